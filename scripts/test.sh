#!/usr/bin/env bash
# The whole test suite, with the checks CI runs: install, lint, type-check, test.
# Tests start their own Hive Metastore, Redis servers and proxies on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test
./scripts/check.sh
# Two test files at a time (pytest-xdist; each worker starts the metastores it needs; a
# file's tests stay together, in order, on one worker). TEST_WORKERS=0 runs them in turn.
exec .venv/bin/python -m pytest --numprocesses "${TEST_WORKERS:-2}" --dist loadfile "$@"
