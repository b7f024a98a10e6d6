"""Workers' stderr as JSON log lines: one pipe per worker, read on the main process's event loop.

With `--log-format json` every line on stderr must be one JSON object, but a worker's fd 2 also
takes what no logger formats: torch's C++ warnings (`[W1205 ...] Warning: ...`), a native
library's prints, a traceback the interpreter writes as it dies. So each local worker gets the
write end of a pipe as its fd 2; the main process reads the other end with a reader callback on
its loop (no thread), passes the worker's own JSON lines through and wraps every other line as a
`worker.stderr` event naming the stage and replica. When the worker has ended its pipe is read to
the end (`close`), so nothing it wrote last is lost. With console logs workers keep the main
process's stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import json
import os
import sys

import structlog

PIPE_BYTES = 1 << 20
"""The pipe's buffer: a worker writing a burst while the loop is busy blocks only past this."""
READ_BYTES = 1 << 16
"""Read per call; the loop calls again while more is waiting."""
LINE_MAX_BYTES = 1 << 16
"""A line longer than this is cut into events of this size (memory stays bounded)."""


class WorkerStderr:
    """The read end of one worker's stderr pipe; `child_fd` is what the worker gets as its fd 2."""

    def __init__(self, stage_id: int, replica: int, component: str) -> None:
        self.stage_id = stage_id
        self.replica = replica
        self.component = component
        self._r, self.child_fd = os.pipe()
        os.set_blocking(self._r, False)
        with contextlib.suppress(OSError, AttributeError):  # (Linux only; the default 64 KiB otherwise)
            fcntl.fcntl(self.child_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._partial = b""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._r, self._read)
        self._closed = False

    def spawned(self) -> None:
        """The worker holds its copy of the write end now: close ours, so its exit ends the pipe."""
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1

    def close(self) -> None:
        """The worker has ended: read what is left, to the pipe's end. A process the worker started
        that still holds the write end keeps it open (closing it would break that process's next
        write to stderr); the reader then lets go at the pipe's end (`_finish`)."""
        if self._closed:
            return
        self.spawned()
        while self._read():
            pass

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._r)
        if self._partial:
            self._write([self._partial])
            self._partial = b""
        os.close(self._r)

    def _read(self) -> bool:
        """Take what is waiting; False once nothing more is (empty for now, or the pipe ended)."""
        if self._closed:
            return False
        try:
            data = os.read(self._r, READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:  # every writer has gone
            self._finish()
            return False
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > LINE_MAX_BYTES:
            lines.append(self._partial)
            self._partial = b""
        self._write([line for line in lines if line.strip()])
        return True

    def _write(self, lines: list[bytes]) -> None:
        out = [self._event(line) for line in lines]
        if out:
            write_lines("".join(out))

    def _event(self, line: bytes) -> str:
        return json_line(line.decode(errors="replace").rstrip("\r"), "worker.stderr", stage_id=self.stage_id,
                         replica=self.replica, component=self.component)


def write_lines(text: str) -> None:
    """Whole lines (`text` ends with a newline) onto this process's stderr in one write, under the lock
    structlog's loggers write stderr with (each of their lines one write too: logs.py), so no line lands
    inside another (Ray's log thread once wrote between a print's line and its newline, gluing two JSON
    lines into one)."""
    structlog.WriteLogger(sys.stderr).msg(text.removesuffix("\n"))


def json_line(text: str, event: str, **fields: object) -> str:
    """One line of a worker's output as a JSON log line: the worker's own structured line passes
    through as it is; any other text becomes an `event` (a warning) carrying it as `line`."""
    if text.startswith("{") and text.endswith("}"):
        with contextlib.suppress(ValueError):
            if isinstance(json.loads(text), dict):  # the worker's own structured log line
                return text + "\n"
    return json.dumps({
        "event": event, "line": text, **fields, "level": "warning",
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z"),
    }) + "\n"
