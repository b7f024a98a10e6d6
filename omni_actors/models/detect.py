"""What a model folder is: the pipeline that serves it without a deploy file (`omni-run --model DIR`).

A diffusers folder is known by its `model_index.json` `_class_name`, a transformers
folder by its `config.json` `model_type`. Each pipeline says which folders it serves in
`PipelineConfig.detect` (next to its own topology), so this module never names a family.
"""

from __future__ import annotations

import json
from pathlib import Path

from omni_actors.config.pipeline import get_pipeline, pipeline_names
from omni_actors.errors import ConfigError

WILDCARD = "*"


def folder_key(folder: str | Path) -> str:
    """"diffusers:<class>" or "transformers:<model_type>" for a model folder; ConfigError if neither."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--model: not a folder: {folder}")
    for name, kind, field in (
        ("model_index.json", "diffusers", "_class_name"),
        ("config.json", "transformers", "model_type"),
    ):
        path = root / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"--model: {path}: cannot read {field}: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--model: {path}: expected a JSON object")
        value = data.get(field)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"--model: {path}: no {field!r} string")
        return f"{kind}:{value}"
    raise ConfigError(
        f"--model: {folder} has neither model_index.json (diffusers) nor config.json (transformers)"
    )


def detect_pipeline(folder: str | Path) -> str:
    """The registered pipeline that serves `folder`; ConfigError naming what is supported if none."""
    key = folder_key(folder)
    kind = key.partition(":")[0]
    exact: list[str] = []
    wildcard: list[str] = []
    supported: list[str] = []
    for name in pipeline_names():
        for entry in get_pipeline(name).detect:
            supported.append(entry)
            if entry == key:
                exact.append(name)
            elif entry == f"{kind}:{WILDCARD}":
                wildcard.append(name)
    if kind == "diffusers" and not exact and wildcard:
        from omni_actors.models.diffusion.capabilities import SUPPORTED, folder_caps

        try:  # the generic diffusion pipeline calls any class with a known call style: check it now
            caps = folder_caps(folder)
        except ConfigError as err:
            raise ConfigError(f"--model: {folder}: {err}") from None
        makes = set().union(*(get_pipeline(name).output_types() for name in wildcard))
        if caps.output_kind not in makes:  # a video/audio class no pipeline names: it would fail at its first request
            named = sorted({e.partition(":")[2] for e in supported if e.startswith("diffusers:")} - {WILDCARD})
            raise ConfigError(
                f"--model: {folder}: {caps.pipeline_class} is a {caps.output_kind} pipeline this server does not "
                f"serve; classes served by name: {', '.join(named) or 'none'}; "
                f"for {' or '.join(sorted(makes))} output, {SUPPORTED}"
            )
    if exact or wildcard:
        return sorted(exact or wildcard)[0]
    raise ConfigError(
        f"--model: {folder} is {key!r}, which no pipeline serves; supported: "
        f"{', '.join(sorted(set(supported))) or 'none'}"
    )
