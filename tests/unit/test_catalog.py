"""The method catalog covers the IDL, declares what it decodes, and every path in it exists.
(Coverage of every Hive version's methods: test_catalog_coverage.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from proxy import catalog, idl
from proxy.catalog import Kind, Scope

SPECS = list(catalog.all_methods())


def test_every_idl_method_is_classified() -> None:
    assert set(idl.method_names()) <= {s.name for s in SPECS}


def test_every_method_whose_arguments_are_decoded_is_declared_in_the_idl() -> None:
    """Cacheable reads are keyed and planned on their decoded arguments, writes with targets
    invalidate what those name; everything else is forwarded as bytes."""
    for spec in SPECS:
        if spec.kind is Kind.CACHEABLE_READ or spec.targets:
            assert spec.name in idl.method_names(), spec.name


def _spec_field(cls: Any, name: str) -> tuple[Any, ...]:
    for field in cls.thrift_spec.values():
        if field[1] == name:
            return tuple(field)
    raise AssertionError(f"{cls.__name__} has no field {name!r}")


def _check_path(cls: Any, path: str) -> None:
    """Walk ``path`` through the thriftpy2 specs; fail on a name or shape that is not there."""
    current: Any = cls
    steps = path.split(".")
    for i, step in enumerate(steps):
        fan_out = step.endswith("[*]")
        field = _spec_field(current, step.removesuffix("[*]"))
        ttype, last = field[0], i == len(steps) - 1
        if fan_out:
            assert ttype in (14, 15), f"{path}: {step} is not a list"
            elem = field[2]
            current = elem[1] if isinstance(elem, tuple) else None
        elif ttype == 12:
            current = field[2]
        else:
            current = None
        if not last:
            assert current is not None, f"{path}: cannot descend past {step}"


def _paths(spec: catalog.MethodSpec) -> list[str]:
    out = []
    for target in spec.targets:
        out += [p for p in (target.db, target.table, target.tables) if p]
        out += [ref.split(":", 1)[1] for ref in target.partitions]
    out += [p for p in (spec.renamed_to, spec.cascade, spec.optional) if p]
    return out


@pytest.mark.parametrize("spec", [s for s in SPECS if _paths(s)], ids=lambda s: s.name)
def test_paths_exist_in_the_arguments(spec: catalog.MethodSpec) -> None:
    for path in _paths(spec):
        _check_path(idl.args_class(spec.name), path)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_partition_references_say_what_they_hold(spec: catalog.MethodSpec) -> None:
    for target in spec.targets:
        for ref in target.partitions:
            assert ref.split(":", 1)[0] in ("values", "name", "names", "objects")


def test_cacheable_reads_name_what_they_depend_on() -> None:
    for spec in SPECS:
        if spec.kind is Kind.CACHEABLE_READ:
            assert spec.scope != Scope.NONE, spec.name
            assert spec.targets or spec.wide, spec.name


def test_writes_that_change_metadata_say_where() -> None:
    catalog_wide = Scope.CATALOG | Scope.FUNCTIONS | Scope.PRIVILEGES
    for spec in SPECS:
        if spec.kind is Kind.WRITE and spec.scope & ~catalog_wide:
            assert spec.targets or spec.name == "drop_catalog", spec.name


def test_engine_hot_paths_are_cached() -> None:
    hot = [
        "get_table",
        "get_table_req",
        "get_database",
        "get_all_databases",
        "get_databases",
        "get_all_tables",
        "get_tables",
        "get_partition_names",
        "get_partition_names_ps",
        "get_partitions_by_names",
        "get_partitions_by_filter",
        "get_partitions",
        "get_table_statistics_req",
        "get_partitions_statistics_req",
        "get_partition_with_auth",
        "get_partitions_ps_with_auth",
        "get_fields",
    ]
    for name in hot:
        spec = catalog.lookup(name)
        assert spec is not None and spec.kind is Kind.CACHEABLE_READ, name


def test_only_reads_are_retried() -> None:
    assert catalog.lookup("get_table").retryable  # type: ignore[union-attr]
    for name in (
        "alter_partition",
        "add_partitions",
        "lock",
        "open_txns",
        "set_ugi",
        "get_delegation_token",
    ):
        assert not catalog.lookup(name).retryable, name  # type: ignore[union-attr]


def test_unknown_methods_have_no_entry() -> None:
    assert catalog.lookup("get_table_by_wishful_thinking") is None


def test_resolve_walks_lists_and_stops_at_none() -> None:
    m = idl.module()
    args = idl.args_class("add_partitions")(
        new_parts=[
            m.Partition(values=["1"], dbName="d", tableName="t"),
            m.Partition(values=["2"], dbName="d"),
        ]
    )
    assert catalog.resolve("new_parts[*].values", args) == [["1"], ["2"]]
    assert catalog.resolve("new_parts[*].tableName", args) == ["t"]
    assert catalog.resolve("new_parts[*].sd.location", args) == []
