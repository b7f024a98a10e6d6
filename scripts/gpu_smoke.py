"""Serve tiny speech and recognition checkpoints on a GPU through `omni-run` and call each with the openai SDK.

A smoke run, not a benchmark: for each family, `make-tiny` writes its folder, a real
`omni-run --deploy` serves it with every stage on device 0 (the engines' CUDA defaults:
static KV slots, CUDA graphs), and the SDK makes the family's call: `audio.speech.create`
for a TTS family (a WAV with samples must come back), `audio.transcriptions.create` for a
recogniser (a JSON text must come back). Random weights: the words mean nothing, the shapes,
devices and graph paths are what is exercised.

    python scripts/gpu_smoke.py [--families qwen3_tts,qwen3_asr,voxtral_realtime] [--device 0]

Prints one JSON line: per family ok, seconds to ready, seconds for the call, and the error if any.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TTS = ("qwen3_tts", "csm", "dia", "vibevoice", "higgs_audio_v2")
ASR = ("qwen3_asr", "voxtral_realtime")
READY_TIMEOUT_S = 240.0
CALL_TIMEOUT_S = 120.0


def _wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(folder: Path, device: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    """`omni-run` on the folder, every stage on `device`; returns once it logs server.ready."""
    from omni_actors.config.pipeline import get_pipeline
    from omni_actors.models.detect import detect_pipeline

    name = detect_pipeline(folder)
    placed = {"devices": device} if device != "cpu" else {}
    stages = [{"stage_id": s, **placed} for s in get_pipeline(name).stage_ids]
    deploy = tmp / "deploy.json"  # YAML is a superset of JSON
    deploy.write_text(json.dumps({"pipeline": name, "model": str(folder), "stages": stages}))
    env = {**os.environ, "OMNI_DATA_DIR": str(tmp / "data")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(deploy), "--port", str(_free_port()),
         "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT_S
    assert proc.stdout is not None
    for line in proc.stdout:  # blocks on the pipe until the server logs
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "server.ready":
            return proc, event["url"]
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"omni-run did not become ready (exit {proc.wait()})")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _call(family: str, url: str) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=CALL_TIMEOUT_S, max_retries=0)
    model = client.models.list().data[0].id
    if family in TTS:
        audio = client.audio.speech.create(model=model, voice="alloy", input="Hello there, how are you?",
                                           response_format="wav").content
        with wave.open(io.BytesIO(audio)) as w:  # a streamed WAV declares the largest length: count the bytes
            rate, width = w.getframerate(), w.getsampwidth() * w.getnchannels()
            frames = len(w.readframes(w.getnframes())) // width
        if frames == 0:
            raise RuntimeError("an empty WAV")
        return {"audio_s": round(frames / rate, 3)}
    text = client.audio.transcriptions.create(model=model, file=("tone.wav", _wav(), "audio/wav")).text
    if not isinstance(text, str):
        raise RuntimeError(f"no text: {text!r}")
    return {"chars": len(text)}


def run(family: str, device: str) -> dict[str, Any]:
    from omni_actors.models.tiny import make_tiny

    row: dict[str, Any] = {"ok": False}
    with tempfile.TemporaryDirectory(prefix=f"gpu-smoke-{family}-") as tmp_s:
        tmp = Path(tmp_s)
        try:
            folder = make_tiny(family, tmp / family)
            t0 = time.perf_counter()
            proc, url = _start(folder, device, tmp)
        except Exception as exc:  # reported per family
            return {**row, "error": f"{type(exc).__name__}: {exc}"}
        row["ready_s"] = round(time.perf_counter() - t0, 2)
        try:
            for attempt in ("first", "second"):  # the second replays captured graphs
                t1 = time.perf_counter()
                row[attempt] = {**_call(family, url), "s": round(time.perf_counter() - t1, 3)}
            row["ok"] = True
        except Exception as exc:  # reported per family
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            _stop(proc)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(TTS + ASR))
    ap.add_argument("--device", default="0", help="the `devices` of every stage (cpu: none, for a dry run)")
    args = ap.parse_args()
    results = {f: run(f, args.device) for f in args.families.split(",") if f}
    print(json.dumps({"bench": "gpu_smoke", "device": args.device, "results": results,
                      "all_ok": all(r["ok"] for r in results.values())}))


if __name__ == "__main__":
    main()
