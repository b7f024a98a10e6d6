"""What a model folder is: the pipeline that serves it without a deploy file (`omni-run --model DIR`).

A diffusers folder is known by its `model_index.json` `_class_name`, a transformers
folder by its `config.json` `model_type`. Each pipeline says which folders it serves in
`PipelineConfig.detect` (next to its own topology), so this module never names a family.
A folder it serves must also hold whole weights: every `*.safetensors` file in it (or in a
component folder one level down) has a readable header whose tensors the file covers, and every
shard an index names is there, so that a truncated download is a config error here rather than
a worker that fails to start. `check_files` (called by `omni-run --model DIR` before it listens)
adds what a partial download lacks: a transformers folder's weights, a component a diffusers
model_index.json names (and its weights, where it has a config.json).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from omni_actors.config.pipeline import get_pipeline, pipeline_names
from omni_actors.errors import ConfigError

WILDCARD = "*"
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
"""The safetensors format's own cap on a header's length; a longer one is a corrupt file."""
WEIGHT_FILES = ("*.safetensors", "*.bin")
"""Where a checkpoint folder's weights are, as the stage loaders look for them (hf_ar_adapter's
check_checkpoint; vLLM and diffusers load the same two formats)."""


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
            raise ConfigError(f"--model: {path}: no {field!r} string; supported: {_supported()}")
        return f"{kind}:{value}"
    raise ConfigError(
        f"--model: {folder} has neither model_index.json (diffusers) nor config.json (transformers); "
        f"supported: {_supported()}"
    )


def _supported() -> str:
    return ", ".join(sorted({e for name in pipeline_names() for e in get_pipeline(name).detect})) or "none"


def check_weights(folder: str | Path) -> None:
    """ConfigError naming the first truncated or corrupt safetensors file, or a missing shard, in `folder`."""
    root = Path(folder).expanduser()
    for index in sorted([*root.glob("*.safetensors.index.json"), *root.glob("*/*.safetensors.index.json")]):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"--model: {index}: not a safetensors index ({err!r})") from None
        missing = sorted(str(s) for s in shards if not (index.parent / str(s)).is_file())
        if missing:
            raise ConfigError(f"--model: {index} names shards that are not in the folder: {', '.join(missing)}")
    for path in sorted([*root.glob("*.safetensors"), *root.glob("*/*.safetensors")]):
        problem = _safetensors_problem(path)
        if problem:
            raise ConfigError(f"--model: {path}: {problem}; download it again")


def check_files(folder: str | Path) -> None:
    """ConfigError naming what a detected model folder (`folder_key` read it) lacks, as the stage loaders
    would find it missing once the server listens: a transformers folder's weights, or a component its
    model_index.json names (and a component's weights, where it has a config.json). Apart from detection,
    which says what a folder is whether or not it is whole."""
    root = Path(folder).expanduser()
    index_file = root / "model_index.json"
    if not index_file.is_file():
        _need_weights(root, "config.json")
        return
    index = json.loads(index_file.read_text())
    for name, spec in index.items():  # as the diffusion loader reads it: [library, class], null when left out
        if name.startswith("_") or not isinstance(spec, list) or not spec or spec[0] is None:
            continue
        part = root / name
        what = f"component {name!r} ({'.'.join(str(s) for s in spec)})"
        if not part.is_dir():
            raise ConfigError(f"--model: {index_file} names {what}, but {part} is missing")
        if not any(part.iterdir()):
            raise ConfigError(f"--model: {part}: empty ({what} named in {index_file})")
        if (part / "config.json").is_file():
            _need_weights(part, f"{name}/config.json")


def _need_weights(folder: Path, config: str) -> None:
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ConfigError(f"--model: {folder}: no weights file ({' or '.join(WEIGHT_FILES)}) beside {config}; "
                          "the download is incomplete")


def _safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (its header read, the tensors' extent checked), or None."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if head == b"version ":  # `git clone` without git-lfs leaves the pointer text
                return "a Git LFS pointer, not the weights (run `git lfs pull` in the folder)"
            if len(head) < 8:
                return f"not a safetensors file ({size} bytes)"
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, MAX_SAFETENSORS_HEADER_BYTES):
                return f"truncated or corrupt safetensors file (a {length}-byte header in {size} bytes)"
            header = json.loads(f.read(length))
    except OSError as err:
        return f"cannot read it ({err.strerror or err})"
    except ValueError:
        return "corrupt safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return "corrupt safetensors file (its header is not a JSON object)"
    offsets = [t.get("data_offsets") if isinstance(t, dict) else None for k, t in header.items() if k != "__metadata__"]
    if not all(isinstance(o, list) and len(o) == 2 and all(isinstance(e, int) for e in o) for o in offsets):
        return "corrupt safetensors file (a tensor without two integer data_offsets)"
    need, have = max((o[1] for o in offsets), default=0), size - 8 - length
    if need != have:
        return f"truncated or corrupt safetensors file (its tensors take {need} bytes, the file holds {have})"
    return None


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
                f"--model: {folder}: {caps.pipeline_class} is {'an' if caps.output_kind[0] in 'aeiou' else 'a'} {caps.output_kind} pipeline this server does not "
                f"serve; classes served by name: {', '.join(named) or 'none'}; "
                f"for {' or '.join(sorted(makes))} output, {SUPPORTED}"
            )
    if exact or wildcard:
        check_weights(folder)
        return sorted(exact or wildcard)[0]
    raise ConfigError(
        f"--model: {folder} is {key!r}, which no pipeline serves; supported: "
        f"{', '.join(sorted(set(supported))) or 'none'}"
    )
