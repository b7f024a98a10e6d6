"""CSM's depth decoder as fixed-shape passes: one frame's codebooks 1..31 per call, a CUDA graph per batch bucket.

For each backbone frame the depth decoder (a small Llama over `num_codebooks`
positions: 0 the backbone's last hidden state, k the embedding of codebook k - 1
at offset (k - 1) * vocab) draws codebooks 1..31, codebook k from the logits at
position k through its own head (`codebooks_head.weight[k - 1]`). Here that is
`num_codebooks` single-token passes over a static per-frame cache (the pass cache
of qwen3_omni_moe/predictor.py), sampling inside the passes: temperature and top-k
over sorted logits, then Gumbel-max with noise drawn before the passes from each
request's own generator (a seeded request stays reproducible alone or batched);
greedy rows take no noise. Ids past the codec's codebook (pad and spares) are
never drawn. With all shapes fixed, a frame is one graph replay on CUDA
(HfAREngine's DecodeGraphs); on CPU the same passes run eagerly.

engine_extras["depth_passes"]: "transformers" (the depth model's own forward per pass;
the default on CPU), "fused" (fused_passes.PassStack: the same maths as straight-line
code) or "compiled" (that, torch.compile'd once per batch bucket: the default on CUDA).
"""

from __future__ import annotations

from typing import Any

import torch

# The static per-frame cache is the same object the Qwen3 code predictor uses.
from omni_actors.models.qwen3_omni_moe.predictor import _PassCache
from omni_actors.workers.engines.fused_passes import PassStack, passes_mode, wire_frames
from omni_actors.workers.engines.hf_ar_sampling import fill_uniform, gumbel_of, small_tensor
from omni_actors.workers.engines.hf_ar_slots import bucket_for, buckets


class DepthRunner:
    """Draws a frame's codebooks 1.. for a batch of requests (see the module docstring)."""

    def __init__(self, model: Any, ctx: Any, codes: int) -> None:
        self.depth = model.depth_decoder
        cfg = self.depth.config
        self.groups, self.vocab, self.codes = cfg.num_codebooks, cfg.vocab_size, codes
        self.device = torch.device(ctx.device)
        self.slots = max(1, ctx.max_num_seqs)
        self.sizes = buckets(self.slots, 1)
        dt, dev, s, n = model.dtype, self.device, self.slots, self.groups
        self.mode, self.stack = passes_mode(ctx), None
        if self.mode != "transformers":
            proj = self.depth.model.inputs_embeds_projector
            self.stack = PassStack.build(self.depth.model, cfg, s, n, proj, "csm.depth")
        if self.stack is None:
            self.mode = "transformers"
            shape = (s, cfg.num_key_value_heads, n, cfg.head_dim)
            self.keys = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(cfg.num_hidden_layers)]
            self.values = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(cfg.num_hidden_layers)]
        self.hidden = torch.zeros(s, cfg.backbone_hidden_size, dtype=dt, device=dev)
        self.code0 = torch.zeros(s, dtype=torch.long, device=dev)
        self.uniform = torch.full((s, n - 1, self.vocab), 0.5, device=dev)
        self.inv_temp = torch.ones(s, 1, device=dev)
        self.top_k = torch.full((s, 1), self.vocab, dtype=torch.long, device=dev)
        self.noise_on = torch.zeros(s, 1, 1, device=dev)
        self.positions = torch.arange(n, device=dev)
        self.ranks = torch.arange(self.vocab, device=dev)
        self.caches: dict[int, _PassCache] = {}
        self.staged: tuple[Any, ...] | None = None
        wire_frames(self, ctx, "csm.depth_compile_off")

    @torch.inference_mode()
    def run(
        self, hidden: torch.Tensor, first: torch.Tensor, params: list[dict[str, Any]],
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        """[n, num_codebooks] codes (codebook 0 is `first`) for n rows of backbone states."""
        n = hidden.shape[0]
        batch = bucket_for(n, self.sizes)
        self.hidden[:n].copy_(hidden)
        self.code0[:n].copy_(first)
        temps = [float(p.get("temperature") or 0.0) for p in params]
        ks = [int(p.get("top_k") or 0) for p in params]
        key = (batch, tuple(temps), tuple(ks))
        if key != self.staged:  # the rows' sampling settings, copied only when they change
            self.staged = key
            rows = [[1.0 / t if t > 0 else 1.0, k if 0 < k < self.vocab else self.vocab, 1.0 if t > 0 else 0.0]
                    for t, k in zip(temps, ks, strict=True)]  # fmt: skip
            staged = small_tensor(rows, self.device)
            self.inv_temp[:n, 0].copy_(staged[:, 0])
            self.top_k[:n, 0].copy_(staged[:, 1])
            self.noise_on[:n, 0, 0].copy_(staged[:, 2])
            self.noise_on[n:batch] = 0.0
        fill_uniform(self.uniform, [t > 0 for t in temps], generators)
        codes = self.graphs.run(batch, 0)
        return codes[:n].clone()

    def _cache(self, batch: int) -> _PassCache:
        cache = self.caches.get(batch)
        if cache is None:
            cache = _PassCache([k[:batch] for k in self.keys], [v[:batch] for v in self.values])
            self.caches[batch] = cache
        return cache

    def _frame(self, batch: int) -> torch.Tensor:
        model, head = self.depth.model, self.depth.codebooks_head.weight
        cache = self._cache(batch)
        dtype = self.hidden.dtype
        gumbel = self._gumbel(batch)
        code = self.code0[:batch]
        codes = [code]
        x = self.hidden[:batch, None]
        for pos in range(self.groups - 1):
            cache.pos = pos
            mask = torch.zeros(self.groups, dtype=dtype, device=self.device)
            mask = mask.masked_fill(self.positions > pos, torch.finfo(dtype).min).expand(batch, 1, 1, -1)
            h = model(inputs_embeds=x, attention_mask=mask, past_key_values=cache, use_cache=True).last_hidden_state
            if pos > 0:
                code = self._draw((h[:, -1] @ head[pos - 1]).float(), gumbel[:, pos - 1], batch)
                codes.append(code)
            x = model.embed_tokens(code + pos * self.vocab)[:, None]
        # the last position's logits: codebook groups - 1
        cache.pos = self.groups - 1
        mask = torch.zeros(self.groups, dtype=dtype, device=self.device).expand(batch, 1, 1, -1)
        h = model(inputs_embeds=x, attention_mask=mask, past_key_values=cache, use_cache=True).last_hidden_state
        codes.append(self._draw((h[:, -1] @ head[self.groups - 2]).float(), gumbel[:, self.groups - 2], batch))
        return torch.stack(codes, dim=1)

    def _gumbel(self, batch: int) -> torch.Tensor:
        return gumbel_of(self.uniform[:batch]) * self.noise_on[:batch]

    def _frame_fused(self, batch: int) -> torch.Tensor:
        """The passes of `_frame` on the PassStack: pass 0 reads the backbone state, pass p >= 1
        the embedding of codebook p - 1 and draws codebook p."""
        stack, gumbel = self.stack, self._gumbel(batch)
        code = self.code0[:batch]
        codes = [code]
        stack.step(self.hidden[:batch, None], stack.pos[0], batch)  # pass 0: eager, half the compiling at load
        x = self.depth.model.embed_tokens(code)[:, None]
        for pos in range(1, self.groups):
            code, x = self._pass(x, stack.pos[pos], gumbel, batch)
            codes.append(code)
        return torch.stack(codes, dim=1)

    def _fused_pass(
        self, x: torch.Tensor, pos: torch.Tensor, gumbel: torch.Tensor, batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass p >= 1 (`pos` 0-d): (codebook p [batch], the next pass's input [batch, 1, hidden])."""
        h = self.stack.step(x, pos, batch)
        g = (pos - 1).view(1)
        head = self.depth.codebooks_head.weight.index_select(0, g)[0]
        code = self._draw((h @ head).float(), gumbel.index_select(1, g)[:, 0], batch)
        return code, self.depth.model.embed_tokens(code + pos * self.vocab)[:, None]

    def _draw(self, logits: torch.Tensor, gumbel: torch.Tensor, batch: int) -> torch.Tensor:
        """Temperature, top-k, then Gumbel-max per row; codes past the codebook never win."""
        logits = logits.masked_fill(self.ranks >= self.codes, float("-inf")) * self.inv_temp[:batch]
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        ordered = ordered.masked_fill(self.ranks >= self.top_k[:batch], float("-inf"))
        pick = torch.argmax(ordered + gumbel, dim=-1)
        return order.gather(1, pick[:, None])[:, 0]
