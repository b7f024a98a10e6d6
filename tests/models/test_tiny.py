"""Tiny Qwen-Omni checkpoints: real format, loadable by transformers, deterministic by seed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.tiny import make_tiny, tiny_names  # noqa: E402

COMMON_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json",
    "video_preprocessor_config.json", "processor_config.json",
)  # fmt: skip
SPECIAL_IDS = {
    "qwen2_5_omni": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                     "<|AUDIO|>": 151646, "<|IMAGE|>": 151655, "<|VIDEO|>": 151656},
    "qwen3_omni_moe": {"<|im_start|>": 151644, "<|image_pad|>": 151655, "<|audio_start|>": 151669,
                       "<tts_pad>": 151671, "<tts_text_bos>": 151672, "<|audio_pad|>": 151675},
}  # fmt: skip


@pytest.fixture(scope="module", params=["qwen2_5_omni", "qwen3_omni_moe"])
def tiny(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, make_tiny(request.param, tmp_path_factory.mktemp(request.param), seed=0)


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_unknown_pipeline_is_rejected():
    assert {"qwen2_5_omni", "qwen3_omni_moe", "llama", "diffusion"} <= set(tiny_names())
    with pytest.raises(ValueError, match="qwen2_5_omni"):
        make_tiny("nope", "/nonexistent")


def test_real_format_files(tiny):
    name, path = tiny
    for file in COMMON_FILES:
        assert (path / file).is_file(), file
    assert (path / "spk_dict.pt").is_file() == (name == "qwen2_5_omni")
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == name
    text = config["thinker_config"]["text_config"]
    assert text["hidden_size"] // text["num_attention_heads"] == 32  # vLLM CPU head sizes
    assert text["vocab_size"] == 152064
    video = json.loads((path / "video_preprocessor_config.json").read_text())
    assert video["merge_size"] == 2


def test_tokenizer_has_qwen_ids_and_round_trips(tiny):
    from transformers import AutoTokenizer

    name, path = tiny
    tok = AutoTokenizer.from_pretrained(path)
    for token, want in SPECIAL_IDS[name].items():
        assert tok.convert_tokens_to_ids(token) == want, token
    assert tok.encode("user") == [872] and tok.encode("assistant") == [77091]
    text = "Hello! What's in this picture? 123 é"
    assert tok.decode(tok.encode(text)) == text
    config = json.loads((path / "config.json").read_text())["thinker_config"]
    audio_id = config.get("audio_token_id", config.get("audio_token_index"))
    assert tok.convert_tokens_to_ids(tok.audio_token) == audio_id
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    assert tok.audio_token in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_feature_extractor_and_image_processor_load_offline(tiny):
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    _, path = tiny
    assert WhisperFeatureExtractor.from_pretrained(path).feature_size == 128
    assert Qwen2VLImageProcessorPil.from_pretrained(path).merge_size == 2


def test_transformers_generates_text_and_audio(tiny):
    from transformers import (
        AutoTokenizer,
        Qwen2_5OmniForConditionalGeneration,
        Qwen3OmniMoeForConditionalGeneration,
    )

    name, path = tiny
    cls = {"qwen2_5_omni": Qwen2_5OmniForConditionalGeneration,
           "qwen3_omni_moe": Qwen3OmniMoeForConditionalGeneration}[name]  # fmt: skip
    model = cls.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hello!"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, return_tensors="pt").input_ids
    speaker = "Chelsie" if name == "qwen2_5_omni" else "ethan"
    seq, wav = model.generate(
        input_ids=ids, speaker=speaker, thinker_max_new_tokens=6, thinker_do_sample=False,
        talker_max_new_tokens=12, talker_do_sample=False,
    )  # fmt: skip
    assert seq.shape[1] > ids.shape[1]
    assert tok.decode(seq[0, ids.shape[1] :])
    assert wav.numel() > 0 and torch.isfinite(wav).all()


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    first = make_tiny("qwen3_omni_moe", tmp_path / "a", seed=0)
    again = make_tiny("qwen3_omni_moe", tmp_path / "b", seed=0)
    other = make_tiny("qwen3_omni_moe", tmp_path / "c", seed=1)
    assert _digest(first) == _digest(again) != _digest(other)
    assert (first / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
