"""Stage engines that misbehave on purpose, loaded by real worker processes in the bus tests."""

from __future__ import annotations

from typing import Any

from omni_actors.workers.synthetic import SyntheticEngine, _Req


class OddKeyEngine(SyntheticEngine):
    """The synthetic engine, but a request with `odd_key` set gets an output keyed by an int:
    the worker sends it (msgpack carries it), and the orchestrator's typed decoder refuses it,
    as it would a frame from a worker of another version. With `odd_text` set, an output holds a
    string msgpack cannot encode at all."""

    def _chunk(self, req: _Req, text: str) -> dict[str, Any]:
        out = super()._chunk(req, text)
        if req.params.get("odd_key"):
            out[7] = "seven"
        if req.params.get("odd_text"):
            out["text"] = "\ud800"  # a lone surrogate: no UTF-8 for msgpack to carry
        return out
