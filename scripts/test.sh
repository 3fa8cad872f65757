#!/usr/bin/env bash
# The whole test suite, with the checks CI runs: install, lint, type-check, test.
# Tests start their own Hive Metastore, Redis servers and proxies on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
