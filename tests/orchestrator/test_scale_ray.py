"""Scaling out on Ray with a real `omni-run`: several pipelines on one two-node cluster, and addresses that
take connections but are not Ray, each refused at start with one line and exit code 2, never a hang.

The two-node `ray.cluster_utils.Cluster` (one CPU per node) lives under a private RAY_TMPDIR that is removed
at the end; no Ray process may outlive the module.
"""

from __future__ import annotations

import glob
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.conftest import free_port

pytest.importorskip("ray")
from ray.cluster_utils import Cluster

from tests.orchestrator.ray_support import local_cluster, processes_under

REFUSED_S = 30.0
"""A wrong address or an over-full cluster is refused within this (Ray's own retries run for minutes)."""
LOCAL_REFUSED_S = 120.0
"""Ray's own start (`address: local`) on a loaded 2-core box, then the refusal."""
READY_TIMEOUT_S = 120.0
"""Two pipelines' replicas placed and Ready on a loaded 2-core box."""
SDK_TIMEOUT_S = 30.0
RELEASE_S = 30.0
"""Bound for Ray to free the ended actors' CPUs."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with local_cluster({"num_cpus": 1}, [{"num_cpus": 1}]) as c:
        yield c


def _omni_run(tmp: Path, deploy: dict[str, Any], **env_extra: str | None) -> subprocess.Popen:
    """omni-run on `deploy`, with `env_extra` in its environment (None: left out)."""
    path = tmp / "deploy.yaml"
    path.write_text(yaml.safe_dump(deploy))
    env = {**os.environ, "OMNI_LOG_JSON": "0", "OMNI_DATA_DIR": str(tmp / "data"), **env_extra}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.Popen([sys.executable, "-m", "omni_actors.cli", "--deploy", str(path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)


def _refused(tmp: Path, deploy: dict[str, Any], timeout_s: float = REFUSED_S, **env: str | None) -> str:
    """omni-run's last stderr line, once it exited with 2 within `timeout_s`, without a traceback."""
    proc = _omni_run(tmp, deploy, **env)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"omni-run still starting after {timeout_s:.0f} s:\n{err[-3000:]}") from None
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


class _Http(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_address_that_answers_but_is_not_rays_gcs_is_refused_at_once(tmp_path: Path) -> None:
    # e.g. the head's dashboard port (8265) given for its GCS port: ray.init retried it for minutes.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        deploy = {"pipeline": "synthetic_text", "server": {"host": "127.0.0.1", "port": free_port()},
                  "cluster": {"backend": "ray", "address": address}, "stages": [{"stage_id": 0}]}
        line = _refused(tmp_path, deploy)
    finally:
        server.shutdown()
        server.server_close()
    assert line == (f"omni-run: config error: {tmp_path / 'deploy.yaml'}: cluster.address: {address} takes "
                    "connections but is not a Ray cluster's GCS (give the head node's GCS port, 6379 by default, "
                    "not its dashboard's or Ray Client's)")


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:0"])
def test_a_port_out_of_range_is_a_format_error(tmp_path: Path, address: str) -> None:
    deploy = {"pipeline": "synthetic_text", "server": {"host": "127.0.0.1", "port": free_port()},
              "cluster": {"backend": "ray", "address": address}, "stages": [{"stage_id": 0}]}
    assert _refused(tmp_path, deploy).endswith(f"cluster.address: expected host:port, \"auto\" or \"local\", "
                                               f"got '{address}'")


def test_pipelines_that_fit_the_cluster_alone_but_not_together_are_refused(cluster: Cluster, tmp_path: Path) -> None:
    # Each pipeline fits the two 1-CPU nodes; together they ask for 2.5 CPUs: one replica would wait
    # for placement until STARTUP_TIMEOUT_S (15 minutes).
    deploy = {"server": {"host": "127.0.0.1", "port": free_port()},
              "cluster": {"backend": "ray", "address": cluster.address},
              "pipelines": [
                  {"pipeline": "synthetic_text", "served_model_name": "writer",
                   "stages": [{"stage_id": 0, "resources": {"CPU": 1}}]},
                  {"pipeline": "synthetic_text", "served_model_name": "scribe",
                   "stages": [{"stage_id": 0, "num_replicas": 2, "resources": {"CPU": 0.75}}]},
              ]}
    line = _refused(tmp_path, deploy)
    assert "stages: the replicas ask for CPU=" in line and "this server's other pipelines" in line, line
    assert "the Ray cluster has 2" in line, line


def test_two_pipelines_on_two_nodes_route_by_model_and_stop_clean(cluster: Cluster, tmp_path: Path) -> None:
    port = free_port()
    deploy = {"server": {"host": "127.0.0.1", "port": port},
              "cluster": {"backend": "ray", "address": cluster.address, "arrays": "frames"},
              "pipelines": [
                  {"pipeline": "synthetic_text", "served_model_name": "writer",
                   "stages": [{"stage_id": 0, "resources": {"CPU": 0.5}}]},
                  {"pipeline": "synthetic_text", "served_model_name": "scribe",
                   "stages": [{"stage_id": 0, "num_replicas": 2, "resources": {"CPU": 0.5}}]},
              ]}
    proc = _omni_run(tmp_path, deploy)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert proc.stderr is not None
        while not any("server.ready" in ln for ln in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=SDK_TIMEOUT_S,
                               max_retries=0)
        assert {m.id for m in client.models.list().data} == {"writer", "scribe", "synthetic_text"}
        for name in ("writer", "scribe", "scribe"):
            out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
            assert out.model == name and out.choices[0].message.content
        proc.terminate()
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, "".join(lines) + rest
    import ray

    ray.init(address=cluster.address, namespace="omni-actors", logging_level="WARNING")
    try:  # every replica's actor ended with omni-run: all CPUs free again
        deadline = time.monotonic() + RELEASE_S
        while ray.available_resources().get("CPU", 0.0) < 2.0:
            assert time.monotonic() < deadline, ray.available_resources()
            time.sleep(0.2)
    finally:
        ray.shutdown()


def test_ray_address_in_the_environment_is_checked_for_auto_and_ignored_by_local(tmp_path: Path) -> None:
    """ray.init reads RAY_ADDRESS in place of "auto" (or no address): it was never checked, so a Ray
    Client address there went through Ray Client (cloudpickle) and a closed port was retried for
    minutes; and `address: local` joined RAY_ADDRESS's cluster rather than starting its own."""
    deploy = {"pipeline": "synthetic_text", "server": {"host": "127.0.0.1", "port": free_port()},
              "cluster": {"backend": "ray", "address": "auto"}, "stages": [{"stage_id": 0}]}
    client = f"ray://127.0.0.1:{free_port()}"
    assert _refused(tmp_path, deploy, RAY_ADDRESS=client).endswith(
        f"cluster.address: auto takes RAY_ADDRESS={client!r} from the environment, which is not a GCS host:port "
        "(Ray Client and the jobs API are not used: unset RAY_ADDRESS, or give cluster.address as the head's "
        "host:port)")
    closed = f"127.0.0.1:{free_port()}"
    assert _refused(tmp_path, deploy, RAY_ADDRESS=closed).endswith(
        f"cluster.address: auto takes RAY_ADDRESS={closed!r} from the environment: cannot reach Ray at {closed}: "
        "Connection refused")
    # `local`: a cluster of its own (one CPU-only node), whatever RAY_ADDRESS says; refused, it leaves
    # no Ray process and no session folder behind.
    deploy["cluster"]["address"] = "local"
    deploy["stages"] = [{"stage_id": 0, "resources": {"GPU": 1}}]
    proc = _omni_run(tmp_path, deploy, RAY_ADDRESS=closed, RAY_TMPDIR=None)  # (its files: in its own folder)
    try:
        _, err = proc.communicate(timeout=LOCAL_REFUSED_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert "stages[0].resources: no node of the Ray cluster has {'CPU': 1.0, 'GPU': 1.0}" \
        in err.strip().splitlines()[-1], err
    session = f"/tmp/omni-ray-{proc.pid}-"
    assert glob.glob(f"{session}*") == [] and processes_under(session) == []
