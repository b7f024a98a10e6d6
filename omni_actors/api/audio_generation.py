"""POST /v1/audio/generations (alias /v1/audio/generate): text to a sound clip (Stable Audio Open and kin).

    {"model", "prompt", "seconds", "seed", "response_format": "wav" | "flac" | "mp3" | "pcm",
     "num_inference_steps", "guidance_scale", "negative_prompt"}  ->  the audio file

What goes into the pipeline: inputs {"prompt", "negative_prompt"}, params {seconds,
seed, num_inference_steps, guidance_scale} (those given). The stage answers
{"audio": float32 [C, S], "sample_rate"}; the file keeps its channels (pcm: 16-bit
little-endian, interleaved). A model that makes no audio, or speech from text rather than
sound from a prompt, is a 400 saying what it makes.
"""

from __future__ import annotations

import io

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api.audio_codec import CONTENT_TYPES, off_loop, pcm16
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    route_model,
)
from omni_actors.api.diffusion_caps import require_task, served_caps
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.schemas import read_body
from omni_actors.api.video_request import capabilities

ROUTES = ("/v1/audio/generations", "/v1/audio/generate")
FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "pcm": None}
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
MAX_SECONDS = 600.0


class AudioGenerationRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prompt: str
    model: str | None = None
    seconds: float | None = None
    seed: int | None = None
    response_format: str = "wav"
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_post(route, generations)


def encode(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    """float [C, S] -> a file of `fmt` (channels kept)."""
    import soundfile as sf

    frames = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1, audio.shape[-1]).T, -1.0, 1.0)
    if FORMATS[fmt] is None:
        return pcm16(frames.reshape(-1))
    major, sub = FORMATS[fmt]
    buf = io.BytesIO()
    sf.write(buf, frames, rate, format=major, subtype=sub)
    return buf.getvalue()


async def generations(request: web.Request) -> web.Response:
    req = await read_body(request, AudioGenerationRequest)
    orch, model = route_model(request, req.model, {"audio"})
    caps = served_caps(orch)
    if caps is None:  # speech from text (a TTS or an assistant pipeline), not a sound from a prompt
        raise bad_request(f"model {model!r} makes speech from text, not sound from a prompt; use "
                          "/v1/audio/speech", "model", "unsupported_task")
    require_task(orch, caps, {"text-to-audio"}, ROUTES[0])
    if req.response_format not in FORMATS:
        raise bad_request(f"response_format {req.response_format!r} is not supported; expected one of "
                          f"{sorted(FORMATS)}", "response_format", "unsupported_value")
    if not req.prompt:
        raise bad_request("prompt must not be empty", "prompt")
    top = float(capabilities(orch).get("max_seconds", MAX_SECONDS))
    if req.seconds is not None and not 0.1 <= req.seconds <= top:
        raise bad_request(f"seconds {req.seconds:g}: this model makes clips of 0.1 to {top:g} s", "seconds")
    if req.seed is not None and not 0 <= req.seed < (1 << 63):
        raise bad_request("seed must be in [0, 2**63)", "seed")
    params = drop_none({"seconds": req.seconds, "seed": req.seed, "num_inference_steps": req.num_inference_steps,
                        "guidance_scale": req.guidance_scale})
    inputs = drop_none({"prompt": req.prompt, "negative_prompt": req.negative_prompt})
    audio, rate = None, 0
    async with PipelineCall(request, ROUTES[0], inputs, params, {"audio"}) as call:
        async for chunk in call:
            if "audio" in chunk.data:
                audio, rate = np.asarray(chunk.data["audio"]), int(chunk.data.get("sample_rate") or 0)
    if audio is None or rate <= 0:
        raise ApiError(500, "the pipeline ended without audio", None, "no_audio")
    if req.response_format == "mp3" and rate not in MP3_RATES:
        raise bad_request(f"response_format mp3 cannot carry {rate} Hz audio; use wav or flac",
                          "response_format", "unsupported_value")
    body = await off_loop(encode, audio, rate, req.response_format)
    kind = CONTENT_TYPES.get(req.response_format, "application/octet-stream")
    return web.Response(body=body, headers={"Content-Type": kind, "X-Sample-Rate": str(rate)})
