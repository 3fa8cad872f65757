"""The engine configurations docs/engines.md shows, as the rig's engines run them.

The Trino catalogs (tests/rig/trino.py) and the Spark sessions (tests/rig/spark.py) of the tests
are built from the ``properties`` snippets of docs/engines.md, with the snippet's metastore URI
replaced by the test's: a snippet that does not work fails a real-engine test.
tests/unit/test_engine_docs.py holds the list of snippets the rig runs and of those it does not
(with the reason), and fails on a snippet in neither.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
# The URI every snippet names; the rig puts its own in its place.
DOC_URI = "thrift://hms-cache-proxy:9083"


def snippets(section: str) -> list[dict[str, str]]:
    """The ``properties`` blocks under the ``## <section>`` heading, in order, as key/value
    pairs (comments and blank lines dropped)."""
    text = DOC.read_text()
    found = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if found is None:
        raise KeyError(f"no section '## {section}' in {DOC}")
    blocks = re.findall(r"^```properties\n(.*?)^```", found.group(1), re.M | re.S)
    return [_properties(block) for block in blocks]


def _properties(block: str) -> dict[str, str]:
    out = {}
    for line in block.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out


def configured(section: str, uri: str, index: int = 0) -> dict[str, str]:
    """Snippet ``index`` of ``section`` with ``uri`` in place of the documented one."""
    return {k: v.replace(DOC_URI, uri) for k, v in snippets(section)[index].items()}


__all__ = ["DOC_URI", "configured", "snippets"]
