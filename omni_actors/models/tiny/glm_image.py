"""Tiny random-weight GLM-Image checkpoint in the real diffusers layout.

GLM-Image is an autoregressive prior plus a DiT decoder: the AR model
(GlmImageForConditionalGeneration: a GLM text model whose head predicts vision
tokens, a vision encoder and VQ quantizer for source images) writes a grid of
prior tokens, which the GlmImageTransformer2DModel denoises into latents for an
AutoencoderKL; a ByT5 encoder (T5EncoderModel + ByT5Tokenizer) embeds quoted
glyph text. The `processor` is a GlmImageProcessor (PIL image backend; no
torchvision) over a byte-level BPE trained offline whose special tokens play
GLM-Image's roles: `image_token` (expanded per source-image patch),
`grid_bos_token` / `grid_eos_token` (around the target grid sizes the processor
appends), and `bos_token`, the image-start token the AR model generates after.
Their ids are the tiny vocabulary's; the config's image_token_id,
image_start_token_id and image_end_token_id name them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_actors.models.tiny.common import byte_bpe
from omni_actors.models.tiny.text_encoders import byt5_glyph_encoder

_SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|image|>",
             "<|begin_of_image|>", "<|end_of_image|>", "<|grid_start|>", "<|grid_end|>"]  # fmt: skip
_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% endfor %}<|assistant|>\n"
)
"""GLM's chat layout; the processor appends the target grid and the image-start token after it."""
VISION_VOCAB = 128
"""Prior tokens: the AR head's outputs, the VQ codebook and the DiT's prior embedding share this size."""


def _tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    tok = byte_bpe(["a photo of a red cube on a table", "a sign that reads 'open' at night"] * 8, 600)
    # Specials after the text vocabulary, above the vision tokens the AR head emits (as in GLM-Image), so a
    # random prior never emits the image-end token and stops early.
    tok.add_special_tokens(_SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_image|>", eos_token="<|end_of_image|>",
        pad_token="<|endoftext|>", model_max_length=8192, chat_template=_TEMPLATE,
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<|grid_start|>",
                              "grid_eos_token": "<|grid_end|>"},
    )  # fmt: skip


def make_tiny_glm_image(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny GlmImagePipeline to `out_dir`; return the folder."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        GlmImagePipeline,
        GlmImageTransformer2DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        GlmImageConfig,
        GlmImageForConditionalGeneration,
        GlmImageImageProcessorPil,
        GlmImageProcessor,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = _tokenizer()
        ids = tokenizer.convert_tokens_to_ids
        # Patch 16 on the half-size image the processor makes: one vision token per 32 px, as the
        # prior's target grid (its fixed factor 32), so a condition image's tokens, upsampled 2x,
        # line up with its latents in the DiT.
        image = GlmImageImageProcessorPil(patch_size=16, temporal_patch_size=1, merge_size=1,
                                          min_pixels=32 * 32, max_pixels=512 * 512)  # fmt: skip
        processor = GlmImageProcessor(image_processor=image, tokenizer=tokenizer, chat_template=_TEMPLATE)
        prior = GlmImageForConditionalGeneration(GlmImageConfig(
            text_config={
                "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 512,
                "vision_vocab_size": VISION_VOCAB, "rope_parameters": {"mrope_section": (4, 2, 2)},
                "pad_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|end_of_image|>"),
            },
            vision_config={"depth": 2, "hidden_size": 32, "num_heads": 2, "image_size": 64, "patch_size": 16,
                           "intermediate_size": 32},
            vq_config={"embed_dim": 32, "num_embeddings": VISION_VOCAB, "latent_channels": 32},
            image_token_id=ids("<|image|>"), image_start_token_id=ids("<|begin_of_image|>"),
            image_end_token_id=ids("<|end_of_image|>"),
        )).eval()  # fmt: skip
        glyph = byt5_glyph_encoder()
        # patch_size x the VAE's 8x = 16: the AR grid (one token per 32 px) is upsampled 2x to the DiT's
        transformer = GlmImageTransformer2DModel(
            patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
            text_embed_dim=32, time_embed_dim=16, condition_dim=8, prior_vq_quantizer_codebook_size=VISION_VOCAB,
        )  # fmt: skip
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
            up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=(4, 8, 16, 16), layers_per_block=1,
            latent_channels=4, norm_num_groups=4, sample_size=128, latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
        )  # fmt: skip
        pipe = GlmImagePipeline(
            tokenizer=ByT5Tokenizer(), processor=processor, text_encoder=glyph, vision_language_encoder=prior,
            vae=vae, transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(),
        )  # fmt: skip
    pipe.save_pretrained(out, safe_serialization=True)
    return out
