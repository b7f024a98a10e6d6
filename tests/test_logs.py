"""A library's notices about choices the runtime made on purpose are dropped from the log (logs.drop_notices),
its info chatter held back, its real warnings kept; at --log-level debug everything shows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import logging
from omni_actors import logs
logs.configure()
logs.drop_notices("somelib", r"^Enforce eager set")
lib = logging.getLogger("somelib.engine")
lib.warning("Enforce eager set, disabling torch.compile")
lib.warning("the KV cache is too small for one request")
lib.info("loading weights")
"""


@pytest.mark.parametrize("level", ["info", "debug"])
def test_a_librarys_notice_is_dropped_and_its_warnings_kept(level: str) -> None:
    env = {**os.environ, "OMNI_LOG_LEVEL": level, "OMNI_LOG_JSON": "0"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "the KV cache is too small" in done.stderr
    shown = level == "debug"
    assert ("Enforce eager set" in done.stderr) is shown, done.stderr
    assert ("loading weights" in done.stderr) is shown, done.stderr
