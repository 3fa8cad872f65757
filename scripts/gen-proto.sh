#!/usr/bin/env bash
# Regenerates proxy/admin/_gen from idl/*.proto (committed; a test checks it is current).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
mkdir -p "$out/proxy/admin/_gen"
.venv/bin/python -m grpc_tools.protoc -Iproxy/admin/_gen=idl \
  --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" \
  proxy/admin/_gen/admin.proto proxy/admin/_gen/listing.proto
