"""The jars of the pyspark wheel, and the rig's own Java helpers compiled against them."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

RIG_DIR = Path(__file__).resolve().parents[2] / ".rig"
SOURCES = Path(__file__).resolve().parent / "java"


def spark_jars() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    if not (jars / "hive-metastore-2.3.10.jar").is_file():
        raise RuntimeError(f"hive-metastore-2.3.10.jar not in {jars}: install pyspark==4.3.0")
    return jars


def classpath(*extra: Path) -> str:
    return ":".join([*(str(p) for p in extra), str(spark_jars() / "*")])


def compiled_helpers() -> Path:
    """Compile tests/rig/java/*.java once per content; returns the classes folder. Safe to
    call from several processes at once (pytest-xdist's workers): each compiles into a
    folder of its own, and the first to rename it into place wins."""
    sources = sorted(SOURCES.glob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    out = RIG_DIR / f"classes-{digest}"
    if (out / ".done").exists():
        return out
    RIG_DIR.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=RIG_DIR))
    try:
        subprocess.run(
            ["javac", "-nowarn", "-d", str(building), "-cp", classpath(), *map(str, sources)],
            check=True,
            capture_output=True,
        )
        (building / ".done").touch()
        if out.exists() and not (out / ".done").exists():
            shutil.rmtree(out, ignore_errors=True)  # a compile that died half-way, once
        try:
            building.rename(out)
        except OSError:  # another process put its own there first (the same classes)
            if not (out / ".done").exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return out
