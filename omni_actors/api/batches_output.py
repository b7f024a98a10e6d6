"""A batch's output and error files: written line by line from its stored results, made live as it ends.

    written = write_outputs(files, store, batch, expired, unstored)   # blocking: off the loop
    store.move(final, expect, drop_lines=True, also=written.rows, failed=written.unstored)

The two files' ids are reserved in the batch's row first (BatchStore.output_files). Their bytes are
written under those ids in the file store's folder, a line at a time in input order as the results are
read (RESULTS_CHUNK rows at a time: memory does not grow with the batch). The files' rows are not
written here: they are statements (`rows`) the caller runs in the transaction that ends the batch, so
a batch is ended with its files or not at all. A server that stops between the two leaves bytes that no
row names (no file a client can list); the next server writes the same ids over them, so a batch has
one output file and one error file however often its end was cut short (and FileStore.sweep removes the
bytes of a batch that never ends).

A file row is inserted as FileStore.add inserts one (file_store.py: its rowid past every dropped file's).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omni_actors.api.batches_schemas import Batch, BatchUsage
from omni_actors.api.batches_store import BatchStore
from omni_actors.api.file_store import FileStore

PURPOSE = "batch_output"
_FILE_ROW = (
    "INSERT INTO files (rowid, id, filename, purpose, bytes, created_at, expires_at, file) VALUES (1 + MAX("
    "COALESCE((SELECT MAX(rowid) FROM files), 0), COALESCE((SELECT MAX(seq) FROM file_cursors), 0)), "
    "?, ?, ?, ?, ?, ?, ?)")


@dataclass
class Written:
    output_file_id: str | None = None
    error_file_id: str | None = None
    """None for a file without a line (its bytes are removed)."""
    usage: BatchUsage = field(default_factory=BatchUsage)
    rows: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    """The INSERTs that make the files live: run them in the transaction that ends the batch."""
    unstored: int = 0
    """Lines written to the error file from `unstored` (their results never reached the store)."""


def write_outputs(files: FileStore, store: BatchStore, batch: Batch, expired: Callable[[str], bytes] | None,
                  unstored: Mapping[int, bytes]) -> Written:
    """Write the batch's output file (2xx answers) and error file (the others; a line without a result:
    its `unstored` line if it has one, else `expired(custom_id)` when the batch expired). Blocking file I/O."""
    out_id, err_id = store.output_files(batch.id)
    paths = files.dir / out_id, files.dir / err_id
    written = Written()
    sizes = [0, 0]
    try:
        with paths[0].open("wb") as out, paths[1].open("wb") as err:
            for line, custom_id, result, ok in store.results(batch.id):
                if result is None:
                    data = unstored.get(line)
                    written.unstored += data is not None
                    if data is None and expired is not None:
                        data = expired(custom_id)
                    if data is None:
                        continue
                else:
                    data = result.encode()
                    if ok:
                        _add_usage(written.usage, result)
                target = 0 if ok and result is not None else 1
                (out, err)[target].write(data + b"\n")
                sizes[target] += len(data) + 1
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise
    now = int(time.time())
    expiry = store.output_expiry(batch.id)
    expires = None if expiry is None else now + expiry
    ids: list[str | None] = []
    for fid, path, size, kind in ((out_id, paths[0], sizes[0], "output"), (err_id, paths[1], sizes[1], "error")):
        if not size:
            path.unlink(missing_ok=True)
            ids.append(None)
            continue
        written.rows.append((_FILE_ROW, (fid, f"{batch.id}_{kind}.jsonl", PURPOSE, size, now, expires, fid)))
        ids.append(fid)
    written.output_file_id, written.error_file_id = ids
    return written


def discard(files: FileStore, written: Written) -> None:
    """Remove the bytes of files whose rows were not written (the batch did not end)."""
    for fid in (written.output_file_id, written.error_file_id):
        if fid is not None:
            (files.dir / fid).unlink(missing_ok=True)


def _add_usage(usage: BatchUsage, result: str) -> None:
    """Add an answer's tokens (chat's and completions' prompt/completion, responses' input/output)."""
    found = ((json.loads(result).get("response") or {}).get("body") or {})
    got = found.get("usage") if isinstance(found, dict) else None
    if not isinstance(got, dict):
        return
    took = got.get("input_tokens", got.get("prompt_tokens", 0)) or 0
    made = got.get("output_tokens", got.get("completion_tokens", 0)) or 0
    usage.input_tokens += took
    usage.output_tokens += made
    usage.total_tokens += took + made
