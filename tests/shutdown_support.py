"""The harness of the shutdown sweep: a real `omni-run` process, its workers, hooks, a streamed request."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.conftest import SHM, free_port

LINE_TIMEOUT_S = 60.0
"""Longest wait for an expected log line (start-up of three workers on busy cores)."""
EXIT_TIMEOUT_S = 30.0
"""Longest wait for omni-run to exit once it was told to (or failed)."""
ORPHAN_EXIT_TIMEOUT_S = 30.0
"""Longest wait for workers to exit by themselves after their main process was killed (15 s was
once too short on a loaded 2-core CI box)."""
STREAM_READ_TIMEOUT_S = 20.0
"""A streamed response silent this long counts as hung."""
STACKS_TIMEOUT_S = 2.0
"""How long a failing test collects the stacks that the workers it names print."""
HURRY_TIMEOUT_S = 10.0
"""A second signal must cut the streams well before the graceful drain's own limit (30 s)."""

STEP_MS = 20
"""The first stage's time per output: a stream of n tokens lasts about n * STEP_MS."""
SLOW_LOAD_LINE = "test.engine_loading"

SLOW_LOAD = f'''
"""Test hook: the synthetic engine's module "loads" until the worker is signalled."""
import signal, sys

class _SlowLoad:
    def find_spec(self, name, path=None, target=None):
        if name == "omni_actors.workers.synthetic":
            print("{SLOW_LOAD_LINE}", file=sys.stderr, flush=True)
            while True:
                signal.pause()
        return None

sys.meta_path.insert(0, _SlowLoad())
'''
STARTING_LINE = "test.interpreter_starting"
STARTING = f'''
"""Test hook: the worker's interpreter is still starting (its own signal handlers not yet set)."""
import signal, sys
print("{STARTING_LINE}", file=sys.stderr, flush=True)
while True:
    signal.pause()
'''
HELD = '''
"""Test hook: the worker's interpreter is still starting, held until the test writes to a FIFO."""
import os, sys
fd = os.open({fifo!r}, os.O_RDWR)  # opened before the line: release() always finds a reader
print("{line}", file=sys.stderr, flush=True)
os.read(fd, 1)  # a signal's handler interrupts this and Python reads again: the byte stays in the pipe
'''
CLOSING_LINE = "test.arena_closing"
HELD_CLOSE = '''
"""Test hook: the worker's shared-memory arena, once closing, waits until the test opens a FIFO."""
import os, sys
from omni_actors.bus import shm

_close = shm.Arena.close

def close(self):
    fd = os.open({fifo!r}, os.O_RDWR)  # opened before the line: release() always finds a reader
    print(f"{line} pid={{os.getpid()}}", file=sys.stderr, flush=True)
    os.read(fd, 1)  # a SIGTERM's handler interrupts this and Python reads again: the byte stays
    _close(self)

shm.Arena.close = close
'''
PR_SET_CHILD_SUBREAPER = 36


# ---- an omni-run process -------------------------------------------------------------------


class StderrLines:
    """A subprocess's stderr, read by a thread into a queue of lines (what was read so far: `lines`)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._eof = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line)
        self._queue.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = LINE_TIMEOUT_S) -> re.Match[str]:
        """The first (not yet read) stderr line matching `pattern`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r} within {timeout_s} s; got:\n{self.output}")
            if line is None:
                self._eof = True
                pytest.fail(f"omni-run ended before a line matching {pattern!r}; got:\n{self.output}")
            self.lines.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def read_to_eof(self, timeout_s: float = EXIT_TIMEOUT_S) -> None:
        """Every remaining stderr line; the end comes when no process of the run (workers too) holds it."""
        deadline = time.monotonic() + timeout_s
        while not self._eof:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"stderr still open after {timeout_s} s: a process of the run holds it")
            if line is None:
                self._eof = True
            else:
                self.lines.append(line)


class OmniRun(StderrLines):
    """One `omni-run` subprocess; its stderr is read by a thread into a queue of lines."""

    def __init__(self, tmp: Path, stages: list[dict[str, Any]], port: int | None = None,
                 pipeline: str = "synthetic", session: bool = False) -> None:
        self.port = port or free_port()
        self.runtime_parent = tmp / "runtime"
        self.runtime_before = runtime_dirs(self.runtime_parent)
        deploy = tmp / f"deploy-{self.port}.yaml"
        deploy.write_text(json.dumps({  # JSON is YAML
            "pipeline": pipeline, "async_chunk": True,
            "server": {"host": "127.0.0.1", "port": self.port}, "stages": stages,
        }))
        env = {**os.environ, "OMNI_LOG_JSON": "0", "OMNI_RUNTIME_DIR": str(self.runtime_parent)}
        super().__init__(subprocess.Popen(
            [sys.executable, "-m", "omni_actors.cli", "--deploy", str(deploy)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=session,  # its own process group, as a shell starts a job
        ))
        self.pid = self.proc.pid
        self.seen_workers: set[psutil.Process] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        self.wait_for(r"server\.ready")
        self.note_workers()

    def note_workers(self) -> list[psutil.Process]:
        """This run's live worker processes (remembered, to check they end)."""
        now = list(workers_of(self.pid))
        self.seen_workers.update(now)
        return now

    def signal(self, sig: signal.Signals) -> None:
        self.note_workers()
        self.proc.send_signal(sig)

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the run's process group, as a terminal does on Ctrl-C (needs `session=True`)."""
        self.note_workers()
        os.killpg(self.pid, sig)

    def wait(self, timeout_s: float = EXIT_TIMEOUT_S, eof: bool = True) -> int:
        """omni-run's exit code; with `eof`, after reading its stderr to the end too."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stacks = self.stacks([psutil.Process(self.pid), *workers_of(self.pid)])
            pytest.fail(f"omni-run did not exit within {timeout_s} s; output:\n{self.output}\nstacks:\n{stacks}")
        if eof:
            self.read_to_eof(timeout_s)
        return code

    def stacks(self, procs: list[psutil.Process]) -> str:
        """What each of `procs` is doing: its state and (by SIGUSR1 to faulthandler) its Python stacks."""
        states = []
        for p in procs:
            with contextlib.suppress(psutil.Error, OSError):
                states.append(f"{p.pid}: {p.status()} wchan={Path(f'/proc/{p.pid}/wchan').read_text()}")
                os.kill(p.pid, signal.SIGUSR1)
        deadline = time.monotonic() + STACKS_TIMEOUT_S
        lines: list[str] = []
        with contextlib.suppress(queue.Empty):
            while (line := self._queue.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
                lines.append(line)
        return "\n".join(states) + "\n" + "".join(lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in [*workers_of(self.pid), *zygotes_of(self.pid)]:
            with contextlib.suppress(psutil.Error):  # (it may end between the listing and the kill)
                p.kill()
                p.wait(EXIT_TIMEOUT_S)  # (reaps it if this process adopted it)

    def assert_clean(self, workers_timeout_s: float = 0.0) -> None:
        """Nothing of this run remains: no worker, no segment, no runtime directory, no traceback."""
        alive = wait_gone(self.seen_workers | set(workers_of(self.pid)) | set(zygotes_of(self.pid)),
                          workers_timeout_s)
        assert alive == [], f"workers of run {self.pid} still running: {alive}"
        assert segments_of(self.pid) == [], "shared-memory segments left behind"
        left = runtime_dirs(self.runtime_parent) - self.runtime_before
        assert left == set(), f"runtime directories left behind: {left}"
        self.read_to_eof()
        for bad in ("Traceback", "Fatal Python error", "KeyboardInterrupt"):
            assert bad not in self.output, self.output


def workers_of(main_pid: int) -> Iterator[psutil.Process]:
    """Live worker processes started by the omni-run whose pid is `main_pid`.

    Found by command line rather than parentage, so orphans count too: a worker's
    spec (JSON on its command line) names its segment prefix, which starts with
    the main process's pid.
    """
    mark = f'"shm_prefix":"omni-{main_pid}-'
    for p in psutil.process_iter(["cmdline", "name"]):
        cmd = p.info["cmdline"] or []
        spawned = "omni_actors.workers.main" in cmd and any(mark in a for a in cmd)
        if (spawned or (p.info["name"] == "omni-worker" and _zygote_cmd(cmd, main_pid))) and _running(p):
            yield p


def zygotes_of(main_pid: int) -> Iterator[psutil.Process]:
    """The run's worker zygote (its command line names the main pid; forked workers keep that
    command line, but are named omni-worker)."""
    for p in psutil.process_iter(["cmdline", "name"]):
        if p.info["name"] == "omni-zygote" and _zygote_cmd(p.info["cmdline"] or [], main_pid) and _running(p):
            yield p


def _zygote_cmd(cmd: list[str], main_pid: int) -> bool:
    return "omni_actors.workers.zygote" in cmd and cmd[-1:] == [str(main_pid)]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(procs: set[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of `procs` still running after `timeout_s` (orphans' exits cannot be awaited: poll)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def segments_of(main_pid: int) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"omni-{main_pid}-*"))


def runtime_dirs(parent: Path) -> set[str]:
    return {p.name for p in parent.glob("*")} if parent.exists() else set()


def release(fifo: Path) -> None:
    """Let a hook waiting on `fifo` go on: one byte it reads (nothing happens if none has it open)."""
    with contextlib.suppress(OSError):  # ENXIO: no reader
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)


def hooked(tmp: Path, hook: str) -> list[dict[str, Any]]:
    """STAGES with `hook` run as sitecustomize in stage 1's worker (before any of its code)."""
    folder = tmp / "hook"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(hook)
    return [*STAGES[:1], {**STAGES[1], "env": {"PYTHONPATH": str(folder)}}, *STAGES[2:]]




class Stream:
    """A streamed chat request read on a thread: `first` is set at its first event."""

    def __init__(self, url: str, max_tokens: int, audio_in_bytes: int = 0) -> None:
        content: list[dict[str, Any]] = [{"type": "text", "text": "hello"}]
        if audio_in_bytes:  # big enough to travel through the orchestrator's shared memory
            data = base64.b64encode(bytes(audio_in_bytes)).decode()
            content.append({"type": "input_audio", "input_audio": {"data": data, "format": "pcm16"}})
        self.body = {"model": "synthetic", "stream": True, "max_tokens": max_tokens,
                     "modalities": ["text", "audio"], "messages": [{"role": "user", "content": content}]}
        self.url = url
        self.first = threading.Event()
        self.events: list[str] = []
        self.error: BaseException | None = None
        self.status = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with requests.post(f"{self.url}/v1/chat/completions", json=self.body, stream=True,
                               timeout=(5, STREAM_READ_TIMEOUT_S)) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith(b"data: "):
                        self.events.append(line[6:].decode())
                        self.first.set()
        except BaseException as err:
            self.error = err
        finally:
            self.first.set()

    def wait_first(self) -> None:
        assert self.first.wait(LINE_TIMEOUT_S), "no first event"
        assert self.error is None and self.status == 200, (self.status, self.error, self.events)

    def join(self, timeout_s: float = STREAM_READ_TIMEOUT_S + 5) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the client is still waiting on the stream"
        assert self.error is None, f"the stream broke instead of ending: {self.error!r}"

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


STAGES: list[dict[str, Any]] = [
    {"stage_id": 0, "engine_extras": {"step_delay_ms": STEP_MS}},
    {"stage_id": 1, "engine_extras": {"payload_bytes": 1 << 17}},  # codes travel through shm
    {"stage_id": 2},
]
