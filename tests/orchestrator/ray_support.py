"""A Ray cluster of several nodes on this machine (`ray.cluster_utils.Cluster`) for a test module,
its session files in a short folder of its own, and nothing of it left running afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ray.cluster_utils import Cluster


@contextlib.contextmanager
def local_cluster(head: dict[str, Any], nodes: list[dict[str, Any]]) -> Iterator[Cluster]:
    """A head node with `head`'s arguments and one node per entry of `nodes` (Cluster.add_node's)."""
    tmp = tempfile.mkdtemp(prefix="omni-ray-", dir="/tmp")  # (short: Ray's socket paths have a length limit)
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    c = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False})
    try:
        for node in nodes:
            c.add_node(**node)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        left = processes_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Ray processes left running: {left}"


def processes_under(path: str) -> list[int]:
    """Processes whose command line names `path` (Ray's daemons name their session dir)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
                state = (proc / "stat").read_text().split()[2]
            except OSError:
                continue
            if path.encode() in cmd and state != "Z":
                out.append(int(proc.name))
    return out
