"""A small decoder stepped one position at a time over a fixed-length cache, as straight-line code.

Depth decoders and code predictors (CSM's depth decoder, Qwen3-Omni's and Qwen3-TTS's
code predictor) draw a frame's codebooks one after another: n single-position passes
of a few Llama/Qwen3 layers over an n-position cache that starts empty every frame.
Run through transformers, each pass is ~40 tiny kernels a layer (RMSNorm, rotary,
mask building, cache bookkeeping), so at a batch of 16 a CSM frame was ~5,000 launches
and 21 ms of GPU time, kernel-count bound.

`PassStack.step(x, pos, batch)` is the same maths for one position, written as
hf_ar_fused.py writes a decode step (packed q/k/v and gate/up weights, a rotary table,
the K/V written at `pos` with an index_copy, one SDPA over the n positions under an
additive mask), with `pos` a 0-d tensor: torch.compile traces it once per batch bucket
and the compiled kernels serve every position of the frame, and the whole frame is then
captured as one CUDA graph by the runner that owns it. Layers are the Llama layer
(SiLU MLP, optional q/k RMSNorm as in Qwen3), rope types whose frequencies are fixed.
Anything else raises FusedUnsupported and the runner keeps the transformers passes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from omni_actors import logs
from omni_actors.workers.engine import timed
from omni_actors.workers.engines.hf_ar_compile import COMPILE_WARMUPS, compile_mode, compiled
from omni_actors.workers.engines.hf_ar_fused import (
    FusedUnsupported,
    HeadShape,
    check_mlp_and_rope,
    fused_layers,
    rms_norm,
    rope_table,
)
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs, cuda_graphs_wanted
from omni_actors.workers.engines.hf_ar_slots import additive_mask, attend_one, buckets

log = logs.get(__name__)

MODES = ("transformers", "fused", "compiled")
"""engine_extras["depth_passes"]: the model's own forward per pass, PassStack eagerly, or compiled."""


def passes_mode(ctx: Any, fused_default: bool = True) -> str:
    """engine_extras["depth_passes"], checked; default "compiled" on CUDA (not with
    enforce_eager, nor for a runner that sets `fused_default` False), "transformers" on CPU
    (whose outputs stay exactly as they were)."""
    extras = ctx.engine_extras
    on = ctx.device == "cuda" and fused_default and not extras.get("enforce_eager")
    default = "compiled" if on else "transformers"
    mode = extras.get("depth_passes", default)
    if mode not in MODES:
        raise ValueError(f"engine_extras.depth_passes: expected one of {MODES}, got {mode!r}")
    return mode


MIN_BUCKET = 16
"""engine_extras["depth_min_bucket"] default: the fewest rows a compiled frame runs at."""


def min_bucket(ctx: Any) -> int:
    """engine_extras["depth_min_bucket"], checked (MIN_BUCKET when unset)."""
    value = ctx.engine_extras.get("depth_min_bucket", MIN_BUCKET)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"engine_extras.depth_min_bucket: expected a positive integer, got {value!r}")
    return value


def check_stack(decoder: torch.nn.Module, config: Any) -> None:
    """Raise FusedUnsupported unless `decoder` is a stack PassStack can run."""
    check_mlp_and_rope(decoder, config)
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"}:
        raise FusedUnsupported(f"layer types {sorted(types)}")
    for layer in decoder.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        if attn is None or mlp is None or not all(hasattr(attn, n) for n in names):
            raise FusedUnsupported(f"{type(layer).__name__} is not a Llama-style layer")
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            raise FusedUnsupported(f"{type(mlp).__name__} is not a gated SiLU MLP")


def wire_frames(runner: Any, ctx: Any, event: str) -> None:
    """Set up a depth/predictor runner's frame: `runner._pass` (its `_fused_pass`, compiled in the
    compiled mode; pass 0 runs the stack's step eagerly) and `runner.graphs` (DecodeGraphs over `_frame_fused`, or `_frame` without a stack); in the
    compiled mode on CUDA every batch bucket is compiled and captured here, so no request waits.
    The runner has `stack`, `mode`, `slots`, `sizes`, `device`, `_frame`, `_frame_fused`, `_fused_pass`."""
    compiling = runner.stack is not None and runner.mode == "compiled"
    if compiling and runner.slots > 1:
        # A compiled frame costs the same at 1 row as at 10 (latency bound: 6.3 ms either way for
        # Qwen3-Omni's predictor on an H200), so small batches share one bucket of up to
        # `depth_min_bucket` rows (padding rows: the same kernels). With one bucket the pass is
        # compiled once with static shapes, no batch-1 specialisation and no symbolic batch: the
        # talker's start-up phase went from 34.5 to ... s cold.
        runner.sizes = buckets(runner.slots, min(runner.slots, min_bucket(ctx)))
    # Past one bucket, the pass differs between buckets only in its batch size: compiled with that
    # size symbolic, inductor compiles once for every bucket (no bucket is 1, which dynamo always
    # specialises) instead of once per bucket.
    dynamic = len(runner.sizes) > 1
    runner._pass = (
        compiled(runner._fused_pass, compile_mode(ctx), event, dynamic=dynamic) if compiling else runner._fused_pass
    )
    frame = runner._frame if runner.stack is None else runner._frame_fused
    runner.graphs = DecodeGraphs(
        lambda b, _: frame(b), cuda_graphs_wanted(ctx), warmups=COMPILE_WARMUPS if compiling else 0,
        buckets=len(runner.sizes),
    )  # fmt: skip
    if compiling and runner.device.type == "cuda":
        with torch.inference_mode(), timed(ctx, "depth_passes"):
            for batch in runner.sizes:
                runner.graphs.run(batch, 0)


def stacked_weights(modules: Any) -> torch.Tensor:
    """[len, *weight.shape]: the modules' (Linear or Embedding) weights in one tensor, indexable by a
    0-d position tensor; each module's weight becomes a view into it (memory is not doubled)."""
    weight = torch.stack([m.weight.detach() for m in modules])
    for i, m in enumerate(modules):
        m.weight = torch.nn.Parameter(weight[i], requires_grad=False)
    return weight


class PassStack:
    """One position of `decoder` (its `layers`, `norm`, `rotary_emb`) at a time, over its own
    [slots, kv_heads, positions, head_dim] K/V buffers (see the module docstring)."""

    def __init__(
        self, decoder: torch.nn.Module, config: Any, slots: int, positions: int,
        in_proj: torch.nn.Linear | None = None,
    ) -> None:  # fmt: skip
        check_stack(decoder, config)
        self.shape = HeadShape.of(decoder, config)
        self.layers = fused_layers(decoder)
        self.norm = decoder.norm.weight
        self.dtype, dev = self.norm.dtype, self.norm.device
        self.in_w = None if in_proj is None else in_proj.weight
        self.in_b = None if in_proj is None else in_proj.bias
        self.cos, self.sin = rope_table(decoder.rotary_emb, positions, self.dtype)
        shape = (slots, self.shape.kv_heads, positions, self.shape.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers]
        self.index = torch.arange(positions, device=dev)
        self.pos = [torch.tensor(p, device=dev) for p in range(positions)]
        """0-d position tensors, made once: a captured frame reads them at fixed addresses."""

    @classmethod
    def build(
        cls, decoder: torch.nn.Module, config: Any, slots: int, positions: int,
        in_proj: torch.nn.Linear | None, event: str,
    ) -> PassStack | None:  # fmt: skip
        """A PassStack, or None (`event` logged with the reason) when the decoder cannot take one."""
        try:
            return cls(decoder, config, slots, positions, in_proj)
        except FusedUnsupported as err:
            log.warning(event, fused="off", reason=str(err))
            return None

    def step(self, x: torch.Tensor, pos: torch.Tensor, batch: int) -> torch.Tensor:
        """x [batch, 1, in] at position `pos` (0-d long; positions above it are not attended)
        -> the final-normed hidden state [batch, hidden]; writes the position's K/V."""
        h = x.to(self.dtype)
        if self.in_w is not None:
            h = F.linear(h, self.in_w, self.in_b)
        cos = self.cos.index_select(0, pos.view(1)).view(1, 1, 1, -1)
        sin = self.sin.index_select(0, pos.view(1)).view(1, 1, 1, -1)
        mask = additive_mask((self.index > pos)[None], self.dtype)  # [1, 1, 1, n]
        at = pos.view(1)
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            q, k, v = self.shape.qkv(layer, h, cos, sin)
            rows_k, rows_v = keys[:batch], values[:batch]
            rows_k.index_copy_(2, at, k)
            rows_v.index_copy_(2, at, v)
            out = attend_one(q, rows_k, rows_v, mask, self.shape.scale)
            h = self.shape.mlp(layer, h + F.linear(out, layer.o_w, layer.o_b))
        return rms_norm(h, self.norm, self.shape.eps)[:, 0]
