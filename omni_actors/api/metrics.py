"""Prometheus metrics of one app (its own CollectorRegistry) and the GET /metrics route.

    omni_http_requests_total{route,method,status}     answered requests (status 499: the client went away
                                                      before the answer ended; unknown paths: route "unmatched")
    omni_http_errors_total{route,status,code}         answered errors by their body's `code` (queue_full,
                                                      worker_died, rejected_by_stage, request_timeout, ...;
                                                      "client_disconnected" with 499, "none" without a code)
    omni_http_requests_in_flight{route}               requests being served now
    omni_time_to_first_token_seconds{route,pipeline}  submit -> first text delta
    omni_time_to_first_audio_seconds{route,pipeline}  submit -> first audio chunk
    omni_request_duration_seconds{route,pipeline}     submit -> last output (successful requests)
    omni_audio_real_time_factor{route,pipeline}       a successful request's duration over the seconds of
                                                      audio it answered with
    omni_stage_queue_depth{pipeline,stage_id,model_stage}      requests routed to a stage and not finished
    omni_stage_queue_limit{pipeline,stage_id,model_stage}      admission bound per replica
    omni_stage_healthy{pipeline,stage_id,model_stage}          1 when a replica is ready
    omni_stage_engine_requests{pipeline,stage_id,model_stage}  requests the workers report holding
    omni_worker_restarts_total{pipeline,stage_id,model_stage}  worker restarts
    omni_stage_first_output_seconds{pipeline,stage_id,model_stage}  a histogram: the stage started on a
                                                      request -> its first output (the stage's share of
                                                      time to first output; orchestrator/latency.py)
    omni_worker_step_seconds{pipeline,stage_id,model_stage,replica}  how long the running engine step has run (0: idle)
    omni_worker_steps_total{pipeline,stage_id,model_stage,replica}   engine steps done (a counter: rate() is
                                                      steps/s; a restarted worker starts again from 0)
    omni_worker_busy_seconds_total{pipeline,stage_id,model_stage,replica}  seconds in engine steps (rate(): the
                                                      replica's busy fraction; over rate(steps): the mean step time)
    omni_worker_step_duration_seconds{pipeline,stage_id,model_stage,replica}  a histogram of completed engine
                                                      steps by duration (the worker counts, its heartbeats carry them)
    omni_replica_in_flight{pipeline,stage_id,model_stage,replica}   requests routed to the replica, not finished
    omni_replica_restarts_total{pipeline,stage_id,model_stage,replica}  restarts of the replica's worker
    omni_worker_startup_seconds{pipeline,stage_id,model_stage,replica,phase}  the worker's last start-up, per
                                                      phase: ready (spawn -> Ready), boot, imports, engine,
                                                      total, engine.weights, ... (orchestrator/stats.py)
    omni_orchestrator_requests_in_flight{pipeline}    runs the orchestrator holds
    omni_orchestrator_leases_held{pipeline}           shared-memory leases not yet freed
    omni_orchestrator_requests_total{pipeline}        runs submitted to the pipeline (/v1/status requests_total)
    omni_orchestrator_requests_failed_total{pipeline}   runs ended by an error (/v1/status requests_failed)
    omni_orchestrator_requests_aborted_total{pipeline}  runs aborted: client gone, stream overflow, shutdown
                                                      (/v1/status requests_aborted)
    omni_pipeline_draining{pipeline}                  1 while the pipeline drains (/health answers 503)
    omni_bus_frames_undecodable_total{pipeline}       frames from workers the bus could not decode
    omni_stream_bytes_queued{pipeline}                final outputs held that their readers have not taken
    omni_stream_overflows_total{pipeline}             requests aborted for leaving server.stream_buffer_mb unread
    omni_first_output_holds_total{pipeline}           workers held while one sharing their device made a first
                                                      output (deploy first_output_priority)

`pipeline` is the pipeline's model id in this server (its served name, else its
pipeline's name). Stage values are read from each `orchestrator.statistics()` at
scrape time.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from omni_actors.api.errors import IN_BAND_ERROR
from omni_actors.bus.messages import STEP_BUCKETS_S
from omni_actors.orchestrator.latency import cumulative
from omni_actors.orchestrator.outputs import AudioOutput

if TYPE_CHECKING:
    from omni_actors.api.pipelines import Pipelines

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Up to the default `server.request_timeout_s` (600 s): an image or a video takes minutes, and a p99
past the last bucket reads only as "more than that"."""
RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class _StageCollector:
    def __init__(self, pipelines: Pipelines) -> None:
        self.pipelines = pipelines

    def collect(self):
        from omni_actors.api.pipelines import model_id  # (pipelines.py imports the API's errors)

        labels = ["pipeline", "stage_id", "model_stage"]
        depth = GaugeMetricFamily("omni_stage_queue_depth", "Requests routed to the stage and not finished", labels=labels)
        limit = GaugeMetricFamily("omni_stage_queue_limit", "Admitted requests per replica before 429", labels=labels)
        healthy = GaugeMetricFamily("omni_stage_healthy", "1 when the stage has a ready replica", labels=labels)
        engine = GaugeMetricFamily("omni_stage_engine_requests", "Requests the stage's workers report holding", labels=labels)
        restarts = CounterMetricFamily("omni_worker_restarts", "Worker restarts of the stage", labels=labels)
        first = HistogramMetricFamily("omni_stage_first_output_seconds", "The stage started on a request -> "
                                      "its first output", labels=labels)
        replica_labels = [*labels, "replica"]
        step_s = GaugeMetricFamily("omni_worker_step_seconds", "How long the replica's running engine step has "
                                   "run (0: between steps), as of its last heartbeat", labels=replica_labels)
        steps = CounterMetricFamily("omni_worker_steps", "Engine steps the replica has done", labels=replica_labels)
        busy = CounterMetricFamily("omni_worker_busy_seconds", "Seconds the replica spent in engine steps "
                                   "(over omni_worker_steps_total: the mean step time)", labels=replica_labels)
        step_hist = HistogramMetricFamily("omni_worker_step_duration_seconds", "The replica's completed engine "
                                          "steps by duration (a restarted worker counts from 0)", labels=replica_labels)
        rep_in_flight = GaugeMetricFamily("omni_replica_in_flight", "Requests routed to the replica and not finished",
                                          labels=replica_labels)
        rep_restarts = CounterMetricFamily("omni_replica_restarts", "Restarts of the replica's worker",
                                           labels=replica_labels)
        startup = GaugeMetricFamily("omni_worker_startup_seconds", "Seconds per phase of the replica's worker "
                                    "start-up (its last one)", labels=[*replica_labels, "phase"])
        one = ["pipeline"]
        runs = GaugeMetricFamily("omni_orchestrator_requests_in_flight", "Runs the orchestrator holds", labels=one)
        leases = GaugeMetricFamily("omni_orchestrator_leases_held", "Shared-memory leases not yet freed", labels=one)
        undecodable = CounterMetricFamily("omni_bus_frames_undecodable", "Frames from workers the bus could not decode",
                                          labels=one)
        queued = GaugeMetricFamily("omni_stream_bytes_queued", "Final outputs held that their readers have not taken",
                                   labels=one)
        overflows = CounterMetricFamily("omni_stream_overflows", "Requests aborted for a reader that stopped reading",
                                        labels=one)
        submitted = CounterMetricFamily("omni_orchestrator_requests", "Runs submitted to the pipeline", labels=one)
        failed = CounterMetricFamily("omni_orchestrator_requests_failed", "Runs ended by an error", labels=one)
        aborted = CounterMetricFamily("omni_orchestrator_requests_aborted", "Runs aborted (client gone, stream "
                                      "overflow, shutdown)", labels=one)
        draining = GaugeMetricFamily("omni_pipeline_draining", "1 while the pipeline drains", labels=one)
        holds = CounterMetricFamily("omni_first_output_holds", "Workers held while one sharing their device made "
                                    "a first output", labels=one)
        for orch in self.pipelines.all:
            stats, name = orch.statistics(), model_id(orch)
            for st in stats.stages:
                key = [name, str(st.stage_id), st.model_stage]
                depth.add_metric(key, st.in_flight)
                limit.add_metric(key, st.queue_limit)
                healthy.add_metric(key, 1.0 if st.healthy else 0.0)
                engine.add_metric(key, st.engine_requests)
                restarts.add_metric(key, sum(r.restarts for r in st.replicas))
                if st.first_output:
                    first.add_metric(key, list(st.first_output), st.first_output_sum_s)
                for r in st.replicas:
                    step_s.add_metric([*key, str(r.replica)], r.step_s)
                    steps.add_metric([*key, str(r.replica)], r.steps)
                    busy.add_metric([*key, str(r.replica)], r.busy_s)
                    rep_in_flight.add_metric([*key, str(r.replica)], r.in_flight)
                    rep_restarts.add_metric([*key, str(r.replica)], r.restarts)
                    if r.step_counts:
                        step_hist.add_metric([*key, str(r.replica)], cumulative(STEP_BUCKETS_S, r.step_counts),
                                             r.busy_s)
                    for phase, seconds in r.startup.items():
                        startup.add_metric([*key, str(r.replica), phase], seconds)
            runs.add_metric([name], stats.requests_in_flight)
            leases.add_metric([name], stats.leases_held)
            undecodable.add_metric([name], stats.frames_undecodable)
            queued.add_metric([name], stats.stream_bytes_queued)
            overflows.add_metric([name], stats.stream_overflows)
            holds.add_metric([name], stats.first_output_holds)
            submitted.add_metric([name], stats.requests_total)
            failed.add_metric([name], stats.requests_failed)
            aborted.add_metric([name], stats.requests_aborted)
            draining.add_metric([name], 1.0 if orch.draining else 0.0)
        return [depth, limit, healthy, engine, restarts, first, step_s, steps, busy, step_hist, rep_in_flight,
                rep_restarts, startup, runs, leases, undecodable, queued, overflows, holds, submitted, failed,
                aborted, draining]


class ApiMetrics:
    """The app's metrics; routes record latencies through `observe_*`."""

    def __init__(self, pipelines: Pipelines) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("omni_http_requests", "Answered HTTP requests",
                                ["route", "method", "status"], registry=r)
        self.errors = Counter("omni_http_errors", "Answered HTTP errors by their error code",
                              ["route", "status", "code"], registry=r)
        self.in_flight = Gauge("omni_http_requests_in_flight", "HTTP requests being served", ["route"], registry=r)
        self.ttft = Histogram("omni_time_to_first_token_seconds", "Submit to first text delta",
                              ["route", "pipeline"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.ttfa = Histogram("omni_time_to_first_audio_seconds", "Submit to first audio chunk",
                              ["route", "pipeline"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.e2e = Histogram("omni_request_duration_seconds", "Submit to last output of successful requests",
                             ["route", "pipeline"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.rtf = Histogram("omni_audio_real_time_factor", "A successful request's duration over the seconds of "
                             "audio it answered with (under 1: faster than real time)", ["route", "pipeline"],
                             buckets=RTF_BUCKETS, registry=r)
        r.register(_StageCollector(pipelines))

    def render(self) -> bytes:
        return generate_latest(self.registry)


METRICS_KEY = web.AppKey("metrics", ApiMetrics)


def route_name(request: web.Request) -> str:
    """The matched route's pattern (bounded label values), or "unmatched"."""
    info = request.match_info
    resource = info.route.resource if info.route is not None else None
    if resource is None or info.http_exception is not None:
        return "unmatched"
    return resource.canonical


CLIENT_CLOSED = 499
"""The status counted for a request whose client went away before its answer ended (nginx's)."""
_CODE = re.compile(r"[a-z0-9_]{1,64}")
"""An error code as a label value; any other (none of ours) is counted as "other"."""


class _ErrorDetail(msgspec.Struct):
    code: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail


_error_body = msgspec.json.Decoder(_ErrorBody)


def error_code(resp: web.StreamResponse | None, status: int) -> str:
    """The error code of an error answer, as a bounded label value (errors.py writes the body)."""
    if status == CLIENT_CLOSED:
        return "client_disconnected"
    body = resp.body if isinstance(resp, web.Response) else None
    if not isinstance(body, bytes):
        return "internal_error" if resp is None and status == 500 else "none"
    try:
        code = _error_body.decode(body).error.code
    except (msgspec.ValidationError, msgspec.DecodeError):
        return "none"
    if code is None:
        return "none"
    return code if _CODE.fullmatch(code) else "other"


@web.middleware
async def metrics_middleware(request: web.Request, handler) -> web.StreamResponse:
    metrics = request.app[METRICS_KEY]
    route = route_name(request)
    gauge = metrics.in_flight.labels(route)
    gauge.inc()
    status, resp = 500, None
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as exc:
        status = exc.status
        raise
    except BaseException:
        status = CLIENT_CLOSED if request.transport is None or request.transport.is_closing() else 500
        raise
    finally:
        gauge.dec()
        metrics.requests.labels(route, request.method, str(status)).inc()
        if status >= 400:
            metrics.errors.labels(route, str(status), error_code(resp, status)).inc()
        elif (in_band := request.get(IN_BAND_ERROR)) is not None:  # headers out, then an error event
            metrics.errors.labels(route, str(status), in_band if _CODE.fullmatch(in_band) else "other").inc()


async def metrics_route(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class Timing:
    """Latency marks of one pipeline call, recorded into the app's histograms."""

    def __init__(self, metrics: ApiMetrics, route: str, pipeline: str) -> None:
        self.metrics = metrics
        self.route = route
        self.pipeline = pipeline
        self.t0 = time.perf_counter()
        self.first_text: float | None = None
        self.first_audio: float | None = None
        self.audio_s = 0.0
        """Seconds of audio the call's outputs carried."""

    def saw(self, output_type: str | None, output: object = None) -> None:
        if isinstance(output, AudioOutput) and output.sample_rate:
            self.audio_s += len(output.audio) / output.sample_rate
        now = time.perf_counter()
        if output_type == "text" and self.first_text is None:
            self.first_text = now - self.t0
            self.metrics.ttft.labels(self.route, self.pipeline).observe(self.first_text)
        elif output_type == "audio" and self.first_audio is None:
            self.first_audio = now - self.t0
            self.metrics.ttfa.labels(self.route, self.pipeline).observe(self.first_audio)

    def done(self) -> float:
        e2e = time.perf_counter() - self.t0
        self.metrics.e2e.labels(self.route, self.pipeline).observe(e2e)
        if self.audio_s > 0:
            self.metrics.rtf.labels(self.route, self.pipeline).observe(e2e / self.audio_s)
        return e2e
