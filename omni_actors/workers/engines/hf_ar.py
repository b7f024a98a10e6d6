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

The step's parts are mixins of the engine, each in its own file: the prompts' forward
(hf_ar_prompts.py), the decode forward (hf_ar_decode.py), the tokens and the ends
(hf_ar_tokens.py); this file holds the engine's state, its requests and `step()`.
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
from omni_actors.workers.engines.hf_ar_decode import DecodeSteps
from omni_actors.workers.engines.hf_ar_fused import FusedDecoder, FusedUnsupported
from omni_actors.workers.engines.hf_ar_grammar import Grammars
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs, cuda_graphs_wanted
from omni_actors.workers.engines.hf_ar_lookahead import InFlight
from omni_actors.workers.engines.hf_ar_prompts import PromptSteps
from omni_actors.workers.engines.hf_ar_sampling import (  # noqa: F401
    all_greedy,
    pick_rows,
    sample,
)
from omni_actors.workers.engines.hf_ar_slots import ContextLengthExceeded, SlotKV
from omni_actors.workers.engines.hf_ar_tokens import DEFAULT_MAX_TOKENS, TokenSteps
from omni_actors.workers.engines.hf_ar_warm import warm_compiled, warm_graphs, warm_wanted
from omni_actors.workers.engines.torch_setup import one_cpu_thread, seeded

DEFAULT_STATIC_MAX_LEN = 4096
"""KV positions per slot of the static cache when the stage sets no max_model_len."""
KV_CACHES = ("static", "dynamic")

log = logs.get(__name__)


class HfAREngine(PromptSteps, DecodeSteps, TokenSteps, StageEngine):
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

    def close(self) -> None:
        self.ahead = None
        for seq in list(self.seqs.values()):
            self._drop(seq)
