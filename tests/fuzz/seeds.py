"""Seed calls for the fuzzers: what engines really send, for every method in the catalog
whose arguments the IDL declares (the others are forwarded as bytes, never decoded).

Two sources per method: the request ``tests/rig/calls.py`` builds for the integration tests
(encoded by thriftpy2, as an engine would), and one built from the IDL with every container
populated (so mutations find maps, lists and nested structs to work on, not only empty ones).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from proxy import catalog, idl
from proxy.catalog import Kind
from tests.fuzz import thrift
from tests.rig import calls
from tests.rig.sample import Sample


@dataclass(frozen=True)
class Seed:
    method: str
    kind: Kind
    body: bytes  # the argument struct, as sent after the message header
    source: str  # "rig": tests/rig/calls.py, encoded by thriftpy2; "generated": populated


@functools.cache
def seeds(generated_per_method: int = 2) -> tuple[Seed, ...]:
    """Every declared catalog method's real request (both flavours: objects that exist and
    not), then ``generated_per_method`` populated ones each."""
    sample = Sample()
    out: list[Seed] = []
    rng = random.Random(20240601)
    declared = idl.method_names()
    for spec in sorted(catalog.all_methods(), key=lambda s: s.name):
        if spec.name not in declared:
            continue
        cls = idl.args_class(spec.name)
        for missing in (False, True):
            try:
                args = calls.build(cls, spec.name, missing, sample)
                body = idl.encode(args)
            except Exception:  # calls.build does not cover a few struct-valued names
                continue
            out.append(Seed(spec.name, spec.kind, body, "rig"))
        for _ in range(generated_per_method):
            value = thrift.generate(cls, rng)
            out.append(Seed(spec.name, spec.kind, thrift.encode(value), "generated"))
    unique: dict[tuple[str, bytes], Seed] = {}
    for seed in out:
        unique.setdefault((seed.method, seed.body), seed)
    return tuple(unique.values())


def read_seeds() -> tuple[Seed, ...]:
    """Seeds of methods the proxy never treats as writes (for a live run against an HMS)."""
    return tuple(s for s in seeds() if s.kind in (Kind.CACHEABLE_READ, Kind.READ))
