"""The supervisor: every stage replica's worker process from start to exit.

It starts workers and waits for their Ready, watches each process's exit and
each worker's heartbeats, restarts dead workers with backoff, and keeps the
health the API reports. Request bookkeeping stays in the orchestrator, which is
told of each death through `on_death`.

Liveness has three thresholds. Heartbeats leave a worker's heartbeat thread every
HEARTBEAT_INTERVAL_S whatever its engine is doing. A Ready worker silent for
`unresponsive_after_s` (a few intervals) is unresponsive: its stage turns
unhealthy and takes no new requests, but nothing is killed, and its next
message makes it responsive again. Silent for `heartbeat_timeout_s`, it is
killed and restarted. Independently, a heartbeat saying the current engine
step has run past the stage's `max_step_s` gets the worker killed as stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from omni_actors import logs, progress
from omni_actors.bus import messages as m
from omni_actors.bus.router_pair import Bus
from omni_actors.bus.shm import SHM_DIR, unlink_prefix, unlink_segment
from omni_actors.bus.sockets import RuntimeDir
from omni_actors.config.deploy import DeployConfig
from omni_actors.config.pipeline import PipelineConfig
from omni_actors.errors import StartupError
from omni_actors.orchestrator import mps
from omni_actors.orchestrator.launcher import (
    HEARTBEAT_INTERVAL_S,
    Launcher,
    WorkerHandle,
    end_process,
)

log = logs.get(__name__)

STARTUP_TIMEOUT_S = 900.0
"""Longest wait for every worker's Ready at start (real models load slowly on CPU)."""
RESTART_READY_TIMEOUT_S = STARTUP_TIMEOUT_S
"""Longest wait for a restarted worker's Ready before it is killed and tried again (with backoff)."""
STARTING_SILENCE_S = 120.0
"""A worker that is not Ready yet and has sent nothing (its heartbeat thread beats while the engine
loads) for this long is hung, not loading: it is killed and, if a restart, tried again."""
HEARTBEAT_TIMEOUT_S = 60.0
"""A worker silent this long is presumed hung and is killed (then restarted)."""
UNRESPONSIVE_AFTER_S = 4 * HEARTBEAT_INTERVAL_S
"""A Ready worker silent this long takes no new requests and its stage reports unhealthy
(until it speaks again, or HEARTBEAT_TIMEOUT_S has it killed)."""
WATCHDOG_PERIOD_S = HEARTBEAT_INTERVAL_S
"""How often the supervisor looks for silent workers."""
RESTART_BACKOFF_S = (0.0, 1.0, 5.0, 15.0)
"""Delay before restart attempts 1, 2, 3 and later ones of a worker that keeps dying."""
BACKOFF_RESET_AFTER_S = 120.0
"""A worker that served this long before it died is restarted at once again (the backoff
counts deaths in a row, and a worker healthy this long ends the row)."""


class Supervisor:
    def __init__(
        self,
        deploy: DeployConfig,
        pipeline: PipelineConfig,
        on_death: Callable[[WorkerHandle, str], None],
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        restart_timeout_s: float = RESTART_READY_TIMEOUT_S,
        unresponsive_after_s: float = UNRESPONSIVE_AFTER_S,
        starting_silence_s: float = STARTING_SILENCE_S,
        backoff_reset_after_s: float = BACKOFF_RESET_AFTER_S,
    ) -> None:
        self.deploy = deploy
        self.pipeline = pipeline
        # A server of several pipelines: whose stage 0 loaded or died is said by the pipeline's served name
        # (as /metrics' `pipeline` label), not its pipeline's name, which two pipelines may share.
        self.name = deploy.server.served_model_name or pipeline.name
        self.log = log.bind(pipeline=self.name)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.restart_timeout_s = restart_timeout_s
        self.unresponsive_after_s = min(unresponsive_after_s, heartbeat_timeout_s)
        self.backoff_reset_after_s = backoff_reset_after_s
        self.starting_silence_s = starting_silence_s
        self._on_death_cb = on_death
        self.workers: dict[int, list[WorkerHandle]] = {s: [] for s in pipeline.stage_ids}
        self.by_identity: dict[bytes, WorkerHandle] = {}
        self.by_producer: dict[str, WorkerHandle] = {}
        self.restarts: dict[tuple[int, int], int] = {}
        """Restarts of each (stage, replica) since start."""
        self.deaths_in_row: dict[tuple[int, int], int] = {}
        """Deaths of each (stage, replica) with no healthy period between: picks the backoff."""
        self.launcher: Launcher | None = None
        self.draining = False
        self.closing = False
        self._tasks: set[asyncio.Task] = set()
        self._healthy = asyncio.Event()
        self._watchdog: asyncio.TimerHandle | None = None

    # ---- start and stop -------------------------------------------------------

    async def start_all(self, launcher: Launcher) -> None:
        """Start a worker per replica and wait for every Ready (StartupError names the stage)."""
        self.launcher = launcher
        self._arm_watchdog()  # (a worker that hangs while starting is caught too)
        handles = []
        for sid in self.pipeline.stage_ids:
            for replica in range(self.deploy.stage(sid).num_replicas):
                handles.append(await self.spawn(sid, replica, generation=0))
        # Weights load in the workers; each Ready is a loaded stage replica (omni_actors/progress.py).
        loading = progress.start("stages.loading", len(handles), pipeline=self.name)
        waits = {asyncio.ensure_future(self._wait_ready(h, loading)): h for h in handles}
        done, pending = await asyncio.wait(waits, timeout=STARTUP_TIMEOUT_S, return_when=asyncio.FIRST_EXCEPTION)
        for fut in pending:
            fut.cancel()
        for fut in done:
            fut.result()
        if pending:
            h = waits[next(iter(pending))]
            raise StartupError(h.stage_id, f"no Ready within {STARTUP_TIMEOUT_S:.0f} s")

    async def _wait_ready(self, h: WorkerHandle, loading: progress.Progress) -> None:
        assert h.ready_future is not None
        await h.ready_future
        model_stage = self.pipeline.stage(h.stage_id).model_stage
        self.log.info("stage.ready", stage_id=h.stage_id, replica=h.replica, pid=h.pid, model_stage=model_stage,
                      **startup_log_keys(h))
        loading.advance(stage=model_stage)

    async def spawn(self, stage_id: int, replica: int, generation: int) -> WorkerHandle:
        assert self.launcher is not None
        h = self.launcher.new_handle(stage_id, replica, generation)
        h.ready_future = asyncio.get_running_loop().create_future()
        h.last_seen = h.spawned_at = time.monotonic()
        self.by_identity[h.identity] = h
        self.by_producer[h.producer] = h
        slots = self.workers[stage_id]
        if replica < len(slots):
            slots[replica] = h
        else:
            slots.append(h)
        await self.launcher.spawn(h)
        self._spawn_task(self._watch_exit(h))
        return h

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            self.log.error("supervisor.task_failed", task=task.get_coro().__qualname__, error=repr(err))

    async def stop_all(self, router: Bus | None) -> None:
        """Ask every worker to exit, signal those that don't, and wait for all of them."""
        self.closing = True
        self._healthy.clear()
        if self._watchdog:
            self._watchdog.cancel()
        handles = [h for hs in self.workers.values() for h in hs if h.proc]
        if router is not None:
            for h in handles:
                if not h.dead:
                    router.send_nowait(h.identity, m.Shutdown())
            router.flush()
        # A worker that is not Ready may not have connected yet: signal it instead of waiting.
        await asyncio.gather(
            *(end_process(h.proc, first_signal=None if h.ready else signal.SIGTERM) for h in handles),
            return_exceptions=True,
        )
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # A restart whose spawn finished while the others were ending started one more: end it too.
        late = [h for hs in self.workers.values() for h in hs
                if h.proc is not None and h not in handles and h.proc.returncode is None]
        await asyncio.gather(*(end_process(h.proc, first_signal=signal.SIGKILL) for h in late),
                             return_exceptions=True)
        for h in (*handles, *late):
            if self.launcher is not None and h.proc is not None and h.proc.returncode is not None:
                self.launcher.after_exit(h)

    # ---- what workers say -------------------------------------------------------

    def on_ready(self, h: WorkerHandle, pid: int, startup: m.StartupPhases | None = None,
                 capacity: int | None = None) -> None:
        # The bus identity is this generation's own, so its Ready is this process's even when it
        # comes before `spawn` has returned (h.proc still None: a loaded host can take longer to
        # hand back a started process than a light worker takes to load), which once left start-up
        # waiting for a Ready it had dropped. (pid None: a Ray worker not yet reported.)
        if h.dead or (h.proc is not None and h.proc.pid not in (pid, None)):
            self.log.warning("worker.ready_ignored", stage_id=h.stage_id, replica=h.replica, pid=pid, dead=h.dead,
                             proc_pid=h.pid)
            return
        h.ready = True
        h.ready_at = time.monotonic()
        h.startup = startup
        h.capacity = capacity if isinstance(capacity, int) and capacity > 0 else None
        if h.ready_future and not h.ready_future.done():
            h.ready_future.set_result(None)
        self.update_health()

    def on_start_failed(self, h: WorkerHandle, error: str) -> None:
        if h.ready_future and not h.ready_future.done():
            h.ready_future.set_exception(StartupError(h.stage_id, error))
        self.log.error("stage.start_failed", stage_id=h.stage_id, replica=h.replica, error=error)

    def on_seen(self, h: WorkerHandle) -> None:
        """Any message from a worker: it is alive now."""
        h.last_seen = time.monotonic()
        if not h.responsive:
            h.responsive = True
            self.log.info("worker.responsive", stage_id=h.stage_id, replica=h.replica, pid=h.pid)
            self.update_health()

    def on_heartbeat(self, h: WorkerHandle, beat: m.Heartbeat) -> None:
        h.engine_requests = beat.busy
        h.leases_out = beat.leased
        h.steps, h.step_s, h.beat_at = beat.steps, beat.step_s, time.monotonic()
        h.busy_s, h.step_counts = beat.busy_s, beat.step_counts
        limit = self.deploy.stage(h.stage_id).max_step_s
        if beat.step_s > limit and h.ready and not h.dead:
            self.log.error("worker.step_stuck", stage_id=h.stage_id, replica=h.replica, pid=h.pid,
                           step_s=round(beat.step_s, 1), max_step_s=limit, steps=beat.steps)
            self._kill(h, f"an engine step ran {beat.step_s:.0f} s, past the stage's max_step_s of {limit:g} s")

    # ---- health ---------------------------------------------------------------------

    @staticmethod
    def serving(h: WorkerHandle) -> bool:
        """Ready, and heard from lately: new requests may go here."""
        return h.ready and h.responsive

    def health(self) -> dict[int, bool]:
        return {sid: any(self.serving(h) for h in hs) for sid, hs in self.workers.items()}

    def update_health(self) -> None:
        if all(self.health().values()) and not self.draining:
            self._healthy.set()
        else:
            self._healthy.clear()

    async def wait_healthy(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await self._healthy.wait()

    # ---- deaths and restarts ----------------------------------------------------------

    async def _watch_exit(self, h: WorkerHandle) -> None:
        assert h.proc is not None
        code = await h.proc.wait()
        if self.launcher is not None:
            self.launcher.after_exit(h)
        if not self.closing:
            self._on_death(h, getattr(h.proc, "exit_detail", None) or f"exit code {code}")

    def _on_death(self, h: WorkerHandle, detail: str) -> None:
        if h.dead:
            return
        h.dead = True
        was_ready, h.ready = h.ready, False
        key = (h.stage_id, h.replica)
        if was_ready and time.monotonic() - h.ready_at >= self.backoff_reset_after_s:
            self.deaths_in_row[key] = 0  # it served a healthy while: this death starts a new row
        self.log.error("worker.died", stage_id=h.stage_id, replica=h.replica, pid=h.pid, detail=detail)
        if h.ready_future and not h.ready_future.done():
            h.ready_future.set_exception(StartupError(h.stage_id, f"worker exited ({detail})"))
        try:
            self._on_death_cb(h, detail)
        finally:
            # Whatever the bookkeeping did, the stage must come back.
            self._forget(h)
            self.update_health()
            if was_ready and not self.draining:
                self._spawn_task(self._restart(h))

    async def _restart(self, h: WorkerHandle) -> None:
        key = (h.stage_id, h.replica)
        while not self.closing:
            attempt = self.deaths_in_row.get(key, 0)
            self.deaths_in_row[key] = attempt + 1
            self.restarts[key] = self.restarts.get(key, 0) + 1
            await asyncio.sleep(RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)])
            if self.closing:
                return
            try:
                h = await self.spawn(h.stage_id, h.replica, h.generation + 1)
            except OSError as err:  # e.g. fork refused under memory pressure: try again later
                self.log.error("worker.restart_failed", stage_id=h.stage_id, replica=h.replica, error=repr(err))
                continue
            assert h.ready_future is not None and h.proc is not None
            self.log.info("worker.restarting", stage_id=h.stage_id, replica=h.replica, pid=h.pid,
                          generation=h.generation, attempt=attempt + 1)
            try:
                async with asyncio.timeout(self.restart_timeout_s):
                    await asyncio.shield(h.ready_future)
                self.log.info("worker.restarted", stage_id=h.stage_id, replica=h.replica, pid=h.pid,
                              **startup_log_keys(h))
                return
            except (StartupError, TimeoutError) as err:
                detail = str(err) or f"no Ready within {self.restart_timeout_s:.0f} s"
                self.log.error("worker.restart_failed", stage_id=h.stage_id, replica=h.replica, error=detail)
                h.dead = True  # this generation is given up: a late Ready must not revive it
                await end_process(h.proc, first_signal=signal.SIGKILL)
                self._forget(h)

    def _forget(self, h: WorkerHandle) -> None:
        """A gone worker's leases can no longer be freed by it: drop its name and its segments."""
        self.by_producer.pop(h.producer, None)
        unlink_prefix(h.shm_prefix)

    def _arm_watchdog(self) -> None:
        loop = asyncio.get_running_loop()
        period = min(WATCHDOG_PERIOD_S, self.unresponsive_after_s / 2)
        self._watchdog = loop.call_later(period, self._check_heartbeats)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        changed = False
        for hs in self.workers.values():
            for h in hs:
                if h.dead or h.proc is None:
                    continue
                silent = now - h.last_seen
                if not h.ready:
                    if silent > self.starting_silence_s and h.ready_future and not h.ready_future.done():
                        self.log.error("worker.silent_starting", stage_id=h.stage_id, replica=h.replica, pid=h.pid)
                        self._kill(h, f"silent for {silent:.0f} s while starting")
                    continue
                if silent > self.heartbeat_timeout_s:
                    self.log.error("worker.silent", stage_id=h.stage_id, replica=h.replica, pid=h.pid)
                    self._kill(h, "missed heartbeats")
                elif silent > self.unresponsive_after_s and h.responsive:
                    h.responsive = False
                    changed = True
                    self.log.warning("worker.unresponsive", stage_id=h.stage_id, replica=h.replica, pid=h.pid,
                                     silent_s=round(silent, 1))
        if changed:
            self.update_health()
        if not self.closing:
            self._arm_watchdog()

    def _kill(self, h: WorkerHandle, detail: str) -> None:
        """End a worker presumed hung or stuck; its requests fail with `detail` and it is restarted."""
        if h.proc and h.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                h.proc.kill()
        self._on_death(h, detail)


def startup_log_keys(h: WorkerHandle) -> dict[str, float]:
    """A Ready worker's start-up phases as log keys: `ready_s`, `boot_s`, ..., `engine_weights_s`."""
    return {k.replace(".", "_") + "_s": v for k, v in h.startup_seconds().items()}


def sweep_stale_segments() -> int:
    """Unlink shared-memory segments of runs whose main process no longer exists."""
    count = 0
    for path in SHM_DIR.glob("omni-*-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            unlink_segment(path.name)
            count += 1
    return count


def sweep_stale_runtime_dirs(parent: Path) -> int:
    """Remove runtime directories (`omni-run-*`) of runs whose main process no longer exists."""
    count = 0
    for owner in parent.glob(f"{RuntimeDir.PREFIX}*/{RuntimeDir.OWNER_FILE}"):
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if not pid_alive(pid):
            mps.quit_stale(owner.parent)  # (a daemon of its own, if it had one)
            shutil.rmtree(owner.parent, ignore_errors=True)  # (refuses a symlink)
            count += 1
    return count


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
