"""Function calling: which pipelines can call tools, and refusing `tools` where the model cannot.

A pipeline can call tools when the stage that writes its text answer names a tool
parser (`StageSpec.tool_parser`, e.g. vLLM's "hermes"). Until tool calls are
served, and for every pipeline whose text stage names none, a request that asks
for tools is refused with a 400 naming the field; it is never silently ignored.

What "asks for tools" means: a non-empty `tools` list, or a `tool_choice` that
demands a call ("required" or a named function). `tool_choice` "none" or "auto"
without tools can lead to no call, so they are accepted (realtime sessions send
"auto" by default).
"""

from __future__ import annotations

from typing import Any

from omni_actors.config.pipeline import PipelineConfig

PASSIVE_TOOL_CHOICES = ("none", "auto")
"""`tool_choice` values that never demand a call on their own."""


def tool_parser(pipeline: PipelineConfig) -> str | None:
    """The tool parser of the stage writing the pipeline's text answer; None: it cannot call tools."""
    for spec in pipeline.stages:
        if spec.final_output and spec.final_output_type == "text" and spec.tool_parser:
            return spec.tool_parser
    return None


def tools_refusal(pipeline: PipelineConfig, tools: Any, tool_choice: Any,
                  prefix: str = "") -> tuple[str, str] | None:
    """(message, param) when the request asks for tools this pipeline cannot call, else None.

    `tools`/`tool_choice` are the client's values (None or msgspec UNSET when absent);
    `prefix` is put before the field name in `param` (realtime: "session.").
    """
    asks_tools = isinstance(tools, list | tuple) and len(tools) > 0
    demands_call = isinstance(tool_choice, dict) or (
        isinstance(tool_choice, str) and tool_choice not in PASSIVE_TOOL_CHOICES)
    if not (asks_tools or demands_call):
        return None
    field = "tools" if asks_tools else "tool_choice"
    # No pipeline serves tool calls yet: one that names a parser is refused the same way, said plainly.
    parser = tool_parser(pipeline)
    reason = (f"tool calls with parser {parser!r} are not served yet" if parser else
              "its text stage has no tool parser")
    return (f"model {pipeline.name!r} cannot call tools ({reason}); send the request without `{field}`",
            prefix + field)
