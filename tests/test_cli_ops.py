"""An operator's mistakes that once started a server, a model download or a traceback: each is one line, exit 2.

Every run is given a port that is already taken, so a mistake that slips past the checks fails fast
on the port (a different line) instead of starting workers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CLI_TIMEOUT_S = 60
SYN = "pipeline: synthetic\n"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        yield busy.getsockname()[1]


def omni_run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        env={**os.environ, "OMNI_LOG_JSON": "0", "OMNI_DATA_DIR": str(tmp_path / "data"), **env},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("text", "expected"), [
    # `.inf` once reached int(max_body_mb * 2**20) in the app and int(stream_buffer_mb ...) in the orchestrator
    pytest.param("server: {max_body_mb: .inf}\n", "server.max_body_mb: expected a finite number > 0, got inf",
                 id="body-mb-inf"),
    pytest.param("server: {stream_buffer_mb: .inf}\n",
                 "server.stream_buffer_mb: expected a finite number > 0, got inf", id="stream-buffer-inf"),
    pytest.param("server: {request_timeout_s: .inf}\n",
                 "server.request_timeout_s: expected a finite number > 0, got inf", id="timeout-inf"),
    pytest.param("stages: [{stage_id: 0, shm_budget_mb: .inf}]\n",
                 "stages[0].shm_budget_mb: expected a finite number > 0, got inf", id="shm-budget-inf"),
    # keys no request can present: the server would start and answer every client 401
    pytest.param("server: {api_keys: ['']}\n", "server.api_keys[0]: empty", id="key-empty"),
    pytest.param("server: {api_keys: [good, ' padded ']}\n", "server.api_keys[1]: has leading or trailing spaces",
                 id="key-padded"),
    pytest.param('server: {api_keys: ["a\\nb"]}\n', "server.api_keys[0]: has a control character", id="key-newline"),
])
def test_deploy_values_no_server_can_use_are_refused(tmp_path: Path, busy_port: int, text: str,
                                                      expected: str) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(SYN + text)
    proc = omni_run(tmp_path, "--deploy", str(path), "--port", str(busy_port))
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc)
    assert line.startswith(f"omni-run: config error: {path} (with command-line overrides): "), line
    assert line.endswith(expected) or expected in line, line


@pytest.mark.parametrize(("args", "expected"), [
    # `--deploy "$DEPLOY"` with the variable unset once served the bundled assistant (preparing its models)
    pytest.param(["--deploy", ""], "omni-run: config error: --deploy: empty; give a deploy YAML file", id="deploy"),
    pytest.param(["--model", ""], "omni-run: config error: --model: empty; give a model folder", id="model"),
    pytest.param(["--model", "synthetic", "--stage-overrides", ""],
                 "omni-run: config error: --stage-overrides: empty; give a JSON object keyed by stage id", id="overrides"),
    pytest.param(["--model", "synthetic", "--model", "synthetic"],
                 "omni-run: config error: --model synthetic: given twice; to serve it under two names", id="model-twice"),
])
def test_empty_or_repeated_flags_are_named(tmp_path: Path, busy_port: int, args: list[str], expected: str) -> None:
    proc = omni_run(tmp_path, *args, "--port", str(busy_port))
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc).startswith(expected), proc.stderr
    assert not (tmp_path / "data" / "assistant").exists()  # nothing was prepared


def test_make_tiny_into_an_empty_path_is_named(tmp_path: Path) -> None:
    proc = omni_run(tmp_path, "make-tiny", "llama", "")
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc) == "omni-run make-tiny: dir: empty; give the folder to write the checkpoint to"


@pytest.mark.parametrize("kind", ["file", "too-long"])
def test_an_unusable_runtime_dir_is_a_config_error(tmp_path: Path, busy_port: int, kind: str) -> None:
    if kind == "file":
        runtime = tmp_path / "runtime"
        runtime.write_text("")
        expected = f"omni-run: config error: OMNI_RUNTIME_DIR: cannot use {runtime}: Not a directory"
    else:  # the run's ipc socket path would pass the 107 characters of sun_path
        runtime = tmp_path / ("r" * 100)
        expected = f"omni-run: config error: OMNI_RUNTIME_DIR: {runtime} is {len(str(runtime))} characters; expected at most"
    proc = omni_run(tmp_path, "--model", "synthetic", "--port", str(busy_port), OMNI_RUNTIME_DIR=str(runtime))
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc).startswith(expected), proc.stderr


def test_make_tiny_with_json_logs_writes_only_json_lines(tmp_path: Path) -> None:
    """transformers' "Writing model shards" tqdm bar once came out between the JSON lines."""
    proc = omni_run(tmp_path, "--log-format", "json", "make-tiny", "llama", str(tmp_path / "tiny"))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    events = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert events and events[-1]["event"] == "model.make_tiny" and events[-1]["done"] == events[-1]["total"]
    assert (tmp_path / "tiny" / "config.json").is_file()


def test_make_tiny_of_a_listed_family_not_built_here_says_why(tmp_path: Path) -> None:
    """`cosmos` answered "unknown name 'cosmos' (did you mean 'csm'?)" though the project lists the family."""
    proc = omni_run(tmp_path, "make-tiny", "cosmos", str(tmp_path / "c"))
    assert proc.returncode == 2
    assert "'cosmos' is not built here: Cosmos2_5_PredictBasePipeline" in proc.stderr and "csm" not in proc.stderr
    assert not (tmp_path / "c").exists()
