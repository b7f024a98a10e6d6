"""Process-wide settings that are not per deployment, read from the environment once."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omni_actors.bus.shm import SHM_IDLE_S
from omni_actors.errors import ConfigError

PLATFORMS = ("cpu", "cuda")


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    """Where prepared model files are cached (OMNI_DATA_DIR)."""
    runtime_parent: Path
    """Parent of each run's private 0700 runtime directory (OMNI_RUNTIME_DIR)."""
    log_level: str
    log_json: bool
    platform: str | None
    """Force "cpu" or "cuda" instead of detecting it (OMNI_PLATFORM)."""
    shm_idle_s: float
    """Shared-memory segments free (or mappings unused) this long go back to the OS (OMNI_SHM_IDLE_S)."""


def _read() -> Settings:
    env = os.environ
    return Settings(
        data_dir=Path(env.get("OMNI_DATA_DIR") or Path.home() / ".cache" / "omni-actors"),
        runtime_parent=Path(env.get("OMNI_RUNTIME_DIR") or tempfile.gettempdir()),
        log_level=env.get("OMNI_LOG_LEVEL", "info").lower(),
        log_json=env.get("OMNI_LOG_JSON", "0") == "1",
        platform=env.get("OMNI_PLATFORM") or None,
        shm_idle_s=_positive(env, "OMNI_SHM_IDLE_S", SHM_IDLE_S),
    )


def _positive(env: os._Environ[str] | dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ConfigError(f"{name}: expected a number of seconds > 0, got {raw!r}")
    return value


SETTINGS = _read()


def detect_platform() -> str:
    """"cuda" when an NVIDIA device node exists, else "cpu" (no torch import)."""
    if SETTINGS.platform:
        if SETTINGS.platform not in PLATFORMS:
            raise ConfigError(f"OMNI_PLATFORM: expected one of {list(PLATFORMS)}, got {SETTINGS.platform!r}")
        return SETTINGS.platform
    return "cuda" if Path("/dev/nvidia0").exists() else "cpu"
