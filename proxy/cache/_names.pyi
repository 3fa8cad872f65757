# Stub of the C extension proxy/cache/_names.c, so that mypy --strict checks its callers;
# scripts/check.sh runs mypy.stubtest to hold this file to the compiled module.
from collections.abc import Callable

def configure(twin: Callable[[bytes], tuple[str, bytes] | None], /) -> None: ...
def name_parts(raw: bytes, /) -> tuple[str, bytes] | None:
    """The twin of proxy.cache.keys.py_name_parts."""
