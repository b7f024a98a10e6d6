"""omni-run: serve a pipeline (or several) from a deploy file, and the tool subcommands.

    omni-run [--deploy deploy.yaml] [--stage-overrides JSON] [--async-chunk | --no-async-chunk]
             [--host H] [--port P] [--model PATH|PIPELINE]... [--served-model-name NAME]...
    omni-run prepare <pipeline>              prepare a bundled pipeline's model files
    omni-run make-tiny <pipeline> <dir>      write a tiny random-weight checkpoint
    omni-run export-thinker <omni dir> <dir> write a Qwen2.5-Omni thinker's LM as a Qwen2
                                             causal-LM folder (text-only serving on vLLM)

This module runs the server: start-up checks (the port, the data and runtime dirs), first-run
preparation that a signal can stop, the pipelines started behind one API server, and a drain on
the first SIGINT/SIGTERM (abort on the second). The flags become deploys in cli_deploys.py; the
tool subcommands are cli_tools.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import os
import signal
import socket
import sys
from collections.abc import Iterator
from typing import NoReturn

import uvloop

from omni_actors import logs, progress
from omni_actors.cli_deploys import (
    DEFAULT_DEPLOY,
    TOOLS,
    TOOLS_HELP,
    bundled_deploy,
    load_from_args,
    parse_serve_args,
    served_folder,
    served_model,
    with_prepared_model,
)
from omni_actors.cli_tools import run_tool
from omni_actors.config.deploy import DeployConfig
from omni_actors.errors import ConfigError, StartupError
from omni_actors.process_exit import exit_now
from omni_actors.settings import check_data_dir, check_runtime_dir, detect_platform, settings

__all__ = [  # (cli_deploys.py's names too: callers import them from here)
    "DEFAULT_DEPLOY", "TOOLS", "TOOLS_HELP", "bundled_deploy", "check_listen", "load_from_args", "main",
    "parse_serve_args", "run", "serve", "served_folder", "served_model", "warn_ignored_devices",
    "with_prepared_model",
]


def check_listen(deploy: DeployConfig) -> None:
    """Fail before any worker starts when server.host:server.port cannot be bound."""
    host, port = deploy.server.host, deploy.server.port
    try:
        family, *_, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except OSError as err:
        raise ConfigError(f"{deploy.source}: server.host: cannot resolve {host!r}: {err.strerror or err}") from None
    try:
        socket.create_server(addr, family=family).close()
    except OSError as err:
        raise ConfigError(
            f"{deploy.source}: server.port: cannot listen on {host}:{port}: {_bind_reason(err)}"
        ) from None


def _bind_reason(err: OSError) -> str:
    """"Address already in use", without the bind wrapper's repetition of the address."""
    return os.strerror(err.errno) if err.errno and err.errno > 0 else str(err)


def warn_ignored_devices(deploy: DeployConfig) -> None:
    """Say so when `devices` are set but this machine runs stages on CPU (they do nothing there)."""
    if detect_platform() != "cpu":
        return
    stages = [st.stage_id for st in deploy.stages if st.device_list()]
    if stages:
        logs.get("omni_actors.cli").warning(
            "config.devices_ignored", deploy=deploy.source, stages=stages, platform="cpu",
            reason="no CUDA device on this machine; stages run on CPU",
        )



class _Signalled(BaseException):
    """SIGINT or SIGTERM arrived during a synchronous start-up step (a BaseException, as
    KeyboardInterrupt is, so that no `except Exception` in a model library swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise _Signalled in the main thread while the block runs (before the event
    loop's own handlers exist); a repeated signal is ignored so the unwinding's cleanup can finish."""
    sigs = (signal.SIGINT, signal.SIGTERM)

    def handler(signum: int, _frame: object) -> None:
        for sig in sigs:
            signal.signal(sig, signal.SIG_IGN)
        raise _Signalled(signum)

    before = {sig: signal.signal(sig, handler) for sig in sigs}
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


async def serve(deploys: list[DeployConfig]) -> None:
    """Serve every deploy's pipeline (each its own Orchestrator) behind one API server until a signal."""
    from omni_actors.api.app import build_app
    from omni_actors.api.loading import LOADING_KEY
    from omni_actors.api.server import start_server
    from omni_actors.orchestrator.core import Orchestrator

    log = logs.get("omni_actors.cli")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    deploys = [with_prepared_model(d) for d in deploys]  # (main() prepared them, under its signal handlers)
    first = deploys[0]
    orchs = [Orchestrator(d) for d in deploys]
    for deploy, orch in zip(deploys, orchs, strict=True):
        log.info("server.starting", pipeline=deploy.pipeline, deploy=deploy.source,
                 stages=len(orch.pipeline.stages), async_chunk=deploy.async_chunk)
    # The API listens while the models load (api/loading.py): clients see "loading", not a refused port.
    app = build_app(orchs)
    app[LOADING_KEY].begin()
    try:
        http = await start_server(app, first.server.host, first.server.port, first.server)
    except OSError as err:  # taken since check_listen ran
        raise ConfigError(
            f"{first.source}: server.port: cannot listen on {first.server.host}:{first.server.port}: "
            f"{_bind_reason(err)}"
        ) from None
    log.info("server.listening", url=f"http://{first.server.host}:{first.server.port}", loading=True)
    starting = asyncio.ensure_future(_start_all(orchs))
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # a signal while the stages load: nothing to drain
        log.info("server.stopping", phase="starting")
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await asyncio.gather(*(o.stop(drain=False) for o in orchs))
        await http.close()
        log.info("server.stopped")
        return
    waiter.cancel()
    try:
        starting.result()
    except BaseException:
        await http.close()
        raise
    app[LOADING_KEY].end()
    for orch in orchs if len(orchs) > 1 else ():
        assert orch.runtime is not None
        log.info("pipeline.ready", pipeline=orch.pipeline.name, model=orch.deploy.server.served_model_name,
                 shm_prefix=orch.run_prefix, runtime_dir=str(orch.runtime.path))
    assert orchs[0].runtime is not None
    log.info("server.ready", url=f"http://{first.server.host}:{first.server.port}",
             shm_prefix=orchs[0].run_prefix, runtime_dir=str(orchs[0].runtime.path))
    if not logs.json_logs():
        from omni_actors.summary import startup_summary

        for i, (deploy, orch) in enumerate(zip(deploys, orchs, strict=True)):
            print(startup_summary(deploy, orch.pipeline, urls=i == len(orchs) - 1, gpu_sharing=orch.gpu_sharing), file=sys.stderr, flush=True)
    await stop.wait()
    log.info("server.stopping")
    stop.clear()
    for orch in orchs:
        orch.draining = True
    stopping = asyncio.ensure_future(asyncio.gather(*(o.stop(drain=True) for o in orchs)))
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stopping, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():  # a second signal: end in-flight requests instead of draining them
        log.info("server.hurrying", requests=sum(len(o.runs) for o in orchs))
        for orch in orchs:
            orch.abort_all()
    waiter.cancel()
    await stopping
    await http.close()
    log.info("server.stopped")


async def _start_all(orchs: list) -> None:
    """Start every pipeline's workers together; if one fails, stop the others and raise its error."""
    results = await asyncio.gather(*(o.start() for o in orchs), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(o.stop(drain=False) for o in orchs))
        raise errors[0]


def _log_flags(argv: list[str]) -> list[str]:
    """Take --log-format / --log-level (any command) out of argv and apply them before logging starts."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--log-format", choices=logs.FORMATS)
    p.add_argument("--log-level", choices=logs.LEVELS, type=str.lower)
    known, rest = p.parse_known_args(argv)
    logs.apply_cli_flags(known.log_level, known.log_format)
    return rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        argv = _log_flags(argv)
    except SystemExit as exit_:  # a bad choice: argparse printed the usage line
        return int(exit_.code or 2)
    try:  # every OMNI_* variable, before anything reads one
        settings()
    except ConfigError as err:
        print(f"omni-run: config error: {err}", file=sys.stderr)
        return 2
    logs.configure()
    progress.main_process()
    try:
        if argv and argv[0] in TOOLS:
            return run_tool(argv)
        args = parse_serve_args(argv)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>` prints its stacks
        check_data_dir(settings().data_dir)  # files, voices, the store and prepared models live there
        check_runtime_dir(settings().runtime_parent)  # each run's private dir of ipc sockets goes there
        deploys = load_from_args(args)
        check_listen(deploys[0])
        for deploy in deploys:
            warn_ignored_devices(deploy)
        try:  # first-run preparation runs here, in the main thread, so that a signal stops it
            with _signals_raise():
                deploys = [with_prepared_model(d) for d in deploys]
        except _Signalled as stopped:
            log = logs.get("omni_actors.cli")
            log.info("server.stopping", phase="prepare", signal=signal.Signals(stopped.signum).name)
            log.info("server.stopped")
            return 128 + stopped.signum
        uvloop.run(serve(deploys))
        return 0
    except ConfigError as err:
        print(f"omni-run: config error: {err}", file=sys.stderr)
        return 2
    except StartupError as err:
        print(f"omni-run: {err}", file=sys.stderr)
        return 2 if err.config else 1  # (a missing checkpoint file is the folder's fault, as a config error)
    except KeyboardInterrupt:
        return 130


def run() -> NoReturn:
    """The `omni-run` command: `main`, then the process ends without the interpreter's teardown
    (process_exit.py; `main` itself returns, for a caller in the same interpreter)."""
    exit_now(main())


if __name__ == "__main__":
    run()
