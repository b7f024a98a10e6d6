"""A deploy checked against its pipeline: stage ids, sizes, devices, dtype, cluster and server limits.

    validate_against_pipeline(cfg, where) -> PipelineConfig   (raises ConfigError naming the field; its
        `speech` read from the model folder where the pipeline names a `speech_of` hook)
    check_override_stages(source, pipeline, stages)           (--stage-overrides keys are the pipeline's stages)
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from omni_actors.config.pipeline import PipelineConfig, get_pipeline, pipeline_names, resolve
from omni_actors.errors import ConfigError

if TYPE_CHECKING:
    from omni_actors.config.deploy import DeployConfig

CLUSTER_BACKENDS = ("local", "ray")
GPU_SHARING = ("auto", "mps", "off")
"""Deploy `gpu_sharing` (orchestrator/mps.py)."""
ARRAY_PATHS = ("auto", "frames")
DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32", "float")
"""`dtype` values the stage engines accept (vLLM's names and their short forms)."""


DEVICE_ID = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z/-]+")
"""A device as CUDA_VISIBLE_DEVICES names it: its index, or its UUID (nvidia-smi -L)."""


def check_override_stages(source: str, pipeline: object, stages: object) -> None:
    """`--stage-overrides` keys name stages of the pipeline (said by the key, not by its merged position)."""
    if not isinstance(pipeline, str) or pipeline not in pipeline_names() or not isinstance(stages, list):
        return  # (an unknown pipeline is reported by validate_against_pipeline)
    ids = get_pipeline(pipeline).stage_ids
    for st in stages:
        sid = st.get("stage_id") if isinstance(st, dict) else None
        if isinstance(sid, int) and sid not in ids:
            raise ConfigError(f"{source}: --stage-overrides: no stage {sid} in pipeline {pipeline!r} "
                              f"(stages {', '.join(map(str, ids))})")


def validate_against_pipeline(cfg: DeployConfig, where: str | None = None) -> PipelineConfig:
    """Check the deploy against its pipeline; messages start with `where` (default: its file)."""
    src = where or cfg.source
    try:
        pipe = get_pipeline(cfg.pipeline)
    except KeyError:
        raise ConfigError(
            f"{src}: pipeline: unknown pipeline {cfg.pipeline!r}; expected one of {pipeline_names()}"
        ) from None
    if cfg.model and not Path(cfg.model).expanduser().exists():
        raise ConfigError(f"{src}: model: path does not exist: {cfg.model}")
    if pipe.requires_model and not cfg.model and not pipe.preparer:
        # (with a preparer, `omni-run` prepares the pipeline's own default model folder)
        raise ConfigError(f"{src}: model: pipeline {pipe.name!r} needs a model path")
    seen: set[int] = set()
    for i, st in enumerate(cfg.stages):
        where = f"{src}: stages[{i}]"
        if st.stage_id not in pipe.stage_ids:
            raise ConfigError(
                f"{where}.stage_id: pipeline {pipe.name!r} has no stage {st.stage_id}; "
                f"expected one of {list(pipe.stage_ids)}"
            )
        if st.stage_id in seen:
            raise ConfigError(f"{where}.stage_id: stage {st.stage_id} is listed twice")
        seen.add(st.stage_id)
        for name in ("num_replicas", "max_num_seqs", "tensor_parallel_size", "max_queue", "max_model_len"):
            value = getattr(st, name)
            if value is not None and value < 1:
                raise ConfigError(f"{where}.{name}: expected an integer >= 1, got {value}")
        if not 0.0 < st.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"{where}.gpu_memory_utilization: expected a value in (0, 1], got {st.gpu_memory_utilization}"
            )
        for name in ("max_step_s", "shm_budget_mb"):
            if not _finite_positive(getattr(st, name)):
                raise ConfigError(f"{where}.{name}: expected a finite number > 0, got {getattr(st, name)}")
        if st.dtype not in DTYPES:
            raise ConfigError(f"{where}.dtype: expected one of {list(DTYPES)}, got {st.dtype!r}")
        devices = st.device_list()
        bad = next((d for d in devices if not DEVICE_ID.fullmatch(d)), None)
        if bad is not None:
            raise ConfigError(f"{where}.devices: {bad!r} is not a GPU: expected an index (0, 1, ...) or a "
                              "GPU-/MIG- UUID, as CUDA_VISIBLE_DEVICES takes them (not 'cuda:0')")
        need = st.tensor_parallel_size * st.num_replicas
        if devices and len(devices) != need:
            raise ConfigError(
                f"{where}.devices: {len(devices)} device(s) {devices} but tensor_parallel_size "
                f"x num_replicas = {st.tensor_parallel_size} x {st.num_replicas} = {need}"
            )
    _validate_cluster(cfg, src)
    if not 0 < cfg.server.port < 65536:
        raise ConfigError(f"{src}: server.port: expected 1..65535, got {cfg.server.port}")
    for name in ("max_body_mb", "body_timeout_s", "request_timeout_s", "realtime_idle_timeout_s",
                 "realtime_max_audio_s", "stream_buffer_mb", "write_timeout_s", "header_timeout_s"):
        if not _finite_positive(getattr(cfg.server, name)):
            raise ConfigError(f"{src}: server.{name}: expected a finite number > 0, got {getattr(cfg.server, name)}")
    _check_api_keys(cfg.server.api_keys, src)
    name = cfg.server.served_model_name
    if name is not None and (not name.strip() or name != name.strip()):
        raise ConfigError(f"{src}: server.served_model_name: expected a name without leading or trailing "
                          f"spaces, got {name!r}")
    if cfg.server.max_connections < 1:
        raise ConfigError(f"{src}: server.max_connections: expected an integer >= 1, got {cfg.server.max_connections}")
    if cfg.server.max_realtime_sessions < 0:
        raise ConfigError(
            f"{src}: server.max_realtime_sessions: expected an integer >= 0, got {cfg.server.max_realtime_sessions}"
        )
    if not 1 <= cfg.server.batch_lines_in_flight <= 256:
        raise ConfigError(f"{src}: server.batch_lines_in_flight: expected an integer from 1 to 256, got "
                          f"{cfg.server.batch_lines_in_flight}")
    return with_folder_speech(pipe, cfg.model)


def _finite_positive(value: float) -> bool:
    """> 0 and not inf (YAML's `.inf` would overflow the int byte counts and deadlines made from it) nor nan."""
    return value > 0 and math.isfinite(value)


def _check_api_keys(keys: list[str], src: str) -> None:
    """Each key must be one a client can present: a header value, which has no surrounding spaces
    (they are stripped), no control characters, and is not empty (an empty key matches no request)."""
    for i, key in enumerate(keys):
        if not key.strip():
            raise ConfigError(f"{src}: server.api_keys[{i}]: empty; no request could present it (is a variable "
                              "that should fill it unset?)")
        if key != key.strip():
            raise ConfigError(f"{src}: server.api_keys[{i}]: has leading or trailing spaces, which a request's "
                              "header cannot carry; remove them")
        if any(ord(c) < 32 or ord(c) == 127 for c in key):
            raise ConfigError(f"{src}: server.api_keys[{i}]: has a control character (a line break?), which a "
                              "request's header cannot carry")


def with_folder_speech(pipe: PipelineConfig, model: str | None) -> PipelineConfig:
    """The pipeline with its `speech` read from the model folder, where the pipeline says it differs per folder."""
    if not pipe.speech_of or not model:
        return pipe
    return msgspec.structs.replace(pipe, speech=resolve(pipe.speech_of)(Path(model).expanduser()))


def _validate_cluster(cfg: DeployConfig, src: str) -> None:
    """The `cluster` section and per-stage `resources` (reaching the cluster is checked at start)."""
    cl = cfg.cluster
    if cl.backend not in CLUSTER_BACKENDS:
        raise ConfigError(f"{src}: cluster.backend: expected one of {list(CLUSTER_BACKENDS)}, got {cl.backend!r}")
    if cl.arrays not in ARRAY_PATHS:
        raise ConfigError(f"{src}: cluster.arrays: expected one of {list(ARRAY_PATHS)}, got {cl.arrays!r}")
    ray_only = {"address": cl.address != "auto", "bus_host": cl.bus_host is not None, "arrays": cl.arrays != "auto"}
    if cl.backend != "ray" and (given := [name for name, set_ in ray_only.items() if set_]):
        raise ConfigError(f"{src}: cluster.{given[0]}: only used with `backend: ray` (without it every worker is a "
                          "child process of this host): add `backend: ray`, or remove it")
    if not cl.address.strip():
        raise ConfigError(f"{src}: cluster.address: expected a Ray address, \"auto\" or \"local\"")
    if cl.address.startswith("ray://"):
        raise ConfigError(f"{src}: cluster.address: {cl.address!r} is a Ray Client address: Ray Client sends every "
                          "call through cloudpickle and counts the head node as this one; run omni-run on a node "
                          "of the cluster with the head's host:port (its GCS port, 6379 by default) or \"auto\"")
    host, _, port = cl.address.rpartition(":")
    if "://" in cl.address or (cl.address not in ("auto", "local") and (
            not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536)):
        raise ConfigError(f"{src}: cluster.address: expected host:port, \"auto\" or \"local\", got {cl.address!r}")
    if cl.bus_host is not None and not cl.bus_host.strip():
        raise ConfigError(f"{src}: cluster.bus_host: expected an address of this host")
    for i, st in enumerate(cfg.stages):
        where = f"{src}: stages[{i}]"
        for name, amount in st.resources.items():
            if not (amount >= 0 and math.isfinite(amount)):  # (also refuses nan)
                raise ConfigError(f"{where}.resources.{name}: expected a finite number >= 0, got {amount}")
        if cl.backend != "ray" and st.resources:
            raise ConfigError(f"{where}.resources: placement by resources needs `cluster: {{backend: ray}}`")
        if cl.backend != "ray" and st.labels:
            raise ConfigError(f"{where}.labels: placement by node labels needs `cluster: {{backend: ray}}`")
        for name, value in st.labels.items():
            if not name.strip() or not value.strip():
                raise ConfigError(f"{where}.labels: expected non-empty names and values, got {name!r}: {value!r}")
        if cl.backend == "ray" and st.devices is not None:
            raise ConfigError(
                f"{where}.devices: with cluster.backend ray, Ray assigns devices; "
                "ask for them with `resources: {GPU: n}` instead"
            )
    if cfg.gpu_sharing not in GPU_SHARING:
        raise ConfigError(f"{src}: gpu_sharing: expected one of {list(GPU_SHARING)}, got {cfg.gpu_sharing!r}")
    if cfg.gpu_sharing == "mps" and cl.backend != "local":
        raise ConfigError(f"{src}: gpu_sharing: mps is for local workers; on a Ray cluster, start MPS on its nodes")
    if cl.backend == "ray" and not _installed("ray"):
        raise ConfigError(f"{src}: cluster.backend: ray is not installed (pip install 'ray==2.60.*')")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (ValueError: blocked in sys.modules)
        return False
