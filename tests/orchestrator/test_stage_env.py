"""A stage's worker keeps torch.compile's code under the data directory (reused on restart), CPU ones too:
importing transformers' models makes inductor's default /tmp/torchinductor_<user> otherwise."""

from __future__ import annotations

from omni_actors.config.deploy import build_deploy
from omni_actors.orchestrator.launcher import COMPILE_CACHE, stage_env, worker_env
from omni_actors.settings import settings


def _deploy(devices: str | None):
    stage = {"stage_id": 0, **({"devices": devices} if devices else {})}
    return build_deploy({"pipeline": "synthetic", "stages": [stage]}, source="test")


def test_compile_cache_in_data_dir_for_every_stage(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    env = stage_env(_deploy("0"), 0, 0)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(settings().data_dir / COMPILE_CACHE)
    cpu = stage_env(_deploy(None), 0, 0)
    assert cpu["TORCHINDUCTOR_CACHE_DIR"] == env["TORCHINDUCTOR_CACHE_DIR"] and "CUDA_VISIBLE_DEVICES" not in cpu
    assert worker_env()["TORCHINDUCTOR_CACHE_DIR"] == env["TORCHINDUCTOR_CACHE_DIR"]  # the zygote's


def test_operator_cache_dir_kept(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/srv/cache")
    assert "TORCHINDUCTOR_CACHE_DIR" not in stage_env(_deploy("0"), 0, 0)  # the host's value passes through
    assert worker_env()["TORCHINDUCTOR_CACHE_DIR"] == "/srv/cache"
