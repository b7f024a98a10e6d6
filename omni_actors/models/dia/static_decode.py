"""Dia's decoder over a static slot KV cache: one fixed-shape decode step per bucket, a CUDA graph each on CUDA.

Every running request holds a slot, and a slot is two decoder rows (2 * slot: the
text, 2 * slot + 1: the all-pad text of classifier-free guidance). Per decoder layer,
preallocated buffers on the engine's device hold:

- self-attention K/V [2 * slots, kv_heads, max_len, head_dim]: the prompt's, copied in
  at prefill, then one position per step, written at the row's own length (a scatter:
  no host sync);
- cross-attention K/V [2 * slots, cross_kv_heads, max_text, cross_head_dim]: the text
  encoder's, projected once at prefill (the prefill forward made them) and only read after.

A decode step feeds each row its last drawn position (ids, position = positions fed
so far) through the decoder's own modules (embeddings, rotary, norms, projections,
MLPs, logits head of transformers' Dia) over the first L self positions and first T
text positions of every row, masked per row to its own lengths. Its shapes depend
only on (batch bucket, L bucket, T bucket), so on CUDA each bucket is captured once
and replayed (HfAREngine's DecodeGraphs; engine_extras.cuda_graphs false runs it
eagerly, as on CPU, over the same buffers). Slots stay compact: a request that ends
or is aborted gives its slot back and the last slot's request moves into it, so a
step runs rows 0 .. 2 * B - 1 with B the smallest batch bucket holding every slot.
Rows of the bucket without a request still compute (length 0, one text position) and
are never read; a request prefilled in the same engine step is stepped (and read) too.
Attention is grouped-query without copying K/V: a single query position lets a kv
head's query heads stand in for query positions.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.models.dia.request import DiaRequest
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs
from omni_actors.workers.engines.hf_ar_slots import (
    additive_mask,
    attend_one,
    bucket_for,
    buckets,
    project_one,
    write_one,
)

MIN_SELF_WINDOW = 128
"""Shortest self-attention window a step reads; windows double up to max_len."""
MIN_TEXT_WINDOW = 64
"""Shortest text (cross-attention) window a step reads; windows double up to the encoder's limit."""


class StaticDecoder:
    """Slot buffers, slot assignment and the fixed-shape decode step of Dia's decoder (module docstring)."""

    def __init__(
        self, model: Any, slots: int, max_len: int, graphs: bool, device: torch.device
    ) -> None:
        from transformers.models.dia.modeling_dia import apply_rotary_pos_emb

        self.rotate = apply_rotary_pos_emb
        self.model, self.decoder = model, model.model.decoder
        cfg = self.decoder.config
        self.channels, self.vocab = cfg.num_channels, cfg.vocab_size
        self.slots, self.max_len, self.device = slots, max_len, device
        self.max_text = model.config.encoder_config.max_position_embeddings
        self.owners: list[DiaRequest] = []
        """owners[i] holds slot i (compact)."""
        rows, dt = 2 * slots, model.dtype
        self_attn, cross_attn = (
            self.decoder.layers[0].self_attention,
            self.decoder.layers[0].cross_attention,
        )
        self.head_dim, self.cross_dim = self_attn.head_dim, cross_attn.head_dim
        own = (rows, self_attn.num_key_value_heads, max_len, self.head_dim)
        cross = (rows, cross_attn.num_key_value_heads, self.max_text, self.cross_dim)
        layers = range(len(self.decoder.layers))
        kw = {"dtype": dt, "device": device}
        self.keys = [torch.zeros(own, **kw) for _ in layers]
        self.values = [torch.zeros(own, **kw) for _ in layers]
        self.cross_keys = [torch.zeros(cross, **kw) for _ in layers]
        self.cross_values = [torch.zeros(cross, **kw) for _ in layers]
        c = self.channels
        self.inputs = torch.zeros(rows, c + 2, dtype=torch.long, device=device)
        """Per row: the ids fed (c), positions fed so far (the new position's id and where its K/V
        goes), text positions its cross-attention reads; written by one copy a step."""
        self.ids, self.lengths, self.texts = (
            self.inputs[:, None, :c],
            self.inputs[:, c],
            self.inputs[:, c + 1],
        )
        self.host = torch.zeros(rows, c + 2, dtype=torch.long, pin_memory=device.type == "cuda")
        self.batch_sizes = buckets(slots, 1)
        self.self_sizes = buckets(max_len, min(MIN_SELF_WINDOW, max_len))
        self.text_sizes = buckets(self.max_text, min(MIN_TEXT_WINDOW, self.max_text))
        self.windows = [(n, t) for n in self.self_sizes for t in self.text_sizes]
        self.graphs = DecodeGraphs(
            lambda batch, w: self._forward(batch, *self.windows[w]), graphs,
            buckets=len(self.batch_sizes) * len(self.windows),
        )  # fmt: skip

    # ---- slots -------------------------------------------------------------

    @torch.inference_mode()
    def store(self, req: DiaRequest) -> None:
        """Give req a slot; copy the prefill's self and cross K/V (per layer [2, heads, n, dim]) into it."""
        assert req.self_kv is not None and req.cross_kv is not None and req.encoded is not None
        slot = len(self.owners)
        rows = slice(2 * slot, 2 * slot + 2)
        n, t = req.self_kv[0][0].shape[2], req.cross_kv[0][0].shape[2]
        for i, ((k, v), (ck, cv)) in enumerate(zip(req.self_kv, req.cross_kv, strict=True)):
            self.keys[i][rows, :, :n] = k
            self.values[i][rows, :, :n] = v
            self.cross_keys[i][rows, :, :t] = ck
            self.cross_values[i][rows, :, :t] = cv
        req.text_len = t
        req.self_kv = req.cross_kv = req.encoded = None  # the slot holds them now
        req.slot = slot
        self.owners.append(req)

    @torch.inference_mode()
    def release(self, req: DiaRequest) -> None:
        """Give req's slot back; the last slot's request moves into it."""
        if req.slot is None:
            return
        hole, last = req.slot, len(self.owners) - 1
        moved = self.owners.pop()
        req.slot = None
        if hole == last:
            return
        n, t = len(moved.positions), moved.text_len
        dst, src = slice(2 * hole, 2 * hole + 2), slice(2 * last, 2 * last + 2)
        for own in (self.keys, self.values):
            for buf in own:
                buf[dst, :, :n] = buf[src, :, :n]
        for cross in (self.cross_keys, self.cross_values):
            for buf in cross:
                buf[dst, :, :t] = buf[src, :, :t]
        moved.slot = hole
        self.owners[hole] = moved

    # ---- warm-up -----------------------------------------------------------

    @torch.inference_mode()
    def warm_up(self, positions: int, text: int) -> list[tuple[int, int, int]]:
        """Run (on CUDA: capture) the step of every batch bucket x every self window up to the one
        holding `positions` x every text window up to the one holding `text` bytes, with no slot in
        use; returns those (batch, self, text) buckets. Leaves nothing behind: the rows' inputs
        and every K/V buffer are zeroed again, as they were allocated."""
        assert not self.owners, "warm up before any request holds a slot"
        spans, widths = _upto(self.self_sizes, positions), _upto(self.text_sizes, text)
        self.inputs.zero_()
        self.texts.fill_(1)  # as a step's unused rows: one text position (zeros), nothing else
        done = []
        for batch in self.batch_sizes:
            for span in spans:
                for width in widths:
                    self.graphs.run(batch, self.windows.index((span, width)))
                    done.append((batch, span, width))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.inputs.zero_()
        for buf in (*self.keys, *self.values, *self.cross_keys, *self.cross_values):
            buf.zero_()
        return done

    # ---- decode ------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, reqs: list[DiaRequest]) -> tuple[list[DiaRequest], torch.Tensor, torch.Tensor]:
        """One position for every slot in use: reqs in slot order, and their (cond, uncond)
        [len(reqs), channels, vocab] float32 logits."""
        batch = bucket_for(len(self.owners), self.batch_sizes)
        host = self.host
        host[: 2 * batch, :-2] = 0
        host[: 2 * batch, -2] = 0
        host[: 2 * batch, -1] = 1
        for req in self.owners:
            rows = slice(2 * req.slot, 2 * req.slot + 2)
            host[rows, :-2] = torch.from_numpy(req.last())
            host[rows, -2] = len(req.positions) - 1
            host[rows, -1] = req.text_len
        longest = int(host[: 2 * batch, -2].max())
        widest = int(host[: 2 * batch, -1].max())
        self.inputs[: 2 * batch].copy_(host[: 2 * batch], non_blocking=True)
        window = self.windows.index(
            (bucket_for(longest + 1, self.self_sizes), bucket_for(widest, self.text_sizes))
        )
        logits = self.graphs.run(batch, window)
        reqs = sorted(reqs, key=lambda r: r.slot)
        n = len(reqs)
        if reqs[-1].slot == n - 1:  # slots 0 .. n - 1: strided views, no index to upload
            return reqs, logits[0 : 2 * n : 2], logits[1 : 2 * n : 2]
        index = torch.tensor([2 * r.slot for r in reqs], device=self.device)
        return reqs, logits.index_select(0, index), logits.index_select(0, index + 1)

    def _forward(self, batch: int, span: int, width: int) -> torch.Tensor:
        """The fixed-shape step of rows 0 .. 2 * batch - 1 over `span` self and `width` text positions."""
        dec, rows = self.decoder, 2 * batch
        lengths, texts = self.lengths[:rows], self.texts[:rows]
        hidden = dec.embeddings(self.ids[:rows])  # [rows, 1, hidden]
        cos, sin = dec.rotary_emb(hidden, position_ids=lengths[:, None])
        dt = hidden.dtype
        own_mask = additive_mask(torch.arange(span, device=self.device)[None] > lengths[:, None], dt)
        text_mask = additive_mask(torch.arange(width, device=self.device)[None] >= texts[:, None], dt)
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attention
            q, k, v = project_one(attn, layer.pre_sa_norm(hidden), self.head_dim)
            q, k = self.rotate(q, k, cos, sin)
            keys, values = self.keys[i][:rows, :, :span], self.values[i][:rows, :, :span]
            write_one(keys, values, lengths, k, v)
            hidden = hidden + attn.o_proj(attend_one(q, keys, values, own_mask, 1.0))  # Dia: unscaled scores
            cross = layer.cross_attention
            x = layer.pre_ca_norm(hidden)
            q = cross.q_proj(x).view(rows, 1, -1, self.cross_dim).transpose(1, 2)
            keys, values = (
                self.cross_keys[i][:rows, :, :width],
                self.cross_values[i][:rows, :, :width],
            )
            hidden = hidden + cross.o_proj(attend_one(q, keys, values, text_mask, 1.0))
            hidden = hidden + layer.mlp(layer.pre_mlp_norm(hidden))
        hidden = dec.norm(hidden)[:, 0]
        return self.model.logits_dense(hidden).float().view(rows, self.channels, self.vocab)


def _upto(sizes: list[int], value: int) -> list[int]:
    """The buckets of `sizes` up to (and including) the one holding `value` (all of them past the last)."""
    return sizes[: sizes.index(bucket_for(min(value, sizes[-1]), sizes)) + 1]
