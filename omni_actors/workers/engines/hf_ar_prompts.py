"""HfAREngine's prompt half of a step: new requests' prompts run through one forward and fill their KV.

A mixin of HfAREngine (hf_ar.py), which holds the state these methods use (ctx, adapter, device,
model, slots, prefill, max_len, batch_prefill, _extra_batches) and the methods they call
(_guarded, _failed: hf_ar.py; _axes: hf_ar_decode.py; _sample: hf_ar_tokens.py). Prompts of
plain embeddings share one left-padded forward when the adapter allows it (`batch_prefill`),
prompts with extra inputs too when the adapter merges them (`batch_extra`), the others run one by
one; a prompt the adapter allows (`graph_prefill`) runs in a bucket of PrefillBuckets
(hf_ar_prefill.py), replayed as a CUDA graph where captured.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engine import EngineOutput
from omni_actors.workers.engines.hf_ar_adapter import ARSeq, ForwardOut, StepInputs
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted
from omni_actors.workers.engines.hf_ar_prefill import PrefillBuckets
from omni_actors.workers.engines.hf_ar_slots import ContextLengthExceeded
from omni_actors.workers.engines.torch_setup import varying_shapes_attention


class PromptSteps:
    """HfAREngine's prefill: the prompts' forward, their KV stored, their first tokens sampled."""

    def _prefill_buckets(self, wanted: Any) -> PrefillBuckets | None:
        if not isinstance(wanted, bool):
            raise ValueError(f"engine_extras.prefill_graphs: expected true or false, got {wanted!r}")
        if not wanted or self.adapter.graph_prefill is None:
            return None
        config = self.model.config
        hidden = getattr(config, "hidden_size", None) or config.get_text_config().hidden_size
        graphs = cuda_graphs_wanted(self.ctx)
        buckets = PrefillBuckets(self.adapter, self.device, hidden, next(self.model.parameters()).dtype,
                                 max(1, self.ctx.max_num_seqs), graphs)  # fmt: skip
        if graphs:
            with torch.inference_mode(), varying_shapes_attention(self.device):
                buckets.warm()
        return buckets

    def _prefill_all(self, seqs: list[ARSeq]) -> list[EngineOutput]:
        """Prompts of new requests: plain-embedding prompts in one left-padded forward when the
        adapter allows it (`batch_prefill`), prompts with extra inputs too when the adapter merges
        them (`batch_extra`), the others one by one."""
        outputs: list[EngineOutput] = []
        batch: list[tuple[ARSeq, StepInputs]] = []
        for seq in seqs:
            try:
                inp = self.adapter.prefill(seq)
                if self.max_len is not None and inp.embeds.shape[0] > self.max_len:
                    raise ContextLengthExceeded(seq.request_id, inp.embeds.shape[0], self.max_len)
            except Exception as err:
                outputs.append(self._failed(seq, err))
                continue
            if self.batch_prefill and (not inp.extra or self._extra_batches):
                batch.append((seq, inp))
            else:
                outputs.extend(self._guarded([seq], lambda s, inp=inp: self._prefill(s, [inp])))
        if batch:
            inps = [inp for _, inp in batch]
            outputs.extend(self._guarded([s for s, _ in batch], lambda s: self._prefill(s, inps)))
        return outputs

    def _prefill(self, seqs: list[ARSeq], inps: list[StepInputs]) -> list[EngineOutput]:
        lengths = [inp.embeds.shape[0] for inp in inps]
        longest = max(lengths)
        pads = [longest - n for n in lengths]
        extra = inps[0].extra
        if len(inps) > 1 or (extra and self._extra_batches):  # (one prompt's extras as the adapter merges them)
            extra = self.adapter.batch_extra([inp.extra for inp in inps], pads) if any(i.extra for i in inps) else {}
        shape = None
        if self.prefill is not None and extra == self.prefill.extra and all(i.positions is None for i in inps):
            shape = self.prefill.bucket(len(inps), longest)
        with varying_shapes_attention(self.device):
            if shape is not None:  # bucketed, replayed where captured (hf_ar_prefill.py)
                out, layers = self.prefill.run(shape, [inp.embeds for inp in inps])
                out = out.rows(slice(0, len(inps)))  # (the bucket's spare rows are not prompts)
                longest, pads, ends = shape[1], [shape[1] - n for n in lengths], lengths
            else:
                out, layers, ends = self._prompt_forward(inps, lengths, extra)
        out.pads = pads
        for row, (seq, inp, n) in enumerate(zip(seqs, inps, lengths, strict=True)):
            pad = longest - n
            kv = [(k[row : row + 1, :, pad:], v[row : row + 1, :, pad:]) for k, v in layers]
            if self.slots is not None:
                self.slots.store(seq, kv)
            else:  # (a bucket's buffers are reused: copies)
                seq.kv = kv if len(seqs) == 1 and shape is None else [(k.clone(), v.clone()) for k, v in kv]
            seq.cached = seq.prompt_len = n
            seq.prefilled = True
            seq.next_pos = inp.next_pos if inp.next_pos is not None else ends[row]
        return self._sample(seqs, out, prefill=True)

    def _prompt_forward(
        self, inps: list[StepInputs], lengths: list[int], extra: dict[str, Any]
    ) -> tuple[ForwardOut, list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
        """The prompts' forward, left-padded to the longest: (its output, each layer's keys and
        values, each row's next position where its StepInputs give none)."""
        from transformers import DynamicCache

        longest, axes = max(lengths), self.adapter.position_axes
        first = inps[0].embeds
        embeds = first.new_zeros(len(inps), longest, first.shape[-1], device=self.device)
        pos = torch.zeros(axes, len(inps), longest, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(inps), longest, dtype=torch.long, device=self.device)
        for row, (inp, n) in enumerate(zip(inps, lengths, strict=True)):
            p = torch.arange(n) if inp.positions is None else inp.positions
            pad = longest - n  # left padding: every row's last position is its prompt's last
            embeds[row, pad:] = inp.embeds
            pos[:, row, pad:] = self._axes(p.reshape(-1, n).to(self.device))
            mask[row, pad:] = 1
        cache = DynamicCache()
        out = self.adapter.forward(embeds, pos, mask, cache, extra)
        ends = [-1 if inp.next_pos is not None else int(pos[:, row].max()) + 1 for row, inp in enumerate(inps)]
        return out, [(x.keys, x.values) for x in cache.layers], ends
