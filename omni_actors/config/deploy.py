"""Deploy YAML: placement and sizing of a pipeline, loaded and validated before anything starts.

    load_deploy(path, cli_overrides) -> DeployConfig   (raises ConfigError)
    load_deploys(path, cli_overrides) -> list[DeployConfig]   a file with `pipelines:` gives several

A file may hold several pipelines served by one server: a `pipelines` list whose
entries are each a deploy of one pipeline (`pipeline`, `model`, `stages`,
`async_chunk`, ... and `served_model_name`), and top-level fields (`server`,
`cluster`, defaults such as `async_chunk`) shared by all of them.

Field names follow vLLM-Omni's deploy files where they overlap, so its users'
files mostly load. Topology (sources, processors, execution types) is owned by
the pipeline in code; naming it here is an error.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import re
from pathlib import Path
from typing import Any

import msgspec
import yaml

from omni_actors import logs
from omni_actors.bus.shm import ARENA_BUDGET_BYTES
from omni_actors.config.pipeline import PipelineConfig, get_pipeline, pipeline_names
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
    """Longest a connection may go without sending a complete request head (a new connection, or
    an idle keep-alive one between requests); past it the connection is closed."""
    max_connections: int = 1024
    """Open client connections at most; at the cap a new one pushes out the oldest connection that
    has not sent a complete request head, else it is answered 503."""
    max_realtime_sessions: int = 16
    realtime_idle_timeout_s: float = 300.0
    realtime_max_audio_s: float = 1800.0
    """Most user audio one realtime session holds (input buffer + conversation items);
    past it an append or item is refused with an error event (~64 KB per second held)."""


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

    def device_list(self) -> list[str]:
        if self.devices is None:
            return []
        if isinstance(self.devices, str):
            return [d.strip() for d in self.devices.split(",") if d.strip()]
        return [str(d) for d in self.devices]

    @property
    def queue_limit(self) -> int:
        return self.max_queue if self.max_queue is not None else 8 * self.max_num_seqs


CLUSTER_BACKENDS = ("local", "ray")
ARRAY_PATHS = ("auto", "frames")


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


DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32", "float")
"""`dtype` values the stage engines accept (vLLM's names and their short forms)."""

TOPOLOGY_FIELDS = frozenset(
    {
        "input_sources", "execution_type", "model_stage", "final_output", "final_output_type",
        "owns_tokenizer", "engine_output_type", "sampling_constraints", "processor",
        "chunk_processor", "custom_process_input_func", "engine", "worker_type", "engine_input_source",
    }
)


def deep_merge(base: Any, over: Any) -> Any:
    """Merge `over` into `base`: dicts key by key, `stages` lists by stage_id, else replace."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, val in over.items():
            if key == "stages" and isinstance(val, list) and isinstance(out.get(key), list):
                out[key] = _merge_stages(out[key], val)
            else:
                out[key] = deep_merge(out[key], val) if key in out else copy.deepcopy(val)
        return out
    return copy.deepcopy(over)


def _merge_stages(base: list[Any], over: list[Any]) -> list[Any]:
    if not all(isinstance(s, dict) for s in (*base, *over)):
        return [*base, *copy.deepcopy(over)]  # not mergeable by id; validation names the bad entry
    by_id = {s.get("stage_id"): s for s in base}
    order = [s.get("stage_id") for s in base]
    for st in over:
        sid = st.get("stage_id")
        if sid in by_id:
            by_id[sid] = deep_merge(by_id[sid], st)
        else:
            by_id[sid] = st
            order.append(sid)
    return [by_id[sid] for sid in order]


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML would keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key.value!r} is given twice in one mapping", key.start_mark
                    )
                seen.add(key.value)
        return super().construct_mapping(node, deep)


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    if not isinstance(err, yaml.MarkedYAMLError) or mark is None:
        return f"{path}: not valid YAML: {err}".replace("\n", " ")
    msg = f"{path}: line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {err.problem}"
    if err.context and err.context_mark is not None:
        msg += f" ({err.context} at line {err.context_mark.line + 1})"
    return msg


def _read_yaml(path: Path, where: str) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"{where}: {path} is a directory; expected a YAML file")
    if not path.is_file():
        raise ConfigError(f"{where}: file not found: {path}")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_YamlLoader) or {}
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the file as UTF-8 text: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(path, err)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    return raw


def _load_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    raw = _read_yaml(path, f"{seen[-1]}: base_config" if seen else "deploy")
    base = raw.get("base_config")
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: base_config: expected a file path, got {type(base).__name__}")
    if base:
        base_path = (path.parent / str(base)).resolve()
        if base_path in seen or base_path == path.resolve():
            raise ConfigError(f"{path}: base_config: circular reference to {base_path}")
        raw = deep_merge(_load_raw(base_path, (*seen, path.resolve())), raw)
    return raw


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
    raw = _load_raw(path)
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
            if not getattr(st, name) > 0:  # (also refuses nan)
                raise ConfigError(f"{where}.{name}: expected a number > 0, got {getattr(st, name)}")
        if st.dtype not in DTYPES:
            raise ConfigError(f"{where}.dtype: expected one of {list(DTYPES)}, got {st.dtype!r}")
        devices = st.device_list()
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
        if not getattr(cfg.server, name) > 0:  # (also refuses nan)
            raise ConfigError(f"{src}: server.{name}: expected a number > 0, got {getattr(cfg.server, name)}")
    if cfg.server.max_connections < 1:
        raise ConfigError(f"{src}: server.max_connections: expected an integer >= 1, got {cfg.server.max_connections}")
    if cfg.server.max_realtime_sessions < 0:
        raise ConfigError(
            f"{src}: server.max_realtime_sessions: expected an integer >= 0, got {cfg.server.max_realtime_sessions}"
        )
    return pipe


def _validate_cluster(cfg: DeployConfig, src: str) -> None:
    """The `cluster` section and per-stage `resources` (reaching the cluster is checked at start)."""
    cl = cfg.cluster
    if cl.backend not in CLUSTER_BACKENDS:
        raise ConfigError(f"{src}: cluster.backend: expected one of {list(CLUSTER_BACKENDS)}, got {cl.backend!r}")
    if cl.arrays not in ARRAY_PATHS:
        raise ConfigError(f"{src}: cluster.arrays: expected one of {list(ARRAY_PATHS)}, got {cl.arrays!r}")
    if not cl.address.strip():
        raise ConfigError(f"{src}: cluster.address: expected a Ray address, \"auto\" or \"local\"")
    if cl.bus_host is not None and not cl.bus_host.strip():
        raise ConfigError(f"{src}: cluster.bus_host: expected an address of this host")
    for i, st in enumerate(cfg.stages):
        where = f"{src}: stages[{i}]"
        for name, amount in st.resources.items():
            if not amount >= 0:  # (also refuses nan)
                raise ConfigError(f"{where}.resources.{name}: expected a number >= 0, got {amount}")
        if cl.backend != "ray" and st.resources:
            raise ConfigError(f"{where}.resources: placement by resources needs `cluster: {{backend: ray}}`")
        if cl.backend == "ray" and st.devices is not None:
            raise ConfigError(
                f"{where}.devices: with cluster.backend ray, Ray assigns devices; "
                "ask for them with `resources: {GPU: n}` instead"
            )
    if cl.backend == "ray" and not _installed("ray"):
        raise ConfigError(f"{src}: cluster.backend: ray is not installed (pip install 'ray==2.60.*')")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (ValueError: blocked in sys.modules)
        return False


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
