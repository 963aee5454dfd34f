#!/usr/bin/env python3
"""Prints criterion's results (target/criterion/**/new/estimates.json) as a markdown table:
benchmark id, median time per iteration, and its 95% confidence interval.

Usage: python3 bench/summarize.py [FILTER]"""
import json, os, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "criterion")
flt = sys.argv[1] if len(sys.argv) > 1 else ""


def fmt(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.1f} ns"


rows = []
for dirpath, dirs, files in os.walk(root):
    if os.path.basename(dirpath) == "new" and "estimates.json" in files and "benchmark.json" in files:
        bench = json.load(open(os.path.join(dirpath, "benchmark.json")))
        est = json.load(open(os.path.join(dirpath, "estimates.json")))["median"]
        name = bench["full_id"]
        if flt in name:
            rows.append((name, est["point_estimate"], est["confidence_interval"]["lower_bound"], est["confidence_interval"]["upper_bound"]))
print("| benchmark | median | 95% CI |")
print("|---|---:|---|")
for name, m, lo, hi in sorted(rows):
    print(f"| `{name}` | {fmt(m)} | {fmt(lo)} .. {fmt(hi)} |")
