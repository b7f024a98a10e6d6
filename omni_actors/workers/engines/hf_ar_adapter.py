"""The model-facing half of HfAREngine: per-request state, the ARAdapter contract, checkpoint helpers.

An adapter (one per engine, provided by a model package) owns everything
model-specific: loading, prompts, the inputs of each decode step, the forward
call, logits masks and what each step hands downstream. The engine owns
scheduling, the KV cache, batching and sampling.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.torch_setup import DTYPES, load_dtype  # noqa: F401 - DTYPES: the public name


@dataclass
class ARSeq:
    """Engine-side state of one request. `data` belongs to the adapter."""

    request_id: str
    params: dict[str, Any]
    streaming: bool
    data: Any = None
    prefilled: bool = False
    """True once the prompt's forward ran (the request then holds KV: a slot or its own cache)."""
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    """Dynamic KV only: per layer (keys, values), each [1, kv_heads, length, head_dim]."""
    slot: int | None = None
    """Static KV only: the row of the slot cache this request owns."""
    cached: int = 0
    """Positions in the KV cache (prompt + fed tokens)."""
    prompt_len: int = 0
    """Positions the prompt's forward took (the usage's prompt_tokens)."""
    next_pos: int = 0
    """Rotary position of the next input (mrope: the same on every axis once decoding)."""
    tokens: list[int] = field(default_factory=list)
    """Sampled tokens (what the adapter feeds back)."""
    seen: torch.Tensor | None = None
    """[vocab] bool of sampled ids, for the repetition penalty (made on first use)."""
    generator: torch.Generator | None = None
    input_done: bool = True
    finished: bool = False
    grammar: Any = None
    """The request's llguidance matcher when its decoding is guided (hf_ar_grammar.py)."""


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
    """Tensors per row (a tensor, or a tuple/list/dict of them) the adapter wants in `on_tokens`."""
    pads: list[int] | None = None
    """Set by the engine after a batched prefill: each row's left padding (per-position outputs
    of row i start at pads[i])."""
    tokens: torch.Tensor | None = None
    """[batch] argmax of each row's logits, when the step computed it (the static decode step
    does, inside its graph): the engine's sampling uses it for steps whose rows are all greedy
    with unprocessed logits, so only B ids come back to the host."""

    def rows(self, index: torch.Tensor | slice) -> ForwardOut:
        """The same output for the rows `index` (dim 0 of every tensor)."""
        tokens = None if self.tokens is None else self.tokens[index]
        return ForwardOut(self.logits[index], _rows(self.hidden, index), tokens=tokens)


def _rows(x: Any, index: torch.Tensor | slice) -> Any:
    if isinstance(x, torch.Tensor):
        return x[index]
    if isinstance(x, tuple | list):
        return type(x)(_rows(v, index) for v in x)
    if isinstance(x, dict):
        return {k: _rows(v, index) for k, v in x.items()}
    return x


class ARAdapter(abc.ABC):
    """Model-specific half of HfAREngine. One instance per engine."""

    position_axes: int = 1
    """1 for plain rotary positions, 3 for mrope ([temporal, height, width])."""
    batch_prefill: bool = False
    """True when prompts without `extra` may share one left-padded prefill forward (then
    `forward` must take a 2D padding mask, and per-position prefill outputs in `on_tokens`
    must skip each row's `out.pads[row]` leading positions)."""

    def batch_extra(self, extras: list[dict[str, Any]], pads: list[int]) -> dict[str, Any]:
        """The `extra` of a left-padded batch prefill whose rows' prompts carry `extras` (row i
        padded by pads[i] positions). Not overridden (the default), prompts with extra inputs
        prefill one by one and this is never called."""
        raise NotImplementedError

    embeds_last_token: bool = False
    """True when `decode_embeds` is the input embedding of each row's last token (`embed_ids`): a
    fused decode step may then embed the ids itself, and a greedy step be queued ahead
    (hf_ar_lookahead.py)."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    def load_dtype(self) -> torch.dtype:
        """float32 on CPU; else the deploy's dtype (bfloat16 for "auto")."""
        return load_dtype(self.ctx)

    @abc.abstractmethod
    def load(self) -> torch.nn.Module:
        """Load weights from ctx.model_path; raise with the file's name on a bad checkpoint."""

    @abc.abstractmethod
    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        """Initialise seq.data from a request's (first) inputs."""

    def feed(self, seq: ARSeq, inputs: dict[str, Any], last: bool) -> None:
        """Take more upstream input for a streaming request."""
        raise NotImplementedError(f"{type(self).__name__} does not take streamed input")

    def warmup_inputs(self) -> dict[str, Any] | None:
        """One request's inputs the engine may run at start to capture its decode graphs
        (hf_ar_warm.py); None (the default): inputs come from elsewhere, graphs are captured
        as steps first use them."""
        return None

    warm_graphs: bool = False
    """The default of engine_extras["warm_graphs"] for this adapter (hf_ar_warm.py): True for a
    speech LM whose first audio under load is the point, where a bucket first met mid-stream
    (a capture) stalls every stream for tens of milliseconds."""

    def ready(self, seq: ARSeq) -> bool:
        """True when the request has what its next forward needs."""
        return True

    @abc.abstractmethod
    def prefill(self, seq: ARSeq) -> StepInputs:
        """The prompt of a request."""

    @abc.abstractmethod
    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        """[batch, 1, hidden] inputs for one decode step of each seq (after its last token)."""

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """[rows, 1] token ids on the device -> [rows, 1, hidden] (`decode_embeds` from device ids;
        used when `embeds_last_token`)."""
        return self.model.get_input_embeddings()(ids)

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

        positions: [position_axes, batch, length]. mask: [batch, cached + length] (0 marks
        padding) for a prefill or a dynamic-cache decode, or a ready 4D additive mask
        [batch, 1, length, cache length] for a static-cache decode; pass it on as
        `attention_mask` (transformers uses a 4D mask as given). cache: a transformers
        Cache the forward extends. Under CUDA graphs the decode forward is captured once
        per batch shape and replayed: it must not sync with the host or branch on values.
        """

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """A request's effective sampling: deploy defaults < request < pipeline constraints."""
        ctx = self.ctx
        return {**ctx.default_sampling_params, **params, **ctx.sampling_constraints}

    def process_logits(self, seqs: list[ARSeq], logits: torch.Tensor) -> torch.Tensor:
        """Mask tokens these requests may not sample now ([batch, vocab] float32, one row each)."""
        return logits

    @abc.abstractmethod
    def on_tokens(
        self, seqs: list[ARSeq], tokens: list[int], out: ForwardOut, prefill: bool
    ) -> list[tuple[dict[str, Any], bool]]:
        """Record sampled tokens; return (payload, finished) per seq."""

    def on_device_tokens(
        self, seqs: list[ARSeq], ids: torch.Tensor, out: ForwardOut, prefill: bool
    ) -> tuple[list[int], list[tuple[dict[str, Any], bool]]] | None:
        """`on_tokens` for an adapter whose next work is on the device: the sampled ids [batch] before
        any host sync, so that work is queued while the step's forward and sampling still run.
        Returns (the ids as a host list, (payload, finished) per seq), or None (the default): the
        engine brings the ids to the host and calls `on_tokens`."""
        return None

    def draw(
        self, seqs: list[ARSeq], out: ForwardOut, prefill: bool
    ) -> tuple[list[int], list[tuple[dict[str, Any], bool]]] | None:
        """For an adapter that samples its steps itself (every row and whatever it draws per row
        at once, from `out`'s logits): (a token per row as a host list, (payload, finished) per
        seq), in place of the engine's sampling, `process_logits` and `on_tokens`. None (the
        default): the engine samples. Not called for a guided step."""
        return None

    graph_prefill: dict[str, Any] | None = None
    """The prompt `extra` under which `forward` may run over bucketed static buffers and be captured
    as a CUDA graph (hf_ar_prefill.py: it then gets a 4D bool mask and a cache whose `update` keeps
    what it is given; it must make no host sync); {} for an adapter without extras. None: never."""

    draws_ahead: bool = False
    """`draw` comes in three parts, so the engine may queue a step before the host takes the one
    before (hf_ar_lookahead.py): `queue_draw`, `write_next`, `take_draw`."""

    def queue_draw(self, seqs: list[ARSeq], out: ForwardOut, before: Any) -> Any:
        """Queue the step's draw on the device, without a host sync; returns a handle for
        `take_draw`. `before`: the handle of the step before when this step was queued ahead
        (its state then comes from that draw on the device, after `write_next`), else None."""
        raise NotImplementedError

    def write_next(self, slots: Any, rows: Any, drawn: Any) -> None:
        """On the device: the embeddings of the step after `drawn` into `slots.embeds[rows]`, and
        whatever state the next draw reads (the engine moves lengths and positions on)."""
        raise NotImplementedError

    def take_draw(self, seqs: list[ARSeq], drawn: Any) -> tuple[list[int], list[tuple[dict[str, Any], bool]]]:
        """`draw`'s result for a queued draw: wait for it, then the host's share."""
        raise NotImplementedError

    def stop_ids(self, seq: ARSeq) -> set[int]:
        return set()

    def text_tokenizer(self) -> tuple[Any, list[int], int] | None:
        """For a stage that writes text: (its tokenizer, its end-of-text ids, the logits' width), so
        requests may be guided by a JSON schema (hf_ar_grammar.py); None: not offered."""
        return None

    def fused_model(self) -> Any:
        """The `hf_ar_fused.FusedModel` engine_extras.fused_decode runs in place of this
        adapter's decode `forward` (it must compute the same logits); None: no fused step."""
        return None


class TextStream:
    """Incremental detokenisation: the text delta of each new token, holding back split characters.

    A push decodes a short window, not the whole text so far (which made a token's cost grow with
    the answer's length): the ids from `prefix` on, against the same window up to `read` (the ids
    already sent). The window starts a step before the unsent ids, for context: SentencePiece
    drops a word's leading space at the start of a decode, and byte-level pieces may complete a
    character begun before. A token that adds no text yet (half a character, a skipped special
    token) is held until one does; the deltas join to the tokenizer's decode of all the ids.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.decode = _list_decoder(tokenizer)
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, token: int, final: bool = False) -> str:
        self.ids.append(token)
        sent = self.decode(self.ids[self.prefix : self.read], skip_special_tokens=self.skip)
        text = self.decode(self.ids[self.prefix :], skip_special_tokens=self.skip)
        if not final and (len(text) <= len(sent) or text.endswith("\ufffd")):
            return ""  # nothing new yet, or an incomplete UTF-8 sequence: wait for the next token
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(sent) :]


def _list_decoder(tokenizer: Any) -> Any:
    """`tokenizer.decode`, or the `_decode` it calls when that decode is transformers' own: it
    only type-checks and copies the ids into a list first (a Python pass over every id, each
    token of every stream; ours are a list of ints already), so the text is the same."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return tokenizer.decode
    if type(tokenizer).decode is PreTrainedTokenizerBase.decode and hasattr(tokenizer, "_decode"):
        return tokenizer._decode
    return tokenizer.decode


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
