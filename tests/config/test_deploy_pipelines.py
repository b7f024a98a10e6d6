"""Deploys of several pipelines: a file's `pipelines` list and repeated `omni-run --model`, validated before
anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omni_actors.cli import load_from_args, parse_serve_args
from omni_actors.config.deploy import load_deploy, load_deploys
from omni_actors.errors import ConfigError

TWO = """
server: {port: 8123, api_keys: [k]}
async_chunk: false
pipelines:
  - pipeline: synthetic
    served_model_name: voice
    async_chunk: true
    stages: [{stage_id: 1, max_num_seqs: 3}]
  - pipeline: synthetic_image
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def test_each_entry_is_a_deploy_with_the_shared_server(tmp_path: Path) -> None:
    voice, image = load_deploys(_file(tmp_path, TWO))
    assert (voice.pipeline, voice.server.served_model_name, voice.async_chunk) == ("synthetic", "voice", True)
    assert voice.stage(1).max_num_seqs == 3
    assert (image.pipeline, image.server.served_model_name, image.async_chunk) == ("synthetic_image", None, False)
    assert voice.server.port == image.server.port == 8123 and image.server.api_keys == ["k"]
    assert image.source.endswith("deploy.yaml: pipelines[1]")


@pytest.mark.parametrize(("text", "message"), [
    ("pipelines: []\n", "pipelines: expected a non-empty list"),
    ("pipeline: synthetic\npipelines: [{pipeline: synthetic_text}]\n", "pipeline: with `pipelines`, each entry"),
    ("pipelines: [{pipeline: synthetic, server: {port: 1}}]\n", "pipelines[0].server: one server serves every"),
    ("pipelines: [{pipeline: synthetic}, {pipeline: synthetic}]\n", "'synthetic' is also the name of"),
    ("pipelines: [{pipeline: synthetic}, {pipeline: nope}]\n", "pipelines[1]: pipeline: unknown pipeline 'nope'"),
    ("pipelines: [{pipeline: synthetic, stages: [{stage_id: 7}]}]\n", "pipelines[0]: stages[0].stage_id"),
    ("pipelines: [3]\n", "pipelines[0]: expected a mapping"),
])
def test_a_bad_pipelines_list_names_the_entry_and_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_deploys(_file(tmp_path, text))


def test_load_deploy_wants_one_pipeline(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected one pipeline here, the file lists 2"):
        load_deploy(_file(tmp_path, TWO))


def test_repeated_model_flags_give_one_deploy_each_in_order() -> None:
    args = ["--model", "synthetic", "--model", "synthetic_asr", "--served-model-name", "a",
            "--served-model-name", "b", "--port", "9001", "--no-async-chunk"]
    a, b = load_from_args(parse_serve_args(args))
    assert (a.pipeline, a.server.served_model_name, b.pipeline, b.server.served_model_name) == (
        "synthetic", "a", "synthetic_asr", "b")
    assert a.server.port == b.server.port == 9001 and not a.async_chunk and not b.async_chunk
    [one] = load_from_args(parse_serve_args(["--model", "synthetic"]))  # a pipeline's name alone
    assert one.pipeline == "synthetic" and one.stage(0).engine_extras  # (its bundled deploy file)
    [default] = load_from_args(parse_serve_args([]))
    assert default.pipeline == "assistant"


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "synthetic", "--model", "synthetic_asr", "--served-model-name", "a"], "given 1 time"),
    (["--model", "synthetic", "--model", "synthetic"], "'synthetic' is also the name"),
    (["--model", "synthetic", "--model", "synthetic_asr", "--stage-overrides", "{}"], "applies to one pipeline"),
    (["--model", "synthetic", "--model", "/no/such/dir"], "not a folder: /no/such/dir"),
])
def test_bad_model_flags_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_from_args(parse_serve_args(argv))


def test_flags_for_one_pipeline_refuse_a_file_of_several(tmp_path: Path) -> None:
    path = str(_file(tmp_path, TWO))
    with pytest.raises(ConfigError, match="lists 2 pipelines"):
        load_from_args(parse_serve_args(["--deploy", path, "--served-model-name", "x"]))
    assert len(load_from_args(parse_serve_args(["--deploy", path, "--port", "9002"]))) == 2


def test_the_serving_guide_deploy_file_loads(tmp_path: Path) -> None:
    guide = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    [block] = re.findall(r"```yaml\n(.*?)```", guide, re.S)
    voice, pics = load_deploys(_file(tmp_path, block))
    assert (voice.server.served_model_name, pics.server.served_model_name) == ("voice", "pics")
    assert voice.stage(0).max_num_seqs == 4 and voice.server.port == pics.server.port == 8000
    lines = re.findall(r"^    omni-run (--model .*)$", guide, re.M)
    assert len(lines) == 3
    argv = next(line.split() for line in lines if "./" not in line)  # (the others need real folders)
    assert [d.pipeline for d in load_from_args(parse_serve_args(argv))] == [
        "synthetic", "synthetic_image", "synthetic_asr"]
