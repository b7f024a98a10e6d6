"""Tiny random-weight checkpoints of each bundled pipeline's real architecture, built offline.

`make_tiny(pipeline, out_dir, seed)` writes a folder in the real on-disk format
(config, safetensors weights, tokenizer/processor files, side files) that the
real loading code reads. Builders are imported lazily: this module imports
without torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path

_BUILDERS: dict[str, str] = {
    "qwen2_5_omni": "omni_actors.models.tiny.qwen2_5_omni:make_tiny_qwen2_5_omni",
    "qwen3_omni_moe": "omni_actors.models.tiny.qwen3_omni_moe:make_tiny_qwen3_omni_moe",
    "llama": "omni_actors.models.tiny.llama:make_tiny_llama",
    "diffusion": "omni_actors.models.tiny.diffusion:make_tiny_diffusion",
    "csm": "omni_actors.models.tiny.csm:make_tiny_csm",
    "csm-1b-sized": "omni_actors.models.tiny.csm:make_csm_1b_sized",
    "qwen3_asr": "omni_actors.models.tiny.qwen3_asr:make_tiny_qwen3_asr",
}


def tiny_names() -> list[str]:
    """Names `make_tiny` accepts."""
    return sorted(_BUILDERS)


def make_tiny(pipeline: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny checkpoint for `pipeline` into `out_dir`; return the folder."""
    try:
        ref = _BUILDERS[pipeline]
    except KeyError:
        raise ValueError(
            f"no tiny builder for {pipeline!r}; known: {', '.join(tiny_names())}"
        ) from None
    module, _, fn = ref.partition(":")
    builder = getattr(importlib.import_module(module), fn)
    return Path(builder(out_dir, seed=seed))
