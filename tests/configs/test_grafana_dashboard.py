"""configs/grafana-dashboard.json and docs/pages/reference/metrics.md against the daemon's own
`/metrics`: every metric a panel queries is one the running daemon exports, and every metric
family it exports is on the reference page, so neither can drift from actors/app/metrics.py.

One daemon serves both checks: it reads a source mosquitto, forwards to a second one, takes the
readers' management topics and runs a maintenance pass every second, so that the families that
appear only with forwarding, with readers or after a pass are all in its exposition. The two
families that only failed table writes bring out come from the collector fed the daemon's own
snapshot plus that fault, and the reference page is held to every family actors/app/metrics.py
builds as well. No Spark JVM: the default landing writes the Delta tables with delta-rs.
"""

from __future__ import annotations

import ast
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import actors.app.metrics as metrics_module
from actors.app.metrics import HealthThresholds, StatusBoard, build_registry
from actors.clock import SimulatedClock
from actors.devtools.broker_kinds import BROKERS
from actors.devtools.broker_process import free_port
from actors.devtools.simulate import simulate
from tests.harness.checks import wait_until
from tests.harness.daemon import DaemonProcess, gateway_env

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "configs" / "grafana-dashboard.json"
REFERENCE = ROOT / "docs" / "pages" / "reference" / "metrics.md"

READERS = 2
PER_READER = 30

# -- PromQL: the metric names an expression selects ----------------------------------------------

# Words of PromQL that are not metric names when they stand alone (functions and aggregations are
# told by the '(' after them).
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?\w+|@\s*(?:start\(\)|end\(\)|[\d.]+)")
_NUMBER = re.compile(
    r"(?<![\w:])(?:0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w:])", re.ASCII
)
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: whatever identifier is left once strings,
    Grafana variables, label matchers, range and subquery brackets, label lists, offsets and
    numbers are gone, unless a '(' follows it (a function) or it is a keyword."""
    text = _STRING.sub(" ", expr)
    text = _GRAFANA_VARIABLE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if word.lower() in KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue
        names.add(word)
    return names


_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_]\w*\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


def variable_names(query: str) -> set[str]:
    """The metric names of a Grafana Prometheus variable query: label_values(selector, label),
    label_values(label) (none), metrics(regex) (none), query_result(expr)."""
    if found := _LABEL_VALUES.match(query):
        return metric_names(found.group(1))
    if found := _QUERY_RESULT.match(query):
        return metric_names(found.group(1))
    return set()


def exposed_names(exposition: str) -> dict[str, str]:
    """Each name PromQL can select in an exposition, with its family's name, from the `# TYPE`
    lines (a family is described there even when it has no sample yet): a counter's `_total`, a
    histogram's `_bucket`, `_sum` and `_count`, a summary's own name, `_sum` and `_count`."""
    names = {}
    for line in exposition.splitlines():
        found = re.match(r"# TYPE (\S+) (\S+)$", line)
        if found is None:
            continue
        name, kind = found.groups()
        if kind == "counter":
            family = name.removesuffix("_total")
            names[f"{family}_total"] = family
        elif kind == "histogram":
            names.update({f"{name}{suffix}": name for suffix in ("_bucket", "_sum", "_count")})
        elif kind == "summary":
            names.update({f"{name}{suffix}": name for suffix in ("", "_sum", "_count")})
        else:
            names[name] = name
    return names


# -- the dashboard's shape -----------------------------------------------------------------------


def all_panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, those folded into a collapsed row too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict) -> Iterator[tuple[str, set[str]]]:
    """(where, metric names) for every panel target and every query variable."""
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", metric_names(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            yield f"variable {variable['name']!r}", variable_names(text)


def uses_the_datasource_variable(reference) -> bool:
    """A panel or target datasource that names the dashboard's Prometheus variable."""
    if isinstance(reference, dict):
        return reference.get("type") == "prometheus" and reference.get("uid") == "${datasource}"
    return reference == "${datasource}"


def shape_problems(dashboard: dict) -> list[str]:
    problems = []
    if dashboard.get("title") != "fxgate" or not dashboard.get("uid"):
        problems.append("title must be 'fxgate' and uid set")
    if not 36 <= dashboard.get("schemaVersion", 0) <= 41:
        problems.append(f"schemaVersion {dashboard.get('schemaVersion')} is not Grafana 10/11's")
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    source = variables.get("datasource", {})
    if (source.get("type"), source.get("query")) != ("datasource", "prometheus"):
        problems.append("no 'datasource' variable of type datasource for prometheus")
    ids = [panel.get("id") for panel in all_panels(dashboard)]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append(f"panel ids not unique: {sorted(i for i in ids if ids.count(i) > 1)}")
    for panel in all_panels(dashboard):
        where = f"panel {panel.get('id')} {panel.get('title')!r}"
        grid = panel.get("gridPos", {})
        if not {"h", "w", "x", "y"} <= grid.keys() or grid["x"] + grid["w"] > 24:
            problems.append(f"{where}: gridPos {grid}")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{where}: no targets")
        if not uses_the_datasource_variable(panel.get("datasource")):
            problems.append(f"{where}: datasource is not ${{datasource}}")
        for target in targets:
            if not target.get("expr") or not uses_the_datasource_variable(target.get("datasource")):
                problems.append(f"{where}: target {target.get('refId')} without expr/datasource")
        refs = [t.get("refId") for t in targets]
        if len(refs) != len(set(refs)):
            problems.append(f"{where}: refIds not unique: {refs}")
    return problems


# -- the daemon ----------------------------------------------------------------------------------


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def samples(text: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[s.name + "".join(f"[{v}]" for v in s.labels.values())] = s.value
    return values


@pytest.fixture(scope="module")
def exposition(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """The /metrics text of a daemon that has forwarded, landed and compacted reads of two
    readers with heartbeats and GPI events, and the daemon's working directory; the daemon and
    both brokers are ended afterwards."""
    source = BROKERS["mosquitto"](tmp_path_factory.mktemp("source"))
    upstream = BROKERS["mosquitto"](tmp_path_factory.mktemp("upstream"))
    workdir = tmp_path_factory.mktemp("gateway")
    port = free_port()
    env = {
        **gateway_env(source, workdir / "data"),
        "FXGATE__GATEWAY__METRICS_PORT": str(port),
        "FXGATE__SOURCE__MANAGEMENT_TOPICS": '["zebra/fx/+/mgmt"]',
        "FXGATE__UPSTREAM__HOST": upstream.host,
        "FXGATE__UPSTREAM__PORT": str(upstream.port),
        "FXGATE__ROUTES__0__SOURCE": "zebra/fx/+/reads",
        "FXGATE__ROUTES__0__TARGET": "cloud/{reader}",
        "FXGATE__ROUTES__0__QOS": "1",
        "FXGATE__COMPACTION__START_DELAY_SECONDS": "0.5",
        "FXGATE__COMPACTION__INTERVAL_SECONDS": "1",
    }
    daemon = DaemonProcess(workdir, env)
    try:
        source.start()
        upstream.start()
        daemon.start()
        daemon.wait_for_log(r"source: subscribed to zebra/fx/\+/mgmt", timeout=60)
        sent = simulate(
            source.host,
            source.port,
            readers=READERS,
            rate=0,
            count=PER_READER,
            qos=1,
            heartbeat_every=10,
            gpi_every=7,
        )
        assert sent.failed == 0
        base = f"http://127.0.0.1:{port}/metrics"
        reads = READERS * PER_READER
        scraped = [""]

        def complete() -> bool:
            # The scrape that shows everything is the one kept: a pass put off by a waiting
            # batch takes the last pass's duration away again until the next pass.
            scraped[0] = get(base)
            now = samples(scraped[0])
            return (
                now.get("fxgate_landed_rows_total", 0) >= reads
                and now.get("fxgate_messages_forwarded_total", 0) >= reads
                and "fxgate_compaction_last_pass_seconds" in now
                and any(key.startswith("fxgate_reader_heartbeats_total[") for key in now)
            )

        assert wait_until(complete, 60), f"{scraped[0]}\n{daemon.output()[-4000:]}"
        yield scraped[0], workdir
        assert daemon.terminate() == 0, daemon.output()[-4000:]
    finally:
        daemon.reap()
        upstream.kill()
        source.kill()


# Families the collector yields only once something has gone wrong: no healthy run exports
# them, so they are taken from the collector itself, fed the running daemon's figures plus that
# fault (three failed Spark batch attempts in a row).
AFTER_A_FAULT = {"fxgate_spark_consecutive_failures", "fxgate_spark_failed_attempts"}


def fault_exposition(snapshot: dict) -> str:
    board = StatusBoard(SimulatedClock(start_monotonic=0.0), HealthThresholds())
    board.publish({**snapshot, "spark": {"failures": 3, "total_failures": 3}})
    return generate_latest(build_registry(board)).decode()


def families_in_source() -> set[str]:
    """Each metric family actors/app/metrics.py builds, as PromQL names it (a counter with
    `_total`), read from the names its families are made with: those that only a fault brings
    out are in it too."""
    counters = {"_counter", "CounterMetricFamily"}
    gauges = {"_gauge", "GaugeMetricFamily"}
    found = set()
    for node in ast.walk(ast.parse(Path(metrics_module.__file__).read_text())):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        callee = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        name = node.args[0]
        if callee in counters | gauges and isinstance(name, ast.Constant):
            found.add(f"{name.value}_total" if callee in counters else name.value)
    return found


def status_snapshot(workdir: Path) -> dict:
    """The daemon's last status snapshot, as it wrote it to its data directory."""
    return json.loads((workdir / "data" / "status.json").read_text())


def load_dashboard(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def unknown_metrics(dashboard: dict, exported: set[str]) -> list[str]:
    return [
        f"{where}: {name}"
        for where, names in expressions(dashboard)
        for name in sorted(names)
        if name not in exported
    ]


# -- tests ---------------------------------------------------------------------------------------


def test_the_metric_names_of_an_expression_are_found_and_nothing_else():
    cases = {
        'rate(fxgate_landed_rows_total{job=~"$job", instance=~"$instance"}[$__rate_interval])': {
            "fxgate_landed_rows_total"
        },
        "sum by (reader, job) (increase(a_total[1h] offset 1d)) / on (instance) group_left b": {
            "a_total",
            "b",
        },
        "histogram_quantile(0.99, sum without (pod) (rate(latency_seconds_bucket[5m]))) > 1e3": {
            "latency_seconds_bucket"
        },
        'label_replace(up, "reason", "$1", "instance", "(.*):.*") and on() vector(1)': {"up"},
        "max_over_time(fxgate_x[10m:1m]) unless fxgate_y @ end() or fxgate_z offset -5m": {
            "fxgate_x",
            "fxgate_y",
            "fxgate_z",
        },
        'fxgate_reader_reported_data_messages{counter=~"dropped|retained"} * 2': {
            "fxgate_reader_reported_data_messages"
        },
    }
    for expr, names in cases.items():
        assert metric_names(expr) == names, expr
    assert variable_names('label_values(fxgate_healthy{job=~"$job"}, instance)') == {
        "fxgate_healthy"
    }
    assert variable_names("label_values(job)") == set()
    assert variable_names("query_result(topk(3, fxgate_sink_lag_seconds))") == {
        "fxgate_sink_lag_seconds"
    }


def test_the_exposition_names_a_counter_with_total_and_a_histogram_by_its_series():
    text = (
        "# TYPE a_total counter\n# TYPE b gauge\n# TYPE c histogram\n# TYPE d summary\n"
        "# TYPE e untyped\n"
    )
    assert set(exposed_names(text)) == {
        "a_total",
        "b",
        "c_bucket",
        "c_sum",
        "c_count",
        "d",
        "d_sum",
        "d_count",
        "e",
    }


def test_the_dashboard_is_an_importable_grafana_dashboard_with_unique_panel_ids():
    dashboard = load_dashboard()
    assert shape_problems(dashboard) == []
    # The same checks find what Grafana would refuse or show empty.
    broken = load_dashboard()
    panels = [p for p in all_panels(broken) if p["type"] != "row"]
    panels[1]["id"] = panels[0]["id"]
    panels[2]["targets"] = []
    panels[3]["datasource"] = {"type": "prometheus", "uid": "some-uid"}
    broken["schemaVersion"] = 16
    problems = shape_problems(broken)
    assert len(problems) == 4, problems
    assert problems[0].startswith("schemaVersion 16")
    assert problems[1] == f"panel ids not unique: [{panels[0]['id']}, {panels[0]['id']}]"
    assert problems[2].endswith("no targets")
    assert problems[3].endswith("datasource is not ${datasource}")


def test_the_dashboard_has_a_row_for_each_part_of_the_gateway_an_operator_watches():
    rows = [p["title"] for p in load_dashboard()["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Intake and landing",
        "Ledger backlog per sink",
        "Disk budget",
        "Connections",
        "Forwarding upstream",
        "Dead letters",
        "Reader health and reconciliation",
        "Compaction and write faults",
    ]


@pytest.mark.broker
def test_every_metric_the_dashboard_queries_is_exported_by_the_running_daemon(exposition):
    text, workdir = exposition
    exported = set(exposed_names(text))
    after_fault = exposed_names(fault_exposition(status_snapshot(workdir)))
    exported |= {name for name, family in after_fault.items() if family in AFTER_A_FAULT}
    dashboard = load_dashboard()
    assert unknown_metrics(dashboard, exported) == []
    used = {name for _, names in expressions(dashboard) for name in names}
    assert len(used) >= 40, sorted(used)  # the parse found the queries, not nothing
    # A name the daemon does not export is caught, in a target and in a variable alike.
    dashboard["panels"][1]["targets"][0]["expr"] = 'rate(fxgate_no_such_total{job="x"}[5m])'
    dashboard["templating"]["list"][1]["query"] = "label_values(fxgate_nothing, job)"
    assert unknown_metrics(dashboard, exported) == [
        f"panel {dashboard['panels'][1]['title']!r} A: fxgate_no_such_total",
        "variable 'job': fxgate_nothing",
    ]


@pytest.mark.broker
def test_every_metric_family_the_daemon_exports_is_on_the_reference_page(exposition):
    text, _ = exposition
    families = set(exposed_names(text)) | families_in_source()
    assert {"fxgate_healthy", "fxgate_spark_failed_attempts_total"} <= families
    page = REFERENCE.read_text()
    documented = set(re.findall(r"\bfxgate_[a-z0-9_]*[a-z0-9]\b", page))
    assert sorted(families - documented) == [], "exported, not on docs/pages/reference/metrics.md"
    assert sorted(documented - families) == [], "on the page, not exported by the daemon"
