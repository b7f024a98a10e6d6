"""Qwen3-TTS's 12 Hz codec (`speech_tokenizer/`): the decoder as torch modules, the Mimi encoder half, the loader.

Decoder (names as `decoder.*` in the folder): split residual VQ -> causal
`pre_conv` (codebook_dim -> latent_dim, kernel 3) -> `pre_transformer`
(`input_proj` latent -> hidden, sliding-window layers, norm, `output_proj`
hidden -> latent) -> `upsample` (transposed conv + ConvNeXt per ratio) ->
`decoder` (conv, SnakeBeta blocks, SnakeBeta, conv) -> clamp to [-1, 1]. The
transformer layers, upsampler and decoder blocks are transformers'
Qwen3-Omni-MoE code2wav classes (same weights, same maths); the quantizer and
projections are written here. The encoder (`encoder.*`) is transformers'
MimiModel without its decoder half.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omni_actors.models.mimi import conv_shapes_on_host
from omni_actors.models.qwen3_tts.modules import CODEBOOK_EPS, _load_strict, _read_weights


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPS)[:, None]


class _Layer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(size, dim) for _ in range(n))


class HalfRVQ(nn.Module):
    """One half of the split quantizer: codebooks of `dim` // 2, 1x1 convs in and out of `dim`."""

    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        half = dim // 2
        self.input_proj = nn.Conv1d(dim, half, 1, bias=False)  # encoding side; kept for the layout
        self.output_proj = nn.Conv1d(half, dim, 1, bias=False)
        self.vq = _Layers(n, size, half)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """[batch, n, time] codes -> [batch, dim, time]."""
        total = 0
        for k, layer in enumerate(self.vq.layers):
            total = total + nn.functional.embedding(codes[:, k], layer._codebook.table())
        return self.output_proj(total.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.rvq_first = HalfRVQ(1, size, dim)
        self.rvq_rest = HalfRVQ(n - 1, size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


def omni_config(dc: dict[str, Any], width: int) -> Any:
    """A Qwen3OmniMoeCode2WavConfig for transformers' blocks, `width` wide."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
    )

    extra = (
        {"head_dim": dc["head_dim"]} if dc.get("head_dim") else {}
    )  # may differ from hidden / heads
    return Qwen3OmniMoeCode2WavConfig(
        **extra,
        codebook_size=dc["codebook_size"], hidden_size=width,
        max_position_embeddings=dc.get("max_position_embeddings", 8000),
        rope_parameters={"rope_type": "default", "rope_theta": dc.get("rope_theta", 10000)},
        num_attention_heads=dc["num_attention_heads"], num_key_value_heads=dc["num_key_value_heads"],
        attention_bias=dc.get("attention_bias", False), sliding_window=dc.get("sliding_window", 72),
        intermediate_size=dc["intermediate_size"], hidden_act=dc.get("hidden_act", "silu"),
        layer_scale_initial_scale=dc.get("layer_scale_initial_scale", 0.01), rms_norm_eps=dc.get("rms_norm_eps", 1e-5),
        num_hidden_layers=dc["num_hidden_layers"], num_quantizers=dc["num_quantizers"],
        upsample_rates=tuple(dc["upsample_rates"]), upsampling_ratios=tuple(dc["upsampling_ratios"]),
        decoder_dim=dc["decoder_dim"],
    )  # fmt: skip


class CodecDecoder(nn.Module):
    """`decoder.*` of a speech_tokenizer folder: codes [batch, groups, frames] -> audio [batch, 1, samples]."""

    def __init__(self, dc: dict[str, Any]) -> None:
        from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

        super().__init__()
        latent, dim = dc["latent_dim"], dc["codebook_dim"]
        self.groups = dc["num_quantizers"]
        self.total_upsample = int(
            np.prod(list(dc["upsample_rates"]) + list(dc["upsampling_ratios"]))
        )
        self.quantizer = SplitRVQ(self.groups, dc["codebook_size"], dim)
        self.pre_conv = m.Qwen3OmniMoeCausalConvNet(dim, latent, 3)
        self.pre_transformer = m.Qwen3OmniMoeCode2WavTransformerModel(
            omni_config(dc, dc["hidden_size"])
        )
        self.pre_transformer.input_proj = nn.Linear(latent, dc["hidden_size"])
        self.pre_transformer.output_proj = nn.Linear(dc["hidden_size"], latent)
        blocks = omni_config(dc, latent)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    m.Qwen3OmniMoeCausalTransConvNet(latent, latent, r, r),
                    m.Qwen3OmniMoeConvNeXtBlock(latent),
                ]
            )
            for r in dc["upsampling_ratios"]
        )
        out = dc["decoder_dim"] // 2 ** len(dc["upsample_rates"])
        self.decoder = nn.ModuleList(
            [m.Qwen3OmniMoeCausalConvNet(latent, dc["decoder_dim"], 7)]
            + [
                m.Qwen3OmniMoeCode2WavDecoderBlock(blocks, i)
                for i in range(len(dc["upsample_rates"]))
            ]
            + [m.Qwen3OmniMoeSnakeBeta(out), m.Qwen3OmniMoeCausalConvNet(out, 1, 7)]
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.shape[1] != self.groups:
            raise ValueError(f"expected {self.groups} code groups, got {codes.shape[1]}")
        x = self.pre_conv(self.quantizer.decode(codes)).transpose(1, 2)
        t = self.pre_transformer
        x = t.output_proj(t(inputs_embeds=t.input_proj(x)).last_hidden_state).transpose(1, 2)
        for pair in self.upsample:
            for block in pair:
                x = block(x)
        for block in self.decoder:
            x = block(x)
        return x.clamp(-1.0, 1.0)


def mimi_encoder(encoder_config: dict[str, Any]) -> nn.Module:
    """transformers' MimiModel without the decoder half (the layout's `encoder.*`)."""
    from transformers import MimiConfig, MimiModel

    cfg = {k: v for k, v in encoder_config.items() if k != "model_type"}
    model = MimiModel(MimiConfig(**cfg))
    model.upsample = model.decoder_transformer = model.decoder = None
    return model


def read_codec_config(path: Path) -> dict[str, Any]:
    folder = path / "speech_tokenizer"
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder / 'config.json'}: cannot read ({err})") from err
    if config.get("model_type") != "qwen3_tts_tokenizer_12hz":
        raise ValueError(
            f"{folder}: model_type {config.get('model_type')!r} is not 'qwen3_tts_tokenizer_12hz'"
        )
    return config


def load_codec(
    path: Path, device: Any, encoder: bool = False
) -> tuple[CodecDecoder, nn.Module | None, dict[str, Any]]:
    """The codec decoder (and with `encoder`, the Mimi encoder) of a qwen3_tts folder, float32, weights checked.

    Without `encoder` the `encoder.*` weights are left unread, but must be all that is left.
    """
    config = read_codec_config(path)
    decoder = CodecDecoder(config["decoder_config"])
    state = _read_weights(path / "speech_tokenizer")
    parts: dict[str, dict[str, torch.Tensor]] = {"decoder": {}, "encoder": {}}
    for name, t in state.items():
        head, _, rest = name.partition(".")
        if head not in parts:
            raise ValueError(f"{path / 'speech_tokenizer'}: unexpected weight {name}")
        parts[head][rest] = t
    _load_strict(
        decoder, {k: v.float() for k, v in parts["decoder"].items()}, f"{path}: codec decoder"
    )
    enc = None
    if encoder:
        enc = mimi_encoder(config["encoder_config"])
        _load_strict(enc, parts["encoder"], f"{path}: codec encoder")
        enc = enc.to(device).eval()
        conv_shapes_on_host(enc)  # no host sync per convolution when a clip is encoded
    return decoder.to(device).eval(), enc, config
