# Stub of the C extension proxy/cache/_assemble.c, so that mypy --strict checks its callers;
# scripts/check.sh runs mypy.stubtest to hold this file to the compiled module.
import weakref

from proxy.cache.assembled import Answer
from proxy.cache.entry import Entry
from proxy.cache.l1 import Item

def configure(item_type: type[Item], entry_type: type[Entry], absent_flag: int, /) -> None: ...
def answer(
    found: dict[bytes, weakref.ref[Item]],
    names: list[bytes],
    mark: int,
    # Exactly floats (the C code checks): mypy would let an int through, which raises here.
    now: float,
    wall: float,
    head: bytes,
    before: bytes,
    closing: bytes,
    largest: int,
    /,
) -> Answer | list[int] | None:
    """The twin of proxy.cache.assembled.py_answer."""
