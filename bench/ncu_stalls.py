#!/usr/bin/env python3
"""Summarizes the per-instruction SASS page of an Nsight Compute report (bench/profile_ncu.sh
writes it as sass.csv): warp-stall samples by role (the code after `setmaxnreg.dec` is the
producer warpgroup's, after `.inc` the consumers'), by stall reason and by opcode, and the
instructions with the most samples; with --range LO HI (hex offsets within the kernel's code) it
lists that stretch of code instead, with the synchronizing instructions and those above
--min-samples.

    python3 bench/ncu_stalls.py sass.csv [--top N] [--range LO HI] [--min-samples N]
"""
import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
SYNC_OPS = ("HGMMA", "DEPBAR", "SYNCS", "BAR", "UTMA", "UBLK", "STG", "EXIT", "USETMAXREG")


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[1]  # rows[0]: "Kernel Name", the kernel's name
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    insts = []
    role = "prologue"
    for row in rows[2:]:
        if len(row) < len(header) or not row[col[SAMPLES]].isdigit():
            continue
        source = row[col["Source"]].strip()
        if "USETMAXREG" in source:
            role = "producer" if "DEALLOC" in source else "consumer"
        insts.append({
            "offset": int(row[col["Address"]], 16) & 0xFFFFF,
            "source": source,
            "samples": int(row[col[SAMPLES]]),
            "executed": row[col["Instructions Executed"]],
            "stalls": {h[6:]: int(row[col[h]]) for h in stall_cols if row[col[h]].isdigit()},
            "role": role,
        })
    return rows[0][1] if len(rows[0]) > 1 else rows[0][0], insts


def opcode(source):
    words = source.split()
    word = words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def summary(insts, top):
    total = sum(i["samples"] for i in insts) or 1

    def share(n):
        return f"{100 * n / total:.1f}%"

    by_role, by_stall, by_op = (collections.Counter() for _ in range(3))
    for i in insts:
        by_role[i["role"]] += i["samples"]
        by_stall.update(i["stalls"])
        by_op[opcode(i["source"])] += i["samples"]
    print(f"{total} samples; by role:", ", ".join(f"{k} {share(v)}" for k, v in by_role.items()))
    print("stall reasons:", ", ".join(f"{k} {share(v)}" for k, v in by_stall.most_common(10)))
    print("opcodes:", ", ".join(f"{k} {share(v)}" for k, v in by_op.most_common(15)))
    for i in sorted(insts, key=lambda i: -i["samples"])[:top]:
        reasons = sorted(i["stalls"].items(), key=lambda kv: -kv[1])[:2]
        print(f"{share(i['samples']):>6} {i['role'][:4]} {i['offset']:05x} {i['source'][:64]:64} "
              f"x{i['executed']} {reasons}")


def listing(insts, lo, hi, min_samples):
    total = sum(i["samples"] for i in insts) or 1
    inside = [i for i in insts if lo <= i["offset"] < hi]
    for i in inside:
        if i["samples"] >= min_samples or any(op in i["source"] for op in SYNC_OPS):
            print(f"{i['offset']:05x} {i['samples']:6d} x{i['executed']:>7} {i['source'][:90]}")
    count = sum(i["samples"] for i in inside)
    print(f"{count} of {total} samples ({100 * count / total:.1f}%) in {lo:05x}-{hi:05x}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--range", nargs=2, metavar=("LO", "HI"))
    parser.add_argument("--min-samples", type=int, default=25)
    args = parser.parse_args()
    kernel, insts = read(args.csv)
    print(kernel[:160])
    if args.range:
        listing(insts, int(args.range[0], 16), int(args.range[1], 16), args.min_samples)
    else:
        summary(insts, args.top)


if __name__ == "__main__":
    main()
