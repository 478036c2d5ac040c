#!/usr/bin/env bash
# Runs every fuzz target for N executions (default 100000), one after another, one job each,
# and prints per target the executions, the time and the result. Extra arguments go to
# libFuzzer (e.g. -rss_limit_mb=2048). Crashes land in fuzz/artifacts/<target>/; the full
# log of each run in fuzz/logs/<target>.log (with -jobs, libFuzzer's own output goes to
# fuzz-0.log in the current folder; it is appended there). Exits 1 when any target failed.
#
#   fuzz/run-all.sh 10000000
#   TARGETS="ztensor dfsn" fuzz/run-all.sh 1000000 -max_len=65536
#
# The time and rate include start-up and loading the corpus; libFuzzer's own figures are in
# the log (stat::average_exec_per_sec).
set -u
cd "$(dirname "$0")/.."

runs=${1:-100000}
shift || true
targets=${TARGETS:-"safetensors_header blob_classification blob_load manifest model_name ztensor dfsn gguf png_text image_input infotext edit_form ollama_images"}
mkdir -p fuzz/logs

cargo +nightly fuzz build || exit 2

failed=0
printf '%-22s %14s %10s %10s  %s\n' target executions seconds exec/s result
for t in $targets; do
    mkdir -p "fuzz/corpus/$t"
    log="fuzz/logs/$t.log"
    rm -f fuzz-0.log
    start=$(date +%s.%N)
    cargo +nightly fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -runs="$runs" -jobs=1 -workers=1 -rss_limit_mb=1024 -timeout=10 \
        -print_final_stats=1 "$@" >"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    if [ -f fuzz-0.log ]; then
        cat fuzz-0.log >>"$log"
        rm -f fuzz-0.log
    fi
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
    [ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -1)
    rate=$(awk -v n="${execs:-0}" -v s="$secs" 'BEGIN { if (s > 0) printf "%d", n / s }')
    if [ "$rc" -eq 0 ]; then
        result=ok
    else
        failed=1
        kind=$(grep -m1 -oE 'ERROR: libFuzzer: [a-z-]+|ERROR: AddressSanitizer: [a-z-]+|panicked at [^:]+:[0-9]+' "$log")
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        result="FAILED (rc $rc) ${kind:-see $log} ${artifact}"
    fi
    printf '%-22s %14s %10s %10s  %s\n' "$t" "${execs:-?}" "$secs" "${rate:-?}" "$result"
done
exit $failed
