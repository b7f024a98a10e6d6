"""HfAREngine's decode half of a step: one batched forward over the static slots or the dynamic caches.

A mixin of HfAREngine (hf_ar.py), which holds the state these methods use (adapter, device,
slots, graphs, fused, lookahead, ahead, _raw_logits) and the methods they call (_guided,
_sample: hf_ar_tokens.py). With the static cache a step runs over the slot buffers
(hf_ar_slots.py), replayed from a CUDA graph where captured (hf_ar_graphs.py), and may be
queued one ahead of the host's work (hf_ar_lookahead.py); with the dynamic cache the requests'
DynamicCaches are left-padded and stacked for the step, then each row is cut back out.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engine import EngineOutput
from omni_actors.workers.engines.hf_ar_adapter import ARSeq, ForwardOut
from omni_actors.workers.engines.hf_ar_lookahead import InFlight, chain_next, queue
from omni_actors.workers.engines.hf_ar_sampling import all_greedy


class DecodeSteps:
    """HfAREngine's decode steps (static or dynamic KV cache) and the lookahead around them."""

    def _decode_static(self, seqs: list[ARSeq]) -> list[EngineOutput]:
        slots, graphs = self.slots, self.graphs
        assert slots is not None and graphs is not None
        batch, length = slots.shape_for()
        if self.fused is not None and self.fused.from_ids:
            rows = slots.load_inputs(batch, seqs, None)  # the fused step embeds the last tokens
        else:
            rows = slots.load_inputs(batch, seqs, self.adapter.decode_embeds(seqs).to(self.device))
        out = graphs.run(batch, length).rows(rows)
        cached = [s.cached + 1 for s in seqs]
        if self.lookahead and self.adapter.draws_ahead and not self._guided(seqs):
            return self._take(queue(out, seqs, rows, cached, self.adapter.queue_draw(seqs, out, None)))
        if self.lookahead and self._greedy(seqs, out):
            return self._take(queue(out, seqs, rows, cached))
        return self._advance(seqs, out)

    def _greedy(self, seqs: list[ARSeq], out: ForwardOut) -> bool:
        """The step's own argmax is every row's token (no sampling, penalty, processing, grammar)."""
        return out.tokens is not None and self._raw_logits and not self._guided(seqs) and all_greedy(seqs)

    def _take(self, fl: InFlight) -> list[EngineOutput]:
        """The host's share of a queued step: queue the next one when it may be (hf_ar_lookahead.py),
        then wait for this one's copies and sample as usual."""
        self.ahead = chain_next(self, fl)
        fl.wait()
        return self._advance(fl.seqs, fl.host, fl.drawn)

    def _advance(self, seqs: list[ARSeq], out: ForwardOut, drawn: Any = None) -> list[EngineOutput]:
        """A decode step's rows hold one more KV position each; their tokens are sampled (or were
        drawn by the adapter: `drawn`, its queued draw)."""
        for seq in seqs:
            seq.cached += 1
            seq.next_pos += 1
        return self._sample(seqs, out, prefill=False, drawn=drawn)

    def _static_forward(self, batch: int, length: int) -> ForwardOut:
        """The transformers decode step (the adapter's forward over the slot cache), plus each
        row's argmax when the logits are [batch, vocab]."""
        assert self.slots is not None
        embeds, positions, mask, cache = self.slots.inputs(batch, length)
        out = self.adapter.forward(embeds, positions, mask, cache, {})
        if out.tokens is None and out.logits.dim() == 2:
            out = ForwardOut(out.logits, out.hidden, tokens=out.logits.argmax(-1))
        return out

    def _decode_dynamic(self, seqs: list[ARSeq]) -> list[EngineOutput]:
        from transformers import DynamicCache

        lengths = [s.cached for s in seqs]
        longest = max(lengths)
        cache = DynamicCache()
        for layer in range(len(seqs[0].kv)):
            keys = torch.cat([_left_pad(s.kv[layer][0], longest) for s in seqs])
            values = torch.cat([_left_pad(s.kv[layer][1], longest) for s in seqs])
            cache.update(keys, values, layer)
        mask = torch.zeros(len(seqs), longest + 1, dtype=torch.long, device=self.device)
        for row, n in enumerate(lengths):
            mask[row, longest - n :] = 1
        pos = torch.tensor([s.next_pos for s in seqs], device=self.device)
        pos = self._axes(pos[None]).unsqueeze(-1)  # [axes, batch, 1]
        embeds = self.adapter.decode_embeds(seqs).to(self.device)
        out = self.adapter.forward(embeds, pos, mask, cache, {})
        for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
            cut = longest - n
            seq.kv = [
                (
                    layer.keys[row : row + 1, :, cut:].clone(),
                    layer.values[row : row + 1, :, cut:].clone(),
                )
                for layer in cache.layers
            ]
            seq.cached += 1
            seq.next_pos += 1
        return self._sample(seqs, out, prefill=False)

    def _axes(self, pos: torch.Tensor) -> torch.Tensor:
        """[1 or axes, ...] -> [adapter axes, ...]."""
        axes = self.adapter.position_axes
        if pos.shape[0] == axes:
            return pos
        return pos[:1].expand(axes, *pos.shape[1:])


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - x.shape[2]
    if pad == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], pad, x.shape[3]), x], dim=2)
