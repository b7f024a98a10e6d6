"""A real `omni-run --model DIR` server process for end-to-end tests of served model folders."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from tests.conftest import free_port
from tests.shutdown_support import OmniRun, runtime_dirs

MODEL_READY_TIMEOUT_S = 240.0
"""Longest wait for a served folder's worker to import torch/diffusers and load (busy 2-core runners)."""
SDK_TIMEOUT_S = 120.0


class ModelRun(OmniRun):
    """`omni-run --model DIR` with its own data directory (OMNI_DATA_DIR); stderr read as OmniRun does."""

    def __init__(self, tmp: Path, model: Path, data_dir: Path, overrides: dict[str, Any] | None = None) -> None:
        self.port = free_port()
        self.runtime_parent = tmp / "runtime"
        self.runtime_before = runtime_dirs(self.runtime_parent)
        args = [sys.executable, "-m", "omni_actors.cli", "--model", str(model), "--host", "127.0.0.1",
                "--port", str(self.port)]
        if overrides:
            args += ["--stage-overrides", json.dumps(overrides)]
        env = {**os.environ, "OMNI_LOG_JSON": "0", "OMNI_RUNTIME_DIR": str(self.runtime_parent),
               "OMNI_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._eof = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.seen_workers = set()
        self.model = model.name

    def wait_ready(self) -> None:
        self.wait_for(r"server\.ready", MODEL_READY_TIMEOUT_S)
        self.note_workers()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=SDK_TIMEOUT_S, max_retries=0)

    def stop(self) -> None:
        """SIGTERM (twice: do not drain unfinished jobs), then check nothing is left behind."""
        import signal

        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            self.wait_for(r"server\.stopping")
            self.signal(signal.SIGTERM)
        self.wait()
        self.assert_clean(workers_timeout_s=30.0)


def serve_tiny(tmp: Path, family: str) -> Iterator[ModelRun]:
    """For a module fixture: `omni-run` on a fresh tiny checkpoint of `family`, stopped after."""
    from omni_actors.models.tiny import make_tiny

    run = ModelRun(tmp, make_tiny(family, tmp / "tiny", seed=0), tmp / "data")
    try:
        run.wait_ready()
        yield run
    finally:
        run.stop()
