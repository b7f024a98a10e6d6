"""The worker zygote: one interpreter that imports the heavy libraries once, then forks workers.

`python -m omni_actors.workers.zygote <fd> <main pid>`, started by the orchestrator's
process (orchestrator/zygote.py) with one end of a SOCK_SEQPACKET socket pair as `fd`.
It imports our worker modules (PRELOAD), then waits for requests on the socket. Before a
fork it imports what that worker will: its engine's module, the model adapter's, and the
engine class's ZYGOTE_PRELOAD (torch and transformers' model base for a transformers
engine: ~8 s of a core each time a worker interpreter starts). Each is imported once, so
the next worker of that kind forks at once, and a light engine (the synthetic ones) never
waits for torch.

    main -> zygote   {"id", "spec", "env", "engine", "imports"} with the main process's stdout
                     and stderr as SCM_RIGHTS: fork a worker that runs `workers.main` with that spec
    zygote -> main   {"ready", "forks"} once imported (forks false: it cannot fork safely,
                     e.g. a preload started a thread or initialised CUDA); {"id", "pid"} or
                     {"id", "error"} per request; {"exit", "code"} when a worker it forked ends
                     (code as asyncio's returncode: negative for a signal)

The child leaves the zygote's frames (`serve` returns its argv) and runs the worker as
`python -m omni_actors.workers.main` would: its own session, stdin /dev/null, the given
environment, then a normal interpreter exit (atexit handlers run). The zygote itself ends with
`os._exit` (no teardown of the modules it imported: seconds, for torch and vLLM). It holds no
threads, no event loop and no ZeroMQ context, so a fork copies nothing half-held. It dies
with the main process (its death signal), and its workers with it (theirs); the socket
closing ends it too.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Iterable

import msgspec

PRELOAD = ("numpy", "omni_actors.workers.main")
"""Modules every worker imports, whatever its engine."""
MAX_MESSAGE = 1 << 20
"""Largest request (a worker spec and an environment)."""
PROCESS_NAME = b"omni-zygote"

_encode = msgspec.json.encode


def _preload(names: Iterable[str]) -> bool:
    """Import `names` (those not imported yet); True when forking stays safe (one thread, CUDA
    untouched). A module that fails to import is skipped: the worker meets the error itself and
    reports it as its start failure."""
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:
            continue
    return _fork_safe()


def _engine_preload(engine: str) -> tuple[str, ...]:
    """What the stage engine `module:Class` asks to have imported (its ZYGOTE_PRELOAD)."""
    module, _, attr = engine.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except Exception:
        return ()
    return tuple(getattr(cls, "ZYGOTE_PRELOAD", ()))


def _fork_safe() -> bool:
    torch = sys.modules.get("torch")
    cuda_on = bool(torch is not None and torch.cuda.is_initialized())
    return threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1 and not cuda_on


def _recv(sock: socket.socket) -> tuple[dict, list[int]] | None:
    fds = array.array("i")
    msg, ancdata, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if not msg:
        for fd in fds:
            os.close(fd)
        return None
    return msgspec.json.decode(msg), list(fds)


def _reap(sock: socket.socket) -> None:
    """Tell the main process about every worker that ended since the last call."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(_encode({"exit": pid, "code": os.waitstatus_to_exitcode(status)}))


def _become_worker(req: dict, fds: list[int], closing: list[int]) -> list[str]:
    """In the forked child: the worker's session, stdio and environment; its argv."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    for fd in closing:
        with contextlib.suppress(OSError):
            os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for target, fd in zip((1, 2), fds, strict=False):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(req["env"])
    if "numpy" in sys.modules:  # (the global generator's state came from the zygote; fresh entropy)
        sys.modules["numpy"].random.seed()
    from omni_actors.workers import main as worker

    sys.argv = [worker.__file__, req["spec"], str(os.getppid())]
    return list(sys.argv)


def serve(sock: socket.socket) -> list[str] | None:
    """The zygote's life; returns a worker's argv in a forked child, None when the zygote is done."""
    forks = _preload(PRELOAD)
    sock.send(_encode({"ready": True, "forks": forks}))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (only to wake the selector)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():
                if key.fileobj == wake_r:
                    os.read(wake_r, 4096)
                    _reap(sock)
                    continue
                got = _recv(sock)
                if got is None:
                    return None
                req, fds = got
                if forks:
                    engine = str(req.get("engine") or "")
                    forks = _preload([*req.get("imports", ()), engine.partition(":")[0]])
                    forks = forks and _preload(_engine_preload(engine)) if engine else forks
                if not forks:
                    sock.send(_encode({"id": req["id"], "error": "this zygote cannot fork safely"}))
                else:
                    try:
                        pid = os.fork()
                    except OSError as err:
                        sock.send(_encode({"id": req["id"], "error": repr(err)}))
                        pid = -1
                    if pid == 0:
                        sel.close()
                        return _become_worker(req, fds, [sock.fileno(), wake_r, wake_w])
                    if pid > 0:
                        sock.send(_encode({"id": req["id"], "pid": pid}))
                for fd in fds:
                    os.close(fd)
    except (BrokenPipeError, ConnectionResetError):
        return None


if __name__ == "__main__":
    from omni_actors.workers.main import _die_with_parent

    _die_with_parent(int(sys.argv[2]), PROCESS_NAME)
    control = socket.socket(fileno=int(sys.argv[1]))
    try:
        argv = serve(control)
    except (KeyboardInterrupt, BrokenPipeError, ConnectionResetError):  # (the main process closed first)
        argv = None
    except Exception:
        traceback.print_exc()
        argv = None
    if argv is None:
        # Done: end without the interpreter's teardown. The zygote holds nothing to clean (no
        # threads, files or sockets of its own: its workers have theirs), and tearing down torch,
        # transformers and vLLM's modules took 3-6 s, which omni-run's exit waited for.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    control.detach()  # (the child closed the descriptor itself)
    del control
    from omni_actors.process_exit import exit_now
    from omni_actors.workers import main as _worker

    exit_now(_worker.main(argv))
