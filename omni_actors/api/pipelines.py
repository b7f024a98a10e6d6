"""The pipelines one server holds, and how a request's `model` picks one of them.

    pipelines = Pipelines([orch_a, orch_b])               # app[PIPELINES_KEY], in deploy order
    orch, model = route_model(request, req.model, {"image"})  # 404 model_not_found / 400 unsupported_modality

Each pipeline is its own Orchestrator (own workers, bus, supervisor, shared-memory
prefix), so stage ids and bus identities of two pipelines never meet. A pipeline
answers to its served name (`server.served_model_name`, or the folder's name for
`--model DIR`) and to its pipeline's name; when two pipelines share a name, the first
listed owns it. A request without a model goes to the first pipeline that can make
what the route makes (with one pipeline: that one, as always). A full-duplex model (Moshi) is
served only as realtime sessions: a REST request that names it, or finds it the only pipeline, is a
400 `full_duplex_model`; one without a model passes over it.

`route_model` records the chosen orchestrator on the request, so the route's later
`orchestrator(request)` and `PipelineCall(request, ...)` reach the same one.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from omni_actors.api.errors import ApiError, bad_request
from omni_actors.orchestrator.core import Orchestrator

ROUTED = web.RequestKey("orchestrator", Orchestrator)
"""The request's key for the orchestrator `route_model` chose."""


def served_model_names(orch: Orchestrator) -> list[str]:
    """Names a request's `model` may carry: the served name (if set) and the pipeline's name."""
    names = [orch.deploy.server.served_model_name] if orch.deploy.server.served_model_name else []
    return [*names, orch.pipeline.name] if orch.pipeline.name not in names else names


def model_id(orch: Orchestrator) -> str:
    """The pipeline's own name in this server: its served name, else its pipeline's name
    (the `pipeline` label of its metrics, its key in /health and /v1/status)."""
    return served_model_names(orch)[0]


class Pipelines:
    """The orchestrators of one server, first = the default."""

    def __init__(self, orchs: Sequence[Orchestrator]) -> None:
        if not orchs:
            raise ValueError("a server needs at least one pipeline")
        self.all = tuple(orchs)
        self.by_name: dict[str, Orchestrator] = {}
        for orch in self.all:
            for name in served_model_names(orch):
                self.by_name.setdefault(name, orch)

    @property
    def default(self) -> Orchestrator:
        return self.all[0]

    def names(self) -> list[str]:
        """Every model name a request may use, each once, in deploy order."""
        return list(self.by_name)

    def names_of(self, orch: Orchestrator) -> list[str]:
        return [n for n, o in self.by_name.items() if o is orch]

    def first_making(self, wanted: set[str]) -> Orchestrator:
        """The first pipeline that makes `wanted`, else the default."""
        return next((o for o in self.all if wanted <= o.pipeline.output_types()), self.default)

    def find(self, name: str | None, wanted: set[str] | frozenset[str], param: str = "model",
             outputs_param: str = "model") -> tuple[Orchestrator, str]:
        """The pipeline for `name` (None or "": the first that makes `wanted`) and the name to echo back.

        `wanted` is what the request will generate; a route that only looks a model up (GET
        /v1/models/{id}, /v1/realtime) passes an empty set. A request to generate never reaches a
        full-duplex model: it is served only as realtime sessions (a 400 naming `param`)."""
        if name:
            orch = self.by_name.get(name)
            if orch is None:
                raise ApiError(404, f"model {name!r} does not exist; this server serves {self.names()}", param,
                               "model_not_found")
        elif len(self.all) == 1:
            orch, name = self.default, model_id(self.default)
        else:
            found = next((o for o in self.all if set(wanted) <= o.pipeline.output_types()
                          and not (wanted and o.pipeline.duplex)), None)
            if found is None:
                makes = {model_id(o): sorted(o.pipeline.output_types()) for o in self.all}
                raise bad_request(f"no model of this server produces {sorted(wanted)}; name one in `model` "
                                  f"({makes})", param, "unsupported_modality")
            orch, name = found, model_id(found)
        if wanted and orch.pipeline.duplex:
            raise bad_request(f"model {name!r} is full-duplex: it is served only as realtime sessions; open the "
                              f"realtime WebSocket (GET /v1/realtime?model={name})", param, "full_duplex_model")
        require_outputs(orch, wanted, outputs_param)
        return orch, name


PIPELINES_KEY = web.AppKey("pipelines", Pipelines)


def require_outputs(orch: Orchestrator, wanted: set[str] | frozenset[str], param: str) -> None:
    have = orch.pipeline.output_types()
    missing = sorted(set(wanted) - have)
    if missing:
        raise bad_request(
            f"pipeline {orch.pipeline.name!r} cannot produce {missing}; it produces {sorted(have)}",
            param, "unsupported_modality")


def route_model(request: web.Request, name: str | None, wanted: set[str] | frozenset[str], param: str = "model",
                outputs_param: str = "model") -> tuple[Orchestrator, str]:
    """Route `request` to the pipeline serving `name` (see Pipelines.find) and remember the choice."""
    orch, model = request.app[PIPELINES_KEY].find(name, wanted, param, outputs_param)
    request[ROUTED] = orch
    return orch, model


def orchestrator(request: web.Request) -> Orchestrator:
    """The pipeline `route_model` chose for this request, else the server's first."""
    routed = request.get(ROUTED)
    return routed if routed is not None else request.app[PIPELINES_KEY].default
