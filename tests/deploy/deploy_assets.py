"""Reads what deploy/ ships: dashboard queries, rule expressions, prometheus-adapter queries, and
the metric names they use; and require_tool for the tools scripts/setup.sh installs."""
import json
import pathlib
import re
import shutil
from typing import Dict, List, Set, Tuple

import pytest
import yaml

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = DEPLOY / "docker" / "Dockerfile.dockerignore"
CHART = DEPLOY / "helm" / "attnserve"
RULES = DEPLOY / "prometheus" / "attnserve.rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tests" / "attnserve.rules.test.yml"
ADAPTER_VALUES = DEPLOY / "prometheus" / "prometheus-adapter-values.yaml"
DASHBOARD = DEPLOY / "grafana" / "attnserve.json"
DASHBOARD_GENERATOR = DEPLOY / "grafana" / "generate_dashboard.py"

# Metrics deploy/ uses that the server does not export yet, each with what it should count.
# The tests expect them missing (strict xfail): once the server exports one, those tests fail
# until it is removed from here.
PENDING_METRICS = {}

# A series name, not part of a recording rule's level:metric:operations name.
_METRIC = re.compile(r"(?<![\w:])attnserve_[a-zA-Z0-9_]+(?![\w:])")
_RECORDED = re.compile(r"(?<![\w:])[a-z_]+:[a-z0-9_]+:[a-z0-9_]+(?![\w:])")
# Names the dashboard and rules read that Prometheus itself produces.
PROMETHEUS_OWN = {"up"}


def metric_names(expr: str) -> Set[str]:
    """attnserve_* series names an expression reads (histogram suffixes included)."""
    return set(_METRIC.findall(expr))


def recorded_names(expr: str) -> Set[str]:
    """Recording-rule outputs (level:metric:operations) an expression reads."""
    return set(_RECORDED.findall(expr))


# --- Grafana -------------------------------------------------------------------------------

def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets() -> List[Tuple[str, str]]:
    """(panel title, expr) for every query of every panel."""
    found = []
    for panel in dashboard()["panels"]:
        for t in panel.get("targets", []):
            found.append((panel["title"], t["expr"]))
    return found


def dashboard_variables() -> Dict[str, str]:
    """Query variables: name -> label_values(...) query."""
    return {v["name"]: v["query"] for v in dashboard()["templating"]["list"]
            if v["type"] == "query"}


def substitute(expr: str, values: Dict[str, str]) -> str:
    """Grafana's variable interpolation for $name, ${name} and $__rate_interval."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


# --- Prometheus rules ----------------------------------------------------------------------

def rules() -> List[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recording_rules() -> Dict[str, str]:
    return {r["record"]: r["expr"] for r in rules() if "record" in r}


def alert_rules() -> Dict[str, str]:
    return {r["alert"]: r["expr"] for r in rules() if "alert" in r}


def rule_metric_names() -> Set[str]:
    """Raw attnserve_* series the rules read (recording-rule outputs left out)."""
    names = set()
    for rule in rules():
        names |= metric_names(rule["expr"])
    return names


# --- prometheus-adapter --------------------------------------------------------------------

def adapter_rules() -> List[dict]:
    return yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]


def adapter_metric_names() -> Set[str]:
    """Names the adapter serves to the custom metrics API."""
    return {rule["name"]["as"] for rule in adapter_rules()}


def adapter_query(rule: dict, label_matchers: str, group_by: str) -> str:
    """prometheus-adapter's metricsQuery template, filled in as the adapter fills it."""
    series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0)
    return (rule["metricsQuery"].replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", label_matchers)
            .replace("<<.GroupBy>>", group_by))


def used_metric_names() -> Set[str]:
    """Every attnserve_* series the dashboard, the rules and the adapter read."""
    names = rule_metric_names()
    for _, expr in dashboard_targets():
        names |= metric_names(expr)
    for query in dashboard_variables().values():
        names |= metric_names(query)
    for rule in adapter_rules():
        names |= metric_names(rule["seriesQuery"]) | metric_names(rule["metricsQuery"])
    return names


def require_tool(name: str) -> str:
    """A tool scripts/setup.sh installs: missing means a broken setup, so fail, don't skip."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run scripts/setup.sh")
    return path
