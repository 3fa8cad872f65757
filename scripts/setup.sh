#!/usr/bin/env bash
# Installs everything the proxy, its tests, benchmarks and demo need; safe to run again.
# System: Java 17 (runs the real Hive Metastore), redis-server, a C compiler and Python headers
# (the proxy's message scanner is a small C extension). Python: a .venv with the project.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
packages=()
command -v java >/dev/null 2>&1 || packages+=(openjdk-17-jre-headless)
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v gcc >/dev/null 2>&1 || packages+=(gcc)
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$include/Python.h" ] || packages+=(python3-dev)
if ((${#packages[@]})); then
  echo "installing system packages: ${packages[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${packages[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# pyspark (~450 MB) carries the Hive Metastore 2.3.10 jars and Spark for the end-to-end tests.
.venv/bin/python -m pip install -q -e ".[test]"
