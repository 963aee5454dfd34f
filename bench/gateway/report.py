#!/usr/bin/env python3
"""Turns bench/gateway.sh's raw measurements into a markdown report (printed to stdout).

Usage: report.py RUNS_TSV META_MD

RUNS_TSV has one line per measured wrk run, tab-separated:
    round  proxy  cpu_ticks  clk_tck  wrk_output_file  pids_changed
where cpu_ticks is the proxy's user+sys CPU time (clock ticks, all of its processes) spent
during that run, and wrk_output_file holds wrk's stdout (run with --latency).
META_MD is markdown copied verbatim to the top of the report (parameters, machine, versions).
"""
import re
import statistics
import sys

PROXIES = ["keyroute", "nginx", "haproxy", "floor", "floor-own", "floor-uring", "baseline"]
UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def parse_wrk(text):
    """requests, req/s, p99 (ms), errors (dict) from wrk --latency output."""
    m = re.search(r"^\s*(\d+) requests in ", text, re.M)
    if not m:
        raise ValueError("no 'N requests in' line in wrk output")
    requests = int(m.group(1))
    m = re.search(r"^Requests/sec:\s*([\d.]+)", text, re.M)
    if not m:
        raise ValueError("no 'Requests/sec:' line in wrk output")
    rps = float(m.group(1))
    m = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s|m|h)\s*$", text, re.M)
    if not m:
        raise ValueError("no '99%' latency line in wrk output (was --latency given?)")
    p99 = float(m.group(1)) * UNIT_MS[m.group(2)]
    errors = {}
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    if m and int(m.group(1)):
        errors["non-2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        for name, v in zip(("connect", "read", "write", "timeout"), m.groups()):
            if int(v):
                errors[name] = int(v)
    return requests, rps, p99, errors


def parse_h2load(text):
    """requests, req/s, p99 (None: h2load gives no percentiles), errors from h2load output."""
    m = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", text)
    if not m:
        raise ValueError("no 'finished in' line in h2load output")
    rps = float(m.group(1))
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text)
    if not m:
        raise ValueError("no 'requests:' line in h2load output")
    requests, ok, failed, errored = (int(g) for g in m.groups())
    errors = {}
    if failed:
        errors["failed"] = failed
    if errored:
        errors["errored"] = errored
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    if m and (int(m.group(3)) or int(m.group(4))):
        errors["non-2xx"] = int(m.group(3)) + int(m.group(4))
    return ok, rps, float("nan"), errors


def parse(text):
    return parse_h2load(text) if "h2load" in text[:300] or "finished in" in text else parse_wrk(text)


def fmt_errors(errors):
    return " ".join(f"{k}={v}" for k, v in errors.items()) if errors else "0"


def main():
    runs_path, meta_path = sys.argv[1], sys.argv[2]
    runs = []
    for line in open(runs_path):
        if not line.strip():
            continue
        rnd, proxy, ticks, clk_tck, wrk_file, pids_changed = line.rstrip("\n").split("\t")
        text = open(wrk_file).read()
        requests, rps, p99, errors = parse(text)
        cpu_s = int(ticks) / int(clk_tck)
        us_per_req = cpu_s / requests * 1e6 if requests else float("nan")
        if pids_changed != "0":
            errors["proxy-pids-changed"] = 1
        runs.append(dict(round=int(rnd), proxy=proxy, requests=requests, rps=rps, p99=p99,
                         cpu_s=cpu_s, us=us_per_req, errors=errors, text=text))

    out = [open(meta_path).read().rstrip("\n"), ""]
    nrounds = max(r["round"] for r in runs)

    med = {}
    out += [f"## Medians over {nrounds} round(s)", "",
            "| proxy | req/s | p99 (ms) | CPU us/request | errors (all rounds) |",
            "|---|---:|---:|---:|---|"]
    for p in PROXIES:
        rs = [r for r in runs if r["proxy"] == p]
        if not rs:
            continue
        med[p] = dict(rps=statistics.median(r["rps"] for r in rs),
                      p99=statistics.median(r["p99"] for r in rs),
                      us=statistics.median(r["us"] for r in rs))
        errs = {}
        for r in rs:
            for k, v in r["errors"].items():
                errs[k] = errs.get(k, 0) + v
        out.append(f"| {p} | {med[p]['rps']:.0f} | {med[p]['p99']:.2f} | {med[p]['us']:.1f} | {fmt_errors(errs)} |")

    out += ["", "## Ratios keyroute / other (medians)", "",
            "| vs | req/s (target >= 1) | p99 (target <= 1) | CPU/request (target <= 1) |",
            "|---|---:|---:|---:|"]
    k = med.get("keyroute")
    for p in ("nginx", "haproxy", "floor", "floor-own", "floor-uring", "baseline"):
        o = med.get(p)
        if not k or not o:
            continue

        def cell(a, b, higher_is_better):
            ratio = a / b if b else float("nan")
            ok = ratio >= 1 if higher_is_better else ratio <= 1
            return f"{ratio:.3f} {'met' if ok else 'MISSED'}"

        out.append(f"| {p} | {cell(k['rps'], o['rps'], True)} | {cell(k['p99'], o['p99'], False)} | "
                   f"{cell(k['us'], o['us'], False)} |")

    # Paired by round: on a noisy machine, a proxy's CPU per request over nginx's in the same round
    # varies less than either does alone.
    by_round = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["proxy"]] = r["us"]
    paired = {p: [rd[p] / rd["nginx"] for rd in by_round.values() if p in rd and rd.get("nginx")]
              for p in PROXIES if p != "nginx"}
    paired = {p: v for p, v in paired.items() if v}
    uring = [rd["floor-uring"] / rd["floor-own"] for rd in by_round.values() if rd.get("floor-uring") and rd.get("floor-own")]
    if uring:
        out += ["", "## io_uring against epoll: floor-uring's CPU per request over floor-own's, paired by round", "",
                f"every round {', '.join(f'{x:.3f}' for x in uring)}; median {statistics.median(uring):.3f} "
                "(io_uring is adopted only at 0.90 or below)"]
    if paired:
        out += ["", "## CPU per request over nginx's, paired by round", "",
                "| proxy | every round | median |", "|---|---|---:|"]
        for p, v in paired.items():
            out.append(f"| {p} | {', '.join(f'{x:.2f}' for x in v)} | {statistics.median(v):.3f} |")

    out += ["", "## Every round (in the order run)", "",
            "| round | proxy | requests | req/s | p99 (ms) | proxy CPU (s) | CPU us/request | errors |",
            "|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        out.append(f"| {r['round']} | {r['proxy']} | {r['requests']} | {r['rps']:.0f} | {r['p99']:.2f} | "
                   f"{r['cpu_s']:.2f} | {r['us']:.1f} | {fmt_errors(r['errors'])} |")

    out += ["", "<details><summary>wrk output of every measured run</summary>", ""]
    for r in runs:
        out += [f"round {r['round']}, {r['proxy']}:", "", "```", r["text"].rstrip("\n"), "```", ""]
    out += ["</details>", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
