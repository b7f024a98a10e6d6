"""Stage engines that misbehave on purpose, loaded by real worker processes in the bus tests."""

from __future__ import annotations

import os
import threading
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


class HangOnceEngine(SyntheticEngine):
    """The synthetic engine, but the first start to find the file `hang_marker` (engine extras)
    takes it away and never finishes loading: a worker that beats but never says Ready."""

    def __init__(self, ctx: Any) -> None:
        marker = str(ctx.engine_extras.get("hang_marker", ""))
        if marker:
            try:
                os.remove(marker)
            except FileNotFoundError:
                pass
            else:
                threading.Event().wait()
        super().__init__(ctx)


class StderrEngine(SyntheticEngine):
    """The synthetic engine, but it writes to its fd 2 what no logger formats, as torch's C++ code
    does: a warning line as it starts, and as it closes `stderr_burst` more (engine extras), then a
    last line with no newline, just before the process exits; and one line on its fd 1, as a native
    library's print does."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.tag = f"s{ctx.stage_id}r{ctx.replica}"
        self.burst = int(ctx.engine_extras.get("stderr_burst", 0))
        os.write(2, f"[W1205 00:00:00.000000000 init.cpp:1] Warning: {self.tag} starting\n".encode())
        os.write(1, f"{self.tag} printed on stdout\n".encode())

    def close(self) -> None:
        lines = "".join(f"[W1205 00:00:00.000000000 x.cpp:2] Warning: {self.tag} line {i}\n" for i in range(self.burst))
        data = (lines + f"{self.tag} last words").encode()
        while data:
            data = data[os.write(2, data):]
