"""`omni-run --model DIR` without a deploy file: the folder's pipeline is detected, or one clear error."""

from __future__ import annotations

import json

import pytest

from omni_actors.cli import load_from_args, parse_serve_args
from omni_actors.errors import ConfigError
from omni_actors.models.detect import detect_pipeline


def _folder(tmp_path, name, body):
    d = tmp_path / "m"
    d.mkdir()
    (d / name).write_text(json.dumps(body))
    return d


def test_a_diffusers_folder_is_served_by_the_diffusion_pipeline(tmp_path):
    d = _folder(tmp_path, "model_index.json", {"_class_name": "QwenImagePipeline"})
    assert detect_pipeline(d) == "diffusion"
    [deploy] = load_from_args(parse_serve_args(["--model", str(d)]))
    assert (deploy.pipeline, deploy.server.served_model_name) == ("diffusion", "m")
    [named] = load_from_args(parse_serve_args(["--model", str(d), "--served-model-name", "x"]))
    assert named.server.served_model_name == "x"


def test_a_transformers_folder_is_detected_by_model_type(tmp_path):
    assert detect_pipeline(_folder(tmp_path, "config.json", {"model_type": "qwen2_5_omni"})) == "qwen2_5_omni"


def test_an_unsupported_folder_names_its_type_and_what_is_supported(tmp_path):
    d = _folder(tmp_path, "config.json", {"model_type": "bert"})
    with pytest.raises(ConfigError, match=r"'transformers:bert'.*supported: .*transformers:qwen2_5_omni"):
        detect_pipeline(d)
    with pytest.raises(ConfigError, match=r"neither model_index\.json"):
        detect_pipeline(tmp_path)


def test_a_diffusers_class_it_cannot_serve_is_named_with_what_is_supported(tmp_path):
    d = _folder(tmp_path, "model_index.json", {"_class_name": "SomeNewPipeline"})
    with pytest.raises(ConfigError, match=r"SomeNewPipeline is not a pipeline class.*supported: .*QwenImagePipeline"):
        detect_pipeline(d)
