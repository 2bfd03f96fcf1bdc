"""deploy/grafana: the committed dashboard is the generator's current output, importable
(ids, layout, data source variable), selects by the dashboard variables everywhere, and has the
panels platform teams look for. test_prometheus_e2e.py runs every query against live data."""
import importlib.util
import re

from deploy_assets import DASHBOARD, DASHBOARD_GENERATOR, dashboard, dashboard_targets

SELECTOR = 'namespace=~"$namespace", job=~"$job", pod=~"$pod"'


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_dashboard", DASHBOARD_GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def panels():
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_committed_json_is_current():
    assert DASHBOARD.read_text() == load_generator().render(), (
        "deploy/grafana/attnserve.json is stale: run python3 deploy/grafana/generate_dashboard.py")


def test_layout_ids_and_grid():
    all_panels = dashboard()["panels"]
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    occupied = set()
    for p in all_panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"{p['title']} overlaps another panel"
        occupied |= cells


def test_every_query_uses_the_data_source_variable_and_selectors():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job", "pod"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["description"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            # Every series selector carries the variables; no bare metric name sneaks in.
            selectors = re.findall(r"\battnserve_[a-z_]+(\{[^}]*\}|)", t["expr"])
            assert selectors, t["expr"]
            for selector in selectors:
                assert SELECTOR in selector, f"{p['title']}: {t['expr']}"


def test_panels_platform_teams_expect():
    queries = " ".join(expr for _, expr in dashboard_targets())
    wanted = {
        "request rate by rpc and code": r"sum by \(rpc, code\) \(rate\(attnserve_requests_total",
        "latency p50": r"histogram_quantile\(0\.5, sum by \(rpc, le\) \(rate\(attnserve_request_duration_seconds_bucket",
        "latency p90": r"histogram_quantile\(0\.9, sum by \(rpc, le\) \(rate\(attnserve_request_duration_seconds_bucket",
        "latency p99": r"histogram_quantile\(0\.99, sum by \(rpc, le\) \(rate\(attnserve_request_duration_seconds_bucket",
        "queue time": r"rate\(attnserve_queue_duration_seconds_bucket",
        "batch size": r"rate\(attnserve_batch_requests_bucket",
        "kernel family mix": r"sum by \(kernel, rpc\) \(rate\(attnserve_compute_duration_seconds_count",
        "tokens/s": r"rate\(attnserve_tokens_total",
        "TFLOP/s": r"rate\(attnserve_flops_total\{[^}]*\}\[\$__rate_interval\]\)\) / 1e12",
        "per-device memory": r"max by \(pod, device\) \(attnserve_device_memory_used_bytes",
        "per-device queue depth": r"max by \(pod, device\) \(attnserve_queue_depth",
        # Issue 21 item 4: requests by protocol and by shared-memory use.
        "OIP inferences by protocol": r"sum by \(protocol\) \(rate\(attnserve_inference_protocol_requests_total",
        "native calls over gRPC and the data channel":
            r'rpc=~"Forward\|Backward"\}\[\$__rate_interval\]\)\) - \(sum by \(rpc\) \(rate\(attnserve_data_requests_total',
        "OIP by shared-memory use": r"sum by \(protocol, shared_memory\) \(rate\(attnserve_inference_protocol_requests_total",
        "OIP non-OK share by code": r"sum by \(protocol, code\) \(rate\(attnserve_inference_protocol_requests_total",
        "shared-memory bytes": r"sum by \(kind, direction\) \(rate\(attnserve_shared_memory_bytes_total",
        # Issue 24 item 5: the data path and saved contexts.
        "bytes by path": r"rate\(attnserve_data_received_bytes_total",
        "data channel chunks": r"sum by \(direction\) \(rate\(attnserve_data_chunks_total",
        "transfer time": r"rate\(attnserve_data_transfer_seconds_sum",
        "overlap": r"rate\(attnserve_data_overlap_seconds_sum",
        "contexts held": r"attnserve_contexts\{",
        "context bytes held": r"attnserve_context_bytes\{",
        "context hits and misses": r"sum by \(result\) \(rate\(attnserve_context_lookups_total",
        "context evictions": r"sum by \(reason\) \(rate\(attnserve_context_evictions_total",
        # Admission rejections, reason="compute" among them.
        "rejections by reason": r"sum by \(reason\) \(rate\(attnserve_rejections_total",
    }
    for what, pattern in wanted.items():
        assert re.search(pattern, queries), what
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in panels()}
    assert units["Request latency by method"] == "s"
    assert units["Device memory used"] == "bytes"
