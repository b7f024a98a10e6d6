"""Tiny random-weight Higgs-Audio-V2 checkpoints (dual-FFN Llama LM + audio tokenizer) in the real on-disk format.

`make_tiny_higgs_audio_v2` writes what `HiggsAudioV2ForConditionalGeneration.from_pretrained`
and `HiggsAudioV2Processor` read from a transformers Higgs-Audio-V2 folder: `config.json`
(model_type "higgs_audio_v2": 8 codebooks of 1024 codes plus the stream bos/eos ids 1024
and 1025, so `codebook_size` 1026), `model.safetensors`, `generation_config.json`, a fast
tokenizer with Higgs's Llama 3 special tokens (`<|audio_out_bos|>`, `<|AUDIO_OUT|>`,
`<|audio_eos|>`, the delay token `<|reserved_special_token_6|>`, ...), a chat template,
the `DacFeatureExtractor` and `processor_config.json`. The real processor names its audio
tokenizer by hub id; here the `HiggsAudioV2TokenizerModel` folder is written beside the
weights in `audio_tokenizer/` and `processor_config.json` names that folder
(models/higgs_audio_v2/codec_loading.py resolves either).

The audio tokenizer keeps the real layout where it sets timing and receptive field: 24 kHz,
DAC strides 8-5-4-2-3 (960 samples, 25 frames a second), a HuBERT semantic model with
HuBERT's 320x feature strides at 16 kHz, 8 quantizers of 1024 codes; all widths are narrow.

The LM's audio head gives the stream bos and eos columns zero weight (logit 0 against peaked
random logits): random weights then never end a request early, so each request makes its
frame budget, a fixed length (the end path is unit-tested in tests/models/test_higgs_audio_v2_parts.py).

`make_higgs_audio_v2_3b_sized` writes the same layout at Higgs-Audio-V2-generation-3B's real sizes
(a Llama-3.2-3B-sized LM: 28 layers of width 3072, 24 heads of 128, 8 KV heads, a 128,256-token
embedding, and an audio FFN beside every layer's: 5.4 B parameters, as the released model; the audio
tokenizer at transformers' defaults, which are the released ones), random weights in bfloat16
(10.8 GB, ~2 min on 2 CPU cores), for GPU benchmarks; 10 s of audio a request.
"""

from __future__ import annotations

import json
from pathlib import Path

from omni_actors.models.tiny.common import build_device, byte_bpe

SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|audio_bos|>", "<|audio_eos|>", "<|audio_out_bos|>", "<|AUDIO|>", "<|AUDIO_OUT|>",
    "<|reserved_special_token_6|>", "<|scene_desc_start|>", "<|scene_desc_end|>",
]  # fmt: skip
CHAT_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'audio' %}{{ '<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n<|audio_out_bos|>' }}{% endif %}"
)
"""Llama 3's turns; an audio part is `<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>` and the generation
prompt opens the assistant's audio, as Higgs's prompts do."""
_CORPUS = [
    "Generate audio following instruction. Audio is recorded from a quiet room.",
    "Hello there, how are you? The quick brown fox jumps over the lazy dog. [SPEAKER0] [SPEAKER1]",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? : ; ' \" , .",
]
TEXT_VOCAB = 384
NUM_CODEBOOKS = 8
CODES = 1024
TINY_MAX_STEPS = 40
"""generation_config max_new_tokens: 40 steps, the first 8 the delay's ramp: 32 frames, 1.28 s of audio."""


def _tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = byte_bpe(_CORPUS, TEXT_VOCAB - len(SPECIALS), SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>", unk_token=None, model_max_length=4096,
    )  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _audio_tokenizer(seed: int, real_sizes: bool = False):
    import torch
    from transformers import HiggsAudioV2TokenizerConfig

    from omni_actors.models.higgs_audio_v2.codec_loading import tokenizer_class

    ratios = [8, 5, 4, 2, 3]  # 960 samples a frame: 25 frames a second at 24 kHz
    if real_sizes:  # the real tokenizer's widths are the config's defaults; its rate and codebooks are not
        config = HiggsAudioV2TokenizerConfig(
            target_bandwidths=[0.5, 1, 1.5, 2],  # 2 kbps at 25 Hz of 10-bit codes: 8 codebooks
            acoustic_model_config={"downsampling_ratios": ratios, "upsampling_ratios": ratios},
        )
        assert config.num_quantizers == NUM_CODEBOOKS and config.frame_rate == 25
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            return tokenizer_class()(config).eval()
    config = HiggsAudioV2TokenizerConfig(
        target_bandwidths=[0.5, 1, 1.5, 2], codebook_size=CODES, codebook_dim=8,
        acoustic_model_config={
            "encoder_hidden_size": 4, "downsampling_ratios": ratios, "decoder_hidden_size": 64,
            "upsampling_ratios": ratios, "hidden_size": 16, "codebook_dim": 4,
        },
        semantic_model_config={
            "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
            "conv_dim": [8] * 7, "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
        },
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        model = tokenizer_class()(config)
        with torch.no_grad():  # audio that varies with the codes and stays inside [-1, 1]
            for name, p in model.named_parameters():
                if "codebook" in name:
                    p.normal_(0.0, 1.0)
                elif p.dim() > 1 and name.startswith(("acoustic_decoder", "fc2")):
                    p.normal_(0.0, 0.7 * p[0].numel() ** -0.5)
            for name, buf in model.named_buffers():
                if name.endswith("embed"):
                    buf.normal_(0.0, 1.0)
    return model.eval()


TINY_LM = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 32}
SIZED_LM = {"vocab_size": 128256, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
            "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128}
"""Higgs-Audio-V2-generation-3B's LM (Llama 3.2 3B's sizes)."""
SIZED_MAX_STEPS = 258
"""10 s of audio (250 frames at 25 a second) after the delay's 8-step ramp."""


def make_tiny_higgs_audio_v2(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Higgs-Audio-V2 folder (its audio tokenizer in `audio_tokenizer/`) into `out_dir`."""
    return _write(out_dir, seed, TINY_LM, TINY_MAX_STEPS, sized=False)


def make_higgs_audio_v2_3b_sized(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random-weight folder at Higgs-Audio-V2-generation-3B's real sizes (GPU benchmarks)."""
    return _write(out_dir, seed, SIZED_LM, SIZED_MAX_STEPS, sized=True)


def _write(out_dir: str | Path, seed: int, sizes: dict, max_steps: int, sized: bool) -> Path:
    import torch
    from transformers import (
        DacFeatureExtractor,
        GenerationConfig,
        HiggsAudioV2Config,
        HiggsAudioV2ForConditionalGeneration,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    ids = {name: tok.convert_tokens_to_ids(name) for name in SPECIALS}
    config = HiggsAudioV2Config(
        **{"vocab_size": max(TEXT_VOCAB, len(tok)), **sizes}, max_position_embeddings=4096,
        pad_token_id=ids["<|end_of_text|>"], bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=ids["<|eot_id|>"], num_codebooks=NUM_CODEBOOKS, codebook_size=CODES + 2,
        audio_token_id=ids["<|AUDIO_OUT|>"], audio_bos_token_id=ids["<|audio_out_bos|>"],
        audio_delay_token_id=ids["<|reserved_special_token_6|>"],
        audio_stream_bos_id=CODES, audio_stream_eos_id=CODES + 1, dtype="bfloat16" if sized else "float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if sized:  # built in bfloat16 (half the memory), at the config's own initialisation
            with build_device(sized):
                model = HiggsAudioV2ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
        else:
            model = HiggsAudioV2ForConditionalGeneration(config)
        with torch.no_grad():
            for p in model.parameters():  # peaked random logits: seed-dependent, varied codes
                if p.dim() > 1 and not sized:
                    p.normal_(0.0, 0.3)
            head = model.audio_lm_head.weight.view(NUM_CODEBOOKS, CODES + 2, -1)
            head[:, CODES:] = 0.0  # stream bos/eos: logit 0, never in the top 50 (see the docstring)
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.7, top_k=50, top_p=0.95, max_new_tokens=max_steps,
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
    )  # fmt: skip
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    _audio_tokenizer(seed, real_sizes=sized).save_pretrained(out / "audio_tokenizer", safe_serialization=True)
    DacFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0, hop_length=960).save_pretrained(out)
    processor = {
        "processor_class": "HiggsAudioV2Processor",
        "audio_tokenizer": {
            "audio_tokenizer_class": "HiggsAudioV2TokenizerModel", "audio_tokenizer_name_or_path": "audio_tokenizer",
        },
    }  # fmt: skip
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return out


if __name__ == "__main__":
    import sys

    print(make_tiny_higgs_audio_v2(sys.argv[1] if len(sys.argv) > 1 else "tiny-higgs_audio_v2"))
