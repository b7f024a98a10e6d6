"""omni-run around first-run preparation: a signal stops it, nothing temporary stays behind,
and an unusable OMNI_DATA_DIR is refused at start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from omni_actors.models.assistant import prepare as assistant_prepare
from tests.conftest import free_port
from tests.shutdown_support import STARTING, STARTING_LINE, OmniRun, StderrLines, hooked

LINE_TIMEOUT_S = 60.0
"""Longest wait for omni-run to reach preparation (imports on busy cores)."""
EXIT_TIMEOUT_S = 20.0
"""Longest wait for omni-run to stop once signalled during preparation (a part's build is not waited for)."""


class _Run(StderrLines):
    """`omni-run` with its own data directory."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        env = {**os.environ, "OMNI_LOG_JSON": "0", "OMNI_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"}
        super().__init__(subprocess.Popen(
            [sys.executable, "-m", "omni_actors.cli", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        ))

    def wait(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"omni-run did not exit within {timeout_s} s; output:\n{self.output}")
        self.read_to_eof(timeout_s)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_signal_during_preparation_stops_it(tmp_path: Path, sig: signal.Signals) -> None:
    data = tmp_path / "data"
    run = _Run(data, "--port", str(free_port()))
    try:
        run.wait_for(r"model\.prepare")
        run.proc.send_signal(sig)
        code = run.wait()
    finally:
        run.kill()
    assert code == 128 + sig, run.output
    assert re.search(r"server\.stopping.*prepar", run.output), run.output
    assert "server.stopped" in run.output, run.output
    for bad in ("server.starting", "server.ready", "Traceback"):
        assert bad not in run.output, run.output
    assert list((data / "assistant").glob(".*.tmp-*")) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_prepare_removes_temp_folders_left_by_killed_runs(tmp_path: Path) -> None:
    for name in assistant_prepare.PARTS:  # every part prepared: prepare() builds nothing
        (tmp_path / name).mkdir()
        (tmp_path / name / assistant_prepare.MARKER).write_text(
            json.dumps({"version": assistant_prepare.PREPARE_VERSION, "part": name}))
    dead = _dead_pid()
    reused = os.getppid()  # a killed run's pid, now another live process's (containers reuse low pids)
    left = [tmp_path / f".llm.tmp-{dead}", tmp_path / f".tts.old-{dead}", tmp_path / f".asr.tmp-{reused}"]
    for folder in left:
        folder.mkdir()
        (folder / "part.bin").write_bytes(b"x")
    kept = tmp_path / "notes.tmp-1"  # not a part's temporary folder
    kept.mkdir()
    assert assistant_prepare.prepare(tmp_path) == tmp_path
    assert [p for p in left if p.exists()] == []
    assert kept.is_dir()
    assert assistant_prepare.is_prepared(tmp_path)


def _unusable_data_dirs(tmp_path: Path) -> list[tuple[Path, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [(a_file, "not a directory"), (a_file / "sub", "not a directory")]
    if os.geteuid() != 0:  # root writes into a read-only folder anyway
        read_only = tmp_path / "read-only"
        read_only.mkdir(mode=0o555)
        cases.append((read_only, "permission denied"))
    return cases


def test_an_unusable_data_dir_is_refused_at_start(tmp_path: Path) -> None:
    for data, reason in _unusable_data_dirs(tmp_path):
        run = _Run(data, "--model", "synthetic", "--port", str(free_port()))
        try:
            code = run.wait(timeout_s=LINE_TIMEOUT_S)
        finally:
            run.kill()
        lines = run.output.strip().splitlines()
        assert code == 2, run.output
        assert len(lines) == 1, run.output
        assert lines[0].startswith("omni-run: config error: OMNI_DATA_DIR:"), run.output
        assert str(data) in lines[0] and reason in lines[0].lower(), run.output


def test_a_signal_before_ready_logs_the_stop(tmp_path: Path) -> None:
    run = OmniRun(tmp_path, hooked(tmp_path, STARTING))
    try:
        run.wait_for(STARTING_LINE)
        run.signal(signal.SIGTERM)
        assert run.wait() == 0, run.output
        run.assert_clean()
    finally:
        run.kill()
    assert "server.ready" not in run.output
    assert re.search(r"server\.stopping", run.output), run.output
    assert re.search(r"server\.stopped", run.output), run.output
