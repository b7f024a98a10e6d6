"""Worker process entry: `python -m omni_actors.workers.main '<WorkerSpec JSON>' <main pid>`.

The launcher has already set the environment (devices, one torch/OMP thread,
the stage's `env`) before this interpreter started, so torch sees it at import.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import msgspec

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.codec import PayloadCodec
from omni_actors.bus.shm import Arena, SegmentCache
from omni_actors.bus.sockets import read_curve_keys
from omni_actors.config.pipeline import resolve
from omni_actors.process_exit import exit_now
from omni_actors.settings import settings
from omni_actors.workers import step_profile
from omni_actors.workers.engine import EngineContext, StageEngine
from omni_actors.workers.io import WorkerIO
from omni_actors.workers.loading_progress import loading_progress
from omni_actors.workers.loop import WorkerLoop
from omni_actors.workers.spec import WorkerSpec

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PROCESS_NAME = b"omni-worker"
"""What `ps -o comm`, top and psutil's name() show for a worker (forked or a fresh interpreter)."""


def process_age_s() -> float:
    """Seconds since this process was forked (Linux /proc; 0.0 where that cannot be read).

    The kernel counts a process's start in clock ticks since boot, as CLOCK_BOOTTIME does in
    seconds, so the difference spans the interpreter's own start-up too (10 ms resolution).
    """
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime (after comm's ')')
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def _die_with_parent(parent: int, name: bytes = PROCESS_NAME) -> None:
    """Ask the kernel to SIGTERM us when `parent` goes away, and name this process `name`."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        libc.prctl(PR_SET_NAME, name)
    except OSError:
        pass
    if os.getppid() != parent:  # it went before we asked; we were adopted (by init or a subreaper)
        sys.exit(0)


class _Flags:
    """What the signal handler records, as plain attributes: a handler that takes a lock (as
    threading.Event.set does) deadlocks when a second signal lands while the first holds it, and a
    parent dying with several threads sends its death signal once per thread, at once."""

    stop = False
    """Set by the first SIGTERM; the heartbeat thread also checks it at each beat, in case the
    SystemExit it raised was swallowed (a signal that lands inside a finalizer is only printed there)."""
    cleaning = False
    """Set when the worker starts cleaning up: from then on SIGTERM and SIGALRM do nothing, so none
    can cut the cleanup short. (The handlers stay installed: setting SIG_IGN instead races a signal
    the C handler already took, which Python then reports as "Signal 15 ignored due to race condition".)"""


SIGNALS = _Flags()


IMPORT_RETRY_S = 0.05
"""How soon a SIGTERM that landed inside an import is tried again (imports finish in milliseconds)."""


def _importing(frame: FrameType | None) -> bool:
    """The main thread is inside an import: an exception raised there may cross a C++ extension's
    module init (nanobind, pybind11), where it ends the process by std::terminate."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if SIGNALS.cleaning:
        return
    if signum == signal.SIGTERM and SIGNALS.stop:
        return  # a repeat: a parent dying with several threads sends its death signal once per thread
    SIGNALS.stop = True
    if _importing(frame):
        signal.setitimer(signal.ITIMER_REAL, IMPORT_RETRY_S)  # raised once the import is over
        return
    raise SystemExit(0)


def _should_stop(parent: int) -> bool:
    """Asked at each heartbeat (on the heartbeat thread): the main process is gone, or a SIGTERM came."""
    if os.getppid() != parent:
        logs.get(__name__).warning("worker.orphaned", parent=parent)
        return True
    return SIGNALS.stop


def _limit_threads() -> None:
    if "torch" in sys.modules:
        import torch

        n = int(os.environ.get("OMP_NUM_THREADS", "1"))
        torch.set_num_threads(max(1, n))


def build_context(spec: WorkerSpec) -> EngineContext:
    st, dep = spec.stage, spec.deploy
    model_path = Path(spec.model_path).expanduser() if spec.model_path else None
    if model_path is not None and st.subdir:
        model_path = model_path / st.subdir
    return EngineContext(
        stage_id=st.stage_id,
        replica=spec.replica,
        model_stage=st.model_stage,
        model_path=model_path,
        device="cuda" if spec.platform == "cuda" else "cpu",
        max_num_seqs=dep.max_num_seqs,
        dtype=dep.dtype,
        gpu_memory_utilization=dep.gpu_memory_utilization,
        tensor_parallel_size=dep.tensor_parallel_size,
        default_sampling_params=dict(dep.default_sampling_params),
        sampling_constraints=dict(st.sampling_constraints),
        tool_parser=st.tool_parser,
        engine_extras={**st.engine_defaults, **dep.engine_extras, **(
            {"max_model_len": dep.max_model_len} if dep.max_model_len else {}
        ), **({"enforce_eager": True} if dep.enforce_eager else {})},
    )


def main(argv: list[str]) -> int:
    t_main = time.perf_counter()
    boot_s = process_age_s()
    spec = msgspec.json.decode(argv[1], type=WorkerSpec)
    parent = int(argv[2])
    _die_with_parent(parent)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGALRM, _on_sigterm)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <worker>` prints its stacks
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process leads shutdown
    logs.configure(component=spec.identity)
    log = logs.get(__name__)
    # The heartbeat thread starts first: it beats while the engine loads, and through every step.
    keys = read_curve_keys() if spec.curve else None
    sock = WorkerIO(spec.endpoint, spec.identity.encode(), spec.heartbeat_interval_s,
                    should_stop=lambda: _should_stop(parent), keys=keys)
    arena = (
        Arena(spec.shm_prefix, int(spec.deploy.shm_budget_mb * 2**20), settings().shm_idle_s)
        if spec.arrays == "shm" else None
    )
    segments = SegmentCache(settings().shm_idle_s)
    engine: StageEngine | None = None
    codec: PayloadCodec | None = None
    try:
        try:
            engine_cls = resolve(spec.stage.engine)
            ctx = build_context(spec)
            adapter = ctx.engine_extras.get("adapter")
            if isinstance(adapter, str):
                resolve(adapter)  # (its module's imports count as imports, not as the engine's start)
            t_imported = time.perf_counter()
            with loading_progress(stage=spec.stage.model_stage, replica=spec.replica):
                engine = engine_cls(ctx)
            _limit_threads()
            t_engine = time.perf_counter()
        except Exception as err:
            log.error("worker.start_failed", error=repr(err))
            sock.send([m.StartFailed(spec.stage.stage_id, spec.replica, f"{type(err).__name__}: {err}")])
            return 1
        startup = m.StartupPhases(
            boot_s=boot_s, imports_s=t_imported - t_main, engine_s=t_engine - t_imported,
            total_s=boot_s + time.perf_counter() - t_main, engine=dict(ctx.startup.phases),
        )
        info: dict[str, object] = {"arrays": spec.arrays}
        if engine.capacity is not None:
            info["capacity"] = int(engine.capacity)
        sock.send([m.Ready(spec.stage.stage_id, spec.replica, os.getpid(), info, startup)])
        codec = PayloadCodec(spec.identity, arena, segments, cuda_ipc=spec.cuda_ipc)
        profiler = step_profile.from_env(spec.stage.model_stage, spec.replica)
        WorkerLoop(spec.stage, engine, sock, codec, profiler, spec.first_claims).run()
        return 0
    finally:
        # Once cleaning up, no signal may cut it short (e.g. the parent-death signal arriving
        # after a Shutdown message ended the loop).
        SIGNALS.cleaning = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        if engine is not None:
            try:
                engine.close()
            except Exception as err:
                log.warning("worker.close_failed", error=repr(err))
        if codec is not None:
            codec.close()
        segments.close()
        if arena is not None:
            arena.close()
        sock.close()


if __name__ == "__main__":
    exit_now(main(sys.argv))
