"""Deploy `gpu_sharing`: a private NVIDIA MPS daemon for the stages of this run that share a GPU.

Stages placed on one GPU run in separate processes, and the GPU time-slices separate processes'
contexts: a speech decoder's window waits for the talker's slice to end and the other way round.
Under MPS (NVIDIA's Multi-Process Service) the processes' kernels go through one server and run
side by side. Measured on an H200 (docs/benchmarks.md, "Sixteenth session"), each against
time-slicing in the same session: Qwen2.5-Omni-3B-sized first audio 346-349 vs 371-378 ms at
concurrency 1 and 493-504 vs 541-561 ms p50 at 8; CSM-1B-sized first audio p99 at 16 streams
79-88 vs 97-128 ms, but its backbone step 13.7 vs 11.3-11.9 ms at one stream (real-time factor
0.17 vs 0.15) and 0.21-0.22 vs 0.18-0.19 at 16. So it is a trade, and off by default.

MPS is usually a host setting (one daemon, started by root). This needs none: the run starts its
own control daemon (`nvidia-cuda-mps-control -f`, a child of the main process) with its pipe and
log directories inside the run's private runtime directory, hands the run's GPU workers
CUDA_MPS_PIPE_DIRECTORY, and tells the daemon to quit after the workers have ended (its server
goes with it). Another daemon on the host (the host's own, another run's) keeps its own server
and clients. A run killed before it could quit its daemon leaves it to the next run's sweep
of stale runtime directories (`quit_stale`).

- `off` (the default): no daemon; each worker its own context, time-sliced.
- `auto`: on a CUDA host, local backend, when two or more of the run's worker processes share a
  GPU, `nvidia-cuda-mps-control` is on PATH, and the environment does not name an MPS pipe
  already (CUDA_MPS_PIPE_DIRECTORY: the host's daemon is then used as it is). A probe process
  then opens a CUDA context through the daemon; if that fails, the daemon goes and the workers
  run time-sliced, with a warning saying why.
- `mps`: the same whenever the run has a GPU worker; a missing binary or a failed probe is a
  start-up error.

MPS clients of one server also share its fate: a fatal GPU fault in one worker (an illegal
memory access) is reported to every worker on that GPU, where time-slicing confines it to the one
process; the supervisor restarts what dies either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from omni_actors import logs
from omni_actors.config.deploy import DeployConfig
from omni_actors.errors import ConfigError
from omni_actors.orchestrator.first_output import devices_of
from omni_actors.orchestrator.launcher import end_process

log = logs.get(__name__)

CONTROL = "nvidia-cuda-mps-control"
START_TIMEOUT_S = 10.0
"""How long the control daemon may take to say it listens."""
PROBE_TIMEOUT_S = 60.0
"""How long the probe may take to open a CUDA context through the daemon (the server starts then)."""
QUIT_TIMEOUT_S = 10.0
"""How long the daemon may take to quit once asked (its clients have ended by then)."""
READY_LINE = "Starting control daemon"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"

PROBE = """
import ctypes, sys
lib = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
                   ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev))):
    rc = getattr(lib, call)(*args)
    if rc:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        sys.exit(f"{call}: {(name.value or b'?').decode()} ({rc})")
lib.cuDevicePrimaryCtxRelease(dev)
"""
"""Run in a fresh interpreter under the daemon's pipe: a context opened through MPS, or the error."""


def _workers_per_gpu(deploy: DeployConfig, stage_ids: Iterable[int], platform: str) -> Counter[str]:
    """How many of the run's worker processes use each GPU (none off CUDA)."""
    if platform != "cuda":
        return Counter()
    return Counter(
        dev
        for sid in stage_ids
        for replica in range(deploy.stage(sid).num_replicas)
        for dev in devices_of(deploy, sid, replica, platform)
    )


def shared_devices(deploy: DeployConfig, stage_ids: Iterable[int], platform: str) -> list[str]:
    """The GPUs two or more of the run's worker processes share (sorted)."""
    return sorted(dev for dev, n in _workers_per_gpu(deploy, stage_ids, platform).items() if n >= 2)


def gpu_devices(deploy: DeployConfig, stage_ids: Iterable[int], platform: str) -> list[str]:
    """Every GPU a worker of the run uses (sorted)."""
    return sorted(_workers_per_gpu(deploy, stage_ids, platform))


def wanted(deploy: DeployConfig, stage_ids: Iterable[int], platform: str) -> tuple[list[str], str]:
    """(the GPUs to put under a private daemon, or [] for none; why, for the log)."""
    mode = deploy.gpu_sharing
    if mode == "off" or platform != "cuda" or deploy.cluster.backend != "local":
        return [], f"gpu_sharing {mode}, platform {platform}, backend {deploy.cluster.backend}"
    pick = gpu_devices if mode == "mps" else shared_devices
    devices = pick(deploy, stage_ids, platform)
    if not devices:
        return [], "no GPU is shared by two worker processes"
    if PIPE_ENV in os.environ:
        return [], f"{PIPE_ENV} is set: the workers use that daemon"
    if shutil.which(CONTROL) is None:
        if mode == "mps":
            raise ConfigError(f"{deploy.source}: gpu_sharing: mps needs NVIDIA's {CONTROL} on PATH (not found)")
        return [], f"{CONTROL} not on PATH"
    return devices, "shared" if mode == "auto" else "asked for"


class MpsDaemon:
    """One run's control daemon: `start`, the workers' `env`, then `stop` after they have ended."""

    def __init__(self, runtime_dir: Path, devices: list[str]) -> None:
        self.pipe_dir = runtime_dir / "mps"
        self.log_dir = runtime_dir / "mps-log"
        self.devices = devices
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def env(self) -> dict[str, str]:
        """What each worker's environment adds to reach the daemon."""
        return {PIPE_ENV: str(self.pipe_dir), LOG_ENV: str(self.log_dir)}

    async def start(self) -> None:
        """Start the daemon and open a context through it; raises RuntimeError if either fails
        (what was started is stopped first)."""
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(mode=0o700)
        env = {**os.environ, **self.env}
        env.pop("CUDA_VISIBLE_DEVICES", None)  # the server sees every GPU; each worker picks its own
        self.proc = await asyncio.create_subprocess_exec(
            CONTROL, "-f", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True,
        )
        listening: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(listening))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await listening
            await self._probe()
        except BaseException as err:
            await self.stop()
            if isinstance(err, TimeoutError):
                raise RuntimeError(f"{CONTROL} did not say it listens within {START_TIMEOUT_S:.0f} s") from None
            raise
        log.info("mps.started", pid=self.proc.pid, pipe_dir=str(self.pipe_dir), devices=self.devices)

    async def _read(self, listening: asyncio.Future[None]) -> None:
        """The daemon's log (its stdout in the foreground): the first line says it listens; the rest
        goes to this log at debug level."""
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if READY_LINE in line and not listening.done():
                listening.set_result(None)
            log.debug("mps.log", line=line)
        if not listening.done():
            listening.set_exception(RuntimeError(f"{CONTROL} exited with {await self.proc.wait()} before listening"))

    async def _probe(self) -> None:
        env = {**os.environ, **self.env}  # (the first GPU this process is shown, as an unplaced stage's)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PROBE, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=env,
        )
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                _, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"no CUDA context through MPS within {PROBE_TIMEOUT_S:.0f} s") from None
        if proc.returncode:
            lines = err.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"no CUDA context through MPS: {lines[-1] if lines else proc.returncode}")

    async def stop(self) -> None:
        """Ask the daemon to quit (it stops its server), wait for it; kill it if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(_quit, self.pipe_dir)
            await end_process(proc, QUIT_TIMEOUT_S)
        if self._reader is not None:
            await self._reader
        log.info("mps.stopped", returncode=proc.returncode)


def _quit(pipe_dir: Path) -> None:
    subprocess.run(
        [CONTROL], input=b"quit\n", env={**os.environ, PIPE_ENV: str(pipe_dir)}, timeout=QUIT_TIMEOUT_S,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
    )


def quit_stale(runtime_dir: Path) -> None:
    """Quit the daemon a dead run left behind (before its runtime directory goes)."""
    pipe = runtime_dir / "mps"
    if (pipe / "control").exists() and shutil.which(CONTROL) is not None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _quit(pipe)
