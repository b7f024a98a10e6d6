"""Qwen3-Omni-MoE's code predictor as fixed-shape passes: one CUDA graph per batch bucket per frame.

For each talker frame the code predictor (a small dense decoder) draws code
groups 1..15 from the talker's hidden state and the frame's first code. Here
that is 16 single-token passes over a static 16-position cache (position 0:
the hidden state, 1: the first code's embedding, p: the embedding of the code
drawn at pass p - 1), sampling inside the passes: top-k / top-p over sorted
logits, then Gumbel-max with noise drawn before the passes from each request's
own generator (so a seeded request stays reproducible on its own); greedy rows
take no noise. With all shapes fixed, the whole frame is one graph replay on
CUDA (HfAREngine's DecodeGraphs); on CPU the same passes run eagerly.

engine_extras["depth_passes"] picks how a pass runs, as for CSM's depth decoder
(fused_passes.py): "transformers" (the default on CPU), "fused", or "compiled" (the
default on CUDA: the straight-line pass torch.compile'd once per batch bucket).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from omni_actors.workers.engines.fused_passes import (
    PassStack,
    passes_mode,
    stacked_weights,
    wire_frames,
)
from omni_actors.workers.engines.hf_ar_sampling import fill_uniform, gumbel_of, small_tensor
from omni_actors.workers.engines.hf_ar_slots import bucket_for, buckets

TOP_K = 50
TOP_P = 0.8
"""The predictor's sampling when the talker samples (as in transformers); temperature 1.
Other models' predictors (qwen3_tts) pass their own."""


class _PassLayer(CacheLayerMixin):
    """One layer's K/V rows [batch, heads, positions, dim]; a pass writes at `owner.pos`."""

    is_compileable = True

    def __init__(self, owner: _PassCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner, self.keys, self.values = owner, keys, values
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        pos = self.owner.pos
        self.keys[:, :, pos : pos + 1].copy_(key_states)
        self.values[:, :, pos : pos + 1].copy_(value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return self.owner.pos

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class _PassCache(Cache):
    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.pos = 0
        super().__init__(layers=[_PassLayer(self, k, v) for k, v in zip(keys, values, strict=True)])


class CodePredictorRunner:
    """Draws a frame's remaining code groups for a batch of requests (see module docstring)."""

    fused_default = True
    """Compiled straight-line passes by default on CUDA (engine_extras depth_passes overrides)."""

    def __init__(
        self, talker: Any, ctx: Any, groups: int,
        top_k: int = TOP_K, top_p: float = TOP_P, temperature: float = 1.0, width: int | None = None,
    ) -> None:  # fmt: skip
        """`width`: the talker state row's size when it is not the predictor's (it projects it)."""
        self.talker, self.groups = talker, groups
        self.top_k, self.top_p, self.inv_temp = top_k, top_p, 1.0 / temperature
        self.device = torch.device(ctx.device)
        self.slots = max(1, ctx.max_num_seqs)
        self.sizes = buckets(self.slots, 1)
        pred = talker.code_predictor
        cfg = pred.config
        dt, dev, n, s = talker.dtype, self.device, groups, self.slots
        heads = cfg.num_key_value_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.mode, self.stack = passes_mode(ctx, self.fused_default), None
        if self.mode != "transformers":
            proj = getattr(pred, "small_to_mtp_projection", None)  # Qwen3-TTS: talker width -> predictor's
            self.stack = PassStack.build(pred.model, cfg, s, n, proj, "qwen3.predictor")
        if self.stack is None:
            self.mode = "transformers"
            shape = (s, heads, n, dim)
            self.keys = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(cfg.num_hidden_layers)]
            self.values = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(cfg.num_hidden_layers)]
        else:
            self.head_w = stacked_weights(pred.lm_head)  # [groups - 1, vocab, hidden]
            self.tables_w = stacked_weights(pred.get_input_embeddings())  # [groups - 1, vocab, width]
        self.hidden = torch.zeros(s, width or cfg.hidden_size, dtype=dt, device=dev)
        self.code0 = torch.zeros(s, dtype=torch.long, device=dev)
        self.uniform = torch.full((s, n - 1, cfg.vocab_size), 0.5, device=dev)
        self.sampled = torch.zeros(s, dtype=torch.float32, device=dev)
        self.positions = torch.arange(n, device=dev)
        self.caches: dict[int, _PassCache] = {}
        self.staged: tuple[Any, ...] | None = None
        wire_frames(self, ctx, "qwen3.predictor_compile_off")

    @torch.inference_mode()
    def run(
        self,
        hidden: torch.Tensor,
        first: torch.Tensor,
        sampled: list[bool],
        generators: list[torch.Generator | None],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(frame embeddings [n, hidden], codes [n, groups]) for n rows of talker states."""
        n = hidden.shape[0]
        batch = bucket_for(n, self.sizes)
        self.hidden[:n].copy_(hidden)
        self.code0[:n].copy_(first)
        if self.staged != (batch, tuple(sampled)):  # copied only when the rows' settings change
            self.staged = (batch, tuple(sampled))
            self.sampled[:n].copy_(small_tensor([float(x) for x in sampled], self.device))
            self.sampled[n:batch] = 0.0
        fill_uniform(self.uniform, sampled, generators)
        frame, codes = self.graphs.run(batch, 0)
        return frame[:n], codes[:n]

    def _cache(self, batch: int) -> _PassCache:
        cache = self.caches.get(batch)
        if cache is None:
            cache = _PassCache([k[:batch] for k in self.keys], [v[:batch] for v in self.values])
            self.caches[batch] = cache
        return cache

    def _gumbel(self, batch: int) -> torch.Tensor:
        return gumbel_of(self.uniform[:batch]) * self.sampled[:batch, None, None]

    def _frame_fused(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`_frame`'s passes on the PassStack: pass 0 reads the talker state, pass 1 the first
        code's embedding, pass p >= 1 draws group p from its own head."""
        stack, gumbel = self.stack, self._gumbel(batch)
        code0 = self.code0[:batch]
        frame = self.talker.get_input_embeddings()(code0)
        codes = [code0]
        stack.step(self.hidden[:batch, None], stack.pos[0], batch)  # pass 0: eager, half the compiling at load
        x = frame[:, None]
        for pos in range(1, self.groups):
            code, emb = self._pass(x, stack.pos[pos], gumbel, batch)
            codes.append(code)
            frame = frame + emb
            x = emb[:, None]
        return frame, torch.stack(codes, dim=1)

    def _fused_pass(
        self, x: torch.Tensor, pos: torch.Tensor, gumbel: torch.Tensor, batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass p >= 1 (`pos` 0-d): (group p's code [batch], its embedding [batch, width])."""
        h = self.stack.step(x, pos, batch)
        g = (pos - 1).view(1)
        logits = (h @ self.head_w.index_select(0, g)[0].T).float() * self.inv_temp
        code = _draw(logits, gumbel.index_select(1, g)[:, 0], self.top_k, self.top_p)
        return code, self.tables_w.index_select(0, g)[0][code]

    def _frame(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        pred = self.talker.code_predictor
        tables = pred.get_input_embeddings()
        cache = self._cache(batch)
        code0 = self.code0[:batch]
        frame = self.talker.get_input_embeddings()(code0)
        gumbel = self._gumbel(batch)
        dtype = self.hidden.dtype
        codes = [code0]
        x = self.hidden[:batch, None]
        for pos in range(self.groups):
            cache.pos = pos
            allowed = self.positions <= pos
            mask = torch.zeros(self.groups, dtype=dtype, device=self.device)
            mask = mask.masked_fill(~allowed, torch.finfo(dtype).min).expand(batch, 1, 1, -1)
            ids = self.positions[pos : pos + 1].expand(batch, 1)
            h = pred.model(
                inputs_embeds=x, position_ids=ids, attention_mask=mask, past_key_values=cache,
                use_cache=True,
            ).last_hidden_state  # fmt: skip
            if pos == 0:
                x = frame[:, None]
                continue
            g = pos - 1
            logits = pred.lm_head[g](h[:, -1]).float() * self.inv_temp
            code = _draw(logits, gumbel[:, g], self.top_k, self.top_p)
            codes.append(code)
            emb = tables[g](code)
            frame = frame + emb
            x = emb[:, None]
        return frame, torch.stack(codes, dim=1)


def _draw(
    logits: torch.Tensor, gumbel: torch.Tensor, top_k: int = TOP_K, top_p: float = TOP_P
) -> torch.Tensor:
    """Top-k / top-p filtered Gumbel-max per row; a row with zero noise takes its argmax. Only the
    top `top_k` ids are ranked (topk, not a sort of the codebook); `gumbel` is by rank, so the
    draw is the one a whole sort would give."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        ordered, order = torch.topk(logits, top_k, dim=-1)
        gumbel = gumbel[..., :top_k]
    else:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    ordered = ordered.masked_fill(probs.cumsum(-1) - probs > top_p, float("-inf"))
    pick = torch.argmax(ordered + gumbel, dim=-1)
    return order.gather(1, pick[:, None])[:, 0]
