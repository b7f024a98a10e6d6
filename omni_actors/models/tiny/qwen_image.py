"""Tiny random-weight Qwen-Image checkpoints (text-to-image, Edit, Edit-Plus, Layered) in the real diffusers layout.

Real classes throughout: QwenImageTransformer2DModel, AutoencoderKLQwenImage,
FlowMatchEulerDiscreteScheduler, a Qwen2.5-VL text encoder with Qwen's real
vocabulary size and special-token ids, the offline Qwen2Tokenizer (see
qwen2_5_omni.py) and, for the edit variants, a Qwen2VLProcessor. Widths are
tiny; 32-64 px images denoise in well under a second a step on one CPU core.
Also home of the Qwen2.5-VL parts that LongCat-Image and HunyuanImage share.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_actors.models.tiny.qwen2_5_omni import build_qwen_tokenizer, chat_template

QWEN2_5_VL_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
"""Qwen2.5-VL's added tokens, in id order from 151643."""

QWEN2_5_VL_EXTRA = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"}  # fmt: skip

TEXT_HIDDEN = 32
"""The tiny text encoder's width (the transformer's joint_attention_dim)."""

VARIANTS = {
    "qwen_image": "QwenImagePipeline",
    "qwen_image_edit": "QwenImageEditPipeline",
    "qwen_image_edit_plus": "QwenImageEditPlusPipeline",
    "qwen_image_layered": "QwenImageLayeredPipeline",
}


def qwen_vl_tokenizer(seed: int = 0) -> Any:
    """Qwen2.5-VL's tokenizer, built offline: real vocabulary size, specials at their real ids."""
    return build_qwen_tokenizer(
        QWEN2_5_VL_SPECIALS,
        QWEN2_5_VL_EXTRA,
        chat_template("<|vision_start|><|image_pad|><|vision_end|>", "", "<|vision_start|><|video_pad|><|vision_end|>"),
        seed=seed,
    )


QWEN_VL_PIXELS = {"min_pixels": 4 * 28 * 28, "max_pixels": 16 * 28 * 28}
"""Small pixel bounds: few vision tokens per image."""


def qwen_vl_image_processor() -> Any:
    """Qwen2-VL's image processor (PIL backend) with QWEN_VL_PIXELS bounds."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(size=_qwen_vl_size(), **QWEN_VL_PIXELS)


def _qwen_vl_size() -> dict[str, int]:
    return {"shortest_edge": QWEN_VL_PIXELS["min_pixels"], "longest_edge": QWEN_VL_PIXELS["max_pixels"]}


def write_qwen_vl_processor(folder: Path, tokenizer: Any) -> None:
    """Write a Qwen2VLProcessor folder as Qwen-Image-Edit ships it, without constructing one.

    transformers 5.19 builds a Qwen2VLProcessor only with torchvision (its video
    processor); the files are the real ones: tokenizer, preprocessor_config.json
    (Qwen2VLImageProcessor), video_preprocessor_config.json, chat_template.jinja.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    image = qwen_vl_image_processor()
    size = _qwen_vl_size()
    config = {**image.to_dict(), "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}
    (folder / "preprocessor_config.json").write_text(json.dumps(config, indent=2))
    video = {key: config[key] for key in ("do_resize", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
                                          "image_std", "do_convert_rgb", "patch_size", "temporal_patch_size",
                                          "merge_size")}  # fmt: skip
    video.update(size=size, **QWEN_VL_PIXELS, video_processor_type="Qwen2VLVideoProcessor",
                 processor_class="Qwen2VLProcessor")  # fmt: skip
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    (folder / "chat_template.jinja").write_text(tokenizer.chat_template)


def name_component(out: Path, name: str, library: str, class_name: str) -> None:
    """Record component `name` in out/model_index.json as `[library, class_name]` (one written by hand)."""
    index_file = out / "model_index.json"
    index = json.loads(index_file.read_text())
    index[name] = [library, class_name]
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def qwen_vl_text_encoder(hidden: int = TEXT_HIDDEN) -> Any:
    """A tiny Qwen2_5_VLForConditionalGeneration with the real vocabulary and vision token ids."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    head_dim = 16
    half = head_dim // 2
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 152064, "hidden_size": hidden, "intermediate_size": hidden * 2,
            "num_hidden_layers": 2, "num_attention_heads": hidden // head_dim, "num_key_value_heads": 1,
            "max_position_embeddings": 32768, "max_window_layers": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                "mrope_section": [half // 4, half * 3 // 8, half * 3 // 8]},
        },
        vision_config={
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": hidden, "fullatt_block_indexes": [0], "window_size": 112,
        },
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
        vision_end_token_id=151653, vision_token_id=151654,
    )  # fmt: skip
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def make_tiny_qwen_image(out_dir: str | Path, seed: int = 0, variant: str = "qwen_image") -> Path:
    """Write a tiny Qwen-Image pipeline of `variant` (see VARIANTS) to `out_dir`; return the folder."""
    import diffusers
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageTransformer2DModel,
    )

    if variant not in VARIANTS:
        raise ValueError(f"unknown Qwen-Image variant {variant!r}; expected one of {sorted(VARIANTS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layered = variant == "qwen_image_layered"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        z_dim = 8 if layered else 4  # the layered pipeline takes a 4-channel input for latents when z_dim is 4
        # The edit pipelines resize every input image to about a megapixel before the VAE encodes it: give
        # them the real 8x VAE (three downsamples, so its mid-block attention sees 128x128, not 256x256), 4 wide
        # (a megapixel through 8-wide causal 3D convolutions took 4 s of a 6 s edit on one CPU thread).
        levels, base_dim = (2, z_dim * 6) if variant == "qwen_image" else (3, 4)
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=z_dim * 4, out_channels=z_dim, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=TEXT_HIDDEN, guidance_embeds=False,
            axes_dims_rope=(8, 4, 4), use_layer3d_rope=layered, use_additional_t_cond=layered,
        )  # fmt: skip
        vae = AutoencoderKLQwenImage(
            base_dim=base_dim, z_dim=z_dim, dim_mult=[1, 2, 4, 4][: levels + 1],
            num_res_blocks=1, temperal_downsample=[False, True, True][:levels], latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
            input_channels=4 if layered else 3,
        )  # fmt: skip
        tokenizer = qwen_vl_tokenizer(seed)
        parts: dict[str, Any] = {
            "transformer": transformer,
            "vae": vae,
            "scheduler": FlowMatchEulerDiscreteScheduler(),
            "text_encoder": qwen_vl_text_encoder(),
            "tokenizer": tokenizer,
        }
        if variant != "qwen_image":
            parts["processor"] = None  # written by hand below
        pipe = getattr(diffusers, VARIANTS[variant])(**parts)
    pipe.save_pretrained(out, safe_serialization=True)
    if variant != "qwen_image":
        write_qwen_vl_processor(out / "processor", tokenizer)
        name_component(out, "processor", "transformers", "Qwen2VLProcessor")
    return out
