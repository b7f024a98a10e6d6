"""omni-run: serve a pipeline from a deploy file, and the tool subcommands.

    omni-run [--deploy deploy.yaml] [--stage-overrides JSON] [--async-chunk | --no-async-chunk]
             [--host H] [--port P] [--model PATH]
    omni-run prepare <pipeline>              prepare a bundled pipeline's model files
    omni-run make-tiny <pipeline> <dir>      write a tiny random-weight checkpoint
    omni-run export-thinker <omni dir> <dir> write a Qwen2.5-Omni thinker's LM as a Qwen2
                                             causal-LM folder (text-only serving on vLLM)
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import signal
import socket
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from omni_actors import logs
from omni_actors.config.deploy import DeployConfig, load_deploy, parse_stage_overrides
from omni_actors.errors import ConfigError, StartupError
from omni_actors.settings import detect_platform, settings

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
    p.add_argument("--deploy", help="deploy YAML (default: the bundled speech assistant)")
    p.add_argument("--stage-overrides", help='JSON: {"<stage_id>": {field: value, ...}}')
    p.add_argument("--async-chunk", dest="async_chunk", action="store_true", default=None)
    p.add_argument("--no-async-chunk", dest="async_chunk", action="store_false")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument(
        "--model",
        help="model folder; without --deploy, the pipeline is detected from the folder "
        "(model_index.json / config.json); with --deploy, it overrides the file's `model`",
    )
    p.add_argument("--served-model-name", help="the `model` name clients use (default: the pipeline's)")
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


def load_from_args(args: argparse.Namespace) -> DeployConfig:
    overlay: dict[str, Any] = {}
    if args.stage_overrides:
        overlay.update(parse_stage_overrides(args.stage_overrides))
    if args.async_chunk is not None:
        overlay["async_chunk"] = args.async_chunk
    server = {
        k: v
        for k, v in (
            ("host", args.host), ("port", args.port), ("served_model_name", args.served_model_name),
        )
        if v is not None
    }
    if server:
        overlay["server"] = server
    if args.model:
        overlay["model"] = args.model
    if args.model and not args.deploy and Path(args.model).expanduser().exists():
        return served_folder(args.model, overlay)
    path = Path(args.deploy) if args.deploy else bundled_deploy()
    return load_deploy(path, overlay or None)


def served_folder(model: str, overlay: dict[str, Any]) -> DeployConfig:
    """`omni-run --model DIR` without a deploy file: the pipeline detected from the folder,
    default placement, served under the folder's name unless --served-model-name says otherwise."""
    from omni_actors.config.deploy import build_deploy
    from omni_actors.models.detect import detect_pipeline

    pipeline = detect_pipeline(model)
    server = {"served_model_name": Path(model).expanduser().resolve().name, **overlay.get("server", {})}
    raw = {"pipeline": pipeline, **overlay, "server": server}
    return build_deploy(raw, f"--model {model}")


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


async def serve(deploy: DeployConfig) -> None:
    from omni_actors.api.app import build_app
    from omni_actors.api.server import start_server
    from omni_actors.orchestrator.core import Orchestrator

    log = logs.get("omni_actors.cli")
    deploy = await asyncio.to_thread(with_prepared_model, deploy)
    orch = Orchestrator(deploy)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("server.starting", pipeline=deploy.pipeline, deploy=deploy.source,
             stages=len(orch.pipeline.stages), async_chunk=deploy.async_chunk)
    starting = asyncio.ensure_future(orch.start())
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await orch.stop(drain=False)
        return
    waiter.cancel()
    starting.result()
    try:
        http = await start_server(build_app(orch), deploy.server.host, deploy.server.port, deploy.server)
    except OSError as err:  # taken since check_listen ran
        await orch.stop(drain=False)
        raise ConfigError(
            f"{deploy.source}: server.port: cannot listen on {deploy.server.host}:{deploy.server.port}: "
            f"{_bind_reason(err)}"
        ) from None
    assert orch.runtime is not None
    log.info("server.ready", url=f"http://{deploy.server.host}:{deploy.server.port}",
             shm_prefix=orch.run_prefix, runtime_dir=str(orch.runtime.path))
    if not logs.json_logs():
        from omni_actors.summary import startup_summary

        print(startup_summary(deploy, orch.pipeline), file=sys.stderr, flush=True)
    await stop.wait()
    log.info("server.stopping")
    stop.clear()
    orch.draining = True
    stopping = asyncio.ensure_future(orch.stop(drain=True))
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stopping, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():  # a second signal: end in-flight requests instead of draining them
        log.info("server.hurrying", requests=len(orch.runs))
        orch.abort_all()
    waiter.cancel()
    await stopping
    await http.close()
    log.info("server.stopped")


def _tool(argv: list[str]) -> int:
    cmd, rest = argv[0], argv[1:]
    if cmd == "prepare":
        p = argparse.ArgumentParser(prog="omni-run prepare")
        p.add_argument("pipeline")
        a = p.parse_args(rest)
        from omni_actors.models.prepare import prepare

        print(prepare(a.pipeline))
        return 0
    if cmd == "export-thinker":
        p = argparse.ArgumentParser(prog="omni-run export-thinker")
        p.add_argument("src")
        p.add_argument("dir")
        a = p.parse_args(rest)
        from omni_actors.models.qwen2_5_omni.export import export_thinker_lm

        try:
            print(export_thinker_lm(a.src, a.dir))
        except (OSError, ValueError, KeyError) as err:
            print(f"omni-run export-thinker: {err}", file=sys.stderr)
            return 2
        return 0
    from omni_actors.models.tiny import make_tiny, tiny_names

    p = argparse.ArgumentParser(prog="omni-run make-tiny")
    p.add_argument("pipeline", choices=tiny_names())
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(rest)
    try:
        Path(a.dir).mkdir(parents=True, exist_ok=True)  # fail before the (slow) builder imports
        print(make_tiny(a.pipeline, a.dir, seed=a.seed))
    except OSError as err:
        print(f"omni-run make-tiny: cannot write {a.dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0


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
    try:
        if argv and argv[0] in TOOLS:
            return _tool(argv)
        deploy = load_from_args(parse_serve_args(argv))
        check_listen(deploy)
        warn_ignored_devices(deploy)
        uvloop.run(serve(deploy))
        return 0
    except ConfigError as err:
        print(f"omni-run: config error: {err}", file=sys.stderr)
        return 2
    except StartupError as err:
        print(f"omni-run: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
