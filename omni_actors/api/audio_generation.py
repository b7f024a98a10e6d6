"""POST /v1/audio/generations (alias /v1/audio/generate): text to a sound clip (Stable Audio Open and kin).

    {"model", "prompt", "seconds", "seed", "response_format": "wav" | "flac" | "mp3" | "pcm",
     "num_inference_steps", "guidance_scale", "negative_prompt"}  ->  the audio file

What goes into the pipeline: inputs {"prompt", "negative_prompt"}, params {seconds,
seed, num_inference_steps, guidance_scale} (those given). The stage answers
{"audio": float32 [C, S], "sample_rate"}; the file (audio_codec.encode_file) keeps its
channels (pcm: 16-bit little-endian, interleaved) and the model's rate, except an mp3 of a
rate mp3 cannot carry, which is resampled to the nearest one it can; X-Sample-Rate says
the file's rate and X-Channels its channels (raw pcm says neither itself; before 2026-12-05 a stereo pcm
answer carried no channel count). A model that makes no audio, or speech from text rather than sound from a
prompt, is a 400 saying what it makes.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Annotated

import msgspec
from aiohttp import web
from msgspec import Meta

from omni_actors.api.audio_codec import (
    CONTENT_TYPES,
    check_supported,
    encode_file,
    off_loop,
    output_rate,
)
from omni_actors.api.calls import (
    PipelineCall,
    drop_none,
    route_model,
)
from omni_actors.api.diffusion_caps import require_task, served_caps, stage_facts
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.schemas import read_body
from omni_actors.orchestrator.outputs import AudioOutput

ROUTES = ("/v1/audio/generations", "/v1/audio/generate")
FORMATS = ("wav", "flac", "mp3", "pcm")
"""The response formats offered here (audio_codec encodes them)."""
MAX_SECONDS = 600.0


@functools.cache
def window_s(folder: str) -> float:
    """The longest clip a Stable Audio folder's latent window holds (transformer sample_size x VAE hop / rate,
    read from its configs as the engine reads them from the loaded pipeline); inf if the folder does not say."""
    try:
        size = json.loads((Path(folder) / "transformer" / "config.json").read_text()).get("sample_size")
        vae = json.loads((Path(folder) / "vae" / "config.json").read_text())
        ratios, rate = vae.get("downsampling_ratios"), vae.get("sampling_rate")
    except (OSError, ValueError, AttributeError):
        return math.inf  # the worker reports an unreadable folder at start; its own check still holds
    if not (isinstance(size, int) and isinstance(rate, int) and isinstance(ratios, list) and ratios
            and all(isinstance(r, int) for r in ratios)) or min(size, rate, *ratios) <= 0:
        return math.inf
    return size * math.prod(ratios) / rate


MAX_STEPS = 1000
"""Most denoising steps a request may ask (as the image routes'); a family's stage may allow fewer."""


class AudioGenerationRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prompt: str
    model: str | None = None
    seconds: float | None = None
    seed: int | None = None
    response_format: str = "wav"
    num_inference_steps: Annotated[int, Meta(ge=1, le=MAX_STEPS)] | None = None
    """Bounded here, as on the image routes: before 2026-12-05 a count past 2**64 reached the bus and came back
    as its "can't serialize ints" 400 naming no field."""
    guidance_scale: Annotated[float, Meta(ge=0.0)] | None = None
    negative_prompt: str | None = None


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_post(route, generations)


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
    check_supported(req.response_format)  # (this server's libsndfile) before the generation, not after
    if not req.prompt.strip():
        raise bad_request("prompt must not be empty", "prompt")
    top = float(stage_facts(orch).get("max_seconds", MAX_SECONDS))  # the family's cap, and this folder's window
    top = min(top, window_s(str(Path(orch.deploy.model).expanduser()))) if orch.deploy.model else top
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
            out = chunk.output
            if isinstance(out, AudioOutput) and len(out.audio):
                audio, rate = (out.audio if out.channels is None else out.channels), out.sample_rate
    if audio is None or rate <= 0:
        raise ApiError(500, "the pipeline ended without audio", None, "no_audio")
    body = await off_loop(encode_file, audio, rate, req.response_format)
    kind = CONTENT_TYPES.get(req.response_format, "application/octet-stream")
    channels = audio.shape[0] if audio.ndim > 1 else 1  # (raw pcm carries no header saying it)
    return web.Response(body=body, headers={"Content-Type": kind, "X-Channels": str(channels),
                                            "X-Sample-Rate": str(output_rate(req.response_format, rate))})
