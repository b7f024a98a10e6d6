"""Starting and ending worker processes: one per stage replica, each with its own environment.

Workers are fresh interpreters (`python -m omni_actors.workers.main`), so the
device mask, thread counts and the stage's `env` are in place before torch is
imported. Each carries its spec as JSON on the command line (no pickle). A CPU
worker whose environment is the plain one (no devices, no stage `env`) is forked
instead from this process's zygote, which imported torch and transformers once
(zygote.py; OMNI_WORKER_ZYGOTE=0 turns that off).

Where they run is a backend, picked by the deploy's `cluster.backend`:
`Launcher` (local: child processes of this one, an ipc bus) or
`ray_backend.RayLauncher` (Ray actors, a CURVE tcp bus), imported only then.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import re
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
import zmq

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.shm import unlink_driver_files
from omni_actors.bus.sockets import BusAuth, RuntimeDir
from omni_actors.config.deploy import DeployConfig
from omni_actors.config.pipeline import PipelineConfig
from omni_actors.orchestrator import zygote
from omni_actors.orchestrator.first_output import claims_first_outputs
from omni_actors.orchestrator.worker_stderr import WorkerStderr
from omni_actors.settings import settings
from omni_actors.workers.spec import WorkerSpec, identity_of

log = logs.get(__name__)

HEARTBEAT_INTERVAL_S = 1.0
"""How often an idle (or busy) worker tells the orchestrator it is alive."""
WORKER_EXIT_TIMEOUT_S = 10.0
"""Grace after Shutdown/SIGTERM before a worker is killed."""

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


class WorkerProcess(Protocol):
    """What the supervisor needs of a worker process: asyncio's Process, or a Ray actor's stand-in."""

    @property
    def pid(self) -> int | None: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


@dataclass(eq=False)
class WorkerHandle:
    """The orchestrator's view of one worker process (one generation of a replica)."""

    stage_id: int
    replica: int
    generation: int
    identity: bytes
    producer: str
    shm_prefix: str
    proc: WorkerProcess | None = None
    ready: bool = False
    dead: bool = False
    in_flight: int = 0
    engine_requests: int = 0
    leases_out: int = 0
    last_seen: float = 0.0
    ready_future: asyncio.Future[None] | None = None
    requests: set[str] = field(default_factory=set)
    ready_at: float = 0.0
    capacity: int | None = None
    """Most requests its engine said it holds at once (Ready; None: it did not say)."""
    responsive: bool = True
    """False while a Ready worker has been silent past the supervisor's unresponsive threshold."""
    steps: int = 0
    """Engine steps the worker reported done (last heartbeat)."""
    step_s: float = 0.0
    """How long its running step had run at the last heartbeat (0: none was running)."""
    busy_s: float = 0.0
    """Seconds the worker reported spending in completed engine steps (last heartbeat)."""
    step_counts: list[int] = field(default_factory=list)
    """Its completed steps per duration bucket (m.STEP_BUCKETS_S; last heartbeat)."""
    stderr: WorkerStderr | None = None
    """The pipe its stderr goes to, read as JSON log lines (JSON logs, local workers; worker_stderr.py)."""
    beat_at: float = 0.0
    """time.monotonic() when that heartbeat arrived."""
    spawned_at: float = 0.0
    """time.monotonic() when the supervisor asked for the process."""
    startup: m.StartupPhases | None = None
    """The worker's own account of its start-up (its Ready)."""

    def step_running_s(self, now: float) -> float:
        """How long the running step has run by `now`: the last heartbeat's report plus its age
        (0 when that heartbeat saw no step; a step that ended since counts until the next beat)."""
        return self.step_s + max(0.0, now - self.beat_at) if self.step_s > 0 else 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def startup_seconds(self) -> dict[str, float]:
        """Seconds per start-up phase, rounded to ms ({} before Ready): "ready" (spawn -> Ready,
        seen from here), the worker's "boot", "imports", "engine" and "total", and inside "engine"
        the phases the engine timed, as "engine.<name>" (bus.messages.StartupPhases)."""
        if not self.ready_at:
            return {}
        out = {"ready": round(self.ready_at - self.spawned_at, 3)}
        st = self.startup
        if st is not None:
            out.update(boot=round(st.boot_s, 3), imports=round(st.imports_s, 3), engine=round(st.engine_s, 3),
                       total=round(st.total_s, 3))
            out.update({f"engine.{k}": round(v, 3) for k, v in st.engine.items()})
        return out


def make_launcher(deploy: DeployConfig, pipeline: PipelineConfig, run_prefix: str, platform: str) -> Launcher:
    """The deploy's backend (Ray is imported only when `cluster.backend` is ray)."""
    if deploy.cluster.backend == "ray":
        from omni_actors.orchestrator.ray_backend import RayLauncher

        return RayLauncher(deploy, pipeline, "", run_prefix, platform)
    return Launcher(deploy, pipeline, "", run_prefix, platform)


class Launcher:
    """The local backend: each worker a child process on this host, on an ipc bus."""

    auth: BusAuth | None = None
    """The bus's CURVE keys (a tcp:// bus only)."""

    def __init__(
        self, deploy: DeployConfig, pipeline: PipelineConfig, endpoint: str, run_prefix: str, platform: str
    ) -> None:
        self.deploy = deploy
        self.pipeline = pipeline
        self.endpoint = endpoint
        self.run_prefix = run_prefix
        self.platform = platform
        self.gpu_env: dict[str, str] = {}
        """Set over every GPU worker's environment (the run's MPS daemon, orchestrator/mps.py)."""

    async def open(self, ctx: zmq.Context) -> None:
        """Get ready to start workers (the ray backend connects to its cluster here)."""

    def bus_endpoint(self, runtime: RuntimeDir) -> str:
        """Where the orchestrator's ROUTER binds."""
        return runtime.endpoint("bus.sock")

    def local_endpoint(self, runtime: RuntimeDir) -> str | None:
        """A second, plain ipc endpoint for workers on this host beside a tcp:// bus (the ray backend's)."""
        return None

    def set_bound(self, bound: str, local: str | None = None) -> None:
        """The ROUTER's bound endpoint(s); workers connect to what this makes of them."""
        self.endpoint = bound

    async def close(self) -> None:
        """After every worker has ended: let go of what `open` took."""

    def after_exit(self, handle: WorkerHandle) -> None:
        """A worker process of this host has ended: read the rest of its stderr, remove what the
        CUDA driver left of it."""
        if handle.stderr is not None:
            handle.stderr.close()
            handle.stderr = None
        if handle.pid:
            unlink_driver_files(handle.pid)

    def new_handle(self, stage_id: int, replica: int, generation: int) -> WorkerHandle:
        ident = identity_of(stage_id, replica, generation)
        return WorkerHandle(
            stage_id=stage_id, replica=replica, generation=generation, identity=ident.encode(),
            producer=ident, shm_prefix=f"{self.run_prefix}-{ident}",
        )

    def _env(self, stage_id: int, replica: int) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.update(stage_env(self.deploy, stage_id, replica))
        if self.platform == "cuda":
            env.update(self.gpu_env)
        return env

    def worker_spec(self, handle: WorkerHandle) -> WorkerSpec:
        stage = self.pipeline.stage(handle.stage_id)
        return WorkerSpec(
            endpoint=self.endpoint,
            identity=handle.identity.decode(),
            stage=stage,
            deploy=self.deploy.stage(handle.stage_id),
            replica=handle.replica,
            generation=handle.generation,
            model_path=self.deploy.model,
            shm_prefix=handle.shm_prefix,
            platform=self.platform,
            heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
            curve=self.auth is not None,
            cuda_ipc=self.cuda_ipc_ok(handle.stage_id),
            first_claims=claims_first_outputs(self.deploy, handle.stage_id, self.platform),
        )

    def cuda_ipc_ok(self, stage_id: int) -> bool:
        """May this stage's CUDA tensors cross as IPC handles? Only when every stage it feeds runs
        on its one device, on this host, and the orchestrator reads none of its outputs."""
        stage = self.pipeline.stage(stage_id)
        consumers = [s.stage_id for s in self.pipeline.stages if stage_id in s.input_sources]
        mine = self.deploy.stage(stage_id).device_list()
        return (
            self.platform == "cuda" and self.auth is None and not stage.final_output and bool(consumers)
            and len(mine) == 1 and all(self.deploy.stage(c).device_list() == mine for c in consumers)
        )

    async def spawn(self, handle: WorkerHandle) -> None:
        ws = self.worker_spec(handle)
        spec = msgspec.json.encode(ws).decode()
        env = self._env(handle.stage_id, handle.replica)
        pipe = WorkerStderr(handle.stage_id, handle.replica, ws.identity) if logs.json_logs() else None
        try:
            await self._start(handle, ws, spec, env, 2 if pipe is None else pipe.child_fd)
        except BaseException:
            if pipe is not None:
                pipe.close()
            raise
        if pipe is not None:
            pipe.spawned()
            handle.stderr = pipe

    async def _start(self, handle: WorkerHandle, ws: WorkerSpec, spec: str, env: dict[str, str],
                     stderr_fd: int) -> None:
        if self.platform == "cpu" and settings().worker_zygote and env == worker_env():
            z = zygote.shared(env)
            if z is not None:
                adapter = {**ws.stage.engine_defaults, **ws.deploy.engine_extras}.get("adapter")
                imports = (adapter.partition(":")[0],) if isinstance(adapter, str) else ()
                try:
                    handle.proc = await z.fork(spec, env, ws.stage.engine, imports, stderr_fd=stderr_fd,
                                               stdout_fd=1 if stderr_fd == 2 else stderr_fd)
                    return
                except zygote.ZygoteGone as err:
                    log.info("launcher.fork_failed", error=str(err), hint="starting a fresh interpreter")
        handle.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "omni_actors.workers.main", spec, str(os.getpid()),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=None if stderr_fd == 2 else stderr_fd,
            stdout=None if stderr_fd == 2 else stderr_fd,  # (JSON logs: its prints are events too)
            # Out of the terminal's process group: Ctrl-C reaches the main process only, which
            # leads the shutdown (a worker still starting would die of it with a traceback).
            start_new_session=True,
        )


COMPILE_CACHE = "compile-cache"
"""Under the data directory: torch.compile's code (TORCHINDUCTOR_CACHE_DIR unless set), so a restart (or a
reboot) loads the compiled kernels instead of compiling them again; set for every worker, since importing
transformers' or diffusers' models makes inductor's default folder (/tmp/torchinductor_<user>) even
where nothing compiles."""


def _compile_cache_env() -> dict[str, str]:
    """The data directory's compile cache, unless the host names a folder of its own. Inductor's
    default counts as none: torch writes it into os.environ the first time anything in this
    process asks inductor for its folder (importing some models does). Inductor's precompiled C++
    headers (CPU compiles) ignore that folder and would go to /tmp/torchinductor_<user>: none are
    made unless the host asks (TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS); a CPU compile of ours
    measured no slower without them."""
    env = {} if "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS" in os.environ else {
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current and current != _inductor_default_dir():
        return env
    return {**env, "TORCHINDUCTOR_CACHE_DIR": str(settings().data_dir / COMPILE_CACHE)}


def _inductor_default_dir() -> str:
    """torch._inductor's default_cache_dir(), without importing torch."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


_PLAIN_ENV = {**dict.fromkeys(THREAD_ENV, "1"), "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
"""What every worker's environment sets over its host's."""


def _log_env() -> dict[str, str]:
    """With JSON logs, no library's tqdm bar (vLLM's "Loading safetensors checkpoint shards") writes
    plain text among the JSON lines; the loading bars we report go through workers/loading_progress.py."""
    return {"TQDM_DISABLE": "1"} if logs.json_logs() else {}


def worker_env() -> dict[str, str]:
    """The environment of a worker with no devices and no stage `env` (a zygote's)."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(_PLAIN_ENV)
    env.update(_log_env())
    env.update(_compile_cache_env())
    return env


def stage_env(deploy: DeployConfig, stage_id: int, replica: int) -> dict[str, str]:
    """What a stage's worker environment sets over its host's: threads, devices, the stage's `env`."""
    dep = deploy.stage(stage_id)
    env = {**_PLAIN_ENV, **_log_env(), **_compile_cache_env()}
    devices = dep.device_list()
    if devices:
        tp = dep.tensor_parallel_size
        mine = devices[replica * tp : (replica + 1) * tp]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    env.update({k: str(v) for k, v in dep.env.items()})
    return env


async def end_process(
    proc: WorkerProcess,
    timeout_s: float = WORKER_EXIT_TIMEOUT_S,
    first_signal: signal.Signals | None = None,
) -> None:
    """Wait for a process asked to exit (or send `first_signal`); SIGTERM, then SIGKILL, if it lingers."""
    for sig in (first_signal, signal.SIGTERM, signal.SIGKILL):
        if proc.returncode is not None:
            return
        if sig is not None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                return
        try:
            async with asyncio.timeout(timeout_s):
                await proc.wait()
            return
        except TimeoutError:
            continue
