"""examples/grafana-dashboard.json charts only metrics the server really exports, by the labels they really
have, and keeps the pipelines of a server apart: a `$pipeline` variable filters every pipeline-labelled
series, each sum keeps `pipeline`, each legend names it, and no two lines of a panel share a name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from tests.api.conftest import eventually, serve

DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana-dashboard.json"
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
ISSUE_SERIES = {
    "queue depth": "omni_stage_queue_depth", "running requests": "omni_replica_in_flight",
    "step time histogram": "omni_worker_step_duration_seconds_bucket",
    "time to first output": "omni_time_to_first_token_seconds_bucket",
    "time to first audio": "omni_time_to_first_audio_seconds_bucket",
    "audio real-time factor": "omni_audio_real_time_factor_bucket", "restarts": "omni_worker_restarts_total",
    "late frames": "omni_duplex_late_frames_total",
}
"""What issue 15 asks the dashboard to chart, by the name /metrics exports it under."""
PIPELINE_FILTER = 'pipeline=~"$pipeline"'
STEPS_TIMEOUT_S = 10.0


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _labels(text: str) -> dict[str, set[str]]:
    """Each exported series' base name -> the label names its samples carry (`le`, `quantile` included)."""
    out: dict[str, set[str]] = {}
    for name, labels in re.findall(r"^(omni_[a-z0-9_]+)(?:\{(.*)\})? ", text, re.M):
        out.setdefault(_base(name), set()).update(re.findall(r'(\w+)="', labels))
    return out


def _problems(dash: dict, exported: dict[str, set[str]]) -> list[str]:
    problems = []
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    query = json.dumps(variables.get("pipeline", {}).get("query", ""))
    if not any(f"({m}," in query for m, labels in exported.items() if "pipeline" in labels):
        problems.append(f"no $pipeline variable over a pipeline-labelled series: {query}")
    for panel in dash["panels"]:
        legends = [t.get("legendFormat", "__auto") for t in panel["targets"]]
        if len(legends) > 1 and ("__auto" in legends or len(set(legends)) < len(legends)):
            problems.append(f"{panel['title']}: lines of one panel need names of their own: {legends}")
        for target in panel["targets"]:
            expr, legend = target["expr"], target.get("legendFormat", "__auto")
            names = {_base(n) for n in re.findall(r"\bomni_[a-z0-9_]+", expr)}
            have = set().union(*(exported.get(n, set()) for n in names))
            groups = [set(re.split(r"\s*,\s*", g.strip())) for g in re.findall(r"by \(([^)]*)\)", expr)]
            kept = set.intersection(*groups) if groups else have
            wrong = set().union(*groups, set(re.findall(r"\{\{(\w+)\}\}", legend))) - have - {"le"}
            if wrong:
                problems.append(f"{expr}: labels its series do not have: {sorted(wrong)}")
            if "pipeline" not in have:
                continue
            for selector in re.findall(r"\bomni_[a-z0-9_]+(?:\{[^}]*\})?", expr):
                if PIPELINE_FILTER not in selector:
                    problems.append(f"{expr}: {selector} is not filtered by $pipeline")
            if "pipeline" not in kept:
                problems.append(f"{expr}: sums the pipelines together")
            if legend != "__auto" and "{{pipeline}}" not in legend:
                problems.append(f"{expr}: its legend {legend!r} does not name the pipeline")
    return problems


async def test_every_dashboard_metric_is_exported_and_pipelines_are_kept_apart() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    wanted = {_base(n) for e in exprs for n in re.findall(r"\bomni_[a-z0-9_]+", e)}
    assert len(wanted) >= 10
    assert {k: v for k, v in ISSUE_SERIES.items() if v not in "\n".join(exprs)} == {}
    async with serve("synthetic", key=None) as srv:
        await srv.client().chat.completions.create(
            model="synthetic", messages=[{"role": "user", "content": "hi"}], modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"})  # (the audio histograms have samples)
        unknown = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as session, session.post(f"{srv.url}/v1/chat/completions",
                                                                    json=unknown) as resp:
            assert resp.status == 404  # (the errors' counter has samples too)
        # (each worker's step histogram reaches the orchestrator with its next heartbeat)
        await eventually(lambda: all(r.step_counts for st in srv.orch.statistics().stages for r in st.replicas),
                         timeout_s=STEPS_TIMEOUT_S)
        async with aiohttp.ClientSession() as session, session.get(f"{srv.url}/metrics") as resp:
            text = await resp.text()
    exported = {_base(m) for m in re.findall(r"^(?:# TYPE )?(omni_[a-z0-9_]+)", text, re.M)}
    assert wanted - exported == set()
    labels = _labels(text)
    assert "pipeline" in labels["omni_time_to_first_audio_seconds"]  # (the samples were read)
    problems = _problems(dash, labels)
    assert problems == [], "\n".join(problems)
