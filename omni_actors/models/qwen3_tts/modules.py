"""Qwen3-TTS's talker, code predictor and 12 Hz codec decoder as torch modules, and their loaders.

transformers has no `qwen3_tts`, so the parts are assembled here from the
architecture the public checkpoint layout describes (config.json model_type
"qwen3_tts"; weights `talker.*`; the codec in `speech_tokenizer/`, model_type
"qwen3_tts_tokenizer_12hz", weights `decoder.*` and `encoder.*`):

- talker: dense Qwen3 decoder layers (q/k norms, SwiGLU) over codec embeddings
  (`talker.model.codec_embedding`), plus its own text table
  (`talker.model.text_embedding`, text_hidden_size wide) and a two-layer
  projection to its width (`talker.text_projection.linear_fc1/fc2`, biased, act
  between); `talker.codec_head` scores code group 0. Its rotary positions are
  multimodal in the original, but a text-only prompt has all three axes equal,
  where that is plain 1-D RoPE: transformers' `Qwen3Model` runs the layers.
- code predictor: a smaller Qwen3 decoder (`talker.code_predictor.model.*`) whose
  inputs (talker state, then code embeddings of the *talker's* width,
  `codec_embedding.{g}` for group g + 1) go through `small_to_mtp_projection`
  first when the widths differ; `lm_head.{g}` scores group g + 1.
- codec decoder: split residual VQ (group 0 through `quantizer.rvq_first`, the
  rest through `rvq_rest`; each codebook's table is `embedding_sum /
  cluster_usage`, each half projected out by a 1x1 conv), a causal `pre_conv` to
  `latent_dim`, a sliding-window transformer between `input_proj` / `output_proj`,
  then the upsampler and SnakeBeta decoder blocks, which are Qwen3-Omni-MoE's
  code2wav blocks (transformers' classes are used for those and the transformer
  layers).
- speaker encoder (`speaker_encoder.*`, Base checkpoints only): an ECAPA-TDNN, transformers'
  Qwen2.5-Omni `ECAPA_TimeDelayNet` (the same blocks and names): a clip's speaker embedding for
  voice cloning (clone.py, with the codec's Mimi encoder from codec_model.py).

Every loader checks the state dict both ways: a weight the modules lack or a
module weight the folder lacks is a ValueError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

CODEBOOK_EPS = 1e-5


def read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path / 'config.json'}: cannot read ({err})") from err
    if config.get("model_type") != "qwen3_tts":
        raise ValueError(f"{path}: model_type {config.get('model_type')!r} is not 'qwen3_tts'")
    return config


def _qwen3(c: dict[str, Any], vocab: int) -> Any:
    from transformers import Qwen3Config

    heads = c["num_attention_heads"]
    rope = c.get("rope_scaling") or {}
    return Qwen3Config(
        vocab_size=vocab, hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=c.get("num_key_value_heads", heads),
        head_dim=c.get("head_dim") or c["hidden_size"] // heads, hidden_act=c.get("hidden_act", "silu"),
        rms_norm_eps=c.get("rms_norm_eps", 1e-6), attention_bias=c.get("attention_bias", False),
        max_position_embeddings=c.get("max_position_embeddings", 32768), tie_word_embeddings=False,
        rope_parameters={"rope_type": rope.get("rope_type", "default"), "rope_theta": c.get("rope_theta", 10000)},
    )  # fmt: skip


class TextProjection(nn.Module):
    def __init__(self, width: int, out: int, act: str) -> None:
        from transformers.activations import ACT2FN

        super().__init__()
        self.linear_fc1 = nn.Linear(width, width, bias=True)
        self.linear_fc2 = nn.Linear(width, out, bias=True)
        self.act = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class CodePredictor(nn.Module):
    """`talker.code_predictor`: attributes as CodePredictorRunner reads them (model, lm_head, config)."""

    def __init__(self, pc: dict[str, Any], talker_width: int) -> None:
        from transformers import Qwen3Model

        super().__init__()
        groups = pc["num_code_groups"]
        self.config = _qwen3(pc, pc["vocab_size"])
        self.model = Qwen3Model(self.config)
        self.model.embed_tokens = (
            None  # inputs are embeddings; the tables below are the talker's width
        )
        self.model.codec_embedding = nn.ModuleList(
            nn.Embedding(pc["vocab_size"], talker_width) for _ in range(groups - 1)
        )
        self.lm_head = nn.ModuleList(
            nn.Linear(pc["hidden_size"], pc["vocab_size"], bias=False) for _ in range(groups - 1)
        )
        if pc["hidden_size"] != talker_width:
            self.small_to_mtp_projection = nn.Linear(talker_width, pc["hidden_size"], bias=True)
            # Every predictor pass takes talker-width inputs; project them on the way in.
            self.model.register_forward_pre_hook(self._project, with_kwargs=True)

    def _project(self, module, args, kwargs):
        kwargs["inputs_embeds"] = self.small_to_mtp_projection(kwargs["inputs_embeds"])
        return args, kwargs

    def get_input_embeddings(self) -> nn.ModuleList:
        return self.model.codec_embedding


class Talker(nn.Module):
    """`talker.*` of a qwen3_tts folder (see the module docstring)."""

    def __init__(self, tc: dict[str, Any]) -> None:
        from transformers import Qwen3Model

        super().__init__()
        self.config = _qwen3(tc, tc["vocab_size"])
        self.model = Qwen3Model(self.config)  # embed_tokens is the codec table
        self.model.text_embedding = nn.Embedding(tc["text_vocab_size"], tc["text_hidden_size"])
        self.text_projection = TextProjection(
            tc["text_hidden_size"], tc["hidden_size"], tc.get("hidden_act", "silu")
        )
        self.codec_head = nn.Linear(tc["hidden_size"], tc["vocab_size"], bias=False)
        pc = {"num_code_groups": tc["num_code_groups"], **tc["code_predictor_config"]}
        self.code_predictor = CodePredictor(pc, tc["hidden_size"])

    @property
    def dtype(self) -> torch.dtype:
        return self.codec_head.weight.dtype

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def text(self, ids: torch.Tensor) -> torch.Tensor:
        """Projected text embeddings of token ids."""
        return self.text_projection(self.model.text_embedding(ids))


TALKER_RENAMES = (("model.codec_embedding.", "model.embed_tokens."),)
"""Checkpoint name (after `talker.`) -> module name."""


def talker_state(talker: Talker) -> dict[str, torch.Tensor]:
    """The talker's weights under their checkpoint names (what make-tiny writes)."""
    out = {}
    for name, t in talker.state_dict().items():
        for ckpt, ours in TALKER_RENAMES:
            if name.startswith(ours):
                name = ckpt + name[len(ours) :]
        out[f"talker.{name}"] = t
    return out


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file() else ["model.safetensors"]
    )  # fmt: skip
    state: dict[str, torch.Tensor] = {}
    for name in files:
        if not (folder / name).is_file():
            raise ValueError(f"{folder / name}: missing")
        state.update(load_file(folder / name))
    return state


def _load_strict(module: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"{where}: weights do not match (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    for name, t in state.items():
        if t.shape != own[name].shape:
            raise ValueError(
                f"{where}: {name} has shape {tuple(t.shape)}, expected {tuple(own[name].shape)}"
            )
    module.load_state_dict(state, strict=True)


def speaker_encoder(sc: dict[str, Any]) -> nn.Module:
    """`speaker_encoder.*` (Base checkpoints): an ECAPA-TDNN, transformers' Qwen2.5-Omni one (same blocks)."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniDiTConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import ECAPA_TimeDelayNet

    keys = ("mel_dim", "enc_dim", "enc_channels", "enc_kernel_sizes", "enc_dilations", "enc_attention_channels",
            "enc_res2net_scale", "enc_se_channels")  # fmt: skip
    return ECAPA_TimeDelayNet(Qwen2_5OmniDiTConfig(**{k: sc[k] for k in keys if k in sc}))


def load_talker(
    path: Path, device: Any, dtype: torch.dtype
) -> tuple[Talker, nn.Module | None, dict[str, Any]]:
    """The talker (with its code predictor) of a qwen3_tts folder, and its speaker encoder where the
    folder has one (Base checkpoints); every weight checked."""
    config = read_config(path)
    talker = Talker(config["talker_config"])
    state: dict[str, dict[str, torch.Tensor]] = {"talker": {}, "speaker_encoder": {}}
    for name, t in _read_weights(path).items():
        head, _, name = name.partition(".")
        if head not in state:
            raise ValueError(f"{path}: unexpected weight {head}.{name}")
        for ckpt, ours in TALKER_RENAMES if head == "talker" else ():
            if name.startswith(ckpt):
                name = ours + name[len(ckpt) :]
        state[head][name] = t
    _load_strict(talker, state["talker"], f"{path}: talker")
    encoder = None
    if state["speaker_encoder"] or config.get("tts_model_type") == "base":
        encoder = speaker_encoder(config["speaker_encoder_config"])
        _load_strict(encoder, state["speaker_encoder"], f"{path}: speaker encoder")
        encoder = encoder.to(device=device, dtype=dtype).eval()
    return talker.to(device=device, dtype=dtype).eval(), encoder, config
