"""The static "slot" KV cache of HfAREngine: preallocated per-layer K/V rows, one per request.

Per layer, keys and values live in [slots, kv_heads, max_len, head_dim]
buffers on the engine's device, allocated once (sized from the first
prefill's cache). A request takes a slot when its prompt has run (the
prompt's KV is copied in) and gives it back when it ends; slots stay compact
(the last one moves into a freed hole), so a decode step runs rows 0..B-1
with B the smallest batch bucket that holds every slot in use.

A decode forward has fixed shapes per (batch bucket, length bucket): inputs
are written into static buffers, each row writes its new K/V at its own
position (`lengths[row]`, a scatter: no host sync, graph-capturable), and
attends to the first L positions of its row through a 4D additive mask built
from the same lengths. Rows whose request is not ready this step, and unused
rows of the bucket, still compute; they write at or past their own length,
which is never read before the request overwrites it.
"""

from __future__ import annotations

import os

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from omni_actors.workers.engine import ContextLengthError
from omni_actors.workers.engines.hf_ar_adapter import ARSeq

MIN_LENGTH_BUCKET = 128
"""Shortest attention window a decode step reads; windows double up to max_len."""
COMPILED_MATH_ATTENTION = os.environ.get("OMNI_COMPILED_ATTENTION", "math") != "sdpa"
"""`attend_one` under torch.compile on a GPU: the attention written out (the default) or SDPA
(OMNI_COMPILED_ATTENTION=sdpa, or scripts/bench_gpu_ar.py's `_sdpa` modes: the benchmarks'
same-run baseline)."""


class ContextLengthExceeded(ContextLengthError):
    """A request needs more KV positions than the stage's max_len; it fails alone."""

    def __init__(self, request_id: str, needed: int, max_len: int) -> None:
        super().__init__(
            f"request {request_id} needs {needed} KV positions; the stage's max_model_len is {max_len}"
        )
        self.needed = needed
        self.max_len = max_len


def buckets(limit: int, first: int) -> list[int]:
    """first, 2 * first, ... below limit, then limit."""
    out = []
    size = first
    while size < limit:
        out.append(size)
        size *= 2
    return [*out, limit]


def bucket_for(value: int, sizes: list[int]) -> int:
    return next(s for s in sizes if s >= value)


class SlotLayer(CacheLayerMixin):
    """One layer's view of the slot buffers for one (batch, length) bucket."""

    is_compileable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values  # views [batch, heads, length, dim] of the buffers
        self.lengths = lengths
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers exist already
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        write_one(self.keys, self.values, self.lengths, key_states, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class SlotCache(Cache):
    """The transformers Cache a static decode forward gets: a SlotLayer per model layer."""

    def __init__(self, layers: list[SlotLayer]) -> None:
        super().__init__(layers=layers)


class SlotKV:
    """Slot buffers, slot assignment and the static decode inputs of one engine."""

    def __init__(self, slots: int, max_len: int, axes: int, device: torch.device) -> None:
        self.slots, self.max_len, self.axes, self.device = slots, max_len, axes, device
        self.owners: list[ARSeq] = []
        """owners[i] holds slot i (compact)."""
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.batch_sizes = buckets(slots, 1)
        self.length_sizes = buckets(max_len, min(MIN_LENGTH_BUCKET, max_len))
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(axes, slots, 1, dtype=torch.long, device=device)
        self.ids = torch.zeros(slots, dtype=torch.long, device=device)
        """Each row's last sampled token (a step that embeds its inputs itself reads these)."""
        pin = device.type == "cuda"
        self.host = torch.zeros(2 + axes, slots, dtype=torch.long, pin_memory=pin)
        """Staging rows: lengths, positions (axes rows), last token ids."""
        self._host = self.host.numpy()  # the same memory: element writes cost no torch call
        self.embeds: torch.Tensor | None = None
        self.views: dict[tuple[int, int], SlotCache] = {}

    # ---- slots -------------------------------------------------------------

    @torch.inference_mode()
    def store(self, seq: ARSeq, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Give seq a slot and copy its prompt's KV (per layer [1, heads, n, dim] keys, values)."""
        if not self.keys:
            self._allocate(kv)
        slot = len(self.owners)
        n = kv[0][0].shape[2]
        for (k, v), keys, values in zip(kv, self.keys, self.values, strict=True):
            keys[slot, :, :n] = k[0]
            values[slot, :, :n] = v[0]
        seq.slot = slot
        self.owners.append(seq)

    @torch.inference_mode()
    def release(self, seq: ARSeq) -> None:
        """Give seq's slot back; the last slot's request moves into it."""
        if seq.slot is None:
            return
        hole, last = seq.slot, len(self.owners) - 1
        moved = self.owners.pop()
        seq.slot = None
        if hole == last:
            return
        n = moved.cached
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[hole, :, :n] = keys[last, :, :n]
            values[hole, :, :n] = values[last, :, :n]
        moved.slot = hole
        self.owners[hole] = moved

    def _allocate(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for k, v in kv:
            _, heads, _, dim = k.shape
            shape = (self.slots, heads, self.max_len, dim)
            kw = {"dtype": k.dtype, "device": self.device}
            self.keys.append(torch.zeros(shape, **kw))
            self.values.append(torch.zeros((*shape[:3], v.shape[-1]), **kw))

    # ---- decode ------------------------------------------------------------

    def shape_for(self, longest: int | None = None) -> tuple[int, int]:
        """(batch bucket, length bucket) of a decode step over every slot in use; `longest`: the
        most KV positions a row holds before the step (default: the owners' `cached`)."""
        if longest is None:
            longest = max(s.cached for s in self.owners)
        return (
            bucket_for(len(self.owners), self.batch_sizes),
            bucket_for(longest + 1, self.length_sizes),
        )

    def load_inputs(
        self, batch: int, ready: list[ARSeq], embeds: torch.Tensor | None
    ) -> torch.Tensor | slice:
        """Write one step's inputs into the static buffers; return the ready rows' indices.
        `embeds` None: the step embeds `ids` itself (only lengths, positions and ids are written)."""
        host = self._host
        host[:, :batch] = 0
        for seq in self.owners:
            host[0, seq.slot] = seq.cached
            host[1:-1, seq.slot] = seq.next_pos
            host[-1, seq.slot] = seq.tokens[-1] if seq.tokens else 0
        self.lengths[:batch].copy_(self.host[0, :batch], non_blocking=True)
        self.positions[:, :batch, 0].copy_(self.host[1:-1, :batch], non_blocking=True)
        self.ids[:batch].copy_(self.host[-1, :batch], non_blocking=True)
        rows = [s.slot for s in ready]
        if embeds is None:
            n = len(rows)
            return slice(0, n) if rows == list(range(n)) else torch.tensor(rows, device=self.device)
        if self.embeds is None:
            shape = (self.slots, 1, embeds.shape[-1])
            self.embeds = torch.zeros(shape, dtype=embeds.dtype, device=self.device)
        if rows == list(range(len(rows))):
            self.embeds[: len(rows)].copy_(embeds)
            return slice(0, len(rows))
        index = torch.tensor(rows, device=self.device)
        self.embeds.index_copy_(0, index, embeds.to(self.embeds.dtype))
        return index

    def inputs(
        self, batch: int, length: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SlotCache]:
        """Static (embeds, positions, 4D mask, cache) of one bucket; the mask is computed here."""
        lengths = self.lengths[:batch]
        allowed = torch.arange(length, device=self.device)[None] <= lengths[:, None]
        dtype = self.embeds.dtype
        mask = torch.zeros(batch, length, dtype=dtype, device=self.device)
        mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
        cache = self.views.get((batch, length))
        if cache is None:
            layers = [
                SlotLayer(k[:batch, :, :length], v[:batch, :, :length], lengths)
                for k, v in zip(self.keys, self.values, strict=True)
            ]
            cache = self.views[(batch, length)] = SlotCache(layers)
        return self.embeds[:batch], self.positions[:, :batch], mask[:, None, None, :], cache


def additive_mask(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[rows, n] True where a row may not look -> [rows, 1, 1, n] additive mask."""
    zeros = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device)
    return zeros.masked_fill(blocked, torch.finfo(dtype).min)[:, None, None, :]


def project_one(attn: torch.nn.Module, x: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, ...]:
    """One position's q, k, v [rows, heads, 1, head_dim] from an attention module's q/k/v_proj;
    x [rows, 1, hidden]."""
    rows = x.shape[0]
    return tuple(
        proj(x).view(rows, 1, -1, head_dim).transpose(1, 2)
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
    )


def write_one(
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Each row's new K/V [rows, kv_heads, 1, dim] into its slot at position lengths[row] (a scatter:
    no host sync, graph-capturable)."""
    where = lengths.view(-1, 1, 1, 1).expand(k.shape)
    keys.scatter_(2, where, k)
    values.scatter_(2, where, v)


def attend_one(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query position over slot K/V: q [rows, heads, 1, dim], keys/values [rows, kv_heads, n, dim]
    -> [rows, 1, heads * dim].

    Query head h reads kv head h // (heads / kv_heads) (transformers' repeat_kv); with one
    position the heads of a kv head are its queries, so K/V are read as they are.

    Compiled for a GPU (`torch.compile` tracing a CUDA step) the attention is written out
    (scores, mask and float32 softmax, which inductor fuses into one kernel, between two
    batched GEMMs): SDPA's kernel with a mask runs a handful of blocks over every key, 13 us a
    layer at 256 keys and 28 at 1,024 on an H200 against 8 and 9
    (scripts/bench_decode_attention.py). Eager and on the CPU it stays SDPA, so those outputs
    do not change.
    """
    rows, heads, _, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, dim)
    if COMPILED_MATH_ATTENTION and q.is_cuda and torch.compiler.is_compiling():
        out = written_out_attention(grouped, keys, values, mask, scale)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            grouped, keys, values, attn_mask=mask, scale=scale
        )
    return out.reshape(rows, 1, heads * dim)


def written_out_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """SDPA's answer as plain ops: q [..., m, dim] over keys/values [..., n, dim] with an additive
    mask, the scores and softmax in float32."""
    scores = (q @ keys.transpose(-1, -2)).float() * scale + mask.float()
    return scores.softmax(-1).to(q.dtype) @ values
