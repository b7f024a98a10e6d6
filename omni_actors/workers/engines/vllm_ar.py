"""The LLM_AR stage engine on vLLM: continuous batching with streamed token deltas.

It wraps vLLM's v1 `LLMEngine`, whose API is already step-driven and so maps
one to one onto `StageEngine`: `add` -> `add_request`, `abort` ->
`abort_request`, `step` -> `step`, `has_work` -> `has_unfinished_requests`.
The worker drives it from one thread; nothing here starts threads or loops.
(`AsyncLLM` would bring its own asyncio loop and output task into the worker,
and `LLM.generate` runs to completion, so neither fits the step contract.)

With the engine core in its own process (vLLM's multiprocess mode, the CUDA
default), `step` collects the outputs the core has produced while the core
already runs the next batch, so our output handling overlaps its compute. On
CPU the core runs in this process; vllm_backend.py says why and holds every
other CPU-vs-CUDA difference.

Every request asks vLLM for `RequestOutputKind.DELTA`, so each step yields
only the new tokens and text of each request:

    {"text": delta, "token_ids": [new ids]}
    last one: finished=True, plus finish_reason, prompt_tokens, completion_tokens
    with params["logprobs"] = k (0-20): "logprobs": [[token text, logprob, [[alternative, logprob] x k]], ...],
        each token once its text has gone out (vLLM holds text back while it may be a stop string); the
        last output trims the tokens past the answer's text (a stop string, the end-of-text token), so
        the texts joined are the answer's text (Logprobs)

Inputs: {"messages": [...], "tools"?: [...]} (the tokenizer's chat template with the generation
prompt; "tools" are shown to it and read back only where the stage names a tool parser: the
last output then carries "tool_calls" [{id, name, arguments}] and "content", see tool_calls.py),
{"prompt": str} or {"prompt_token_ids": [...]}, or {"prompt_embeds": array} where vLLM has prompt
embeds enabled; "multi_modal_data" and "mm_processor_kwargs" pass through to vLLM (arrays copied,
as the inputs may be views of shared memory).

Params beyond sampling (api/structured.py): "structured_outputs" ({"json": schema} or
{"json_object": True}: vLLM's guided decoding) and "tool_calls_forced" (the guided answer is a
forced tool_choice's list of calls: the last output carries them as "tool_calls").

Failures: bad inputs or sampling params (temperature=-1, max_tokens=0 or past the whole context, which vLLM
would cut silently, a reused request id) raise ValueError from `add`, failing that request only. A
request vLLM finishes with reason "error" ends with `EngineOutput.error` set.
An exception from vLLM's own step (a dead engine core) propagates and fails
every request, as the StageEngine contract says.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omni_actors import logs
from omni_actors.workers.engine import (
    TORCH_PRELOAD,
    ContextLengthError,
    EngineContext,
    EngineOutput,
    StageEngine,
)
from omni_actors.workers.engines import vllm_backend
from omni_actors.workers.engines.tool_calls import ShownText, ToolCallReader, forced_calls
from omni_actors.workers.engines.vllm_logprobs import Logprobs

CORE_EXIT_TIMEOUT_S = 10.0

log = logs.get(__name__)

# Request params that map onto vllm.SamplingParams fields of the same name.
# Anything else in a request's params is ignored (other stages' settings ride
# along in the same dict).
SAMPLING_KEYS = frozenset(
    {
        "n",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "min_tokens",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "logprobs",
    }
)


_GRAMMAR_ERROR = re.compile(r"grammar|schema|json", re.I)
_CONTEXT_PARAMETERS = ("input_text", "input_tokens")
"""The `parameter` of vLLM's refusal of a prompt past the context, by its characters or its tokens."""
_CONTEXT_WORDS = re.compile(r"longer than the maximum model length")
"""vLLM's input processor's refusal of the same, which names no parameter."""
"""A refusal of vLLM's structured-output backends (a schema they cannot compile)."""


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as text-only chat templates read them: a content list of text parts only (OpenAI's SDK
    and the Responses API send those) becomes one string, the parts joined by newlines. A list with
    other parts stays for templates that render them."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            msg = {**msg, "content": "\n".join(str(p.get("text", "")) for p in content)}
        out.append(msg)
    return out


def _media_kinds(messages: list[dict[str, Any]]) -> list[str]:
    """The non-text part types left in `messages` (after template_messages), in order of first use."""
    kinds = [str(p.get("type")) for m in messages if isinstance(m.get("content"), list)
             for p in m["content"] if isinstance(p, dict)]
    return list(dict.fromkeys(k for k in kinds if k != "text"))


@dataclass
class _Run:
    """What the engine remembers about one live request."""

    prompt_tokens: int | None = None
    completion_tokens: int = 0
    tools: list[dict[str, Any]] | None = None
    """The request's tools, when this stage reads tool calls (then `text` collects the answer)."""
    forced: bool = False
    """A forced `tool_choice` guided the decoding: the answer is read as calls (tool_calls.forced_calls)."""
    text: list[str] = field(default_factory=list)
    shown: ShownText | None = None
    """With `tools`: what of the answer may be shown as it streams (the "shown" of each output)."""
    logprobs: Logprobs | None = None
    """With params["logprobs"]: the sampled tokens' log-probabilities not yet sent."""


def _copy_arrays(value: Any) -> Any:
    """Copy arrays (possibly views of shared memory freed after `add`) out of nested inputs."""
    import torch

    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _copy_arrays(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy_arrays(v) for v in value)
    return value


class _EnvPatch:
    """Sets environment variables and restores the previous values on `restore`."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def apply(self, env: dict[str, str]) -> None:
        for key in env:
            self._saved.setdefault(key, os.environ.get(key))
        os.environ.update(env)

    def restore(self) -> None:
        for key, old in self._saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        self._saved = {}


class VllmAREngine(StageEngine):
    """Autoregressive generation on vLLM's v1 LLMEngine; see the module docstring."""

    ZYGOTE_PRELOAD = TORCH_PRELOAD

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self._runs: dict[str, _Run] = {}
        self._engine: Any = None
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._env = _EnvPatch()
        self._private_dir = Path(tempfile.mkdtemp(prefix="omni-vllm-"))
        self._tool_reader: ToolCallReader | None = None
        self._multimodal = False
        vllm_backend.quiet_notices()
        try:
            (self._private_dir / "rpc").mkdir()
            self._env.apply(vllm_backend.backend_env(ctx, self._private_dir))
            before = {p.pid for p in multiprocessing.active_children()}
            started = time.perf_counter()
            self._engine = self._start_engine()
            # The engine-core processes vLLM started (none in-process), so that
            # close can make sure they are gone and reaped.
            self._procs = [p for p in multiprocessing.active_children() if p.pid not in before]
            self._tokenizer = self._engine.get_tokenizer()
            self._multimodal = bool(self._engine.model_config.is_multimodal_model)
            self._tool_reader = ToolCallReader(ctx.tool_parser, self._tokenizer) if ctx.tool_parser else None
        except BaseException:
            self.close()
            raise
        log.info(
            "vllm_engine.started",
            stage=ctx.stage_id,
            device=ctx.device,
            multiprocess=vllm_backend.use_multiprocess(ctx),
            processes=len(self._procs),
            start_s=round(time.perf_counter() - started, 2),
        )

    def _start_engine(self) -> Any:
        import vllm.envs
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        # An in-process engine core freezes vllm.envs; a later engine in the
        # same process must see its own private folders.
        vllm.envs.disable_envs_cache()
        args = EngineArgs(**vllm_backend.engine_kwargs(self.ctx))
        return LLMEngine.from_engine_args(
            args, enable_multiprocessing=vllm_backend.use_multiprocess(self.ctx)
        )

    # -- requests ---------------------------------------------------------------

    def add(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        streaming: bool = False,
    ) -> None:
        if streaming:
            raise ValueError("the vLLM AR engine takes its whole prompt in add, not streamed input")
        if request_id in self._runs:
            raise ValueError(f"request {request_id!r} is already running")
        sampling = self._sampling_params(self.merged_sampling(params))
        context = self._engine.model_config.max_model_len
        if (asked := params.get("max_tokens")) is not None and int(asked) > context:  # (vLLM would cut it short)
            raise ValueError(f"max_tokens: {asked} is more than this model's whole context holds ({context} tokens, "
                             f"the prompt's included); ask for at most {context}")
        prompt, tokenization_kwargs = self._prompt(inputs)
        from vllm.exceptions import VLLMClientError

        try:
            self._engine.add_request(request_id, self._render(prompt, tokenization_kwargs), sampling)
        except VLLMClientError as exc:
            if getattr(exc, "parameter", None) in _CONTEXT_PARAMETERS or _CONTEXT_WORDS.search(str(exc)):
                raise ContextLengthError(str(exc)) from exc
            if sampling.structured_outputs is not None and _GRAMMAR_ERROR.search(str(exc)):
                raise ValueError(f"response_format: the decoder cannot follow this JSON schema: {exc}") from exc
            raise ValueError(str(exc)) from exc
        tools = inputs.get("tools") if self._tool_reader is not None else None
        forced = bool(params.get("tool_calls_forced"))
        shown = self._tool_reader.shown(list(tools)) if tools and not forced and self._tool_reader else None
        top = sampling.logprobs
        self._runs[request_id] = _Run(tools=list(tools) if tools else None, forced=forced, shown=shown,
                                      logprobs=None if top is None else Logprobs(top))

    def _render(self, prompt: dict[str, Any], tokenization_kwargs: dict[str, Any] | None) -> Any:
        """The prompt as the engine takes it: tokenized (and its media processed) by the engine's own
        renderer, as LLMEngine.add_request would do with a raw prompt, which vLLM 0.32 warns is
        deprecated (a warning in the worker's log on the first request)."""
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        renderer = self._engine.renderer
        params = renderer.default_cmpl_tok_params.with_kwargs(**(tokenization_kwargs or {}))
        (engine_input,) = renderer.render_cmpl([parse_model_prompt(self._engine.model_config, prompt)], params)
        return engine_input

    def abort(self, request_id: str) -> None:
        if self._runs.pop(request_id, None) is not None:
            self._engine.abort_request([request_id])

    def has_work(self) -> bool:
        return bool(self._runs) and self._engine.has_unfinished_requests()

    def step(self) -> list[EngineOutput]:
        outputs = []
        for ro in self._engine.step():
            run = self._runs.get(ro.request_id)
            if run is None:  # aborted while its output was in flight
                continue
            if run.prompt_tokens is None and ro.prompt_token_ids is not None:
                run.prompt_tokens = len(ro.prompt_token_ids)
            completion = ro.outputs[0]
            token_ids = list(completion.token_ids)
            run.completion_tokens += len(token_ids)
            payload: dict[str, Any] = {"text": completion.text, "token_ids": token_ids}
            if run.tools is not None or run.forced:
                run.text.append(completion.text)
            if run.shown is not None:
                shown, parts = run.shown.feed(completion.text, token_ids)
                if shown:
                    payload["shown"] = shown
                if parts:
                    payload["tool_parts"] = parts
            if run.logprobs is not None:
                run.logprobs.add(completion.text, token_ids, completion.logprobs)
                payload["logprobs"] = run.logprobs.release(ro.finished)
            error = None
            if ro.finished:
                del self._runs[ro.request_id]
                reason = completion.finish_reason
                payload.update(
                    finish_reason=reason,
                    prompt_tokens=run.prompt_tokens or 0,
                    completion_tokens=run.completion_tokens,
                )
                if reason == "error":
                    error = "vLLM reported an internal error for this request"
                elif run.forced:
                    if (forced := forced_calls("".join(run.text), cut=reason == "length")) is not None:
                        payload.update(tool_calls=forced or None, content=None)
                elif run.tools is not None and self._tool_reader is not None:
                    content, calls = self._tool_reader.read("".join(run.text), run.tools)
                    if calls:
                        payload.update(tool_calls=calls, content=content)
            outputs.append(EngineOutput(ro.request_id, payload, ro.finished, error))
        return outputs

    def close(self) -> None:
        engine, self._engine = self._engine, None
        procs, self._procs = self._procs, []
        self._runs.clear()
        try:
            if engine is not None:
                engine.engine_core.shutdown()
                del engine
                gc.collect()
                log.info("vllm_engine.closed", stage=self.ctx.stage_id)
        finally:
            # vLLM signals its engine-core process and, after a grace period,
            # kills it without waiting; join so none is left running or unreaped.
            for proc in procs:
                proc.join(CORE_EXIT_TIMEOUT_S)
                if proc.is_alive():
                    proc.kill()
                    proc.join(CORE_EXIT_TIMEOUT_S)
            self._env.restore()
            shutil.rmtree(self._private_dir, ignore_errors=True)

    # -- conversions ------------------------------------------------------------

    def _sampling_params(self, merged: dict[str, Any]) -> Any:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind

        kwargs = {k: v for k, v in merged.items() if k in SAMPLING_KEYS}
        if kwargs.get("top_p") == 0:  # OpenAI's top_p 0 (vLLM wants it in (0, 1]): only the likeliest token
            kwargs.update(top_p=1.0, top_k=1)
        if bias := kwargs.get("logit_bias"):  # (JSON's string keys, as the API passes them on: vLLM wants ids)
            kwargs["logit_bias"] = {int(token): float(value) for token, value in bias.items()}
        if kwargs.get("n", 1) != 1:
            raise ValueError("n must be 1: one stage request streams one sequence")
        if structured := merged.get("structured_outputs"):  # chat response_format (api/structured.py)
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(**structured)
        try:
            return SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
        except (TypeError, ValueError, VLLMClientError) as exc:
            raise ValueError(f"invalid sampling params: {exc}") from exc

    def _prompt(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """A vLLM prompt dict from a stage payload, and the tokenization kwargs it needs."""
        tokenization_kwargs = None
        if "prompt_embeds" in inputs:
            embeds = _copy_arrays(inputs["prompt_embeds"])
            if isinstance(embeds, np.ndarray):
                import torch

                embeds = torch.from_numpy(embeds)
            prompt: dict[str, Any] = {"prompt_embeds": embeds}
        elif "prompt_token_ids" in inputs:
            ids = inputs["prompt_token_ids"]
            prompt = {"prompt_token_ids": [int(t) for t in np.asarray(ids).reshape(-1)]}
        elif "messages" in inputs:
            # A stage that reads tool calls shows the request's tools to the model, as its template asks.
            tools = list(inputs["tools"]) if inputs.get("tools") and self._tool_reader is not None else None
            messages = template_messages(inputs["messages"])
            if not self._multimodal and (media := _media_kinds(messages)):
                raise ValueError(f"messages: this model reads text only; the request has {' and '.join(media)} "
                                 "parts (send text, or use a model that takes them)")
            try:
                text = self._tokenizer.apply_chat_template(
                    messages, tools=tools, tokenize=False, add_generation_prompt=True
                )
            except Exception as exc:  # the model's own Jinja template refusing these messages: the request's fault
                raise ValueError(f"messages: this model's chat template cannot render them "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from exc
            prompt = {"prompt": text}
            # The template already wrote any BOS it wants.
            tokenization_kwargs = {"add_special_tokens": False}
        elif "prompt" in inputs:
            prompt = {"prompt": str(inputs["prompt"])}
        else:
            raise ValueError(
                "inputs need one of: messages, prompt, prompt_token_ids, prompt_embeds"
            )
        for key in ("multi_modal_data", "mm_processor_kwargs"):
            if key in inputs:
                prompt[key] = _copy_arrays(inputs[key])
        return prompt, tokenization_kwargs
