"""Export a Qwen2.5-Omni thinker's language model as a plain Qwen2 causal-LM folder.

The thinker's text decoder is a Qwen2 decoder (same layers, q/k/v biases,
RMSNorm, untied LM head); only its rotary positions are 3-axis (M-RoPE), and
for text-only input the three axes carry the same position, which is exactly
1-D RoPE. So for text chat the exported folder is the same model, and any
Qwen2 runtime can serve it: vLLM 0.32 on CPU cannot import its Qwen-Omni
thinker here (that module imports torchvision), but it serves Qwen2.

    export_thinker_lm(omni_dir, out_dir)  # -> out_dir

Writes config.json (Qwen2ForCausalLM), generation_config.json (the folder's own
when it has one), the thinker's
text weights as safetensors (renamed "thinker.model.*" -> "model.*",
"thinker.lm_head.*" -> "lm_head.*", shards of at most `shard_bytes`) and the
tokenizer files with the chat template. Audio and vision towers are left out.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from omni_actors.models.qwen2_5_omni.loading import check_checkpoint

MODEL_TYPES = ("qwen2_5_omni", "qwen2_5_omni_thinker")
"""config.json `model_type`s of the folders this exports (the whole model, or its thinker)."""
PREFIXES = {"thinker.model.": "model.", "thinker.lm_head.": "lm_head."}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
    "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json",
)  # fmt: skip
TEXT_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "hidden_act", "max_position_embeddings",
    "rms_norm_eps", "attention_dropout", "use_sliding_window", "sliding_window",
    "max_window_layers",
)  # fmt: skip


def qwen2_config(omni_config: dict[str, Any]) -> dict[str, Any]:
    """The Qwen2ForCausalLM config.json equal to a Qwen2.5-Omni thinker's text model."""
    thinker = omni_config.get("thinker_config", omni_config)
    text = thinker.get("text_config", thinker)
    heads, hidden = text["num_attention_heads"], text["hidden_size"]
    head_dim = text.get("head_dim") or hidden // heads
    if head_dim * heads != hidden:
        raise ValueError(f"thinker head_dim {head_dim} x {heads} heads != hidden {hidden}")
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    theta = rope.get("rope_theta", text.get("rope_theta", 1_000_000.0))
    out = {k: text[k] for k in TEXT_KEYS if k in text}
    out.update(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        dtype=thinker.get("dtype") or omni_config.get("dtype") or "bfloat16",
    )
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = text.get(key)
        value = thinker.get(key) if value is None else value
        if value is not None:
            out[key] = value
    return out


def _weight_files(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [src / n for n in names]
    return [src / "model.safetensors"]


def _rename(name: str) -> str | None:
    for old, new in PREFIXES.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return None


def export_thinker_lm(src: str | Path, out: str | Path, shard_bytes: int = 4 << 30) -> Path:
    """Write the thinker's language model of the Qwen2.5-Omni folder `src` to `out`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = check_checkpoint(src, ("config.json",))
    omni_config = json.loads((src / "config.json").read_text())
    if omni_config.get("model_type") not in MODEL_TYPES:
        raise ValueError(
            f"{src / 'config.json'}: not a Qwen2.5-Omni checkpoint: model_type "
            f"{omni_config.get('model_type')!r}, expected one of {list(MODEL_TYPES)}"
        )
    config = qwen2_config(omni_config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for file in _weight_files(src):
        if not file.is_file():
            raise FileNotFoundError(f"{file}: weights file is missing")
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                new = _rename(name)
                if new is None:
                    continue
                tensor = f.get_tensor(name)
                nbytes = tensor.numel() * tensor.element_size()
                if size and size + nbytes > shard_bytes:
                    shards.append({})
                    size = 0
                shards[-1][new] = tensor.contiguous()
                size += nbytes
    if "lm_head.weight" not in shards[-1] and not any("lm_head.weight" in s for s in shards):
        raise ValueError(f"{src}: no thinker.lm_head.weight in the checkpoint")
    _save(out, shards, save_file)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    if (src / "generation_config.json").is_file():  # the thinker's own stop ids and sampling
        gen.update(json.loads((src / "generation_config.json").read_text()))
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out


def _save(out: Path, shards: list[dict[str, Any]], save_file: Any) -> None:
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata=meta)
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
