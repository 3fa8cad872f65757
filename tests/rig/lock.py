"""uv.lock and the pinned uv, as the tests read and run them (set-up installed both)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".rig" / "tools" / "uv" / "bin" / "uv"


def locked_versions() -> dict[str, str]:
    """Each package of uv.lock (its canonical name) and its version."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return {canonicalize_name(p["name"]): p.get("version", "") for p in lock["package"]}


def uv_env(**changes: str) -> dict[str, str]:
    """This machine's environment for uv, with ``changes``: offline (uv's cache holds what
    set-up installed, and the pinned setuptools builds use), no Python downloads, and none of
    the caller's uv settings, virtual environment or compiler flags."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("UV_", "VIRTUAL_ENV", "PYTHON")) and k != "CFLAGS"
    }
    return env | {"UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never"} | changes
