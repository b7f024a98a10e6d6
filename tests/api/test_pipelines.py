"""One server, several pipelines: a real `omni-run --model A --model B --model C --model DIR` routes each
request by its `model` on every route, lists every model, and reports health, status and metrics per pipeline."""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest
import requests

from tests.conftest import free_port
from tests.shutdown_support import OmniRun, runtime_dirs

MODELS = ("synthetic", "synthetic_image", "synthetic_asr", "tiny-sd")
"""Speech and text, images, transcripts: three weightless pipelines by name; and a tiny random-weight
Stable Diffusion folder (`make-tiny diffusion`), detected from its model_index.json. Each its own orchestrator."""
SDK_TIMEOUT_S = 30.0
RESTART_TIMEOUT_S = 30.0
"""Longest wait for a killed worker's replacement to be Ready (test side; the supervisor restarts it at once)."""


class MultiRun(OmniRun):
    """`omni-run` with the given arguments (OmniRun's stderr reader and leak checks)."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.port = free_port()
        self.runtime_parent = tmp / "runtime"
        self.runtime_before = runtime_dirs(self.runtime_parent)
        env = {**os.environ, "OMNI_LOG_JSON": "0", "OMNI_RUNTIME_DIR": str(self.runtime_parent),
               "OMNI_DATA_DIR": str(tmp / "data")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "omni_actors.cli", *args, "--host", "127.0.0.1", "--port", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.pid = self.proc.pid
        self.lines = []
        self._eof = False
        self._queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.seen_workers = set()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=SDK_TIMEOUT_S, max_retries=0)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        assert self.wait() == 0, self.output
        self.assert_clean(workers_timeout_s=15.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiRun]:
    from omni_actors.models.tiny import make_tiny

    tmp = tmp_path_factory.mktemp("multi")
    folder = make_tiny("diffusion", tmp / "tiny-sd")
    args = [a for m in MODELS for a in ("--model", str(folder) if m == "tiny-sd" else m)]
    r = MultiRun(tmp, *args)
    try:
        r.wait_ready()
        yield r
    finally:
        if r.proc.poll() is None:
            r.stop()
        else:
            r.kill()


def _wav(seconds: float = 0.25, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.sin(np.arange(int(seconds * rate)) / 9) * 8000).astype(np.int16).tobytes())
    return buf.getvalue()


def test_models_lists_every_pipeline_with_what_it_makes(run: MultiRun) -> None:
    models = {m.id: m for m in run.client().models.list().data}
    assert set(MODELS) <= set(models)
    assert set(models["synthetic"].model_extra["output_types"]) == {"text", "audio"}
    assert models["synthetic_image"].model_extra["output_types"] == ["image"]
    assert models["synthetic_asr"].model_extra["output_types"] == ["transcript"]
    tiny = models["tiny-sd"].model_extra
    assert tiny["pipeline"] == "diffusion" and tiny["output_types"] == ["image"]
    assert "text-to-image" in tiny["capabilities"]["tasks"]
    assert run.client().models.retrieve("synthetic_asr").model_extra["pipeline"] == "synthetic_asr"
    assert "features" not in run.client().models.retrieve("synthetic").model_extra  # no optional features


def test_each_rest_route_reaches_its_model(run: MultiRun) -> None:
    c = run.client()
    chat = c.chat.completions.create(model="synthetic", messages=[{"role": "user", "content": "hi"}])
    assert chat.model == "synthetic" and chat.choices[0].message.content
    speech = c.audio.speech.create(model="synthetic", input="hello", voice="alloy", response_format="wav")
    assert speech.content[:4] == b"RIFF" and len(speech.content) > 44
    image = c.images.generate(model="synthetic_image", prompt="a cube", size="64x48", response_format="b64_json")
    assert base64.b64decode(image.data[0].b64_json)[:8] == b"\x89PNG\r\n\x1a\n"
    png = base64.b64decode(image.data[0].b64_json)
    sd = c.images.generate(model="tiny-sd", prompt="a cube", size="32x32", response_format="b64_json",
                           extra_body={"num_inference_steps": 1, "seed": 1})
    assert base64.b64decode(sd.data[0].b64_json)[:4] == b"\x89PNG"
    edit = c.images.edit(model="synthetic_image", image=("in.png", png), prompt="x", response_format="b64_json")
    assert base64.b64decode(edit.data[0].b64_json)[:4] == b"\x89PNG"
    text = c.audio.transcriptions.create(model="synthetic_asr", file=("a.wav", _wav()))
    assert "samples at" in text.text


def test_a_request_without_model_goes_to_the_first_that_makes_its_output(run: MultiRun) -> None:
    image = requests.post(f"{run.url}/v1/images/generations", json={"prompt": "a cube", "size": "64x48"},
                          timeout=SDK_TIMEOUT_S)
    assert image.status_code == 200, image.text
    gen = requests.post(f"{run.url}/v1/audio/generations", json={"prompt": "rain"}, timeout=SDK_TIMEOUT_S)
    assert gen.status_code == 400 and gen.json()["error"]["code"] == "unsupported_task"  # the first audio
    assert "'synthetic'" in gen.json()["error"]["message"]  # model makes speech, not sounds from a prompt
    video = requests.post(f"{run.url}/v1/videos", json={"prompt": "waves"}, timeout=SDK_TIMEOUT_S)
    assert video.status_code == 400 and video.json()["error"]["code"] == "unsupported_modality"
    assert "synthetic_image" in video.json()["error"]["message"]


def test_a_model_that_cannot_make_the_output_or_is_unknown_is_refused(run: MultiRun) -> None:
    c = run.client()
    with pytest.raises(openai.BadRequestError) as wrong:
        c.images.generate(model="synthetic_asr", prompt="a cube")
    assert wrong.value.code == "unsupported_modality"
    with pytest.raises(openai.NotFoundError) as unknown:
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.code == "model_not_found"
    assert all(m in unknown.value.message for m in MODELS)
    with pytest.raises(openai.NotFoundError):
        c.audio.transcriptions.create(model="nope", file=("a.wav", _wav()))
    # a speech pipeline makes audio, but from text: a sound from a prompt is asked of another route
    with pytest.raises(openai.BadRequestError) as speech:
        c.post("/audio/generations", body={"model": "synthetic", "prompt": "rain"}, cast_to=object)
    assert (speech.value.code, speech.value.param) == ("unsupported_task", "model")
    assert "/v1/audio/speech" in speech.value.message
    with pytest.raises(openai.BadRequestError) as image:
        c.post("/audio/generations", body={"model": "tiny-sd", "prompt": "rain"}, cast_to=object)
    assert image.value.code == "unsupported_modality", image.value.message


async def test_realtime_and_speech_stream_sockets_route_by_model(run: MultiRun) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{run.url}/v1/realtime?model=synthetic") as ws:
            created = json.loads((await ws.receive(timeout=SDK_TIMEOUT_S)).data)
            assert created["type"] == "session.created" and created["session"]["model"] == "synthetic"
        async with http.get(f"{run.url}/v1/realtime?model=nope", headers={"Upgrade": "websocket"}) as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"
        async with http.ws_connect(f"{run.url}/v1/audio/speech/stream?model=synthetic") as ws:
            created = json.loads((await ws.receive(timeout=SDK_TIMEOUT_S)).data)
            assert created["session"]["model"] == "synthetic"
            await ws.send_str(json.dumps({"type": "session.update", "session": {"model": "synthetic_image"}}))
            refused = json.loads((await ws.receive(timeout=SDK_TIMEOUT_S)).data)
            assert refused["type"] == "error" and refused["error"]["code"] == "unsupported_modality"
            await ws.send_str(json.dumps({"type": "input_text.append", "text": "hello there."}))
            await ws.send_str(json.dumps({"type": "input_text.done"}))
            kinds = []
            while not kinds or kinds[-1] != "speech.audio.done":
                kinds.append(json.loads((await ws.receive(timeout=SDK_TIMEOUT_S)).data)["type"])
            assert "speech.audio.delta" in kinds
        async with http.get(f"{run.url}/v1/audio/speech/stream?model=synthetic_asr",
                            headers={"Upgrade": "websocket"}) as resp:
            assert resp.status == 400


def test_health_status_and_metrics_are_per_pipeline(run: MultiRun) -> None:
    assert requests.get(f"{run.url}/health", timeout=SDK_TIMEOUT_S).json() == {"status": "ok"}
    status = requests.get(f"{run.url}/v1/status", timeout=SDK_TIMEOUT_S).json()
    assert [p["models"] for p in status["pipelines"]] == [[m] for m in MODELS[:3]] + [["tiny-sd", "diffusion"]]
    assert [len(p["stages"]) for p in status["pipelines"]] == [3, 1, 1, 1]
    assert status["pipeline"] == "synthetic" and all(p["healthy"] for p in status["pipelines"])
    assert {p["gpu_sharing"] for p in status["pipelines"]} == {"none"}  # (no GPU here: nothing to share)
    text = requests.get(f"{run.url}/metrics", timeout=SDK_TIMEOUT_S).text
    for model in MODELS:
        assert re.search(rf'^omni_stage_healthy{{model_stage="\w+",pipeline="{model}",stage_id="0"}} 1.0$', text, re.M)
    assert 'omni_orchestrator_requests_in_flight{pipeline="synthetic_image"}' in text
    pids = {r["pid"] for p in status["pipelines"] for s in p["stages"] for r in s["replicas"]}
    assert len(pids) == 6  # every stage of every pipeline is its own worker process


def test_a_dead_worker_is_restarted_in_its_own_pipeline(run: MultiRun) -> None:
    status = requests.get(f"{run.url}/v1/status", timeout=SDK_TIMEOUT_S).json()
    asr = status["pipelines"][MODELS.index("synthetic_asr")]
    os.kill(asr["stages"][0]["replicas"][0]["pid"], signal.SIGKILL)
    chat = run.client().chat.completions.create(model="synthetic", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content  # the other pipelines serve on

    run.wait_for(r"worker\.restarted .*stage_id=0", RESTART_TIMEOUT_S)  # (its Ready came: the line is logged after)
    now = requests.get(f"{run.url}/v1/status", timeout=SDK_TIMEOUT_S).json()
    assert now["pipelines"][MODELS.index("synthetic_asr")]["healthy"], now
    assert [p["worker_restarts"] for p in now["pipelines"]] == [0, 0, 1, 0]
    text = requests.get(f"{run.url}/metrics", timeout=SDK_TIMEOUT_S).text
    assert 'omni_worker_restarts_total{model_stage="asr",pipeline="synthetic_asr",stage_id="0"} 1.0' in text
    assert "samples at" in run.client().audio.transcriptions.create(model="synthetic_asr", file=("a.wav", _wav())).text
    run.note_workers()


DEPLOY = """
server: {host: 127.0.0.1}
async_chunk: false
pipelines:
  - pipeline: synthetic_text
    served_model_name: writer
    stages: [{stage_id: 0, max_num_seqs: 2}]
  - pipeline: synthetic_text
    served_model_name: scribe
"""


def test_a_deploy_file_lists_two_pipelines(tmp_path: Path) -> None:
    deploy = tmp_path / "two.yaml"
    deploy.write_text(DEPLOY)
    r = MultiRun(tmp_path, "--deploy", str(deploy))
    try:
        r.wait_ready()
        r.wait_for(r"Ctrl-C stops it")  # the start-up summary: each pipeline, then the URLs once
        summary = r.output[r.output.index("server.ready"):]
        assert "serving 'writer'" in summary and "serving 'scribe'" in summary, summary
        assert summary.count(f"playground http://127.0.0.1:{r.port}/") == 1, summary
        ready = [line for line in r.output.splitlines() if "stage.ready" in line]  # (whose stage: served names)
        assert sorted(re.search(r"pipeline=(\w+)", line).group(1) for line in ready) == ["scribe", "writer"], ready
        c = r.client()
        assert {m.id for m in c.models.list().data} == {"writer", "scribe", "synthetic_text"}
        for name in ("writer", "scribe"):
            out = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
            assert out.model == name and out.choices[0].message.content
        status = requests.get(f"{r.url}/v1/status", timeout=SDK_TIMEOUT_S).json()
        # (the pipeline's own name belongs to the first that has it)
        assert [p["models"] for p in status["pipelines"]] == [["writer", "synthetic_text"], ["scribe"]]
        assert [p["stages"][0]["queue_limit"] for p in status["pipelines"]] == [16, 64]
        assert [p["requests_total"] for p in status["pipelines"]] == [1, 1]
        r.stop()
    finally:
        r.kill()


async def test_the_playground_offers_each_models_panels_from_one_page(run: MultiRun, tmp_path: Path) -> None:
    from tests.browser_support import browser_page

    async with browser_page(run.url + "/") as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        options = await page.locator("#model option").all_inner_texts()
        assert set(MODELS) <= set(options)
        await page.get_by_test_id("model-select").select_option("synthetic_image")
        assert await page.locator("#tabs button").all_inner_texts() == ["Images", "Pipeline"]
        await page.get_by_test_id("image-prompt").fill("a red cube")
        await page.get_by_test_id("image-button").click()
        await page.locator("[data-testid=image-result] img").first.wait_for()
        await page.get_by_test_id("tab-pipeline").click()
        await page.locator("[data-testid=stage-0]").wait_for()
        assert await page.locator("#pipeline-graph .stage").count() == 1  # the chosen model's pipeline
        await page.screenshot(path=str(tmp_path / "images-pipeline.png"))
        await page.get_by_test_id("model-select").select_option("synthetic")
        assert await page.locator("#tabs button").all_inner_texts() == ["Talk", "Chat", "Speak", "Pipeline"]
        await page.get_by_test_id("tab-pipeline").click()
        await page.locator("[data-testid=stage-2]").wait_for()
        assert await page.locator("#pipeline-graph .stage").count() == 3
        assert bp.errors == [] and bp.refused == []
