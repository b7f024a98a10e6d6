"""The folders of the Ray clusters omni-run starts itself (`cluster.address: local`).

Ray keeps a cluster's session files (logs, sockets) in /tmp/ray for good. A cluster of ours keeps
them in `/tmp/omni-ray-<main pid>-*` instead (short: Ray's socket paths have a length limit), removed
when it stops. A run killed with SIGKILL cannot remove it, and some of Ray's own processes outlive
their driver (its dashboard and runtime-env agents, adopted by init, with their logs open in that
folder): the next local cluster's start ends those and removes the folder, as the runtime folders
of dead runs are swept (supervisor.sweep_stale_runtime_dirs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from omni_actors import logs
from omni_actors.orchestrator.supervisor import pid_alive

log = logs.get(__name__)

PREFIX = "omni-ray-"
PARENT = Path("/tmp")


def make_session_dir(parent: Path = PARENT) -> Path:
    """A new folder for this process's cluster, named after its pid."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))


def sweep_stale_sessions(parent: Path = PARENT) -> int:
    """End the processes left holding files in the folders of dead runs, and remove those folders;
    how many folders were removed."""
    count = 0
    for folder in parent.glob(f"{PREFIX}*-*"):
        owner = folder.name.removeprefix(PREFIX).split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid() or pid_alive(int(owner)) or not folder.is_dir():
            continue
        holders = _holders(folder)
        for pid in holders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        log.info("ray.session_swept", folder=str(folder), processes=len(holders))
        count += 1
    return count


def _holders(folder: Path) -> list[int]:
    """Processes with a file open in `folder`, or working in it."""
    inside = str(folder.resolve()) + os.sep
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = [os.readlink(proc / "cwd")] + [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if any((link + os.sep).startswith(inside) for link in links):
            found.append(int(proc.name))
    return found
