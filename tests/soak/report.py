"""The soak's figures as JSON and as a markdown summary."""
import collections
import json

from invariants import lifetime_phases, outcomes, rss_growth

CODES_ORDER = ("OK", "CANCELLED", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED",
               "UNAVAILABLE", "UNIMPLEMENTED", "INTERNAL", "KILLED")


DETAIL_CHARS = 90


def by_code(requests):
    """[(code, calls)] over every rpc, from {"Rpc|CODE": n}."""
    codes = collections.Counter()
    for name, n in requests.items():
        codes[name.split("|", 1)[1]] += n
    return sorted(codes.items())


def tables(counts):
    """Calls by kind and how they ended; verified answers by rpc and dtype."""
    by_kind = collections.defaultdict(collections.Counter)
    for phase, rpc, kind, code, n in outcomes(counts):
        by_kind[kind][code] += n
    verified = {name[len("verified|"):]: n for name, n in counts.items()
                if name.startswith("verified|")}
    return {kind: dict(codes) for kind, codes in sorted(by_kind.items())}, verified


def write_json(path, data):
    with open(path, "w") as out:
        json.dump(data, out, indent=1, sort_keys=True)


def markdown(data) -> str:
    counts, by_kind, verified = data["counts"], *tables(data["counts"])
    codes = [c for c in CODES_ORDER if any(c in row for row in by_kind.values())]
    codes += sorted({c for row in by_kind.values() for c in row} - set(codes))
    lines = [f"# attnserve soak, {data['started']}", "",
             f"Command: `{data['command']}`  ",
             f"Machine: {data['machine']}; binary `{data['binary']}`.  ",
             f"Devices `{data.get('devices', 'cpu')}`, optional phases: "
             f"{', '.join(data.get('features') or ['none'])}.  ",
             f"Duration {data['elapsed_s']:.0f} s, {data['workers']} client processes, "
             f"seed {data['seed']}, load average before/after {data['loadavg_before']} / "
             f"{data['loadavg_after']}.", "",
             "## Calls by kind and how they ended (client side, every attempt)", "",
             "| kind | " + " | ".join(codes) + " | total |",
             "|---|" + "---:|" * (len(codes) + 1)]
    totals = collections.Counter()
    for kind, row in by_kind.items():
        totals.update(row)
        lines.append(f"| {kind} | " + " | ".join(str(row.get(c, "")) for c in codes)
                     + f" | {sum(row.values())} |")
    lines.append("| **all** | " + " | ".join(str(totals.get(c, "")) for c in codes)
                 + f" | {sum(totals.values())} |")
    lines += ["", "Answers verified against the float64 reference: "
              + ", ".join(f"{k} {v}" for k, v in sorted(verified.items())) + ".",
              f"Victim processes killed with SIGKILL: {data['victims']['killed']}.  ",
              "Attempts refused during the SIGTERM/restart gap and retried: "
              + (", ".join(f"{k} {v}" for k, v in sorted(
                  (n[len('gap_refused|'):], c) for n, c in counts.items()
                  if n.startswith("gap_refused|"))) or "none") + ".", "",
              "Calls refused UNAVAILABLE for a device fault: "
              + (", ".join(f"{k} {v}" for k, v in sorted(
                  (n[len('device_refused|'):], c) for n, c in counts.items()
                  if n.startswith("device_refused|"))) or "none") + ".", "",
              "## Server lifetimes", "",
              "| lifetime | exit (in flight at SIGTERM) "
              "| median RSS after warmup -> before load end (KiB) "
              "| RSS range under load (KiB) | fds warmup -> load end "
              "| device memory used, median (MiB) | device faults, resets, memory waits "
              "| server requests_total by code (final scrape) |",
              "|---|---|---|---|---|---|---|---|"]
    phases = lifetime_phases([lifetime["name"] for lifetime in data["lifetimes"]])
    for lifetime in data["lifetimes"]:
        samples = lifetime["samples"]
        growth = rss_growth(lifetime, data["limits"]["rss_window_s"]) or ("?", "?")
        since = samples.get("warmup", {}).get("t", 0)
        until = samples.get("load_end", {}).get("t", float("inf"))
        rss = [x["rss_kib"] for x in lifetime["series"] if since <= x["t"] <= until] or [0]
        rest = f"; at rest {samples['rest']['rss_kib']}" if "rest" in samples else ""
        final = lifetime["final_metrics"] or {}
        requests, device = final.get("requests", {}), final.get("device", {})
        memory = rss_growth(lifetime, data["limits"]["rss_window_s"], "device_memory_used")
        memory = f"{memory[0] >> 20} -> {memory[1] >> 20}" if memory else "?"
        fault = f"; injected {lifetime['fault']}" if lifetime.get("fault") else ""
        if lifetime.get("cut_short"):
            fault += " (ended early: its device stayed out of service)"
        lines.append(f"| {lifetime['name']} ({'+'.join(phases[lifetime['name']])}) | "
                     f"{lifetime['exit_code']} ({lifetime['inflight_at_sigterm']}) | "
                     f"{growth[0]} -> {growth[1]} | "
                     f"{min(rss)}-{max(rss)}{rest} | {samples.get('warmup', {}).get('fds')} -> "
                     f"{samples.get('load_end', {}).get('fds')} | {memory} | "
                     f"{device.get('device_faults')}, {final.get('device_resets', {})}, "
                     f"{device.get('memory_waits')}{fault} | "
                     + ", ".join(f"{k} {v}" for k, v in by_code(requests)) + " |")
    lines += ["", "## Checks", ""]
    for result in data["checks"]:
        mark = "pass" if result["ok"] else "**FAIL**"
        # Passing checks' details shortened, so that soak.md stays printable (soak.json has
        # them whole).
        detail = result["detail"]
        if result["ok"] and len(detail) > DETAIL_CHARS:
            detail = detail[:DETAIL_CHARS] + "…"
        lines.append(f"- {mark}: {result['check']}" + (f" — {detail}" if detail else ""))
    if data["failures"]:
        lines += ["", "## Failures (first 50)", ""] + [f"- `{f}`" for f in data["failures"][:50]]
    lines += ["", f"Verdict: **{'PASS' if data['passed'] else 'FAIL'}**", ""]
    return "\n".join(lines)
