"""The examples users copy: every deploy file in examples/ loads and validates, and every README block runs.

`model` in the examples is a placeholder the user replaces; here it is
overridden with an existing folder, as `omni-run --model DIR` does. README
blocks run as a user would run them (curl in a shell, the realtime script as its
own Python process) against the real assistant or `omni-run` itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import soundfile as sf

from omni_actors.config.deploy import load_deploy
from omni_actors.config.pipeline import get_pipeline
from omni_actors.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FILES = sorted(EXAMPLES.rglob("*.yaml"))
PLACEHOLDER = [p for p in FILES if "model: /path/to/" in p.read_text()]


def _id(path: Path) -> str:
    return str(path.relative_to(EXAMPLES))


def test_every_pipeline_has_an_example() -> None:
    pipelines = {load_deploy(p, {"model": str(EXAMPLES)}).pipeline for p in FILES}
    assert {"qwen2_5_omni", "qwen3_omni_moe", "diffusion", "llm"} <= pipelines
    for name in ("qwen2_5_omni", "qwen3_omni_moe"):
        split = [p for p in FILES if p.stem == f"{name}_split"]
        assert split, f"no split-across-devices example for {name}"


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_example_loads(path: Path, tmp_path: Path) -> None:
    cfg = load_deploy(path, {"model": str(tmp_path)})
    pipe = get_pipeline(cfg.pipeline)
    assert cfg.source == str(path)
    assert cfg.model in (str(tmp_path), None)
    for st in cfg.stages:
        assert st.stage_id in pipe.stage_ids
        devices = st.device_list()
        if devices:
            assert len(devices) == st.tensor_parallel_size * st.num_replicas


@pytest.mark.parametrize("path", PLACEHOLDER, ids=_id)
def test_placeholder_model_is_reported(path: Path) -> None:
    """Left as shipped, the placeholder path fails early with a message naming `model`."""
    with pytest.raises(ConfigError, match="model: path does not exist"):
        load_deploy(path)


def test_llm_example_tiny_command_fits_the_tiny_model(tiny_model: Callable[[str], Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The command in examples/llm.yaml's comment for a tiny llama asks for no more positions than the
    model has: a larger max_model_len is refused when the stage starts (exit 2)."""
    from omni_actors.cli import load_from_args, parse_serve_args

    text = (EXAMPLES / "llm.yaml").read_text()
    lines = re.search(r"^#\s+(omni-run --deploy examples/llm\.yaml .*?)\\\n#\s+(.*)$", text, re.M)
    assert lines, "examples/llm.yaml: no tiny-llama command in its comment"
    folder = tiny_model("llama")
    argv = shlex.split(f"{lines.group(1)} {lines.group(2)}".replace("/tmp/tiny-llama", str(folder)))
    monkeypatch.chdir(EXAMPLES.parent)
    [deploy] = load_from_args(parse_serve_args(argv[1:]))
    positions = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    assert deploy.model == str(folder)
    assert deploy.stage(0).engine_extras["max_model_len"] <= positions


def test_split_examples_place_stages_on_devices(tmp_path: Path) -> None:
    for name in ("qwen2_5_omni_split", "qwen3_omni_moe_split"):
        cfg = load_deploy(EXAMPLES / f"{name}.yaml", {"model": str(tmp_path)})
        assert all(st.device_list() for st in cfg.stages), name


# ---- README: every code block, run as a user would ------------------------------------

README = EXAMPLES.parent / "README.md"
SPEECH = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")
"""A recorded sentence for the README's transcription script (pocketsphinx-testdata)."""
NOT_RUN = {"scripts/dev.sh": "sets up the machine and runs the whole suite (what CI itself runs)"}
"""README blocks not run here (a phrase in the block -> why)."""
READY_TIMEOUT_S = 120.0
"""How long `omni-run` on the synthetic pipeline may take to say server.ready."""
EXAMPLE_TIMEOUT_S = 300.0
"""One README command against the assistant (on 2 shared cores, a spoken answer takes a while)."""


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block in README.md, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def _commands(code: str) -> list[str]:
    """Shell commands of a bash block: comments dropped, continuation lines joined."""
    return [c.strip() for c in re.sub(r"\\\n", " ", re.sub(r"(?m)^\s*#.*\n", "", code)).split("\n") if c.strip()]


@pytest.fixture(scope="module")
async def assistant_url(vllm_cache: Path) -> AsyncIterator[str]:
    """The bundled assistant deploy (as `omni-run` serves it, no keys; the run's vLLM cache) on a free port."""
    from omni_actors.cli import bundled_deploy
    from omni_actors.models.assistant import LLM
    from omni_actors.models.assistant.prepare import prepare
    from tests.api.conftest import serve_deploy

    cache = {"stage_id": LLM, "engine_extras": {"cache_dir": str(vllm_cache)}}
    deploy = load_deploy(bundled_deploy(), {"model": str(prepare(progress=None)), "stages": [cache]})
    async with serve_deploy(deploy, None) as srv:
        yield srv.url.removeprefix("http://")


async def _run(cmd: str, cwd: Path, env: dict[str, str]) -> bytes:
    proc = await asyncio.create_subprocess_shell(cmd, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), EXAMPLE_TIMEOUT_S)
    assert proc.returncode == 0, (cmd, proc.returncode, out[-2000:], err[-2000:])
    return out


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / ".curlrc").write_text("fail-with-body\n")  # a 4xx / 5xx answer fails the command
    return {**os.environ, "CURL_HOME": str(tmp_path)}


def test_every_readme_block_is_run_here() -> None:
    blocks = readme_blocks()
    kinds = [lang for lang, code in blocks if not any(k in code for k in NOT_RUN)]
    assert kinds.count("python") == 2 and kinds.count("bash") == 2, blocks
    assert "docs/architecture.md" in README.read_text() and (EXAMPLES.parent / "docs/architecture.md").exists()


def _json_values(out: bytes) -> list[dict]:
    """The JSON documents curl printed one after another."""
    text, values, decoder = out.decode(), [], json.JSONDecoder()
    while text.strip():
        value, end = decoder.raw_decode(text.strip())
        values.append(value)
        text = text.strip()[end:]
    return values


async def test_readme_assistant_examples(assistant_url: str, tmp_path: Path) -> None:
    """The curl block (speech to hello.wav, its transcript, a spoken chat answer), then the realtime script,
    then the transcription script on a recorded sentence."""
    env = _env(tmp_path)
    [curl] = [code for lang, code in readme_blocks() if lang == "bash" and "localhost:8000" in code]
    (tmp_path / "examples.sh").write_text(curl.replace("localhost:8000", assistant_url))
    transcript, chat = _json_values(await _run("bash -e examples.sh", tmp_path, env))
    wave, rate = sf.read(tmp_path / "hello.wav")  # a real WAV, as its name says
    assert rate > 8000 and wave.size / rate > 0.5
    assert "assistant" in transcript["text"].lower()  # "Hello! The assistant is up."
    message = chat["choices"][0]["message"]
    assert "paris" in message["content"].lower() and message["audio"]["data"]
    [script] = [code for lang, code in readme_blocks() if lang == "python" and "conversation.item.create" in code]
    (tmp_path / "realtime.py").write_text(script.replace("127.0.0.1:8000", assistant_url))
    said = await _run(f"{sys.executable} realtime.py", tmp_path, env)
    assert "paris" in said.decode().lower(), said
    [script] = [code for lang, code in readme_blocks() if lang == "python" and '"transcription"' in code]
    (tmp_path / "transcribe.py").write_text(script.replace("127.0.0.1:8000", assistant_url))
    heard = await _run(f"{sys.executable} transcribe.py {SPEECH}", tmp_path, env)
    assert "young man" in heard.decode().lower(), heard  # "he was not an ill disposed young man"


async def test_readme_synthetic_example(tmp_path: Path) -> None:
    """`omni-run --deploy omni_actors/deploy/synthetic.yaml --port 8001`, then its curl, on a free port."""
    [block] = [code for lang, code in readme_blocks() if lang == "bash" and "synthetic.yaml" in code]
    serve_cmd, probe = _commands(block)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    serve_cmd = serve_cmd.replace(".venv/bin/", f"{Path(sys.executable).parent}/").replace("8001", port)
    proc = await asyncio.create_subprocess_shell(f"exec {serve_cmd}", cwd=EXAMPLES.parent, stdout=PIPE,
                                                 stderr=asyncio.subprocess.STDOUT,
                                                 env={**os.environ, "OMNI_LOG_LEVEL": "info"})  # says server.ready
    try:
        async def ready() -> None:
            assert proc.stdout is not None
            while b"server.ready" not in (line := await proc.stdout.readline()):
                assert line, "omni-run ended before server.ready"
        await asyncio.wait_for(ready(), READY_TIMEOUT_S)
        out = await _run(probe.replace("8001", port), tmp_path, _env(tmp_path))
        assert json.loads(out)["status"] == "ok"
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.communicate(), READY_TIMEOUT_S)
    assert proc.returncode == 0


@pytest.mark.slow  # (default-suite budget: the slow run, `-m slow`, keeps it)
def test_a_max_model_len_past_the_models_positions_is_one_line_and_exit_2(
        tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """examples/llm.yaml as shipped asks for 4096 positions; the tiny llama has 1024. vLLM's own refusal
    was exit 1 and a traceback suggesting VLLM_ALLOW_LONG_MAX_MODEL_LEN; the deploy's field is named."""
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", "--deploy", str(EXAMPLES / "llm.yaml"),
         "--model", str(tiny_model("llama")), "--port", str(port)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "OMNI_LOG_JSON": "0", "OMNI_DATA_DIR": str(tmp_path / "data")},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "max_model_len 4096 is more than the 1024 positions" in proc.stderr, proc.stderr[-3000:]
