"""`pip install omni-actors[cpu|cuda|diffusion|ray]`: each kind of install is a declared extra, and what the
extras this machine can install pin (all but `cuda`'s vLLM, a GPU build) is what the test environment runs."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement

KINDS = ("cpu", "cuda", "diffusion", "ray")
"""The installs the README and docs/serving.md name."""
HERE = ("models", "assistant", "cpu", "diffusion", "ray", "dev")
"""Extras installed in the test environment (scripts/dev.sh setup)."""


def test_each_kind_of_install_is_an_extra() -> None:
    declared = set(metadata.metadata("omni-actors").get_all("Provides-Extra") or [])
    assert set(KINDS) <= declared, declared


def test_the_extras_pins_are_what_the_tests_run_against() -> None:
    wrong = []
    for req in map(Requirement, metadata.metadata("omni-actors").get_all("Requires-Dist") or []):
        if req.name == "omni-actors" or req.marker is None:
            continue
        if not any(req.marker.evaluate({"extra": extra}) for extra in HERE):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{req}: not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            wrong.append(f"{req}: {have} installed")
    assert not wrong, wrong
