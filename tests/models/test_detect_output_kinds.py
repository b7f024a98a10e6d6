"""`omni-run --model DIR` on a diffusers video or audio class that no pipeline here names: one error at start
(it went to the image `diffusion` pipeline and failed at the first request: no output converter for 'video')."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("diffusers")  # the class's __call__ is read from the installed diffusers' source

from omni_actors.cli import load_from_args, parse_serve_args
from omni_actors.config.pipeline import get_pipeline, pipeline_names
from omni_actors.errors import ConfigError
from omni_actors.models.detect import detect_pipeline


def _folder(tmp_path, class_name: str):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model_index.json").write_text(json.dumps({"_class_name": class_name}))
    return d


@pytest.mark.parametrize(("class_name", "kind"), [("CogVideoXPipeline", "video"), ("AudioLDM2Pipeline", "audio")])
def test_an_unserved_video_or_audio_class_is_one_error_naming_it(tmp_path, class_name: str, kind: str) -> None:
    d = _folder(tmp_path, class_name)
    article = "an" if kind == "audio" else "a"
    pattern = rf"{class_name} is {article} {kind} pipeline this server does not serve.*supported: .*QwenImagePipeline"
    with pytest.raises(ConfigError, match=pattern) as err:
        load_from_args(parse_serve_args(["--model", str(d)]))
    served = [e.partition(":")[2] for n in pipeline_names() for e in get_pipeline(n).detect
              if e.startswith("diffusers:") and not e.endswith("*")]
    assert all(c in str(err.value) for c in served)  # the video/audio classes it does serve are listed
    with pytest.raises(ConfigError, match=class_name):
        detect_pipeline(d)


def test_a_named_video_class_and_an_image_class_are_still_served(tmp_path) -> None:
    video = next(n for n in pipeline_names() if any(e.startswith("diffusers:") and not e.endswith("*")
                                                    for e in get_pipeline(n).detect))
    cls = next(e.partition(":")[2] for e in get_pipeline(video).detect if e.startswith("diffusers:"))
    assert detect_pipeline(_folder(tmp_path, cls)) == video
    (tmp_path / "m" / "model_index.json").write_text(json.dumps({"_class_name": "ZImagePipeline"}))
    assert detect_pipeline(tmp_path / "m") == "diffusion"
