"""Forking workers from a zygote: the main process's side (the zygote itself: workers/zygote.py).

A worker interpreter spends most of its start importing torch and transformers (~5 s of a
core each). The local launcher asks one zygote per main process, which imported them once,
to fork each CPU worker instead; the worker then starts in well under a second and shares
the imported pages with its siblings. Only a worker whose environment is exactly the one the
zygote started with is forked (threads, devices and stage `env` are read by libraries at
import); any other, and every GPU worker, starts as a fresh interpreter as before.

The zygote starts on the first fork (its imports overlap nothing else that start waits for)
and lives as long as this process: it ends when the socket closes (at exit) or with this
process (its death signal). When this process's environment changes, a new zygote takes over and
the old one ends once its workers have. A fork nobody waits for any more (its start was cancelled
by a shutdown) is killed when its pid arrives, so no worker runs untracked. A thread reads its
messages (blocking reads, no polling) and hands each to the event loop that asked. `ForkedWorker` is what the supervisor sees: the
WorkerProcess of launcher.py, with the exit code the zygote reaped.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import msgspec

from omni_actors import logs

log = logs.get(__name__)

FORK_TIMEOUT_S = 300.0
"""Longest wait for a fork's answer (the zygote imports first: minutes on a loaded 2-core box)."""
MAX_MESSAGE = 1 << 16
CLOSE_TIMEOUT_S = 5.0
"""Wait for the zygote to end once its socket closed, before it is killed."""
VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})
"""Variables no library reads at import, which may differ between the zygote and a worker it forks
(the worker gets its own value): pytest sets this one to the running test's name."""


class ZygoteGone(RuntimeError):
    """The zygote cannot fork (it ended, or found forking unsafe): start a fresh interpreter instead."""


class ForkedWorker:
    """A worker the zygote forked: the supervisor's WorkerProcess (pid, returncode, wait, signals)."""

    def __init__(self, pid: int, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._loop = loop
        self._ended = loop.create_future()

    def _exited(self, code: int) -> None:  # (on the loop)
        if self.returncode is None:
            self.returncode = code
            if not self._ended.done():
                self._ended.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One zygote process and the thread that reads it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "omni_actors.workers.zygote", str(theirs.fileno()), str(os.getpid())],
            env=self.env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True,
        )
        theirs.close()
        self.pid = self._proc.pid
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._workers: dict[int, ForkedWorker] = {}
        self._early_exits: dict[int, int] = {}
        self._abandoned: set[int] = set()  # requests nobody waits for any more
        self._killed: set[int] = set()  # their workers, killed: no exit code is kept for them
        self.alive = True
        self.forks = True
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    async def fork(self, spec_json: str, env: dict[str, str] | None = None, engine: str = "",
                   imports: tuple[str, ...] = (), timeout_s: float = FORK_TIMEOUT_S,
                   stderr_fd: int = 2, stdout_fd: int = 1) -> ForkedWorker:
        """A worker running `spec_json` in `env` (one `fits`; default the zygote's), after the zygote
        imported the stage engine `engine` ("module:Class") and its preloads, and `imports`, its stderr
        `stderr_fd` and stdout `stdout_fd` (default: this process's);
        ZygoteGone when this zygote cannot make one."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        with self._lock:
            if not self.alive or not self.forks:
                raise ZygoteGone("the zygote cannot fork")
            req = next(self._ids)
            self._pending[req] = (loop, fut)
        try:
            msg = msgspec.json.encode({"id": req, "spec": spec_json, "env": self.env if env is None else env,
                                       "engine": engine, "imports": list(imports)})
            self._sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        memoryview(bytes(_fds((stdout_fd, stderr_fd)))))])
        except OSError as err:
            with self._lock:
                self._pending.pop(req, None)
            raise ZygoteGone(f"the zygote's socket: {err}") from err
        try:
            async with asyncio.timeout(timeout_s):  # (not wait_for: on 3.11 it can swallow a cancel)
                pid = await fut
        except (TimeoutError, asyncio.CancelledError) as err:
            with self._lock:
                if self._pending.pop(req, None) is not None:
                    self._abandoned.add(req)  # (a pid that still comes for it is killed at once)
            if isinstance(err, asyncio.CancelledError):
                raise
            raise ZygoteGone(f"no fork within {timeout_s:g} s") from None
        worker = ForkedWorker(pid, loop)
        with self._lock:
            self._workers[pid] = worker
            early = self._early_exits.pop(pid, None)
        if early is not None:
            worker._exited(early)
        return worker

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a worker of environment `env` may be forked from this zygote."""
        return _significant(env) == _significant(self.env)

    def idle(self) -> bool:
        """No worker of this zygote is alive and no fork is pending."""
        with self._lock:
            return not self._workers and not self._pending

    def close(self, at_once: bool = False) -> None:
        """End the zygote (its forked workers have ended or get their death signal); `at_once`
        kills it rather than letting it see the socket close (it may be importing still)."""
        with self._lock:
            self.alive = False
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if at_once:
            self._proc.kill()
        try:
            self._proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=CLOSE_TIMEOUT_S)
        self._sock.close()

    # ---- the reader thread ----

    def _read(self) -> None:
        while True:
            try:
                raw = self._sock.recv(MAX_MESSAGE)
            except OSError:
                raw = b""
            if not raw:
                break
            self._on_message(msgspec.json.decode(raw))
        self._gone()

    def _on_message(self, msg: dict[str, Any]) -> None:
        if "ready" in msg:
            if not msg.get("forks"):
                log.warning("zygote.no_forks", pid=self.pid, hint="workers start as fresh interpreters")
                self._fail_pending(forks_off=True)
            return
        if "exit" in msg:
            pid, code = int(msg["exit"]), int(msg["code"])
            with self._lock:
                worker = self._workers.pop(pid, None)
                if worker is None and pid not in self._killed:
                    self._early_exits[pid] = code
                self._killed.discard(pid)
            if worker is not None:
                _on_loop(worker._loop, worker._exited, code)
            return
        with self._lock:
            waiting = self._pending.pop(int(msg["id"]), None)
            unwanted = waiting is None and int(msg["id"]) in self._abandoned
            self._abandoned.discard(int(msg["id"]))
        if unwanted and "pid" in msg:
            self._unwanted(int(msg["pid"]))
        if waiting is not None:
            loop, fut = waiting
            result: Any = int(msg["pid"]) if "pid" in msg else ZygoteGone(str(msg.get("error")))
            _on_loop(loop, self._deliver, fut, result)

    def _deliver(self, fut: asyncio.Future, result: Any) -> None:  # (on the waiter's loop)
        if fut.done() and isinstance(result, int):  # its waiter was cancelled as the pid came
            self._unwanted(result)
        else:
            _settle(fut, result)

    def _unwanted(self, pid: int) -> None:
        """A worker forked for a request nobody waits for any more: it must not run untracked."""
        log.info("zygote.abandoned_fork", pid=pid)
        with self._lock:
            self._killed.add(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _fail_pending(self, forks_off: bool = False) -> None:
        with self._lock:
            if forks_off:
                self.forks = False
            pending, self._pending = self._pending, {}
        for loop, fut in pending.values():
            _on_loop(loop, _settle, fut, ZygoteGone("the zygote cannot fork"))

    def _gone(self) -> None:
        """The zygote ended: nothing more is forked, and its workers (sent their death signal) are
        killed and counted as ended, since no exit code can come for them any more."""
        with self._lock:
            self.alive = False
            workers, self._workers = self._workers, {}
        self._fail_pending()
        for pid, worker in workers.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _on_loop(worker._loop, worker._exited, -signal.SIGKILL)


def _significant(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in VOLATILE_ENV}


def _fds(fds: tuple[int, ...]) -> bytes:
    return array.array("i", fds).tobytes()


def _settle(fut: asyncio.Future, result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # that loop is closed: nobody waits there any more
        pass


_shared: Zygote | None = None
_retired: list[Zygote] = []
"""Zygotes of an environment this process no longer has, kept until their last worker ends."""
_shared_lock = threading.Lock()


@atexit.register
def _close_shared() -> None:
    for z in (*_retired, *([_shared] if _shared is not None else [])):
        z.close()


def shared(env: dict[str, str]) -> Zygote | None:
    """This process's zygote for workers of environment `env` (started on first use). The
    environment of this process changed since it started (a library set a variable, say): a new
    zygote takes over, and the old one ends once its last worker has (at once if idle). None when
    a worker of that environment cannot be forked (forking turned out unsafe, or no zygote starts)."""
    global _shared
    with _shared_lock:
        if _shared is not None and _shared.alive and not _shared.fits(env):
            log.info("zygote.replaced", pid=_shared.pid, reason="the environment changed",
                     busy=not _shared.idle())
            _retired.append(_shared)
            _shared = None
        for old in [z for z in _retired if z.idle() or not z.alive]:
            _retired.remove(old)
            old.close(at_once=True)
        if _shared is not None and not _shared.alive:
            _shared = None
        if _shared is None:
            try:
                _shared = Zygote(env)
            except OSError as err:
                log.warning("zygote.start_failed", error=repr(err))
                return None
        z = _shared
    return z if z.forks and z.fits(env) else None
