"""Shared test helpers: deploy builders, a running-orchestrator factory, leak checks."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import getpass
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# torch.compile's code (inductor, also vLLM's) goes to a folder of this run, removed after it,
# not to /tmp/torchinductor_<user>; set before anything imports inductor (it reads it at import).
_INDUCTOR = tempfile.mkdtemp(prefix="omni-test-inductor-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _INDUCTOR)
atexit.register(shutil.rmtree, _INDUCTOR, True)
# inductor's C++ precompiled headers (CPU compiles: vLLM's, llguidance's mask kernel, the compiled
# depth passes') ignore that variable and go to /tmp/torchinductor_<user>, shared by every process on
# the host: none are made (as the launcher sets for workers), so no test process's clean-up below can
# take one from under another's compile (one xdist worker ending while the other compiled, or another
# run). Whatever the run still wrote there goes after it (files newer than its start, then folders left
# empty), and the folder too if the run made it.
os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
# What a test server stores without a store of its own (get_store(): responses, files, batches, client
# secrets) goes to a folder of this run, never the user's `~/.cache/omni-actors/state`; prepared models
# (OMNI_DATA_DIR) are still read from the user's data directory.
# Read into this process's settings only: a server a test starts as a subprocess keeps its own data dir's.
_STATE = tempfile.mkdtemp(prefix="omni-test-state-")
atexit.register(shutil.rmtree, _STATE, True)
if "OMNI_STATE_DIR" not in os.environ:
    os.environ["OMNI_STATE_DIR"] = _STATE
    from omni_actors.settings import settings

    settings()  # (read once per process: a second import of this module finds them read)
    del os.environ["OMNI_STATE_DIR"]
_HEADERS = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
_STARTED = time.time() - 1.0


def _drop_written_since_start(folder: Path) -> None:
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()  # only when empty
            elif path.lstat().st_mtime >= _STARTED:
                path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


atexit.register(_drop_written_since_start, _HEADERS)
# pytest's tmp_path folders are kept only for failed tests (pyproject's tmp_path_retention_policy);
# after a green run their parent is empty and goes too.
_PYTEST_TMP = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"


def _drop_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (kept failures, another run's), or gone
        folder.rmdir()


atexit.register(_drop_if_empty, _PYTEST_TMP)
# The CUDA driver's file for this process's interprocess CUDA events (the GPU tests export some), which
# it leaves in /dev/shm; a worker's goes when it ends (Launcher.after_exit).


def _drop_driver_files() -> None:
    from omni_actors.bus.shm import unlink_driver_files

    unlink_driver_files(os.getpid())


atexit.register(_drop_driver_files)

from omni_actors.config.deploy import DeployConfig, build_deploy  # noqa: E402
from omni_actors.orchestrator.core import Orchestrator  # noqa: E402

SHM = Path("/dev/shm")


TF32_DEFAULTS = (False, True)
"""torch's own (cuda.matmul.allow_tf32, cudnn.allow_tf32)."""


def _backends() -> Any:
    """torch.backends once torch is fully imported (None before, or while another thread imports it)."""
    torch = sys.modules.get("torch")
    backends = getattr(torch, "backends", None)
    return backends if hasattr(backends, "cudnn") and hasattr(getattr(backends, "cuda", None), "matmul") else None


@pytest.fixture(autouse=True)
def _tf32_as_it_was() -> Any:
    """A CUDA stage loaded in-process may set TF32 for its process (Qwen2.5-Omni's code2wav does, as its
    worker would for itself); the next test's float32 comparisons must not run under it."""
    backends = _backends()
    before = TF32_DEFAULTS if backends is None else (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32)
    yield
    backends = _backends()
    if backends is not None:
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One vLLM cache folder (`engine_extras.cache_dir`) for the whole run. vLLM inspects a model class
    in a subprocess when its cache is new (~14 s per engine start on 2 cores); with the folder shared,
    only the run's first engine of each architecture pays it."""
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`make_tiny(name, seed=0)` once per run: modules that only read a tiny folder share it (a tiny
    Qwen-Omni takes ~3 s to write, and five modules read the same one). A test that changes a folder
    makes its own."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            from omni_actors.models.tiny import make_tiny

            made[name] = make_tiny(name, tmp_path_factory.mktemp("tiny") / name, seed=0)
        return made[name]

    return get


def make_deploy(pipeline: str = "synthetic", **raw: Any) -> DeployConfig:
    return build_deploy({"pipeline": pipeline, **raw}, source="test")


def shm_files(prefix: str) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"{prefix}*"))


async def eventually(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until `cond()` holds (test-side only; the runtime never polls)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def running(deploy: DeployConfig, **kw: Any) -> AsyncIterator[Orchestrator]:
    """An orchestrator with real workers; on exit checks that nothing was left behind."""
    orch = Orchestrator(deploy, **kw)
    await orch.start()
    try:
        yield orch
    finally:
        pids = [h.pid for hs in orch.workers.values() for h in hs if h.pid]
        await orch.stop()
        assert shm_files(orch.run_prefix) == [], "shared-memory segments left behind"
        assert orch.runtime is not None and not orch.runtime.path.exists(), "runtime dir left behind"
        for pid in pids:
            assert not _alive(pid), f"worker {pid} still running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
