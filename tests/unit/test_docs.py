"""The README stays true: every option and every metric is documented."""

from __future__ import annotations

from pathlib import Path

from proxy.config import flag_name, option_fields
from proxy.metrics import Metrics

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_option_is_in_the_configuration_reference() -> None:
    for f in option_fields():
        assert f"| `{flag_name(f.name)}` |" in README, f.name


def test_every_metric_is_in_the_metrics_reference() -> None:
    for family in Metrics().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in README, name
