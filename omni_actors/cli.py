"""omni-run: serve a pipeline (or several) from a deploy file, and the tool subcommands.

    omni-run [--deploy deploy.yaml] [--stage-overrides JSON] [--async-chunk | --no-async-chunk]
             [--host H] [--port P] [--model PATH|PIPELINE]... [--served-model-name NAME]...
    omni-run prepare <pipeline>              prepare a bundled pipeline's model files
    omni-run make-tiny <pipeline> <dir>      write a tiny random-weight checkpoint
    omni-run export-thinker <omni dir> <dir> write a Qwen2.5-Omni thinker's LM as a Qwen2
                                             causal-LM folder (text-only serving on vLLM)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import faulthandler
import os
import signal
import socket
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import uvloop

from omni_actors import logs, progress
from omni_actors.cli_tools import run_tool
from omni_actors.config.deploy import (
    DeployConfig,
    check_distinct,
    load_deploys,
    parse_stage_overrides,
)
from omni_actors.config.deploy_yaml import load_raw
from omni_actors.errors import ConfigError, StartupError
from omni_actors.process_exit import exit_now
from omni_actors.settings import check_data_dir, check_runtime_dir, detect_platform, settings

DEFAULT_DEPLOY = "assistant.yaml"
"""The bundled deploy file `omni-run` serves with no --deploy (in omni_actors/deploy/)."""

TOOLS = ("prepare", "make-tiny", "export-thinker")
TOOLS_HELP = """commands (each has its own --help):
  omni-run prepare <pipeline>              prepare a bundled pipeline's model files
  omni-run make-tiny <pipeline> <dir>      write a tiny random-weight checkpoint
  omni-run export-thinker <omni dir> <dir> export a Qwen2.5-Omni thinker's LM as a Qwen2 folder
"""


def bundled_deploy(name: str = DEFAULT_DEPLOY) -> Path:
    return Path(str(resources.files("omni_actors") / "deploy" / name))


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omni-run", description="Serve an omni-modal pipeline.", epilog=TOOLS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--deploy", metavar="FILE", help="deploy YAML (default: the bundled speech assistant); "
                   "its fields: docs/guides/deploy-file.md")
    p.add_argument("--stage-overrides", metavar="JSON",
                   help='per-stage deploy fields over the file\'s, e.g. \'{"0": {"max_num_seqs": 16}}\'')
    p.add_argument("--async-chunk", dest="async_chunk", action="store_true", default=None,
                   help="stream partial results between stages (the deploy's `async_chunk`; on by default)")
    p.add_argument("--no-async-chunk", dest="async_chunk", action="store_false",
                   help="each stage waits for the whole output of the one before")
    p.add_argument("--host", help="address to listen on (the deploy's server.host; default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (the deploy's server.port; default 8000)")
    p.add_argument(
        "--model", action="append",
        help="model folder (or a registered pipeline's name); without --deploy, the pipeline is detected "
        "from the folder (model_index.json / config.json); repeat it to serve several pipelines from one "
        "server; with --deploy, it overrides the file's `model`",
    )
    p.add_argument("--served-model-name", action="append",
                   help="the `model` name clients use (default: the folder's or the pipeline's name); "
                   "with several --model, one per --model, in the same order")
    p.add_argument("--log-format", choices=logs.FORMATS, help="console (default) or json lines")
    p.add_argument("--log-level", choices=logs.LEVELS, help="default info; debug also shows vLLM's own logs")
    return p


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    p = _serve_parser()
    if argv and not argv[0].startswith("-"):  # serving takes no positional arguments
        close = difflib.get_close_matches(argv[0], TOOLS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(TOOLS)}"
        p.error(f"unknown command {argv[0]!r}; {hint}")
    return p.parse_args(argv)


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


def load_from_args(args: argparse.Namespace) -> list[DeployConfig]:
    """The deploys to serve (one per pipeline) from the command line."""
    models, names = args.model or [], args.served_model_name or []
    # An empty value (`--deploy "$DEPLOY"` with the variable unset) is a mistake, never "the default".
    if args.deploy is not None and not args.deploy.strip():
        raise ConfigError("--deploy: empty; give a deploy YAML file (leave the flag out to serve the bundled "
                          "assistant)")
    if any(not m.strip() for m in models):
        raise ConfigError("--model: empty; give a model folder or a registered pipeline's name")
    if args.stage_overrides is not None and not args.stage_overrides.strip():
        raise ConfigError("--stage-overrides: empty; give a JSON object keyed by stage id, e.g. "
                          "'{\"0\": {\"max_num_seqs\": 16}}'")
    if any(not n.strip() for n in names):
        raise ConfigError("--served-model-name: empty; give the name clients put in `model`")
    overlay: dict[str, Any] = {}
    if args.stage_overrides:
        if len(models) > 1:
            raise ConfigError("--stage-overrides: applies to one pipeline; with several --model, "
                              "write a deploy file with `pipelines` (docs/serving.md)")
        overlay.update(parse_stage_overrides(args.stage_overrides))
    if args.async_chunk is not None:
        overlay["async_chunk"] = args.async_chunk
    server = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if server:
        overlay["server"] = server
    if args.deploy and len(models) > 1:
        raise ConfigError("--model: with --deploy, give at most one --model (it overrides the file's `model`); "
                          "list several pipelines in the deploy file's `pipelines` instead")
    if not args.deploy and models:  # (the bundled deploy takes no --model: each is served on its own)
        if names and len(names) != len(models):
            raise ConfigError(f"--served-model-name: given {len(names)} time(s) for {len(models)} --model; "
                              "give one per --model, in the same order, or none")
        twice = next((m for i, m in enumerate(models) if m in models[:i]), None)
        if twice is not None and not names:
            raise ConfigError(f"--model {twice}: given twice; to serve it under two names, give a "
                              "--served-model-name per --model")
        deploys = [served_model(m, overlay, names[i] if names else None) for i, m in enumerate(models)]
        check_distinct(deploys)
        return deploys
    if len(names) > 1:
        raise ConfigError("--served-model-name: given more than once for one pipeline")
    path = Path(args.deploy) if args.deploy else bundled_deploy()
    if models or names or args.stage_overrides:  # flags for one pipeline
        if names:
            overlay["server"] = {**overlay.get("server", {}), "served_model_name": names[0]}
        if models:
            overlay["model"] = models[0]
        # Counted from the file as written: validating it first, without the overrides, would refuse a
        # `model` path that --model replaces.
        entries = load_raw(path).get("pipelines")
        if isinstance(entries, list) and len(entries) > 1:
            raise ConfigError(f"{path}: lists {len(entries)} pipelines: --model, --served-model-name and "
                              "--stage-overrides apply to one; set them in the file's `pipelines` entries")
    return load_deploys(path, overlay or None)


def _servable(model: str, pipelines: list[str]) -> bool:
    """A `--model` names an existing path or a registered pipeline; ConfigError (with a hint) if neither."""
    if Path(model).expanduser().exists() or model in pipelines:
        return True
    close = difflib.get_close_matches(model, pipelines, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"--model {model}: no such folder, and no pipeline of that name{hint}")


def served_model(model: str, overlay: dict[str, Any], name: str | None) -> DeployConfig:
    """One `--model`: a folder (its pipeline detected), else a registered pipeline's name (served with
    its bundled deploy file if there is one, else default placement)."""
    from omni_actors.config.deploy import build_deploy
    from omni_actors.config.pipeline import pipeline_names

    over = {**overlay, "server": {**overlay.get("server", {}), **({"served_model_name": name} if name else {})}}
    _servable(model, pipeline_names())
    if Path(model).expanduser().exists():
        return served_folder(model, {**over, "model": model})
    bundled = bundled_deploy(f"{model}.yaml")
    if bundled.is_file():
        return load_deploys(bundled, over)[0]
    return build_deploy({"pipeline": model}, f"--model {model}", over)


def served_folder(model: str, overlay: dict[str, Any]) -> DeployConfig:
    """`omni-run --model DIR` without a deploy file: the pipeline detected from the folder,
    default placement, served under the folder's name unless --served-model-name says otherwise."""
    from omni_actors.config.deploy import build_deploy
    from omni_actors.models.detect import check_files, detect_pipeline

    pipeline = detect_pipeline(model)
    check_files(model)  # a partial download: one config error now, not a failure after the port listens
    server = {"served_model_name": Path(model).expanduser().resolve().name, **overlay.get("server", {})}
    raw = {"pipeline": pipeline, **{k: v for k, v in overlay.items() if k != "stages"}, "server": server}
    stages = {"stages": overlay["stages"]} if "stages" in overlay else None  # reported as --stage-overrides
    return build_deploy(raw, f"--model {model}", stages)


def with_prepared_model(deploy: DeployConfig) -> DeployConfig:
    """A deploy without `model` gets its pipeline's prepared default (prepared on first use)."""
    if deploy.model:
        return deploy
    from omni_actors.config.pipeline import get_pipeline
    from omni_actors.models.prepare import prepare

    pipe = get_pipeline(deploy.pipeline)
    if not pipe.preparer:
        return deploy
    return msgspec.structs.replace(deploy, model=str(prepare(pipe.name)))


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
