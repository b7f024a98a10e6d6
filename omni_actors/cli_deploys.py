"""omni-run's command line made deploys: the serve flags parsed, --deploy / --model resolved to DeployConfigs.

cli.py serves what this returns: with --deploy, the file (--model, --served-model-name,
--stage-overrides and the listen flags laid over it); without, one deploy per --model (a
folder, its pipeline detected, or a registered pipeline's name), or the bundled assistant.
Every mistake in the flags is one ConfigError naming the flag, before any worker starts.
"""

from __future__ import annotations

import argparse
import difflib
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from omni_actors import logs
from omni_actors.config.deploy import (
    DeployConfig,
    check_distinct,
    load_deploys,
    parse_stage_overrides,
)
from omni_actors.config.deploy_yaml import load_raw
from omni_actors.errors import ConfigError

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
    deploys = load_deploys(path, overlay or None)
    for deploy in deploys:
        _check_folder(deploy.model, "--model" if models else f"{path}: `model`")
    return deploys


def _check_folder(model: str | None, source: str) -> None:
    """A deploy's model folder that a download left partial (truncated weights, a missing shard, a
    detected folder's missing weights or component): one ConfigError naming `source` now, not a
    stage failing after the port listens. A folder with neither config.json nor model_index.json (a
    prepared pipeline's own layout) is left to its loader."""
    from omni_actors.models.detect import check_files, check_weights

    root = Path(model).expanduser() if model else None
    if root is None or not root.is_dir():
        return
    try:
        check_weights(root)
        if (root / "config.json").is_file() or (root / "model_index.json").is_file():
            check_files(root)
    except ConfigError as err:
        raise ConfigError(f"{source}: {str(err).removeprefix('--model: ')}") from None


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
