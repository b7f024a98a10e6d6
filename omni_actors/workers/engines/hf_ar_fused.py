"""Our own static decode step for Llama-architecture causal LMs (engine_extras["fused_decode"]).

HfAREngine's static decode normally calls the transformers model with a
SlotCache; its layers graph-break around the cache, so torch.compile cannot
fuse their small elementwise kernels and every RMSNorm, rotary, SiLU x up and
residual add is its own launch. `FusedDecoder` runs the same maths for one
position per row, written as straight-line tensor code with no Python branch
on values: torch.compile traces it as ONE graph (inductor fuses the
elementwise work between the GEMMs) and DecodeGraphs captures it as it is.

Per layer: RMSNorm, one q/k/v GEMM (q_norm/k_norm for qwen3), rotary from a
cos/sin table indexed by position, the new K/V written into the slot
buffers at each row's length (an index_put: no host sync, graph-capturable), `attend_one` over the slot K/V under the same
additive mask the transformers path gets, o proj, residual, RMSNorm, one
gate/up GEMM, SiLU x up, down proj, residual; then the final norm, lm_head
and the greedy argmax of every row (so an all-greedy step brings back B ints,
not B x vocab logits). For CausalLMAdapter the step also embeds each row's last
token itself (`from_ids`), so no embedding lookup or embeds copy runs outside it.

Weights are read once at load: q/k/v (and their biases) are concatenated
into one tensor per layer, gate/up into another, and the transformers
modules' parameters become views into them, so memory is not doubled and
the transformers prefill keeps working on the same storage.

Fusable: model_type llama, mistral, qwen2, qwen3 with SiLU MLPs and a rope
type whose frequencies do not change with the sequence length (default,
linear, llama3, yarn: the loaded rotary module's inv_freq and attention
scaling are used as they are). Anything else raises `FusedUnsupported`
naming why; the engine then logs `hf_ar.fused_off` and keeps the normal step.

The step reads its model through `FusedModel` (decoder stack, head, optional
input projection), which an adapter with its own forward may give
(`ARAdapter.fused_model`): Qwen2.5-Omni's talker is a Qwen2 decoder between a
thinker-to-talker projection and a codec head, and its multimodal rotary is the
plain rotary at decode, where all three position axes are equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from omni_actors.workers.engines.hf_ar_adapter import ForwardOut
from omni_actors.workers.engines.hf_ar_slots import SlotKV, additive_mask, attend_one

FUSABLE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""model_type values whose decoder layer is the Llama layer (qwen3: plus per-head q/k RMSNorm)."""
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
"""Rope types whose inv_freq is fixed at load (dynamic and longrope change with the length)."""


class FusedUnsupported(ValueError):
    """The model cannot take the fused decode step; the message says why."""


@dataclass
class FusedLayer:
    """One decoder layer's weights, as the fused step reads them."""

    norm1: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    norm2: torch.Tensor
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None


def astuple_shallow(layer: FusedLayer) -> tuple[torch.Tensor | None, ...]:
    """A FusedLayer's fields in order, the tensors themselves (dataclasses.astuple copies them)."""
    return tuple(getattr(layer, f.name) for f in fields(layer))


@dataclass
class FusedModel:
    """What the fused step reads of a model: `decoder` has `layers`, `norm` and `rotary_emb`;
    `kind` is the layer family (one of FUSABLE_TYPES) when the config's model_type is the
    model's own name; `in_proj` maps the adapter's decode embeddings to the hidden size."""

    config: Any
    decoder: torch.nn.Module
    embed: torch.nn.Module | None
    head: torch.nn.Linear
    in_proj: torch.nn.Linear | None = None
    kind: str | None = None
    hidden: bool = False
    """Also return each row's (input embedding, final normed hidden state) as ForwardOut.hidden:
    transformers' hidden_states[0] and [-1] (the Qwen2.5-Omni thinker hands them to its talker)."""
    layer_parts: tuple[str, str, str] = ("input_layernorm", "post_attention_layernorm", "mlp")
    """Each layer's (pre-attention norm, post-attention norm, MLP) attribute names: a layer with
    a second set for some tokens (Higgs-Audio-V2's audio FFN, all a decode step runs) names it."""

    @classmethod
    def causal_lm(cls, model: torch.nn.Module) -> FusedModel:
        """An *ForCausalLM: `model.model` and `lm_head`."""
        return cls(model.config, model.model, model.get_input_embeddings(), model.lm_head)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: float32 statistics, scaled back in the input dtype."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def check_mlp_and_rope(decoder: torch.nn.Module, config: Any) -> None:
    """Raise FusedUnsupported unless the layers' MLP is SiLU x up and the rotary's frequencies are fixed."""
    if getattr(config, "hidden_act", "silu") != "silu":
        raise FusedUnsupported(f"hidden_act {config.hidden_act!r}: the fused MLP is SiLU x up")
    rope = getattr(getattr(decoder, "rotary_emb", None), "rope_type", None)
    if rope not in STATIC_ROPE_TYPES:
        raise FusedUnsupported(f"rope type {rope!r} is not one of {STATIC_ROPE_TYPES}")


def check_fusable(parts: FusedModel, max_len: int) -> None:
    """Raise FusedUnsupported unless the model can take the fused step."""
    config = parts.config
    kind = parts.kind or getattr(config, "model_type", None)
    if kind not in FUSABLE_TYPES:
        raise FusedUnsupported(f"model_type {kind!r} is not one of {FUSABLE_TYPES}")
    check_mlp_and_rope(parts.decoder, config)
    layer_types = list(getattr(config, "layer_types", None) or [])
    windowed = kind == "mistral" or "sliding_attention" in layer_types
    window = getattr(config, "sliding_window", None) if windowed else None
    if window is not None and window < max_len:
        raise FusedUnsupported(f"sliding_window {window} < max_model_len {max_len}")
    if any(t != "full_attention" for t in layer_types if t != "sliding_attention"):
        raise FusedUnsupported(f"layer types {sorted(set(layer_types))}")


def _pack(modules: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the Linears' weights (and biases) along dim 0 into one tensor each; the
    Linears' parameters become views into it (the old storage is freed)."""
    weight = torch.cat([m.weight for m in modules])
    has_bias = [m.bias is not None for m in modules]
    if any(has_bias) and not all(has_bias):
        raise FusedUnsupported("some of the fused projections have a bias and some do not")
    bias = torch.cat([m.bias for m in modules]) if all(has_bias) else None
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


class FusedDecoder:
    """The fused decode step over an engine's SlotKV (see the module docstring)."""

    def __init__(
        self, model: torch.nn.Module | FusedModel, slots: SlotKV, max_len: int, from_ids: bool = False
    ) -> None:
        """`model`: an *ForCausalLM, or the FusedModel an adapter gave. `from_ids`: the step
        embeds each row's last token (`slots.ids`) itself, inside the graph, instead of reading
        `slots.embeds` (the adapter's decode embeddings)."""
        parts = model if isinstance(model, FusedModel) else FusedModel.causal_lm(model)
        check_fusable(parts, max_len)
        if from_ids and parts.embed is None:
            raise FusedUnsupported("the step embeds ids, but the model gave no embedding table")
        config = parts.config
        inner = parts.decoder
        self.slots = slots
        self.from_ids = from_ids
        self.embed_w = None if parts.embed is None else parts.embed.weight
        proj = parts.in_proj
        self.in_w, self.in_b = (None, None) if proj is None else (proj.weight, proj.bias)
        self.hidden = parts.hidden
        self.rows = torch.arange(slots.slots, device=slots.device)
        self.shape = HeadShape.of(inner, config)
        self.layers = fused_layers(inner, parts.layer_parts)
        self._weights = [astuple_shallow(layer) for layer in self.layers]
        self.norm = inner.norm.weight
        self.head_w, self.head_b = parts.head.weight, parts.head.bias
        self.dtype = self.norm.dtype
        self.cos, self.sin = rope_table(inner.rotary_emb, max_len, self.dtype)
        self._layer: Callable[..., Any] = self.layer_step
        self._head: Callable[..., Any] = self.head_step

    def forward(self, batch: int, length: int) -> ForwardOut:
        """One decode position for rows 0..batch-1 of the slot cache, attending to `length`
        positions; writes each row's new K/V at its length. Logits [batch, vocab] and the
        greedy ids [batch] (`tokens`)."""
        slots = self.slots
        lengths = slots.lengths[:batch]
        blocked = torch.arange(length, device=lengths.device)[None] > lengths[:, None]
        mask = additive_mask(blocked, self.dtype)
        pos = slots.positions[0, :batch, 0].clamp(0, self.cos.shape[0] - 1)
        cos, sin = self.cos[pos][:, None, None, :], self.sin[pos][:, None, None, :]  # [B,1,1,d]
        if self.from_ids:
            h = F.embedding(slots.ids[:batch, None], self.embed_w)  # [B, 1, hidden]
        else:
            h = slots.embeds[:batch].to(self.dtype)
            if self.in_w is not None:
                h = F.linear(h, self.in_w, self.in_b)
        h_in = h
        rows = self.rows[:batch]
        for weights, keys, values in zip(self._weights, slots.keys, slots.values, strict=True):
            h = self._layer(h, cos, sin, rows, lengths, mask, keys, values, length, *weights)
        h, logits, tokens = self._head(h, self.norm, self.head_w, self.head_b)
        return ForwardOut(logits, (h_in, h) if self.hidden else None, tokens=tokens)

    def compile_layers(self, compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Compile one layer's code and the head's, each once for every layer (the weights are
        the compiled code's inputs, so the layers share one graph per bucket): a bucket compiles a
        layer's worth of code instead of the whole stack's (engine_extras compile_scope "layer")."""
        self._layer = compile_fn(self.layer_step)
        self._head = compile_fn(self.head_step)

    def mark_static_inputs(self) -> None:
        """Tell dynamo the step's fixed-size inputs (weights, rotary tables, the slot buffers once
        allocated) are static: compiled with symbolic sizes, only the batch and the length stay
        symbolic, which compiles faster (a third less on a CPU probe) and keeps kernels specialised
        on the model's own sizes."""
        import torch._dynamo as dynamo

        fixed = [self.cos, self.sin, self.norm, self.head_w, self.head_b, self.embed_w, self.in_w, self.in_b]
        fixed += [w for weights in self._weights for w in weights]
        fixed += [*self.slots.keys, *self.slots.values]
        for t in fixed:
            if t is not None:
                dynamo.mark_static(t)

    def warm_compile(self) -> int:
        """Run the (compiled) layer and head at a few buckets now, so their compiles happen at load
        and not under a request: with symbolic sizes (compile_dynamic) two batches above 1 and
        batch 1, each at two lengths, meet every recompile dynamo makes. What it writes into the
        slot buffers is at rows and positions no request holds yet. The shapes run."""
        slots = self.slots
        many = [b for b in slots.batch_sizes if b > 1][:2]
        lengths = slots.length_sizes[:2]
        shapes = [(b, n) for b in [*many, 1] for n in lengths]
        with torch.inference_mode():
            for batch, length in shapes:
                self.forward(batch, length)
        return len(shapes)

    def layer_step(self, h, cos, sin, rows, lengths, mask, keys, values, length: int, *weights):
        """One decoder layer at one position per row: attention (the new K/V written into the
        whole slot buffers `keys`/`values` in place at each row's length, an index_put inductor
        keeps in place, as gpt-fast's cache), residual, MLP, residual. `weights`: a FusedLayer's
        fields in order (so a compiled layer_step takes them as inputs, not as constants)."""
        layer = FusedLayer(*weights)
        q, k, v = self.shape.qkv(layer, h, cos, sin)
        keys[rows, :, lengths] = k[:, :, 0]
        values[rows, :, lengths] = v[:, :, 0]
        batch = h.shape[0]
        out = attend_one(q, keys[:batch, :, :length], values[:batch, :, :length], mask, self.shape.scale)
        h = h + F.linear(out, layer.o_w, layer.o_b)
        return self.shape.mlp(layer, h)

    def head_step(self, h, norm, head_w, head_b):
        """The final norm, the head's logits of each row's last position and their argmax."""
        h = rms_norm(h, norm, self.shape.eps)  # [B, 1, hidden]
        logits = F.linear(h[:, -1], head_w, head_b)
        return h, logits, logits.argmax(-1)


@dataclass
class HeadShape:
    """A decoder's attention geometry, and the per-layer maths of one position the fused
    steps share (hf_ar_fused.FusedDecoder, fused_passes.PassStack)."""

    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    eps: float

    @classmethod
    def of(cls, decoder: torch.nn.Module, config: Any) -> HeadShape:
        attn = decoder.layers[0].self_attn
        return cls(int(config.num_attention_heads), int(config.num_key_value_heads), int(attn.head_dim),
                   float(attn.scaling), float(config.rms_norm_eps))  # fmt: skip

    def qkv(self, layer: FusedLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """RMSNorm, q/k/v of one position h [rows, 1, hidden] (q/k norms, rotary applied):
        q [rows, heads, 1, dim], k and v [rows, kv_heads, 1, dim]."""
        rows, d = h.shape[0], self.head_dim
        x = rms_norm(h, layer.norm1, self.eps)
        split = [self.heads * d, self.kv_heads * d, self.kv_heads * d]
        q, k, v = F.linear(x, layer.qkv_w, layer.qkv_b).split(split, dim=-1)
        q = q.view(rows, 1, self.heads, d)
        k = k.view(rows, 1, self.kv_heads, d)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, self.eps)
        if layer.k_norm is not None:
            k = rms_norm(k, layer.k_norm, self.eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(rows, 1, self.kv_heads, d).transpose(1, 2)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def mlp(self, layer: FusedLayer, h: torch.Tensor) -> torch.Tensor:
        """h + the layer's SiLU MLP of its post-attention RMSNorm."""
        x = rms_norm(h, layer.norm2, self.eps)
        gate, up = F.linear(x, layer.gate_up_w, layer.gate_up_b).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, layer.down_w, layer.down_b)


def fused_layers(
    decoder: torch.nn.Module, parts: tuple[str, str, str] = FusedModel.layer_parts
) -> list[FusedLayer]:
    """The decoder's layers as the fused steps read them (`parts`: FusedModel.layer_parts); q/k/v
    and gate/up packed (see `_pack`)."""
    norm1, norm2, mlp_name = parts
    layers = []
    with torch.no_grad():
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, getattr(layer, mlp_name)
            qkv_w, qkv_b = _pack([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up_w, gate_up_b = _pack([mlp.gate_proj, mlp.up_proj])
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            layers.append(FusedLayer(
                norm1=getattr(layer, norm1).weight, qkv_w=qkv_w, qkv_b=qkv_b,
                q_norm=None if q_norm is None else q_norm.weight,
                k_norm=None if k_norm is None else k_norm.weight,
                o_w=attn.o_proj.weight, o_b=attn.o_proj.bias,
                norm2=getattr(layer, norm2).weight,
                gate_up_w=gate_up_w, gate_up_b=gate_up_b,
                down_w=mlp.down_proj.weight, down_b=mlp.down_proj.bias,
            ))  # fmt: skip
    return layers


def rope_table(rotary: torch.nn.Module, max_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[max_len, head_dim] cos and sin in `dtype`, computed as transformers' rotary module
    computes them per step (float32 position x inv_freq, then scaled and cast)."""
    inv_freq = rotary.inv_freq.to(torch.float32)
    positions = torch.arange(max_len, device=inv_freq.device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    scaling = rotary.attention_scaling
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)
