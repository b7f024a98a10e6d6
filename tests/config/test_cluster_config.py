"""The deploy's `cluster` section and per-stage `resources`: validated at load, each mistake one clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omni_actors.errors import ConfigError
from tests.conftest import make_deploy


def test_without_cluster_the_backend_is_local_and_ray_is_not_imported() -> None:
    code = (
        "import sys; from tests.conftest import make_deploy; d = make_deploy(); "
        "from omni_actors.orchestrator.launcher import make_launcher, Launcher; "
        "from omni_actors.config.pipeline import get_pipeline; "
        "l = make_launcher(d, get_pipeline('synthetic'), 'p', 'cpu'); "
        "assert d.cluster.backend == 'local' and type(l) is Launcher; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ray_cluster_section_loads() -> None:
    d = make_deploy(cluster={"backend": "ray", "address": "10.0.0.5:6379", "bus_host": "0.0.0.0"},
                    stages=[{"stage_id": 0, "resources": {"GPU": 1, "node:10.0.0.5": 0.01}}])
    assert d.cluster.backend == "ray" and d.cluster.arrays == "auto"
    assert d.stage(0).resources == {"GPU": 1.0, "node:10.0.0.5": 0.01}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"cluster": {"backend": "slurm"}}, "test: cluster.backend: expected one of ['local', 'ray'], got 'slurm'"),
        ({"cluster": {"backend": "ray", "arrays": "shm"}}, "cluster.arrays: expected one of ['auto', 'frames']"),
        ({"cluster": {"backend": "ray", "adress": "auto"}}, "cluster: unknown field `adress`; did you mean `address`?"),
        ({"cluster": {"address": "10.0.0.5:6379"}}, "test: cluster.address: only used with `backend: ray`"),
        ({"cluster": {"backend": "local", "bus_host": "0.0.0.0"}}, "cluster.bus_host: only used with `backend: ray`"),
        ({"cluster": {"arrays": "frames"}}, "cluster.arrays: only used with `backend: ray`"),
        ({"cluster": {"backend": "ray", "address": " "}}, "cluster.address: expected a Ray address"),
        ({"cluster": {"backend": "ray", "address": "ray://head:10001"}},
         "cluster.address: 'ray://head:10001' is a Ray Client address: Ray Client sends every call through cloudpickle"),
        ({"cluster": {"backend": "ray", "address": "http://head:8265"}},
         "cluster.address: expected host:port, \"auto\" or \"local\", got 'http://head:8265'"),
        ({"cluster": {"backend": "ray", "address": "head"}},
         "cluster.address: expected host:port, \"auto\" or \"local\", got 'head'"),
        ({"cluster": {"backend": "ray", "address": "head:99999"}},
         "cluster.address: expected host:port, \"auto\" or \"local\", got 'head:99999'"),
        ({"cluster": {"backend": "ray", "address": ":6379"}},
         "cluster.address: expected host:port, \"auto\" or \"local\", got ':6379'"),
        ({"stages": [{"stage_id": 0, "resources": {"GPU": 1}}]},
         "stages[0].resources: placement by resources needs `cluster: {backend: ray}`"),
        ({"stages": [{"stage_id": 0, "labels": {"zone": "a"}}]},
         "stages[0].labels: placement by node labels needs `cluster: {backend: ray}`"),
        ({"cluster": {"backend": "ray"}, "stages": [{"stage_id": 0, "labels": {"zone": " "}}]},
         "stages[0].labels: expected non-empty names and values"),
        ({"cluster": {"backend": "ray"}, "stages": [{"stage_id": 1, "resources": {"GPU": -1}}]},
         "stages[0].resources.GPU: expected a finite number >= 0, got -1"),
        ({"cluster": {"backend": "ray"}, "stages": [{"stage_id": 1, "resources": {"GPU": "x"}}]},
         "stages[0].resources[...]: expected `float`, got `str`"),
        ({"cluster": {"backend": "ray"}, "stages": [{"stage_id": 0, "devices": "0"}]},
         "stages[0].devices: with cluster.backend ray, Ray assigns devices"),
    ],
)
def test_cluster_mistakes_are_one_clear_error(raw: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_deploy(**raw)
    assert expected in str(err.value)


def test_ray_not_installed_is_one_clear_error(tmp_path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text("pipeline: synthetic\ncluster: {backend: ray}\n")
    code = f"import sys; sys.modules['ray'] = None; from omni_actors.cli import main; sys.exit(main(['--deploy', {str(path)!r}]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"omni-run: config error: {path}: cluster.backend: ray is not installed" in out.stderr


def test_unreachable_ray_address_is_one_clear_error_at_start(tmp_path) -> None:
    from tests.conftest import free_port

    path = tmp_path / "deploy.yaml"
    path.write_text(f"pipeline: synthetic\ncluster: {{backend: ray, address: '127.0.0.1:{free_port()}'}}\n"
                    f"server: {{port: {free_port()}}}\n")
    out = subprocess.run([sys.executable, "-m", "omni_actors.cli", "--deploy", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert f"omni-run: config error: {path}: cluster.address: cannot reach Ray at 127.0.0.1:" in out.stderr
    assert "Traceback" not in out.stderr
