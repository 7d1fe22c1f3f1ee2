"""contrib/: the Prometheus rules, their unit tests, the example scrape configuration and the
Grafana dashboard, checked with the real promtool.

- The rules file passes ``promtool check rules`` and its unit tests (``contrib/prometheus/tests``)
  pass ``promtool test rules``.
- Those unit tests can fail: each alert made to never fire, or to fire on every series it reads,
  and each recording rule made to record nothing, must make them fail.
- Every alert has a severity, a summary and a description.
- ``contrib/prometheus/prometheus.yml`` passes ``promtool check config``.
- Every expression of the dashboard (its variables replaced by values Grafana could give them)
  parses as PromQL: they are written as recording rules into a file ``promtool check rules``
  reads.
- Every ddmd metric the rules and the dashboard read is one ddmd exports (``FAMILIES``), and
  ``rate()``/``increase()`` only read counters.
- ``contrib/README.md`` names every alert and recording rule, and its links resolve.

Without promtool (Debian package ``prometheus``) these tests are skipped, except under
``CI=true`` where they fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddmd.control.metrics import FAMILIES
from tests.actors.needs import skip_or_fail

CONTRIB = Path(__file__).resolve().parents[2] / "contrib"
RULES = CONTRIB / "prometheus" / "ddmd-rules.yml"
RULE_TESTS = sorted((CONTRIB / "prometheus" / "tests").glob("*.yml"))
CONFIG = CONTRIB / "prometheus" / "prometheus.yml"
DASHBOARD = CONTRIB / "grafana" / "ddmd-lab.json"

PROMTOOL_CAP = 120  # seconds for one promtool run, on a slow machine
SEVERITIES = {"critical", "warning", "info"}
# What Grafana puts in place of its own variables; the dashboard's variables are regexes.
GRAFANA_VALUES = {"__rate_interval": "1m", "__range": "6h", "__interval": "30s"}
DASHBOARD_VARIABLES = {"host", "device", "app"}
ALSO_ALLOWED = {"up"}  # written by Prometheus itself for every target


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        skip_or_fail("'promtool' is not on PATH (install Debian's prometheus package)")
        raise AssertionError  # skip_or_fail raised
    return path


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=PROMTOOL_CAP, check=False
    )


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


# The rules file, read line by line: enough for the shape ddmd-rules.yml has (one rule per
# "- alert:"/"- record:" item, an expr on one line or folded with ">-"). Anything else is refused
# loudly, and the count is checked against promtool's own.

_RULE_START = re.compile(r"^\s*- (alert|record): (\S+)\s*$")
_GROUP_START = re.compile(r"^\s*- name: ")
_FOLDED = (">-", ">", "|", "|-")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _value(lines: list[str], i: int, key: str) -> tuple[str, int] | None:
    """The value of ``key:`` on line ``i`` (a folded block joined into one line), and the index
    of the line after it; None when line ``i`` is not ``key:``."""
    match = re.match(rf"^(\s*){key}: ?(.*)$", lines[i])
    if match is None:
        return None
    value = match.group(2).strip()
    if value not in _FOLDED:
        return value.removeprefix('"').removesuffix('"'), i + 1
    end = i + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > len(match[1])):
        end += 1
    return " ".join(line.strip() for line in lines[i + 1 : end] if line.strip()), end


@dataclass(frozen=True)
class Rule:
    kind: str  # "alert" or "record"
    name: str
    expr: str
    expr_lines: tuple[int, int]  # where the expr is in the file: [start, end)
    lines: tuple[str, ...]

    def field(self, key: str) -> str | None:
        lines = list(self.lines)
        for i in range(len(lines)):
            found = _value(lines, i, key)
            if found is not None:
                return found[0]
        return None


def read_rules(text: str) -> list[Rule]:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _RULE_START.match(line)]
    rules = []
    for start in starts:
        end = next(
            (
                j
                for j in range(start + 1, len(lines))
                if _RULE_START.match(lines[j]) or _GROUP_START.match(lines[j])
            ),
            len(lines),
        )
        head = _RULE_START.match(lines[start])
        assert head is not None
        exprs = [(j, _value(lines, j, "expr")) for j in range(start, end)]
        found = [(j, v) for j, v in exprs if v is not None]
        assert len(found) == 1, f"rule {head.group(2)}: expected one expr"
        j, (expr, after) = found[0]
        rules.append(Rule(head.group(1), head.group(2), expr, (j, after), tuple(lines[start:end])))
    return rules


RULES_READ = read_rules(RULES.read_text())
ALERTS = [r for r in RULES_READ if r.kind == "alert"]
RECORDS = [r for r in RULES_READ if r.kind == "record"]


def with_expr(rule: Rule, expr: str) -> str:
    """The rules file with ``rule``'s expr replaced (written on one line)."""
    lines = RULES.read_text().splitlines()
    start, end = rule.expr_lines
    indent = lines[start][: _indent(lines[start])]
    lines[start:end] = [f"{indent}expr: {expr}"]
    return "\n".join(lines) + "\n"


def test_rules_reader() -> None:
    text = """groups:
  - name: g
    rules:
      - record: a:b:c
        expr: sum(x)
      - alert: Folded
        expr: >-
          a
          > 1
        labels:
          severity: warning
        annotations:
          summary: "short"
          description: >-
            one
            two
  - name: h
    rules:
      - alert: Last
        expr: up == 0
"""
    rules = read_rules(text)
    assert [(r.kind, r.name, r.expr) for r in rules] == [
        ("record", "a:b:c", "sum(x)"),
        ("alert", "Folded", "a > 1"),
        ("alert", "Last", "up == 0"),
    ]
    assert rules[1].expr_lines == (6, 9)
    assert rules[1].field("severity") == "warning"
    assert rules[1].field("summary") == "short"
    assert rules[1].field("description") == "one two"
    assert rules[2].field("severity") is None


# PromQL names

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME_REGEX = re.compile(r'__name__\s*=~?\s*"([^"]*)"')
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?=\s*(\(?))")
_COUNTER_READ = re.compile(r"\b(?:rate|irate|increase)\s*\(\s*(ddmd_[a-z0-9_]+)")


def metric_names(expr: str) -> tuple[set[str], set[str]]:
    """(ddmd metric names, recording rule names) that ``expr`` reads."""
    names = {n for m in _NAME_REGEX.finditer(expr) for n in m.group(1).split("|")}
    recorded: set[str] = set()
    for match in _IDENT.finditer(_STRING.sub('""', expr)):
        word, call = match.group(0), match.group(1)
        if call:
            continue  # a function, or an aggregation's "by (...)"... never a metric
        if ":" in word:
            recorded.add(word)
        elif word.startswith("ddmd_"):
            names.add(word)
    return names, recorded


def unknown_names(expr: str, records: set[str]) -> list[str]:
    names, recorded = metric_names(expr)
    problems = [f"{n} (ddmd exports no such metric)" for n in names - set(FAMILIES) - ALSO_ALLOWED]
    problems += [f"{n} (no such recording rule)" for n in recorded - records]
    problems += [
        f"{n} is read with rate()/increase() but is a {FAMILIES[n]}"
        for n in _COUNTER_READ.findall(expr)
        if n in FAMILIES and FAMILIES[n] != "counter"
    ]
    return problems


def test_metric_names_reader() -> None:
    names, recorded = metric_names(
        'sum by (host) (increase(ddmd_app_crashes_total{app=~"ddmd_not_a_name"}[5m]))'
        " / on(host) a:ddmd_vms:sum + count(ddmd_vm_info)"
        ' + count({__name__=~"ddmd_vm_threads|ddmd_vms", host="x"})'
    )
    assert names == {"ddmd_app_crashes_total", "ddmd_vm_info", "ddmd_vm_threads", "ddmd_vms"}
    assert recorded == {"a:ddmd_vms:sum"}
    assert unknown_names("rate(ddmd_vm_threads[5m]) + ddmd_no_such", set()) == [
        "ddmd_no_such (ddmd exports no such metric)",
        "ddmd_vm_threads is read with rate()/increase() but is a gauge",
    ]


# The rules


def test_rules_file_passes_promtool_check(promtool: str) -> None:
    result = run(promtool, "check", "rules", RULES)
    assert result.returncode == 0, output(result)
    # The line reader above saw every rule promtool did.
    assert f"SUCCESS: {len(RULES_READ)} rules found" in output(result)


def test_rule_unit_tests_pass(promtool: str) -> None:
    assert RULE_TESTS, "no unit tests in contrib/prometheus/tests"
    result = run(promtool, "test", "rules", *RULE_TESTS)
    assert result.returncode == 0, output(result)
    assert output(result).count("SUCCESS") == len(RULE_TESTS), output(result)


def mutated_test_run(promtool: str, tmp_path: Path, rules_text: str) -> str:
    """Runs the unit tests against ``rules_text``; their output, which must be a failure."""
    (tmp_path / "tests").mkdir()
    for test in RULE_TESTS:
        shutil.copy(test, tmp_path / "tests" / test.name)
    (tmp_path / RULES.name).write_text(rules_text)
    result = run(promtool, "test", "rules", *sorted((tmp_path / "tests").glob("*.yml")))
    assert result.returncode != 0, "the unit tests passed against a broken rule"
    return output(result)


def fires_on_everything(expr: str) -> str:
    """``expr`` with its comparison made a ``bool`` one (every series it reads fires), or, with
    no comparison, joined with an always-present series."""
    outside = re.sub(r"\{[^}]*\}", lambda m: " " * len(m.group(0)), expr)
    match = re.search(r"(==|!=|>=|<=|>|<)", outside)
    if match is None:
        return f"({expr}) or vector(1)"
    return f"{expr[: match.end()]} bool{expr[match.end() :]}"


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r.name)
def test_each_alert_is_tested_firing(promtool: str, tmp_path: Path, rule: Rule) -> None:
    failed = mutated_test_run(promtool, tmp_path, with_expr(rule, "absent(vector(1))"))
    assert f"alertname: {rule.name}" in failed


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r.name)
def test_each_alert_is_tested_quiet(promtool: str, tmp_path: Path, rule: Rule) -> None:
    failed = mutated_test_run(promtool, tmp_path, with_expr(rule, fires_on_everything(rule.expr)))
    assert f"alertname: {rule.name}" in failed


@pytest.mark.parametrize("rule", RECORDS, ids=lambda r: r.name)
def test_each_recording_rule_is_tested(promtool: str, tmp_path: Path, rule: Rule) -> None:
    failed = mutated_test_run(promtool, tmp_path, with_expr(rule, "absent(vector(1))"))
    assert rule.name in failed


def test_fires_on_everything() -> None:
    assert fires_on_everything('up{job!="x"} == 0') == 'up{job!="x"} == bool 0'
    assert fires_on_everything("a:b:c >= 3") == "a:b:c >= bool 3"
    assert fires_on_everything('absent(up{job="ddmd"})') == '(absent(up{job="ddmd"})) or vector(1)'


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r.name)
def test_each_alert_says_what_happened(rule: Rule) -> None:
    assert rule.field("severity") in SEVERITIES
    summary, description = rule.field("summary"), rule.field("description")
    assert summary, "no summary"
    assert description, "no description"
    assert len(description) > len(summary)


def test_rules_read_only_what_ddmd_exports() -> None:
    records = {r.name for r in RECORDS}
    problems = [f"{r.name}: {p}" for r in RULES_READ for p in unknown_names(r.expr, records)]
    assert problems == []


def test_example_scrape_config_passes_promtool_check(promtool: str) -> None:
    result = run(promtool, "check", "config", CONFIG)
    assert result.returncode == 0, output(result)
    # It loads the rules file (promtool checks that too).
    assert "SUCCESS: 1 rule files found" in output(result)
    text = CONFIG.read_text()
    assert "job_name: ddmd" in text
    assert "honor_labels: true" in text


# The dashboard

DASH: dict[str, Any] = json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every variable's series selector."""
    exprs = [
        (f"panel {p['title']!r} target {t['refId']}", t["expr"])
        for p in all_panels(DASH["panels"])
        for t in p.get("targets", [])
    ]
    for variable in DASH["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
        assert match is not None, f"variable {variable['name']}: {query}"
        exprs.append((f"variable {variable['name']}", match.group(1)))
    return exprs


def substitute(expr: str) -> str:
    """``expr`` with Grafana's variables replaced as Grafana would (the dashboard's own are
    multi-value regexes: "All" is ``.*``)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in DASHBOARD_VARIABLES:
            return ".*"
        assert name in GRAFANA_VALUES, f"unknown variable ${name} in {expr}"
        return GRAFANA_VALUES[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


def test_dashboard_is_a_grafana_dashboard() -> None:
    assert DASH["schemaVersion"] >= 36
    assert DASH["uid"]
    assert DASH["title"]
    variables = {v["name"]: v for v in DASH["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert set(variables) >= DASHBOARD_VARIABLES
    for name in DASHBOARD_VARIABLES:
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["allValue"] == ".*"


def test_dashboard_panels_fit_the_grid() -> None:
    ids = [p["id"] for p in all_panels(DASH["panels"])]
    assert len(ids) == len(set(ids)), "two panels share an id"
    taken: set[tuple[int, int]] = set()
    for panel in all_panels(DASH["panels"]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_dashboard_panels_read_prometheus_through_the_variable() -> None:
    for panel in all_panels(DASH["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, f"panel {panel['title']!r} has no query"
        assert len(refs) == len(set(refs)), panel["title"]


def test_dashboard_has_the_lab_panels() -> None:
    exprs = " ".join(e for _, e in dashboard_exprs())
    for name in (
        'up{job="ddmd"',
        "ddmd_vm_heap_size_bytes",
        "ddmd_vm_heap_allocated_bytes",
        "ddmd_app_crashes_total",
        "ddmd_debuggers_attached",
        "ddmd_vm_suspended_seconds",
        "ddmd_logcat_stream_reconnects_total",
        "ddmd_logcat_lines_dropped_total",
    ):
        assert name in exprs


def test_dashboard_exprs_parse_as_promql(promtool: str, tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}:check", "expr": substitute(expr)}
                    for i, (_, expr) in enumerate(exprs)
                ],
            }
        ]
    }
    # JSON is YAML: promtool reads this file as it reads any rules file.
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules, indent=2))
    result = run(promtool, "check", "rules", path)
    where = "\n".join(f"dashboard:expr_{i}:check = {w}" for i, (w, _) in enumerate(exprs))
    assert result.returncode == 0, f"{output(result)}\n{where}"
    assert f"SUCCESS: {len(exprs)} rules found" in output(result)


def test_dashboard_reads_only_what_ddmd_exports() -> None:
    problems = [f"{where}: {p}" for where, e in dashboard_exprs() for p in unknown_names(e, set())]
    assert problems == []


# contrib/README.md

README = CONTRIB / "README.md"


def test_readme_links_resolve() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    missing = [link for link in links if not (README.parent / link).exists()]
    assert missing == []


def test_readme_lists_every_alert_and_recording_rule() -> None:
    text = README.read_text()
    missing = [r.name for r in RULES_READ if f"`{r.name}`" not in text]
    assert missing == []
