"""The jars of the pyspark wheel, and the rig's own Java helpers compiled against them."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
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
    """Compile tests/rig/java/*.java once per content; returns the classes folder."""
    sources = sorted(SOURCES.glob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    out = RIG_DIR / f"classes-{digest}"
    if (out / ".done").exists():
        return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    subprocess.run(
        ["javac", "-nowarn", "-d", str(out), "-cp", classpath(), *map(str, sources)],
        check=True,
        capture_output=True,
    )
    (out / ".done").touch()
    return out
