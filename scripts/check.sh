#!/usr/bin/env bash
# The project's own checks before its tests (scripts/test.sh runs them after set-up): the lock
# agrees with pyproject.toml, lint, format, types (and the C modules' stubs against the
# modules themselves), and the C extensions build without a warning. A failure says which.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=.rig/tools/uv/bin/uv
export UV_PYTHON_DOWNLOADS=never
for tool in "$uv" .venv/bin/ruff .venv/bin/mypy; do
  [ -x "$tool" ] || {
    echo "check failed: $tool is not installed: run ./scripts/setup.sh --test first" >&2
    exit 1
  }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# check NAME COMMAND...: the command's output is shown only if it fails.
check() {
  local name=$1
  shift
  if ! "$@" >"$out/log" 2>&1; then
    cat "$out/log" >&2
    echo "check failed: $name" >&2
    exit 1
  fi
}

# pyproject.toml and uv.lock must say the same: a dependency added, removed or re-ranged in
# one only fails here (scripts/upgrade-lock.sh --no-upgrade rewrites the lock for it).
check "uv.lock does not match pyproject.toml (scripts/upgrade-lock.sh --no-upgrade follows it)" \
  "$uv" lock --check --offline
check "ruff (.venv/bin/ruff check . shows it)" .venv/bin/ruff check .
check "format (.venv/bin/ruff format . fixes it)" .venv/bin/ruff format --check .
check "mypy --strict" .venv/bin/mypy
# The .pyi stubs of the C modules say what the compiled modules hold.
check "the C modules' .pyi stubs differ from the modules" \
  .venv/bin/python -m mypy.stubtest --concise \
  proxy.wire._scanner proxy.cache._assemble proxy.cache._names
# A warning fails the project's own build of its C extensions, never a user's: setup.py
# compiles with -Wall only, and -Werror is added here. CFLAGS replaces the interpreter's own
# compile flags (-Wsign-compare, -O3, and on Debian's Python -Wformat and more) rather than
# adding to them, so it carries those too: the warnings a user's build would show. The sdist,
# then a wheel from it, in a clean folder (a build in the source tree would skip what an
# earlier build compiled), with the lock's pinned setuptools, as a user's pip would build them.
cflags=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS") or "")')
check "the C extensions do not build without warnings (-Werror)" \
  env CFLAGS="$cflags -Werror" "$uv" build --out-dir "$out/dist" .
echo "checks passed: lock, ruff, format, mypy, C stubs, C build with -Werror"
