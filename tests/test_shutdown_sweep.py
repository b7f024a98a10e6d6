"""Every way an `omni-run` process ends leaves nothing behind.

Each case runs the real `python -m omni_actors.cli` with a synthetic pipeline and
ends it one way: SIGINT or SIGTERM while workers start, while idle, during a
streamed request, twice in a row; a terminal's Ctrl-C to the whole process group;
SIGKILL (workers follow by PR_SET_PDEATHSIG, also one killed before it could ask
for that signal; the next start sweeps what was left); a worker that fails at
start; a port in use. After each: the exit code is the expected one, no worker of
that run is alive, no /dev/shm/omni-<pid>-* segment and no runtime directory
remain, and no traceback was printed.

Workers are held "starting" by a sitecustomize hook in one stage's PYTHONPATH
(the deploy's per-stage `env`), which prints a line the test waits for.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.shutdown_support import (
    CLOSING_LINE,
    HELD,
    HELD_CLOSE,
    HURRY_TIMEOUT_S,
    LINE_TIMEOUT_S,
    ORPHAN_EXIT_TIMEOUT_S,
    PR_SET_CHILD_SUBREAPER,
    SLOW_LOAD,
    SLOW_LOAD_LINE,
    STAGES,
    STARTING,
    STARTING_LINE,
    OmniRun,
    Stream,
    hooked,
    release,
    runtime_dirs,
    segments_of,
    wait_gone,
)


@pytest.fixture
def subreaper() -> Iterator[None]:
    """This test process adopts orphaned descendants, as systemd --user or `tini -s` do."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[OmniRun]]:
    """Start runs with `runs.append(OmniRun(...))`; whatever a test leaves running is killed."""
    started: list[OmniRun] = []
    yield started
    for run in started:
        run.kill()


# ---- requests ---------------------------------------------------------------------------------

SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]
SIGNALS_ONE_FAST = [SIGNALS[0], pytest.param(signal.SIGTERM, id="SIGTERM", marks=pytest.mark.slow)]
"""SIGTERM takes the same shutdown path as SIGINT: the default suite runs SIGINT, the slow run both."""


# ---- the cases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS_ONE_FAST)
def test_signal_while_workers_start(tmp_path: Path, runs: list[OmniRun], sig: signal.Signals) -> None:
    run = OmniRun(tmp_path, hooked(tmp_path, SLOW_LOAD))
    runs.append(run)
    run.wait_for(SLOW_LOAD_LINE)
    assert run.note_workers(), "no worker seen while starting"
    run.signal(sig)
    assert run.wait() == 0, run.output
    assert "server.ready" not in run.output
    run.assert_clean()


def test_ctrl_c_at_a_terminal_while_workers_start(tmp_path: Path, runs: list[OmniRun]) -> None:
    """Ctrl-C reaches the whole foreground process group: the main process alone leads the shutdown."""
    run = OmniRun(tmp_path, hooked(tmp_path, STARTING), session=True)
    runs.append(run)
    run.wait_for(STARTING_LINE)
    run.signal_group(signal.SIGINT)
    assert run.wait() == 0, run.output
    run.assert_clean()


@pytest.mark.parametrize("sig", SIGNALS_ONE_FAST)
def test_signal_while_idle(tmp_path: Path, runs: list[OmniRun], sig: signal.Signals) -> None:
    run = OmniRun(tmp_path, STAGES)
    runs.append(run)
    run.wait_ready()
    assert len(run.seen_workers) == 3
    run.signal(sig)
    assert run.wait() == 0, run.output
    run.assert_clean()


@pytest.mark.parametrize("sig", SIGNALS_ONE_FAST)
def test_signal_during_a_stream_drains_it(tmp_path: Path, runs: list[OmniRun], sig: signal.Signals) -> None:
    run = OmniRun(tmp_path, STAGES)
    runs.append(run)
    run.wait_ready()
    stream = Stream(run.url, max_tokens=50, audio_in_bytes=96_000)  # ~1 s of steps
    stream.wait_first()
    run.signal(sig)
    stream.join()
    assert stream.done, stream.events[-3:]
    assert run.wait() == 0, run.output
    run.assert_clean()


@pytest.mark.parametrize("sig", SIGNALS_ONE_FAST)
def test_second_signal_hurries_the_drain(tmp_path: Path, runs: list[OmniRun], sig: signal.Signals) -> None:
    run = OmniRun(tmp_path, STAGES)
    runs.append(run)
    run.wait_ready()
    stream = Stream(run.url, max_tokens=100_000)  # far longer than the drain would wait
    stream.wait_first()
    run.signal(sig)
    run.wait_for(r"server\.stopping")
    run.signal(sig)
    stream.join(HURRY_TIMEOUT_S)  # cut, not drained (the drain would wait DRAIN_TIMEOUT_S, 30 s)
    assert not stream.done, stream.events[-3:]
    assert json.loads(stream.events[-1])["error"]["code"] == "request_aborted", stream.events[-1]
    # How soon the interpreter then exits is the host's (a loaded 2-core box once took over 10 s
    # after `server.stopped`): the generous exit limit.
    assert run.wait() == 0, run.output
    assert "server.hurrying" in run.output
    run.assert_clean()


def test_sigkill_workers_follow_and_next_start_sweeps(tmp_path: Path, runs: list[OmniRun]) -> None:
    run = OmniRun(tmp_path, STAGES)
    runs.append(run)
    run.wait_ready()
    stream = Stream(run.url, max_tokens=3, audio_in_bytes=96_000)
    stream.join()
    assert stream.done, stream.events[-3:]
    assert any("-orch-" in s for s in segments_of(run.pid)), "the request left no arena segment to sweep"
    run.signal(signal.SIGKILL)
    assert run.wait(eof=False) == -signal.SIGKILL
    alive = wait_gone(run.seen_workers, ORPHAN_EXIT_TIMEOUT_S)
    assert alive == [], f"workers outlived their killed main process: {alive}\n{run.stacks(alive)}"

    after = OmniRun(tmp_path, STAGES)
    runs.append(after)
    after.wait_ready()
    assert segments_of(run.pid) == [], "the next start did not sweep the killed run's segments"
    assert "runtime.swept_stale" in after.output, "the next start did not sweep the killed run's runtime dir"
    after.signal(signal.SIGTERM)
    assert after.wait() == 0, after.output
    after.assert_clean()
    run.assert_clean()
    assert runtime_dirs(run.runtime_parent) == set()


def test_sigkill_before_a_worker_could_ask_for_its_parent_death_signal(
    tmp_path: Path, runs: list[OmniRun], subreaper: None
) -> None:
    """A worker whose main process died before PR_SET_PDEATHSIG leaves, even when a subreaper adopts it."""
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    run = OmniRun(tmp_path, hooked(tmp_path, HELD.format(line=STARTING_LINE, fifo=str(fifo))))
    runs.append(run)
    run.wait_for(STARTING_LINE)
    run.signal(signal.SIGKILL)
    assert run.wait(eof=False) == -signal.SIGKILL
    release(fifo)  # let the held worker go on starting, now an orphan
    alive = wait_gone(run.seen_workers, ORPHAN_EXIT_TIMEOUT_S)
    for p in run.seen_workers - set(alive):  # reap the adopted orphans
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, 0)
    assert alive == [], f"workers outlived their killed main process: {alive}\n{run.stacks(alive)}"
    assert segments_of(run.pid) == []


def test_a_repeated_sigterm_does_not_cut_a_workers_cleanup_short(tmp_path: Path, runs: list[OmniRun]) -> None:
    """The kernel repeats the parent-death signal once per thread of a killed multi-threaded parent."""
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    run = OmniRun(tmp_path, hooked(tmp_path, HELD_CLOSE.format(line=CLOSING_LINE, fifo=str(fifo))))
    runs.append(run)
    run.wait_ready()
    Stream(run.url, max_tokens=3).join()
    assert [s for s in segments_of(run.pid) if "-s1r0g0-" in s], "stage 1 holds no segment"
    run.signal(signal.SIGKILL)
    assert run.wait(eof=False) == -signal.SIGKILL
    worker = psutil.Process(int(run.wait_for(CLOSING_LINE + r" pid=(\d+)").group(1)))
    worker.send_signal(signal.SIGTERM)  # while its cleanup is held: a handler that raised would cut it short
    release(fifo)
    alive = wait_gone(run.seen_workers, ORPHAN_EXIT_TIMEOUT_S)
    assert alive == [], f"workers outlived their killed main process: {alive}\n{run.stacks(alive)}"
    assert segments_of(run.pid) == [], "the worker's cleanup was cut short"
    run.read_to_eof()
    assert "Traceback" not in run.output, run.output


def test_worker_failing_at_start(tmp_path: Path, runs: list[OmniRun]) -> None:
    stages = [*STAGES[:1], {**STAGES[1], "engine_extras": {"fail_start": True}}, *STAGES[2:]]
    run = OmniRun(tmp_path, stages)
    runs.append(run)
    run.wait_for(r"stage\.start_failed|worker\.died")
    code = run.wait()
    assert code == 1, run.output
    assert re.search(r"omni-run: stage 1 did not start", run.output), run.output
    run.assert_clean()


def test_port_in_use(tmp_path: Path, runs: list[OmniRun]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = OmniRun(tmp_path, STAGES, port=port)
        runs.append(run)
        code = run.wait(LINE_TIMEOUT_S)  # (before or after its workers start: either way none is left)
    assert code > 0, run.output
    assert f"cannot listen on 127.0.0.1:{port}" in run.output, run.output
    run.assert_clean()
