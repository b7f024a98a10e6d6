"""The folders of local Ray clusters a killed run left behind: swept, with what held them open.

Real processes stand in for the Ray agents that outlive a SIGKILLed driver: each holds a log file
open in its run's folder, as those agents do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omni_actors.orchestrator import ray_sessions

HOLD_S = 300
"""How long a stand-in agent would live if nothing ended it."""
EXIT_TIMEOUT_S = 10.0


def _dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _holder(folder: Path) -> subprocess.Popen:
    """A process with a file open in `folder`, started and holding it before this returns."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'w'); print('open', flush=True); "
         f"time.sleep({HOLD_S})", str(folder / "agent.log")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "open\n"
    return proc


def test_a_dead_runs_folder_and_its_holders_go_a_live_runs_stay(tmp_path: Path) -> None:
    stale = tmp_path / f"{ray_sessions.PREFIX}{_dead_pid()}-abc"
    live = ray_sessions.make_session_dir(tmp_path)  # this process's: alive
    other = tmp_path / "omni-ray-notapid-x"
    for folder in (stale, other):
        folder.mkdir()
    held, kept = _holder(stale), _holder(live)
    try:
        assert ray_sessions.sweep_stale_sessions(tmp_path) == 1
        assert held.wait(EXIT_TIMEOUT_S) == -9  # the agent left behind: ended
        assert not stale.exists() and live.is_dir() and other.is_dir()
        assert kept.poll() is None  # a live run's: untouched
    finally:
        for proc in (held, kept):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", ["omni-ray-", "omni-ray-12x-a"])
def test_names_that_are_not_a_runs_are_left_alone(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    assert ray_sessions.sweep_stale_sessions(tmp_path) == 0 and (tmp_path / name).is_dir()
