"""The `llm` pipeline: one autoregressive text stage on vLLM, for any local HF causal LM.

Topology only (imports without torch). The model folder is the deploy's `model`.
"""

from __future__ import annotations

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline


@register_pipeline("llm")
def llm() -> PipelineConfig:
    return PipelineConfig(
        detect=("transformers:llama", "transformers:qwen2", "transformers:qwen3", "transformers:mistral"),
        name="llm",
        description="A text LLM served on vLLM (streamed text out)",
        stages=(
            StageSpec(
                stage_id=0, model_stage="llm", execution_type=ExecutionType.LLM_AR,
                engine="omni_actors.workers.engines.vllm_ar:VllmAREngine",
                final_output=True, final_output_type="text",
                # Hermes-style calls (<tool_call>{json}</tool_call>): Qwen2.5/Qwen3 and the tiny test model's
                # template. A model writing another format answers its calls as plain text.
                tool_parser="hermes",
            ),
        ),
    )  # fmt: skip
