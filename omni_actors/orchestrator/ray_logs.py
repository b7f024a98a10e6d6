"""With `--log-format json`, what Ray prints on the main process is JSON lines too.

Ray writes two kinds of text on its driver (the main process): records of its own `ray` logger (a
warning as the cluster starts, say), formatted by a handler of its own, and the lines its actors and
their processes (our workers) write to stdout and stderr, forwarded from every node and printed
with a `(WorkerActor pid=N, ip=...)` prefix. Either would put plain text among the JSON lines. So
in JSON mode ray.init leaves logging alone (`configure_logging=False`), the `ray` logger's records go
to the root handler (logs.py's JSON formatter), and the forwarded lines are printed by our own
handler: a worker's own JSON line passes through, any other line becomes a `worker.stderr` (or
`worker.stdout`) event naming the process, its actor and node. Ray's forwarding hook is internal
(`ray._private.worker`, ray pinned at 2.60): if it is missing, Ray's printer stays.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from omni_actors import logs
from omni_actors.orchestrator.worker_stderr import json_line, write_lines

_HANDLER = "ray_print_logs"
"""The name Ray gives its printer of forwarded lines (ray._private.worker.connect)."""


def init_options() -> dict[str, Any]:
    """ray.init's logging options for this process's log format (before ray.init)."""
    if not logs.json_logs():
        return {"logging_level": "WARNING"}
    ray_logger = logging.getLogger("ray")
    for handler in list(ray_logger.handlers):  # (Ray's plain-text handler, added at import)
        ray_logger.removeHandler(handler)
    ray_logger.propagate = True
    ray_logger.setLevel(logging.WARNING)
    return {"configure_logging": False}


def print_forwarded_as_json() -> None:
    """Swap Ray's printer of forwarded worker lines for one writing JSON lines (after ray.init)."""
    if not logs.json_logs():
        return
    with contextlib.suppress(ImportError, AttributeError):
        from ray._private import worker as ray_worker

        dispatcher = ray_worker.global_worker_stdstream_dispatcher
        events_only = ray_worker.filter_autoscaler_events
        if any(name == _HANDLER for name, _ in dispatcher.handlers):
            dispatcher.remove_handler(_HANDLER)
            dispatcher.add_handler(_HANDLER, lambda data: _print(data, events_only))


def _print(data: dict[str, Any], events_only: Any) -> None:
    """One batch of forwarded lines (Ray's dict: pid, ip, is_err, lines, actor_name, task_name). Of
    the autoscaler's lines only its events are printed, as Ray's own printer does (not its status)."""
    pid = data.get("pid")
    lines = data.get("lines") or []
    fields = {"pid": pid, "ip": data.get("ip")}
    if name := data.get("actor_name") or data.get("task_name"):
        fields["actor"] = name
    if pid in ("autoscaler", "raylet"):
        event = f"ray.{pid}"
        lines = events_only(lines) if pid == "autoscaler" else lines
    else:
        event = "worker.stderr" if data.get("is_err") else "worker.stdout"
    out = "".join(json_line(str(line).rstrip("\r\n"), event, **fields) for line in lines if str(line).strip())
    if out:
        write_lines(out)
