"""/v1/videos jobs under a tiny `server.stream_buffer_mb`: the slow-reader bound does not abort a healthy job.

The server runs the tiny Wan2.2 folder under a deploy file whose `server.stream_buffer_mb` is below one
chunk. A job's stream took at most that (a chunk into an empty stream is always taken): two of its outputs
waiting unread together aborted it, which a 100-step job's per-step progress reached within its first steps
(the worker sends a report a step, faster than the event loop hands each on), and so did its frames arriving
behind an unread report. Now a job's stream holds what it declared it makes (video_jobs.output_bytes) on top
of the server's bound: each job completes.
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
from tests.api.test_video_derive import by_id
from tests.api.test_videos import JOB_WAIT_S, wait_done
from tests.shutdown_support import StderrLines, runtime_dirs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated

TINY_BUFFER_MB = 0.0001
"""About 100 bytes: less than one queued chunk's own overhead, so a second unread output overflowed it."""
STEPS = 60
"""Denoising steps a job: each such job overflowed the tiny bound before the fix (about 1 s each)."""


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


def test_jobs_past_the_stream_bound_complete_rather_than_abort(wan):
    """Each was a 500 `RequestAborted` ("its client left more than 104 bytes of output unread"), `retrieve`
    saying `failed`: the job's own reader (the job runner) was taken for a slow client."""
    for size, frames in (("16x16", 1), ("32x32", 5)):  # (frames of 768 B and 15 KB: past the bound by far)
        resp = requests.post(f"{wan.url}/v1/videos/sync", timeout=JOB_WAIT_S, json={
            "model": wan.model, "prompt": "no overflow", "size": size, "num_frames": frames,
            "num_inference_steps": STEPS})
        assert resp.status_code == 200, resp.text
        assert resp.headers["Content-Type"] == "video/mp4" and resp.content[4:8] == b"ftyp"
    client = wan.client()
    job = client.videos.create(model=wan.model, prompt="a job", size="32x32", seconds="0.25",
                               extra_body={"num_inference_steps": STEPS})
    done = wait_done(client, job.id)
    assert (done.status, done.progress) == ("completed", 100), done.error
    edit = client.videos.edit(prompt="its edit", **by_id(job.id, num_inference_steps=STEPS, strength=1.0))
    done = wait_done(client, edit.id)
    assert (done.status, done.progress) == ("completed", 100), done.error
    assert not any("request.stream_overflow" in line for line in wan.lines)
