"""Progress of slow preparation: plain `done`/`total` log lines when stderr is not a terminal, from a real
`omni-run` start and `omni-run make-tiny`, a bar line on a terminal, and at most a line per tenth."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.test_cli_operator import EXIT_TIMEOUT_S, _lines_until, _serve, _stop

MAKE_TINY_TIMEOUT_S = 120


def _events(lines: list[str], name: str) -> list[dict]:
    return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e["event"] == name]


def test_omni_run_logs_stage_loading_progress_until_every_stage_is_ready() -> None:
    """... and with --log-format json every line is JSON, aiohttp's access lines too."""
    proc, port = _serve("--log-format", "json")
    try:
        lines = _lines_until(proc, "server.ready")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=EXIT_TIMEOUT_S) as resp:
            assert resp.status == 200
    finally:
        _stop(proc)
    assert proc.stderr is not None
    lines += proc.stderr.readlines()
    assert [line for line in lines if not line.startswith("{")] == []
    access = [e for e in map(json.loads, lines) if e.get("logger") == "aiohttp.access"]
    assert len(access) == 1 and "GET /health" in access[0]["event"]
    steps = _events(lines, "stages.loading")
    assert [(e["done"], e["total"]) for e in steps] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert {e["stage"] for e in steps[1:]} == {"thinker", "talker", "vocoder"}
    assert all(e["pipeline"] == "synthetic" for e in steps)


def test_make_tiny_logs_its_steps(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", "make-tiny", "llama", str(tmp_path / "tiny"), "--log-format", "json"],
        capture_output=True, text=True, timeout=MAKE_TINY_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    steps = _events(done.stderr.splitlines(), "model.make_tiny")
    assert [(e["done"], e["total"]) for e in steps] == [(0, 2), (1, 2), (2, 2)]
    assert (tmp_path / "tiny" / "config.json").is_file()


def test_json_logs_carry_python_warnings_as_json_lines() -> None:
    """A library's warning (vLLM's FutureWarnings at import) is a JSON record, not two plain lines."""
    script = "import warnings\nfrom omni_actors import logs\nlogs.configure()\nwarnings.warn('old API', FutureWarning)\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=EXIT_TIMEOUT_S,
                          env={**os.environ, "OMNI_LOG_JSON": "1", "PYTHONWARNINGS": "always"})
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert record["logger"] == "py.warnings" and "FutureWarning: old API" in record["event"], record


SCRIPT = """
from omni_actors import logs, progress
logs.configure()
if {main}:
    progress.main_process()
bar = progress.start("test.steps", 1000, what="weights")
for _ in range(1000):
    bar.advance()
"""


def test_a_thousand_steps_are_eleven_lines() -> None:
    env = {**os.environ, "OMNI_LOG_JSON": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(main=True)], capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT_S, env=env)
    steps = _events(done.stderr.splitlines(), "test.steps")
    assert [e["done"] for e in steps] == list(range(0, 1001, 100))
    assert all(e["what"] == "weights" and e["total"] == 1000 for e in steps)


def test_on_a_terminal_the_main_process_draws_a_bar() -> None:
    env = {**os.environ, "OMNI_LOG_JSON": "0"}
    main, other = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(main=True)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=other, env=env)
        os.close(other)
        out = b""
        while chunk := _read(main):
            out += chunk
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0
    finally:
        os.close(main)
    text = out.decode()
    assert "test.steps" in text and "[" + "#" * 28 + "] 1000/1000" in text
    assert "done=" not in text  # a bar, not log lines


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the other end closed
        return b""
