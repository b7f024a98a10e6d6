"""The operator's view of omni-run: a readable start-up summary, JSON logs on request, quiet engines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

DEPLOY = Path(__file__).parents[1] / "omni_actors" / "deploy" / "synthetic.yaml"
EXIT_TIMEOUT_S = 30


def _serve(*flags: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNI_LOG", "VLLM_LOGGING"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(DEPLOY), "--port", str(port), *flags],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    return proc, port


def _lines_until(proc: subprocess.Popen, marker: str) -> list[str]:
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # ends at EOF if omni-run dies first
        seen.append(line)
        if marker in line:
            return seen
    pytest.fail("omni-run ended early:\n" + "".join(seen))


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0


def test_console_start_up_summary_names_stages_and_urls() -> None:
    proc, port = _serve()
    try:
        text = "".join(_lines_until(proc, "Ctrl-C stops it."))
    finally:
        _stop(proc)
    assert "serving 'synthetic'" in text
    for stage in ("0  thinker", "1  talker", "2  vocoder"):
        assert stage in text
    assert f"playground http://127.0.0.1:{port}/" in text
    assert f"ws://127.0.0.1:{port}/v1/realtime" in text


def test_json_log_format_is_one_json_object_per_line() -> None:
    proc, _port = _serve("--log-format", "json", "--log-level", "INFO")
    try:
        lines = _lines_until(proc, "server.ready")
    finally:
        _stop(proc)
    events = [json.loads(line) for line in lines]  # every line, the workers' too, is JSON
    assert events[-1]["event"] == "server.ready"
    assert {e.get("component") for e in events} >= {"main"}
    assert all("level" in e and "timestamp" in e for e in events)


def test_a_bad_log_level_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "omni_actors.cli", "--log-level", "loud"],
                          capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)
    assert done.returncode == 2 and "--log-level" in done.stderr and "Traceback" not in done.stderr
