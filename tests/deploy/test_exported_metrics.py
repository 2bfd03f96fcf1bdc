"""Every metric the dashboard, the rules and the prometheus-adapter rules read is exported by a
live server once it has served traffic, and every label they group by exists."""
import re

import numpy as np
import pytest

import attnserve

from deploy_assets import (PENDING_METRICS, PROMETHEUS_OWN, dashboard_targets, metric_names,
                           recorded_names, rules, used_metric_names)
from deploy_traffic import CALL_TIMEOUT_S, _problem, run_rounds

# Labels Prometheus attaches to every scraped series (the chart's ServiceMonitor or the
# kubernetes-pods job add namespace and pod), and the histogram bucket label.
TARGET_LABELS = {"namespace", "job", "pod", "instance", "le"}


@pytest.fixture(scope="module")
def exposition(live_server):
    counts = run_rounds(live_server.target, rounds=2,
                        data_address=("127.0.0.1", live_server.data_port),
                        oip_addresses=(live_server.target, f"127.0.0.1:{live_server.http_port}"))
    # Per round: 5 native calls and 3 OIP inferences answered; 3 native and 2 OIP refused.
    assert counts == {"ok": 16, "rejected": 10, "protocol_errors": 2}
    return live_server.http_get("/metrics").decode()


@pytest.fixture(scope="module")
def exported(exposition):
    """{series name: set of label names} from the text exposition."""
    series = {}
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(2) or ""))
        series.setdefault(match.group(1), set()).update(labels)
    return series


def test_used_metrics_are_exported(exported):
    used = used_metric_names() - set(PENDING_METRICS)
    assert len(used) >= 15
    missing = sorted(used - set(exported))
    assert not missing, f"used by deploy/ but not exported by the server: {missing}"


@pytest.mark.parametrize("name", sorted(PENDING_METRICS))
@pytest.mark.xfail(strict=True, reason="not exported yet; see PENDING_METRICS in deploy_assets.py")
def test_pending_metric_is_exported(exported, name):
    assert name in used_metric_names()
    assert name in exported, f"{name}: {PENDING_METRICS[name]}"


def test_grouping_labels_exist(exported):
    """`by (...)`, `on (...)` and `ignoring (...)` name labels the series carry."""
    exported_labels = set().union(*exported.values()) | TARGET_LABELS
    expressions = [expr for _, expr in dashboard_targets()] + [r["expr"] for r in rules()]
    checked = 0
    for expr in expressions:
        for clause in re.findall(r"\b(?:by|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
            for label in filter(None, (l.strip() for l in clause.split(","))):
                assert label in exported_labels, f"label {label!r} in {expr}"
                checked += 1
    assert checked >= 30


def test_rules_read_only_exported_or_recorded_series():
    """Each rule reads attnserve series, Prometheus' own `up`, or a series recorded here."""
    recorded = {r["record"] for r in rules() if "record" in r}
    for rule in rules():
        reads_recorded = recorded_names(rule["expr"])
        assert reads_recorded <= recorded, f"{rule}: reads unknown {reads_recorded - recorded}"
        reads_own = {n for n in PROMETHEUS_OWN if re.search(rf"\b{n}\{{", rule["expr"])}
        assert metric_names(rule["expr"]) or reads_recorded or reads_own, rule
    for title, expr in dashboard_targets():
        assert metric_names(expr), f"{title}: {expr}"


def test_traffic_moves_each_labelled_series_the_new_panels_split_by(exposition):
    """The protocol, shared-memory and rejection panels show each value the traffic makes."""
    wanted = [
        r'attnserve_inference_protocol_requests_total\{[^}]*protocol="grpc"[^}]*shared_memory="none"',
        r'attnserve_inference_protocol_requests_total\{[^}]*protocol="http"[^}]*shared_memory="none"',
        r'attnserve_inference_protocol_requests_total\{[^}]*protocol="grpc"[^}]*shared_memory="system"',
        r'attnserve_inference_protocol_requests_total\{code="INVALID_ARGUMENT"[^}]*protocol="http"',
        r'attnserve_shared_memory_bytes_total\{direction="in",kind="system"\}',
        r'attnserve_shared_memory_bytes_total\{direction="out",kind="system"\}',
        r'attnserve_rejections_total\{reason="compute"\}',
        r'attnserve_data_requests_total\{code="OK",rpc="Forward"\}',
        r'attnserve_data_requests_total\{code="NOT_FOUND",rpc="Backward"\}',
    ]
    for pattern in wanted:
        values = [float(v) for v in re.findall(r"^" + pattern + r"[^\n]* (\S+)$", exposition,
                                               re.M)]
        assert values and max(values) > 0, f"{pattern} not in\n{exposition}"


def test_data_channel_calls_are_told_from_native_grpc_ones(live_server, exposition):
    """attnserve_data_requests_total counts the data channel's Forwards and Backwards, which
    attnserve_requests_total counts too: the dashboard's native gRPC line is the difference."""
    ok_forward = 'code="OK",rpc="Forward"'

    def counts():
        return (live_server.metric("attnserve_requests_total", ok_forward),
                live_server.metric("attnserve_data_requests_total", ok_forward))

    q, k, v, cu = _problem(np.random.default_rng(1))
    before = counts()
    with attnserve.Client(live_server.target, timeout=CALL_TIMEOUT_S, transport="grpc",
                          shared_memory="off") as c:
        c.forward(q, k, v, cu, cu, causal=True)
    live_server.wait_for_metric("attnserve_requests_total", before[0] + 1, ok_forward)
    assert counts() == (before[0] + 1, before[1])
    with attnserve.Client(live_server.target, timeout=CALL_TIMEOUT_S,
                          shared_memory="off") as client:
        client.forward(q, k, v, cu, cu, causal=True)
        assert client.active_transport() == "data_channel"
    live_server.wait_for_metric("attnserve_data_requests_total", before[1] + 1, ok_forward)
    assert counts() == (before[0] + 2, before[1] + 1)
