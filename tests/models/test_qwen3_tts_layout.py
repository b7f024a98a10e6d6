"""qwen3_tts loading: the public layout read into our modules, every weight name consumed, mismatches named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from omni_actors.models.detect import detect_pipeline
from omni_actors.models.qwen3_tts.codec_model import load_codec
from omni_actors.models.qwen3_tts.modules import load_talker
from omni_actors.models.tiny import make_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tiny("qwen3_tts", tmp_path_factory.mktemp("m") / "tiny-qwen3_tts", seed=0)


def test_every_weight_of_the_layout_is_loaded(folder: Path) -> None:
    talker, spk, config = load_talker(folder, "cpu", torch.float32)
    assert spk is None  # CustomVoice: no speaker encoder
    assert config["model_type"] == "qwen3_tts" and detect_pipeline(folder) == "qwen3_tts"
    saved = load_file(folder / "model.safetensors")
    assert (
        "talker.model.codec_embedding.weight" in saved
        and "talker.model.text_embedding.weight" in saved
    )
    assert (
        "talker.code_predictor.small_to_mtp_projection.weight" in saved
    )  # widths differ in the tiny one
    assert torch.equal(
        talker.get_input_embeddings().weight, saved["talker.model.codec_embedding.weight"]
    )
    decoder, encoder, _ = load_codec(folder, "cpu", encoder=True)
    codec = load_file(folder / "speech_tokenizer" / "model.safetensors")
    assert "decoder.quantizer.rvq_rest.vq.layers.0._codebook.embedding_sum" in codec
    assert sum(1 for k in codec if k.startswith("decoder.")) == len(decoder.state_dict())
    assert sum(1 for k in codec if k.startswith("encoder.")) == len(encoder.state_dict())
    audio = decoder(torch.randint(0, 64, (1, decoder.groups, 6)))
    assert audio.shape[:2] == (1, 1) and 5 * 1920 < audio.shape[-1] <= 6 * 1920


def test_a_missing_or_extra_weight_is_named(folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    state = load_file(bad / "model.safetensors")
    state.pop("talker.codec_head.weight")
    save_file(state, bad / "model.safetensors")
    with pytest.raises(ValueError, match=r"talker.*codec_head"):
        load_talker(bad, "cpu", torch.float32)
    codec = load_file(bad / "speech_tokenizer" / "model.safetensors")
    codec["decoder.extra.weight"] = torch.zeros(1)
    save_file(codec, bad / "speech_tokenizer" / "model.safetensors")
    with pytest.raises(ValueError, match=r"extra\.weight"):
        load_codec(bad, "cpu")


def test_base_checkpoints_load_their_speaker_encoder(tmp_path: Path) -> None:
    base = make_tiny("qwen3_tts-base", tmp_path / "base", seed=0)
    _talker, spk, config = load_talker(base, "cpu", torch.float32)
    saved = load_file(base / "model.safetensors")
    names = [k for k in saved if k.startswith("speaker_encoder.")]
    assert config["tts_model_type"] == "base" and names and len(names) == len(spk.state_dict())
    embedding = spk(torch.randn(1, 50, config["speaker_encoder_config"]["mel_dim"]))
    assert (
        embedding.shape[-1] == config["talker_config"]["hidden_size"]
    )  # one codec row of the prompt
    saved.pop(names[0])
    save_file(saved, base / "model.safetensors")
    with pytest.raises(ValueError, match="speaker encoder"):
        load_talker(base, "cpu", torch.float32)
