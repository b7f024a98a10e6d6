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
    (["--model", "synthetic", "--model", "synthetic"], "--model synthetic: given twice"),
    (["--model", "synthetic", "--model", "synthetic_asr", "--stage-overrides", "{}"], "applies to one pipeline"),
    (["--model", "synthetic", "--model", "/no/such/dir"], "--model /no/such/dir: no such folder"),
    (["--model", "synthetic", "--served-model-name", ""], "--served-model-name: empty"),
    (["--served-model-name", " "], "--served-model-name: empty"),
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
    lines = re.findall(r"^(?:    )?omni-run (--model .*)$", guide, re.M)  # (indented, or a marked block's)
    assert len(lines) == 3
    argv = next(line.split() for line in lines if "./" not in line)  # (the others need real folders)
    assert [d.pipeline for d in load_from_args(parse_serve_args(argv))] == [
        "synthetic", "synthetic_image", "synthetic_asr"]


@pytest.mark.parametrize("argv", [
    ["--model", "synthetic", "--model", "synthetic_image",
     "--served-model-name", "synthetic_image", "--served-model-name", "synthetic"],
    ["--model", "synthetic", "--model", "synthetic_image", "--served-model-name", "x",
     "--served-model-name", "synthetic"],
])
def test_a_served_name_may_not_be_another_pipelines_name(argv: list[str]) -> None:
    with pytest.raises(ConfigError, match="is also the name of pipeline 'synthetic"):
        load_from_args(parse_serve_args(argv))


def test_a_pipelines_file_whose_entries_swap_names_is_refused(tmp_path: Path) -> None:
    text = ("pipelines:\n  - {pipeline: synthetic, served_model_name: synthetic_image}\n"
            "  - {pipeline: synthetic_image, served_model_name: synthetic}\n")
    with pytest.raises(ConfigError, match=r"pipelines\[\d\]: served_model_name: 'synthetic(_image)?' is also"):
        load_deploys(_file(tmp_path, text))


def test_two_of_one_pipeline_may_still_share_its_name() -> None:
    argv = ["--model", "synthetic", "--model", "synthetic", "--served-model-name", "synthetic",
            "--served-model-name", "b"]
    assert [d.server.served_model_name for d in load_from_args(parse_serve_args(argv))] == ["synthetic", "b"]


def test_model_overrides_a_deploy_files_missing_model(tmp_path: Path) -> None:
    path = _file(tmp_path, "pipeline: synthetic\nmodel: /no/such/model\n")
    folder = tmp_path / "weights"
    folder.mkdir()
    [dep] = load_from_args(parse_serve_args(["--deploy", str(path), "--model", str(folder)]))
    assert dep.model == str(folder)
    with pytest.raises(ConfigError, match="model: path does not exist: /no/such/model"):
        load_from_args(parse_serve_args(["--deploy", str(path)]))


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "synthetc"], "--model synthetc: no such folder, and no pipeline of that name "
                              "(did you mean 'synthetic'?)"),
    (["--model", "/no/such/dir"], "--model /no/such/dir: no such folder, and no pipeline of that name"),
])
def test_a_mistyped_model_names_the_flag_not_the_bundled_file(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_from_args(parse_serve_args(argv))
    assert str(err.value).startswith(message), err.value
    assert "assistant.yaml" not in str(err.value)


@pytest.mark.parametrize("argv", [
    ["--stage-overrides", '{"9": {"max_num_seqs": 2}}'],
    ["--model", "synthetic", "--stage-overrides", '{"9": {"max_num_seqs": 2}}'],
])
def test_a_stage_override_for_a_missing_stage_names_the_key(tmp_path: Path, argv: list[str]) -> None:
    path = _file(tmp_path, "pipeline: synthetic\nstages: [{stage_id: 0}, {stage_id: 1}, {stage_id: 2}]\n")
    if "--model" not in argv:
        argv = ["--deploy", str(path), *argv]
    with pytest.raises(ConfigError) as err:
        load_from_args(parse_serve_args(argv))
    assert "--stage-overrides: no stage 9 in pipeline 'synthetic' (stages 0, 1, 2)" in str(err.value), err.value
    assert "stages[" not in str(err.value)
