"""Loading one part (thinker, talker, vocoder) of a Qwen-Omni checkpoint folder, checked first.

A Qwen-Omni folder holds every stage's weights in one state dict under a
prefix per part ("thinker.", "talker.", "token2wav." / "code2wav."). Each
stage worker loads only its own part with `from_pretrained` (a key mapping
strips the prefix) and, where it needs them, single tensors of another part
(the talker reads the thinker's token embeddings) straight from safetensors.
On CUDA the weights load straight onto the device (`weights_device_map`); on
CPU as before. The seconds count as the start-up phases "weights" and "config".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_actors.workers.engine import direct_load, timed
from omni_actors.workers.engines.hf_ar import DTYPES, check_checkpoint
from omni_actors.workers.engines.torch_setup import load_dtype, weights_device_map

__all__ = ["DTYPES", "check_checkpoint", "load_config", "load_part", "load_tensor"]


def load_config(path: Path, ctx: Any = None) -> Any:
    """The folder's full config, with a message naming config.json when it does not parse
    (timed as start-up phase "config" of `ctx`, when given)."""
    from transformers import AutoConfig

    with timed(ctx, "config"):
        try:
            return AutoConfig.from_pretrained(path)
        except Exception as err:
            raise ValueError(f"{path / 'config.json'}: cannot build the model config ({err})") from err


def load_part(
    cls: Any, path: Path, sub_config: Any, prefix: str, ctx: Any, float32: bool = False
) -> Any:
    """`cls` built from `sub_config` with the weights under `prefix.` in the folder, in eval mode,
    on ctx.device (loaded straight onto it on CUDA)."""
    import torch
    from transformers.utils import logging as hf_logging

    dtype = torch.float32 if float32 else load_dtype(ctx)
    placement = weights_device_map(ctx)
    where = {} if placement is None else {"device_map": placement}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the other parts' weights are "unexpected" by design
    with timed(ctx, "weights"):
        try:
            model = cls.from_pretrained(
                path, config=sub_config, dtype=dtype, key_mapping={rf"^{prefix}\.": ""}, **where
            )
        except Exception as err:
            raise ValueError(f"{path}: cannot load the {prefix} weights ({err})") from err
        finally:
            hf_logging.set_verbosity(level)
        # (after a device_map load a no-op that would catch anything left behind)
        return model.to(ctx.device).eval()


def load_codec(ctx: Any, cls: Any, sub: str, prefix: str) -> tuple[Any, Any]:
    """(model, sub-config) of a codec decoder: `cls` from the folder's `sub` config and its
    `prefix.` weights, in float32 (decoders that need it), the folder checked first."""
    path = check_checkpoint(ctx.model_path, ("config.json",))
    config = getattr(load_config(path, ctx), sub)
    return load_part(cls, path, config, prefix, ctx, float32=True), config


def load_tensor(path: Path, name: str, ctx: Any = None) -> Any:
    """One tensor of the folder's safetensors weights (sharded or not), read alone: onto the CPU,
    or with `ctx` straight onto ctx.device (unless its `direct_load` is off; timed as its start-up
    phase "weights")."""
    with timed(ctx, "weights"):
        return _read_tensor(path, name, ctx.device if ctx is not None and direct_load(ctx) else "cpu")


def _read_tensor(path: Path, name: str, device: str) -> Any:
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        file = path / json.loads(index.read_text())["weight_map"][name]
    else:
        file = path / "model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: weights file is missing")
    with safe_open(str(file), framework="pt", device=device) as f:
        if name not in f.keys():  # noqa: SIM118 - safe_open has no __contains__
            raise KeyError(f"{file}: no tensor {name}")
        return f.get_tensor(name)
