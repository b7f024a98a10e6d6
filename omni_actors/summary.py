"""The start-up summary `omni-run` prints once it serves: pipeline, stages, placement, URLs."""

from __future__ import annotations

from omni_actors.config.deploy import DeployConfig
from omni_actors.config.pipeline import PipelineConfig

SHARING = {
    "mps": "shared through this run's own MPS daemon (kernels of the stages on one GPU run side by side)",
    "time_slice": "a CUDA context per worker process, time-sliced where they share a GPU (deploy gpu_sharing)",
}


def _host_for_url(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)


def startup_summary(
    deploy: DeployConfig, pipe: PipelineConfig, urls: bool = True, gpu_sharing: str = "none"
) -> str:
    """A few readable lines; the same facts are in the `server.ready` log event and /v1/status.
    A server of several pipelines prints one per pipeline, the last with `urls`."""
    host = _host_for_url(deploy.server.host)
    base = f"http://{host}:{deploy.server.port}"
    name = deploy.server.served_model_name or pipe.name
    lines = [
        "",
        f"  omni-actors serving {name!r} (pipeline {pipe.name}, async chunk {'on' if deploy.async_chunk else 'off'})",
        f"  model      {deploy.model or '(none: weightless)'}",
        "  stages",
    ]
    for spec in pipe.stages:
        st = deploy.stage(spec.stage_id)
        devices = ",".join(st.device_list()) or "cpu/default"
        src = ",".join(str(s) for s in spec.input_sources) or "request"
        out = f" -> {spec.final_output_type}" if spec.final_output else ""
        lines.append(
            f"    {spec.stage_id}  {spec.model_stage:<12} {spec.execution_type.value:<15} "
            f"replicas {st.num_replicas}  devices {devices:<12} from {src}{out}"
        )
    if gpu_sharing != "none":
        lines.append(f"  GPUs       {SHARING[gpu_sharing]}")
    if not urls:
        return "\n".join(lines)
    lines += [
        f"  API        {base}/v1      (OpenAI-compatible; realtime at ws://{host}:{deploy.server.port}/v1/realtime)",
        f"  playground {base}/",
        f"  health     {base}/health   metrics {base}/metrics",
        "  Ctrl-C stops it.",
        "",
    ]
    return "\n".join(lines)
