"""`omni-run` on a Ray cluster it started itself (`address: local`) still shuts down in order on SIGTERM.

ray.init installs its own SIGTERM handler (it aborts the process); the Ray backend puts omni-run's back.
With JSON logs, every line on omni-run's stderr is JSON: Ray's own warnings and what the workers on
the cluster write (forwarded by Ray, which would prefix each with `(WorkerActor pid=...)`) included.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import free_port

pytest.importorskip("ray")

READY_TIMEOUT_S = 120.0
"""Ray's own start (a local cluster) plus three workers."""
EXIT_TIMEOUT_S = 60.0


async def test_sigterm_stops_omni_run_in_order_after_ray_started_in_process(tmp_path: Path) -> None:
    port = free_port()
    deploy = {
        "pipeline": "synthetic",
        "cluster": {"backend": "ray", "address": "local"},
        "server": {"host": "127.0.0.1", "port": port},
        "stages": [{"stage_id": s, "resources": {"CPU": 0.5}} for s in range(3)],
    }
    deploy["stages"][0]["env"] = {"PYTHONVERBOSE": "1"}  # plain text on the worker's stderr: every import
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(deploy))
    env = {k: v for k, v in os.environ.items() if k != "RAY_TMPDIR"}  # Ray's files: in omni-run's own folder
    env["OMNI_LOG_JSON"] = "1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omni_actors.cli", "--deploy", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    sessions = f"/tmp/omni-ray-{proc.pid}-*"
    seen: list[str] = []
    try:

        async def until(text: str) -> None:
            while True:
                line = (await proc.stderr.readline()).decode(errors="replace")
                if not line:
                    raise AssertionError(f"omni-run ended before {text!r}:\n{''.join(seen)}")
                seen.append(line)
                if text in line:
                    return

        await asyncio.wait_for(until("server.ready"), READY_TIMEOUT_S)
        assert len(glob.glob(sessions)) == 1  # Ray's session files, in omni-run's folder
        proc.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(proc.communicate(), EXIT_TIMEOUT_S)
        seen.append((rest or b"").decode(errors="replace"))
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        left = glob.glob(sessions)
        for folder in left:
            shutil.rmtree(folder, ignore_errors=True)
    out = "".join(seen)
    assert proc.returncode == 0, out
    assert "server.stopped" in out, out
    assert left == [], "Ray's session folder was left behind"
    events = [json.loads(line) for line in out.splitlines() if line.strip()]  # never a plain line
    imports = [e for e in events if e["event"] == "worker.stderr" and e.get("actor") == "WorkerActor"]
    assert any(e["line"].startswith("import ") for e in imports), [e["event"] for e in events][:50]
