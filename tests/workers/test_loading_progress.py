"""A worker's weight loading as `worker.loading` progress lines: transformers' own "Loading weights" bar
routed to our events, from a real `omni-run --model` start; the hook is set only while an engine loads,
and a worker that never imports transformers does not import it for this."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from omni_actors.models.tiny import make_tiny
from tests.api.model_server import serve_tiny

SCRIPT_TIMEOUT_S = 120
SCRIPT = """
import sys
from omni_actors import logs
from omni_actors.workers.loading_progress import loading_progress
logs.configure()
with loading_progress(stage="plain"):
    pass
assert "transformers" not in sys.modules  # nothing loaded: nothing imported
with loading_progress(stage="thinker", replica=0):
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(sys.argv[1])
import transformers.utils.logging as tl
assert tl._tqdm_hook is None  # restored after the block
AutoModelForCausalLM.from_pretrained(sys.argv[1])  # outside it: no events
"""


def _loading_events(script: str, folder: Path) -> list[dict]:
    """The `worker.loading` events `script` (run with the folder as its argument) logged as JSON."""
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT_S, env={**os.environ, "OMNI_LOG_JSON": "1"})
    assert done.returncode == 0, done.stderr
    return [e for e in (json.loads(x) for x in done.stderr.splitlines() if x.startswith("{"))
            if e["event"] == "worker.loading"]


def test_transformers_weights_are_reported_inside_the_block_only(tmp_path: Path) -> None:
    folder = make_tiny("llama", tmp_path / "tiny", seed=0)
    events = _loading_events(SCRIPT, folder)
    assert events and all(e["what"] == "Loading weights" and e["stage"] == "thinker" for e in events)
    total = events[0]["total"]
    assert total > 1 and events[0]["done"] == 0 and events[-1]["done"] == total
    assert len(events) <= 11  # at most a line a tenth


def test_a_served_folder_reports_its_weights_while_its_workers_load(tmp_path: Path) -> None:
    run = next(serve_tiny(tmp_path, "csm"))
    try:
        loading = [line for line in run.lines if "worker.loading" in line]
    finally:
        run.stop()
    finals = [line for line in loading if "Loading weights" in line
              and re.search(r"\bdone=(\d+)\b", line)[1] == re.search(r"\btotal=(\d+)\b", line)[1]]
    assert finals, "".join(run.lines[-30:])  # every CSM worker loads transformers weights (LM, codec)


DIFFUSERS_SCRIPT = """
import sys
from pathlib import Path
from omni_actors import logs
from omni_actors.workers.engines.diffusion_loading import load_pipeline
from omni_actors.workers.loading_progress import loading_progress
logs.configure()
with loading_progress(stage="image", replica=0):
    load_pipeline(Path(sys.argv[1]), "cpu", "float32")
import diffusers.utils.logging as dl
assert type(dl.tqdm).__name__ == "_tqdm_cls"  # diffusers' own again after the block
load_pipeline(Path(sys.argv[1]), "cpu", "float32")  # outside it: no events
"""


def test_diffusers_components_are_reported_one_by_one_inside_the_block_only(tmp_path: Path) -> None:
    folder = make_tiny("diffusion", tmp_path / "tiny", seed=0)
    events = _loading_events(DIFFUSERS_SCRIPT, folder)
    parts = [e for e in events if e["what"] == "Loading pipeline components"]
    assert parts and all(e["stage"] == "image" for e in events), events
    index = json.loads((folder / "model_index.json").read_text())
    components = sum(isinstance(v, list) and v[0] is not None for v in index.values())  # unet, vae, ...
    assert parts[0]["done"] == 0 and parts[-1]["done"] == parts[-1]["total"] == components
    assert len([e for e in parts if e["done"] == e["total"]]) == 1  # one load inside the block, none after
