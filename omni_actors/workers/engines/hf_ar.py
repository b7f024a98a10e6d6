"""The LLM_AR stage engine on transformers: continuous batching over a model adapter.

For autoregressive stages vLLM does not run (talkers fed with another stage's
hidden states, small custom AR models). The engine owns scheduling, the KV
cache, batching and sampling; everything model-specific sits in an
`ARAdapter` (hf_ar_adapter.py) that the model package provides and the stage
names in `engine_extras["adapter"]` ("module:Class").

One `step()`:

1. prefills every request that became ready (as many as there are free
   slots), samples its first token: prompts of plain embeddings share one
   left-padded forward when the adapter allows it (`batch_prefill`;
   engine_extras["batch_prefill"] false turns it off, a baseline), prompts
   with extra inputs (media) run one by one;
2. runs ONE batched decode forward for all other active requests;
3. samples one token per request (hf_ar_sampling.py) and returns the
   adapter's payload for each; the last one carries finish_reason "stop"
   (a stop token) or "length" (max_tokens, DEFAULT_MAX_TOKENS if unset, or
   the token that filled the KV cache's max_model_len positions).

First-token priority (`engine_extras["first_chunk_priority"]`, default on): a
step that has requests to prefill while others are decoding runs only the
prefill (1) and returns, so the new requests' first tokens leave one decode
forward sooner; the running requests decode in the next step, which also takes
the just-prefilled ones. Their tokens come no later than they would have (the
decode waited for the prefill either way). The next step always decodes, so a
stream of arrivals cannot starve running requests. Off: (1) and (2) in one step.

KV cache, engine_extras["kv_cache"]:

- "static" (default on CUDA): preallocated slot buffers (hf_ar_slots.py); a
  decode step has fixed shapes per batch/length bucket and, with
  engine_extras["cuda_graphs"] (default on CUDA), replays a captured CUDA
  graph (hf_ar_graphs.py). Sized by engine_extras["max_model_len"]
  (DEFAULT_STATIC_MAX_LEN when unset). engine_extras["fused_decode"] (default
  on CUDA) replaces the transformers layers in that step with our own
  straight-line decode step for Llama-family models (hf_ar_fused.py: packed
  q/k/v and gate/up GEMMs, no graph breaks); a model it cannot fuse, or an
  adapter with its own forward, logs `hf_ar.fused_off` and keeps the normal
  step. engine_extras["compile"] (CUDA; default on where the fused step runs)
  runs the step through torch.compile first (hf_ar_compile.py: with the fused
  step one layer's code, shared by every layer, compiled with symbolic sizes at
  load by hf_ar_warm.warm_compiled, and cached on disk across restarts).
  Every static step also takes the greedy argmax of its logits inside the
  step, so a step whose rows are all greedy (no penalty, no logits processing)
  brings back B ids instead of sampling over the vocabulary on the host.
  When a step's input is the last token's embedding, such a step is queued
  one ahead of the host's work on the step before (engine_extras["lookahead"],
  default on CUDA; hf_ar_lookahead.py); so is every step of an adapter that
  draws its steps on the device itself (`draws_ahead`). Prompts an adapter
  allows (`graph_prefill`) run left-padded to a (batch, length) bucket and
  replayed as CUDA graphs (engine_extras["prefill_graphs"], default on CUDA;
  hf_ar_prefill.py).
- "dynamic" (default on CPU): a DynamicCache per request; each decode step
  left-pads and stacks the requests' caches, then cuts each row back out.
  Cheapest for tiny CPU models.

A prompt longer than max_model_len is refused alone with ContextLengthExceeded
(a 400 context_length_exceeded; nothing was sent). A request whose generation
fills the cache ends like vLLM's at max_model_len: the token sampled from its
last position is its last, finish_reason "length" (so max_tokens is in effect
min(max_tokens, max_model_len - prompt + 1): the last token needs no KV
position), never an error after its outputs streamed. New requests are
admitted while fewer than `max_num_seqs` hold KV. A streaming request (async chunk) may not be ready for
its next forward until more upstream input arrives through `feed`; the adapter
says so with `ready`. Abort drops the request's state and KV at once.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors import logs
from omni_actors.workers.engine import (
    TORCH_PRELOAD,
    EngineContext,
    EngineOutput,
    StageEngine,
    first_chunk_priority,
)
from omni_actors.workers.engines.hf_ar_adapter import (  # noqa: F401 - the public names
    DTYPES,
    ARAdapter,
    ARSeq,
    ForwardOut,
    StepInputs,
    TextStream,
    check_checkpoint,
    prompt_ids,
)
from omni_actors.workers.engines.hf_ar_causal import CausalLMAdapter  # noqa: F401 - a public name
from omni_actors.workers.engines.hf_ar_compile import (
    COMPILE_WARMUPS,
    compile_dynamic,
    compile_mode,
    compile_scope,
    compile_wanted,
    compiled,
    compiled_step,
    prefer_blas,
)
from omni_actors.workers.engines.hf_ar_fused import FusedDecoder, FusedUnsupported
from omni_actors.workers.engines.hf_ar_grammar import Grammars
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs, cuda_graphs_wanted
from omni_actors.workers.engines.hf_ar_lookahead import InFlight, chain_next, queue
from omni_actors.workers.engines.hf_ar_prefill import PrefillBuckets
from omni_actors.workers.engines.hf_ar_sampling import (  # noqa: F401
    all_greedy,
    pick_rows,
    sample,
)
from omni_actors.workers.engines.hf_ar_slots import ContextLengthExceeded, SlotKV
from omni_actors.workers.engines.hf_ar_warm import warm_compiled, warm_graphs, warm_wanted
from omni_actors.workers.engines.torch_setup import one_cpu_thread, seeded, varying_shapes_attention

DEFAULT_MAX_TOKENS = 4096
"""Tokens a request may generate when its params name no max_tokens."""
DEFAULT_STATIC_MAX_LEN = 4096
"""KV positions per slot of the static cache when the stage sets no max_model_len."""
KV_CACHES = ("static", "dynamic")

log = logs.get(__name__)


class HfAREngine(StageEngine):
    """Continuous-batching AR engine over a model adapter (see module docstring)."""

    ZYGOTE_PRELOAD = TORCH_PRELOAD

    default_max_tokens = DEFAULT_MAX_TOKENS

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        one_cpu_thread(ctx)
        extras = ctx.engine_extras
        cuda = ctx.device == "cuda"
        kind = extras.get("kv_cache") or ("static" if cuda else "dynamic")
        if kind not in KV_CACHES:
            raise ValueError(f"engine_extras.kv_cache: expected one of {KV_CACHES}, got {kind!r}")
        limit = extras.get("max_model_len")
        if limit is not None and int(limit) < 1:
            raise ValueError(f"engine_extras.max_model_len: expected a positive int, got {limit!r}")
        self.adapter: ARAdapter = self.make_adapter()
        self.device = torch.device(ctx.device)
        self.model = self.adapter.load()
        self.seqs: dict[str, ARSeq] = {}
        self.first_priority = first_chunk_priority(extras)
        batch = extras.get("batch_prefill", True)
        if not isinstance(batch, bool):
            raise ValueError(f"engine_extras.batch_prefill: expected true or false, got {batch!r}")
        self.batch_prefill = batch and self.adapter.batch_prefill
        self._extra_batches = type(self.adapter).batch_extra is not ARAdapter.batch_extra
        """Prompts with `extra` inputs may share a batch prefill too (the adapter merges them)."""
        self._prefill_only = False
        """The last step ran only a prefill (so this one decodes)."""
        mode = compile_mode(ctx)  # checked on every device
        scope, dynamic = compile_scope(ctx), compile_dynamic(ctx)
        prefer_blas(ctx)
        self.static = kind == "static"
        self.max_len = int(limit) if limit else (DEFAULT_STATIC_MAX_LEN if self.static else None)
        self.slots: SlotKV | None = None
        self.graphs: DecodeGraphs | None = None
        self.fused: FusedDecoder | None = None
        self._raw_logits = type(self.adapter).process_logits is ARAdapter.process_logits
        """The adapter leaves logits as they are (so a greedy row's token is their argmax)."""
        self.grammars: Grammars | None = None
        fused = extras.get("fused_decode", cuda and self.static)  # the CPU path stays as it was
        if not isinstance(fused, bool):
            raise ValueError(f"engine_extras.fused_decode: expected true or false, got {fused!r}")
        ahead = extras.get("lookahead", cuda)  # on a CPU nothing runs while the host works
        if not isinstance(ahead, bool):
            raise ValueError(f"engine_extras.lookahead: expected true or false, got {ahead!r}")
        self.ahead: InFlight | None = None
        """The decode step queued ahead of the host's work (hf_ar_lookahead.py)."""
        self.thrown_away = 0
        """Steps queued ahead, then thrown away (a request left while one was queued)."""
        if fused and not self.static:  # (only where asked: the default follows the cache)
            log.warning("hf_ar.fused_off", reason="fused_decode needs kv_cache static")
        compile_now = False
        if self.static:
            slots = max(1, ctx.max_num_seqs)
            self.slots = SlotKV(slots, self.max_len, self.adapter.position_axes, self.device)
            self.fused = self._fused("fused_decode" in extras) if fused else None
            step, warmups = self._static_forward, 0
            if self.fused is not None:
                step = self.fused.forward
            if compile_wanted(ctx, self.fused is not None):
                warmups = COMPILE_WARMUPS
                if self.fused is not None and scope == "layer":
                    self.fused.compile_layers(lambda fn: compiled(fn, mode, dynamic=dynamic))
                    compile_now = dynamic
                else:
                    step = compiled_step(step, mode)
            self.graphs = DecodeGraphs(step, cuda_graphs_wanted(ctx), warmups,
                                       len(self.slots.batch_sizes) * len(self.slots.length_sizes))
        self.prefill = self._prefill_buckets(extras.get("prefill_graphs", cuda and self.static))
        """Prompt forwards over bucketed static buffers, captured on CUDA (hf_ar_prefill.py), or None."""
        self.lookahead = ahead and self.static and (type(self.adapter).embeds_last_token or self.adapter.draws_ahead)
        """Queue a decode step before the host takes the one before (inputs: last tokens' embeddings,
        or what the adapter's own draw makes)."""
        if compile_now:  # the symbolic compiles at load, not under a request
            warm_compiled(self)
        if warm_wanted(self):  # (graphs exist only for the static cache)
            warm_graphs(self)

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

    def _fused(self, asked: bool) -> FusedDecoder | None:
        """The fused decode step, or None (logged: a warning where the deploy `asked` for it)
        when this stage cannot take it."""
        try:
            kind = type(self.adapter)
            parts = self.adapter.fused_model()
            if parts is None:
                raise FusedUnsupported(f"{kind.__name__} has its own forward and no fused step")
            return FusedDecoder(parts, self.slots, self.max_len, kind.embeds_last_token)
        except FusedUnsupported as err:
            (log.warning if asked else log.info)("hf_ar.fused_off", reason=str(err))
            return None

    # ---- requests --------------------------------------------------------

    def add(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        streaming: bool = False,
    ) -> None:
        params = self.adapter.sampling_params(params)
        seq = ARSeq(request_id, params, streaming, input_done=not streaming)
        seq.generator = seeded(params.get("seed"), self.device)
        if params.get("structured_outputs"):
            seq.grammar = self._grammars().start(params)
        self.adapter.start(seq, inputs)
        self.seqs[request_id] = seq

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        seq = self.seqs.get(request_id)
        if seq is None:
            return
        self.adapter.feed(seq, inputs, last)
        if last:
            seq.input_done = True

    def abort(self, request_id: str) -> None:
        seq = self.seqs.get(request_id)
        if seq is not None:
            self._drop(seq)

    def _drop(self, seq: ARSeq) -> None:
        """Forget a request and free its KV (its slot goes back at once; a step queued ahead is
        thrown away first, as the last slot's request may move)."""
        self.seqs.pop(seq.request_id, None)
        if seq.slot is not None and self.ahead is not None:
            self.ahead = None
            self.thrown_away += 1
        if self.slots is not None:
            self.slots.release(seq)
        seq.kv = None

    def has_work(self) -> bool:
        if self.ahead is not None:
            return True
        holding = sum(1 for s in self.seqs.values() if s.prefilled)
        room = holding < max(1, self.ctx.max_num_seqs)
        return any(
            self.adapter.ready(s) and (s.prefilled or room)
            for s in self.seqs.values()
            if not s.finished
        )

    # ---- stepping --------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[EngineOutput]:
        if self.ahead is not None:  # take the step queued last time (and maybe queue the next)
            return self._take(self.ahead)
        limit = max(1, self.ctx.max_num_seqs)
        holding = sum(1 for s in self.seqs.values() if s.prefilled)
        ready = [s for s in self.seqs.values() if not s.finished and self.adapter.ready(s)]
        new = [s for s in ready if not s.prefilled][: max(0, limit - holding)]
        running = [s for s in ready if s.prefilled][:limit]
        outputs: list[EngineOutput] = []
        if new:
            outputs.extend(self._prefill_all(new))
        first_only = self.first_priority and bool(new and running) and not self._prefill_only
        self._prefill_only = first_only
        if first_only:
            return outputs  # the new requests' first tokens leave now; the decode is the next step
        if running:  # (no full cache: the token that filled one ended its request, _sample)
            decode = self._decode_static if self.static else self._decode_dynamic
            outputs.extend(self._guarded(running, decode))
        return outputs

    def _guarded(self, seqs: list[ARSeq], fn: Any) -> list[EngineOutput]:
        try:
            return fn(seqs)
        except Exception as err:
            if len(seqs) != 1:
                raise  # a batch failure fails every request it holds
            return [self._failed(seqs[0], err)]

    def _failed(self, seq: ARSeq, err: Exception) -> EngineOutput:
        """The one error output of a request that failed here, logged once (the stage answers the
        caller with it; a failure that is ours, not the request's, is an error line)."""
        self._drop(seq)
        rejected = isinstance(err, ContextLengthExceeded)
        (log.warning if rejected else log.error)("worker.request_failed", request_id=seq.request_id,
                                                 error=repr(err), rejected=rejected)
        return EngineOutput(seq.request_id, {}, True, f"{type(err).__name__}: {err}", rejected,
                            getattr(err, "code", None) if rejected else None)

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

    def _guided(self, seqs: list[ARSeq]) -> bool:
        return self.grammars is not None and any(s.grammar is not None for s in seqs)

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

    def _grammars(self) -> Grammars:
        """The stage's grammar compiler (made on the first guided request)."""
        if self.grammars is None:
            text = self.adapter.text_tokenizer()
            if text is None:
                raise ValueError("response_format: this stage does not guide its decoding; ask for plain text")
            self.grammars = Grammars(*text)
        return self.grammars

    def _sample(self, seqs: list[ARSeq], out: ForwardOut, prefill: bool, drawn: Any = None) -> list[EngineOutput]:
        guided = self._guided(seqs)
        if drawn is not None:  # the adapter's draw, queued with the step
            took = self.adapter.take_draw(seqs, drawn)
        else:
            took = None if guided else self.adapter.draw(seqs, out, prefill)
        tokens, results = took if took is not None else self._pick(seqs, out, prefill, guided)
        ended = [guided and s.grammar is not None and Grammars.consume(s, t) for s, t in zip(seqs, tokens, strict=True)]
        outputs = []
        for seq, tok, done, (payload, finished) in zip(seqs, tokens, ended, results, strict=True):
            seq.tokens.append(tok)
            reason = "stop" if finished or done or tok in self.adapter.stop_ids(seq) else None
            if reason is None and (self._full(seq) or len(seq.tokens) >= int(
                seq.params.get("max_tokens") or DEFAULT_MAX_TOKENS
            )):
                reason = "length"
            if reason is not None:
                finished = True
                seq.finished = True
                self._drop(seq)
                payload = {**payload, "finish_reason": payload.get("finish_reason", reason),
                           "prompt_tokens": seq.prompt_len, "completion_tokens": len(seq.tokens)}
            outputs.append(EngineOutput(seq.request_id, payload, finished))
        return outputs

    def _full(self, seq: ARSeq) -> bool:
        """The request's KV holds max_len positions: no next step can take its last token, so that
        token ends it ("length", as vLLM ends a request at max_model_len), whatever max_tokens says."""
        return self.max_len is not None and seq.cached >= self.max_len

    def _pick(
        self, seqs: list[ARSeq], out: ForwardOut, prefill: bool, guided: bool
    ) -> tuple[list[int], list[tuple[dict[str, Any], bool]]]:
        """The engine's sampling of a step: a token per row, and the adapter's (payload, finished) per seq."""
        if out.tokens is not None and self._raw_logits and not guided and all_greedy(seqs):
            ids = out.tokens  # the argmax the step took: B ids, no vocab pass
        else:
            logits = self.adapter.process_logits(seqs, out.logits.float())
            if guided:
                self.grammars.mask(logits, seqs)
            ids = pick_rows(logits, seqs)
        on_device = None if guided else self.adapter.on_device_tokens(seqs, ids, out, prefill)
        if on_device is None:
            tokens = ids.tolist()
            results = self.adapter.on_tokens(seqs, tokens, out, prefill)
        else:
            tokens, results = on_device
        return tokens, results

    def close(self) -> None:
        self.ahead = None
        for seq in list(self.seqs.values()):
            self._drop(seq)


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - x.shape[2]
    if pad == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], pad, x.shape[3]), x], dim=2)
