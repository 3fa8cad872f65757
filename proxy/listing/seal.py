"""When a partition's directory may be cached: the sealed rule (pure).

A partition is **sealed** (its files no longer change) when

* its parameters carry the configured marker (``--seal-marker key=value``), or
* it has not been altered for ``--seal-after`` seconds (from ``transient_lastDdlTime``, which
  the HMS sets on every change) and, if ``--seal-marker-file`` names one (``_SUCCESS``), that
  file is in its directory.

Everything else is **open**: listed live on every call, never cached. Unpartitioned tables are
always open: nothing marks the end of their writes. So is every partition of a transactional
table (:func:`transactional`), whatever its marker or age: Hive's ACID and insert-only writes
add ``delta_``/``base_`` directories to a partition without altering it in the metastore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DDL_TIME = "transient_lastDdlTime"
TRANSACTIONAL = "transactional"
TRANSACTIONAL_PROPERTIES = "transactional_properties"


def transactional(table_parameters: Mapping[str, str] | None) -> bool:
    """Whether a table's parameters make it transactional, as Hive reads them: full ACID or
    insert-only (``transactional=true``; Hive's insert-only test looks at
    ``transactional_properties=insert_only`` alone). Keys and values in any case; when in
    doubt (spaces around ``true``), transactional: a live listing is never wrong."""
    for key, value in (table_parameters or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        name, text = key.strip().lower(), value.strip().lower()
        if (name, text) in ((TRANSACTIONAL, "true"), (TRANSACTIONAL_PROPERTIES, "insert_only")):
            return True
    return False


@dataclass(frozen=True, slots=True)
class SealRule:
    seal_after: float = 3600.0
    marker: tuple[str, str] | None = None  # (parameter, value)
    marker_file: str | None = None

    def sealed(
        self, parameters: Mapping[str, str] | None, now: float, names: set[str] | None
    ) -> bool:
        """``names``: every file name in the directory (hidden ones too), or ``None`` if not
        listed yet (then a required marker file counts as missing)."""
        params = parameters or {}
        if self.marker is not None and params.get(self.marker[0]) == self.marker[1]:
            return True
        try:
            changed = float(params[DDL_TIME])
        except (KeyError, ValueError):
            return False  # no change time: cannot tell, so open
        if now - changed < self.seal_after:
            return False
        if self.marker_file is not None:
            return names is not None and self.marker_file in names
        return True

    @property
    def needs_listing(self) -> bool:
        """Whether the decision can depend on the directory's contents."""
        return self.marker_file is not None


def parse_marker(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected PARAMETER=VALUE, got {text!r}")
    return key.strip(), value.strip()
