"""`omni-run --model DIR` on a folder a download left partial: one config-error line naming what is missing,
exit 2, before the port is bound.

The folder's pipeline is detected from config.json / model_index.json alone, so a folder with those and no
weights, or a diffusers model_index.json naming a component folder that is not there, used to start the
server: it bound the port, logged `server.listening` and told clients the model was loading, and ~12 s
later a stage failed to start on the missing file. (Truncated weights and missing shards are
tests/models/test_detect_weights.py's.)

Each run is given a port that is taken (tests/test_cli_ops.py's `busy_port`): a folder that slips past the
check fails on the port instead, a different line, without starting workers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli_ops import busy_port, omni_run, one_line

__all__ = ["busy_port"]

SD_INDEX = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0",
            "scheduler": ["diffusers", "PNDMScheduler"], "unet": ["diffusers", "UNet2DConditionModel"],
            "vae": ["diffusers", "AutoencoderKL"], "safety_checker": [None, None]}
"""A diffusers index whose components are scheduler, unet and vae (a null one is left out by design)."""


def _write(path: Path, body: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))


def _config_without_weights(d: Path) -> str:
    _write(d / "config.json", {"model_type": "csm"})
    (d / "tokenizer.json").write_text("{}")
    return f"--model: {d}: no weights file (*.safetensors or *.bin) beside config.json; the download is incomplete"


def _component_folder_missing(d: Path) -> str:
    _write(d / "model_index.json", SD_INDEX)
    _write(d / "scheduler" / "scheduler_config.json", {})
    for part in ("unet",):
        _write(d / part / "config.json", {})
        (d / part / "diffusion_pytorch_model.bin").write_bytes(b"")
    return (f"--model: {d}/model_index.json names component 'vae' (diffusers.AutoencoderKL), "
            f"but {d}/vae is missing")


def _component_without_weights(d: Path) -> str:
    _write(d / "model_index.json", SD_INDEX)
    _write(d / "scheduler" / "scheduler_config.json", {})
    for part in ("unet", "vae"):
        _write(d / part / "config.json", {})
    return (f"--model: {d}/unet: no weights file (*.safetensors or *.bin) beside unet/config.json; "
            "the download is incomplete")


@pytest.mark.parametrize("make", [_config_without_weights, _component_folder_missing, _component_without_weights])
def test_a_partial_folder_is_one_line_before_the_port_is_bound(tmp_path: Path, busy_port: int, make) -> None:
    d = tmp_path / "m"
    d.mkdir()
    named = make(d)
    proc = omni_run(tmp_path, "--model", str(d), "--port", str(busy_port))
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc) == f"omni-run: config error: {named}"


@pytest.mark.parametrize("with_flag", [False, True], ids=["file", "flag"])
def test_a_partial_folder_a_deploy_file_serves_is_one_line_before_the_port_is_bound(
        tmp_path: Path, busy_port: int, with_flag: bool) -> None:
    """A deploy file's `model` (or the --model laid over it) was not checked: the server listened and a stage
    failed on the missing weights later."""
    d = tmp_path / "m"
    d.mkdir()
    named = _config_without_weights(d).removeprefix("--model: ")
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(f"pipeline: csm\nmodel: {tmp_path if with_flag else d}\n")
    flags = ["--model", str(d)] if with_flag else []
    proc = omni_run(tmp_path, "--deploy", str(deploy), *flags, "--port", str(busy_port))
    assert proc.returncode == 2, proc.stderr
    source = "--model" if with_flag else f"{deploy}: `model`"
    assert one_line(proc) == f"omni-run: config error: {source}: {named}"
