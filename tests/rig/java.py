"""The jars of the pyspark wheel, and the rig's own Java helpers compiled against them."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.rig import machine

RIG_DIR = machine.RIG_DIR
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
    """Compile tests/rig/java/*.java once per content; returns the classes folder. One
    process at a time (pytest-xdist's workers share .rig/): the others wait, then find it
    built. Compiled into a folder of its own and renamed into place, so a compile that dies
    half-way leaves nothing that looks built."""
    sources = sorted(SOURCES.glob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    out = RIG_DIR / f"classes-{digest}"
    if (out / ".done").exists():
        return out
    with machine.alone("classes"):
        if (out / ".done").exists():
            return out  # (another process built it meanwhile)
        for left in [out, *RIG_DIR.glob(".classes-*")]:
            shutil.rmtree(left, ignore_errors=True)  # half-built, by a process that died
        building = Path(tempfile.mkdtemp(prefix=".classes-", dir=RIG_DIR))
        try:
            subprocess.run(
                ["javac", "-nowarn", "-d", str(building), "-cp", classpath(), *map(str, sources)],
                check=True,
                capture_output=True,
            )
            (building / ".done").touch()
            building.rename(out)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return out
