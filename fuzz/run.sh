#!/usr/bin/env bash
# Runs every fuzz target (or those named) for a bounded time on a copy of its committed seed
# corpus, and exits non-zero if any target found a crash or a timeout.
#
#   fuzz/run.sh                      # 60 s per target
#   fuzz/run.sh 300                  # 300 s per target
#   FUZZ_SECONDS=120 fuzz/run.sh request config
#
# Each target first replays fuzz/regressions/<target>/ (the reproducers of earlier findings).
# The committed seeds in fuzz/corpus/<target>/ are never written: each run copies them to
# fuzz/target/run-corpus/<target>/ (libFuzzer adds what it finds there). Crashes go to
# fuzz/artifacts/<target>/ (cargo-fuzz's default), logs to fuzz/target/logs/<target>.log.
# FUZZ_NICE (default 10) is the niceness the builds and runs get, to share the machine.
set -uo pipefail

cd "$(dirname "$0")"

seconds="${FUZZ_SECONDS:-60}"
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
    seconds="$1"
    shift
fi
all=(config key_template admin_json request http1_differential memcache_codec resp_codec)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")
nice_level="${FUZZ_NICE:-10}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "run.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked || exit 1
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "run.sh: the nightly toolchain is needed (rustup toolchain install nightly)" >&2
    exit 1
fi

# Build once, then run the binaries: a source edit during the runs does not rebuild mid-way.
echo "run.sh: building the fuzz targets" >&2
# The fuzz crate is a workspace member (its targets' code is replayed on the corpus by
# `cargo test --workspace`); the libFuzzer binaries need the `libfuzzer` feature, and are built
# apart from the workspace's target directory (nightly, sanitizer flags).
export CARGO_TARGET_DIR="$PWD/target"
nice -n "$nice_level" cargo +nightly fuzz build --features libfuzzer || exit 1
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
bin="target/$triple/release"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}"

mkdir -p target/logs target/run-corpus
failed=()
summary="| target | seconds | executions | exec/s | corpus | findings |
|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
    if [[ ! -d "corpus/$t" ]]; then
        echo "run.sh: no target '$t' (have: ${all[*]})" >&2
        failed+=("$t")
        continue
    fi
    work="target/run-corpus/$t"
    rm -rf "$work"
    mkdir -p "$work" "artifacts/$t"
    cp corpus/"$t"/* "$work"/
    log="target/logs/$t.log"
    # The reproducers of earlier findings first: each must pass (the open ones are asserted only
    # with KEYROUTE_FUZZ_CHECK_KNOWN=1).
    if compgen -G "regressions/$t/*" >/dev/null; then
        if ! "$bin/$t" regressions/"$t"/* >"target/logs/$t.regressions.log" 2>&1; then
            echo "run.sh: $t: a regression input fails again; see fuzz/target/logs/$t.regressions.log" >&2
            failed+=("$t")
            summary+="
| $t | 0 | - | - | - | regression: see target/logs/$t.regressions.log |"
            continue
        fi
    fi
    dict=()
    [[ -f "dict/$t.dict" ]] && dict=("-dict=dict/$t.dict")
    echo "run.sh: fuzzing $t for ${seconds}s (log: fuzz/$log)" >&2
    start=$(date +%s)
    nice -n "$nice_level" "$bin/$t" "$work" -artifact_prefix="artifacts/$t/" \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${dict[@]}" >"$log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)
    execs=$(sed -nE 's/^#([0-9]+)[[:space:]]+DONE.*/\1/p' <<<"$done_line")
    rate=$(sed -nE 's/.*exec\/s: ([0-9]+).*/\1/p' <<<"$done_line")
    corp=$(sed -nE 's/.*corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$done_line")
    if [[ $rc -eq 0 ]]; then
        findings="none"
    else
        failed+=("$t")
        artifact=$(grep -oE "Test unit written to [^ ]+" "$log" | tail -n 1 | sed 's/Test unit written to //')
        findings="exit $rc${artifact:+: $artifact}"
        execs=${execs:-$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')}
        echo "run.sh: $t FAILED (exit $rc); see fuzz/$log" >&2
        grep -E "panicked at|ERROR: libFuzzer|SUMMARY|Test unit written" "$log" | head -n 5 >&2
    fi
    summary+="
| $t | $took | ${execs:-?} | ${rate:-?} | ${corp:-?} | $findings |"
done

echo
echo "$summary" | tee target/fuzz-summary.md
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "run.sh: failed: ${failed[*]}" >&2
    exit 1
fi
