"""Loading a diffusers pipeline from a local folder, with errors that name the broken file.

On CUDA each component's weights load straight onto the device (diffusers' `device_map`
with a device name: every model component on that one device, no hooks, `.to()` still
allowed); on CPU the pipeline loads as it always has.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_actors import logs
from omni_actors.errors import ConfigError
from omni_actors.models.diffusion.fixes import apply_fixes
from omni_actors.models.diffusion.processors import torchvision_free_components

log = logs.get(__name__)

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def load_pipeline(model_path: Path | None, device: str, dtype: str, direct: bool = True) -> Any:
    """Load the diffusers pipeline in `model_path`; ConfigError naming the file when it is broken.
    `direct`: off the CPU, load the weights straight onto `device` (torch_setup.direct_load)."""
    if model_path is None:
        raise ConfigError("diffusion stage: no model path given")
    root = Path(model_path)
    index_file = root / "model_index.json"
    if not index_file.is_file():
        raise ConfigError(f"{index_file}: missing (not a diffusers pipeline folder)")
    index = _read_json(index_file)
    class_name = index.get("_class_name") if isinstance(index, dict) else None
    if not isinstance(class_name, str):
        raise ConfigError(
            f"{index_file}: _class_name: expected the name of a diffusers pipeline class"
        )

    import diffusers
    import torch

    if not isinstance(getattr(diffusers, class_name, None), type):
        raise ConfigError(
            f"{index_file}: _class_name: {class_name} is not a pipeline in diffusers {diffusers.__version__}"
        )
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        folder = root / name
        if not folder.is_dir():
            raise ConfigError(f"{folder}: missing (component {name!r} named in {index_file})")
        for cfg in sorted(folder.glob("*.json")):
            _read_json(cfg)
    torch_dtype = _torch_dtype(dtype, device, torch)
    where = {"device_map": device} if direct and device != "cpu" else {}
    diffusers.utils.logging.disable_progress_bar()
    try:
        parts, later = torchvision_free_components(root, index)
        pipe = diffusers.DiffusionPipeline.from_pretrained(
            root, local_files_only=True, dtype=torch_dtype, **parts, **dict.fromkeys(later), **where
        )
        pipe.register_modules(**later)
        if parts or later:
            log.info("diffusion.torchvision_free_components", components=sorted([*parts, *later]))
        fixed = apply_fixes(pipe)
        if fixed:
            log.info("diffusion.library_fixes", fixes=fixed)
    except Exception as err:  # loading is the stage-start boundary: name the folder, keep the cause
        raise ConfigError(f"{root}: cannot load {class_name}: {type(err).__name__}: {err}") from err
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)  # (after a device_map load: only what was passed in, e.g. processors)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from None


def _torch_dtype(dtype: str, device: str, torch: Any) -> Any:
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype: expected auto or one of {sorted(_DTYPES)}, got {dtype!r}")
    return getattr(torch, _DTYPES[dtype])
