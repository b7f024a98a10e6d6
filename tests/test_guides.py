"""The user guides in docs/guides/: every code block runs (or, for GPUs and clusters, is validated) here.

The reference pages (docs/*.md) run the blocks they mark the same way; their unmarked blocks (fragments
that continue an earlier one) are not run.

Each fenced block on a page follows a marker comment, invisible when the page is rendered:

    <!-- test: KIND [NAME] [slow] [expect="REGEX"] [exit=N] -->

    serve   bash: every line but the last runs to completion; the last, an `omni-run`, is started
            with `--host 127.0.0.1 --port P` added and serves the page's later blocks until the
            page ends (then Ctrl-C: SIGINT, exit 0, nothing left behind)
    shell   bash, run to completion: exit status `exit` (default 0); each file a `-o FILE` names
            must be written and not empty
    python  run as its own Python process (the unmodified `openai` SDK as client)
    file    written to NAME in the page's folder; a .yaml file is loaded by the real deploy loader
    check   `omni-run` command lines parsed by omni-run's own parser and their deploys loaded and
            validated, starting nothing: for blocks that need GPUs or a Ray cluster

`expect` must match the block's output (stdout, and stderr for shell blocks). `slow` blocks run
only in the slow test. A page's blocks run in order in one temporary folder with `omni-run` on
PATH; `localhost:8000` and `127.0.0.1:8000` in a block mean the page's server; paths under
`/models/` (real checkpoints the page names) become empty folders under the page's folder.
`omni-run make-tiny NAME DIR` is the run's shared tiny folder of NAME (conftest's `tiny_model`, the
same builder and seed as the command; the command itself is tested in test_cli_sweep.py), copied to DIR;
a page's vLLM stages keep their caches in the run's one vLLM cache folder (conftest's `vllm_cache`).
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from omni_actors.cli import load_from_args, parse_serve_args
from omni_actors.config.deploy import DeployConfig, load_deploys
from tests.conftest import free_port
from tests.shutdown_support import OmniRun, runtime_dirs

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ROOT / "docs" / "guides"
PAGES = sorted(p for p in GUIDES.glob("*.md") if p.name != "README.md")
KINDS = ("serve", "shell", "python", "file", "check")
SERVE_READY_TIMEOUT_S = 240.0
"""Longest wait for a page's `omni-run` to say server.ready (tiny folders' workers import torch)."""
BLOCK_TIMEOUT_S = 180.0
"""Longest one block may run (make-tiny, a tiny video job, a realtime turn on 2 busy cores)."""
STOP_TIMEOUT_S = 30.0

MARKED = re.compile(r"^<!-- test: (.*?) -->\n```(\w+)\n(.*?)^```$", re.S | re.M)
FENCE = re.compile(r"^```(\w+)$", re.M)
MODELS = re.compile(r"(?<![\w.:/~])/models/[\w.\-]+")
"""A checkpoint path the page names (`/models/Qwen2.5-Omni-7B`); not a route such as `/v1/models/nope`."""
REFERENCE = sorted(p for p in (ROOT / "docs").glob("*.md") if MARKED.search(p.read_text()))
"""Reference pages with marked blocks (serving.md, media-video.md, ...)."""


@dataclass
class Block:
    page: str
    lang: str
    kind: str
    code: str
    name: str | None = None
    slow: bool = False
    opts: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.page}: {self.kind} block {self.code.splitlines()[0][:60]!r}"


def blocks(page: Path) -> list[Block]:
    """The marked blocks of a page, in order."""
    out = []
    for marker, lang, code in MARKED.findall(page.read_text()):
        kind, *rest = shlex.split(marker)
        block = Block(page.name, lang, kind, code)
        for word in rest:
            if word == "slow":
                block.slow = True
            elif "=" in word:
                key, value = word.split("=", 1)
                block.opts[key] = value
            else:
                block.name = word
        out.append(block)
    return out


def commands(code: str) -> list[str]:
    """Shell commands of a bash block: comment lines dropped, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", re.sub(r"(?m)^\s*#.*\n", "", code))
    return [c.strip() for c in joined.split("\n") if c.strip()]


def check_vllm_extras(deploy: DeployConfig) -> None:
    """A vLLM stage's engine_extras are keys the vLLM engine takes (it refuses others only at start)."""
    from omni_actors.config.pipeline import get_pipeline
    from omni_actors.workers.engines.vllm_backend import KNOWN_EXTRAS

    for stage in get_pipeline(deploy.pipeline).stages:
        if stage.engine.endswith(":VllmAREngine"):
            unknown = set(deploy.stage(stage.stage_id).engine_extras) - KNOWN_EXTRAS
            assert not unknown, (
                f"{deploy.source}: stage {stage.stage_id}: engine_extras {sorted(unknown)}"
            )


class GuideServer(OmniRun):
    """A page's `omni-run` (OmniRun's stderr reader and leak checks), on a free port."""

    def __init__(self, folder: Path, argv: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        self.runtime_parent = Path(env["OMNI_RUNTIME_DIR"])
        self.runtime_before = runtime_dirs(self.runtime_parent)
        self.proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pid = self.proc.pid
        self.lines = []
        self._eof = False
        self._queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.seen_workers = set()

    def stop(self) -> None:
        self.signal(signal.SIGINT)  # Ctrl-C, as the pages say
        assert self.wait(STOP_TIMEOUT_S) == 0, self.output
        self.assert_clean(workers_timeout_s=15.0)


class PageRun:
    """Runs one page's blocks in order in `folder`."""

    def __init__(
        self, page: Path, folder: Path, tiny: Callable[[str], Path], vllm_cache: Path
    ) -> None:
        self.page, self.folder, self.tiny = page, folder, tiny
        self.ray_tmp = tempfile.mkdtemp(
            prefix="omni-guide-ray-", dir="/tmp"
        )  # (short: Ray's socket paths)
        self.server: GuideServer | None = None
        bindir = Path(sys.executable).parent
        assert (bindir / "omni-run").exists(), "omni-run is not installed beside this Python"
        (folder / ".curlrc").write_text("fail-with-body\n")  # a 4xx / 5xx answer fails the command
        self.env = {
            **os.environ,
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
            "CURL_HOME": str(folder),
            "OMNI_DATA_DIR": str(folder / "data"),
            "OMNI_RUNTIME_DIR": str(folder / "runtime"),
            "OMNI_LOG_JSON": "0",
            "OMP_NUM_THREADS": "1",
            "RAY_TMPDIR": self.ray_tmp,  # a Ray cluster that a page starts keeps its files here
        }
        (folder / "data" / "cache").mkdir(parents=True)  # (vllm_backend.default_cache_dir: shared)
        (folder / "data" / "cache" / "vllm").symlink_to(vllm_cache, target_is_directory=True)
        for path in set(MODELS.findall(page.read_text())):
            (folder / path.lstrip("/")).mkdir(parents=True, exist_ok=True)

    def code(self, block: Block) -> str:
        code = MODELS.sub(lambda m: f"{self.folder}{m.group(0)}", block.code)
        if self.server is not None:
            for host in ("localhost:8000", "127.0.0.1:8000"):
                code = code.replace(host, f"127.0.0.1:{self.server.port}")
        return code

    def run(self, block: Block) -> None:
        code = self.code(block)
        match block.kind:
            case "file":
                assert block.name, f"{block}: a file block needs a NAME"
                (self.folder / block.name).write_text(code)
                if block.name.endswith((".yaml", ".yml")):
                    for deploy in load_deploys(self.folder / block.name):
                        check_vllm_extras(deploy)
            case "check":
                for cmd in commands(code):
                    self.check(block, cmd)
            case "shell":
                out = self.shell(block, code, int(block.opts.get("exit", 0)))
                self.expect(block, out)
                for name in re.findall(r"-o (\S+)", code):
                    assert (self.folder / name).stat().st_size > 0, f"{block}: {name} is empty"
            case "serve":
                *first, last = commands(code)
                for cmd in first:
                    self.shell(block, cmd, 0)
                self.serve(block, last)
            case "python":
                script = self.folder / "example.py"
                script.write_text(code)
                out = self.proc(block, [sys.executable, script.name], 0)
                self.expect(block, out)
            case _:
                pytest.fail(f"{block}: unknown kind; expected one of {KINDS}")

    def check(self, block: Block, cmd: str) -> None:
        argv = shlex.split(cmd)
        assert argv[0] == "omni-run", f"{block}: a check block holds omni-run command lines"
        cwd = Path.cwd()
        os.chdir(self.folder)
        try:
            deploys = load_from_args(parse_serve_args(argv[1:]))
        except SystemExit as exit_:  # argparse refused a flag (it printed why)
            pytest.fail(f"{block}: {cmd!r} does not parse (exit {exit_.code})")
        finally:
            os.chdir(cwd)
        assert deploys, cmd
        for deploy in deploys:
            check_vllm_extras(deploy)

    def shell(self, block: Block, cmd: str, status: int) -> str:
        argv = shlex.split(cmd)
        if argv[:2] == ["omni-run", "make-tiny"] and len(argv) == 4 and status == 0:
            shutil.copytree(self.tiny(argv[2]), self.folder / argv[3])
            return ""
        return self.proc(block, ["bash", "-e", "-c", cmd], status, stderr=True)

    def proc(self, block: Block, argv: list[str], status: int, stderr: bool = False) -> str:
        try:
            done = subprocess.run(
                argv,
                cwd=self.folder,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block}: still running after {BLOCK_TIMEOUT_S} s")
        assert done.returncode == status, (
            str(block),
            done.returncode,
            done.stdout[-3000:],
            done.stderr[-3000:],
        )
        return done.stdout + (done.stderr if stderr else "")

    def expect(self, block: Block, out: str) -> None:
        if "expect" in block.opts:
            assert re.search(block.opts["expect"], out, re.S), (
                f"{block}: no {block.opts['expect']!r} in:\n{out}"
            )

    def serve(self, block: Block, cmd: str) -> None:
        argv = shlex.split(cmd)
        assert argv[0] == "omni-run", (
            f"{block}: the last line of a serve block is the omni-run to start"
        )
        self.stop()
        self.server = GuideServer(
            self.folder, [shutil.which("omni-run", path=self.env["PATH"]), *argv[1:]], self.env
        )
        self.server.wait_for(r"server\.ready", SERVE_READY_TIMEOUT_S)
        self.server.note_workers()

    def stop(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def run_page(
    page: Path, folder: Path, tiny: Callable[[str], Path], vllm_cache: Path, slow: bool
) -> None:
    run = PageRun(page, folder, tiny, vllm_cache)
    try:
        for block in blocks(page):
            if slow or not block.slow:
                run.run(block)
        run.stop()
    finally:
        run.kill()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_guide_page_runs(
    page: Path, tmp_path: Path, tiny_model: Callable[[str], Path], vllm_cache: Path
) -> None:
    run_page(page, tmp_path, tiny_model, vllm_cache, slow=False)


SLOW_REFERENCE = {"media.md", "media-video.md"}
"""Reference pages run in the slow run only (default-suite budget: their routes have their own tests)."""


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_REFERENCE else p for p in REFERENCE
], ids=lambda p: p.name)
def test_reference_page_runs(
    page: Path, tmp_path: Path, tiny_model: Callable[[str], Path], vllm_cache: Path
) -> None:
    run_page(page, tmp_path, tiny_model, vllm_cache, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [p for p in PAGES if any(b.slow for b in blocks(p))], ids=lambda p: p.name
)
def test_guide_page_runs_with_its_slow_blocks(
    page: Path, tmp_path: Path, tiny_model: Callable[[str], Path], vllm_cache: Path
) -> None:
    run_page(page, tmp_path, tiny_model, vllm_cache, slow=True)


def test_every_block_is_marked_and_every_page_listed() -> None:
    index = (GUIDES / "README.md").read_text()
    expected = {"serve-a-folder.md", "deploy-file.md", "sdk.md", "gpus.md", "ray.md"}
    assert expected <= {p.name for p in PAGES}
    for page in PAGES:
        found = blocks(page)
        assert found, f"{page.name} has no tested block"
        assert len(found) == len(FENCE.findall(page.read_text())), (
            f"{page.name}: a block has no test marker"
        )
        assert all(b.kind in KINDS for b in found), page.name
        assert f"({page.name})" in index, f"{page.name} is not listed in docs/guides/README.md"
    assert "docs/guides/" in (ROOT / "README.md").read_text()
    assert {"serving.md", "media.md", "media-video.md"} <= {p.name for p in REFERENCE}
    for page in REFERENCE:
        assert all(b.kind in KINDS for b in blocks(page)), page.name


def test_the_field_lists_in_deploy_file_md_are_the_deploy_schema() -> None:
    """Every stage and server field is listed, and every name listed is a field."""
    from omni_actors.config.deploy import ServerConfig, StageDeploy

    text = (GUIDES / "deploy-file.md").read_text()
    for lead, struct, skip in (
        ("Stage fields", StageDeploy, {"stage_id"}),
        ("Server fields", ServerConfig, set()),
    ):
        paragraph = re.search(rf"^{lead} .*?\n\n", text, re.S | re.M)
        assert paragraph, lead
        listed = set(re.findall(r"`(\w+)`", paragraph.group(0))) - {"stages", "server"} - skip
        assert listed == set(struct.__struct_fields__) - skip, (
            lead,
            listed ^ (set(struct.__struct_fields__) - skip),
        )
