#!/usr/bin/env bash
# The library's benchmarks against a saved baseline: which moved by more than the noise.
#
#   bench/compare.sh save [NAME]      run the placement benchmarks and save them as baseline NAME
#                                     (default "main"), e.g. on the commit before a change
#   bench/compare.sh [NAME]           run them again against NAME and list every benchmark whose
#                                     change is outside criterion's 95% confidence interval AND
#                                     larger than NOISE percent (default 5: this machine is shared)
#
# Extra criterion arguments go after `--`, e.g. `bench/compare.sh main -- lookup-keyed` to run a
# subset. Exits 1 when a benchmark got slower by more than the noise, so it can gate a change.
set -euo pipefail
cd "$(dirname "$0")/.."

NOISE=${NOISE:-5}
mode=compare
if [[ ${1:-} == save ]]; then
    mode=save
    shift
fi
name=main
if [[ $# -gt 0 && $1 != -- ]]; then
    name=$1
    shift
fi
[[ ${1:-} == -- ]] && shift
filter=("$@")

target=${CARGO_TARGET_DIR:-target}
if [[ $mode == save ]]; then
    cargo bench -p keyroute-bench --bench placement -- "${filter[@]}" --save-baseline "$name"
    echo "saved baseline '$name' under $target/criterion"
    exit 0
fi
started=$(date +%s)
cargo bench -p keyroute-bench --bench placement -- "${filter[@]}" --baseline "$name" >/dev/null
python3 - "$target/criterion" "$NOISE" "$started" <<'EOF'
import json, os, sys
root, noise, started = sys.argv[1], float(sys.argv[2]) / 100, int(sys.argv[3])
rows = []
for dirpath, _, files in os.walk(root):
    if os.path.basename(dirpath) != "change" or "estimates.json" not in files:
        continue
    path = os.path.join(dirpath, "estimates.json")
    if os.path.getmtime(path) < started:
        continue  # not run this time
    bench = os.path.relpath(os.path.dirname(dirpath), root)
    with open(path) as f:
        mean = json.load(f)["mean"]
    point = mean["point_estimate"]
    lo, hi = mean["confidence_interval"]["lower_bound"], mean["confidence_interval"]["upper_bound"]
    moved = (lo > 0 or hi < 0) and abs(point) > noise
    rows.append((bench, point, lo, hi, moved))
rows.sort()
slower = [r for r in rows if r[4] and r[1] > 0]
faster = [r for r in rows if r[4] and r[1] < 0]
print(f"{len(rows)} benchmarks compared with the baseline; noise threshold {noise:.0%}")
for title, group in (("slower", slower), ("faster", faster)):
    print(f"\n{title}: {len(group)}")
    for bench, point, lo, hi, _ in group:
        print(f"  {bench:60} {point:+7.1%}  (95% CI {lo:+.1%} .. {hi:+.1%})")
sys.exit(1 if slower else 0)
EOF
