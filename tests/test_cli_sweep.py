"""A demanding user's sweep of omni-run mistakes: exit 2 with one clear message, no traceback, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omni_actors.settings import detect_platform
from tests.conftest import free_port, shm_files

SYNTHETIC = Path(__file__).parents[1] / "omni_actors" / "deploy" / "synthetic.yaml"
CLI_TIMEOUT_S = 60
READY_TIMEOUT_S = 60


def omni_run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", *args],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env={**os.environ, "OMNI_LOG_JSON": "0"}, cwd=cwd,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The single non-empty stderr line of a failed run (config errors are one line)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("sub", [[], ["prepare"], ["make-tiny"], ["export-thinker"]], ids=lambda s: s[0] if s else "serve")
def test_help_exits_0(sub: list[str]) -> None:
    proc = omni_run(*sub, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: omni-run {sub[0] if sub else ''}".rstrip()), proc.stdout


def test_top_level_help_lists_the_commands() -> None:
    out = omni_run("--help").stdout
    for name in ("prepare", "make-tiny", "export-thinker"):
        assert f"omni-run {name}" in out, out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve"], "unknown command 'serve'; expected one of prepare, make-tiny, export-thinker"),
        (["make_tiny", "llama", "x"], "unknown command 'make_tiny'; did you mean 'make-tiny'?"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
        (["make-tiny", "llama"], "the following arguments are required: dir"),
        (["export-thinker", "--bogus", "a", "b"], "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_exit_2_with_usage(args: list[str], expected: str) -> None:
    proc = omni_run(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("usage: omni-run"), proc.stderr
    assert expected in proc.stderr, proc.stderr


def test_deploy_directory_exits_2(tmp_path: Path) -> None:
    proc = omni_run("--deploy", str(tmp_path))
    assert proc.returncode == 2
    assert one_line(proc) == f"omni-run: config error: deploy: {tmp_path} is a directory; expected a YAML file"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("pipeline: synthetic\nstages:\n  - stage_id: 0\n   bad: [\n", "line 4, column 4: not valid YAML",
                     id="syntax"),
        pytest.param("pipeline: synthetic\nplatforms: [cpu]\n", "platforms: expected `object`, got `array`",
                     id="platforms-list"),
        pytest.param("pipeline: synthetic\nstages: 3\n", "stages: expected `array`, got `int`", id="stages-int"),
        pytest.param(b"pipeline: synthetic\n\xff\xfe\n", "cannot read the file as UTF-8 text", id="not-utf8"),
    ],
)
def test_malformed_file_is_one_line_exit_2(tmp_path: Path, text: str | bytes, expected: str) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    proc = omni_run("--deploy", str(path))
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith(f"omni-run: config error: {path}: ") and expected in line, line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--stage-overrides", '{"7": {"max_num_seqs": 2}}'], "--stage-overrides: no stage 7 in pipeline 'synthetic' "
                                                              "(stages 0, 1, 2)"),
        (["--stage-overrides", '{"0": {"max_num_seqs": "two"}}'], "stages[0].max_num_seqs: expected `int`, got `str`"),
        (["--port", "70000"], "server.port: expected 1..65535, got 70000"),
        (["--model", "/no/such/model"], "model: path does not exist: /no/such/model"),
    ],
)
def test_command_line_override_errors_say_so(args: list[str], expected: str) -> None:
    proc = omni_run("--deploy", str(SYNTHETIC), *args)
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith(f"omni-run: config error: {SYNTHETIC} (with command-line overrides): "), line
    assert expected in line, line


def test_port_in_use_fails_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        started = time.monotonic()
        proc = omni_run("--deploy", str(SYNTHETIC), "--port", str(port))
        elapsed = time.monotonic() - started
    assert proc.returncode == 2
    line = one_line(proc)  # no server.starting / stage.ready lines: no worker was started
    assert line == (f"omni-run: config error: {SYNTHETIC}: server.port: cannot listen on 127.0.0.1:{port}: "
                    "Address already in use"), line
    assert elapsed < 30


@pytest.mark.skipif(detect_platform() != "cpu", reason="devices are used on a CUDA machine")
def test_devices_on_a_cpu_machine_are_reported_and_the_server_stops_clean(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text("pipeline: synthetic_text\nstages: [{stage_id: 0, devices: '0'}]\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(path), "--port", str(free_port())],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "OMNI_LOG_JSON": "1"},
    )
    try:
        assert proc.stderr is not None
        events: dict[str, dict] = {}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "server.ready" not in events and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            if line.startswith("{"):
                event = json.loads(line)
                events[event["event"]] = event
        assert "server.ready" in events, events
        warning = events.get("config.devices_ignored")
        assert warning is not None and warning["level"] == "warning", events
        assert warning["stages"] == [0] and warning["deploy"] == str(path), warning
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[1]
        assert proc.returncode == 0, rest
        assert "Traceback" not in rest, rest
        assert shm_files(events["server.ready"]["shm_prefix"]) == []
        assert not Path(events["server.ready"]["runtime_dir"]).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("name", "hint"), [("qwen9", ""), ("qwen3asr", " (did you mean 'qwen3_asr'?)")])
def test_make_tiny_unknown_pipeline_lists_the_choices(tmp_path: Path, name: str, hint: str) -> None:
    """The usage line, then one error line naming the choices: argparse's `choices` printed all ~40 names
    twice (a usage of a dozen lines, then the error line listing them again, quoted)."""
    proc = omni_run("make-tiny", name, str(tmp_path / "x"))
    assert proc.returncode == 2
    usage, error = proc.stderr.splitlines()
    assert usage == "usage: omni-run make-tiny [-h] [--seed SEED] name dir", proc.stderr
    assert error.startswith(f"omni-run make-tiny: error: unknown name {name!r}{hint}; expected one of csm, "), error
    assert ", qwen2_5_omni, " in error, error
    assert not (tmp_path / "x").exists()


def test_make_tiny_unwritable_target(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "tiny"
    proc = omni_run("make-tiny", "llama", str(target))
    assert proc.returncode == 2
    assert one_line(proc) == f"omni-run make-tiny: cannot write {target}: Not a directory"


def test_make_tiny_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "csm"}')
    proc = omni_run("make-tiny", "llama", str(target))
    assert proc.returncode == 2
    assert one_line(proc) == (f"omni-run make-tiny: {target} is not empty; "
                              "give a new or empty folder (a checkpoint is a whole folder)")
    assert [p.name for p in target.iterdir()] == ["config.json"]
    assert (target / "config.json").read_text() == '{"model_type": "csm"}'


def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('["model_type", "llama"]')
    proc = omni_run("--model", str(tmp_path))
    assert proc.returncode == 2
    assert one_line(proc) == f"omni-run: config error: --model: {tmp_path}/config.json: expected a JSON object"


@pytest.mark.parametrize(("args", "expected"), [
    (["--model", "synthetc"],
     "--model synthetc: no such folder, and no pipeline of that name (did you mean 'synthetic'?)"),
    (["--model", "synthetic", "--model", "synthetic_image",
      "--served-model-name", "synthetic_image", "--served-model-name", "synthetic"],
     f"{SYNTHETIC}: served_model_name: 'synthetic_image' is also the name of pipeline 'synthetic_image' "
     "(--model synthetic_image); give this pipeline another served_model_name"),
])
def test_model_flag_mistakes_are_one_line_exit_2(args: list[str], expected: str) -> None:
    proc = omni_run(*args)
    assert proc.returncode == 2
    assert one_line(proc) == f"omni-run: config error: {expected}"


def test_prepare_errors(tmp_path: Path) -> None:
    """An unknown name says which pipelines have files to prepare, and the near miss (it said neither)."""
    proc = omni_run("prepare", "asistant")
    assert proc.returncode == 2 and one_line(proc) == ("omni-run: config error: prepare: unknown pipeline 'asistant' "
                                                       "(did you mean 'assistant'?); these have files to prepare: "
                                                       "assistant")
    proc = omni_run("prepare", "synthetic")
    assert proc.returncode == 2 and "has nothing to prepare" in one_line(proc)


def test_export_thinker_refuses_a_folder_that_is_not_qwen2_5_omni(tmp_path: Path) -> None:
    src = tmp_path / "llama"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (src / "model.safetensors").write_bytes(b"")
    out = tmp_path / "out"
    proc = omni_run("export-thinker", str(src), str(out))
    assert proc.returncode == 2
    assert one_line(proc) == (f"omni-run export-thinker: {src / 'config.json'}: not a Qwen2.5-Omni checkpoint: "
                              "model_type 'llama', expected one of ['qwen2_5_omni', 'qwen2_5_omni_thinker']")
    assert not out.exists()


def _omni_folder(path: Path) -> Path:
    """The smallest folder export-thinker exports: a Qwen2.5-Omni config and the thinker's LM head."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir()
    text = {"hidden_size": 4, "num_attention_heads": 1, "num_hidden_layers": 1, "vocab_size": 3}
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni",
                                                  "thinker_config": {"text_config": text}}))
    save_file({"thinker.lm_head.weight": np.zeros((3, 4), np.float32)}, str(path / "model.safetensors"))
    return path


def test_export_thinker_never_writes_over_a_folder(tmp_path: Path) -> None:
    """`export-thinker SRC ""` wrote the Qwen2 folder into the current folder, and `export-thinker SRC SRC`
    rewrote the source checkpoint's config.json as Qwen2's (exit 0); any non-empty folder was written into.
    Each is now one line, exit 2, nothing written (a new folder's export: tests/models/test_qwen2_5_omni_export.py)."""
    src = _omni_folder(tmp_path / "omni")
    config = (src / "config.json").read_text()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cases = [("", "dir: empty; give the folder to write the checkpoint to"),
             (str(src), f"{src} is not empty; give a new or empty folder (a checkpoint is a whole folder)"),
             (str(src / "config.json"), f"{src / 'config.json'} is not a folder; give a new or empty folder")]
    for out, expected in cases:
        proc = omni_run("export-thinker", str(src), out, cwd=cwd)
        assert proc.returncode == 2 and one_line(proc) == f"omni-run export-thinker: {expected}", proc.stderr
    assert not list(cwd.iterdir()) and (src / "config.json").read_text() == config
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "model.safetensors"]


def test_an_unknown_forced_platform_is_a_config_error(tmp_path: Path) -> None:
    deploy = tmp_path / "d.yaml"
    deploy.write_text("pipeline: synthetic\n")
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(deploy)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env={**os.environ, "OMNI_PLATFORM": "tpu"},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "OMNI_PLATFORM: expected one of ['cpu', 'cuda'], got 'tpu'" in one_line(proc)


@pytest.mark.parametrize(("var", "value", "expected"), [
    pytest.param("OMNI_SHM_IDLE_S", "soon", "OMNI_SHM_IDLE_S: expected a positive number, got 'soon'", id="not-a-number"),
    pytest.param("OMNI_MAX_INPUT_AUDIO_S", "-5", "OMNI_MAX_INPUT_AUDIO_S: expected a positive number", id="negative"),
    pytest.param("OMNI_INPUT_AUDIO_MIN_RATE_HZ", "8000.5", "expected a positive integer", id="not-an-integer"),
    pytest.param("OMNI_INPUT_AUDIO_MIN_RATE_HZ", "500000", "expected at most OMNI_INPUT_AUDIO_MAX_RATE_HZ",
                 id="min-over-max"),
    pytest.param("OMNI_LOG_LEVEL", "loud", "OMNI_LOG_LEVEL: expected one of ['debug', 'info', 'warning', 'error']",
                 id="log-level"),
    pytest.param("OMNI_LOG_JSON", "yes", "OMNI_LOG_JSON: expected one of ['0', '1'], got 'yes'", id="log-json"),
])
def test_a_bad_environment_setting_is_one_line_and_exit_2(tmp_path: Path, var: str, value: str,
                                                           expected: str) -> None:
    """The installed `omni-run` script (it imports the whole CLI first) names the variable and its form."""
    deploy = tmp_path / "d.yaml"
    deploy.write_text("pipeline: synthetic\n")
    script = Path(sys.executable).with_name("omni-run")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "omni_actors.cli"]
    proc = subprocess.run([*cmd, "--deploy", str(deploy)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env={**os.environ, var: value})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert one_line(proc).startswith("omni-run: config error: ") and expected in one_line(proc), proc.stderr
