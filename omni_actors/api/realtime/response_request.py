"""What a Realtime response asks of the pipeline: its options (session defaults filled in) and the request.

    opts = Options.build(session_cfg, response_in, context_items)
    turn = build_request(pipeline, opts, items)   # inputs, params, wanted outputs, the audio's user item
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime.audio import FORMATS
from omni_actors.api.realtime.conversation import Item
from omni_actors.api.realtime.function_calls import add_function_item, forced_call, shown_tools
from omni_actors.api.realtime.session import SessionConfig, parse_format
from omni_actors.api.realtime.vad import VAD_RATE
from omni_actors.config.pipeline import PipelineConfig


@dataclass
class Options:
    """A response.create's settings, defaults filled from the session."""

    modalities: tuple[str, ...]
    instructions: str
    voice: str
    output_audio_format: str
    temperature: float
    max_output_tokens: int | None
    speed: float = 1.0
    in_conversation: bool = True
    metadata: dict[str, Any] | None = None
    context: list[Item] | None = None
    """Out-of-band input items (response.input); None: the conversation."""
    tools: tuple[ce.FunctionTool, ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    forced: dict[str, Any] | None = None
    """The `structured_outputs` forcing the call `tool_choice` demands (function_calls.py); None: none."""

    @classmethod
    def build(cls, cfg: SessionConfig, r: ce.ResponseIn | None, context: list[Item] | None) -> Options:
        r = r or ce.ResponseIn()
        tokens = r.max_output_tokens if r.max_output_tokens is not None else r.max_response_output_tokens
        for key in ("modalities", "output_modalities"):  # (as session.update refuses them: session.py)
            if getattr(r, key) == []:
                raise ce.BadEvent(f"{key} must name at least one of 'text', 'audio'", param=f"response.{key}")
        if r.conversation not in (None, "auto", "none"):
            raise ce.BadEvent("conversation must be 'auto' or 'none'", param="response.conversation")
        if r.output_audio_format not in (None, *FORMATS):
            raise ce.BadEvent(f"unsupported audio format {r.output_audio_format!r}; expected one of {list(FORMATS)}",
                              param="response.output_audio_format")
        out = r.audio.output if r.audio is not None else None  # GA: audio.output.{format, voice}
        fmt = r.output_audio_format
        if out is not None and out.format is not None:
            fmt = parse_format(out.format, "response.audio.output.format")
        voice = r.voice or (out.voice if out is not None else None)
        tools = cfg.tools if r.tools is None else tuple(r.tools)
        tool_choice = cfg.tool_choice if r.tool_choice is None else r.tool_choice
        return cls(
            modalities=tuple(r.output_modalities or r.modalities or cfg.modalities),
            instructions=cfg.instructions if r.instructions is None else r.instructions,
            voice=voice or cfg.voice,
            output_audio_format=fmt or cfg.output_audio_format,
            speed=cfg.speed,
            temperature=cfg.temperature if r.temperature is None else r.temperature,
            max_output_tokens=cfg.max_output_tokens if tokens is None else (None if tokens == "inf" else tokens),
            in_conversation=r.conversation != "none",
            metadata=r.metadata,
            context=context,
            tools=tools,
            tool_choice=tool_choice,
            forced=forced_call(tools, tool_choice, "response."),
        )


@dataclass(frozen=True)
class Turn:
    """What a response asks of the pipeline (through the REST routes' PipelineCall)."""

    inputs: dict[str, Any]
    params: dict[str, Any]
    wanted: frozenset[str]
    """Output types the response needs: the stages run are the pipeline's for these."""
    audio_item: Item | None
    """The user item whose audio is `inputs["audio"]` (its transcript is stored on it)."""


def build_request(pipe: PipelineConfig, opts: Options, items: list[Item]) -> Turn:
    """The pipeline request for a response, and the user item whose audio is `inputs["audio"]`.

    The project's chat-input convention (api/chat_inputs.py): `messages` in
    order, system instructions first; an item with text (or a transcript) is
    text; user audio nobody transcribed yet is a part `{"type": "input_audio",
    "array": key, "sample_rate": 16000}` whose samples are the top-level
    `inputs[key]`: "audio" for the last user message, "audio_1", ... for earlier ones.
    Function items are written as chat writes them (function_calls.py), and the
    response's tools, unless its `tool_choice` is "none", are `inputs["tools"]`; a
    `tool_choice` that demands a call guides the stage's decoding to one (`opts.forced`).
    """
    messages: list[dict[str, Any]] = []
    if opts.instructions:
        messages.append({"role": "system", "content": opts.instructions})
    inputs: dict[str, Any] = {}
    last_user = next((it for it in reversed(items) if it.role == "user"), None)
    audio_item = last_user if last_user is not None and last_user.pending_audio() is not None else None
    earlier = 0
    for item in items:
        if item.type != "message":
            add_function_item(messages, item)
        elif item.pending_audio() is None:
            if item.text():
                messages.append({"role": item.role, "content": item.text()})
        else:
            parts: list[dict[str, Any]] = []
            for part in item.content:
                if part.type == "input_audio" and part.audio is not None and not part.transcript:
                    if item is audio_item and "audio" not in inputs:
                        key = "audio"
                        inputs["sample_rate"] = VAD_RATE
                    else:
                        earlier += 1
                        key = f"audio_{earlier}"
                    inputs[key] = part.audio
                    parts.append({"type": "input_audio", "array": key, "sample_rate": VAD_RATE})
                elif part.text or part.transcript:
                    parts.append({"type": "text", "text": part.text or part.transcript})
            messages.append({"role": item.role, "content": parts})
    inputs["messages"] = messages
    if (tools := shown_tools(opts.tools, opts.tool_choice)) is not None:
        inputs["tools"] = tools
    params: dict[str, Any] = {"temperature": opts.temperature, "voice": opts.voice, "modalities": list(opts.modalities)}
    if opts.max_output_tokens is not None:
        params["max_tokens"] = opts.max_output_tokens
    if opts.forced is not None:
        params["structured_outputs"] = opts.forced
        params["tool_calls_forced"] = True
    outputs = pipe.output_types()
    if ("audio" not in opts.modalities or "audio" not in outputs) and "text" in outputs:
        wanted = frozenset({"text"})
    else:
        wanted = frozenset(set(opts.modalities) & outputs or outputs)
    return Turn(inputs, params, wanted, audio_item)
