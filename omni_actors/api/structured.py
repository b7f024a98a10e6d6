"""Guided decoding for chat: JSON answers (`response_format`) and forced tool calls (`tool_choice`, realtime's too).

"text" (or none) is a plain answer. "json_object" (any JSON object) and "json_schema" (an object
that `json_schema.schema` describes) need the final text stage to constrain its decoding
(`StageSpec.guided_decoding`: vLLM's structured outputs). That stage gets params
["structured_outputs"] = {"json_object": True} or {"json": schema} and can write nothing else, so
the answer parses, as the SDK's `chat.completions.parse` expects. Elsewhere the request is a 400
naming `response_format.type`; a schema the decoder cannot compile is a 400 naming
`response_format` (the stage's refusal).

`tool_choice` "required" or {"type": "function", "function": {"name"}} on a stage that both calls
tools (a tool parser) and guides decoding: the answer is constrained to a JSON list of
{"name", "parameters"} objects (one for a named function or `parallel_tool_calls: false`), each
`parameters` in that tool's schema; the stage (params["tool_calls_forced"]) answers it as
`tool_calls` (workers/engines/tool_calls.py `forced_calls`). Realtime sessions force calls the
same way (api/realtime/function_calls.py `forced_call` turns their flat {"type": "function", "name"}
into this shape and answers the calls as `function_call` items). Elsewhere api/tools.py refuses them.
"""

from __future__ import annotations

from typing import Any

from omni_actors.api.chat_schemas import ResponseFormat
from omni_actors.api.errors import bad_request
from omni_actors.config.pipeline import PipelineConfig


def guided(pipeline: PipelineConfig) -> bool:
    """The stage writing the pipeline's text answer constrains its decoding."""
    return any(s.final_output and s.final_output_type == "text" and s.guided_decoding for s in pipeline.stages)


def structured_outputs(pipeline: PipelineConfig, fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """The `structured_outputs` param for the text stage (None: a plain answer); 400 where it cannot be served."""
    if fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise bad_request("response_format.json_schema goes with type 'json_schema'", "response_format.json_schema")
        return None
    if not guided(pipeline):
        raise bad_request(f"model {pipeline.name!r} cannot constrain its answers to JSON (its text stage has no "
                          "guided decoding); response_format.type must be 'text'", "response_format.type",
                          "unsupported_value")
    if fmt.type == "json_object":
        if fmt.json_schema is not None:
            raise bad_request("response_format.json_schema goes with type 'json_schema', not 'json_object'",
                              "response_format.json_schema")
        return {"json_object": True}
    if fmt.json_schema is None:
        raise bad_request("response_format type 'json_schema' needs `json_schema` ({name, schema})",
                          "response_format.json_schema", "missing_required_parameter")
    return {"json": fmt.json_schema.schema or {"type": "object"}}


def guided_params(pipeline: PipelineConfig, fmt: ResponseFormat | None, tools: list[Any] | None, tool_choice: Any,
                  parallel: bool | None) -> dict[str, Any]:
    """The params that guide the text stage for a request (none: {}): its JSON `fmt` or the call its
    `tool_choice` forces, and "one_tool_call" for `parallel_tool_calls: false` (the API keeps the first
    call read); 400s as structured_outputs / forced_tool_calls give, and for asking both."""
    structured = structured_outputs(pipeline, fmt)
    forced = forced_tool_calls(tools, tool_choice, parallel)
    if forced is not None and structured is not None:
        raise bad_request("a JSON response_format and a tool_choice that forces a call cannot both shape the "
                          "answer; send one of them", "response_format")
    # `parallel_tool_calls: false` with calls the parser reads: the answer keeps the first (api/chat.py Tally).
    one = {"one_tool_call": True} if parallel is False and tools and tool_choice != "none" else {}
    if forced is None and structured is None:
        return one
    return {"structured_outputs": forced or structured, "tool_calls_forced": forced is not None, **one}


def forced_tool_calls(tools: list[Any] | None, tool_choice: Any, parallel: bool | None) -> dict[str, Any] | None:
    """The `structured_outputs` that force a call (None: `tool_choice` demands none); 400 for a choice
    no offered tool meets. Only for pipelines api/tools.py lets force calls."""
    if not isinstance(tool_choice, dict) and tool_choice != "required":
        return None
    offered = {t.function.name: t.function.parameters for t in tools or ()}
    if not offered:
        raise bad_request("a `tool_choice` that demands a call needs `tools` to call", "tool_choice")
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                              '{"type": "function", "function": {"name": ...}}', "tool_choice")
        if name not in offered:
            raise bad_request(f"tool_choice names {name!r}, which is not among `tools` ({sorted(offered)})",
                              "tool_choice.function.name")
        offered, most = {name: offered[name]}, 1
    else:
        most = 1 if parallel is False else None
    items = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"type": "string", "enum": [name]}, "parameters": call_schema(schema)}}
             for name, schema in offered.items()]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if most is not None:
        schema["maxItems"] = most
    return {"json": schema}


NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
"""A function declared without `parameters` (or with `{}`) takes none, as OpenAI reads it: its forced
call's arguments are `{}` (an open object would let a weak model write until max_tokens)."""
DECODER_OPTIONS = {"whitespace_flexible": False}
"""As the stages compile schemas (vLLM's "guidance" backend without free whitespace, hf_ar_grammar.py)."""


def call_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The schema a forced call's arguments are decoded in."""
    return parameters or NO_PARAMETERS


def decoder_refusal(schema: dict[str, Any]) -> str | None:
    """Why the stages' decoder (llguidance, which vLLM's "guidance" backend and the transformers engine
    both run) cannot follow `schema`; None when it can, or when llguidance is not installed here (the
    stage then refuses it itself)."""
    try:
        import llguidance
    except ImportError:
        return None
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=DECODER_OPTIONS)
    except (ValueError, TypeError) as err:
        return str(err)
    return llguidance.LLMatcher.validate_grammar(grammar) or None
