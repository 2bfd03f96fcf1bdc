"""What must hold after a soak, computed from the clients' counts and the servers' own.

Client counts are keys of one Counter (see worker.py):
  issued|KIND, outcome|PHASE|RPC|KIND|CODE, hung|KIND, wrong|KIND, unexpected|KIND|CODE,
  gap_refused|KIND|CODE|CAUSE (worker.gap_cause), verified|RPC|DTYPE, failures
  device_refused|PHASE|RPC|KIND (an UNAVAILABLE naming a device fault, with the faults phase)
PHASE says which server answered: Ln (before its SIGTERM), Lndrain (after it) or L(n+1).
Victims (clients killed with SIGKILL) add outcome|PHASE|RPC|victim|OK and |KILLED for the
call they died in. Unread calls (clients that stop reading) count CANCELLED in the phase they
were sent in: the client never learns their outcome.

The server-side invariant, per lifetime and RPC. The server counts a call OK once it has handed
the answer to gRPC; a client counts OK once it has received it. Every OK a client received was
counted by the server, and the server may have answered OK calls whose client stopped listening
first (it cancelled, its deadline passed, its channel closed, it was killed). So
    client_OK <= server_OK <= client_OK + abandoned,
abandoned being the fault-injected calls (cancel, deadline, close, victim) that ended
CANCELLED, DEADLINE_EXCEEDED or KILLED at the client. A plain valid call is never abandoned: if
one ends CANCELLED during the restart after the server had answered it OK (an accepted call
dropped), the server's count exceeds the bound.
A data channel request torn mid-payload (data_close) the server counts UNAVAILABLE (the
connection carrying its payload closed), the client CANCELLED; so the server's UNAVAILABLE
may exceed the clients' after the SIGTERM by at most those, the calls refused for a device
fault (which the clients saw) and the unread calls (which the server may have refused for one);
in a lifetime with a fault injected, also by the abandoned calls (refused for the fault after
their clients gave up on them).
Refusals the handler makes (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) are never abandoned in the
soak, so their counts must be equal, except for what the dying first server counted after its
last /metrics scrape, which only calls that ended after its SIGTERM can be.
"""
import collections
import statistics

RPCS = ("Forward", "Backward")
ABANDONED = {"CANCELLED", "DEADLINE_EXCEEDED", "KILLED"}
ABANDONING_KINDS = {"cancel", "deadline", "close", "victim", "data_close", "unread"}
ALL = tuple(phase for n in range(1, 10) for phase in (f"L{n}", f"L{n}drain"))  # every phase


def lifetime_phases(names):
    """{lifetime name: the phases it answered}: Ln, and Lndrain for all but the last."""
    return {name: (name, f"{name}drain") if i < len(names) - 1 else (name,)
            for i, name in enumerate(names)}
# Kinds whose calls never reach the handler: gRPC refuses them while reading the message.
TRANSPORT_ONLY = {"malformed:oversize_message"}
HANDLER_CODES = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")
FAULT_KINDS = ("cancel", "deadline", "close", "victim", "garbage_bytes", "data_close")
# Backwards by context_id: found, released first, never made, expired.
CONTEXT_KINDS = ("context:hit", "context:released", "context:unknown", "context:expired")


def outcomes(counts):
    """[(phase, rpc, kind, code, n)] from outcome|... keys."""
    rows = []
    for name, n in counts.items():
        parts = name.split("|")
        if parts[0] == "outcome":
            rows.append((*parts[1:], n))
    return rows


def _sum(rows, phases, rpc=None, kinds=None, codes=None, skip_kinds=()):
    return sum(n for phase, r, kind, code, n in rows
               if phase in phases and (rpc is None or r == rpc)
               and (kinds is None or kind in kinds) and kind not in skip_kinds
               and (codes is None or code in codes))


def _grouped(counts, prefix):
    """Sum of counts whose key starts with prefix|, by the rest of the key."""
    grouped = collections.Counter()
    for name, n in counts.items():
        if name.startswith(prefix + "|"):
            grouped[name[len(prefix) + 1:]] += n
    return grouped


def rss_growth(lifetime, window_s, field="rss_kib"):
    """(median RSS just after warmup, median RSS just before the load ended), in KiB, or None.
    Medians over a window, both under the same load: single samples swing by ~10 MiB with the
    request buffers in flight, which would hide a slow leak or fake one. field: another
    sampled series (device_memory_used, bytes), the same way."""
    samples, series = lifetime["samples"], lifetime["series"]
    if "warmup" not in samples or "load_end" not in samples:
        return None
    start, end = samples["warmup"]["t"], samples["load_end"]["t"]
    window = min(window_s, (end - start) / 3)
    first = [s[field] for s in series if start <= s["t"] <= start + window
             and s.get(field) is not None]
    last = [s[field] for s in series if end - window <= s["t"] <= end
            and s.get(field) is not None]
    if not first or not last:
        return None
    return int(statistics.median(first)), int(statistics.median(last))


class Checks:
    def __init__(self):
        self.results = []

    def add(self, name, ok, detail=""):
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})

    @property
    def passed(self):
        return all(result["ok"] for result in self.results)


def check(counts, lifetimes, reports_expected, reports_received, limits):
    checks = Checks()
    rows = outcomes(counts)
    codes = {lt["name"]: lt["exit_code"] for lt in lifetimes}
    checks.add("server exits 0 after each SIGTERM", all(c == 0 for c in codes.values()),
               str(codes))
    checks.add("server never died on its own", not counts["server_died"],
               f"{counts['server_died']} unexpected exits")
    checks.add("every client process reported", reports_received == reports_expected,
               f"{reports_received}/{reports_expected}")

    issued, resolved = _grouped(counts, "issued"), collections.Counter()
    for _, _, kind, _, n in rows:
        resolved[kind] += n
    hung = sum(_grouped(counts, "hung").values())
    checks.add("every call resolved exactly once", issued == resolved and not hung,
               f"issued {sum(issued.values())}, resolved {sum(resolved.values())}, hung {hung}"
               + ("" if issued == resolved else f"; per kind issued {dict(issued)} "
                  f"resolved {dict(resolved)}"))
    verified = sum(_grouped(counts, "verified").values())
    wrong = sum(_grouped(counts, "wrong").values())
    checks.add("every OK answer matches the reference (malformed never OK)",
               verified > 0 and not wrong, f"{verified} verified, {wrong} wrong")
    unexpected = _grouped(counts, "unexpected")
    checks.add("every call ended with a code its kind allows", not unexpected,
               str(dict(unexpected)) if unexpected else "")

    phases_of = lifetime_phases([lifetime["name"] for lifetime in lifetimes])
    device_refused = collections.Counter()  # (phase, rpc) -> calls
    for name, n in _grouped(counts, "device_refused").items():
        phase, rpc, _ = name.split("|", 2)
        device_refused[phase, rpc] += n
    for lifetime in lifetimes:
        name, final = lifetime["name"], lifetime["final_metrics"]
        if final is None:
            checks.add(f"{name}: final /metrics scrape", False, "none succeeded")
            continue
        checks.add(f"{name}: final /metrics scrape shows nothing in flight",
                   final["inflight"] == 0, f"inflight {final['inflight']}")
        server = final["requests"]
        phases = phases_of[name]
        drain = tuple(p for p in phases if p.endswith("drain"))
        for rpc in RPCS:
            client_ok = _sum(rows, phases, rpc, codes={"OK"})
            abandoned = _sum(rows, phases, rpc, kinds=ABANDONING_KINDS, codes=ABANDONED)
            server_ok = server.get(f"{rpc}|OK", 0)
            checks.add(f"{name} {rpc}: client OK <= server OK <= client OK + abandoned",
                       client_ok <= server_ok <= client_ok + abandoned,
                       f"{client_ok} <= {server_ok} <= {client_ok} + {abandoned}")
            for code in HANDLER_CODES + ("UNAVAILABLE",):
                client = _sum(rows, phases, rpc, codes={code}, skip_kinds=TRANSPORT_ONLY)
                late = _sum(rows, drain, rpc, codes={code}, skip_kinds=TRANSPORT_ONLY)
                got = server.get(f"{rpc}|{code}", 0)
                if code == "UNAVAILABLE":
                    # Clients also see UNAVAILABLE while no server listens at all.
                    torn = _sum(rows, phases, rpc, kinds={"data_close"}, codes={"CANCELLED"})
                    faulted = sum(device_refused[phase, rpc] for phase in phases)
                    unread = _sum(rows, phases, rpc, kinds={"unread"})
                    # A call its client abandoned (cancelled, past its deadline, killed) may
                    # have been refused meanwhile: for a fault injected into this lifetime, and
                    # by the drain when the client gave up after the SIGTERM (seen once: a
                    # Backward past its deadline, refused while draining).
                    gone = abandoned if lifetime.get("fault") else _sum(
                        rows, drain, rpc, kinds=ABANDONING_KINDS, codes=ABANDONED)
                    ok = got <= late + torn + faulted + unread + gone
                    rule = (f"server {got} <= client after SIGTERM {late} + torn {torn} + "
                            f"refused for a device fault {faulted} + unread {unread} + "
                            f"abandoned {gone}")
                else:
                    ok = got <= client and client - got <= late
                    rule = f"server {got}, client {client} (of which after SIGTERM {late})"
                checks.add(f"{name} {rpc}: server and client agree on {code}", ok, rule)

        if drain:
            # The SIGTERM must find accepted work, and the drain answer it. The server's count
            # (from its log) is not compared with the answers that arrived after the signal: it
            # drops a call only after handing its answer to gRPC, so it can still include a
            # call whose answer the client already has (seen once in 81540 calls). Per call,
            # the burst sent just before the signal must end OK (or UNAVAILABLE if refused
            # before it was accepted: "every call ended with a code its kind allows").
            in_flight = lifetime["inflight_at_sigterm"]
            burst_ok = _sum(rows, drain, kinds={"drain_burst"}, codes={"OK"})
            timed_out = "drain timeout" in (lifetime.get("log_tail") or "")
            if lifetime.get("fault") and final.get("device", {}).get("devices_unhealthy"):
                # No device could run the burst: it is refused UNAVAILABLE, and the drain must
                # still end in time.
                checks.add(f"{name}: with its device out of service, the SIGTERM's drain ended "
                           "in time", not timed_out,
                           f"{in_flight} in flight at the SIGTERM, drain timeout: {timed_out}")
            else:
                checks.add(f"{name}: the SIGTERM found accepted work in flight and the drain "
                           "answered it",
                           (in_flight or 0) >= 1 and burst_ok >= 1 and not timed_out,
                           f"{in_flight} in flight at the SIGTERM (server log), {burst_ok} "
                           f"burst calls answered OK after it, drain timeout: {timed_out}")
        device = final.get("device", {})
        checks.add(f"{name}: after the drain no device memory is reserved",
                   device.get("device_memory_reserved") == 0,
                   f"{device.get('device_memory_reserved')} bytes")
        if "faults" in limits.get("features", ()):
            faulted = lifetime.get("fault") is not None
            faults, resets = device.get("device_faults", 0), final.get("device_resets", {})
            if faulted:
                refused = sum(device_refused[phase, rpc] for phase in phases for rpc in RPCS)
                # A GPU whose trap survives cudaDeviceReset stays out of service (README,
                # "Device faults"): then it must say so, and the next lifetime serves again.
                checks.add(f"{name}: the injected device fault ({lifetime['fault']}) took "
                           "effect, calls were refused UNAVAILABLE for it, and the device came "
                           "back after a reset or is reported out of service",
                           faults >= 1 and refused >= 1
                           and (resets.get("ok", 0) >= 1 or device.get("devices_unhealthy")),
                           f"{faults} faults, {refused} calls refused, resets {resets}, "
                           f"{device.get('devices_unhealthy')} devices out of service at the "
                           "end")
            else:
                served = sum(n for key, n in server.items() if key.endswith("|OK"))
                checks.add(f"{name}: no device fault, every device in service, calls served",
                           faults == 0 and not device.get("devices_unhealthy") and served > 0,
                           f"{faults} faults, {device.get('devices_unhealthy')} out of "
                           f"service, {served} OK")
        memory = rss_growth(lifetime, limits["rss_window_s"], "device_memory_used")
        if memory is None:
            checks.add(f"{name}: device memory in use sampled", False, "no samples")
        else:
            checks.add(f"{name}: median device memory in use grew <= "
                       f"{limits['device_memory_growth_bytes'] >> 20} MiB under load",
                       memory[1] - memory[0] <= limits["device_memory_growth_bytes"],
                       f"{memory[0] >> 20} -> {memory[1] >> 20} MiB "
                       f"({(memory[1] - memory[0]) / (1 << 20):+.1f})")
        growth = rss_growth(lifetime, limits["rss_window_s"])
        if growth is None:
            checks.add(f"{name}: RSS and fds sampled", False, str(lifetime["samples"]))
            continue
        before, after = growth
        checks.add(f"{name}: median RSS growth under load <= {limits['rss_growth_kib']} KiB",
                   after - before <= limits["rss_growth_kib"],
                   f"{before} -> {after} KiB ({after - before:+d})")
        warm, end = lifetime["samples"]["warmup"], lifetime["samples"]["load_end"]
        fd_growth = end["fds"] - warm["fds"]
        checks.add(f"{name}: fd growth under load <= {limits['fd_growth']}",
                   fd_growth <= limits["fd_growth"],
                   f"{warm['fds']} -> {end['fds']} ({fd_growth:+d})")

    # The faults really happened and really bit, so a green soak means something.
    for kind in FAULT_KINDS:
        checks.add(f"fault injected: {kind}", issued[kind] > 0, f"{issued[kind]} calls")
    malformed = sum(n for kind, n in issued.items() if kind.startswith("malformed:"))
    checks.add("fault injected: malformed", malformed > 0, f"{malformed} calls")
    features = limits.get("features", ())
    effects = [("cancel", "CANCELLED"), ("deadline", "DEADLINE_EXCEEDED"), ("victim", "KILLED")]
    if "memory" in features:
        effects.append(("memory:oversized", "RESOURCE_EXHAUSTED"))
        waits = sum((lt["final_metrics"] or {}).get("device", {}).get("memory_waits", 0)
                    for lt in lifetimes)
        checks.add("memory phase: requests waited for device memory", waits > 0,
                   f"{waits} waits (attnserve_memory_waits_total)")
    if "unread" in features:
        effects.append(("unread", "CANCELLED"))
    for kind, code in effects:
        hit = _sum(rows, ALL, kinds={kind}, codes={code})
        checks.add(f"fault took effect: {kind} ended {code}", hit > 0, f"{hit} calls")
    for kind in CONTEXT_KINDS + ("context:release", "client:auto", "client:grpc") + (
            ("memory",) if "memory" in features else ()):
        ok = _sum(rows, ALL, kinds={kind}, codes={"OK"})
        checks.add(f"path exercised: {kind} answered OK", ok > 0, f"{ok} calls")
    lookups = collections.Counter()
    for lifetime in lifetimes:
        lookups.update((lifetime["final_metrics"] or {}).get("context_lookups", {}))
    checks.add("the servers counted context hits and misses (misses resent in full)",
               lookups["hit"] > 0 and lookups["miss"] > 0, str(dict(lookups)))
    rest = lifetimes[-1].get("rest")
    if rest is None:
        checks.add("at rest: the last server's holdings scraped", False, "no scrape")
    else:
        drained = rest["drained_after_s"]
        checks.add("at rest: no data channel buffers, sessions or connections left",
                   drained["data"] is not None and drained["data"] <= rest["margin_s"],
                   f"held at rest {rest['held_at_rest']}, gone after {drained['data']} s")
        checks.add("at rest: saved contexts freed within their TTL",
                   drained["contexts"] is not None
                   and drained["contexts"] <= rest["ttl_s"] + rest["margin_s"],
                   f"{rest['held_at_rest']['contexts']} contexts "
                   f"({rest['held_at_rest']['context_bytes']} bytes) at rest, gone after "
                   f"{drained['contexts']} s (TTL {rest['ttl_s']} s)")
    refused = sum(_grouped(counts, "gap_refused").values())
    expected = limits.get("lifetimes", 2)
    checks.add("SIGTERM + restart: clients were refused during the gap and retried",
               len(lifetimes) == expected and refused > 0,
               f"{len(lifetimes)}/{expected} lifetimes, {refused} refused attempts")
    return checks
