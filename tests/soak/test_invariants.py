"""The soak's checks catch what they are meant to: each seeded defect fails its check, and a
clean record passes. Synthetic records, no server: fast."""
import pathlib
import sys
from collections import Counter

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent),
                str(pathlib.Path(__file__).resolve().parents[1] / "python")]

import invariants  # noqa: E402
from lifetime import parse_metrics  # noqa: E402

LIMITS = {"rss_growth_kib": 16 << 10, "rss_window_s": 30, "fd_growth": 8,
          "device_memory_growth_bytes": 64 << 20}


def _counts():
    counts = Counter({
        "outcome|L1|Forward|valid|OK": 90, "outcome|L1|Forward|cancel|CANCELLED": 5,
        "outcome|L1|Forward|cancel|OK": 5, "outcome|L1drain|Forward|valid|UNAVAILABLE": 3,
        "outcome|L1drain|Forward|valid|OK": 2,
        "outcome|L1|Backward|malformed:bad_dtype|INVALID_ARGUMENT": 7,
        "outcome|L1drain|Backward|malformed:bad_dtype|INVALID_ARGUMENT": 1,
        "outcome|L2|Forward|deadline|DEADLINE_EXCEEDED": 4, "outcome|L2|Forward|valid|OK": 50,
        "outcome|L2|Forward|victim|KILLED": 1, "outcome|L2|Forward|victim|OK": 9,
        "outcome|L2|Backward|garbage_bytes|INVALID_ARGUMENT": 2,
        "outcome|L2|Backward|malformed:oversize_message|RESOURCE_EXHAUSTED": 3,
        "outcome|L1drain|Forward|drain_burst|OK": 2, "issued|drain_burst": 2,
        "verified|Forward|fp16": 158, "gap_refused|valid|UNAVAILABLE": 3,
        # A torn data channel request, and one call of each context and client path.
        "outcome|L2|Forward|data_close|CANCELLED": 1,
        "outcome|L2|Forward|context:keep|OK": 4, "outcome|L2|ReleaseContext|context:release|OK": 1,
        "outcome|L2|Backward|context:hit|OK": 1, "outcome|L2|Backward|context:released|OK": 1,
        "outcome|L2|Backward|context:unknown|OK": 1, "outcome|L2|Backward|context:expired|OK": 1,
        "outcome|L2|Forward|client:auto|OK": 1, "outcome|L2|Forward|client:grpc|OK": 1,
    })
    for kind, n in (("valid", 145), ("cancel", 10), ("malformed:bad_dtype", 8),
                    ("deadline", 4), ("victim", 10), ("garbage_bytes", 2),
                    ("malformed:oversize_message", 3), ("close", 0), ("data_close", 1),
                    ("context:keep", 4), ("context:release", 1), ("context:hit", 1),
                    ("context:released", 1), ("context:unknown", 1), ("context:expired", 1),
                    ("client:auto", 1), ("client:grpc", 1)):
        counts[f"issued|{kind}"] = n
    return counts


def _lifetimes():
    def lifetime(name, requests):
        # RSS swinging by 10 MiB around a flat level, sampled every 2 s from t = 10 to 100.
        # Device memory in use likewise swinging by 16 MiB around 600 MiB.
        series = [{"t": t, "rss_kib": 30000 + 10000 * (t % 4 == 0), "fds": 12,
                   "device_memory_used": (600 + 16 * (t % 4 == 0)) << 20}
                  for t in range(10, 101, 2)]
        device = {"device_memory_used": 600 << 20, "device_memory_reserved": 0,
                  "memory_waits": 0, "device_faults": 0, "devices_unhealthy": 0}
        return {"name": name, "fault": None, "exit_code": 0, "series": series,
                "inflight_at_sigterm": 2,
                "samples": {"warmup": series[0], "load_end": series[-1]},
                "final_metrics": {"requests": requests, "rejections": {}, "inflight": 0,
                                  "context_lookups": {"hit": 1, "miss": 3},
                                  "device": device, "device_resets": {}}}
    # L1: 99 OK received + up to 5 cancelled; the last INVALID_ARGUMENT came after the scrape.
    # L2: the torn data channel request counted UNAVAILABLE; 6 OK Forwards and 4 Backwards
    # through the client.
    l2 = lifetime("L2", {"Forward|OK": 66, "Forward|DEADLINE_EXCEEDED": 2,
                         "Forward|UNAVAILABLE": 1, "Backward|OK": 4, "Backward|NOT_FOUND": 3,
                         "Backward|INVALID_ARGUMENT": 2})
    l2["rest"] = {"held_at_rest": {"contexts": 2, "context_bytes": 4096},
                  "drained_after_s": {"data": 0.0, "contexts": 3.1}, "ttl_s": 4,
                  "margin_s": 1.5}
    return [lifetime("L1", {"Forward|OK": 101, "Forward|UNAVAILABLE": 3,
                            "Backward|INVALID_ARGUMENT": 7}), l2]


def _failed(counts, lifetimes, limits=LIMITS):
    checks = invariants.check(counts, lifetimes, 3, 3, limits)
    return {r["check"] for r in checks.results if not r["ok"]}


def test_clean_record_passes_but_for_the_missing_fault():
    # Nothing was closed under a call in this record: exactly that check fails.
    assert _failed(_counts(), _lifetimes()) == {"fault injected: close"}


def _with(counts=None, lifetimes=None, limits=LIMITS):
    base_counts = _counts()
    base_counts["issued|close"] = 1
    base_counts["outcome|L2|Forward|close|CANCELLED"] = 1
    lifetimes = lifetimes or _lifetimes()
    lifetimes[1]["final_metrics"]["requests"]["Forward|OK"] = 67  # the closed call finished
    base_counts.update(counts or {})
    return _failed(base_counts, lifetimes, limits)


def test_seeded_defects_fail_their_checks():
    assert _with() == set()
    # Clients received more OKs than the server sent.
    assert _with({"outcome|L2|Forward|valid|OK": 5, "issued|valid": 5}) == {
        "L2 Forward: client OK <= server OK <= client OK + abandoned"}
    assert "every call resolved exactly once" in _with({"issued|valid": 1})
    assert "every call resolved exactly once" in _with({"hung|valid": 1})
    assert _with({"wrong|valid": 1}) == {
        "every OK answer matches the reference (malformed never OK)"}
    assert _with({"unexpected|valid|INTERNAL": 1}) == {
        "every call ended with a code its kind allows"}
    # A plain call dropped with CANCELLED during the restart after the server counted it OK,
    # while every cancelled call was answered OK too (98 received + 5 cancelled + 1 dropped).
    lifetimes = _lifetimes()
    lifetimes[0]["final_metrics"]["requests"]["Forward|OK"] = 104
    assert _with({"outcome|L1drain|Forward|valid|CANCELLED": 1,
                  "outcome|L1|Forward|valid|OK": -1}, lifetimes) == {
        "L1 Forward: client OK <= server OK <= client OK + abandoned"}
    # An INVALID_ARGUMENT the server never counted, in the quiet final lifetime.
    assert "L2 Backward: server and client agree on INVALID_ARGUMENT" in _with(
        {"outcome|L2|Backward|malformed:bad_dtype|INVALID_ARGUMENT": 1,
         "issued|malformed:bad_dtype": 1})
    # An UNAVAILABLE beyond the one torn data channel request, outside the restart.
    lifetimes = _lifetimes()
    lifetimes[1]["final_metrics"]["requests"]["Forward|UNAVAILABLE"] = 2
    assert _with(lifetimes=lifetimes) == {"L2 Forward: server and client agree on UNAVAILABLE"}
    # A Backward its client gave up on after the SIGTERM, refused UNAVAILABLE by the drain: no
    # defect; one more UNAVAILABLE than that is.
    lifetimes = _lifetimes()
    lifetimes[0]["final_metrics"]["requests"]["Backward|UNAVAILABLE"] = 1
    late_deadline = {"outcome|L1drain|Backward|deadline|DEADLINE_EXCEEDED": 1,
                     "issued|deadline": 1}
    assert _with(late_deadline, lifetimes) == set()
    lifetimes = _lifetimes()
    lifetimes[0]["final_metrics"]["requests"]["Backward|UNAVAILABLE"] = 2
    assert _with(late_deadline, lifetimes) == {
        "L1 Backward: server and client agree on UNAVAILABLE"}
    # No context miss was ever counted: the resend path went untested.
    lifetimes = _lifetimes()
    for lifetime in lifetimes:
        lifetime["final_metrics"]["context_lookups"] = {"hit": 5}
    assert _with(lifetimes=lifetimes) == {
        "the servers counted context hits and misses (misses resent in full)"}


def test_rest_defects_fail_their_checks():
    # A session left behind, and contexts that outlived their TTL.
    lifetimes = _lifetimes()
    lifetimes[1]["rest"]["drained_after_s"] = {"data": None, "contexts": None}
    assert _with(lifetimes=lifetimes) == {
        "at rest: no data channel buffers, sessions or connections left",
        "at rest: saved contexts freed within their TTL"}
    lifetimes = _lifetimes()
    del lifetimes[1]["rest"]
    assert _with(lifetimes=lifetimes) == {"at rest: the last server's holdings scraped"}


def test_lifetime_defects_fail_their_checks():
    lifetimes = _lifetimes()
    lifetimes[0]["exit_code"] = -11
    for sample in lifetimes[1]["series"][-16:]:  # the last 30 s: 17 MiB more
        sample["rss_kib"] += 17 << 10
    lifetimes[1]["samples"]["load_end"]["fds"] = 21
    lifetimes[0]["final_metrics"]["requests"]["Forward|UNAVAILABLE"] = 4
    lifetimes[0]["inflight_at_sigterm"] = 0  # the SIGTERM found the server idle
    assert _with(lifetimes=lifetimes) == {
        "L1: the SIGTERM found accepted work in flight and the drain answered it",
        "server exits 0 after each SIGTERM", "L2: median RSS growth under load <= 16384 KiB",
        "L2: fd growth under load <= 8", "L1 Forward: server and client agree on UNAVAILABLE"}


def test_device_memory_defects_fail_their_checks():
    lifetimes = _lifetimes()
    for sample in lifetimes[0]["series"][-16:]:  # the last 30 s: 80 MiB more on the device
        sample["device_memory_used"] += 80 << 20
    lifetimes[1]["final_metrics"]["device"]["device_memory_reserved"] = 4096
    assert _with(lifetimes=lifetimes) == {
        "L1: median device memory in use grew <= 64 MiB under load",
        "L2: after the drain no device memory is reserved"}


FAULTS = dict(LIMITS, features=["faults", "memory", "unread"])
# Added to _counts(): L2 had cpu@3+100 injected, two valid Forwards were refused for it, and
# one unread call the server may have refused too; the device came back. L1's device waited
# for memory 5 times.
FAULT_COUNTS = {"outcome|L2|Forward|valid|UNAVAILABLE": 2, "device_refused|L2|Forward|valid": 2,
                "issued|valid": 2, "outcome|L2|Forward|unread|CANCELLED": 1,
                "issued|unread": 1, "issued|memory": 3, "outcome|L1|Forward|memory|OK": 3,
                "issued|memory:oversized": 1,
                "outcome|L1|Backward|memory:oversized|RESOURCE_EXHAUSTED": 1}


def _fault_lifetimes(refused_by_server=3, resets=None, unhealthy=0):
    lifetimes = _lifetimes()
    l1, l2 = (lifetime["final_metrics"] for lifetime in lifetimes)
    l1["requests"]["Forward|OK"] += 3
    l1["requests"]["Backward|RESOURCE_EXHAUSTED"] = 1
    l1["device"]["memory_waits"] = 5
    lifetimes[1]["fault"] = "cpu@3+100"
    l2["requests"]["Forward|UNAVAILABLE"] = 1 + refused_by_server  # and the torn request
    l2["device"].update(device_faults=1, devices_unhealthy=unhealthy)
    l2["device_resets"] = {"ok": 1} if resets is None else resets
    return lifetimes


def test_fault_phases_pass_and_their_defects_fail():
    assert _with(FAULT_COUNTS, _fault_lifetimes(), FAULTS) == set()
    # A GPU whose trap survived the reset: out of service, which it reports.
    assert _with(FAULT_COUNTS, _fault_lifetimes(resets={"failed": 4}, unhealthy=1),
                 FAULTS) == set()
    # Neither back nor reported out of service.
    fault_check = ("L2: the injected device fault (cpu@3+100) took effect, calls were refused "
                   "UNAVAILABLE for it, and the device came back after a reset or is reported "
                   "out of service")
    assert _with(FAULT_COUNTS, _fault_lifetimes(resets={"failed": 4}), FAULTS) == {fault_check}
    # More UNAVAILABLE on the server than the refused (2), torn (1) and unread (1) calls and
    # those abandoned in L2 (4 past their deadline, 1 killed victim, 1 closed, 1 torn and 1
    # unread) explain: 1 + 11 = 12 may be, 13 not.
    assert _with(FAULT_COUNTS, _fault_lifetimes(refused_by_server=11), FAULTS) == set()
    assert _with(FAULT_COUNTS, _fault_lifetimes(refused_by_server=12), FAULTS) == {
        "L2 Forward: server and client agree on UNAVAILABLE"}
    # The fault never bit: no call was refused for it.
    counts = dict(FAULT_COUNTS, **{"device_refused|L2|Forward|valid": 0,
                                   "outcome|L2|Forward|valid|UNAVAILABLE": 0,
                                   "issued|valid": 0})
    assert _with(counts, _fault_lifetimes(refused_by_server=0), FAULTS) == {fault_check}
    # A fault where none was injected, and no memory wait anywhere.
    lifetimes = _fault_lifetimes()
    lifetimes[0]["final_metrics"]["device"].update(device_faults=1, memory_waits=0)
    assert _with(FAULT_COUNTS, lifetimes, FAULTS) == {
        "L1: no device fault, every device in service, calls served",
        "memory phase: requests waited for device memory"}


def test_parse_metrics():
    text = ('# TYPE attnserve_requests_total counter\n'
            'attnserve_requests_total{code="OK",rpc="Forward"} 15\n'
            'attnserve_requests_total{code="INVALID_ARGUMENT",rpc="Backward"} 2\n'
            'attnserve_rejections_total{reason="deadline"} 3\n'
            'attnserve_inflight_requests 0\n'
            'attnserve_data_sessions 1\n'
            'attnserve_contexts{device="cpu"} 2\n'
            'attnserve_contexts{device="cuda:0"} 1\n'
            'attnserve_context_lookups_total{result="miss"} 4\n'
            'attnserve_device_memory_used_bytes{device="cuda:0"} 1048576\n'
            'attnserve_device_healthy{device="cuda:0"} 0\n'
            'attnserve_device_faults_total{device="cuda:0"} 2\n'
            'attnserve_device_resets_total{device="cuda:0",result="failed"} 3\n'
            'attnserve_memory_waits_total{device="cuda:0"} 7\n')
    held = {"data_buffered_bytes": 0, "data_sessions": 1, "data_connections": 0,
            "contexts": 3, "context_bytes": 0}
    assert parse_metrics(text) == {"requests": {"Forward|OK": 15, "Backward|INVALID_ARGUMENT": 2},
                                   "rejections": {"deadline": 3}, "inflight": 0,
                                   "held": held, "context_lookups": {"miss": 4},
                                   "device": {"device_memory_used": 1 << 20,
                                              "device_memory_reserved": 0, "memory_waits": 7,
                                              "device_faults": 2, "devices_unhealthy": 1},
                                   "device_resets": {"failed": 3}}
