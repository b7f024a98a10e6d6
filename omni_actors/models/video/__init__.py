"""Video and audio generation pipelines: one VIDEO-engine stage per diffusers family, found by its class.

Each family is a one-stage DIFFUSION pipeline run by `workers/engines/video.py`,
detected by its exact `model_index.json` `_class_name` (so the generic image
`diffusion` pipeline does not take it). What a family can make is declared here,
in `engine_defaults` the API reads too (so a bad request is a 400 before a job is
queued) and the engine checks again:

    fps, size_multiple, frame_multiple, max_frames, max_seconds, max_batch   see the engine's docstring
    image_input     "none" | "optional" | "required": a first frame (`input_reference`)
    video_input     true: the pipeline edits a video (/v1/videos/edits; workers/engines/video_edit.py)
    default_size    "WxH" used when a request gives no size
    image_batches   how requests with first frames share a call (wan_i2v.py); else each runs alone

Topology only: this module imports without torch or diffusers.
"""

from __future__ import annotations

from typing import Any

from omni_actors.config.pipeline import ExecutionType, PipelineConfig, StageSpec, register_pipeline

ENGINE = "omni_actors.workers.engines.video:VideoEngine"


def _one_stage(name: str, classes: tuple[str, ...], output: str, description: str,
               defaults: dict[str, Any]) -> PipelineConfig:
    return PipelineConfig(
        name=name,
        detect=tuple(f"diffusers:{c}" for c in classes),
        description=description,
        stages=(
            StageSpec(
                stage_id=0,
                model_stage="diffusion",
                execution_type=ExecutionType.DIFFUSION,
                engine=ENGINE,
                final_output=True,
                final_output_type=output,
                engine_defaults=defaults,
            ),
        ),
    )


# Wan2.2: 8x spatial VAE and 2x2 patches -> sides in multiples of 16; 4x temporal VAE -> 4k+1 frames.
_WAN = {"fps": 16, "size_multiple": 16, "frame_multiple": 4, "max_frames": 257, "default_size": "832x480"}


@register_pipeline("wan2_2")
def wan2_2() -> PipelineConfig:
    return _one_stage("wan2_2", ("WanPipeline",), "video",
                      "Wan2.2 text-to-video (WanPipeline)", {**_WAN, "image_input": "none", "video_input": True})


@register_pipeline("wan2_2_i2v")
def wan2_2_i2v() -> PipelineConfig:
    return _one_stage("wan2_2_i2v", ("WanImageToVideoPipeline",), "video",
                      "Wan2.2 image-to-video (WanImageToVideoPipeline): a first frame and a prompt",
                      {**_WAN, "image_input": "required", "video_input": True,
                       "image_batches": "omni_actors.models.video.wan_i2v:batch_first_frames"})


@register_pipeline("stable_audio")
def stable_audio() -> PipelineConfig:
    return _one_stage("stable_audio", ("StableAudioPipeline",), "audio",
                      "Stable Audio Open text-to-audio (StableAudioPipeline)",
                      {"max_seconds": 47.0, "image_input": "none"})


@register_pipeline("ltx2")
def ltx2() -> PipelineConfig:
    # 32x spatial / 8x temporal VAE; the video carries the audio track the pipeline makes with it.
    return _one_stage("ltx2", ("LTX2Pipeline",), "video", "LTX-2 text-to-video with audio (LTX2Pipeline)",
                      {"fps": 24, "size_multiple": 32, "frame_multiple": 8, "max_frames": 257,
                       "default_size": "768x512", "image_input": "none", "video_input": True})


@register_pipeline("hunyuan_video_1_5")
def hunyuan_video_1_5() -> PipelineConfig:
    # 16x spatial / 4x temporal VAE, 1x1 patches; 480p at 24 fps by default. Its diffusers
    # pipeline fails on batches of several prompts (0.42), so each request runs alone.
    return _one_stage("hunyuan_video_1_5", ("HunyuanVideo15Pipeline",), "video",
                      "HunyuanVideo-1.5 text-to-video (HunyuanVideo15Pipeline)",
                      {"fps": 24, "size_multiple": 16, "frame_multiple": 4, "max_frames": 241,
                       "default_size": "848x480", "image_input": "none", "max_batch": 1})
