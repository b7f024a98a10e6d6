"""/v1/videos jobs the server itself ends: an abort that is not a client's delete reads as `failed` with its
reason, through `retrieve` and `/v1/videos/sync` alike, never as a deleted job's 404.

The server runs the tiny Wan2.2 folder under a deploy file whose `server.stream_buffer_mb` is below one
chunk: the orchestrator aborts a request as soon as two of its outputs wait unread together, which a
1000-step job's per-step progress reaches within its first steps (the worker sends a report a step,
faster than the event loop hands each on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

pytest.importorskip("diffusers")
pytest.importorskip("av")

from omni_actors.models.tiny import make_tiny
from tests.api.model_server import ModelRun
from tests.api.test_videos import JOB_WAIT_S, LONG
from tests.shutdown_support import StderrLines, runtime_dirs

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # the SDK marks its video API deprecated
    pytest.mark.slow,  # a server of its own (~40 s on 2 cores), and the overflow depends on the loop falling behind
]

TINY_BUFFER_MB = 0.0001
"""About 100 bytes: less than one queued chunk's own overhead, so a second unread output overflows it."""


class DeployRun(ModelRun):
    """ModelRun's `omni-run --model DIR`, with a deploy file for the server's own limits."""

    def __init__(self, tmp: Path, model: Path, data_dir: Path, server: dict) -> None:
        from tests.conftest import free_port

        self.port = free_port()
        self.runtime_parent = tmp / "runtime"
        self.runtime_before = runtime_dirs(self.runtime_parent)
        deploy = tmp / "deploy.yaml"
        deploy.write_text(json.dumps({"pipeline": "wan2_2", "server": {"served_model_name": model.name, **server}}))
        args = [sys.executable, "-m", "omni_actors.cli", "--deploy", str(deploy), "--model", str(model),
                "--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "OMNI_LOG_JSON": "0", "OMNI_RUNTIME_DIR": str(self.runtime_parent),
               "OMNI_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"}
        StderrLines.__init__(self, subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.PIPE, text=True, env=env))
        self.pid = self.proc.pid
        self.seen_workers = set()
        self.model = model.name
        self.data = data_dir


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wan-probe3")
    run = DeployRun(tmp, make_tiny("wan2_2", tmp / "tiny-wan", seed=0), tmp / "data",
                    {"stream_buffer_mb": TINY_BUFFER_MB})
    try:
        run.wait_ready()
        yield run
    finally:
        run.stop()


def test_a_job_the_server_aborts_is_failed_with_its_reason_not_deleted(wan):
    """It was a 404 `video_deleted` from /v1/videos/sync, and `retrieve` said `cancelled`, for a job nobody
    deleted: every abort but a shutdown's read as the client's own delete."""
    resp = requests.post(f"{wan.url}/v1/videos/sync", timeout=JOB_WAIT_S, json={
        "model": wan.model, "prompt": "overflow", "size": "16x16", "num_frames": 1, **LONG})
    job_id = resp.headers["X-Video-Id"]
    error = resp.json()["error"]
    assert (resp.status_code, error["code"]) == (500, "RequestAborted"), resp.text
    assert "stream_buffer_mb" in error["message"], error
    video = wan.client().videos.retrieve(job_id)  # the job is still there, failed with the same reason
    assert video.status == "failed" and video.error is not None
    assert (video.error.code, video.error.message) == ("RequestAborted", error["message"].removeprefix(
        "video generation failed: "))
    assert wan.client().videos.delete(job_id).deleted
    assert not list((wan.data / "state" / "files" / "videos").glob(f"{job_id}*"))
