"""Process-wide settings that are not per deployment, read from the environment once.

    settings() -> Settings      (read on first use; ConfigError naming the variable and its form)
    check_data_dir(path)        (OMNI_DATA_DIR created if missing and writable, else a ConfigError)
    check_runtime_dir(path)     (OMNI_RUNTIME_DIR likewise, and short enough for the run's ipc sockets)

Read on first use, not at import: `omni-run` checks them before anything else and
answers a bad value with one line and exit status 2 (cli.py), never a traceback.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omni_actors.bus.shm import SHM_IDLE_S
from omni_actors.errors import ConfigError

PLATFORMS = ("cpu", "cuda")
CUDA_IPC_PATHS = ("allocation", "torch")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    """Where prepared model files are cached (OMNI_DATA_DIR)."""
    state_dir: Path
    """Where what clients come back for is kept: the SQLite store of responses, files, batches, voices,
    video jobs (OMNI_STATE_DIR; default `<OMNI_DATA_DIR>/state`)."""
    runtime_parent: Path
    """Parent of each run's private 0700 runtime directory (OMNI_RUNTIME_DIR)."""
    log_level: str
    log_json: bool
    platform: str | None
    """Force "cpu" or "cuda" instead of detecting it (OMNI_PLATFORM)."""
    shm_idle_s: float
    """Shared-memory segments free (or mappings unused) this long go back to the OS (OMNI_SHM_IDLE_S)."""
    max_input_audio_s: float = 3600.0
    """Longest client audio decoded, in seconds (OMNI_MAX_INPUT_AUDIO_S): chat `input_audio`,
    transcription uploads and realtime items; past it a 400 before any sample is decoded."""
    input_audio_min_rate_hz: int = 8000
    """Lowest client audio sample rate accepted (OMNI_INPUT_AUDIO_MIN_RATE_HZ): a WAV declaring
    1 Hz would otherwise resample to 16,000 times its sample count."""
    input_audio_max_rate_hz: int = 192_000
    """Highest client audio sample rate accepted (OMNI_INPUT_AUDIO_MAX_RATE_HZ)."""
    cuda_ipc_path: str = "allocation"
    """How CUDA tensors cross between stages on one GPU (OMNI_CUDA_IPC): "allocation" (the
    allocation's IPC handle, mapped once; torch's reduction where it cannot) or "torch" (torch's
    per-tensor reduction only)."""
    worker_zygote: bool = True
    """Fork CPU workers from one zygote that imported torch and transformers once
    (OMNI_WORKER_ZYGOTE, "1" or "0"; orchestrator/zygote.py), instead of a fresh interpreter each."""


def _number(env: Mapping[str, str], name: str, default: float, kind: type = float):
    """A positive number from the environment, or `default` when unset."""
    raw = env.get(name)
    if not raw:
        return default
    form = "a positive integer" if kind is int else "a positive number"
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected {form}, got {raw!r}") from None
    if not value > 0:  # (nan too)
        raise ConfigError(f"{name}: expected {form}, got {raw!r}")
    return value


def _choice(env: Mapping[str, str], name: str, default: str | None, choices: tuple[str, ...]) -> str | None:
    raw = env.get(name)
    if not raw:
        return default
    if raw.lower() not in choices:
        raise ConfigError(f"{name}: expected one of {list(choices)}, got {raw!r}")
    return raw.lower()


def read(env: Mapping[str, str]) -> Settings:
    """Settings from `env`; a bad value is a ConfigError naming the variable and the expected form."""
    data_dir = Path(env.get("OMNI_DATA_DIR") or Path.home() / ".cache" / "omni-actors")
    out = Settings(
        data_dir=data_dir,
        state_dir=Path(env.get("OMNI_STATE_DIR") or data_dir / "state"),
        runtime_parent=Path(env.get("OMNI_RUNTIME_DIR") or tempfile.gettempdir()),
        log_level=_choice(env, "OMNI_LOG_LEVEL", "info", LOG_LEVELS) or "info",
        log_json=_choice(env, "OMNI_LOG_JSON", "0", ("0", "1")) == "1",
        platform=_choice(env, "OMNI_PLATFORM", None, PLATFORMS),
        shm_idle_s=_number(env, "OMNI_SHM_IDLE_S", SHM_IDLE_S),
        max_input_audio_s=_number(env, "OMNI_MAX_INPUT_AUDIO_S", 3600.0),
        input_audio_min_rate_hz=_number(env, "OMNI_INPUT_AUDIO_MIN_RATE_HZ", 8000, int),
        input_audio_max_rate_hz=_number(env, "OMNI_INPUT_AUDIO_MAX_RATE_HZ", 192_000, int),
        cuda_ipc_path=_choice(env, "OMNI_CUDA_IPC", CUDA_IPC_PATHS[0], CUDA_IPC_PATHS),
        worker_zygote=_choice(env, "OMNI_WORKER_ZYGOTE", "1", ("0", "1")) == "1",
    )
    if out.input_audio_min_rate_hz > out.input_audio_max_rate_hz:
        raise ConfigError(f"OMNI_INPUT_AUDIO_MIN_RATE_HZ: expected at most OMNI_INPUT_AUDIO_MAX_RATE_HZ "
                          f"({out.input_audio_max_rate_hz}), got {out.input_audio_min_rate_hz}")
    return out


_settings: Settings | None = None


def settings() -> Settings:
    """This process's settings, read from the environment on first use."""
    global _settings
    if _settings is None:
        _settings = read(os.environ)
    return _settings


def detect_platform() -> str:
    """"cuda" when an NVIDIA device node exists, else "cpu" (no torch import)."""
    return settings().platform or ("cuda" if Path("/dev/nvidia0").exists() else "cpu")


def check_data_dir(path: Path) -> Path:
    """Create the data directory (OMNI_DATA_DIR) if missing and check this process can write there;
    a ConfigError naming the variable and the reason otherwise, before anything is served from it."""
    return _writable_dir("OMNI_DATA_DIR", path)


IPC_PATH_MAX = 107
"""Longest path of a unix socket (sun_path less its NUL on Linux): the run's ipc endpoints live there."""
RUNTIME_ENTRY_RESERVE = len("/omni-run-XXXXXXXX/bus.sock")
"""Characters a run's socket path adds to OMNI_RUNTIME_DIR: its `omni-run-XXXXXXXX` directory (mkdtemp's
8 characters) and the endpoint in it (bus/sockets.py RuntimeDir; 79-character test folders run there)."""


def check_runtime_dir(path: Path) -> Path:
    """OMNI_RUNTIME_DIR (each run's private directory of ipc sockets goes under it) exists or can be
    made, is writable, and is short enough for a socket path; else a ConfigError naming the variable."""
    limit = IPC_PATH_MAX - RUNTIME_ENTRY_RESERVE
    if len(str(path.absolute())) > limit and not path.is_file():  # (a file: "Not a directory" says more)
        raise ConfigError(f"OMNI_RUNTIME_DIR: {path} is {len(str(path.absolute()))} characters; expected at most "
                          f"{limit} (the run's ipc sockets go under it, and a socket path is at most "
                          f"{IPC_PATH_MAX})")
    return _writable_dir("OMNI_RUNTIME_DIR", path)


def _writable_dir(var: str, path: Path) -> Path:
    try:
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(f"{var}: cannot use {path}: {err.strerror or err}") from None
    return path
