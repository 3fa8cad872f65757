"""Java parts from Maven Central (Trino, Hive's standalone metastores, Iceberg), resolved by Maven.

Each part is a small pom under ``tests/rig/maven/<name>/pom.xml`` whose dependencies are what the
part needs. Maven downloads them into the user's repository (``~/.m2``, kept between runs on one
machine); :func:`resolved` copies them into ``.rig/maven/<name>-<digest of the pom>/lib`` and
unpacks the archives among them (a ``tar.gz`` or ``zip``, as Trino's server and plugins are
published) into ``.rig/maven/<name>-<digest>/<artifactId>/``. Nothing is committed; a changed pom
resolves into a new folder.

``python -m tests.rig.maven [name ...]`` resolves them all (or the named ones) ahead of the tests:
``scripts/setup.sh --test`` runs it, so a download that fails says so in one line there, not in a
test.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from tests.rig import machine

POMS = Path(__file__).resolve().parent / "maven"
OUT = machine.RIG_DIR / "maven"
JVMS = Path("/usr/lib/jvm")


def names() -> list[str]:
    return sorted(p.parent.name for p in POMS.glob("*/pom.xml"))


def folder(name: str) -> Path:
    pom = POMS / name / "pom.xml"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    return OUT / f"{name}-{digest}"


def resolved(name: str) -> Path:
    """The folder of ``name``'s resolved parts (see the module docstring); resolved once per
    pom, one process at a time (pytest-xdist's workers share .rig/), built aside and renamed
    into place, so a resolve that dies half-way leaves nothing that looks done; the folders of
    the part's earlier poms are removed."""
    out = folder(name)
    if (out / ".done").exists():
        return out
    with machine.alone(f"maven-{name}", OUT):
        if (out / ".done").exists():
            return out
        aside = OUT / ".building" / name
        shutil.rmtree(aside, ignore_errors=True)  # half-built, by a process that died
        aside.mkdir(parents=True)
        try:
            # One Maven at a time: 3.8 does not lock its local repository, and parts share
            # artifacts (Hadoop's client jars, the dependency plugin).
            with machine.alone("maven", OUT):
                _copy(POMS / name / "pom.xml", aside / "lib")
            for archive in sorted((aside / "lib").iterdir()):
                _unpack(archive, aside)
            (aside / ".done").touch()
            shutil.rmtree(out, ignore_errors=True)
            aside.rename(out)
        finally:
            shutil.rmtree(aside, ignore_errors=True)
        for old in OUT.iterdir():
            if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{12}}", old.name) and old != out:
                shutil.rmtree(old, ignore_errors=True)
    return out


def _copy(pom: Path, lib: Path) -> None:
    command = [
        "mvn",
        "-B",
        "-q",
        "-C",  # a download whose checksum does not match fails here, not in the unpack
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={lib}",
        "-Dmdep.overWriteIfNewer=true",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=3600)
    except FileNotFoundError:
        raise RuntimeError("no mvn on PATH (scripts/setup.sh --test installs Maven)") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"Maven did not resolve {pom.parent.name} within an hour") from None
    if done.returncode != 0:
        errors = [line for line in done.stdout.splitlines() if line.startswith("[ERROR]")]
        why = errors[0] if errors else (done.stdout + done.stderr).strip()[-300:]
        raise RuntimeError(f"Maven could not resolve {pom.parent.name}: {why}")


def _unpack(archive: Path, into: Path) -> None:
    """A ``<artifactId>-<version>.tar.gz`` or ``.zip`` unpacked into ``into/<artifactId>``,
    its single top folder (``trino-server-476/``) dropped."""
    match = re.fullmatch(r"(.+?)-(\d[\w.\-]*?)(?:\.tar\.gz|\.zip)", archive.name)
    if match is None:
        return
    target = into / match.group(1)
    unpacking = Path(tempfile.mkdtemp(prefix=".unpack-", dir=into))
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(unpacking)
                # zipfile drops the modes; Trino's launcher scripts must stay executable.
                for info in z.infolist():
                    mode = (info.external_attr >> 16) & 0o777
                    if mode:
                        os.chmod(unpacking / info.filename, mode)
        else:
            with tarfile.open(archive) as t:
                # Python 3.11.4 and later check members (Debian 12's 3.11.2 has no filter;
                # the archives come from Maven Central, checked by their checksums).
                safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
                t.extractall(unpacking, **safe)  # type: ignore[arg-type]
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise RuntimeError(
            f"could not unpack {archive.name} ({exc}); if it is damaged, delete it from "
            "~/.m2/repository and resolve again"
        ) from None
    tops = list(unpacking.iterdir())
    (tops[0] if len(tops) == 1 and tops[0].is_dir() else unpacking).rename(target)
    shutil.rmtree(unpacking, ignore_errors=True)
    archive.unlink()  # unpacked: the copy in ~/.m2 stays


def java_home(at_least: int, at_most: int | None = None, needs: str = "Trino") -> Path:
    """A JDK of version ``at_least`` (to ``at_most``): $JAVA_HOME if it is one, else the newest
    such under /usr/lib/jvm (this machine kind has a Temurin JDK beside the default 17)."""
    candidates = [Path(os.environ["JAVA_HOME"])] if "JAVA_HOME" in os.environ else []
    candidates += sorted(JVMS.glob("*"), key=_version, reverse=True)
    for home in candidates:
        version = _version(home)
        if (home / "bin" / "java").exists() and at_least <= version <= (at_most or version):
            return home
    wanted = f"{at_least} to {at_most}" if at_most else f"{at_least} or newer"
    raise RuntimeError(
        f"no JDK {wanted} (looked at $JAVA_HOME and {JVMS}); {needs} needs one: "
        f"install one there or set JAVA_HOME"
    )


def _version(home: Path) -> int:
    release = home / "release"
    if release.exists():
        found = re.search(r'JAVA_VERSION="(\d+)', release.read_text(errors="replace"))
        if found:
            return int(found.group(1))
    found = re.search(r"(\d+)", home.name)
    return int(found.group(1)) if found else 0


def main(argv: list[str]) -> int:
    for name in argv or names():
        started = time.monotonic()
        fresh = not (folder(name) / ".done").exists()
        try:
            resolved(name)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
        if fresh:
            print(f"{name}: resolved in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
