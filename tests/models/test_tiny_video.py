"""Tiny video/audio diffusers checkpoints: the real pipeline classes and component classes, loadable offline."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("diffusers")

from omni_actors.models.detect import detect_pipeline
from omni_actors.models.tiny import make_tiny, tiny_names

EXPECTED = {
    "wan2_2": ("WanPipeline", {"text_encoder": "UMT5EncoderModel", "tokenizer": "T5Tokenizer",
                               "transformer_2": "WanTransformer3DModel", "vae": "AutoencoderKLWan"}),
    "wan2_2_i2v": ("WanImageToVideoPipeline", {"text_encoder": "UMT5EncoderModel",
                                               "transformer": "WanTransformer3DModel"}),
    "stable_audio": ("StableAudioPipeline", {"text_encoder": "T5EncoderModel", "tokenizer": "T5Tokenizer",
                                             "vae": "AutoencoderOobleck",
                                             "projection_model": "StableAudioProjectionModel"}),
    "ltx2": ("LTX2Pipeline", {"text_encoder": "Gemma3ForConditionalGeneration", "tokenizer": "GemmaTokenizer",
                              "vocoder": "LTX2Vocoder", "audio_vae": "AutoencoderKLLTX2Audio"}),
    "hunyuan_video_1_5": ("HunyuanVideo15Pipeline", {"text_encoder": "Qwen2_5_VLTextModel",
                                                     "tokenizer": "Qwen2Tokenizer", "tokenizer_2": "ByT5Tokenizer",
                                                     "text_encoder_2": "T5EncoderModel"}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tiny_video_folder_is_the_real_layout(name, tmp_path):
    import diffusers

    assert name in tiny_names()
    folder = make_tiny(name, tmp_path / name, seed=0)
    index = json.loads((folder / "model_index.json").read_text())
    cls, parts = EXPECTED[name]
    assert index["_class_name"] == cls
    for part, part_cls in parts.items():
        assert index[part][1] == part_cls, part
        assert (folder / part).is_dir()
    pipe = diffusers.DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    assert type(pipe).__name__ == cls
    ids = pipe.tokenizer("a cat walks on the beach").input_ids
    assert len(ids) > 0 and (pipe.tokenizer.unk_token_id is None or pipe.tokenizer.unk_token_id not in ids)
    assert detect_pipeline(folder) == name  # `omni-run --model` serves it with its own pipeline
