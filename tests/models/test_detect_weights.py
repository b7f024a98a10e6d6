"""`omni-run --model DIR` on a folder whose weights are not whole: one config-error line naming the file, exit 2.

A truncated download, a shard an index names but the folder lacks, or a Git LFS pointer left by a clone
without git-lfs is found when the folder is detected, before any worker starts (which used to end in
`stage 0 did not start: ValueError: ... incomplete metadata` and exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from omni_actors.models.detect import detect_pipeline
from tests.conftest import free_port

RUN_TIMEOUT_S = 120
CONFIG = {"model_type": "csm"}


def _omni_run(tmp: Path, model: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMNI_DATA_DIR": str(tmp / "data"), "OMNI_RUNTIME_DIR": str(tmp / "runtime"),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "omni_actors.cli", "--model", str(model), "--port",
                           str(free_port())], capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def _folder(tmp: Path, config: dict | None = CONFIG) -> Path:
    d = tmp / "m"
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


def _weights(path: Path) -> Path:
    save_file({"a": np.zeros((64, 64), np.float32), "b": np.ones(16, np.float32)}, str(path))
    return path


def _truncated(d: Path) -> str:
    path = _weights(d / "model.safetensors")
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    return "model.safetensors: truncated or corrupt safetensors file"


def _missing_shard(d: Path) -> str:
    _weights(d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}}))
    return "names shards that are not in the folder: model-00002-of-00002.safetensors"


def _lfs_pointer(d: Path) -> str:
    (d / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n")
    return "a Git LFS pointer, not the weights"


def _component_truncated(d: Path) -> str:
    (d / "codec").mkdir()
    _weights(d / "model.safetensors")
    path = _weights(d / "codec" / "model.safetensors")
    with path.open("r+b") as f:
        f.truncate(20)
    return "codec/model.safetensors: truncated or corrupt safetensors file"


@pytest.mark.parametrize("make", [_truncated, _missing_shard, _lfs_pointer, _component_truncated])
def test_broken_weights_are_one_config_error_line(tmp_path, make):
    d = _folder(tmp_path)
    named = make(d)
    done = _omni_run(tmp_path, d)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("omni-run: config error: --model: "), done.stderr[-2000:]
    assert named in lines[0]


def test_a_config_without_model_type_says_what_is_supported(tmp_path):
    d = _folder(tmp_path, {"architectures": ["Something"]})
    done = _omni_run(tmp_path, d)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert "no 'model_type' string; supported: " in line and "transformers:csm" in line


def test_whole_weights_pass(tmp_path):
    d = _folder(tmp_path)
    _weights(d / "model-00001-of-00002.safetensors")
    _weights(d / "model-00002-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert detect_pipeline(d) == "csm"


def test_a_checkpoint_file_the_worker_finds_missing_is_a_config_error(tmp_path: Path) -> None:
    """Which files a family needs is its loader's to say: the worker's FileNotFoundError ends the start
    as a config error (exit 2), one line naming the file, not as the runtime's own failure (exit 1)."""
    from omni_actors.models.tiny import make_tiny

    model = make_tiny("csm", tmp_path / "csm")
    (model / "tokenizer_config.json").unlink()
    done = _omni_run(tmp_path, model)
    assert done.returncode == 2, done.stderr
    assert "did not start: FileNotFoundError" in done.stderr and "tokenizer_config.json" in done.stderr, done.stderr
