"""Where a Dia folder's DAC codec is: the folder its `processor_config.json` names, found without a download.

Dia's processor names its audio tokenizer (`audio_tokenizer_name_or_path`): the real
checkpoint says "descript/dac_44khz" (a hub id), a tiny one "dac" (a folder beside the
weights). Looked up in order: that name as a folder inside the model folder, as an
absolute folder, then the local Hugging Face cache (`local_files_only`: nothing is
fetched). A `dac/` folder inside the model folder is used when the processor names none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT_DAC = "dac"


def dac_folder(model_path: Path) -> Path:
    """The DAC folder of a Dia checkpoint; FileNotFoundError naming what was looked for."""
    config = model_path / "processor_config.json"
    name = DEFAULT_DAC
    if config.is_file():
        try:
            name = json.loads(config.read_text())["audio_tokenizer"]["audio_tokenizer_name_or_path"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{config}: no audio_tokenizer.audio_tokenizer_name_or_path ({err!r})"
            ) from None
    for folder in (model_path / name, Path(name)):
        if (folder / "config.json").is_file():
            return folder
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not a cached hub id either
        pass
    raise FileNotFoundError(
        f"{config}: its DAC codec {name!r} is neither a folder in {model_path} nor in the local "
        f"Hugging Face cache; put the descript/dac_44khz folder at {model_path / name}"
    )


def load_dac(model_path: Path, device: str) -> Any:
    """DacModel (float32, eval) of a Dia checkpoint."""
    from transformers import DacModel

    folder = dac_folder(model_path)
    try:
        model = DacModel.from_pretrained(folder, dtype="float32")
    except Exception as err:
        raise ValueError(f"{folder}: cannot load the DAC codec ({err})") from err
    return model.to(device).eval()
