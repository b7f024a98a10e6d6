"""A process's end without the interpreter's teardown: `exit_now(code)` once its own cleanup is done.

After `omni-run` or a worker has stopped (engines closed, sockets closed, shared memory unlinked,
logs written), a normal interpreter exit still tears down every module it imported: for a worker
with torch, transformers and vLLM loaded that took 3-6 s on a busy 2-core box, and omni-run's own
exit waits for its workers'. `exit_now` runs what registered to run at exit (atexit handlers:
logging's flush, tempfile's finalizers, the zygote's close), flushes stdout and stderr, and ends the
process with `os._exit`. Used only at the very end of a process's entry point (never from a library
call: a test calling `cli.main` in-process keeps its interpreter). `OMNI_EXIT_TEARDOWN=1` keeps the
interpreter's exit (scripts/bench_exit.py's same-run baseline).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    if os.environ.get("OMNI_EXIT_TEARDOWN") == "1":
        sys.exit(code)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code if isinstance(code, int) else 0)
