#!/usr/bin/env python3
"""Writes deploy/grafana/attnserve.json, the attnserve Grafana dashboard.

The dashboard is generated so its ~40 panels stay short to read and review here; the JSON is
committed for import (Grafana > Dashboards > New > Import, or a provisioning folder) and
tests/deploy/test_dashboard.py fails while it is stale. After editing this file:

    python3 deploy/grafana/generate_dashboard.py

Every query selects `namespace`, `job` and `pod` through the dashboard's variables: the chart's
ServiceMonitor (or the annotation-based kubernetes-pods scrape job) attaches them, `job` being
one release, i.e. one GPU class. `$__rate_interval` is Grafana's own rate window.
"""
import json
import pathlib
import sys

OUTPUT = pathlib.Path(__file__).resolve().parent / "attnserve.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", job=~"$job", pod=~"$pod"'
RATE = "$__rate_interval"


def target(expr, legend="", instant=False, table=False):
    t = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
    if instant:
        t.update(instant=True, range=False)
    if table:
        t["format"] = "table"
    return t


def quantiles(metric, by, legend, qs=(0.5, 0.9, 0.99)):
    """histogram_quantile targets of one histogram, one per quantile."""
    group = ", ".join(by + ["le"])
    return [target(f"histogram_quantile({q}, sum by ({group}) "
                   f"(rate({metric}_bucket{{{SEL}}}[{RATE}])))",
                   f"{legend} p{round(q * 100)}") for q in qs]


def mean(metric, by, legend):
    group = f"sum by ({', '.join(by)}) " if by else "sum "
    return target(f"{group}(rate({metric}_sum{{{SEL}}}[{RATE}])) / "
                  f"{group}(rate({metric}_count{{{SEL}}}[{RATE}]))", f"{legend} mean")


def panel(kind, title, description, targets, unit="short", width=12, height=8, **extra):
    for ref_id, t in zip("ABCDEFGH", targets):
        t["refId"] = ref_id
    p = {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
         "targets": targets, "_size": (width, height)}
    p.update(extra)
    return p


def timeseries(title, description, targets, unit="short", stack=None, **extra):
    custom = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
    if stack:
        custom.update(stacking={"mode": stack, "group": "A"}, fillOpacity=60)
    p = panel("timeseries", title, description, targets, unit, **extra)
    p["fieldConfig"]["defaults"]["custom"] = custom
    p["options"] = {"legend": {"displayMode": "table", "placement": "right",
                               "calcs": ["mean", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}}
    return p


def stat(title, description, expr, unit="short", thresholds=None):
    p = panel("stat", title, description, [target(expr, instant=True)], unit, width=4, height=4)
    if thresholds:
        p["fieldConfig"]["defaults"]["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}] + [
                {"color": color, "value": value} for value, color in thresholds]}
    p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area"}
    return p


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


PANELS = [
    row("Overview"),
    stat("Requests/s", "All finished calls per second.",
         f"sum(rate(attnserve_requests_total{{{SEL}}}[{RATE}]))", "reqps"),
    stat("Non-OK calls", "Share of calls not answered OK (client mistakes included).",
         f'(sum(rate(attnserve_requests_total{{{SEL}, code!="OK"}}[{RATE}])) or vector(0))'
         f" / sum(rate(attnserve_requests_total{{{SEL}}}[{RATE}]))",
         "percentunit", thresholds=[(0.01, "orange"), (0.05, "red")]),
    stat("p99 latency", "99th percentile of request latency, all methods.",
         f"histogram_quantile(0.99, sum by (le) "
         f"(rate(attnserve_request_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
         "s", thresholds=[(1, "orange"), (5, "red")]),
    stat("In flight", "Requests accepted and not yet answered, all servers.",
         f"sum(attnserve_inflight_requests{{{SEL}}})"),
    stat("Servers", "Scraped attnserve processes.", f"count(attnserve_build_info{{{SEL}}})"),
    stat("GPUs", "CUDA devices the servers compute on (0: CPU fallback only).",
         f'count(attnserve_device_info{{{SEL}, device=~"cuda:.*"}}) or vector(0)',
         thresholds=None),

    row("Traffic"),
    timeseries("Request rate by method and code", "Finished calls per second.",
               [target(f"sum by (rpc, code) (rate(attnserve_requests_total{{{SEL}}}[{RATE}]))",
                       "{{rpc}} {{code}}")], "reqps"),
    timeseries("Non-OK share by method and code",
               "Each non-OK code's share of a method's calls. INVALID_ARGUMENT and "
               "RESOURCE_EXHAUSTED are client mistakes; INTERNAL or UNAVAILABLE are the server's.",
               [target(f'sum by (rpc, code) (rate(attnserve_requests_total{{{SEL}, code!="OK"}}[{RATE}]))'
                       f" / ignoring (code) group_left "
                       f"sum by (rpc) (rate(attnserve_requests_total{{{SEL}}}[{RATE}]))",
                       "{{rpc}} {{code}}")], "percentunit"),
    timeseries("In-flight requests by pod", "Accepted and not yet answered.",
               [target(f"sum by (pod) (attnserve_inflight_requests{{{SEL}}})", "{{pod}}")]),
    timeseries("Tensor bytes", "Tensor payload received in requests and sent in responses.",
               [target(f"sum(rate(attnserve_received_bytes_total{{{SEL}}}[{RATE}]))", "received"),
                target(f"sum(rate(attnserve_sent_bytes_total{{{SEL}}}[{RATE}]))", "sent")],
               "Bps"),

    timeseries("Admission rejections by reason",
               "Requests refused or dropped before running, per second, from "
               "attnserve_rejections_total: invalid and limit (the request's own fault), "
               "memory, queue_full and compute (its estimated compute time exceeds "
               "--max_request_compute_seconds on every device it could run on), no_kernel, "
               "device_fault, context_not_found (a Backward whose saved context is gone; the "
               "client resends), deadline, cancelled and shutting_down. A climbing compute or "
               "memory rate is requests too big for the release's GPU class.",
               [target(f"sum by (reason) (rate(attnserve_rejections_total{{{SEL}}}[{RATE}]))",
                       "{{reason}}")], "reqps", stack="normal"),

    row("Protocols and shared memory"),
    timeseries("Attention calls by protocol",
               "Forward and backward calls per second by the way they came: the native API "
               "over gRPC or over the data channel, and the Open Inference Protocol's "
               "ModelInfer over gRPC or HTTP. attnserve_requests_total counts the native "
               "calls of both transports under one rpc label; the data channel's own are "
               "attnserve_data_requests_total, and native gRPC the difference.",
               [target(f'sum by (rpc) (rate(attnserve_requests_total{{{SEL}, '
                       f'rpc=~"Forward|Backward"}}[{RATE}])) - (sum by (rpc) (rate('
                       f'attnserve_data_requests_total{{{SEL}}}[{RATE}])) or sum by (rpc) '
                       f'(rate(attnserve_requests_total{{{SEL}, rpc=~"Forward|Backward"}}'
                       f"[{RATE}])) * 0)", "native gRPC {{rpc}}"),
                target(f"sum by (rpc) (rate(attnserve_data_requests_total{{{SEL}}}[{RATE}]))",
                       "data channel {{rpc}}"),
                target(f"sum by (protocol) (rate("
                       f"attnserve_inference_protocol_requests_total{{{SEL}}}[{RATE}]))",
                       "OIP {{protocol}}")], "reqps"),
    timeseries("OIP inferences by shared-memory use",
               "Open Inference Protocol inferences per second by where their tensors were: "
               "none (in the message), system (POSIX shared memory regions) or cuda (CUDA IPC "
               "regions), by protocol. Shared memory needs --allow_shared_memory.",
               [target(f"sum by (protocol, shared_memory) (rate("
                       f"attnserve_inference_protocol_requests_total{{{SEL}}}[{RATE}]))",
                       "{{protocol}} {{shared_memory}}")], "reqps"),
    timeseries("OIP non-OK share by protocol and code",
               "Each non-OK status code's share of a protocol's inferences. INVALID_ARGUMENT, "
               "NOT_FOUND (unknown model or region) and RESOURCE_EXHAUSTED are client mistakes; "
               "INTERNAL or UNAVAILABLE are the server's (they also count in the server-side "
               "error ratio alert, which reads rpc ModelInfer of attnserve_requests_total).",
               [target(f'sum by (protocol, code) (rate(attnserve_inference_protocol_requests_total'
                       f'{{{SEL}, code!="OK"}}[{RATE}]))'
                       f" / ignoring (code) group_left "
                       f"sum by (protocol) (rate(attnserve_inference_protocol_requests_total"
                       f"{{{SEL}}}[{RATE}]))", "{{protocol}} {{code}}")], "percentunit"),
    timeseries("Shared-memory bytes by kind and direction",
               "Tensor bytes per second read from (in) or written to (out) registered "
               "shared-memory regions instead of travelling in messages.",
               [target(f"sum by (kind, direction) (rate("
                       f"attnserve_shared_memory_bytes_total{{{SEL}}}[{RATE}]))",
                       "{{kind}} {{direction}}")], "Bps"),

    row("Latency"),
    timeseries("Request latency by method",
               "Receipt to response, from attnserve_request_duration_seconds.",
               quantiles("attnserve_request_duration_seconds", ["rpc"], "{{rpc}}"), "s"),
    timeseries("Queue time by method",
               "Time waiting for a device. Rising queue time at flat compute time is saturation.",
               quantiles("attnserve_queue_duration_seconds", ["rpc"], "{{rpc}}", (0.5, 0.99))
               + [mean("attnserve_queue_duration_seconds", ["rpc"], "{{rpc}}")], "s"),
    timeseries("Compute time by kernel family and device",
               "Time executing on the device, from attnserve_compute_duration_seconds.",
               quantiles("attnserve_compute_duration_seconds", ["kernel", "device"],
                         "{{kernel}} {{device}}", (0.5, 0.99)), "s"),
    timeseries("Requests by code path",
               "Requests per second by the kernel family and code path that ran them "
               "(Execution.code_path: flash/sm90, flash/sm80, fallback/sm80, reference/cpu, ...), "
               "from attnserve_code_path_compute_duration_seconds. Hopper traffic off sm90 "
               "means requests only the sm80 kernels serve (dropout, ALiBi, deterministic).",
               [target(f"sum by (code_path) (rate("
                       f"attnserve_code_path_compute_duration_seconds_count{{{SEL}}}[{RATE}]))",
                       "{{code_path}}")], "reqps"),
    timeseries("Launch phases by device (mean per launch)",
               "Where a launch's time goes: stage_in (request tensors into pinned memory), "
               "device (copies and kernels), stage_out (answers out of pinned memory), on the "
               "GPU lane; answer (encoding, serializing and finishing the call) on the answer "
               "threads. A lane whose stage phases rival its device phase keeps the GPU idle.",
               [mean("attnserve_launch_phase_duration_seconds", ["device", "phase"],
                     "{{device}} {{phase}}")], "s"),

    row("Data path and saved contexts"),
    timeseries("Tensor bytes by path",
               "Tensor payload per second over gRPC and over the data channel. The server's "
               "received/sent totals count both paths; gRPC's share is the total less the data "
               "channel's (all of it on a server without a data channel).",
               [target(f"sum(rate(attnserve_{direction}_bytes_total{{{SEL}}}[{RATE}])) - "
                       f"(sum(rate(attnserve_data_{direction}_bytes_total{{{SEL}}}[{RATE}])) "
                       f"or vector(0))", f"gRPC {direction}")
                for direction in ("received", "sent")]
               + [target(f"sum(rate(attnserve_data_{direction}_bytes_total{{{SEL}}}[{RATE}]))",
                         f"data channel {direction}") for direction in ("received", "sent")],
               "Bps"),
    timeseries("Data channel chunks",
               "CHUNK frames per second by direction (in: request payload, out: answers). "
               "Bytes over chunks is the chunk size clients negotiated.",
               [target(f"sum by (direction) (rate(attnserve_data_chunks_total{{{SEL}}}[{RATE}]))",
                       "{{direction}}")], "ops"),
    timeseries("Data channel sessions and connections",
               "Sessions with an open connection and the connections themselves, per pod. "
               "Connections far above sessions times the clients' data_connections, or "
               "sessions that outlive their clients, are leaks.",
               [target(f"sum by (pod) (attnserve_data_sessions{{{SEL}}})", "{{pod}} sessions"),
                target(f"sum by (pod) (attnserve_data_connections{{{SEL}}})",
                       "{{pod}} connections")]),
    timeseries("Data channel buffered bytes",
               "Receive buffers held by data channel requests against the "
               "--data_max_buffered_bytes budget; at the budget new requests are refused "
               "with RESOURCE_EXHAUSTED.",
               [target(f"sum by (pod) (attnserve_data_buffered_bytes{{{SEL}}})",
                       "{{pod}} buffered"),
                target(f"max by (pod) (attnserve_data_buffered_bytes_limit{{{SEL}}})",
                       "{{pod}} budget")], "bytes"),
    timeseries("Data channel protocol errors by reason",
               "Connections closed per second for breaking the protocol (bad frames, "
               "duplicate chunks, HELLO timeouts, connection limit). A steady rate is a "
               "broken or hostile client.",
               [target(f"sum by (reason) "
                       f"(rate(attnserve_data_protocol_errors_total{{{SEL}}}[{RATE}]))",
                       "{{reason}}")], "ops"),
    timeseries("Transfer time against compute time per request",
               "Data channel transfer per request (in: REQUEST frame to last payload byte; out: "
               "answer queued to last byte sent) beside compute time on the device, both from "
               "their histograms. Transfer far above compute means the wire, not the GPU, "
               "sets the pace. gRPC calls have no transfer histogram; how much transfer "
               "overlapped compute is not measured.",
               [mean("attnserve_data_transfer_seconds", ["direction"], "transfer {{direction}}")]
               + quantiles("attnserve_data_transfer_seconds", ["direction"],
                           "transfer {{direction}}", (0.9,))
               + [mean("attnserve_compute_duration_seconds", ["rpc"], "compute {{rpc}}")]
               + quantiles("attnserve_compute_duration_seconds", ["rpc"], "compute {{rpc}}",
                           (0.9,)), "s"),
    timeseries("Data channel overlap",
               "Share of the time data channel calls spent with the engine that overlapped "
               "their transfers: computing (or queued) while the payload still arrived, or "
               "while a grouped forward's first groups were already going back "
               "(attnserve_data_overlap_seconds over attnserve_data_engine_seconds_total). "
               "Near 0: transfers and compute take turns (small or single-sequence calls, "
               "clients with group_chunks off).",
               [target(f"sum(rate(attnserve_data_overlap_seconds_sum{{{SEL}}}[{RATE}])) / "
                       f"sum(rate(attnserve_data_engine_seconds_total{{{SEL}}}[{RATE}]))",
                       "overlap ratio")], "percentunit"),
    timeseries("Saved contexts by device",
               "Contexts (keep_context forwards awaiting their backward) each device holds.",
               [target(f"max by (pod, device) (attnserve_contexts{{{SEL}}})",
                       "{{pod}} {{device}}")]),
    timeseries("Saved context bytes by device",
               "Device memory the saved contexts hold, part of the device's memory budget "
               "(at most --context_memory_bytes).",
               [target(f"max by (pod, device) (attnserve_context_bytes{{{SEL}}})",
                       "{{pod}} {{device}}")], "bytes"),
    timeseries("Context lookup hit ratio",
               "Share of Backwards by context_id that found their context. A miss (unknown, "
               "expired or evicted) costs the client a full resend.",
               [target(f'(sum(rate(attnserve_context_lookups_total{{{SEL}, result="hit"}}[{RATE}]))'
                       f" or vector(0)) / "
                       f"sum(rate(attnserve_context_lookups_total{{{SEL}}}[{RATE}]))",
                       "hit ratio")], "percentunit"),
    timeseries("Context lookups by result",
               "Backwards by context_id per second that found their saved context (hit) or "
               "not (miss: unknown, expired or evicted; the client resent in full).",
               [target(f"sum by (result) "
                       f"(rate(attnserve_context_lookups_total{{{SEL}}}[{RATE}]))",
                       "{{result}}")], "ops"),
    timeseries("Context evictions and releases",
               "Contexts leaving the store per second: released (by their Backward or "
               "ReleaseContext), evicted after the TTL (ttl: the client lost interest), or "
               "evicted for room (lru: the budget is too small for the contexts in use).",
               [target(f"sum by (reason) "
                       f"(rate(attnserve_context_evictions_total{{{SEL}}}[{RATE}]))",
                       "evicted {{reason}}"),
                target(f"sum(rate(attnserve_context_releases_total{{{SEL}}}[{RATE}]))",
                       "released")], "ops"),

    row("Batching and kernels"),
    timeseries("Batch size", "Requests that shared one kernel launch.",
               quantiles("attnserve_batch_requests", [], "batch", (0.5, 0.99))
               + [mean("attnserve_batch_requests", [], "batch")]),
    timeseries("Kernel family mix",
               "Executions per second by kernel family and method: flash where the device can, "
               "fallback kernels where FlashAttention cannot run, reference on the CPU.",
               [target(f"sum by (kernel, rpc) "
                       f"(rate(attnserve_compute_duration_seconds_count{{{SEL}}}[{RATE}]))",
                       "{{kernel}} {{rpc}}")], "ops", stack="percent"),

    row("Throughput"),
    timeseries("Tokens/s by method", "Query tokens processed per second.",
               [target(f"sum by (rpc) (rate(attnserve_tokens_total{{{SEL}}}[{RATE}]))",
                       "{{rpc}}")], "short"),
    timeseries("TFLOP/s by device and kernel family",
               "Attention FLOPs executed per second (4·Σ sq·sk·d·heads forward, halved if causal; "
               "2.5× that backward). Needs the server's attnserve_flops_total counter: until it "
               "exports it this panel shows no data.",
               [target(f"sum by (device, kernel) (rate(attnserve_flops_total{{{SEL}}}[{RATE}])) / 1e12",
                       "{{device}} {{kernel}}")], "short"),

    row("Devices"),
    timeseries("Device memory used", "Memory in use per device (host memory for the CPU device).",
               [target(f"max by (pod, device) (attnserve_device_memory_used_bytes{{{SEL}}})",
                       "{{pod}} {{device}}")], "bytes"),
    timeseries("Device memory used (share)",
               "Used over total memory per device. Needs attnserve_device_memory_total_bytes.",
               [target(f"max by (pod, device) (attnserve_device_memory_used_bytes{{{SEL}}}"
                       f" / attnserve_device_memory_total_bytes{{{SEL}}})",
                       "{{pod}} {{device}}")], "percentunit"),
    timeseries("Queue depth by device", "Requests waiting in each device's queue.",
               [target(f"max by (pod, device) (attnserve_queue_depth{{{SEL}}})",
                       "{{pod}} {{device}}")]),
    panel("table", "Devices", "Devices each server computes on.",
          [target(f"max by (namespace, job, pod, device, name, compute_capability) "
                  f"(attnserve_device_info{{{SEL}}})", instant=True, table=True)],
          transformations=[{"id": "organize", "options": {
              "excludeByName": {"Time": True, "Value": True},
              "renameByName": {"compute_capability": "compute capability"}}}]),
    timeseries("Servers by version", "Scraped servers per attnserve version: rollouts show here.",
               [target(f"count by (version) (attnserve_build_info{{{SEL}}})", "{{version}}")]),
]


def variable(name, label, query):
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": query, "definition": query, "refresh": 2, "sort": 1,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}, "hide": 0}


def layout(panels):
    """Assigns ids and grid positions: panels fill 24-column rows left to right."""
    x = y = row_height = 0
    for number, p in enumerate(panels, start=1):
        p["id"] = number
        if p["type"] == "row":
            y += row_height
            x, row_height = 0, 0
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        width, height = p.pop("_size")
        if x + width > 24:
            x, y, row_height = 0, y + row_height, 0
        p["gridPos"] = {"h": height, "w": width, "x": x, "y": y}
        x += width
        row_height = max(row_height, height)
    return panels


def dashboard():
    return {
        "title": "attnserve",
        "uid": "attnserve-overview",
        "description": "attnserve GPU attention service: traffic, admission rejections, "
                       "protocols and shared memory, latency, queueing, the data "
                       "path and saved contexts, batching, kernel families, throughput and "
                       "devices. Generated by "
                       "deploy/grafana/generate_dashboard.py.",
        "tags": ["attnserve", "gpu"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1},
            variable("namespace", "Namespace", "label_values(attnserve_build_info, namespace)"),
            variable("job", "Release (GPU class)",
                     'label_values(attnserve_build_info{namespace=~"$namespace"}, job)'),
            variable("pod", "Pod",
                     'label_values(attnserve_build_info{namespace=~"$namespace", job=~"$job"}, pod)'),
        ]},
        "panels": layout(json.loads(json.dumps(PANELS))),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit("usage: generate_dashboard.py (writes deploy/grafana/attnserve.json)")
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}")
