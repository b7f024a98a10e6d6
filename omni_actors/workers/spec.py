"""WorkerSpec: everything a worker process needs, passed as JSON on its command line."""

from __future__ import annotations

import msgspec

from omni_actors.config.deploy import StageDeploy
from omni_actors.config.pipeline import StageSpec


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    endpoint: str
    identity: str
    """This process's bus identity and lease-producer name: stage, replica and generation, so a
    restarted worker never shares a ZeroMQ routing id with its dead predecessor."""
    stage: StageSpec
    deploy: StageDeploy
    replica: int
    generation: int
    model_path: str | None
    shm_prefix: str
    """Names of this worker's shared-memory segments start with this."""
    platform: str
    heartbeat_interval_s: float
    arrays: str = "shm"
    """How arrays cross to and from this worker: "shm" (it maps the orchestrator node's shared
    memory) or "frames" (message frames: it runs on another node)."""
    cuda_ipc: bool = False
    """CUDA tensors this worker outputs go as IPC handles (every consumer shares its one GPU)."""
    first_claims: bool = False
    """Say when a step makes some request's first output (deploy `first_output_priority`)."""
    curve: bool = False
    """The bus is CURVE-authenticated: the worker reads its keys from stdin (bus.sockets.read_curve_keys)."""


def identity_of(stage_id: int, replica: int, generation: int) -> str:
    return f"s{stage_id}r{replica}g{generation}"


HEARTBEAT_SUFFIX = b"/hb"
"""A worker's heartbeat socket's bus identity is its own plus this (workers/io.py)."""
