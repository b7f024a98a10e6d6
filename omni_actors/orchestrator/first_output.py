"""Deploy `first_output_priority`: while a worker steps for some request's first output, the
workers that share its device hold their steps.

Stages placed on one GPU run in separate processes whose kernels the GPU time-slices: a speech
decoder's first window (the first audio of a request) then runs beside the AR stages still
decoding the same request, and takes longer than alone. A worker whose engine says its next
step makes a first output (`StageEngine.first_output_next`) sends FirstOutput(True) before the
step and FirstOutput(False) after it; meanwhile this sends every other live worker sharing one
of its devices a Hold (a CPU stage's device is the host), and a Hold(0) once no worker on its
devices claims. A Hold lapses by itself after HOLD_S (a claimer that died mid-step); the worker
caps it too (loop.HOLD_MAX_S). By default only stages on GPUs take part (on a CUDA host a stage
without `devices` is on GPU 0; true: CPU stages too, sharing the host; false: none). Local deployments only: a cluster's workers on other hosts
share no device with these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from omni_actors.bus import messages as m
from omni_actors.config.deploy import DeployConfig

if TYPE_CHECKING:
    from omni_actors.orchestrator.launcher import WorkerHandle

HOLD_S = 0.5
"""How long one Hold lasts unless released first: longer than a first window's step."""


def devices_of(deploy: DeployConfig, stage_id: int, replica: int, platform: str) -> frozenset[str]:
    """The devices a stage replica shares with others: its GPUs (GPU 0, CUDA's default, for a stage
    without `devices` on a CUDA host); on a host without CUDA "cpu" when `first_output_priority`
    is true, nothing when it is left to its default (GPUs only)."""
    dep = deploy.stage(stage_id)
    tp = dep.tensor_parallel_size
    mine = dep.device_list()[replica * tp : (replica + 1) * tp]
    if platform == "cuda":
        return frozenset(mine or ["0"])
    return frozenset({"cpu"}) if deploy.first_output_priority else frozenset()


def claims_first_outputs(deploy: DeployConfig, stage_id: int, platform: str) -> bool:
    """Whether a stage's workers say when a step makes a first output (WorkerSpec.first_claims)."""
    on = deploy.first_output_priority is not False and deploy.cluster.backend == "local"
    return on and bool(devices_of(deploy, stage_id, 0, platform))


class FirstOutputPriority:
    def __init__(self, deploy: DeployConfig, platform: str, send: Callable[[bytes, m.Message], None]) -> None:
        self.deploy = deploy
        self.platform = platform
        self.send = send
        self.enabled = deploy.first_output_priority is not False and deploy.cluster.backend == "local"
        self.claims: set[bytes] = set()
        self.held: set[bytes] = set()
        self.holds = 0
        """Holds sent (a held worker counted once per claim that held it)."""

    def on_claim(self, h: WorkerHandle, active: bool, workers: Iterable[WorkerHandle]) -> None:
        if not self.enabled:
            return
        if active:
            self.claims.add(h.identity)
        else:
            self.claims.discard(h.identity)
        live = [w for w in workers if w.ready and not w.dead]
        alive = {w.identity for w in live}
        self.claims &= alive  # (a worker that died claiming, or held, is gone: a restart has a new identity)
        self.held &= alive
        devices = {w.identity: devices_of(self.deploy, w.stage_id, w.replica, self.platform) for w in live}
        claimers = [w for w in live if w.identity in self.claims]
        for w in live:
            held = w.identity not in self.claims and any(
                devices[w.identity] & devices[c.identity] for c in claimers
            )
            if held and w.identity not in self.held:
                self.held.add(w.identity)
                self.holds += 1
                self.send(w.identity, m.Hold(HOLD_S))
            elif not held and w.identity in self.held:
                self.held.discard(w.identity)
                self.send(w.identity, m.Hold(0.0))
