"""Chat `response_format`: JSON answers by guided decoding, where the stage writing the answer can.

"text" (or none) is a plain answer. "json_object" (any JSON object) and "json_schema" (an object
that `json_schema.schema` describes) need the final text stage to constrain its decoding
(`StageSpec.guided_decoding`: vLLM's structured outputs). That stage gets params
["structured_outputs"] = {"json_object": True} or {"json": schema} and can write nothing else, so
the answer parses, as the SDK's `chat.completions.parse` expects. Elsewhere the request is a 400
naming `response_format.type`; a schema the decoder cannot compile is a 400 naming
`response_format` (the stage's refusal).
"""

from __future__ import annotations

from typing import Any

from omni_actors.api.chat_schemas import ResponseFormat
from omni_actors.api.errors import bad_request
from omni_actors.config.pipeline import PipelineConfig


def structured_outputs(pipeline: PipelineConfig, fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """The `structured_outputs` param for the text stage (None: a plain answer); 400 where it cannot be served."""
    if fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise bad_request("response_format.json_schema goes with type 'json_schema'", "response_format.json_schema")
        return None
    if not any(s.final_output and s.final_output_type == "text" and s.guided_decoding for s in pipeline.stages):
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
