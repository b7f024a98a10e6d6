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
    shm_idle: str | None
    """OMNI_SHM_IDLE_S as given; read it through `shm_idle_s()`, which checks it."""


def _read() -> Settings:
    env = os.environ
    return Settings(
        data_dir=Path(env.get("OMNI_DATA_DIR") or Path.home() / ".cache" / "omni-actors"),
        runtime_parent=Path(env.get("OMNI_RUNTIME_DIR") or tempfile.gettempdir()),
        log_level=env.get("OMNI_LOG_LEVEL", "info").lower(),
        log_json=env.get("OMNI_LOG_JSON", "0") == "1",
        platform=env.get("OMNI_PLATFORM") or None,
        shm_idle=env.get("OMNI_SHM_IDLE_S") or None,
    )


SETTINGS = _read()


def shm_idle_s() -> float:
    """Seconds after which shared-memory segments free (or mappings unused) go back to the OS
    (OMNI_SHM_IDLE_S, default SHM_IDLE_S); ConfigError if it is not a number > 0."""
    raw = SETTINGS.shm_idle
    if raw is None:
        return SHM_IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:  # (also refuses nan)
        raise ConfigError(f"OMNI_SHM_IDLE_S: expected a number of seconds > 0, got {raw!r}")
    return value


def detect_platform() -> str:
    """"cuda" when an NVIDIA device node exists, else "cpu" (no torch import)."""
    if SETTINGS.platform:
        if SETTINGS.platform not in PLATFORMS:
            raise ConfigError(f"OMNI_PLATFORM: expected one of {list(PLATFORMS)}, got {SETTINGS.platform!r}")
        return SETTINGS.platform
    return "cuda" if Path("/dev/nvidia0").exists() else "cpu"
