"""Faster, numerically equivalent pieces of Qwen2.5-Omni's Token2Wav, installed after loading.

Two things, both checked against transformers' own modules in
tests/models/test_qwen2_5_omni_fast_token2wav.py:

- `install_fast_vocoder(bigvgan)` swaps every anti-aliased activation of the
  BigVGAN vocoder (upsample x2 -> SnakeBeta -> downsample x2, 37 of them) for
  `FastAntiAliasedActivation`: the same depthwise convolutions in the same
  order, but replicate padding by concatenating edge slices (`F.pad(mode=
  "replicate")` was ~17 % of the vocoder on CPU), the constant exp(alpha) and
  1 / (exp(beta) + eps) of SnakeBeta computed once, and SnakeBeta's square,
  scale and residual add done in place. Same arithmetic, so the output is
  bit-equal. (Rewriting the up/down-sampling as polyphase or channels-as-batch
  convolutions was measured and is slower on CPU: mkldnn's depthwise kernel is
  its fast path; a 1-channel or 2-in-channel grouped conv1d is 2-5x slower.)
- `DiTVelocity` is the classifier-free-guided velocity the ODE solver calls
  36 times a window. It computes once per decode what the DiT's forward
  recomputes at every evaluation: the code embeddings (conditioned and not),
  the speaker-encoder output and the rest of the input projection's constant
  operand, the rotary tables and the block attention masks (as additive float masks). Each evaluation
  then runs the same layers on the same values, so its output is bit-equal.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _replicate_pad(x: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """F.pad(x, (left, right), mode="replicate") on the last axis, by concatenation."""
    parts = [x]
    if left:
        parts.insert(0, x[..., :1].expand(*x.shape[:-1], left))
    if right:
        parts.append(x[..., -1:].expand(*x.shape[:-1], right))
    return torch.cat(parts, dim=-1)


class FastAntiAliasedActivation(nn.Module):
    """Qwen2_5OmniAntiAliasedActivation1d (SnakeBeta, up/down ratio 2) with the same result, faster."""

    def __init__(self, ref: nn.Module) -> None:
        super().__init__()
        up, down, snake = ref.upsample, ref.downsample, ref.act
        self.up_ratio, self.up_pad = up.ratio, up.pad
        self.up_stride, self.up_left, self.up_right = up.stride, up.pad_left, up.pad_right
        self.down_stride, self.down_left, self.down_right = (
            down.stride,
            down.pad_left,
            down.pad_right,
        )
        channels = snake.alpha.shape[0]
        # The filters expanded over channels once (transformers expands them every call).
        self.up_filter = nn.Buffer(
            up.filter.expand(channels, -1, -1).contiguous(), persistent=False
        )
        self.down_filter = nn.Buffer(
            down.filter.expand(channels, -1, -1).contiguous(), persistent=False
        )
        with torch.no_grad():
            alpha = torch.exp(snake.alpha.unsqueeze(0).unsqueeze(-1))
            beta = torch.exp(snake.beta.unsqueeze(0).unsqueeze(-1))
            inv_beta = 1.0 / (beta + snake.no_div_by_zero)
        self.alpha = nn.Buffer(alpha.detach().clone(), persistent=False)
        self.inv_beta = nn.Buffer(inv_beta.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        h = _replicate_pad(x, self.up_pad, self.up_pad)
        h = F.conv_transpose1d(h, self.up_filter, stride=self.up_stride, groups=channels)
        h = self.up_ratio * h
        h = h[..., self.up_left : -self.up_right]
        s = torch.sin(h * self.alpha)  # SnakeBeta: h + 1/beta * sin(alpha h)^2
        s.mul_(s).mul_(self.inv_beta).add_(h)
        s = _replicate_pad(s, self.down_left, self.down_right)
        return F.conv1d(s, self.down_filter, stride=self.down_stride, groups=channels)


def install_fast_vocoder(bigvgan: nn.Module) -> int:
    """Replace every anti-aliased SnakeBeta activation in `bigvgan`; returns how many."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniAntiAliasedActivation1d,
        Qwen2_5OmniSnakeBeta,
    )

    swaps = []
    for mod in bigvgan.modules():
        for child_name, child in mod.named_children():
            if isinstance(child, Qwen2_5OmniAntiAliasedActivation1d) and isinstance(
                child.act, Qwen2_5OmniSnakeBeta
            ):
                swaps.append((mod, child_name, child))
    for parent, child_name, child in swaps:
        fast = FastAntiAliasedActivation(child).to(child.upsample.filter.device)
        setattr(parent, child_name, fast)
    return len(swaps)


@torch.inference_mode()
def receptive_radius(vocoder: nn.Module, mel_dim: int, frames: int = 128) -> int:
    """How many mel frames either side of a frame can change the vocoder's samples for it.

    Measured, not derived: the samples of the last convolution (before the output
    clamp, which could hide a change) that move at all (any difference, not a
    tolerance) when one frame of a mel is changed, in frames from that frame. A
    bound from the convolutions' and filters' sizes would be about twice as wide
    (24 frames against 12 for the tiny vocoder). `frames` if it reaches that far.
    """
    param = next(vocoder.parameters())
    gen = torch.Generator().manual_seed(0)
    mel = torch.randn(1, mel_dim, frames, generator=gen).to(param) * 0.1 - 3.0
    mid = frames // 2
    bumped = mel.clone()
    bumped[..., mid] += 0.5
    seen: list[torch.Tensor] = []
    hook = vocoder.conv_post.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        vocoder(mel)
        vocoder(bumped)
    finally:
        hook.remove()
    moved = (seen[0].reshape(-1) != seen[1].reshape(-1)).nonzero().reshape(-1)
    hop = math.prod(vocoder.config.upsample_rates)
    if moved.numel() == 0:
        return frames  # nothing measurable: decode everything
    radius = max(mid - int(moved[0]) // hop, int(moved[-1]) // hop - mid)
    return frames if radius >= mid - 1 else radius


def dit_conditioning(
    dit: nn.Module, codes: torch.Tensor, cond: torch.Tensor, ref: torch.Tensor
) -> torch.Tensor:
    """The constant part of the DiT input projection's operand for a decode, guided rows first:
    cat(speaker-encoder output, code embeddings, speaker vector) for [guided; unconditioned]."""
    code_embed = torch.cat(
        [dit.text_embed(codes, drop_code=False), dit.text_embed(codes, drop_code=True)], dim=0
    )
    frames = code_embed.shape[1]
    speaker = torch.cat([cond, torch.zeros_like(cond)], dim=0)
    ref2 = torch.cat([ref, torch.zeros_like(ref)], dim=0)
    enc = dit.input_embed.spk_encoder(ref2).unsqueeze(1).repeat(1, frames, 1)
    return torch.cat((enc, code_embed, speaker), dim=-1)


class DiTVelocity:
    """Guided velocity of Qwen2_5OmniToken2WavDiTModel for fixed codes and speaker conditioning.

    Equal to `dit(x, condition_vector=ref, speaker_embedding=cond, quantized_code=codes,
    time_step=t, apply_cfg=True)` followed by the guidance mix, for every (t, x).
    `static` is `dit_conditioning(...)` (a tensor a CUDA graph may refill in place);
    `for_codes` builds both.
    """

    @classmethod
    def for_codes(
        cls,
        dit: nn.Module,
        codes: torch.Tensor,
        cond: torch.Tensor,
        ref: torch.Tensor,
        guidance_scale: float,
    ) -> DiTVelocity:
        return cls(dit, dit_conditioning(dit, codes, cond, ref), guidance_scale)

    def __init__(self, dit: nn.Module, static: torch.Tensor, guidance_scale: float) -> None:
        self.dit, self.guidance_scale = dit, guidance_scale
        # The input projection's operand is cat(x, enc, code_embed, speaker): all but x is constant.
        self.static = static
        batch2, frames = static.shape[0], static.shape[1]
        like = static.new_empty(batch2, frames, 1)
        position_ids = torch.arange(frames, device=static.device)[None, :].repeat(batch2, 1)
        self.position_embeddings = dit.rotary_embed(like, position_ids)
        # Each layer's block mask as one additive [1, 1, n, n] float mask (0 / -inf): what SDPA
        # turns transformers' bool [2B, heads, n, n] mask into at every call, made once.
        block_diff = dit._create_block_diff(like[:1])[:1, :1]
        self.masks: list[torch.Tensor] = []
        cache: dict[tuple[int, int], torch.Tensor] = {}
        for block in dit.transformer_blocks:
            key = (block.look_backward_block, block.look_ahead_block)
            if key not in cache:
                keep = (block_diff >= -float(key[0])) & (block_diff <= float(key[1]))
                cache[key] = torch.zeros(keep.shape, dtype=like.dtype, device=like.device)
                cache[key].masked_fill_(~keep, float("-inf"))
            self.masks.append(cache[key])

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        dit = self.dit
        batch2 = self.static.shape[0]
        time_step = t.repeat(batch2) if t.ndim == 0 else torch.cat([t, t], dim=0)
        temb = dit.time_embed(time_step)
        h = dit.input_embed.proj(torch.cat((torch.cat([x, x], dim=0), self.static), dim=-1))
        for block, mask in zip(dit.transformer_blocks, self.masks, strict=True):
            h = _decoder_layer(block, h, temb, self.position_embeddings, mask)
        out = dit.proj_out(dit.norm_out(h, temb))
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * self.guidance_scale


def _decoder_layer(
    block: Any, h: torch.Tensor, temb: torch.Tensor, pos: Any, mask: torch.Tensor
) -> torch.Tensor:
    """DiTDecoderLayer.forward with its attention mask given (transformers rebuilds it per call)."""
    norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.attn_norm(h, emb=temb)
    attn = block.attn(hidden_states=norm, position_embeddings=pos, attention_mask=mask)
    h = h + gate_msa.unsqueeze(1) * attn
    norm = block.ff_norm(h) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return h + gate_mlp.unsqueeze(1) * block.ff(norm)
