"""Ctrl-C to exit: `omni-run` on the embedded default (Whisper -> SmolLM2 on vLLM -> Piper), after one chat
answer, from SIGINT to the process's end; ending without the interpreter's teardown (the default) against
the same run with it (OMNI_EXIT_TEARDOWN=1, the same-run baseline), alternating.

    .venv/bin/python scripts/bench_exit.py [--rounds 2] [--port 8931]

Prints one JSON line: seconds from SIGINT to exit per round and mode, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 300.0
EXIT_TIMEOUT_S = 120.0
MODES = {"teardown": "1", "exit_now": "0"}


def _round(port: int, teardown: str) -> float:
    env = {**os.environ, "OMNI_EXIT_TEARDOWN": teardown, "OMNI_LOG_JSON": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "omni_actors.cli", "--port", str(port)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert proc.stderr is not None
        for line in proc.stderr:  # (JSON lines: wait for the one saying it serves)
            if '"server.ready"' in line:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("omni-run did not become ready")
        body = json.dumps({"model": "assistant", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "Hi"}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=EXIT_TIMEOUT_S)
        return round(time.perf_counter() - t0, 3)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=8931)
    args = ap.parse_args()
    os.chdir(Path(__file__).resolve().parents[1])
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, flag in MODES.items():
            seconds[mode].append(_round(args.port, flag))
    med = {mode: statistics.median(v) for mode, v in seconds.items()}
    print(json.dumps({"bench": "exit", "pipeline": "assistant", "sigint_to_exit_s": seconds,
                      "median_s": med, "speedup": round(med["teardown"] / med["exit_now"], 2),
                      "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
