#!/usr/bin/env bash
# The proxy's main job, end to end: a real Hive Metastore, Redis (when installed), the proxy,
# a Trino- and Spark-shaped workload through it, and a summary of what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m bench.demo "$@"
