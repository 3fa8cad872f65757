#!/usr/bin/env bash
# Moves uv.lock to newer releases, the one way the installed versions change:
#
#   ./scripts/upgrade-lock.sh                every package to its newest release that
#                                            pyproject.toml allows
#   ./scripts/upgrade-lock.sh ruff mypy      only these (and what they need)
#   ./scripts/upgrade-lock.sh --no-upgrade   none: the lock rewritten for a changed
#                                            pyproject.toml, keeping every version it can
#
# Then it installs the new lock into .venv, regenerates the gRPC code (its generator is in the
# lock) and prints what moved. Run ./scripts/test.sh, and commit uv.lock with anything
# regenerated. Two pins it does not move: uv itself (scripts/uv-requirements.txt says how) and
# setuptools, which builds the C extensions ([tool.uv] build-constraint-dependencies in
# pyproject.toml: edit it, then run this with --no-upgrade). If grpcio-tools moved,
# tests/unit/test_generated.py may ask for higher grpcio/protobuf floors in pyproject.toml:
# raise them and run this with --no-upgrade again.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test >/dev/null
uv=.rig/tools/uv/bin/uv
export UV_PYTHON_DOWNLOADS=never

before=$(mktemp)
trap 'rm -f "$before"' EXIT
cp uv.lock "$before"
if [ "${1:-}" = "--no-upgrade" ]; then
  "$uv" lock
elif (($#)); then
  args=()
  for name in "$@"; do args+=(--upgrade-package "$name"); done
  "$uv" lock "${args[@]}"
else
  "$uv" lock --upgrade
fi
"$uv" sync --frozen --extra test --quiet
./scripts/gen-proto.sh
# What moved: name old -> new, one per line.
.venv/bin/python - "$before" uv.lock <<'PY'
import sys, tomllib
def versions(path):
    with open(path, "rb") as f:
        return {p["name"]: p.get("version", "?") for p in tomllib.load(f)["package"]}
old, new = map(versions, sys.argv[1:3])
moved = [f"  {n}: {old.get(n, '-')} -> {new.get(n, '-')}" for n in sorted(old | new) if old.get(n) != new.get(n)]
print("uv.lock: " + (f"{len(moved)} packages moved" if moved else "nothing moved"))
if moved:
    print("\n".join(moved))
PY
git status --short uv.lock proxy/admin/_gen
