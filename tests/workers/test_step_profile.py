"""The opt-in step profiler: off by default, profiles the asked steps, writes its report once."""

from __future__ import annotations

import json

import pytest
import torch

from omni_actors.workers import step_profile


def test_off_unless_asked(tmp_path):
    assert step_profile.from_env("talker", 0, {}) is None
    env = {"OMNI_PROFILE_DIR": str(tmp_path), "OMNI_PROFILE_STAGES": "codec"}
    assert step_profile.from_env("talker", 0, env) is None
    assert step_profile.from_env("codec", 1, env) is not None


def test_bad_steps_named(tmp_path):
    with pytest.raises(ValueError, match="OMNI_PROFILE_STEPS"):
        step_profile.from_env("s", 0, {"OMNI_PROFILE_DIR": str(tmp_path), "OMNI_PROFILE_STEPS": "ten"})


def test_profiles_the_asked_steps_and_writes_once(tmp_path):
    prof = step_profile.from_env("s", 2, {"OMNI_PROFILE_DIR": str(tmp_path), "OMNI_PROFILE_STEPS": "2:3"})
    x = torch.randn(64, 64)
    for i in range(8):
        with prof.step():
            x = torch.tanh(x @ x)
        if i < 4:
            assert not (tmp_path / "s-2.json").exists()
    summary = json.loads((tmp_path / "s-2.json").read_text())
    assert summary["profile"] == "s-2" and summary["steps"] == 3
    assert summary["wall_ms_per_step"] > 0
    table = (tmp_path / "s-2.txt").read_text()
    assert "aten::mm" in table and "aten::tanh" in table
    assert prof.done and prof.seen == 5
