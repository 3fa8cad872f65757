"""The committed gRPC code is what idl/admin.proto generates today."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generated_admin_code_is_current(tmp_path: Path) -> None:
    subprocess.run([str(REPO / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True, cwd=REPO)
    for name in (f"{p}_pb2{e}" for p in ("admin", "listing") for e in (".py", ".pyi", "_grpc.py")):
        fresh = (tmp_path / "proxy" / "admin" / "_gen" / name).read_text()
        committed = (REPO / "proxy" / "admin" / "_gen" / name).read_text()
        assert fresh == committed, f"{name} is stale: run scripts/gen-proto.sh"
