"""The project's IDL agrees with the Thrift classes compiled into Hive 2.3.10, field by field.

Wire compatibility rests on field ids and types. Rather than trust a transcription, this test
reads the real classes in ``hive-metastore-2.3.10.jar`` (and ``libfb303``) through Java
reflection and compares every struct, every method's arguments and result (declared
exceptions included, at their ids), and every enum value with what thriftpy2 loads from
``idl/``.
"""

from __future__ import annotations

import re
import subprocess
import zipfile
from typing import Any

import pytest

from proxy import idl
from tests.rig import java

pytestmark = pytest.mark.hms

PRIMITIVES = {
    2: "bool",
    3: "byte",
    4: "double",
    6: "i16",
    8: "i32",
    10: "i64",
    11: "string",
    18: "binary",
}


def _elem_text(spec: Any) -> str:
    if isinstance(spec, tuple):
        return _type_text(spec[0], spec[1])
    return PRIMITIVES[spec]


def _type_text(ttype: int, arg: Any) -> str:
    if ttype == 12:
        return str(arg.__name__)
    if ttype in (14, 15):
        return f"{'set' if ttype == 14 else 'list'}<{_elem_text(arg)}>"
    if ttype == 13:
        return f"map<{_elem_text(arg[0])},{_elem_text(arg[1])}>"
    if ttype == 8 and arg is not None:
        return str(arg.__name__)  # an enum
    return PRIMITIVES[ttype]


def ours(cls: Any) -> set[str]:
    out = set()
    for fid, field in cls.thrift_spec.items():
        ttype, name = field[0], field[1]
        arg = field[2] if len(field) == 4 else None
        required = "required " if field[-1] is True else ""
        out.add(f"{fid}:{required}{_type_text(ttype, arg)} {name}")
    return out


@pytest.fixture(scope="module")
def hive() -> dict[str, dict[str, set[str]]]:
    jars = java.spark_jars()
    names = []
    for jar, package in (
        ("hive-metastore-2.3.10.jar", "org/apache/hadoop/hive/metastore/api/"),
        ("libfb303-0.9.3.jar", "com/facebook/fb303/"),
    ):
        with zipfile.ZipFile(jars / jar) as z:
            names += [
                n[:-6].replace("/", ".")
                for n in z.namelist()
                if re.fullmatch(re.escape(package) + r"[A-Za-z_0-9]+\.class", n)
            ]
    out: dict[str, dict[str, set[str]]] = {"method": {}, "struct": {}, "enum": {}}
    for service in (
        "org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore",
        "com.facebook.fb303.FacebookService",
    ):
        text = subprocess.run(
            ["java", "-cp", java.classpath(java.compiled_helpers()), "IdlDump", service, *names],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for line in text.splitlines():
            kind, name, *fields = line.split(" ", 2)
            items = {f.strip() for f in (fields[0].split(";") if fields else []) if f.strip()}
            out[kind][name] = items
    return out


def test_every_hive_23_method_is_in_our_idl_with_the_same_shape(
    hive: dict[str, dict[str, set[str]]],
) -> None:
    assert len(hive["method"]) > 300
    for name, fields in hive["method"].items():
        method, part = name.rsplit("_", 1)
        cls = getattr(idl, f"{part}_class")(method)
        assert ours(cls) == fields, name


# Fields Hive 3 reused for something else: 2.3.10's Table has catName at 16, Hive 3 and 4
# have creationMetadata there and catName at 17. The IDL follows Hive 3/4 (a 2.3.10 string
# at 16 is skipped as a field of another wire type; 2.3 has one catalog anyway).
REUSED = {"Table": {"16:string catName"}}


def _ids(fields: set[str]) -> set[str]:
    return {f.split(":", 1)[0] for f in fields}


def test_every_hive_23_struct_has_the_same_fields(hive: dict[str, dict[str, set[str]]]) -> None:
    """Every 2.3.10 field is ours at its id with its type; ours may add Hive 3/4 fields at
    ids 2.3.10 does not use (and the reused one above)."""
    assert len(hive["struct"]) > 130
    module = idl.module()
    for name, fields in hive["struct"].items():
        mine = ours(getattr(module, name))
        reused = REUSED.get(name, set())
        assert fields - reused <= mine, name
        assert not _ids(mine - fields) & _ids(fields - reused), name


def test_every_hive_23_enum_value_matches(hive: dict[str, dict[str, set[str]]]) -> None:
    module = idl.module()
    for name, values in hive["enum"].items():
        cls = getattr(module, name, None) or getattr(module.fb303, name)
        for item in values:
            key, number = item.split("=")
            assert getattr(cls, key) == int(number), f"{name}.{key}"
