"""The container image, checked offline: no Docker engine runs where the tests run.

``deploy/docker/Dockerfile`` is read with dockerfile-parse for what the image must be: a base
pinned by digest, a numeric non-root user, no build tools in the final stage, the proxy's
ports, a health check on the readiness service, the console script as entry point, and the
Python packages installed from ``uv.lock`` by the uv that ``scripts/uv-requirements.txt`` pins,
as scripts/setup.sh installs them. Then the build is reproduced: the files the build stage
copies (after ``.dockerignore``, matched as Docker matches it) are laid out in a scratch
directory, the build stage's own ``uv sync`` command runs there (from uv's cache, offline),
and the virtual environment it makes, which holds nothing but the proxy and its runtime
packages, runs the HEALTHCHECK command against a live proxy.

The image carries the extra ``[kerberos]``: gssapi is compiled in the build stage against MIT
krb5 (libkrb5-dev), and the runtime stage installs only the shared libraries its modules load,
which is checked against what the gssapi installed with the tests links (Debian's package
database of this machine, the base image's release). The emulated environment holds the
extra's packages too, and the proxy in it logs in from a keytab of a real KDC and serves
engines of a Kerberized metastore.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from proxy import config, idl
from proxy.admin.server import READINESS
from tests.rig.hms import MetastoreServer
from tests.rig.kdc import Realm
from tests.rig.lock import UV, locked_versions, uv_env
from tests.rig.ports import free_port, free_ports, wait_for_port
from tests.rig.sasl_client import KerberosConnection

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# What compiles or fetches build inputs; none of it belongs in the image that runs. (apt-get
# may run there, for RUNTIME_PACKAGES only: see the runtime stage's tests.)
BUILD_TOOLS = {
    "build-essential",
    "cc",
    "clang",
    "cmake",
    "g++",
    "gcc",
    "libc6-dev",
    "libkrb5-dev",
    "krb5-multidev",
    "make",
    "pip",
    "pip3",
    "uv",
    "python3-dev",
}
# The project's extras the image carries: one image for plain and Kerberized metastores.
IMAGE_EXTRAS = {"kerberos"}
# Debian packages the runtime stage may install: the shared libraries gssapi's modules load
# (libgssapi-krb5-2 and what it depends on). No headers, no krb5-user (kinit, klist), no
# krb5-config (/etc/krb5.conf): the proxy reads a mounted krb5.conf and keytab.
RUNTIME_PACKAGES = {
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libkrb5support0",
    "libkeyutils1",
    "libcom-err2",
}
# The build stage compiles gssapi against these (headers, libraries, krb5-config).
KERBEROS_BUILD_PACKAGES = {"libkrb5-dev"}


# --- the Dockerfile ---------------------------------------------------------------------------


@dataclass
class Instruction:
    name: str
    value: str
    workdir: str


@dataclass
class Stage:
    image: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, name: str) -> list[Instruction]:
        return [i for i in self.instructions if i.name == name]

    def last(self, name: str) -> Instruction:
        found = self.all(name)
        assert found, f"stage {self.name!r} has no {name}"
        return found[-1]


def stages() -> list[Stage]:
    out: list[Stage] = []
    for item in DockerfileParser(path=str(DOCKERFILE)).structure:
        name, value = item["instruction"], item["value"]
        if name == "COMMENT":
            continue
        if name == "FROM":
            words = [w for w in value.split() if not w.startswith("--")]
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(out))
            out.append(Stage(words[0], alias))
            continue
        assert out, f"{name} before the first FROM"
        stage = out[-1]
        workdir = stage.instructions[-1].workdir if stage.instructions else "/"
        if name == "WORKDIR":
            workdir = posixpath.join(workdir, value.strip())
        stage.instructions.append(Instruction(name, value, workdir))
    return out


def build_stage() -> Stage:
    """The stage the final one copies from."""
    sources = {flags(i.value).get("from") for i in stages()[-1].all("COPY")} - {None}
    assert len(sources) == 1, f"the final stage should copy from one build stage: {sources}"
    (name,) = sources
    matching = [s for s in stages()[:-1] if s.name == name]
    assert matching, f"COPY --from={name}: no such stage"
    return matching[0]


def flags(value: str) -> dict[str, str]:
    out = {}
    for word in value.split():
        if not word.startswith("--"):
            break
        key, _, flag_value = word[2:].partition("=")
        out[key] = flag_value
    return out


def shell_commands(value: str) -> list[list[str]]:
    """A RUN's commands (split at ``&&`` and ``;``), each as argv."""
    return [argv for part in re.split(r"&&|;", value) if (argv := shlex.split(part))]


def apt_packages(stage: Stage) -> set[str]:
    """The packages the stage's ``apt-get install`` commands name."""
    out: set[str] = set()
    for instruction in stage.all("RUN"):
        for argv in shell_commands(instruction.value):
            if argv[:2] == ["apt-get", "install"]:
                out |= {w for w in argv[2:] if not w.startswith("-")}
    return out


def sync_run() -> tuple[Instruction, list[str]]:
    """The build stage's ``uv sync`` (its one install of Python packages): the RUN, and the
    command as argv."""
    found = [
        (instruction, argv)
        for instruction in build_stage().all("RUN")
        for argv in shell_commands(instruction.value)
        if argv[0].endswith("/uv") and argv[1:2] == ["sync"]
    ]
    assert len(found) == 1, f"the build stage should run one `uv sync`: {found}"
    return found[0]


def sync_command() -> list[str]:
    return sync_run()[1]


def installed_extras() -> set[str]:
    """The project's extras in the build stage's ``uv sync``."""
    argv = sync_command()
    assert "--all-extras" not in argv
    return {argv[i + 1] for i, word in enumerate(argv) if word == "--extra"} | {
        word.removeprefix("--extra=") for word in argv if word.startswith("--extra=")
    }


def build_env() -> dict[str, str]:
    """The build stage's ENV."""
    env: dict[str, str] = {}
    for instruction in build_stage().all("ENV"):
        for key, _, value in (w.partition("=") for w in shlex.split(instruction.value)):
            env[key] = value
    return env


def smoke_test() -> str:
    """The Python code the build stage's smoke test runs (``python -I -c CODE``)."""
    for instruction in build_stage().all("RUN"):
        for argv in shell_commands(instruction.value):
            if argv[0].endswith("/python") and argv[1:3] == ["-I", "-c"]:
                return argv[3]
    raise AssertionError("the build stage has no `python -I -c` smoke test")


def imported_modules(code: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def copy_operands(value: str) -> tuple[list[str], str]:
    """COPY's sources and destination, in shell or JSON form, after its flags."""
    rest = value.split()
    while rest and rest[0].startswith("--"):
        rest.pop(0)
    text = " ".join(rest)
    operands = json.loads(text) if text.startswith("[") else text.split()
    assert len(operands) >= 2, value
    return operands[:-1], operands[-1]


def exec_form(value: str) -> list[str]:
    """An exec-form (JSON) command; Docker would silently run anything else through a shell."""
    argv = json.loads(value)
    assert isinstance(argv, list), value
    assert all(isinstance(a, str) for a in argv), value
    return argv


def image_env(base: dict[str, str]) -> dict[str, str]:
    """The final stage's ENV, with ``$VAR`` expanded from ``base`` as Docker would."""
    env = dict(base)
    for instruction in stages()[-1].all("ENV"):
        words = shlex.split(instruction.value)
        pairs = [w.partition("=") for w in words]
        if not pairs[0][1]:  # the old ``ENV KEY value`` form
            pairs = [(words[0], "=", " ".join(words[1:]))]
        for key, _, raw in pairs:
            env[key] = re.sub(
                r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), raw.replace("\\\n", "")
            )
    return env


def healthcheck() -> tuple[dict[str, str], list[str]]:
    value = stages()[-1].last("HEALTHCHECK").value
    options_text, keyword, command = value.partition(" CMD ")
    assert keyword, f"HEALTHCHECK without CMD: {value}"
    options = {}
    for word in options_text.split():
        assert word.startswith("--"), f"HEALTHCHECK option {word!r}"
        key, _, option_value = word[2:].partition("=")
        options[key] = option_value
    return options, exec_form(command.strip())


def seconds(duration: str) -> float:
    """A Docker duration such as ``5s``, ``1m30s``, ``500ms``."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert parts and "".join(a + b for a, b in parts) == duration, duration
    return sum(float(number) * units[unit] for number, unit in parts)


# --- .dockerignore, as Docker reads it (moby/patternmatcher) ------------------------------------


@dataclass
class Pattern:
    text: str
    exclusion: bool
    kind: str
    regex: re.Pattern[str] | None

    @classmethod
    def compile(cls, text: str, exclusion: bool) -> Pattern:
        """The same translation as patternmatcher's ``Pattern.compile``."""
        regex, kind, pos, index = "^", "exact", 0, 0
        while pos < len(text):
            ch = text[pos]
            pos += 1
            if ch == "*":
                if pos < len(text) and text[pos] == "*":
                    pos += 1
                    if pos < len(text) and text[pos] == "/":
                        pos += 1
                    if pos >= len(text):
                        if kind == "exact":
                            kind = "prefix"
                        else:
                            regex, kind = regex + ".*", "regexp"
                    else:
                        regex, kind = regex + "(.*/)?", "regexp"
                    if index == 0:
                        kind = "suffix"
                else:
                    regex, kind = regex + "[^/]*", "regexp"
            elif ch == "?":
                regex, kind = regex + "[^/]", "regexp"
            elif ch in ".+()|{}$":
                regex += "\\" + ch
            elif ch == "\\":
                if pos < len(text):
                    regex, kind = regex + "\\" + text[pos], "regexp"
                    pos += 1
                else:
                    regex += "\\\\"
            elif ch in "[]":
                regex, kind = regex + ch, "regexp"
            else:
                regex += ch
            index += 1
        compiled = re.compile(regex + r"\Z") if kind == "regexp" else None
        return cls(text, exclusion, kind, compiled)

    def match(self, path: str) -> bool:
        if self.kind == "exact":
            return path == self.text
        if self.kind == "prefix":
            return path.startswith(self.text[:-2])
        if self.kind == "suffix":
            suffix = self.text[2:]
            return path.endswith(suffix) or (suffix.startswith("/") and path == suffix[1:])
        assert self.regex is not None
        return self.regex.match(path) is not None

    def may_match_below(self, depth: int) -> bool:
        """Whether this pattern can match a path deeper than ``depth`` components."""
        return "**" in self.text or len(self.text.split("/")) > depth


class DockerIgnore:
    def __init__(self, text: str) -> None:
        self.patterns: list[Pattern] = []
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            line = line.strip()
            if not line:
                continue
            exclusion = line.startswith("!")
            if exclusion:
                line = line[1:].strip()
            line = posixpath.normpath(line)
            if len(line) > 1 and line.startswith("/"):
                line = line[1:]
            self.patterns.append(Pattern.compile(line, exclusion))

    def excluded(self, path: str) -> bool:
        """``MatchesOrParentMatches``: a pattern matching a parent directory counts."""
        path = posixpath.normpath(path)
        parent = posixpath.dirname(path) or "."
        parents = parent.split("/")
        matched = False
        for pattern in self.patterns:
            if pattern.exclusion != matched:
                continue
            hit = pattern.match(path)
            if not hit and parent != ".":
                hit = any(pattern.match("/".join(parents[: i + 1])) for i in range(len(parents)))
            if hit:
                matched = not pattern.exclusion
        return matched

    def prunable(self, directory: str) -> bool:
        """Excluded, and no exception pattern can let anything inside back in."""
        depth = len(directory.split("/"))
        return self.excluded(directory) and not any(
            p.exclusion and p.may_match_below(depth) for p in self.patterns
        )


def dockerignore() -> DockerIgnore:
    return DockerIgnore(DOCKERIGNORE.read_text())


def build_context() -> list[str]:
    """Paths (files and symlinks) the build context holds: the repository less what is ignored."""
    ignore = dockerignore()
    out = []
    for top, dirs, files in os.walk(REPO):
        rel = Path(top).relative_to(REPO).as_posix()
        prefix = "" if rel == "." else rel + "/"
        kept = []
        for name in dirs:
            if (Path(top) / name).is_symlink():
                files.append(name)  # sent as a symlink, not followed
            elif not ignore.prunable(prefix + name):
                kept.append(name)
        dirs[:] = kept
        out.extend(prefix + name for name in files if not ignore.excluded(prefix + name))
    return sorted(out)


def test_dockerignore_matching_follows_docker() -> None:
    """The matcher above, on cases whose outcome Docker's own tests and docs fix."""
    ignore = DockerIgnore("*\n!keep/\n**/*.pyc\n/docs/**\n# comment\n")
    assert ignore.excluded("README.md")
    assert ignore.excluded("tests/unit/test_x.py")  # through its parent ``tests``
    assert not ignore.excluded("keep/a/b.py")
    assert ignore.excluded("keep/a/b.pyc")
    assert DockerIgnore("**/*.pyc").excluded("a.pyc")  # ``**/`` also matches no directory
    assert ignore.prunable("tests")
    assert not ignore.prunable("keep")
    assert not DockerIgnore("*.md").excluded("docs/a.md")  # ``*`` stays in one directory
    assert DockerIgnore("docs/**").excluded("docs/a/b.md")
    assert not DockerIgnore("docs/**").excluded("docsx")


# --- static checks ------------------------------------------------------------------------------


def test_the_dockerfile_parses_into_a_build_and_a_runtime_stage() -> None:
    found = stages()
    assert len(found) >= 2
    assert build_stage() is not found[-1]
    assert found[-1].all("ENTRYPOINT")


def test_every_base_image_is_pinned_by_tag_and_digest() -> None:
    for stage in stages():
        name = stage.image.partition("@")[0]
        assert DIGEST.search(stage.image), f"{stage.name}: {stage.image} is not pinned by digest"
        assert ":" in name.rsplit("/", 1)[-1], f"{stage.name}: {stage.image} names no tag"
        assert "$" not in stage.image, f"{stage.name}: {stage.image} depends on a build argument"
    # The C extension built in the first stage must load in the last: one interpreter for both.
    assert build_stage().image == stages()[-1].image


def test_the_image_python_is_the_one_the_tests_run_on() -> None:
    tag = stages()[-1].image.partition("@")[0].rsplit(":", 1)[1]
    version = re.match(r"(\d+)\.(\d+)", tag)
    assert version, f"no Python version in the base image's tag {tag!r}"
    assert (int(version[1]), int(version[2])) == sys.version_info[:2]
    assert Requirement(f"python{PYPROJECT['project']['requires-python']}").specifier.contains(
        f"{version[1]}.{version[2]}"
    )


def test_the_runtime_stage_runs_as_a_numeric_non_root_user() -> None:
    final = stages()[-1]
    user = final.last("USER").value.strip()
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"USER {user}: Kubernetes' runAsNonRoot can only verify a number"
    assert int(uid) != 0
    if gid:
        assert gid.isdigit() and int(gid) != 0, f"USER {user}"
    # The user exists in the image (a passwd entry keeps tools that look the user up happy).
    commands = " ".join(i.value for i in final.all("RUN"))
    assert re.search(rf"useradd\b.*--uid {uid}\b", commands), "no useradd of the USER's uid"
    # Nothing after USER switches back.
    last_user = max(n for n, i in enumerate(final.instructions) if i.name == "USER")
    assert not [i for i in final.instructions[last_user:] if i.name == "RUN"]


def test_the_runtime_stage_has_no_build_tools() -> None:
    final = stages()[-1]
    assert not final.all("ADD")
    for instruction in final.all("RUN"):
        words = set(re.split(r"[\s;&|()]+", instruction.value))
        assert not words & BUILD_TOOLS, f"RUN {instruction.value}: {words & BUILD_TOOLS}"
        assert not {w for w in words if w.endswith("-dev")}, f"RUN {instruction.value}: headers"
    build = build_stage()
    build_inputs = {i.workdir for i in build.instructions if i.name == "COPY"}
    for instruction in final.all("COPY"):
        assert flags(instruction.value).get("from") == build.name, (
            f"COPY {instruction.value}: the final stage takes nothing from the build context"
        )
        sources, _ = copy_operands(instruction.value)
        for source in sources:
            for inputs in build_inputs:
                assert not PurePosixPath(source).is_relative_to(inputs), (
                    f"COPY {instruction.value}: {source} is the build stage's source tree"
                )


def test_the_runtime_stage_installs_only_the_kerberos_libraries() -> None:
    """apt-get in the last stage: update, install the libraries without recommends, remove
    the lists, in one RUN (one layer, no package lists left in the image)."""
    final = stages()[-1]
    installed = apt_packages(final)
    assert installed, "the runtime stage installs no library for gssapi"
    assert installed <= RUNTIME_PACKAGES, sorted(installed - RUNTIME_PACKAGES)
    assert "libgssapi-krb5-2" in installed  # gssapi's modules link libgssapi_krb5.so.2
    for instruction in final.all("RUN"):
        commands = shell_commands(instruction.value)
        if not any(argv[0] in ("apt", "apt-get", "dpkg") for argv in commands):
            continue
        assert commands[0] == ["apt-get", "update"], instruction.value
        assert commands[-1] == ["rm", "-rf", "/var/lib/apt/lists/*"], instruction.value
        for argv in commands[1:-1]:
            assert argv[:2] == ["apt-get", "install"], f"{instruction.value}: {shlex.join(argv)}"
            assert "-y" in argv and "--no-install-recommends" in argv, shlex.join(argv)


def test_the_build_stage_compiles_gssapi_against_mit_krb5() -> None:
    build = build_stage()
    assert apt_packages(build) >= KERBEROS_BUILD_PACKAGES, "no MIT krb5 headers to build gssapi"
    assert {"gcc", "libc6-dev"} <= apt_packages(build)
    for instruction in build.all("RUN"):
        if "apt-get" in instruction.value:
            assert "--no-install-recommends" in instruction.value, instruction.value
            assert "rm -rf /var/lib/apt/lists/*" in instruction.value, instruction.value
    # The build stage's smoke test imports gssapi: the compiled modules load the libraries.
    assert {"gssapi", "proxy.app", "proxy.wire._scanner", "proxy.cache._assemble"} <= (
        imported_modules(smoke_test())
    )


def debian_release() -> str:
    os_release = Path("/etc/os-release")
    fields = (
        dict(line.split("=", 1) for line in os_release.read_text().splitlines() if "=" in line)
        if os_release.exists()
        else {}
    )
    return f"{fields.get('ID', '')}:{fields.get('VERSION_CODENAME', '').strip(chr(34))}"


def dpkg_depends(package: str) -> list[list[str]] | None:
    """An installed package's Depends and Pre-Depends, each a list of alternatives; None if
    the package is not installed here."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status}\t${Depends}, ${Pre-Depends}", package],
        capture_output=True,
        text=True,
        timeout=30,
    )
    status, _, fields = result.stdout.partition("\t")
    if result.returncode != 0 or status != "installed":
        return None
    out = []
    for entry in fields.split(","):
        names = [a.split("(")[0].strip().split(":")[0] for a in entry.split("|")]
        if any(names):
            out.append([n for n in names if n])
    return out


def dependency_closure(packages: set[str]) -> set[str]:
    """The installed packages ``packages`` need (Depends and Pre-Depends, recursively; of
    alternatives, those installed here)."""
    seen: set[str] = set()
    todo = list(packages)
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        depends = dpkg_depends(package)
        assert depends is not None or package not in packages, f"{package} is not installed"
        if depends is None:
            continue
        seen.add(package)
        for alternatives in depends:
            todo += alternatives
    return seen


def test_the_runtime_libraries_are_what_gssapi_links() -> None:
    """Every shared library the compiled gssapi loads comes from a package of the runtime
    stage or one they depend on (or libc6, the base image's)."""
    release = stages()[-1].image.partition("@")[0].rsplit("-", 1)[-1]
    if debian_release() != f"debian:{release}" or shutil.which("dpkg-query") is None:
        pytest.skip(f"this machine is not Debian {release}, the base image's release")
    import gssapi

    modules = sorted(Path(gssapi.__file__).parent.rglob("*.so"))
    assert modules, "gssapi has no compiled modules"
    linked: set[str] = set()
    for module in modules:
        ldd = subprocess.run(["ldd", str(module)], capture_output=True, text=True, timeout=30)
        assert ldd.returncode == 0, ldd.stderr
        for line in ldd.stdout.splitlines():
            match = re.search(r"=>\s+(/\S+)", line)
            if match:
                linked.add(os.path.realpath(match.group(1)))
    owners: dict[str, str] = {}
    for library in sorted(linked):
        found = subprocess.run(["dpkg", "-S", library], capture_output=True, text=True)
        if found.returncode != 0:  # /lib -> /usr/lib: dpkg knows one of the two spellings
            found = subprocess.run(
                ["dpkg", "-S", library.replace("/usr/lib/", "/lib/", 1)],
                capture_output=True,
                text=True,
            )
        assert found.returncode == 0, f"{library}: no Debian package owns it"
        owners[library] = found.stdout.split(":", 1)[0].strip()
    assert "libgssapi-krb5-2" in owners.values(), owners
    provided = dependency_closure(apt_packages(stages()[-1])) | {"libc6"}
    missing = {lib: owner for lib, owner in owners.items() if owner not in provided}
    assert not missing, f"gssapi loads libraries the runtime stage does not install: {missing}"


def test_only_the_locked_runtime_packages_go_into_the_environment() -> None:
    argv = sync_command()
    # The lock as it is (never re-resolved on the day of the build), no dependency group,
    # the proxy as a wheel rather than a link to /src.
    assert {"--frozen", "--no-dev", "--no-editable"} <= set(argv), argv
    # The image's extras and no other: the test and rig extras (pytest, pyspark) stay out.
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert installed_extras() == IMAGE_EXTRAS, installed_extras()
    assert set(extras) >= IMAGE_EXTRAS and not IMAGE_EXTRAS & {"test", "rig"}
    for extra in IMAGE_EXTRAS:
        names = {canonicalize_name(Requirement(r).name) for r in extras[extra]}
        assert "hms-cache-proxy" not in names, f"[{extra}] must not pull in other extras"
    # Into the environment the runtime stage copies, with no Python fetched by uv.
    env = build_env()
    (copied,) = {copy_operands(i.value)[0][0] for i in stages()[-1].all("COPY")}
    assert env.get("UV_PROJECT_ENVIRONMENT") == copied, (env, copied)
    assert env.get("UV_PYTHON_DOWNLOADS") == "never"
    # uv.lock is what the sync reads: it is copied where the project is.
    copied_files = {
        posixpath.normpath(posixpath.join(i.workdir, s))
        for i in build_stage().all("COPY")
        for s in copy_operands(i.value)[0]
    }
    assert {"/src/uv.lock", "/src/pyproject.toml"} <= copied_files, copied_files


def test_the_image_uv_is_the_pinned_one() -> None:
    """pip installs only uv, with the hashes of scripts/uv-requirements.txt (as set-up does)."""
    installs = [
        argv
        for instruction in build_stage().all("RUN")
        for argv in shell_commands(instruction.value)
        if argv[0] in ("pip", "pip3") or argv[1:3] == ["-m", "pip"]
    ]
    assert len(installs) == 1, installs
    (argv,) = installs
    assert "install" in argv and "--require-hashes" in argv and "--no-deps" in argv, argv
    assert argv[argv.index("-r") + 1] == "scripts/uv-requirements.txt", argv
    target = argv[argv.index("--target") + 1]
    assert sync_command()[0] == f"{target}/bin/uv", sync_command()
    assert "scripts/uv-requirements.txt" in (REPO / "scripts" / "setup.sh").read_text()


def test_the_ports_are_the_proxy_defaults() -> None:
    exposed = set()
    for instruction in stages()[-1].all("EXPOSE"):
        exposed |= {int(p.partition("/")[0]) for p in instruction.value.split()}
    defaults = {f.name: f.default for f in config.option_fields()}
    expected = {defaults[name].port for name in ("listen", "metrics_listen", "admin_listen")}
    assert exposed == expected


def test_the_entry_point_is_the_console_script() -> None:
    final = stages()[-1]
    entrypoint = exec_form(final.last("ENTRYPOINT").value)
    assert len(entrypoint) == 1
    assert entrypoint[0] in PYPROJECT["project"]["scripts"]
    assert exec_form(final.last("CMD").value) == ["serve"]


def test_the_healthcheck_asks_the_readiness_service_in_time() -> None:
    options, argv = healthcheck()
    assert argv[0] == "python" and "-c" in argv, argv
    code = argv[argv.index("-c") + 1]
    tree = ast.parse(code)  # valid Python, or this raises
    compile(tree, "<HEALTHCHECK>", "exec")
    keywords = {
        k.arg: k.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for k in node.keywords
    }
    assert isinstance(keywords.get("service"), ast.Constant)
    assert keywords["service"].value == READINESS
    # The call gives up before Docker kills the check, so a slow proxy fails cleanly.
    assert isinstance(keywords.get("timeout"), ast.Constant)
    assert keywords["timeout"].value < seconds(options["timeout"])
    for option in ("interval", "timeout", "start-period"):
        seconds(options[option])


def test_the_image_environment_is_a_valid_configuration() -> None:
    env = image_env({"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert env["PYTHONUNBUFFERED"] == "1"  # log lines reach `docker logs` as they are written
    known = {config.env_name(f.name) for f in config.option_fields()}
    ours = {k for k in env if k.startswith(config.ENV_PREFIX)}
    assert ours <= known | {config.ENV_PREFIX + "CONFIG"}, "the proxy refuses unknown variables"
    # With nothing but an upstream added, the image's environment starts the proxy.
    config.load({"upstream": "thrift://hms:9083"}, env=env)


def test_the_labels_agree_with_the_project() -> None:
    labels = DockerfileParser(path=str(DOCKERFILE)).labels
    project = PYPROJECT["project"]
    assert labels["org.opencontainers.image.version"] == project["version"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.description"] == project["description"]
    base, _, digest = stages()[-1].image.partition("@")
    assert labels["org.opencontainers.image.base.name"] == base
    assert labels["org.opencontainers.image.base.digest"] == digest


def test_every_build_input_is_in_the_repository_and_the_context() -> None:
    ignore = dockerignore()
    context = build_context()
    for instruction in build_stage().all("COPY"):
        if "from" in flags(instruction.value):
            continue
        sources, _ = copy_operands(instruction.value)
        for source in sources:
            assert not set("*?[") & set(source), f"{source}: wildcards are not reproduced here"
            path = posixpath.normpath(source)
            assert (REPO / path).exists(), f"COPY {source}: not in the repository"
            assert not ignore.excluded(path), f"COPY {source}: excluded by .dockerignore"
            assert path in context or any(c.startswith(path + "/") for c in context), source


def test_the_context_holds_only_what_the_build_copies() -> None:
    copied = set()
    for instruction in build_stage().all("COPY"):
        if "from" not in flags(instruction.value):
            copied |= {posixpath.normpath(s) for s in copy_operands(instruction.value)[0]}
    context = build_context()
    outside = [c for c in context if not any(c == s or c.startswith(s + "/") for s in copied)]
    assert not outside, f"in the build context but never copied: {outside}"
    leftovers = [
        c
        for c in context
        if "__pycache__" in c.split("/")
        or c.endswith((".pyc", *importlib.machinery.EXTENSION_SUFFIXES))
    ]
    assert not leftovers, f"built or cached files would reach the image build: {leftovers}"
    for name in (".git", ".venv", ".rig", "tests", "bench"):
        if (REPO / name).exists():
            assert dockerignore().excluded(name), name


# --- the build, reproduced ----------------------------------------------------------------------


def lay_out_build_inputs(stage: Stage, rootfs: Path) -> None:
    """Do the stage's COPY instructions from the build context into ``rootfs``."""
    context = build_context()
    for instruction in stage.all("COPY"):
        if "from" in flags(instruction.value):
            continue
        sources, dest = copy_operands(instruction.value)
        target = PurePosixPath(posixpath.join(instruction.workdir, dest))
        into_dir = dest.endswith("/") or len(sources) > 1
        for source in sources:
            path = posixpath.normpath(source)
            if path in context:  # a file
                name = target / PurePosixPath(path).name if into_dir else target
                copy_entry(REPO / path, rootfs / name.relative_to("/"))
                continue
            for entry in context:
                if entry.startswith(path + "/"):
                    inside = PurePosixPath(entry).relative_to(path)
                    copy_entry(REPO / entry, rootfs / (target / inside).relative_to("/"))


def copy_entry(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink():
        dest.symlink_to(os.readlink(source))
    else:
        shutil.copy2(source, dest)


def source_tree(rootfs: Path) -> Path:
    """Where the build stage's ``uv sync`` runs, in ``rootfs``."""
    return rootfs / PurePosixPath(sync_run()[0].workdir).relative_to("/")


@dataclass
class Built:
    wheel: Path
    rootfs: Path
    output: str  # what the build printed (uv shows the build backend's warnings)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The wheel of the proxy that the build stage's ``uv sync --no-editable`` installs, built
    from the files the build stage copies."""
    root = tmp_path_factory.mktemp("image")
    rootfs = root / "rootfs"
    lay_out_build_inputs(build_stage(), rootfs)
    out = root / "wheels"
    result = subprocess.run(
        [str(UV), "build", "--wheel", "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=source_tree(rootfs),
        env=uv_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("*.whl")
    return Built(wheel, rootfs, result.stdout + result.stderr)


def test_building_the_wheel_warns_about_no_package(built: Built) -> None:
    """Every directory Python could import is in ``packages``: otherwise setuptools prints a
    ~50-line ``BuildBackendWarning`` ("Package 'proxy._idl' is absent from the `packages`
    configuration") at every install."""
    assert "BuildBackendWarning" not in built.output, built.output
    assert "absent from the `packages`" not in built.output, built.output


def test_the_wheel_holds_the_package_the_idl_the_scanner_and_the_grpc_code(built: Built) -> None:
    names = set(zipfile.ZipFile(built.wheel).namelist())
    context = build_context()
    modules = {c for c in context if c.startswith("proxy/") and c.endswith((".py", ".pyi"))}
    assert modules, "no modules in the build context"
    assert modules <= names, sorted(modules - names)
    package_data = {
        f"{package.replace('.', '/')}/{p.relative_to(root).as_posix()}"
        for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items()
        for root in [REPO / package.replace(".", "/")]
        for pattern in patterns
        for p in root.glob(pattern)
    }
    assert any(n.endswith(".thrift") for n in package_data), "the IDL is not package data"
    assert package_data <= names, sorted(package_data - names)
    for c_source in (c for c in context if c.startswith("proxy/") and c.endswith(".c")):
        stem = c_source.removesuffix(".c")
        assert any(stem + s in names for s in importlib.machinery.EXTENSION_SUFFIXES), (
            f"{c_source} was not compiled into the wheel"
        )
        assert f"{stem}.pyi" in names, f"{c_source} has no stub in the wheel"
    for proto in sorted((REPO / "idl").glob("*.proto")):
        for module in (f"{proto.stem}_pb2.py", f"{proto.stem}_pb2_grpc.py"):
            assert f"proxy/admin/_gen/{module}" in names, module


def test_the_wheel_declares_the_runtime_dependencies_and_the_console_script(
    built: Built,
) -> None:
    with zipfile.ZipFile(built.wheel) as wheel:
        info = next(n.split("/")[0] for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        tags = HeaderParser().parsestr(wheel.read(f"{info}/WHEEL").decode()).get_all("Tag")
    runtime = {
        str(Requirement(r))
        for r in metadata.get_all("Requires-Dist") or []
        if "extra" not in str(Requirement(r).marker or "")
    }
    assert runtime == {str(Requirement(r)) for r in PYPROJECT["project"]["dependencies"]}
    for script, target in PYPROJECT["project"]["scripts"].items():
        assert re.search(rf"^{re.escape(script)}\s*=\s*{re.escape(target)}$", entry_points, re.M)
    python = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert tags and all(t.startswith(f"{python}-{python}-linux") for t in tags), tags


# --- the environment, made as the build stage makes it --------------------------------------------


@dataclass
class Runtime:
    venv: Path
    bin: Path
    site: Path
    workdir: Path
    env: dict[str, str]

    def run(
        self, *argv: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            cwd=self.workdir,
            env=self.env if env is None else env,
            timeout=60,
        )

    def distributions(self) -> set[str]:
        """The (canonical) names of what is installed in the environment."""
        code = "import importlib.metadata as m; print(*(d.name for d in m.distributions()))"
        result = self.run(str(self.bin / "python"), "-I", "-c", code)
        assert result.returncode == 0, result.stderr
        return {canonicalize_name(n) for n in result.stdout.split()}


@pytest.fixture(scope="module")
def runtime(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    """The virtual environment the build stage's own ``uv sync`` command makes (its argv and
    ENV, read from the Dockerfile) from the files the stage copies, with this machine's uv of
    the same pinned version and its cache (offline: set-up filled it from the same lock)."""
    root = tmp_path_factory.mktemp("runtime")
    venv = root / "opt" / "hms-cache-proxy"
    env = build_env()
    assert "UV_PROJECT_ENVIRONMENT" in env
    env = {k: v for k, v in env.items() if k not in ("UV_NO_CACHE", "UV_PROJECT_ENVIRONMENT")}
    # The image's Python is the base image's; here, the one the tests run on (not their venv).
    python = str(
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    )
    env = uv_env(**env, UV_PROJECT_ENVIRONMENT=str(venv), UV_PYTHON=python)
    result = subprocess.run(
        [str(UV), *sync_command()[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=source_tree(built.rootfs),
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    workdir = root / "work"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env = {k: v for k, v in env.items() if not k.startswith(config.ENV_PREFIX)}
    env = image_env(env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    return Runtime(venv, venv / "bin", site, workdir, env)


def test_the_image_installs_the_lock_and_nothing_else(runtime: Runtime) -> None:
    """Every package in the environment is at the lock's version, and complete."""
    locked = locked_versions()
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    result = runtime.run(str(runtime.bin / "python"), "-I", "-c", code)
    assert result.returncode == 0, result.stderr
    installed = {canonicalize_name(n): v for n, v in json.loads(result.stdout).items()}
    assert "hms-cache-proxy" in installed and "gssapi" in installed, installed
    unlocked = {n: v for n, v in installed.items() if locked.get(n) != v}
    assert not unlocked, f"not the lock's versions: {unlocked}"
    check = runtime.run(str(UV), "pip", "check", "--python", str(runtime.bin / "python"))
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_console_script_runs_from_the_wheel(runtime: Runtime) -> None:
    (script,) = exec_form(stages()[-1].last("ENTRYPOINT").value)
    path = shutil.which(script, path=runtime.env["PATH"])
    assert path == str(runtime.bin / script)
    version = runtime.run(path, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.split() == [script, PYPROJECT["project"]["version"]]
    command = exec_form(stages()[-1].last("CMD").value)
    config_check = runtime.run(path, *command, "--print-config", "--upstream", "thrift://hms:9083")
    assert config_check.returncode == 0, config_check.stdout + config_check.stderr


PROBE = """
import importlib.metadata, importlib.util, json, sys
import proxy, proxy.app, proxy.wire._scanner, proxy.cache._assemble
import proxy.admin._gen.admin_pb2_grpc, grpc_health.v1
import proxy.auth, gssapi, gssapi.raw
from proxy import idl
absent = [n for n in sys.argv[1:] if importlib.util.find_spec(n) is None]
print(json.dumps({
    "proxy": proxy.__file__,
    "scanner": proxy.wire._scanner.__file__,
    "assemble": proxy.cache._assemble.__file__,
    "idl": str(idl.idl_dir()),
    "methods": len(idl.method_names()),
    "gssapi": gssapi.__file__,
    "krb5": hasattr(gssapi.raw, "acquire_cred_from"),
    "absent": absent,
}))
"""


def imports_of_test_extras(runtime: Runtime) -> list[str]:
    """Import names of packages installed with the tests that the image's environment lacks."""
    image = runtime.distributions()
    names = []
    for name, dists in importlib.metadata.packages_distributions().items():
        owners = {canonicalize_name(d) for d in dists}
        if name.isidentifier() and not owners & image:
            names.append(name)
    return sorted(names)


def test_the_package_runs_from_the_wheel_alone(runtime: Runtime) -> None:
    test_only = imports_of_test_extras(runtime)
    assert {"pytest", "pyspark"} <= set(test_only)
    result = runtime.run(str(runtime.bin / "python"), "-I", "-c", PROBE, *test_only)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    package = runtime.site / "proxy"
    assert Path(probe["proxy"]) == package / "__init__.py"
    for name, where in (("scanner", "wire"), ("assemble", "cache")):
        assert Path(probe[name]).parent == package / where
        assert Path(probe[name]).name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert Path(probe["idl"]) == package / "_idl"
    assert probe["methods"] > 100
    # The extra [kerberos]: gssapi in the environment, with the credential-store extension
    # (keytab logins without kinit) that MIT krb5 gives it.
    assert Path(probe["gssapi"]).is_relative_to(runtime.site)
    assert probe["krb5"], "gssapi without acquire_cred_from: not built against MIT krb5"
    assert probe["absent"] == test_only, "test dependencies are visible to the runtime"


def test_the_build_stage_smoke_test_passes_in_the_runtime_environment(runtime: Runtime) -> None:
    result = runtime.run(str(runtime.bin / "python"), "-I", "-c", smoke_test())
    assert result.returncode == 0, result.stderr


# --- the HEALTHCHECK, run against the proxy -----------------------------------------------------


@dataclass
class RunningProxy:
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    log: Path
    port: int
    metrics_port: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def readyz(self) -> tuple[int, str]:
        """/readyz on the metrics port: the status and the checks (``name=value`` lines)."""
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()


StartProxy = Callable[..., RunningProxy]


@pytest.fixture
def start_proxy(runtime: Runtime, tmp_path: Path) -> Iterator[StartProxy]:
    """The proxy as the image starts it: ENTRYPOINT + CMD, the image's environment, flags."""
    started: list[RunningProxy] = []

    def start(
        upstream: str,
        *args: str,
        admin_host: str = "127.0.0.1",
        extra_env: dict[str, str] | None = None,
    ) -> RunningProxy:
        admin_port, port, metrics_port = free_ports(3)
        env = dict(runtime.env) | (extra_env or {})
        env[config.env_name("admin_listen")] = f"{admin_host}:{admin_port}"
        if not config.is_loopback(admin_host):
            token = tmp_path / f"token-{admin_port}"
            token.write_text("s3cret\n")
            env[config.env_name("admin_token_file")] = str(token)
        entrypoint = exec_form(stages()[-1].last("ENTRYPOINT").value)
        command = exec_form(stages()[-1].last("CMD").value)
        executable = shutil.which(entrypoint[0], path=env["PATH"])
        assert executable == str(runtime.bin / entrypoint[0])
        listen = ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
        log = tmp_path / f"proxy-{admin_port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [executable, *entrypoint[1:], *command, "--upstream", upstream, *listen, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=runtime.workdir,
                env=env,
            )
        proxy = RunningProxy(process, env, log, port, metrics_port)
        started.append(proxy)
        try:
            wait_for_port(admin_port, 30, alive=lambda: process.poll() is None)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{proxy.output()}") from exc
        return proxy

    yield start
    for proxy in started:
        if proxy.process.poll() is None:
            proxy.process.send_signal(signal.SIGTERM)
            try:
                proxy.process.wait(30)
            except subprocess.TimeoutExpired:
                proxy.process.kill()
                proxy.process.wait(10)


def run_healthcheck(
    runtime: Runtime, env: dict[str, str], *, service: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK's command, as Docker runs it in the container (optionally another
    health service, to tell a broken check from a proxy that is not ready)."""
    _, argv = healthcheck()
    if service is not None:
        at = argv.index("-c") + 1
        code = argv[at].replace(f"service={READINESS!r}", f"service={service!r}")
        assert code != argv[at], "the readiness service is not named where expected"
        argv = [*argv[:at], code, *argv[at + 1 :]]
    executable = shutil.which(argv[0], path=env["PATH"])
    assert executable == str(runtime.bin / argv[0]), "not the image's Python"
    return runtime.run(executable, *argv[1:], env=env)


def test_the_healthcheck_fails_without_a_proxy(runtime: Runtime) -> None:
    env = dict(runtime.env)
    env[config.env_name("admin_listen")] = f"127.0.0.1:{free_port()}"
    result = run_healthcheck(runtime, env)
    assert result.returncode == 1  # unhealthy (2 is reserved by Docker)
    assert "StatusCode.UNAVAILABLE" in result.stderr


def test_the_healthcheck_fails_while_the_metastore_is_unreachable(
    runtime: Runtime, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(f"thrift://127.0.0.1:{free_port()}")
    # Alive: the same check on the liveness service passes ...
    alive = run_healthcheck(runtime, proxy.env, service="")
    assert alive.returncode == 0, alive.stderr + proxy.output()
    # ... but not ready: the proxy answered NOT_SERVING, the check did not break.
    ready = run_healthcheck(runtime, proxy.env)
    assert (ready.returncode, ready.stderr) == (1, "")
    assert proxy.process.poll() is None


@pytest.mark.hms
def test_the_healthcheck_passes_once_ready_with_the_admin_port_open(
    runtime: Runtime, start_proxy: StartProxy, hms: MetastoreServer
) -> None:
    """As in Kubernetes: admin on all addresses, with a token; health calls need none."""
    proxy = start_proxy(hms.uri, admin_host="0.0.0.0")
    deadline = time.monotonic() + 60
    while (result := run_healthcheck(runtime, proxy.env)).returncode != 0:
        assert proxy.process.poll() is None, proxy.output()
        assert time.monotonic() < deadline, f"never healthy: {result.stderr}\n{proxy.output()}"
        time.sleep(0.5)
    assert result.stderr == ""
    proxy.process.send_signal(signal.SIGTERM)
    assert proxy.process.wait(60) == 0, proxy.output()


# --- Kerberos, from the image's environment -----------------------------------------------------


def kerberos_flags(realm: Realm, *, upstream: bool) -> list[str]:
    """The proxy as proxy/localhost, from its keytab; towards a Kerberized metastore too."""
    flags = [
        "--client-auth",
        "kerberos",
        "--kerberos-principal",
        realm.principal("proxy/localhost"),
        "--kerberos-keytab",
        str(realm.keytab("proxy/localhost")),
    ]
    if upstream:
        flags += ["--upstream-auth", "kerberos", "--upstream-principal", f"hive/_HOST@{realm.name}"]
    return flags


def checks(body: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in body.splitlines() if "=" in line)


def test_the_image_logs_in_from_a_keytab_without_kinit(
    runtime: Runtime, start_proxy: StartProxy, realm: Realm
) -> None:
    """gssapi of the image's environment: a keytab login at a real KDC (no ticket cache, no
    kinit; KRB5_CONFIG only), reported as readiness's check `kerberos`."""
    proxy = start_proxy(
        f"thrift://localhost:{free_port()}",
        *kerberos_flags(realm, upstream=True),
        extra_env=realm.env,
    )
    deadline = time.monotonic() + 30
    while "kerberos" not in checks((ready := proxy.readyz())[1]):
        assert proxy.process.poll() is None, proxy.output()
        assert time.monotonic() < deadline, f"no kerberos check: {ready}\n{proxy.output()}"
        time.sleep(0.2)
    status, body = ready
    assert status == 503, body  # the metastore is not there ...
    assert checks(body)["kerberos"] == "ok", body  # ... but the login is
    assert checks(body)["metastore"] == "down", body
    assert "logged in as proxy/localhost@" in proxy.output()
    # The HEALTHCHECK says not ready, without breaking.
    assert (run_healthcheck(runtime, proxy.env).returncode, proxy.process.poll()) == (1, None)


@pytest.mark.hms
def test_the_image_serves_engines_of_a_kerberized_metastore(
    runtime: Runtime, start_proxy: StartProxy, realm: Realm, kerberos_hms: MetastoreServer
) -> None:
    """The HEALTHCHECK passes against a Kerberized metastore, and an engine authenticated
    with GSSAPI is served as itself."""
    proxy = start_proxy(
        kerberos_hms.uri, *kerberos_flags(realm, upstream=True), extra_env=realm.env
    )
    deadline = time.monotonic() + 60
    while (result := run_healthcheck(runtime, proxy.env)).returncode != 0:
        assert proxy.process.poll() is None, proxy.output()
        assert time.monotonic() < deadline, f"never healthy: {result.stderr}\n{proxy.output()}"
        time.sleep(0.5)
    status, body = proxy.readyz()
    assert (status, checks(body)["kerberos"]) == (200, "ok"), body
    with KerberosConnection(
        "localhost", proxy.port, service="proxy", ccache=realm.kinit("alice")
    ) as alice:
        method = "get_all_databases"
        reply = alice.call(idl.encode_call(method, 1))
        assert "default" in idl.decode_result(method, reply[12 + len(method) :]).success
    proxy.process.send_signal(signal.SIGTERM)
    assert proxy.process.wait(60) == 0, proxy.output()
