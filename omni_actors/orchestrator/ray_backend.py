"""The ray backend: each stage replica a Ray actor placed by its resources; the bus stays ours.

Ray owns placement and process lifetime. Each actor (`WorkerActor`) starts the
same worker process as the local backend (`python -m omni_actors.workers.main`)
next to itself, so the device mask Ray gives the actor and the stage's env are
in place before torch is imported, and tells its exit code. A worker on another
node connects to the orchestrator over `tcp://` with CURVE keys it reads from its
stdin; the actor gets them, like everything else, as JSON text in its constructor
(no pickled object of ours crosses into Ray), and its arrays travel as message
frames. A worker on the orchestrator's node keeps the local backend's path: the
run's ipc socket (bus.router_pair) and shared memory.

On the orchestrator's side a `RayWorker` stands in for the process (pid,
returncode, wait, signals), so the supervisor treats both backends alike: an
actor or node that dies ends its `wait`, and the replica is restarted as a new
actor wherever Ray can place it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import ray
import zmq
from ray._raylet import InnerGcsClient  # (ray is pinned: the ray extra's ray==2.60.0)
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from omni_actors import logs
from omni_actors.bus.sockets import BusAuth, RuntimeDir, tcp_host
from omni_actors.config.deploy import DeployConfig, StageDeploy
from omni_actors.errors import ConfigError
from omni_actors.orchestrator import ray_logs, ray_sessions
from omni_actors.orchestrator.launcher import Launcher, WorkerHandle, stage_env
from omni_actors.workers.spec import WorkerSpec

log = logs.get(__name__)

NAMESPACE = "omni-actors"
CLUSTER_CONNECT_TIMEOUT_S = 10.0
"""Longest wait for a TCP connection to the Ray address given (Ray itself retries for minutes)."""
GCS_ANSWER_TIMEOUT_S = 5.0
"""Longest wait for the Ray address to answer as Ray's GCS does (gRPC, then the cluster's id): a port
that takes connections but is not the GCS (the dashboard's 8265, a Ray Client port) would otherwise
have ray.init retry for minutes."""
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""A gRPC client's first bytes: HTTP/2's connection preface and an empty SETTINGS frame."""
_HTTP2_SETTINGS = 0x4
"""The frame type an HTTP/2 server's first frame has (its SETTINGS)."""
ACTOR_CONCURRENCY = 4
"""Calls an actor serves at once: `wait` blocks for its worker's life while `signal` still answers."""
DEFAULT_CPUS = 1.0
"""CPUs a replica asks for when its `resources` name none."""
RAY_ADDRESS_ENV = "RAY_ADDRESS"
"""Where ray.init looks for an address when given none or "auto" (Ray's ray_constants)."""
_ANY_HOST = ("0.0.0.0", "*", "::", "[::]")
_users = 0
"""Open RayLaunchers of this process: one Ray connection serves them all; the last one closes it."""
_owned = False
"""This module made the connection (one an embedding program made is left open)."""
_session_dir: str | None = None
"""The folder of the Ray cluster this process started (`address: local`), removed when it stops."""
_claims: dict[int, dict[str, float]] = {}
"""What the replicas of each open RayLauncher of this process (one per pipeline) ask for in all: the
pipelines of one server share the cluster, so each one's check counts the others' replicas."""


def replica_resources(dep: StageDeploy) -> dict[str, float]:
    """What one replica of a stage asks Ray for."""
    return {"CPU": DEFAULT_CPUS, **{k: float(v) for k, v in dep.resources.items()}}


def _actor_options(need: dict[str, float]) -> dict[str, Any]:
    custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": need.get("CPU", 0.0), "num_gpus": need.get("GPU", 0.0), "resources": custom}


class WorkerActor:
    """Lives inside a Ray actor: starts one stage worker process next to itself and reports its exit."""

    def __init__(self, spec_json: str, keys_json: str, env_json: str, orch_node: str, arrays: str,
                 local_endpoint: str | None) -> None:
        self.node = ray.get_runtime_context().get_node_id()
        path = "frames" if arrays == "frames" or self.node != orch_node else "shm"
        spec = msgspec.structs.replace(msgspec.json.decode(spec_json, type=WorkerSpec), arrays=path)
        if path == "shm" and local_endpoint:  # the orchestrator's node: its ipc socket, as the local backend
            spec = msgspec.structs.replace(spec, endpoint=local_endpoint, curve=False)
        env = {**os.environ, **msgspec.json.decode(env_json, type=dict[str, str])}
        env.setdefault("HF_HUB_OFFLINE", "1")
        self.arrays = path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "omni_actors.workers.main", msgspec.json.encode(spec).decode(), str(os.getpid())],
            env=env, stdin=subprocess.PIPE, start_new_session=True,
        )
        assert self.proc.stdin is not None
        if spec.curve:
            self.proc.stdin.write(keys_json.encode() + b"\n")  # (never on a command line or on disk)
        self.proc.stdin.close()

    def info(self) -> str:
        return msgspec.json.encode({"pid": self.proc.pid, "node": self.node, "arrays": self.arrays}).decode()

    def wait(self) -> int:
        return self.proc.wait()

    def signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)


class RayWorker:
    """The orchestrator's stand-in for a worker process that runs under a Ray actor."""

    def __init__(self, actor: Any, pg: Any, on_exit: Callable[[], None]) -> None:
        self.actor = actor
        self.pg = pg
        """The replica's placement group (a replica on several GPUs), removed when it exits."""
        self._pg_held = pg is not None
        self._on_exit = on_exit
        self.pid: int | None = None
        self.node = ""
        self.returncode: int | None = None
        self.exit_detail: str | None = None
        """Why it ended, where an exit code says nothing (its actor or node died: code -1)."""
        self._ended_by_us = False
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.reported: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the actor said its pid and node (or it died first). Its worker's bus Ready can come
        before that: pid and node stay unknown until then."""
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        code = -1
        try:
            info = msgspec.json.decode(await self.actor.info.remote())
            self.pid, self.node = info["pid"], info["node"]
            self.reported.set_result(None)
            code = await self.actor.wait.remote()
        except ray.exceptions.RayError as err:  # the actor, or its node, died (or never started)
            if self._ended_by_us:
                log.info("ray.actor_ended", error=type(err).__name__)
            else:
                log.error("ray.actor_died", error=type(err).__name__, detail=str(err).splitlines()[0][:300])
                self.exit_detail = f"its Ray actor or the actor's node died ({type(err).__name__})"
        finally:
            if not self.reported.done():
                self.reported.set_result(None)
            self.returncode = code
            self._release()
            if not self._exited.done():
                self._exited.set_result(code)

    def _release(self) -> None:
        self._on_exit()
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
        if self._pg_held:
            self._pg_held = False
            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        if self.pid is None:  # not placed or not started yet: nothing to ask, end the actor
            self._ended_by_us = True
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
            return
        self.actor.signal.remote(int(sig))

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class RayLauncher(Launcher):
    """Starts workers as Ray actors on the cluster of `cluster.address`, on a CURVE tcp bus."""

    def after_exit(self, handle: WorkerHandle) -> None:
        """Nothing: an actor's process belongs to Ray (its pid may be another node's)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._connected = False
        self._workers: set[RayWorker] = set()
        self.node_id = ""
        self.node_ip = ""
        self.local: str | None = None
        """The ipc endpoint for workers on this node (None: `arrays: frames`, every worker on tcp)."""

    async def open(self, ctx: zmq.Context) -> None:
        cl = self.deploy.cluster
        src = self.deploy.source
        global _users, _owned
        if not ray.is_initialized():
            address = _init_address(cl.address, src)
            # ray.init installs its own SIGTERM handler (it prints and aborts the process): keep ours,
            # so a SIGTERM still leads omni-run's orderly shutdown.
            handlers = _signal_handlers()
            local = _local_options() if cl.address == "local" else {}
            try:
                ray.init(address=address, namespace=NAMESPACE, **ray_logs.init_options(), **local)
                ray_logs.print_forwarded_as_json()
            except (ConnectionError, RuntimeError, ValueError) as err:
                _remove_session_dir()
                raise ConfigError(f"{src}: cluster.address: cannot connect to Ray at {cl.address!r}: {err}") from None
            finally:
                _restore_signal_handlers(handlers)
            _owned = True
        # else: this process is a Ray driver already (another orchestrator, or an embedding program)
        _users += 1
        self._connected = True
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        alive = [n for n in ray.nodes() if n["Alive"]]
        others: dict[str, float] = {}
        for claim in _claims.values():
            for k, v in claim.items():
                others[k] = others.get(k, 0.0) + v
        check_resources(self.deploy, self.pipeline.stage_ids, [n["Resources"] for n in alive],
                        [n.get("Labels") or {} for n in alive], others)
        self.actor_cls = ray.remote(WorkerActor)
        self._check_options()
        _claims[id(self)] = replica_totals(self.deploy, self.pipeline.stage_ids)
        self.auth = BusAuth(ctx)
        log.info("ray.connected", address=cl.address, node=self.node_id, node_ip=self.node_ip,
                 nodes=sum(1 for n in ray.nodes() if n["Alive"]))

    def _check_options(self) -> None:
        """Ray's own checks of each stage's replica options, now rather than at its first spawn (where
        a quantity finer than Ray's 0.0001 or a malformed label selector was a traceback)."""
        for i, st in enumerate(self.deploy.stages):
            if st.stage_id not in self.pipeline.stage_ids:
                continue
            selector = {"label_selector": dict(st.labels)} if st.labels else {}
            try:
                self.actor_cls.options(**_actor_options(replica_resources(st)), **selector)
            except ValueError as err:
                raise ConfigError(f"{self.deploy.source}: stages[{i}]: Ray refuses this replica's resources or "
                                  f"labels: {err}") from None

    def bus_endpoint(self, runtime: RuntimeDir) -> str:
        return f"tcp://{tcp_host(self.deploy.cluster.bus_host or self.node_ip)}:0"

    def local_endpoint(self, runtime: RuntimeDir) -> str | None:
        return None if self.deploy.cluster.arrays == "frames" else runtime.endpoint("bus.sock")

    def set_bound(self, bound: str, local: str | None = None) -> None:
        host, _, port = bound.removeprefix("tcp://").rpartition(":")
        self.endpoint = f"tcp://{tcp_host(self.node_ip) if host in _ANY_HOST else host}:{port}"
        self.local = local

    async def spawn(self, handle: WorkerHandle) -> None:
        assert self.auth is not None
        spec = self.worker_spec(handle)
        keys = self.auth.issue()
        need = replica_resources(self.deploy.stage(handle.stage_id))
        options: dict[str, Any] = {**_actor_options(need), "max_concurrency": ACTOR_CONCURRENCY, "max_restarts": 0}
        labels = dict(self.deploy.stage(handle.stage_id).labels)
        pg = None
        if need.get("GPU", 0.0) > 1:  # a replica on several GPUs: reserve them together on one node
            pg = placement_group([need], strategy="STRICT_PACK", bundle_label_selector=[labels] if labels else None)
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        elif labels:
            options["label_selector"] = labels
        env = stage_env(self.deploy, handle.stage_id, handle.replica)
        actor = self.actor_cls.options(**options).remote(
            msgspec.json.encode(spec).decode(), msgspec.json.encode(keys).decode(), msgspec.json.encode(env).decode(),
            self.node_id, self.deploy.cluster.arrays, self.local,
        )
        worker = RayWorker(actor, pg, lambda: self._gone(keys))
        self._workers.add(worker)
        worker._exited.add_done_callback(lambda _: self._workers.discard(worker))
        handle.proc = worker

    def _gone(self, keys: Any) -> None:
        if self.auth is not None:
            self.auth.revoke(keys)  # a gone worker's keys open nothing

    async def close(self) -> None:
        for worker in list(self._workers):
            worker._task.cancel()
            worker._release()
        if self.auth is not None:
            self.auth.close()
            self.auth = None
        _claims.pop(id(self), None)
        if self._connected:
            global _users, _owned
            self._connected = False
            _users -= 1
            if _users == 0 and _owned:
                _owned = False
                ray.shutdown()
                _remove_session_dir()


def _local_options() -> dict[str, Any]:
    """ray.init's options for a cluster of our own: no dashboard, and its session files (logs, sockets)
    in a folder of this run's (ray_sessions.py), removed when it stops, rather than kept in /tmp/ray for
    good (unless the host names Ray's folder, RAY_TMPDIR: then they go there, as Ray keeps them)."""
    global _session_dir
    if os.environ.get("RAY_TMPDIR"):
        return {"include_dashboard": False}
    ray_sessions.sweep_stale_sessions()
    _session_dir = str(ray_sessions.make_session_dir())
    return {"include_dashboard": False, "_temp_dir": _session_dir}


def _remove_session_dir() -> None:
    global _session_dir
    if _session_dir is not None:
        shutil.rmtree(_session_dir, ignore_errors=True)
        _session_dir = None


def _signal_handlers() -> dict[int, Any]:
    """SIGINT/SIGTERM handlers now (empty off the main thread, where they cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(handlers: dict[int, Any]) -> None:
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def _init_address(address: str, src: str) -> str:
    """What ray.init is given for `cluster.address`, checked first (ray.init would retry a wrong one for
    minutes). ray.init reads RAY_ADDRESS in place of None or "auto": "local" is passed as such (a cluster
    of our own, whatever RAY_ADDRESS says), and "auto" with RAY_ADDRESS set is checked as that address."""
    if address == "local":
        return address
    if address == "auto":
        env = os.environ.get(RAY_ADDRESS_ENV, "").strip()
        if not env:
            return address  # (Ray finds this host's cluster, or says it found none)
        where = f"cluster.address: auto takes {RAY_ADDRESS_ENV}={env!r} from the environment"
        if "://" in env:  # (ray://: Ray Client, which cloudpickles every call; http://: the jobs API)
            raise ConfigError(f"{src}: {where}, which is not a GCS host:port (Ray Client and the jobs API are not "
                              f"used: unset {RAY_ADDRESS_ENV}, or give cluster.address as the head's host:port)")
        _check_reachable(env, src, where)
        return env
    _check_reachable(address, src, "cluster.address")
    return address


def _check_reachable(address: str, src: str, where: str) -> None:
    """A `host:port` address must be Ray's GCS, answering now (ray.init would retry it for minutes)."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # ([::1]:6379, an IPv6 host)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{src}: {where}: expected host:port, \"auto\" or \"local\", got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=CLUSTER_CONNECT_TIMEOUT_S) as conn:
            if _ray_tls():  # (Ray's TLS: the GCS answers only a TLS handshake; ray.init checks the rest)
                return
            conn.settimeout(GCS_ANSWER_TIMEOUT_S)
            conn.sendall(_HTTP2_PREFACE)
            first = conn.recv(9)  # an HTTP/2 frame header: length (3), type (1), flags (1), stream (4)
    except OSError as err:
        raise ConfigError(f"{src}: {where}: cannot reach Ray at {address}: {err.strerror or err}") from None
    not_gcs = (f"{src}: {where}: {address} takes connections but is not a Ray cluster's GCS (give the head "
               f"node's GCS port, 6379 by default, not its dashboard's or Ray Client's)")
    if len(first) < 4 or first[3] != _HTTP2_SETTINGS:  # not gRPC at all (HTTP/1, another protocol, silence)
        raise ConfigError(not_gcs)
    try:  # gRPC: is it a GCS? (the cluster's id, asked once)
        InnerGcsClient.standalone(address, None, int(GCS_ANSWER_TIMEOUT_S * 1000))
    except ray.exceptions.RayError:
        raise ConfigError(not_gcs) from None


def _ray_tls() -> bool:
    """Ray's own switch for TLS on its gRPC connections (RAY_USE_TLS, read as Ray reads it)."""
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


def _plain(labels: dict[str, str]) -> dict[str, str]:
    """The selectors that ask for one value (Ray's "!", "in(...)" forms are left to Ray to match)."""
    return {k: v for k, v in labels.items() if not v.startswith("!") and not v.startswith("in(")}


def replica_totals(deploy: DeployConfig, stage_ids: tuple[int, ...]) -> dict[str, float]:
    """What all replicas of a pipeline's stages ask Ray for together."""
    total: dict[str, float] = {}
    for sid in stage_ids:
        dep = deploy.stage(sid)
        for k, v in replica_resources(dep).items():
            total[k] = total.get(k, 0.0) + v * dep.num_replicas
    return total


def check_resources(deploy: DeployConfig, stage_ids: tuple[int, ...], nodes: list[dict[str, float]],
                    labels: list[dict[str, str]] | None = None, others: dict[str, float] | None = None) -> None:
    """Every stage's replica must fit on some node of the cluster (one carrying its plain `labels`,
    when given the nodes' labels), and all replicas together in the cluster, with what `others` (the
    server's other pipelines) ask for (else some would wait for placement forever)."""
    labels = labels if labels is not None else [{} for _ in nodes]
    others = others or {}
    total = replica_totals(deploy, stage_ids)
    for sid in stage_ids:
        dep = deploy.stage(sid)
        need = replica_resources(deploy.stage(sid))
        want = _plain(dep.labels)
        if any(all(node.get(k, 0.0) >= v for k, v in need.items()) and all(tags.get(k) == v for k, v in want.items())
               for node, tags in zip(nodes, labels, strict=True)):
            continue
        index = next((i for i, st in enumerate(deploy.stages) if st.stage_id == sid), None)
        if want and any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
            carried = "; ".join(", ".join(f"{k}={v}" for k, v in sorted(t.items()) if not k.startswith("ray.io/"))
                                or "none" for t in labels)
            raise ConfigError(f"{deploy.source}: stages[{index}].labels: no node of the Ray cluster with room for "
                              f"{need} carries {want} (nodes' labels: {carried})")
        where = f"stages[{index}].resources" if index is not None else f"stage {sid} (default resources)"
        offered = "; ".join(
            ", ".join(f"{k}={v:g}" for k, v in sorted(n.items()) if not k.startswith(("node:", "memory", "object_store")))
            for n in nodes
        )
        raise ConfigError(
            f"{deploy.source}: {where}: no node of the Ray cluster has {need} (nodes offer: {offered or 'nothing'})"
        )
    for k, want in sorted(total.items()):
        have = sum(node.get(k, 0.0) for node in nodes)
        if want + others.get(k, 0.0) > have + 1e-9:
            shared = (f" (and this server's other pipelines, which share the cluster, {k}={others[k]:g})"
                      if others.get(k) else "")
            raise ConfigError(
                f"{deploy.source}: stages: the replicas ask for {k}={want:g} in all{shared}, the Ray cluster has "
                f"{have:g} (a replica asks for CPU=1 unless its `resources` say otherwise)"
            )
