"""The LLM_AR stage engine on transformers: continuous batching with a KV cache per request.

For autoregressive stages vLLM does not run (talkers fed with another stage's
hidden states, small custom AR models). The engine owns scheduling, KV caches,
batching and sampling; everything model-specific sits in an `ARAdapter` that
the model package provides and the stage names in `engine_extras["adapter"]`
("module:Class").

One `step()`:

1. prefills every request that became ready (one forward each: prompts differ
   in length), samples its first token;
2. runs ONE batched decode forward for all other active requests: their
   per-request caches are left-padded to a common length and stacked, the
   padding is masked out, positions are given per row, and afterwards each
   row's cache is cut back out (so requests never share cache memory);
3. samples one token per request (per-request seed, temperature, top-k/p,
   repetition penalty; greedy when no temperature is given) and returns the
   adapter's payload for each; the last one carries finish_reason "stop"
   (a stop token) or "length" (max_tokens, DEFAULT_MAX_TOKENS if unset).

New requests are admitted while fewer than `max_num_seqs` hold a KV cache.

A streaming request (async chunk) may not be ready for its next forward until
more upstream input arrives through `feed`; the adapter says so with `ready`.
Abort drops the request's state at once.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_TOKENS = 4096
"""Tokens a request may generate when its params name no max_tokens."""


@dataclass
class ARSeq:
    """Engine-side state of one request. `data` belongs to the adapter."""

    request_id: str
    params: dict[str, Any]
    streaming: bool
    data: Any = None
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    """Per layer (keys, values), each [1, kv_heads, length, head_dim]; None before prefill."""
    next_pos: int = 0
    """Rotary position of the next input (mrope: the same on every axis once decoding)."""
    tokens: list[int] = field(default_factory=list)
    """Sampled tokens (what the adapter feeds back)."""
    history: list[int] = field(default_factory=list)
    """Ids the repetition penalty looks at."""
    generator: torch.Generator | None = None
    input_done: bool = True
    finished: bool = False


@dataclass
class StepInputs:
    """What the adapter gives the engine for one forward of one request."""

    embeds: torch.Tensor
    """[length, hidden] input embeddings."""
    positions: torch.Tensor | None = None
    """[axes, length] or [length] positions; None means 0, 1, ..., length - 1."""
    next_pos: int | None = None
    """Position after this input (for mrope prompts it differs from the length)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for this request's prefill forward only (not batched)."""


@dataclass
class ForwardOut:
    """What the adapter's forward returns for a batch of rows."""

    logits: torch.Tensor
    """[batch, vocab] at the last position of each row."""
    hidden: Any = None
    """Anything per row the adapter wants back in `on_tokens` (e.g. hidden states)."""


class ARAdapter(abc.ABC):
    """Model-specific half of HfAREngine. One instance per engine."""

    position_axes: int = 1
    """1 for plain rotary positions, 3 for mrope ([temporal, height, width])."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    @abc.abstractmethod
    def load(self) -> torch.nn.Module:
        """Load weights from ctx.model_path; raise with the file's name on a bad checkpoint."""

    @abc.abstractmethod
    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        """Initialise seq.data from a request's (first) inputs."""

    def feed(self, seq: ARSeq, inputs: dict[str, Any], last: bool) -> None:
        """Take more upstream input for a streaming request."""
        raise NotImplementedError(f"{type(self).__name__} does not take streamed input")

    def ready(self, seq: ARSeq) -> bool:
        """True when the request has what its next forward needs."""
        return True

    @abc.abstractmethod
    def prefill(self, seq: ARSeq) -> StepInputs:
        """The prompt of a request."""

    @abc.abstractmethod
    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        """[batch, 1, hidden] inputs for one decode step of each seq (after its last token)."""

    @abc.abstractmethod
    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        extra: dict[str, Any],
    ) -> ForwardOut:
        """Run the model on [batch, length, hidden] embeds.

        positions: [position_axes, batch, length]; mask: [batch, cached + length]
        (0 marks left padding); cache: a DynamicCache the forward extends.
        """

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """A request's effective sampling: deploy defaults < request < pipeline constraints."""
        ctx = self.ctx
        return {**ctx.default_sampling_params, **params, **ctx.sampling_constraints}

    def process_logits(self, seq: ARSeq, logits: torch.Tensor) -> torch.Tensor:
        """Mask tokens this request may not sample now (a [vocab] float32 row)."""
        return logits

    @abc.abstractmethod
    def on_tokens(
        self, seqs: list[ARSeq], tokens: list[int], out: ForwardOut, prefill: bool
    ) -> list[tuple[dict[str, Any], bool]]:
        """Record sampled tokens; return (payload, finished) per seq."""

    def stop_ids(self, seq: ARSeq) -> set[int]:
        return set()


class HfAREngine(StageEngine):
    """Continuous-batching AR engine over a model adapter (see module docstring)."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        if ctx.device == "cpu":
            torch.set_num_threads(1)
        self.adapter: ARAdapter = self.make_adapter()
        self.device = torch.device(ctx.device)
        self.model = self.adapter.load()
        self.seqs: dict[str, ARSeq] = {}

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
        seed = params.get("seed")
        if seed is not None:
            seq.generator = torch.Generator(device="cpu").manual_seed(int(seed))
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
        self.seqs.pop(request_id, None)

    def has_work(self) -> bool:
        holding = sum(1 for s in self.seqs.values() if s.kv is not None)
        room = holding < max(1, self.ctx.max_num_seqs)
        return any(
            self.adapter.ready(s) and (s.kv is not None or room)
            for s in self.seqs.values()
            if not s.finished
        )

    # ---- stepping --------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[EngineOutput]:
        limit = max(1, self.ctx.max_num_seqs)
        holding = sum(1 for s in self.seqs.values() if s.kv is not None)  # KV caches in use
        ready = [s for s in self.seqs.values() if not s.finished and self.adapter.ready(s)]
        new = [s for s in ready if s.kv is None][: max(0, limit - holding)]
        running = [s for s in ready if s.kv is not None][:limit]
        outputs: list[EngineOutput] = []
        for seq in new:
            outputs.extend(self._guarded([seq], self._prefill))
        if running:
            outputs.extend(self._guarded(running, self._decode))
        return outputs

    def _guarded(self, seqs: list[ARSeq], fn: Any) -> list[EngineOutput]:
        try:
            return fn(seqs)
        except Exception as err:
            if len(seqs) != 1:
                raise  # a batch failure fails every request it holds
            self.seqs.pop(seqs[0].request_id, None)
            return [EngineOutput(seqs[0].request_id, {}, True, f"{type(err).__name__}: {err}")]

    def _prefill(self, seqs: list[ARSeq]) -> list[EngineOutput]:
        from transformers import DynamicCache

        (seq,) = seqs
        inp = self.adapter.prefill(seq)
        length = inp.embeds.shape[0]
        pos = torch.arange(length) if inp.positions is None else inp.positions
        pos = self._axes(pos.reshape(-1, length).to(self.device)).unsqueeze(1)  # [axes, 1, length]
        cache = DynamicCache()
        mask = torch.ones(1, length, dtype=torch.long, device=self.device)
        out = self.adapter.forward(inp.embeds[None].to(self.device), pos, mask, cache, inp.extra)
        seq.kv = [(layer.keys, layer.values) for layer in cache.layers]
        seq.next_pos = inp.next_pos if inp.next_pos is not None else int(pos.max()) + 1
        return self._sample([seq], out, prefill=True)

    def _decode(self, seqs: list[ARSeq]) -> list[EngineOutput]:
        from transformers import DynamicCache

        lengths = [s.kv[0][0].shape[2] for s in seqs]
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
            seq.next_pos += 1
        return self._sample(seqs, out, prefill=False)

    def _axes(self, pos: torch.Tensor) -> torch.Tensor:
        """[1 or axes, ...] -> [adapter axes, ...]."""
        axes = self.adapter.position_axes
        if pos.shape[0] == axes:
            return pos
        return pos[:1].expand(axes, *pos.shape[1:])

    def _sample(self, seqs: list[ARSeq], out: ForwardOut, prefill: bool) -> list[EngineOutput]:
        tokens = []
        for row, seq in enumerate(seqs):
            logits = self.adapter.process_logits(seq, out.logits[row].float())
            tokens.append(sample(logits, seq.params, seq.history, seq.generator))
        results = self.adapter.on_tokens(seqs, tokens, out, prefill)
        outputs = []
        for seq, tok, (payload, finished) in zip(seqs, tokens, results, strict=True):
            seq.tokens.append(tok)
            seq.history.append(tok)
            reason = "stop" if finished or tok in self.adapter.stop_ids(seq) else None
            if reason is None and len(seq.tokens) >= int(
                seq.params.get("max_tokens") or DEFAULT_MAX_TOKENS
            ):
                reason = "length"
            if reason is not None:
                finished = True
                seq.finished = True
                self.seqs.pop(seq.request_id, None)
                payload = {**payload, "finish_reason": payload.get("finish_reason", reason)}
            outputs.append(EngineOutput(seq.request_id, payload, finished))
        return outputs

    def close(self) -> None:
        self.seqs.clear()


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - x.shape[2]
    if pad == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], pad, x.shape[3]), x], dim=2)


def sample(
    logits: torch.Tensor,
    params: dict[str, Any],
    history: list[int],
    generator: torch.Generator | None,
) -> int:
    """One token from a [vocab] float32 row: greedy at temperature 0, else top-k/top-p sampling."""
    penalty = float(params.get("repetition_penalty") or 1.0)
    if penalty != 1.0 and history:
        idx = torch.tensor(sorted(set(history)), device=logits.device)
        picked = logits[idx]
        logits = logits.clone()
        logits[idx] = torch.where(picked > 0, picked / penalty, picked * penalty)
    temperature = float(params.get("temperature", 0.0) or 0.0)
    if temperature <= 0.0:
        return int(torch.argmax(logits))
    logits = logits / temperature
    top_k = int(params.get("top_k") or 0)
    if 0 < top_k < logits.shape[0]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    top_p = float(params.get("top_p") or 1.0)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


class TextStream:
    """Incremental detokenisation: the text delta of each new token, holding back split characters."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int, final: bool = False) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd") and not final:
            return ""  # an incomplete UTF-8 sequence: wait for its next byte
        delta, self.sent = text[self.sent :], len(text)
        return delta


class CausalLMAdapter(ARAdapter):
    """Any transformers `AutoModelForCausalLM` folder: prompt in, text and token ids out.

    Inputs: {"prompt_token_ids": [...]}, {"prompt": str} or {"messages": [...]}
    (chat template with the generation prompt). Outputs per step:
    {"text": delta, "token_ids": [id]}.
    """

    def load(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = check_checkpoint(self.ctx.model_path, ("config.json", "tokenizer_config.json"))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        dtype = (
            DTYPES.get(self.ctx.dtype, torch.float32) if self.ctx.device != "cpu" else torch.float32
        )
        self.model = (
            AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.ctx.device).eval()
        )
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return self.model

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        seq.data = {"ids": prompt_ids(self.tokenizer, inputs), "text": TextStream(self.tokenizer)}

    def prefill(self, seq: ARSeq) -> StepInputs:
        ids = torch.tensor(seq.data["ids"], device=self.ctx.device)
        return StepInputs(self.model.get_input_embeddings()(ids))

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        ids = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.ctx.device)
        return self.model.get_input_embeddings()(ids)

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.model(
            inputs_embeds=embeds, position_ids=positions[0], attention_mask=mask,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        return ForwardOut(self.model.lm_head(out.last_hidden_state[:, -1]))

    def on_tokens(self, seqs, tokens, out, prefill):
        return [
            ({"text": s.data["text"].push(t), "token_ids": [t]}, False)
            for s, t in zip(seqs, tokens, strict=True)
        ]

    def stop_ids(self, seq: ARSeq) -> set[int]:
        return set() if seq.params.get("ignore_eos") else self.eos


def check_checkpoint(path: Any, required: tuple[str, ...]) -> Path:
    """Fail early, naming the file, when a checkpoint folder lacks a file or has a bad JSON one."""
    if path is None:
        raise FileNotFoundError("the stage has no model path")
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: model folder not found")
    for name in required:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name}: required checkpoint file is missing")
    for file in sorted(folder.glob("*.json")):
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{file}: not valid JSON ({err})") from None
        if file.name == "config.json" and not isinstance(data, dict):
            raise ValueError(f"{file}: expected a JSON object")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise FileNotFoundError(f"{folder / 'model.safetensors'}: no weights file in the folder")
    return folder


def prompt_ids(tokenizer: Any, inputs: dict[str, Any]) -> list[int]:
    """Token ids of a request's prompt: token ids, a string, or chat messages."""
    if "prompt_token_ids" in inputs:
        return [int(i) for i in inputs["prompt_token_ids"]]
    if "messages" in inputs:
        text = tokenizer.apply_chat_template(
            inputs["messages"], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, add_special_tokens=False).input_ids
    if "prompt" in inputs:
        return tokenizer(inputs["prompt"]).input_ids
    raise ValueError("inputs need 'prompt_token_ids', 'prompt' or 'messages'")
