"""A stage's worker keeps torch.compile's code under the data directory (reused on restart), CPU ones too:
importing transformers' models makes inductor's default /tmp/torchinductor_<user> otherwise."""

from __future__ import annotations

import pytest

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


def test_inductors_own_default_counts_as_unset(monkeypatch):
    """torch writes its default folder into os.environ when anything in the main process first
    asks inductor for it; the workers still get the data directory's cache."""
    pytest.importorskip("torch")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    want = str(settings().data_dir / COMPILE_CACHE)
    assert stage_env(_deploy(None), 0, 0)["TORCHINDUCTOR_CACHE_DIR"] == want
    assert worker_env()["TORCHINDUCTOR_CACHE_DIR"] == want


def test_no_precompiled_headers_unless_the_host_asks(monkeypatch):
    """Inductor puts them in /tmp/torchinductor_<user> whatever the cache folder: workers make none."""
    monkeypatch.delenv("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", raising=False)
    assert stage_env(_deploy(None), 0, 0)["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    assert worker_env()["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    monkeypatch.setenv("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "1")
    assert "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS" not in stage_env(_deploy(None), 0, 0)
    assert worker_env()["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "1"


@pytest.mark.parametrize(("json_logs", "tqdm"), [("1", "1"), ("0", None)])
def test_json_logs_turn_library_progress_bars_off(monkeypatch, json_logs: str, tqdm: str | None):
    """vLLM's own tqdm bars would print plain text among the JSON lines."""
    monkeypatch.setenv("OMNI_LOG_JSON", json_logs)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert stage_env(_deploy(None), 0, 0).get("TQDM_DISABLE") == worker_env().get("TQDM_DISABLE") == tqdm
