"""A demanding user's sweep of deploy-file mistakes: each is one ConfigError naming the file, the field and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_actors.config.deploy import load_deploy
from omni_actors.errors import ConfigError


def _error(path: Path, overrides: dict | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        load_deploy(path, overrides)
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def _write(tmp_path: Path, text: str | bytes, name: str = "deploy.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


SYN = "pipeline: synthetic\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("- pipeline: synthetic\n", "expected a mapping at the top level, got list", id="list"),
        pytest.param("just words\n", "expected a mapping at the top level, got str", id="scalar"),
        pytest.param("stages: []\n", "(top level): object missing required field `pipeline`", id="no-pipeline"),
        # syntax errors give the line (and column) where the parser stopped
        pytest.param(SYN + "stages:\n  - stage_id: 0\n   max_num_seqs: [\n",
                     "line 4, column 4: not valid YAML: expected <block end>", id="bad-indent"),
        pytest.param(SYN + "\tstages: []\n", "line 2, column 1: not valid YAML: found character '\\t'", id="tab"),
        pytest.param(SYN + "server: {port: 8000\n", "line 3, column 1: not valid YAML", id="unclosed-flow"),
        pytest.param(SYN + "async_chunk: false\nasync_chunk: true\n",
                     "line 3, column 1: not valid YAML: key 'async_chunk' is given twice", id="duplicate-key"),
        pytest.param(SYN + "stages:\n  - stage_id: 0\n    max_num_seqs: 2\n    max_num_seqs: 4\n",
                     "line 5, column 5: not valid YAML: key 'max_num_seqs' is given twice", id="duplicate-nested-key"),
        # unknown keys, with a suggestion when one is close
        pytest.param(SYN + "stage: []\n", "(top level): unknown field `stage`; did you mean `stages`?", id="top-typo"),
        pytest.param(SYN + "server: {prot: 80}\n", "server: unknown field `prot`; did you mean `port`?", id="server-typo"),
        pytest.param(SYN + "stages: [{stage_id: 0, max_num_seq: 2}]\n",
                     "stages[0]: unknown field `max_num_seq`; did you mean `max_num_seqs`?", id="stage-typo"),
        # wrong types and ranges
        pytest.param(SYN + "server: {port: '8000'}\n", "server.port: expected `int`, got `str`", id="port-str"),
        pytest.param(SYN + "server: {port: -1}\n", "server.port: expected 1..65535, got -1", id="port-negative"),
        pytest.param(SYN + "stages: [{stage_id: 0, num_replicas: -1}]\n",
                     "stages[0].num_replicas: expected an integer >= 1, got -1", id="replicas-negative"),
        pytest.param(SYN + "stages: [{stage_id: 0, gpu_memory_utilization: 1.5}]\n",
                     "stages[0].gpu_memory_utilization: expected a value in (0, 1], got 1.5", id="gpu-mem-high"),
        pytest.param(SYN + "stages: [{stage_id: 0, gpu_memory_utilization: 0}]\n",
                     "stages[0].gpu_memory_utilization: expected a value in (0, 1], got 0.0", id="gpu-mem-zero"),
        pytest.param(SYN + "stages: [{stage_id: 0, max_queue: 0}]\n",
                     "stages[0].max_queue: expected an integer >= 1, got 0", id="max-queue-zero"),
        pytest.param(SYN + "stages: [{stage_id: 0, max_model_len: -3}]\n",
                     "stages[0].max_model_len: expected an integer >= 1, got -3", id="max-model-len"),
        pytest.param(SYN + "stages: [{stage_id: 0, dtype: bfloat61}]\n",
                     "stages[0].dtype: expected one of ['auto', 'bfloat16'", id="dtype-typo"),
        pytest.param(SYN + "server: {max_body_mb: -1}\n", "server.max_body_mb: expected a finite number > 0, got -1", id="body-mb"),
        pytest.param(SYN + "server: {body_timeout_s: -5}\n", "server.body_timeout_s: expected a finite number > 0, got -5",
                     id="body-timeout"),
        pytest.param(SYN + "server: {request_timeout_s: 0}\n",
                     "server.request_timeout_s: expected a finite number > 0, got 0", id="request-timeout"),
        pytest.param(SYN + "server: {max_realtime_sessions: -1}\n",
                     "server.max_realtime_sessions: expected an integer >= 0, got -1", id="realtime-sessions"),
        pytest.param(SYN + "stages: 3\n", "stages: expected `array`, got `int`", id="stages-int"),
        pytest.param(SYN + "stages: [3]\n", "stages[0]: expected `object`, got `int`", id="stage-int"),
        pytest.param(SYN + "platforms: [cpu]\n", "platforms: expected `object`, got `array`", id="platforms-list"),
        pytest.param(SYN + "platforms: {cpu: [1], cuda: [1]}\n", "expected a mapping of deploy fields, got list",
                     id="platform-overlay-list"),
        # pipeline topology
        pytest.param("pipeline: synthetc\n", "pipeline: unknown pipeline 'synthetc'; expected one of [", id="pipeline-typo"),
        pytest.param(SYN + "stages: [{stage_id: 0}, {stage_id: 1}, {stage_id: 0}]\n",
                     "stages[2].stage_id: stage 0 is listed twice", id="duplicate-stage"),
        pytest.param(SYN + "stages: [{stage_id: -1}]\n",
                     "stages[0].stage_id: pipeline 'synthetic' has no stage -1; expected one of [0, 1, 2]", id="stage-negative"),
        pytest.param(SYN + "model: /no/such/model\n", "model: path does not exist: /no/such/model", id="model-missing"),
        pytest.param(SYN + "base_config: [a.yaml]\n", "base_config: expected a file path, got list", id="base-config-list"),
        pytest.param(SYN + "base_config: nothere.yaml\n", "base_config: file not found: ", id="base-config-missing"),
    ],
)
def test_mistake_is_one_message_naming_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    msg = _error(path)
    assert msg.startswith(f"{path}: "), msg
    assert expected in msg, msg


def test_unknown_field_far_from_any_gets_no_suggestion(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, SYN + "server: {zzzzzz: 1}\n"))
    assert msg == f"{tmp_path / 'deploy.yaml'}: server: unknown field `zzzzzz`", msg


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    assert _error(tmp_path) == f"deploy: {tmp_path} is a directory; expected a YAML file"


def test_base_config_that_is_a_directory_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    path = _write(tmp_path, SYN + "base_config: base\n")
    msg = _error(path)
    assert msg == f"{path}: base_config: {tmp_path / 'base'} is a directory; expected a YAML file", msg


def test_file_that_is_not_utf8_text(tmp_path: Path) -> None:
    path = _write(tmp_path, b"pipeline: synthetic\n\xff\xfe\x00")
    msg = _error(path)
    assert msg.startswith(f"{path}: cannot read the file as UTF-8 text"), msg


def test_bad_stage_entry_under_base_config_names_the_file(tmp_path: Path) -> None:
    _write(tmp_path, SYN + "stages: [{stage_id: 0}]\n", "base.yaml")
    path = _write(tmp_path, "base_config: base.yaml\nstages: [oops]\n")
    msg = _error(path)
    assert msg.startswith(f"{path}: stages[1]: expected `object`, got `str`"), msg


def test_override_errors_say_they_come_from_the_command_line(tmp_path: Path) -> None:
    path = _write(tmp_path, SYN)
    msg = _error(path, {"server": {"port": 0}})
    assert msg == f"{path} (with command-line overrides): server.port: expected 1..65535, got 0", msg
    msg = _error(path, {"model": "/no/such/model"})
    assert msg == f"{path} (with command-line overrides): model: path does not exist: /no/such/model", msg
