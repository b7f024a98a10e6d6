"""The ray backend on a 3-node Ray cluster on this machine: stages pinned to nodes, arrays as frames.

One `ray.cluster_utils.Cluster` serves the module (a head and two nodes, each
with its own custom resource); `cluster.arrays: frames` forces the cross-node
path. The Ray temp dir lives under a private directory that is removed at the
end, and no Ray process may outlive the module.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import zmq
from ray.cluster_utils import Cluster
from zmq.utils.monitor import recv_monitor_message

from omni_actors.bus import messages as m
from omni_actors.bus.router_pair import RouterPair
from omni_actors.config.deploy import DeployConfig
from omni_actors.errors import ConfigError, StageUnavailable, WorkerDied
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec, StageChunk
from omni_actors.workers.spec import HEARTBEAT_SUFFIX
from tests.conftest import eventually, make_deploy, running, shm_files
from tests.orchestrator.ray_support import local_cluster

NODES = {"head": {"num_cpus": 4}, "node_a": {"num_cpus": 2}, "node_b": {"num_cpus": 2, "num_gpus": 2}}
"""Node name (also its custom resource) -> its other resources (node_b's two GPUs are only
names to Ray: they let stage 1 be a two-GPU replica, placed with a placement group)."""
EXTRAS = {"step_delay_ms": 20, "payload_bytes": 256 * 1024, "chunks": 6}
"""Every stage sends a 256 KiB array per chunk: over the inline limit, so it travels as a frame."""
RESTART_S = 60.0
"""Longest wait for a replacement actor's Ready on a loaded 2-core box."""
FAIL_FAST_S = 10.0
"""A request on a killed worker fails well within this (the test's bound, not a timing claim)."""
HOSTILE_WAIT_S = 2.0
"""How long an unauthenticated client waits for anything to come back (nothing may)."""
NODE_DEATH_S = 120.0
"""Bound for Ray to notice a removed node (its health checks) and the request to fail."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    nodes = [{**NODES[name], "resources": {name: 4}, "labels": {"zone": name}} for name in ("node_a", "node_b")]
    with local_cluster({**NODES["head"], "resources": {"head": 4}}, nodes) as c:
        yield c


def ray_deploy(address: str, **cluster: Any) -> DeployConfig:
    pins = {0: "node_a", 1: "node_b", 2: "head"}
    return make_deploy(
        cluster={"backend": "ray", "address": address, "arrays": "frames", **cluster},
        stages=[{"stage_id": s, "resources": {node: 1, **({"GPU": 2} if s == 1 else {})}, "engine_extras": EXTRAS}
                for s, node in pins.items()],
    )


def normal(chunks: list[StageChunk]) -> list[tuple]:
    """Chunks as comparable values (arrays by dtype, shape and bytes), stage by stage in arrival
    order (how two stages' outputs interleave depends on timing)."""
    def value(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return (v.dtype.str, v.shape, v.tobytes())
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [value(x) for x in v]
        return v
    return sorted(((c.stage_id, c.output_type, c.finished, value(c.data)) for c in chunks), key=lambda t: t[0])


PROMPTS = ("one two three", "the quick brown fox")


async def test_resources_no_node_has_are_one_clear_error_at_start(cluster: Cluster) -> None:
    deploy = make_deploy(cluster={"backend": "ray", "address": cluster.address},
                         stages=[{"stage_id": 1, "resources": {"GPU": 8}}])
    orch = Orchestrator(deploy)
    with pytest.raises(ConfigError) as err:
        await orch.start()
    assert "test: stages[0].resources: no node of the Ray cluster has {'CPU': 1.0, 'GPU': 8.0}" in str(err.value)
    assert not ray.is_initialized()
    # Each replica fits a node, but not all of them together.
    deploy = make_deploy(cluster={"backend": "ray", "address": cluster.address},
                         stages=[{"stage_id": 0, "num_replicas": 5, "resources": {"node_a": 1, "CPU": 0}}])
    with pytest.raises(ConfigError) as err:
        await Orchestrator(deploy).start()
    assert "test: stages: the replicas ask for node_a=5 in all, the Ray cluster has 4" in str(err.value)
    assert not ray.is_initialized()
    # What Ray itself refuses in a replica's options (at its first spawn, a traceback before).
    for stage, why in (({"resources": {"CPU": 0.00001}}, "resource num_cpus cannot go beyond 0.0001"),
                       ({"labels": {"zone": "in(a"}}, "Invalid label selector value `in(a`")):
        deploy = make_deploy(cluster={"backend": "ray", "address": cluster.address},
                             stages=[{"stage_id": 0}, {"stage_id": 2, **stage}])
        with pytest.raises(ConfigError) as err:
            await Orchestrator(deploy).start()
        assert "test: stages[1]: Ray refuses this replica's resources or labels: " in str(err.value), err.value
        assert why in str(err.value), err.value
        assert not ray.is_initialized()
    deploy = make_deploy(cluster={"backend": "ray", "address": cluster.address, "bus_host": "192.0.2.254"})
    with pytest.raises(ConfigError) as err:
        await Orchestrator(deploy).start()
    assert "test: cluster.bus_host: cannot listen on tcp://192.0.2.254:0" in str(err.value)
    assert not ray.is_initialized()
    assert orch.runtime is not None and not orch.runtime.path.exists()


@pytest.fixture(scope="module")
async def local_outputs() -> list[list[tuple]]:
    deploy = make_deploy(stages=[{"stage_id": s, "engine_extras": EXTRAS} for s in (0, 1, 2)])
    async with running(deploy) as orch:
        return [normal(await orch.submit(RequestSpec(inputs={"prompt": p})).collect()) for p in PROMPTS]


@pytest.fixture(scope="module")
async def orch(cluster: Cluster) -> Any:
    async with running(ray_deploy(cluster.address), restart_timeout_s=RESTART_S) as o:
        # a worker's bus Ready can come before its actor's report of pid and node
        reports = [h.proc.reported for hs in o.workers.values() for h in hs]
        await asyncio.wait_for(asyncio.gather(*reports), RESTART_S)
        yield o
    assert not ray.is_initialized(), "the orchestrator left its Ray connection open"


async def test_stages_on_three_nodes_give_the_local_outputs_with_arrays_as_frames(
    orch: Orchestrator, local_outputs: list[list[tuple]]
) -> None:
    assert orch.router is not None and orch.launcher is not None
    assert orch.launcher.endpoint.startswith("tcp://")
    nodes = {sid: orch.workers[sid][0].proc.node for sid in (0, 1, 2)}
    assert len(set(nodes.values())) == 3, "each stage on its own node"
    assert [orch.workers[sid][0].proc.pg is not None for sid in (0, 1, 2)] == [False, True, False]
    assert orch.router.frames_peers == {h.identity for hs in orch.workers.values() for h in hs}
    for prompt, expected in zip(PROMPTS, local_outputs, strict=True):
        chunks = await orch.submit(RequestSpec(inputs={"prompt": prompt})).collect()
        assert normal(chunks) == expected
        assert any(isinstance(c.data.get("blob"), np.ndarray) and c.data["blob"].nbytes == 256 * 1024
                   for c in chunks)
    # Arrays crossed as frames: no worker made a shared-memory segment.
    assert shm_files(f"{orch.run_prefix}-s") == []
    assert orch.statistics().leases_held == 0


async def test_a_stage_with_node_labels_is_placed_on_a_node_carrying_them(orch: Orchestrator, cluster: Cluster) -> None:
    """`labels` (Ray label selectors): stage 0 lands on the node labelled zone=node_a; a label no node
    carries is one clear error at start, naming the labels the nodes have."""
    def deploy(zone: str) -> DeployConfig:
        return make_deploy(cluster={"backend": "ray", "address": cluster.address}, stages=[
            {"stage_id": 0, "labels": {"zone": zone}, "resources": {"CPU": 0.5}, "engine_extras": EXTRAS},
            *({"stage_id": s, "resources": {"head": 1}, "engine_extras": EXTRAS} for s in (1, 2))])

    with pytest.raises(ConfigError) as err:
        await Orchestrator(deploy("moon")).start()
    assert "stages[0].labels: no node of the Ray cluster with room for {'CPU': 0.5} carries {'zone': 'moon'}" \
        in str(err.value) and "zone=node_a" in str(err.value)
    node_a = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node_a" in n["Resources"])
    async with running(deploy("node_a"), restart_timeout_s=RESTART_S) as placed:
        await asyncio.wait_for(placed.workers[0][0].proc.reported, RESTART_S)
        assert placed.workers[0][0].proc.node == node_a
        chunks = await placed.submit(RequestSpec(inputs={"prompt": PROMPTS[0]})).collect()
        assert any(c.finished for c in chunks)


async def test_a_worker_on_the_orchestrators_node_maps_shared_memory_and_the_others_get_frames(
    orch: Orchestrator, cluster: Cluster, local_outputs: list[list[tuple]]
) -> None:
    """`arrays: auto`: stage 0 on this process's Ray node (the run's ipc socket and shared memory, as the
    local backend), 1 and 2 elsewhere (tcp + CURVE, frames): stage 0's leased arrays reach stage 1 as
    frames, and stage 1 gives the leases back. The tcp bus listens on `bus_host: "::"` (IPv6's any
    address, IPv4 too), the workers elsewhere connect to this node's address."""
    here = ray.get_runtime_context().get_node_id()  # (the module's orchestrator keeps Ray connected)
    mine = next(name for n in ray.nodes() if n["NodeID"] == here for name in NODES if name in n["Resources"])
    others = [name for name in NODES if name != mine]
    pins = {0: mine, 1: others[0], 2: others[1]}
    deploy = make_deploy(
        cluster={"backend": "ray", "address": cluster.address, "bus_host": "::"},
        stages=[{"stage_id": s, "resources": {node: 1}, "engine_extras": EXTRAS} for s, node in pins.items()],
    )
    async with running(deploy) as mixed:
        assert mixed.router is not None and mixed.launcher is not None
        assert mixed.router.endpoint.startswith("tcp://[::]:")
        assert mixed.launcher.endpoint == f"tcp://{ray.util.get_node_ip_address()}:{mixed.router.endpoint.split(':')[-1]}"
        assert mixed.router.frames_peers == {mixed.workers[1][0].identity, mixed.workers[2][0].identity}
        assert isinstance(mixed.router, RouterPair) and mixed.router.local_endpoint.startswith("ipc://")
        here_id = mixed.workers[0][0].identity
        assert mixed.router.local_peers == {here_id, here_id + HEARTBEAT_SUFFIX}  # (its heartbeat socket too)
        assert mixed.router.local.messages_in > 0 and mixed.router.remote.messages_in > 0
        for prompt, expected in zip(PROMPTS, local_outputs, strict=True):
            chunks = await mixed.submit(RequestSpec(inputs={"prompt": prompt})).collect()
            assert normal(chunks) == expected
        assert shm_files(f"{mixed.run_prefix}-s0") != []  # stage 0's arena
        assert shm_files(f"{mixed.run_prefix}-s1") == shm_files(f"{mixed.run_prefix}-s2") == []
        await eventually(lambda: mixed.statistics().stage(0).replicas[0].leases_out == 0, 10.0)


def _hostile(endpoint: str, server_key: str | None) -> list[int]:
    """A plain ZeroMQ client (or one with the bus's public key but no allowed key pair) that connects,
    claims a worker's identity and sends frames; returns the handshake events it saw and asserts
    that nothing came back."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"s0r0g0")
    if server_key is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_key.encode(), public, secret
    mon = sock.get_monitor_socket()
    try:
        sock.connect(endpoint)
        ready = m.Ready(0, 0, os.getpid())
        out = m.StageOutput("x", 0, m.Payload(data={"text": "forged"}), True)
        for _ in range(3):
            try:
                sock.send(m.encode_many([ready, out]), zmq.NOBLOCK)
            except zmq.Again:
                pass
        events = []
        poller = zmq.Poller()
        poller.register(mon, zmq.POLLIN)
        poller.register(sock, zmq.POLLIN)
        while True:
            got = dict(poller.poll(int(HOSTILE_WAIT_S * 1000)))
            if not got:
                break
            assert sock not in got, "an unauthenticated client received something"
            events.append(recv_monitor_message(mon)["event"])
        return events
    finally:
        sock.disable_monitor()
        mon.close(0)
        sock.close(0)
        ctx.term()


async def test_a_client_without_the_curve_keys_changes_nothing_and_learns_nothing(orch: Orchestrator) -> None:
    assert orch.launcher is not None and orch.launcher.auth is not None
    before = orch.statistics()
    workers = {sid: [h.identity for h in hs] for sid, hs in orch.workers.items()}
    plain = await asyncio.to_thread(_hostile, orch.launcher.endpoint, None)
    stranger = await asyncio.to_thread(_hostile, orch.launcher.endpoint, orch.launcher.auth.public_key)
    failed = {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_AUTH}
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in plain + stranger
    assert failed & set(plain), plain
    assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in stranger, stranger  # refused by the ZAP allow-list
    after = orch.statistics()
    assert after.requests_total == before.requests_total
    assert {sid: [h.identity for h in hs] for sid, hs in orch.workers.items()} == workers
    assert all(h.ready for hs in orch.workers.values() for h in hs)
    chunks = await orch.submit(RequestSpec(inputs={"prompt": "still fine"})).collect()
    assert chunks[-1].finished and not any(c.data.get("text") == "forged" for c in chunks)


async def test_the_workers_keys_are_in_no_command_line_environment_or_ray_file(orch: Orchestrator) -> None:
    """A worker's CURVE keys reach it through the actor's constructor and its stdin only: not on its
    command line or in its environment (both readable in /proc), nor in any of Ray's session files
    (its logs: every node of this cluster keeps them under RAY_TMPDIR)."""
    pids = [h.pid for hs in orch.workers.values() for h in hs]
    assert pids and None not in pids
    leaked = [(pid, name) for pid in pids for name in ("cmdline", "environ")
              if b"secret_key" in (Path("/proc") / str(pid) / name).read_bytes()]
    assert leaked == []  # (what it names, never the text: a failure must not print a key)
    files = [p for p in Path(os.environ["RAY_TMPDIR"]).rglob("*") if p.is_file()]
    assert files  # (the nodes' logs)
    assert [p for p in files if b"secret_key" in _read(p)] == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # (a file Ray removed meanwhile)
        return b""


async def test_a_killed_worker_fails_its_request_fast_and_the_stage_comes_back(orch: Orchestrator) -> None:
    victim = orch.workers[1][0]
    node = victim.proc.node
    stream = orch.submit(RequestSpec(inputs={"prompt": "a b"}, params={"chunks": 1000}))
    async for chunk in stream:
        if chunk.output_type == "audio":
            break
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)  # the worker process under the actor on node_b
    with pytest.raises(WorkerDied) as err:
        await asyncio.wait_for(stream.collect(), FAIL_FAST_S)
    assert err.value.stage_id == 1
    # /health reports the stage down until its replacement is Ready (set with the failure: a
    # replacement needs a new actor and process, far more than this one loop turn)
    assert not orch.health()[1]
    with pytest.raises(StageUnavailable):
        orch.submit(RequestSpec(inputs={"prompt": "too early"}))
    await orch.wait_healthy(RESTART_S)
    back = orch.workers[1][0]
    await asyncio.wait_for(back.proc.reported, RESTART_S)
    assert back is not victim and back.generation == victim.generation + 1
    assert back.proc.node == node  # placed where its resources are
    assert ray.util.placement_group_table(victim.proc.pg)["state"] == "REMOVED"
    chunks = await orch.submit(RequestSpec(inputs={"prompt": "after"})).collect()
    assert chunks[-1].finished

    # An actor that dies (as with its node) is the same to the orchestrator.
    victim = back
    stream = orch.submit(RequestSpec(inputs={"prompt": "a b"}, params={"chunks": 1000}))
    async for chunk in stream:
        if chunk.output_type == "audio":
            break
    ray.kill(victim.proc.actor, no_restart=True)
    with pytest.raises(WorkerDied) as err:
        await asyncio.wait_for(stream.collect(), FAIL_FAST_S)
    assert "Ray actor or the actor's node died" in str(err.value), err.value  # (not "exit code -1")
    await orch.wait_healthy(RESTART_S)
    assert orch.workers[1][0] is not victim
    assert (await orch.submit(RequestSpec(inputs={"prompt": "again"})).collect())[-1].finished


@pytest.mark.slow
async def test_tiny_qwen2_5_omni_on_three_nodes_gives_the_local_outputs(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from omni_actors.models.tiny import make_tiny

    path = str(make_tiny("qwen2_5_omni", tmp_path_factory.mktemp("qwen2_5_omni"), seed=0))
    spec = RequestSpec(
        inputs={"messages": [{"role": "user", "content": "Hello! How are you?"}]},
        params={"max_tokens": 24, "ignore_eos": True, "talker_max_tokens": 40, "talker_temperature": 0.0},
    )
    outputs = []
    pins = {0: "node_a", 1: "node_b", 2: "head"}
    for raw in (
        {},
        {"cluster": {"backend": "ray", "address": cluster.address, "arrays": "frames"},
         "stages": [{"stage_id": s, "resources": {node: 1}} for s, node in pins.items()]},
    ):
        async with running(make_deploy("qwen2_5_omni", model=path, **raw)) as o:
            chunks = await o.submit(RequestSpec(inputs=spec.inputs, params=spec.params)).collect()
        text = "".join(c.data.get("text", "") for c in chunks if c.stage_id == 0)
        audio = np.concatenate([c.data["audio"] for c in chunks if c.output_type == "audio"])
        outputs.append((text, audio))
    (text, audio), (ray_text, ray_audio) = outputs
    assert text and ray_text == text
    assert audio.size and ray_audio.shape == audio.shape
    np.testing.assert_allclose(ray_audio, audio, atol=1e-5)


@pytest.mark.slow
async def test_a_node_that_dies_fails_its_requests_and_the_replica_comes_back_where_ray_can_place_it(
    cluster: Cluster,
) -> None:
    async with running(ray_deploy(cluster.address), restart_timeout_s=RESTART_S) as o:
        victim = o.workers[1][0]
        stream = o.submit(RequestSpec(inputs={"prompt": "a b"}, params={"chunks": 100000}))
        async for chunk in stream:
            if chunk.output_type == "audio":
                break
        node = next(n for n in cluster.worker_nodes if n.node_id == victim.proc.node)
        cluster.remove_node(node)  # node_b: its raylet, its actors and their workers
        with pytest.raises(WorkerDied):
            await asyncio.wait_for(stream.collect(), NODE_DEATH_S)
        cluster.add_node(**NODES["node_b"], resources={"node_b": 4})  # somewhere to place it again
        await o.wait_healthy(2 * RESTART_S)
        back = o.workers[1][0]
        await asyncio.wait_for(back.proc.reported, RESTART_S)  # its bus Ready can come before the actor's report
        assert back is not victim and back.proc.node not in ("", victim.proc.node)
        assert (await o.submit(RequestSpec(inputs={"prompt": "after"})).collect())[-1].finished


def test_what_crosses_into_ray_is_json_text_and_numbers_never_a_pickled_object() -> None:
    """The actor's constructor and its calls take and return only str/int/None (Ray pickles what it
    is given: nothing of ours is ever handed to it but text and numbers)."""
    import inspect
    import typing

    from omni_actors.orchestrator import ray_backend

    plain = {str, int, type(None)}
    for name in ("__init__", "info", "wait", "signal"):
        hints = typing.get_type_hints(getattr(ray_backend.WorkerActor, name))
        for arg, hint in hints.items():
            kinds = set(typing.get_args(hint)) or {hint}
            assert kinds <= plain, f"WorkerActor.{name} {arg}: {hint}"
        params = inspect.signature(getattr(ray_backend.WorkerActor, name)).parameters
        ours = {p for p in params if p != "self" and not p.startswith("_ray_")}  # (ray.remote adds its own)
        assert ours <= set(hints), f"WorkerActor.{name} has an unannotated argument"
