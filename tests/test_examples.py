"""Every deploy file in examples/ loads and validates (no workers started).

`model` in the examples is a placeholder the user replaces; here it is
overridden with an existing folder, as `omni-run --model DIR` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_actors.config.deploy import load_deploy
from omni_actors.config.pipeline import get_pipeline
from omni_actors.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FILES = sorted(EXAMPLES.rglob("*.yaml"))
PLACEHOLDER = [p for p in FILES if "model: /path/to/" in p.read_text()]


def _id(path: Path) -> str:
    return str(path.relative_to(EXAMPLES))


def test_every_pipeline_has_an_example() -> None:
    pipelines = {load_deploy(p, {"model": str(EXAMPLES)}).pipeline for p in FILES}
    assert {"qwen2_5_omni", "qwen3_omni_moe", "diffusion", "llm"} <= pipelines
    for name in ("qwen2_5_omni", "qwen3_omni_moe"):
        split = [p for p in FILES if p.stem == f"{name}_split"]
        assert split, f"no split-across-devices example for {name}"


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_example_loads(path: Path, tmp_path: Path) -> None:
    cfg = load_deploy(path, {"model": str(tmp_path)})
    pipe = get_pipeline(cfg.pipeline)
    assert cfg.source == str(path)
    assert cfg.model in (str(tmp_path), None)
    for st in cfg.stages:
        assert st.stage_id in pipe.stage_ids
        devices = st.device_list()
        if devices:
            assert len(devices) == st.tensor_parallel_size * st.num_replicas


@pytest.mark.parametrize("path", PLACEHOLDER, ids=_id)
def test_placeholder_model_is_reported(path: Path) -> None:
    """Left as shipped, the placeholder path fails early with a message naming `model`."""
    with pytest.raises(ConfigError, match="model: path does not exist"):
        load_deploy(path)


def test_split_examples_place_stages_on_devices(tmp_path: Path) -> None:
    for name in ("qwen2_5_omni_split", "qwen3_omni_moe_split"):
        cfg = load_deploy(EXAMPLES / f"{name}.yaml", {"model": str(tmp_path)})
        assert all(st.device_list() for st in cfg.stages), name
