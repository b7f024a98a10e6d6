"""omni-run as a user runs it: starts, reports ready, serves /health, and leaves nothing behind on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.conftest import free_port, shm_files

DEPLOY = Path(__file__).parents[1] / "omni_actors" / "deploy" / "synthetic.yaml"
READY_TIMEOUT_S = 60


def _wait_for_line(proc: subprocess.Popen, pattern: str) -> re.Match:
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen = []
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    pytest.fail(f"no line matching {pattern!r}; got:\n{''.join(seen)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
# (SIGINT on an idle omni-run is test_shutdown_sweep.py's test_signal_while_idle[SIGINT]; -m slow adds it here)
def test_serve_then_signal_leaves_nothing_behind(sig: signal.Signals) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(DEPLOY), "--port", str(port)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "OMNI_LOG_JSON": "0"},
    )
    try:
        ready = _wait_for_line(proc, r"server\.ready.*runtime_dir=(\S+).*shm_prefix=(\S+)|server\.ready.*shm_prefix=(\S+).*runtime_dir=(\S+)")
        groups = [g for g in ready.groups() if g]
        runtime_dir = next(g for g in groups if g.startswith("/"))
        prefix = next(g for g in groups if g.startswith("omni-"))
        children = psutil.Process(proc.pid).children(recursive=True)
        (zygote,) = psutil.Process(proc.pid).children()  # three stages, forked by one zygote
        assert "omni_actors.workers.zygote" in " ".join(zygote.cmdline())
        workers = zygote.children()
        assert len(workers) == 3 and len(children) == 4
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json() == {"status": "ok"}
        assert Path(runtime_dir).is_dir() and oct(Path(runtime_dir).stat().st_mode & 0o777) == "0o700"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        _gone, alive = psutil.wait_procs(children, timeout=5)
        assert alive == []
        assert not Path(runtime_dir).exists()
        assert shm_files(prefix) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
