"""`make-tiny` entry points of the diffusers image families: one function per name, each `(out_dir, seed) -> Path`.

Every builder writes a real diffusers folder with the family's real pipeline,
transformer, VAE, scheduler, text encoder and tokenizer classes at tiny widths
(docs/media.md lists them and what could not be built offline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_actors.models.tiny.common import byte_bpe, seeded_pipeline
from omni_actors.models.tiny.text_encoders import (
    QWEN3_TEXT_HIDDEN,
    byt5_glyph_encoder,
    qwen3_config,
)


def qwen_image(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image")


def qwen_image_edit(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image_edit")


def qwen_image_edit_plus(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image_edit_plus")


def qwen_image_layered(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.qwen_image import make_tiny_qwen_image

    return make_tiny_qwen_image(out_dir, seed, "qwen_image_layered")


def longcat_image(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.longcat_image import make_tiny_longcat_image

    return make_tiny_longcat_image(out_dir, seed, "longcat_image")


def longcat_image_edit(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.longcat_image import make_tiny_longcat_image

    return make_tiny_longcat_image(out_dir, seed, "longcat_image_edit")


def glm_image(out_dir: str | Path, seed: int = 0) -> Path:
    from omni_actors.models.tiny.glm_image import make_tiny_glm_image

    return make_tiny_glm_image(out_dir, seed)


def z_image(out_dir: str | Path, seed: int = 0) -> Path:
    """Z-Image: ZImageTransformer2DModel, AutoencoderKL (16 latent channels), a Qwen3 text encoder."""
    return seeded_pipeline(out_dir, seed, lambda: _z_image(seed))


def _z_image(seed: int) -> Any:
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        ZImagePipeline,
        ZImageTransformer2DModel,
    )
    from transformers import Qwen3Model

    from omni_actors.models.tiny.qwen_image import qwen_vl_tokenizer

    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2,
        n_refiner_layers=1, n_heads=2, n_kv_heads=2, qk_norm=True, cap_feat_dim=QWEN3_TEXT_HIDDEN,
        axes_dims=[8, 4, 4], axes_lens=[256, 32, 32],
    )  # fmt: skip
    with torch.no_grad():  # made with torch.empty: give them values a saved file can hold
        transformer.x_pad_token.normal_()
        transformer.cap_pad_token.normal_()
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[32, 64], layers_per_block=1,
        latent_channels=16, norm_num_groups=32, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
    )  # fmt: skip
    return ZImagePipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=Qwen3Model(qwen3_config(2)), tokenizer=qwen_vl_tokenizer(seed),
    )  # fmt: skip


def hunyuan_image(out_dir: str | Path, seed: int = 0) -> Path:
    """HunyuanImage-2.1: its transformer and 2-D VAE, a Qwen2.5-VL and a ByT5 (T5 encoder) text encoder, APG guiders."""
    import torch
    from diffusers import (
        AdaptiveProjectedMixGuidance,
        AutoencoderKLHunyuanImage,
        FlowMatchEulerDiscreteScheduler,
        HunyuanImagePipeline,
        HunyuanImageTransformer2DModel,
    )
    from transformers import ByT5Tokenizer

    from omni_actors.models.tiny.qwen_image import (
        TEXT_HIDDEN,
        qwen_vl_text_encoder,
        qwen_vl_tokenizer,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HunyuanImageTransformer2DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
            num_single_layers=1, num_refiner_layers=1, patch_size=(1, 1), guidance_embeds=False,
            text_embed_dim=TEXT_HIDDEN, text_embed_2_dim=32, rope_axes_dim=(8, 8),
        )  # fmt: skip
        vae = AutoencoderKLHunyuanImage(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64, 64, 64),
            layers_per_block=1, scaling_factor=0.476986, spatial_compression_ratio=8, sample_size=128,
        )  # fmt: skip
        byt5 = byt5_glyph_encoder()
        pipe = HunyuanImagePipeline(
            transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
            text_encoder=qwen_vl_text_encoder(), tokenizer=qwen_vl_tokenizer(seed),
            text_encoder_2=byt5, tokenizer_2=ByT5Tokenizer(),
            guider=AdaptiveProjectedMixGuidance(adaptive_projected_guidance_start_step=2),
            ocr_guider=AdaptiveProjectedMixGuidance(adaptive_projected_guidance_start_step=3),
        )  # fmt: skip
    pipe.save_pretrained(out, safe_serialization=True)
    return out


_FLUX2_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                   "[IMG]", "[IMG_BREAK]", "[IMG_END]"]  # fmt: skip
_FLUX2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{% elif m['role'] == 'user' %}[INST]{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}{% elif c['type'] == 'image' %}[IMG]{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if m['role'] == 'system' %}[/SYSTEM_PROMPT]{% elif m['role'] == 'user' %}[/INST]{% endif %}"
    "{% endfor %}"
)
"""Mistral's chat layout ([SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]) over content lists."""


def _flux2_tokenizer() -> Any:
    """Mistral-Small-3.x's tokenizer layout over a byte-level BPE trained offline."""
    from transformers import PreTrainedTokenizerFast

    tok = byte_bpe(["a photo of a red cube on a table", "a dog is dancing in the garden at night"] * 8, 600,
                   _FLUX2_SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=4096, chat_template=_FLUX2_TEMPLATE)


def _write_pixtral_processor(folder: Path, tokenizer: Any) -> None:
    """A PixtralProcessor folder as FLUX.2 ships its `tokenizer`, written without constructing one.

    transformers 5.19 builds a PixtralProcessor only with torchvision; the files
    are the real ones: tokenizer, preprocessor_config.json (PixtralImageProcessor),
    processor_config.json, chat_template.jinja.
    """
    import json

    from transformers import PixtralImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    image = PixtralImageProcessorPil(patch_size=8, size={"longest_edge": 64}).to_dict()
    image.update(image_processor_type="PixtralImageProcessor", processor_class="PixtralProcessor")
    (folder / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    processor = {"processor_class": "PixtralProcessor", "patch_size": 8, "spatial_merge_size": 1,
                 "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2))
    (folder / "chat_template.jinja").write_text(_FLUX2_TEMPLATE)


def flux2(out_dir: str | Path, seed: int = 0) -> Path:
    """FLUX.2 [dev]: Flux2Transformer2DModel, AutoencoderKLFlux2, a Mistral3 text encoder and its Pixtral processor.

    The processor folder is written by hand (see _write_pixtral_processor); served
    here, it loads as its tokenizer (models/diffusion/processors.py).

    The text encoder has 30 layers (tiny ones) because the pipeline reads hidden states 10, 20 and 30.
    """
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2Pipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    from omni_actors.models.tiny.qwen_image import name_component

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = _flux2_tokenizer()
        ids = tokenizer.convert_tokens_to_ids
        hidden = 16
        text_encoder = Mistral3ForConditionalGeneration(Mistral3Config(
            text_config={
                "model_type": "mistral", "vocab_size": len(tokenizer), "hidden_size": hidden,
                "intermediate_size": 32, "max_position_embeddings": 4096, "num_attention_heads": 2,
                "num_hidden_layers": 30, "num_key_value_heads": 1, "head_dim": 8, "sliding_window": None,
                "bos_token_id": ids("<s>"), "eos_token_id": ids("</s>"), "pad_token_id": ids("<pad>"),
            },
            vision_config={"model_type": "pixtral", "hidden_size": 16, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "intermediate_size": 32, "image_size": 64, "patch_size": 8,
                           "num_channels": 3},
            image_token_index=ids("[IMG]"), spatial_merge_size=1, vision_feature_layer=-1,
        )).eval()  # fmt: skip
        transformer = Flux2Transformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=hidden * 3, timestep_guidance_channels=256,
            axes_dims_rope=[4, 4, 4, 4],
        )  # fmt: skip
        vae = AutoencoderKLFlux2(
            sample_size=32, in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), layers_per_block=1,
            latent_channels=4, norm_num_groups=16, use_quant_conv=False, use_post_quant_conv=False,
        )  # fmt: skip
        pipe = Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=None, transformer=transformer)
    pipe.save_pretrained(out, safe_serialization=True)
    _write_pixtral_processor(out / "tokenizer", tokenizer)
    name_component(out, "tokenizer", "transformers", "PixtralProcessor")
    return out
