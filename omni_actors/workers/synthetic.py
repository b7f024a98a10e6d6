"""Synthetic stage engines: deterministic stand-ins for models, for runtime tests and benchmarks.

Behaviour is set by the deploy's `engine_extras` (and a few request params):

    kind            "text" | "audio" | "codes" | "image" | "transcript"   what each chunk carries
                    (a transcript's words say how many samples at what rate the input audio had)
    chunks          outputs per request (entry and full-payload stages)
    step_delay_ms   simulated compute per step (one step serves every active request)
    load_ms         simulated weight loading at start (start-up phase "weights", reported in Ready)
    payload_bytes   an extra uint8 array "blob" of this size in every chunk
    samples         audio samples per chunk; sample_rate (omni_actors.audio.DEFAULT_SAMPLE_RATE)
    fail_on_chunk   fail each request when it reaches this chunk (-1: never)
    max_chunks      the most outputs a request may ask for (100000), like a model's context:
                    more is refused at add (ValueError), as vLLM refuses max_tokens past it
    max_prompt_chars  a longer prompt is refused at add as past the context (ContextLengthError:
                    OpenAI's context_length_exceeded), as a model's context refuses it (0: none)

Request params: `chunks` / `max_tokens` override `chunks`; `fail: true` fails at
add; images take `n`, `width`, `height`, `seed`, `num_inference_steps`.
A streaming (async-chunk) request yields one output per fed chunk.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.audio import DEFAULT_SAMPLE_RATE
from omni_actors.workers.engine import (
    ContextLengthError,
    EngineContext,
    EngineOutput,
    StageEngine,
    timed,
)


def source_text(inputs: dict[str, Any]) -> str:
    """The text a request carries, whatever shape its input has."""
    for key in ("text", "prompt", "input"):
        if isinstance(inputs.get(key), str):
            return inputs[key]
    messages = inputs.get("messages")
    if isinstance(messages, list) and messages:
        content = messages[-1].get("content", "") if isinstance(messages[-1], dict) else ""
        if isinstance(content, list):
            return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content)
    return ""


@dataclass
class _Req:
    text: str
    params: dict[str, Any]
    units: deque[str] = field(default_factory=deque)
    input_done: bool = True
    produced: int = 0
    total: int = 0


class SyntheticEngine(StageEngine):
    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        x = ctx.engine_extras
        self.kind = str(x.get("kind", "text"))
        self.chunks = int(x.get("chunks", 4))
        self.step_delay_s = float(x.get("step_delay_ms", 0)) / 1000.0
        self.payload_bytes = int(x.get("payload_bytes", 0))
        self.samples = int(x.get("samples", 2400))
        self.sample_rate = int(x.get("sample_rate", DEFAULT_SAMPLE_RATE))
        self.fail_on_chunk = int(x.get("fail_on_chunk", -1))
        self.max_chunks = int(x.get("max_chunks", 100_000))
        self.max_prompt_chars = int(x.get("max_prompt_chars", 0))
        if x.get("fail_start"):
            raise RuntimeError("synthetic engine configured to fail at start")
        with timed(ctx, "weights"):
            time.sleep(float(x.get("load_ms", 0)) / 1000.0)
        self.reqs: dict[str, _Req] = {}
        self.steps = 0
        self._blob = np.arange(self.payload_bytes, dtype=np.uint64).astype(np.uint8)

    def add(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any], streaming: bool = False) -> None:
        if params.get("fail"):
            raise ValueError("synthetic failure requested by the request")
        params = self.merged_sampling(params)
        text = source_text(inputs)
        if self.kind == "transcript":
            text = f"{np.size(inputs.get('audio', ()))} samples at {inputs.get('sample_rate')} Hz"
        if 0 < self.max_prompt_chars < len(text):
            raise ContextLengthError(f"the prompt has {len(text)} characters; this stage's context holds "
                                     f"{self.max_prompt_chars}")
        req = _Req(text=text, params=params)
        if streaming:
            req.input_done = False
        else:
            n = int(params.get("num_inference_steps") or params.get("chunks") or params.get("max_tokens") or self.chunks)
            if self.kind != "image":
                n = min(n, int(params.get("max_tokens") or n))
            if n > self.max_chunks:
                raise ValueError(f"this stage produces at most {self.max_chunks} outputs a request; {n} asked")
            if self.kind == "image":
                n += 1  # a progress chunk a step (the last: "decode"), then the images
            req.units.extend([req.text] * n)
            req.total = n
        self.reqs[request_id] = req

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        req = self.reqs.get(request_id)
        if req is None:
            return
        if inputs:
            req.units.append(source_text(inputs) or str(len(req.units)))
            req.total += 1
        req.input_done = last

    def abort(self, request_id: str) -> None:
        self.reqs.pop(request_id, None)

    def has_work(self) -> bool:
        return any(r.units or r.input_done for r in self.reqs.values())

    def first_output_next(self) -> bool:
        return any(r.produced == 0 and r.units for r in self.reqs.values())

    def step(self) -> list[EngineOutput]:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        self.steps += 1
        outs: list[EngineOutput] = []
        for rid, req in list(self.reqs.items()):
            if not req.units and not req.input_done:
                continue
            if not req.units:  # input ended with nothing left to produce
                outs.append(EngineOutput(rid, {}, finished=True))
                del self.reqs[rid]
                continue
            text = req.units.popleft()
            if req.produced == self.fail_on_chunk:
                outs.append(EngineOutput(rid, {}, True, f"synthetic failure at chunk {req.produced}"))
                del self.reqs[rid]
                continue
            payload = self._chunk(req, text)
            req.produced += 1
            finished = not req.units and req.input_done
            outs.append(EngineOutput(rid, payload, finished))
            if finished:
                del self.reqs[rid]
        return outs

    def _chunk(self, req: _Req, text: str) -> dict[str, Any]:
        i = req.produced
        out: dict[str, Any]
        if self.kind == "transcript":
            out = {"text": text if i == 0 else ""}
        elif self.kind == "text":
            words = text.split() or ["ok"]
            out = {"text": ("" if i == 0 else " ") + words[i % len(words)]}
        elif self.kind == "codes":
            seed = zlib.crc32(f"{text}:{i}".encode())
            out = {"codes": np.random.default_rng(seed).integers(0, 1024, 8, dtype=np.int32), "text": text}
        elif self.kind == "audio":
            freq = 200 + zlib.crc32(text.encode()) % 400
            t = (np.arange(self.samples) + i * self.samples) / self.sample_rate
            audio = (0.1 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
            out = {"audio": audio, "sample_rate": self.sample_rate, "transcript": text}
        elif self.kind == "image":
            out = self._image_chunk(req, i)
        else:
            raise ValueError(f"unknown synthetic kind {self.kind!r}")
        if self.payload_bytes:
            out["blob"] = self._blob
        return out

    def _image_chunk(self, req: _Req, i: int) -> dict[str, Any]:
        p = req.params
        steps = req.total - 1  # as the diffusion engine reports: steps 1..N-1 "denoise", N "decode"
        if i < steps:
            return {"progress": (i + 1) / steps, "step": i + 1, "total": steps,
                    "phase": "decode" if i + 1 == steps else "denoise"}
        n, w, h = int(p.get("n", 1)), int(p.get("width", 32)), int(p.get("height", 32))
        rng = np.random.default_rng((int(p.get("seed", 0)) + zlib.crc32(req.text.encode())) % 2**64)
        return {"images": rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8), "progress": 1.0}
