#!/usr/bin/env bash
# zimage beside diffusers, a cold process to a PNG each, in one run: the family's big random
# model (klein: models/make_klein_tiny.py --big; flux3: models/make_flux3_tiny.py --big; flux1:
# models/make_flux1_tiny.py --big, a FLUX.1 [dev] at guidance 3.5), its distilled transformer run
# 4 steps, float32, at SIZE² (default 512), in ROUNDS rounds (default 3) taken in turn; prints
# each run's wall time and peak RSS and the medians' ratios.
#
#   PYTHON=/path/to/venv/bin/python benches/diffusers_compare.sh klein|flux3|flux1 [SIZE] [ROUNDS]
#
# PYTHON must have torch, diffusers 0.42.1 and transformers (docs/benchmarks.md says how the
# reference runs are installed). The model is written once under target/bench/FAMILY-big.
set -euo pipefail
cd "$(dirname "$0")/.."
family=${1:?klein, flux3 or flux1}
size=${2:-512}
rounds=${3:-3}
python=${PYTHON:-python3}
model=target/bench/$family-big
out=target/bench/$family-out
mkdir -p "$out"
case $family in
  klein) index=model_index.json ;;
  flux3) index=modular_model_index.json ;;
  flux1) index=model_index.json ;;
  *) echo "FAMILY is klein, flux3 or flux1" >&2; exit 2 ;;
esac
[ -f "$model/$index" ] || "$python" "models/make_${family}_tiny.py" --big "$model"
cargo build --release --quiet
zimage=target/release/zimage
# OpenBLAS picks its kernels from the CPU unless OPENBLAS_CORETYPE names them: say which ran.
"$zimage" info | grep '^BLAS'

run() { # NAME COMMAND...: "NAME wall_s peak_kb"
  local name=$1
  shift
  /usr/bin/time -o "$out/time" -f "%e %M" "$@" >"$out/$name.log" 2>&1 ||
    { echo "$name failed:" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
  echo "$name $(cat "$out/time")"
}

results=$(for r in $(seq "$rounds"); do
  run zimage "$zimage" generate "a red fox in the snow" --model "$model" --dtype f32 \
    --width "$size" --height "$size" --steps 4 --seed 42 -o "$out/zimage.png"
  run diffusers "$python" "models/bench_${family}_reference.py" "$model" "$size" "$out/diffusers.png"
done)
echo "$results" | awk -v size="$size" -v family="$family" '
  { wall[$1] = wall[$1] " " $2; rss[$1] = rss[$1] " " $3; print "  " $1 ": " $2 " s, peak RSS " $3 / 1e6 " GB" }
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return a[int((n + 1) / 2)]
  }
  END {
    zw = median(wall["zimage"]); dw = median(wall["diffusers"])
    zr = median(rss["zimage"]); dr = median(rss["diffusers"])
    printf "%s big %dx%d f32, medians: zimage %.2f s / %.2f GB, diffusers %.2f s / %.2f GB: time x%.2f, memory x%.2f\n",
      family, size, size, zw, zr / 1e6, dw, dr / 1e6, zw / dw, zr / dr
  }'
