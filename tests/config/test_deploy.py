"""Deploy loading and validation: every error names the file, the field path and what was expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from omni_actors.config.deploy import load_deploy, parse_stage_overrides
from omni_actors.errors import ConfigError
from omni_actors.settings import detect_platform


def write(tmp_path: Path, text: str, name: str = "deploy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_valid_file_loads_with_defaults(tmp_path: Path) -> None:
    cfg = load_deploy(write(tmp_path, "pipeline: synthetic\nstages:\n  - stage_id: 1\n    max_num_seqs: 4\n"))
    assert cfg.async_chunk is True
    assert cfg.stage(1).max_num_seqs == 4
    assert cfg.stage(1).queue_limit == 32
    assert cfg.stage(0).num_replicas == 1  # unlisted stage gets defaults
    assert cfg.server.port == 8000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pipeline: synthetic\nbogus: 1\n", "(top level): unknown field `bogus`"),
        ("pipeline: synthetic\nstages:\n  - stage_id: 0\n    num_replicas: two\n",
         "stages[0].num_replicas: expected `int`, got `str`"),
        ("pipeline: synthetic\nstages:\n  - stage_id: 0\n    input_sources: [1]\n",
         "stages[0].input_sources: is a topology field"),
        ("pipeline: synthetic\nstages:\n  - stage_id: 0\n    devices: '0,1'\n    num_replicas: 1\n",
         "stages[0].devices: 2 device(s)"),
        ("pipeline: nope\n", "pipeline: unknown pipeline 'nope'"),
        ("pipeline: diffusion\nmodel: /does/not/exist\n", "model: path does not exist: /does/not/exist"),
        ("pipeline: synthetic\nstages:\n  - stage_id: 9\n", "stages[0].stage_id: pipeline 'synthetic' has no stage 9"),
        ("pipeline: synthetic\nserver: {port: 70000}\n", "server.port: expected 1..65535"),
        ("pipeline: synthetic\nstages: [ {stage_id: 0, max_num_seqs: 0} ]\n", "stages[0].max_num_seqs: expected an integer >= 1"),
        ("pipeline: synthetic\nstages: [ {stage_id: 0, max_step_s: 0} ]\n", "stages[0].max_step_s: expected a finite number > 0"),
        ("pipeline: synthetic\nstages: [ {stage_id: 0, shm_budget_mb: -1} ]\n", "stages[0].shm_budget_mb: expected a finite number > 0"),
        ("pipeline: [unclosed\n", "not valid YAML"),
        ("pipeline: synthetic\nstages:\n  - stage_id: 0\n    devices: 'cuda:0'\n",
         "stages[0].devices: 'cuda:0' is not a GPU"),
        ("pipeline: synthetic\nstages:\n  - stage_id: 0\n    devices: [-1]\n", "stages[0].devices: '-1' is not a GPU"),
        ("pipeline: synthetic\nserver: {served_model_name: ''}\n", "server.served_model_name: expected a name"),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_deploy(path)
    msg = str(err.value)
    assert msg.startswith(str(path)), msg
    assert expected in msg, msg


def test_base_config_merges_stages_by_id(tmp_path: Path) -> None:
    write(tmp_path, "pipeline: synthetic\nasync_chunk: false\nstages:\n  - {stage_id: 0, max_num_seqs: 2, env: {A: '1'}}\n  - {stage_id: 2, max_num_seqs: 3}\n", "base.yaml")
    path = write(tmp_path, "base_config: base.yaml\nstages:\n  - {stage_id: 0, env: {B: '2'}}\n")
    cfg = load_deploy(path)
    assert cfg.async_chunk is False
    assert cfg.stage(0).max_num_seqs == 2
    assert cfg.stage(0).env == {"A": "1", "B": "2"}
    assert cfg.stage(2).max_num_seqs == 3


def test_platform_overlay_and_cli_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "pipeline: synthetic\nplatforms:\n  cpu: {stages: [{stage_id: 1, max_num_seqs: 5}]}\n")
    cfg = load_deploy(path, {**parse_stage_overrides('{"0": {"max_num_seqs": 7}}'), "async_chunk": False})
    assert cfg.stage(1).max_num_seqs == 5
    assert cfg.stage(0).max_num_seqs == 7
    assert cfg.async_chunk is False


def test_stage_overrides_reject_topology_and_bad_json(tmp_path: Path) -> None:
    path = write(tmp_path, "pipeline: synthetic\n")
    with pytest.raises(ConfigError, match="input_sources: is a topology field"):
        load_deploy(path, parse_stage_overrides('{"1": {"input_sources": [0]}}'))
    with pytest.raises(ConfigError, match="--stage-overrides: not valid JSON"):
        parse_stage_overrides("{nope")


def test_cli_config_error_exits_2_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "pipeline: synthetic\nstages:\n  - stage_id: 0\n    devices: [0, 1, 2]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "stages[0].devices" in lines[0] and str(path) in lines[0], proc.stderr


def test_cli_missing_file_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(tmp_path / "none.yaml")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "file not found" in proc.stderr


def test_platform_overlays_are_all_checked_and_unknown_platforms_refused(tmp_path: Path) -> None:
    other = "cuda" if detect_platform() == "cpu" else "cpu"  # an overlay this machine does not apply
    cases = [
        (f"platforms:\n  {other}: {{stages: [{{stage_id: 0, max_num_sqes: 2}}]}}\n",
         f"(with platforms.{other}): stages[0]: unknown field `max_num_sqes`"),
        (f"platforms:\n  {other}: {{stages: [{{stage_id: 0, engine: x}}]}}\n",
         f"platforms.{other}: stages[0].engine: is a topology field"),
        ("platforms:\n  rocm: {async_chunk: false}\n", "platforms.rocm: unknown platform; expected one of"),
    ]
    for text, expected in cases:
        with pytest.raises(ConfigError) as err:
            load_deploy(write(tmp_path, "pipeline: synthetic\n" + text))
        assert expected in str(err.value), str(err.value)


def test_connectors_load_with_a_warning_naming_the_field(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        load_deploy(write(tmp_path, "pipeline: synthetic\nconnectors: {shm: {threshold: 1024}}\n"))
    warned = [e for e in logs if e["event"] == "config.field_ignored"]
    assert [e["field"] for e in warned] == ["connectors"] and "bus" in warned[0]["reason"]
    with structlog.testing.capture_logs() as logs:
        load_deploy(write(tmp_path, "pipeline: synthetic\n"))
    assert not [e for e in logs if e["event"] == "config.field_ignored"]


def test_devices_take_indexes_and_uuids(tmp_path: Path) -> None:
    uuid = "GPU-5c6f1a9e-0b2d-4c1e-9f3a-7d8e2b4a6c10"
    cfg = load_deploy(write(tmp_path, f"pipeline: synthetic\nstages:\n  - stage_id: 0\n    devices: '{uuid}'\n"
                                      "  - stage_id: 1\n    devices: [1]\n"))
    assert (cfg.stage(0).device_list(), cfg.stage(1).device_list()) == ([uuid], ["1"])
