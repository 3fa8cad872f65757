"""The environment the tests run in is uv.lock's, exactly: set-up installs from the lock and
nothing else, so a release on PyPI changes nothing until scripts/upgrade-lock.sh moves it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.rig.lock import REPO, UV, uv_env


def test_the_environment_is_the_lock() -> None:
    # uv compares .venv with the lock's [test] set (versions, and the project's own build
    # inputs: pyproject.toml, setup.py, the C sources), offline: nothing is looked up.
    assert Path(sys.prefix).resolve() == REPO / ".venv", "the tests run in the project's .venv"
    result = subprocess.run(
        [str(UV), "sync", "--check", "--frozen", "--extra", "test"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=uv_env(),
        timeout=120,
    )
    assert result.returncode == 0, (
        f"{result.stderr}.venv is not uv.lock's [test] set: run scripts/setup.sh --test"
    )


def test_the_uv_is_the_pinned_one() -> None:
    pinned = (REPO / "scripts" / "uv-requirements.txt").read_text()
    version = subprocess.run([str(UV), "--version"], capture_output=True, text=True, check=True)
    assert f"uv=={version.stdout.split()[1]} " in pinned, version.stdout


def test_the_lock_pins_what_builds_the_packages() -> None:
    # The build constraints of pyproject.toml are recorded in the lock too (uv lock --check
    # fails when they differ), and setuptools, which builds the proxy, is pinned exactly.
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    constraints = lock["manifest"]["build-constraints"]
    assert any(c["name"] == "setuptools" and c["specifier"].startswith("==") for c in constraints)
