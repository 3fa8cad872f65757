"""The committed gRPC code is what idl/*.proto generates with the generator uv.lock names, and
the dependency floors of pyproject.toml admit no runtime that code refuses at import."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from tests.rig.lock import locked_versions

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "proxy" / "admin" / "_gen"
FILES = [f"{p}_pb2{e}" for p in ("admin", "listing") for e in (".py", ".pyi", "_grpc.py")]


def floor(name: str) -> Version:
    """The lowest version pyproject.toml's runtime dependencies allow for ``name``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (req,) = (r for r in map(Requirement, project["dependencies"]) if r.name == name)
    (low,) = (Version(s.version) for s in req.specifier if s.operator == ">=")
    return low


def test_generator_is_the_locked_one() -> None:
    # The output carries the generator's version (GRPC_GENERATED_VERSION), so the comparison
    # below is only meaningful with the generator the lock names: set-up installs that one.
    assert importlib.metadata.version("grpcio-tools") == locked_versions()["grpcio-tools"], (
        "grpcio-tools in .venv is not uv.lock's: run scripts/setup.sh --test"
    )


def test_generated_admin_code_is_current(tmp_path: Path) -> None:
    subprocess.run([str(REPO / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True, cwd=REPO)
    for name in FILES:
        fresh = (tmp_path / "proxy" / "admin" / "_gen" / name).read_text()
        committed = (GENERATED / name).read_text()
        assert fresh == committed, f"{name} is stale: run scripts/gen-proto.sh"


def stamps(pattern: str, suffix: str) -> set[Version]:
    """The versions ``pattern`` finds in the generated files ending in ``suffix``."""
    found = set()
    for name in (f for f in FILES if f.endswith(suffix)):
        match = re.search(pattern, (GENERATED / name).read_text())
        assert match, f"{name}: no {pattern!r}"
        found.add(Version(match.group(1)))
    return found


def test_runtime_floors_admit_the_generated_code() -> None:
    # The generated modules refuse, at import, a grpcio older than the generator and a
    # protobuf older than its protoc: a user installing without the lock must not get one.
    grpc = stamps(r"GRPC_GENERATED_VERSION = '([^']+)'", "_grpc.py")
    protobuf = stamps(r"# Protobuf Python Version: (\S+)", "_pb2.py")
    assert max(grpc) <= floor("grpcio"), f"pyproject.toml: grpcio>={max(grpc)}"
    assert max(protobuf) <= floor("protobuf"), f"pyproject.toml: protobuf>={max(protobuf)}"
