"""Deploy `gpu_sharing`: when a run starts its own MPS daemon, and the daemon's start, probe and quit.

Off a GPU host the daemon's binary is NVIDIA's; here a stand-in of `nvidia-cuda-mps-control` (a few
lines below, put first on PATH) speaks the part this runtime uses: `-f` says it listens and serves
its control socket until a client writes `quit`. The real daemon runs under `-m gpu`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from omni_actors.bus.sockets import RuntimeDir
from omni_actors.errors import ConfigError
from omni_actors.orchestrator import mps
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.launcher import Launcher
from omni_actors.orchestrator.mps import MpsDaemon, quit_stale, shared_devices, wanted
from tests.conftest import _alive, make_deploy, running

STANDIN = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, socket, sys
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    path = os.path.join(pipe, "control")
    if "-f" not in sys.argv:  # a client: what stdin says goes to the daemon
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(sys.stdin.buffer.read())
        sys.exit(0)
    with open(os.path.join(pipe, "pid"), "w") as f:
        f.write(str(os.getpid()))
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    print("[0 Control] {mps.READY_LINE} using socket " + path, flush=True)
    while True:
        conn, _ = srv.accept()
        if b"quit" in conn.recv(64):
            print("[0 Control] Cmd:quit", flush=True)
            sys.exit(0)
""")


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / mps.CONTROL
    exe.write_text(STANDIN)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    return exe


SYN = (0, 1, 2)
"""The synthetic pipeline's stages."""
THREE_ON_ONE = [{"stage_id": s, "devices": "0"} for s in (0, 1, 2)]


def test_only_gpus_two_worker_processes_share_are_shared() -> None:
    assert shared_devices(make_deploy(stages=THREE_ON_ONE, gpu_sharing="auto"), SYN, "cuda") == ["0"]
    assert shared_devices(make_deploy(), SYN, "cuda") == ["0"]  # (unplaced stages on a CUDA host are on GPU 0)
    apart = [{"stage_id": 0, "devices": "0"}, {"stage_id": 1, "devices": "1"}, {"stage_id": 2, "devices": "2"}]
    assert shared_devices(make_deploy(stages=apart), SYN, "cuda") == []
    replicas = [*apart[:2], {"stage_id": 2, "devices": "2,2", "num_replicas": 2}]
    assert shared_devices(make_deploy(stages=replicas), SYN, "cuda") == ["2"]
    assert shared_devices(make_deploy(stages=THREE_ON_ONE, gpu_sharing="auto"), SYN, "cpu") == []


def test_auto_starts_a_daemon_only_where_it_helps_and_the_host_has_mps(standin: Path, monkeypatch) -> None:
    assert wanted(make_deploy(stages=THREE_ON_ONE), SYN, "cuda")[0] == []  # (off by default)
    assert wanted(make_deploy(stages=THREE_ON_ONE, gpu_sharing="auto"), SYN, "cuda") == (["0"], "shared")
    assert wanted(make_deploy(stages=THREE_ON_ONE, gpu_sharing="off"), SYN, "cuda")[0] == []
    assert wanted(make_deploy(stages=THREE_ON_ONE, gpu_sharing="auto"), SYN, "cpu")[0] == []
    one = [{"stage_id": 0, "devices": "0"}, {"stage_id": 1, "devices": "1"}, {"stage_id": 2, "devices": "2"}]
    assert wanted(make_deploy(stages=one, gpu_sharing="auto"), SYN, "cuda") == ([], "no GPU is shared by two worker processes")
    assert wanted(make_deploy(stages=one, gpu_sharing="mps"), SYN, "cuda") == (["0", "1", "2"], "asked for")
    monkeypatch.setenv(mps.PIPE_ENV, "/run/the-hosts-mps")  # the host's own daemon: used as it is
    devices, why = wanted(make_deploy(stages=THREE_ON_ONE, gpu_sharing="auto"), SYN, "cuda")
    assert devices == [] and mps.PIPE_ENV in why


def test_without_the_binary_auto_time_slices_and_mps_is_one_clear_error(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # (nothing on it)
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    assert wanted(make_deploy(stages=THREE_ON_ONE, gpu_sharing="auto"), SYN, "cuda") == ([], f"{mps.CONTROL} not on PATH")
    with pytest.raises(ConfigError, match=f"gpu_sharing: mps needs NVIDIA's {mps.CONTROL} on PATH"):
        wanted(make_deploy(stages=THREE_ON_ONE, gpu_sharing="mps"), SYN, "cuda")


def test_a_bad_setting_is_refused_when_the_deploy_is_read() -> None:
    with pytest.raises(ConfigError, match=r"gpu_sharing: expected one of \['auto', 'mps', 'off'\], got 'sometimes'"):
        make_deploy(gpu_sharing="sometimes")
    with pytest.raises(ConfigError, match="gpu_sharing: mps is for local workers"):
        make_deploy(gpu_sharing="mps", cluster={"backend": "ray"})


async def test_a_daemon_that_gives_no_cuda_context_is_stopped_and_says_why(standin: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    daemon = MpsDaemon(run, ["0"])
    assert daemon.env == {mps.PIPE_ENV: str(run / "mps"), mps.LOG_ENV: str(run / "mps-log")}
    # The stand-in listens, but no CUDA context opens through it (here: no libcuda at all).
    with pytest.raises(RuntimeError, match="no CUDA context through MPS: "):
        await daemon.start()
    pid = int((run / "mps" / "pid").read_text())
    assert not _alive(pid), "the daemon was left running"
    assert daemon.proc is None
    assert (run / "mps").stat().st_mode & 0o777 == 0o700


async def test_a_daemon_a_dead_run_left_is_quit_by_the_next_runs_sweep(standin: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "mps").mkdir(parents=True)
    env = {**os.environ, mps.PIPE_ENV: str(run / "mps")}
    proc = await asyncio.create_subprocess_exec(str(standin), "-f", stdout=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert mps.READY_LINE in (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
    await asyncio.to_thread(quit_stale, run)
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    quit_stale(tmp_path / "no-such-run")  # (nothing to quit: nothing happens)


async def test_a_daemon_that_fails_its_probe_leaves_auto_time_sliced_and_is_an_error_for_mps(
    standin: Path, tmp_path: Path
) -> None:
    """The orchestrator's own start of the daemon, as on a CUDA host whose MPS gives no context."""
    for mode in ("auto", "mps"):
        orch = Orchestrator(make_deploy(stages=THREE_ON_ONE, gpu_sharing=mode))
        orch.platform = "cuda"  # (the decision only: no worker is started)
        orch.runtime = RuntimeDir()
        launcher = Launcher(orch.deploy, orch.pipeline, "", "p", "cuda")
        try:
            if mode == "auto":
                await orch._start_mps(launcher)
                assert orch.mps is None and launcher.gpu_env == {} and orch.gpu_sharing == "time_slice"
            else:
                with pytest.raises(ConfigError, match="gpu_sharing: mps: no CUDA context through MPS"):
                    await orch._start_mps(launcher)
            pid = int((orch.runtime.path / "mps" / "pid").read_text())
            assert not _alive(pid), "the daemon outlived its failed probe"
        finally:
            orch.runtime.close()


async def test_a_cpu_run_says_it_has_no_gpu_to_share() -> None:
    async with running(make_deploy(gpu_sharing="mps")) as orch:
        assert orch.mps is None
        assert orch.gpu_sharing == ("none" if orch.platform == "cpu" else "mps")


@pytest.mark.gpu
def test_workers_on_one_gpu_share_it_through_the_runs_own_daemon() -> None:
    asyncio.run(_workers_on_one_gpu())  # (the device's pytest has no asyncio plugin)


async def _workers_on_one_gpu() -> None:
    async with running(make_deploy(stages=THREE_ON_ONE, gpu_sharing="auto")) as orch:
        assert orch.gpu_sharing == "mps" and orch.mps is not None
        pipe = orch.mps.pipe_dir
        for handles in orch.workers.values():
            for h in handles:
                env = Path(f"/proc/{h.pid}/environ").read_bytes().split(b"\0")
                assert f"{mps.PIPE_ENV}={pipe}".encode() in env
        # A CUDA process given the workers' environment runs through the daemon's server.
        code = "import torch; x = torch.ones(1024, device='cuda'); assert float((x @ x).item()) == 1024.0"
        subprocess.run([sys.executable, "-c", code], env={**os.environ, **orch.mps.env}, check=True, timeout=120)
        servers = subprocess.run([mps.CONTROL], input=b"get_server_list\n", capture_output=True, timeout=10,
                                 env={**os.environ, mps.PIPE_ENV: str(pipe)}, check=True).stdout.split()
        assert servers and all(s.isdigit() for s in servers)
        server_pids = [int(s) for s in servers]
    assert not pipe.exists()
    assert not any(_alive(pid) for pid in server_pids), "the MPS server outlived the run"
