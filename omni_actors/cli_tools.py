"""omni-run's tool subcommands: `prepare`, `make-tiny`, `export-thinker` (cli.py serves; these write files).

    omni-run prepare <pipeline>              prepare a bundled pipeline's model files
    omni-run make-tiny <pipeline> <dir>      write a tiny random-weight checkpoint
    omni-run export-thinker <omni dir> <dir> write a Qwen2.5-Omni thinker's LM as a Qwen2 folder
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from omni_actors.errors import ConfigError


def run_tool(argv: list[str]) -> int:
    """`omni-run prepare | make-tiny | export-thinker ...`: the exit code."""
    cmd, rest = argv[0], argv[1:]
    if cmd == "prepare":
        p = argparse.ArgumentParser(prog="omni-run prepare")
        p.add_argument("pipeline")
        a = p.parse_args(rest)
        from omni_actors.config.pipeline import get_pipeline, pipeline_names
        from omni_actors.models.prepare import prepare

        known = pipeline_names()
        if a.pipeline not in known:
            close = difflib.get_close_matches(a.pipeline, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            some = ", ".join(n for n in known if get_pipeline(n).preparer)
            raise ConfigError(f"prepare: unknown pipeline {a.pipeline!r}{hint}; these have files to prepare: {some}")
        print(prepare(a.pipeline))
        return 0
    if cmd == "export-thinker":
        p = argparse.ArgumentParser(prog="omni-run export-thinker")
        p.add_argument("src")
        p.add_argument("dir", help="a new or empty folder to write the Qwen2 folder to")
        a = p.parse_args(rest)
        if (refused := _refused_folder(a.dir)) is not None:  # ("" wrote into the current folder; `src` over itself)
            print(f"omni-run export-thinker: {refused}", file=sys.stderr)
            return 2
        from omni_actors.models.qwen2_5_omni.export import export_thinker_lm

        try:
            print(export_thinker_lm(a.src, a.dir))
        except (OSError, ValueError, KeyError) as err:
            print(f"omni-run export-thinker: {err}", file=sys.stderr)
            return 2
        return 0
    from omni_actors.models.tiny import make_tiny, tiny_names

    names = tiny_names()
    p = argparse.ArgumentParser(prog="omni-run make-tiny")
    # (no `choices`: argparse would print all the names twice, in the usage and the error, on any mistake)
    p.add_argument("pipeline", metavar="name", help=f"one of: {', '.join(names)}")
    p.add_argument("dir", help="a new or empty folder to write the checkpoint to")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(rest)
    if a.pipeline in NOT_BUILT:  # a family the project lists, whose tiny checkpoint cannot be built here
        p.error(f"{a.pipeline!r} is not built here: {NOT_BUILT[a.pipeline]}")
    if a.pipeline not in names:
        close = difflib.get_close_matches(a.pipeline, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        p.error(f"unknown name {a.pipeline!r}{hint}; expected one of {', '.join(names)}")
    if (refused := _refused_folder(a.dir)) is not None:
        print(f"omni-run make-tiny: {refused}", file=sys.stderr)
        return 2
    try:
        Path(a.dir).mkdir(parents=True, exist_ok=True)  # fail before the (slow) builder imports
        print(make_tiny(a.pipeline, a.dir, seed=a.seed))
    except OSError as err:
        print(f"omni-run make-tiny: cannot write {a.dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0


NOT_BUILT = {
    "cosmos": "Cosmos2_5_PredictBasePipeline cannot be built or run without NVIDIA's cosmos_guardrail safety "
              "checker (not installed here; it fetches its guardrail models at run time); docs/media-video.md",
}
"""Families the project lists whose tiny checkpoint cannot be built offline here, and why."""


def _refused_folder(path: str) -> str | None:
    """Why a tool may not write its checkpoint to `path` (None if it may): empty text (the current
    folder), something that is not a folder, or a folder with files in it (two checkpoints would mix,
    or a source folder would be written over)."""
    if not path.strip():
        return "dir: empty; give the folder to write the checkpoint to"
    try:
        if Path(path).exists() and not Path(path).is_dir():
            return f"{path} is not a folder; give a new or empty folder"
        if Path(path).is_dir() and any(Path(path).iterdir()):
            return f"{path} is not empty; give a new or empty folder (a checkpoint is a whole folder)"
    except OSError as err:
        return f"cannot write {path}: {err.strerror or err}"
    return None
