"""`omni-run prepare <pipeline>`: build a bundled pipeline's model folder (idempotent)."""

from __future__ import annotations

from pathlib import Path

from omni_actors.config.pipeline import get_pipeline, resolve
from omni_actors.errors import ConfigError
from omni_actors.settings import check_data_dir, settings


def prepare(pipeline: str) -> Path:
    try:
        pipe = get_pipeline(pipeline)
    except KeyError:
        raise ConfigError(f"prepare: unknown pipeline {pipeline!r}") from None
    if not pipe.preparer:
        raise ConfigError(f"prepare: pipeline {pipeline!r} has nothing to prepare (give it a model path)")
    check_data_dir(settings().data_dir)
    return Path(resolve(pipe.preparer)())
