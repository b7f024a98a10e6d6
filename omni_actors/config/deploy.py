"""Deploy YAML: placement and sizing of a pipeline, loaded and validated before anything starts.

    load_deploy(path, cli_overrides) -> DeployConfig   (raises ConfigError)
    load_deploys(path, cli_overrides) -> list[DeployConfig]   a file with `pipelines:` gives several

A file may hold several pipelines served by one server: a `pipelines` list whose
entries are each a deploy of one pipeline (`pipeline`, `model`, `stages`,
`async_chunk`, ... and `served_model_name`), and top-level fields (`server`,
`cluster`, defaults such as `async_chunk`) shared by all of them.

Field names follow vLLM-Omni's deploy files where they overlap, so its users'
files mostly load. Topology (sources, processors, execution types) is owned by
the pipeline in code; naming it here is an error. Reading the YAML (base_config
chains): deploy_yaml.py; the checks against the pipeline: deploy_checks.py.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import msgspec

from omni_actors import logs
from omni_actors.bus.shm import ARENA_BUDGET_BYTES
from omni_actors.config.deploy_checks import check_override_stages, validate_against_pipeline
from omni_actors.config.deploy_yaml import deep_merge, load_raw
from omni_actors.errors import ConfigError
from omni_actors.settings import PLATFORMS, detect_platform

log = logs.get(__name__)

IGNORED_FIELDS = {
    "connectors": "data between stages always travels on this runtime's bus (shared memory), "
                  "so connector settings have no effect",
}
"""Top-level fields accepted for vLLM-Omni's files but without effect here: each warns at load."""


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = []
    served_model_name: str | None = None
    max_body_mb: float = 32.0
    body_timeout_s: float = 30.0
    """Longest wait for a request's body; a client slower than that (or one that declares more
    bytes than it sends) gets a 408 and the connection is closed."""
    request_timeout_s: float = 600.0
    stream_buffer_mb: float = 16.0
    """Most final output one request may hold that its client has not taken yet (the API reads
    it as the client reads); past it the request is aborted in every stage (a stalled reader)."""
    write_timeout_s: float = 30.0
    """Longest a response (HTTP or WebSocket) may wait for its client to take more bytes; past it
    the connection is closed, which aborts its request in every stage."""
    header_timeout_s: float = 15.0
    """Longest a new connection may wait before starting its request, and longest a request head
    may take from its first byte; past it the connection is closed. (Idle keep-alive connections
    between requests have their own, longer timeout: api/server.py KEEPALIVE_TIMEOUT_S.)"""
    max_connections: int = 1024
    """Open client connections at most; at the cap a new one pushes out the oldest connection
    waiting idle for a request head (never one just opened), else it is answered 503."""
    max_realtime_sessions: int = 16
    realtime_idle_timeout_s: float = 300.0
    realtime_max_audio_s: float = 1800.0
    """Most user audio one realtime session holds (input buffer + conversation items);
    past it an append or item is refused with an error event (~64 KB per second held)."""
    batch_lines_in_flight: int = 4
    """Batch lines (/v1/batches) the server runs at once over all its batches, 1-256; each is a request
    to the server itself, so they take places in the stages' queues as clients' requests do."""


class StageDeploy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    stage_id: int
    devices: str | list[int] | None = None
    num_replicas: int = 1
    max_num_seqs: int = 8
    max_queue: int | None = None
    """Requests admitted per replica before 429; default 8 x max_num_seqs."""
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    max_model_len: int | None = None
    dtype: str = "auto"
    default_sampling_params: dict[str, Any] = {}
    engine_extras: dict[str, Any] = {}
    env: dict[str, str] = {}
    shm_budget_mb: float = ARENA_BUDGET_BYTES / 2**20
    """Bytes of shared memory (MiB) a worker of this stage may have leased to consumers; at the
    budget its engine waits for them to give leases back."""
    max_step_s: float = 1800.0
    """Longest one engine step may run before the worker is presumed stuck, killed and restarted
    (its requests fail). Heartbeats flow during steps, so a long step alone never kills a worker."""
    resources: dict[str, float] = {}
    """With `cluster.backend: ray`: Ray resources per replica (GPU, CPU, custom, "node:<ip>")."""
    labels: dict[str, str] = {}
    """With `cluster.backend: ray`: node labels a replica's node must carry (Ray label selectors:
    "value", or Ray's "!value", "in(a,b)", "!in(a,b)"), e.g. {"zone": "eu-1"}."""

    def device_list(self) -> list[str]:
        if self.devices is None:
            return []
        if isinstance(self.devices, str):
            return [d.strip() for d in self.devices.split(",") if d.strip()]
        return [str(d) for d in self.devices]

    @property
    def queue_limit(self) -> int:
        return self.max_queue if self.max_queue is not None else 8 * self.max_num_seqs




class ClusterConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Where workers run: `local` child processes (default) or Ray actors (`ray`)."""

    backend: str = "local"
    address: str = "auto"
    """A Ray address; "auto" = the cluster this host belongs to; "local" = start one in-process."""
    bus_host: str | None = None
    """The address of this host where the orchestrator's TCP bus listens, or 0.0.0.0 (default:
    this host's address in the cluster)."""
    arrays: str = "auto"
    """How arrays reach a worker: "auto" (shared memory on the orchestrator's node, message
    frames elsewhere) or "frames" (always frames: the cross-node path, for tests and benchmarks)."""


class DeployConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pipeline: str
    model: str | None = None
    async_chunk: bool = True
    first_output_priority: bool | None = None
    """Stages that share a device hold their steps while one of them computes some request's first
    output (a speech decoder's first window): first audio does not wait on the GPU behind the
    stages still decoding the same requests. None (the default): among stages on GPUs (a stage
    without `devices` on a CUDA host is on GPU 0); true: CPU stages too (they share the host);
    false: never. Local deployments
    only (a cluster's workers on other hosts share nothing)."""
    gpu_sharing: str = "off"
    """How worker processes on one GPU share it: "off" (the default: the GPU time-slices their
    contexts), "auto" (a private NVIDIA MPS daemon for the run when two or more of its workers share
    a GPU and the host has MPS, else time-sliced), "mps" (a daemon whenever the run has a GPU
    worker, or a start-up error). MPS gave earlier first audio on an H200 but slower AR steps
    (docs/guides/gpus.md). Local deployments only (orchestrator/mps.py)."""
    server: ServerConfig = ServerConfig()
    cluster: ClusterConfig = ClusterConfig()
    stages: list[StageDeploy] = []
    connectors: dict[str, Any] = {}
    """Accepted from vLLM-Omni files and ignored (with a warning naming it): data between stages
    always travels on this runtime's bus."""
    platforms: dict[str, Any] = {}
    base_config: str | None = None
    source: str = "<deploy>"
    """The file this came from (set by the loader, for messages)."""

    def stage(self, stage_id: int) -> StageDeploy:
        for st in self.stages:
            if st.stage_id == stage_id:
                return st
        return StageDeploy(stage_id=stage_id)


TOPOLOGY_FIELDS = frozenset(
    {
        "input_sources", "execution_type", "model_stage", "final_output", "final_output_type",
        "owns_tokenizer", "engine_output_type", "sampling_constraints", "processor",
        "chunk_processor", "custom_process_input_func", "engine", "worker_type", "engine_input_source",
    }
)


_AT = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$", re.S)


_UNKNOWN = re.compile(r"^Object contains unknown field `(.*)`$", re.S)


def _format_validation(source: str, err: msgspec.ValidationError) -> str:
    match = _AT.match(str(err))
    msg, path = (match.group(1), match.group(2)) if match else (str(err), None)
    path = (path or "").lstrip(".")
    unknown = _UNKNOWN.match(msg)
    if unknown:
        msg = f"unknown field `{unknown.group(1)}`{_did_you_mean(path, unknown.group(1))}"
    return f"{source}: {path or '(top level)'}: {msg[0].lower() + msg[1:] if msg else msg}"


def _did_you_mean(path: str, name: str) -> str:
    """"; did you mean `x`?" when `name` is close to a field of the struct at `path`."""
    last = path.rpartition(".")[2]
    struct = (
        DeployConfig if not path else ServerConfig if last == "server"
        else ClusterConfig if last == "cluster"
        else StageDeploy if last.startswith("stages[") else None
    )  # fmt: skip
    fields = [f for f in getattr(struct, "__struct_fields__", ()) if f != "source"]
    close = difflib.get_close_matches(name, fields, n=1)
    return f"; did you mean `{close[0]}`?" if close else ""


def _check_topology_fields(source: str, raw: dict[str, Any]) -> None:
    stages = raw.get("stages")
    for i, st in enumerate(stages if isinstance(stages, list) else []):
        if isinstance(st, dict):
            bad = sorted(TOPOLOGY_FIELDS & set(st))
            if bad:
                raise ConfigError(
                    f"{source}: stages[{i}].{bad[0]}: is a topology field owned by the pipeline "
                    f"{raw.get('pipeline')!r} in code; remove it from the deploy file"
                )


def build_deploy(raw: dict[str, Any], source: str, overrides: dict[str, Any] | None = None) -> DeployConfig:
    """Validate a raw mapping (already merged) into a DeployConfig."""
    _check_topology_fields(source, raw)
    platforms, platform = raw.get("platforms"), detect_platform()
    for name, over in (platforms.items() if isinstance(platforms, dict) else ()):
        if name not in PLATFORMS:
            raise ConfigError(f"{source}: platforms.{name}: unknown platform; expected one of {list(PLATFORMS)}")
        if not isinstance(over, dict):
            raise ConfigError(
                f"{source}: platforms.{name}: expected a mapping of deploy fields, got {type(over).__name__}"
            )
        if name != platform:  # not applied on this machine, but checked now rather than on that one
            other = {**deep_merge(raw, over), "source": source}
            other.pop("base_config", None)
            _check_topology_fields(f"{source}: platforms.{name}", other)
            try:
                msgspec.convert(other, DeployConfig)
            except msgspec.ValidationError as err:
                raise ConfigError(_format_validation(f"{source} (with platforms.{name})", err)) from None
    if isinstance(platforms, dict) and platform in platforms:
        raw = deep_merge(raw, platforms[platform])
    where = source
    if overrides:
        raw = deep_merge(raw, overrides)
        _check_topology_fields("--stage-overrides", raw)
        check_override_stages(f"{source} (with command-line overrides)", raw.get("pipeline"), overrides.get("stages"))
        where = f"{source} (with command-line overrides)"
    raw = {**raw, "source": source}
    raw.pop("base_config", None)
    try:
        cfg = msgspec.convert(raw, DeployConfig)
    except msgspec.ValidationError as err:
        raise ConfigError(_format_validation(where, err)) from None
    validate_against_pipeline(cfg, where)
    for name, reason in IGNORED_FIELDS.items():
        if raw.get(name):
            log.warning("config.field_ignored", deploy=source, field=name, reason=reason)
    return cfg


def load_deploy(path: str | Path, overrides: dict[str, Any] | None = None) -> DeployConfig:
    """Read, merge (base_config, platforms, CLI overrides) and validate a deploy file of one pipeline."""
    deploys = load_deploys(path, overrides)
    if len(deploys) != 1:
        raise ConfigError(f"{path}: pipelines: expected one pipeline here, the file lists {len(deploys)}")
    return deploys[0]


def load_deploys(path: str | Path, overrides: dict[str, Any] | None = None) -> list[DeployConfig]:
    """Read and validate a deploy file: one DeployConfig per pipeline it lists (see the module doc)."""
    path = Path(path)
    raw = load_raw(path)
    if "pipelines" not in raw:
        return [build_deploy(raw, str(path), overrides)]
    return split_pipelines(raw, str(path), overrides)


PIPELINE_ONLY = ("pipeline", "model", "stages")
"""Fields that belong to one pipeline: with `pipelines`, in each entry, not at the top level."""
SHARED_ONLY = ("server", "cluster")
"""Fields one server shares: with `pipelines`, at the top level only."""


def split_pipelines(raw: dict[str, Any], source: str, overrides: dict[str, Any] | None = None) -> list[DeployConfig]:
    """A mapping with a `pipelines` list -> one validated DeployConfig per entry (top-level fields shared)."""
    entries = raw.get("pipelines")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: pipelines: expected a non-empty list of pipeline deploys")
    common = {k: v for k, v in raw.items() if k != "pipelines"}
    for key in PIPELINE_ONLY:
        if key in common:
            raise ConfigError(f"{source}: {key}: with `pipelines`, each entry names its own {key}; "
                              "move it into the entries")
    deploys = []
    for i, entry in enumerate(entries):
        where = f"{source}: pipelines[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping (pipeline, model, stages, ...), got {type(entry).__name__}")
        for key in SHARED_ONLY:
            if key in entry:
                raise ConfigError(f"{where}.{key}: one server serves every pipeline; set `{key}` at the top level "
                                  "(per pipeline: served_model_name)")
        own = {k: v for k, v in entry.items() if k != "served_model_name"}
        merged = deep_merge(common, own)
        if entry.get("served_model_name") is not None:
            merged["server"] = {**merged.get("server", {}), "served_model_name": entry["served_model_name"]}
        deploys.append(build_deploy(merged, where, overrides))
    check_distinct(deploys)
    return deploys


def model_id(deploy: DeployConfig) -> str:
    """The name a pipeline answers to first: its served name, else its pipeline's name."""
    return deploy.server.served_model_name or deploy.pipeline


def check_distinct(deploys: list[DeployConfig]) -> None:
    """Pipelines of one server must answer to different names (ConfigError naming both)."""
    seen: dict[str, DeployConfig] = {}
    for dep in deploys:
        name = model_id(dep)
        if name in seen:
            raise ConfigError(f"{dep.source}: served_model_name: {name!r} is also the name of {seen[name].source}; "
                              "give each pipeline its own served_model_name")
        seen[name] = dep
    # A request's `model` also reaches a pipeline by its pipeline's name (api/pipelines.py): a served
    # name that is another kind of pipeline's name would hide one of the two.
    for dep in deploys:
        name = dep.server.served_model_name
        other = next((o for o in deploys if o is not dep and o.pipeline == name != dep.pipeline), None)
        if other is not None:
            raise ConfigError(f"{dep.source}: served_model_name: {name!r} is also the name of pipeline "
                              f"{other.pipeline!r} ({other.source}); give this pipeline another served_model_name")


def parse_stage_overrides(text: str) -> dict[str, Any]:
    """`--stage-overrides '{"0": {...}}'` -> a deploy overlay {"stages": [...]}."""
    try:
        data = msgspec.json.decode(text)
    except msgspec.DecodeError as err:
        raise ConfigError(f"--stage-overrides: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError("--stage-overrides: expected a JSON object keyed by stage id")
    stages = []
    for key, val in data.items():
        if not isinstance(val, dict) or not str(key).lstrip("-").isdigit():
            raise ConfigError(f"--stage-overrides: {key!r}: expected a stage id mapped to an object")
        stages.append({**val, "stage_id": int(key)})
    return {"stages": stages}
