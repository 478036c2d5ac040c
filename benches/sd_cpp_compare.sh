#!/usr/bin/env bash
# zimage against stable-diffusion.cpp on its own GGUF files, on the CPU, at the real
# Z-Image-Turbo size with random weights: the same files, the same prompt, seed, sizes and
# steps, in one run on one machine, measured the same way (/usr/bin/time -v: wall clock and peak
# RSS of the whole process; each program's log for the per-step and VAE-decode times).
#
#   benches/sd_cpp_compare.sh                # everything: sd-cli, model, GGUF files, imports, runs
#   benches/sd_cpp_compare.sh run --sizes 256 --types q4_0
#   benches/sd_cpp_compare.sh table          # the table again, from the logs
#
# Stages (`all` runs them in order):
#   build    sd-cli from PyPI's stable-diffusion-cpp-python sdist (benches/build_sd_cli.sh)
#   model    the synthetic model (make_synthetic), imported in bf16 and exported in ComfyUI's
#            layout (the transformer with fused q|k|v, as sd.cpp reads it), then removed
#   convert  `sd-cli -M convert --type T` of the transformer and the text encoder, per type
#   import   `zimage create` of those same GGUF files (and the VAE) into a scratch store
#   run      both programs, each after reading its files once (a warm page cache for both);
#            zimage once per `--products` choice (f32, its default, and bf16)
#   table    one line per program, type and size
# About 45 GB of disk at the peak of `model`; sd.cpp needs minutes per step on two cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  cat <<EOF
usage: benches/sd_cpp_compare.sh [STAGE] [OPTIONS]
stages: all (default), build, model, convert, import, run, table
  --work DIR      scratch folder: sd-cli, GGUF files, store, logs (default: target/sd-cpp-compare)
  --sizes LIST    image sizes, comma-separated (default: 256,512)
  --steps N       denoising steps (default: 2)
  --types LIST    GGUF types, comma-separated (default: q4_0,q8_0)
  --products LIST zimage's --products runs, comma-separated (default: f32,bf16; bf16 products
                  need AVX512-BF16 and otherwise run as f32 ones)
  --sd-cli BIN    an sd-cli already built (default: the one the build stage makes)
  --zimage BIN    the zimage binary (default: target/release/zimage, built if missing)
EOF
}

die() { echo "sd_cpp_compare: $*" >&2; exit 2; }

stage=all
case "${1:-}" in
  all|build|model|convert|import|run|table) stage=$1; shift ;;
esac
work="$root/target/sd-cpp-compare"; sizes=256,512; steps=2; types=q4_0,q8_0; products=f32,bf16; sd_cli=""; zimage=""
while [ $# -gt 0 ]; do
  [ "$1" = -h ] || [ "$1" = --help ] && { usage; exit 0; }
  [ $# -ge 2 ] || die "$1 needs a value (see --help)"
  case "$1" in
    --work) work=$2 ;;
    --sizes) [[ $2 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--sizes takes sizes like 256,512, got \`$2\`"; sizes=$2 ;;
    --steps) [[ $2 =~ ^[1-9][0-9]*$ ]] || die "--steps takes a positive whole number, got \`$2\`"; steps=$2 ;;
    --types) [[ $2 =~ ^(q4_0|q4_1|q5_0|q5_1|q8_0|q4_K|q5_K)(,(q4_0|q4_1|q5_0|q5_1|q8_0|q4_K|q5_K))*$ ]] || die "--types takes GGUF types like q4_0,q8_0, got \`$2\`"; types=$2 ;;
    --products) [[ $2 =~ ^(f32|bf16)(,(f32|bf16))*$ ]] || die "--products takes f32 and/or bf16, got \`$2\`"; products=$2 ;;
    --sd-cli) sd_cli=$2 ;;
    --zimage) zimage=$2 ;;
    *) die "unknown option \`$1\` (see --help)" ;;
  esac
  shift 2
done
mkdir -p "$work/logs"
work=$(cd "$work" && pwd)
[ -n "$sd_cli" ] || sd_cli="$work/sd/stable_diffusion_cpp_python-0.4.7/vendor/stable-diffusion.cpp/build/bin/sd-cli"
[ -n "$zimage" ] || zimage="$root/target/release/zimage"
export ZIMAGE_MODELS="$work/store"
prompt="a lighthouse on a cliff at dusk"
seed=5
IFS=, read -r -a size_list <<<"$sizes"
IFS=, read -r -a type_list <<<"$types"
IFS=, read -r -a product_list <<<"$products"

build() {
  [ -x "$sd_cli" ] || "$root/benches/build_sd_cli.sh" "$work/sd"
  [ -x "$zimage" ] || (cd "$root" && cargo build --release)
}

model() {
  [ -f "$work/comfy/vae/synthetic.safetensors" ] && return
  (cd "$root" && cargo run --release --example make_synthetic -- --out "$work/synthetic" --no-sync)
  "$zimage" create synthetic --from "$work/synthetic"
  rm -rf "$work/synthetic"
  "$zimage" export synthetic --format comfy "$work/comfy"
  "$zimage" rm synthetic && "$zimage" gc
}

convert() {
  for t in "${type_list[@]}"; do
    for c in diffusion_models text_encoders; do
      out="$work/$c-$t.gguf"
      [ -f "$out" ] || "$sd_cli" -M convert -m "$work/comfy/$c/synthetic.safetensors" -o "$out" --type "$t" \
        >"$work/logs/convert-$c-$t.log" 2>&1
    done
  done
}

import() {
  for t in "${type_list[@]}"; do
    "$zimage" show "synthetic:$t" >/dev/null 2>&1 && continue
    "$zimage" create "synthetic:$t" --transformer "$work/diffusion_models-$t.gguf" \
      --text-encoder "$work/text_encoders-$t.gguf" --vae "$work/comfy/vae/synthetic.safetensors"
  done
}

# A run's input files read once beforehand, so that each program starts from the page cache
# rather than from whatever the previous run happened to leave there.
warm() { [ $# -gt 0 ] || die "nothing to read ahead"; cat "$@" >/dev/null; }
# The blob files of stored model synthetic:TYPE, from its manifest.
model_blobs() {
  grep -o 'sha256:[0-9a-f]\{64\}' "$ZIMAGE_MODELS/manifests/registry.ollama.ai/library/synthetic/$1" |
    sed "s|^sha256:|$ZIMAGE_MODELS/blobs/sha256-|"
}

# One measured run: LABEL, then the command.
measure() {
  local label=$1; shift
  echo "running $label" >&2
  /usr/bin/time -v "$@" >"$work/logs/$label.log" 2>&1 || { tail -5 "$work/logs/$label.log" >&2; die "$label failed"; }
}

run() {
  for t in "${type_list[@]}"; do
    "$zimage" show "synthetic:$t" >/dev/null 2>&1 || die "synthetic:$t is not stored in $ZIMAGE_MODELS; run the import stage"
    mapfile -t blobs < <(model_blobs "$t")
    for s in "${size_list[@]}"; do
      warm "$work/diffusion_models-$t.gguf" "$work/text_encoders-$t.gguf" "$work/comfy/vae/synthetic.safetensors"
      measure "sd-cpp-$t-$s" "$sd_cli" --diffusion-model "$work/diffusion_models-$t.gguf" \
        --llm "$work/text_encoders-$t.gguf" --vae "$work/comfy/vae/synthetic.safetensors" \
        -p "$prompt" -W "$s" -H "$s" --steps "$steps" --cfg-scale 1.0 --seed "$seed" \
        -o "$work/sd-cpp-$t-$s.png"
      for p in "${product_list[@]}"; do
        warm "${blobs[@]}"
        measure "zimage-$p-$t-$s" "$zimage" generate "$prompt" --model "synthetic:$t" \
          --width "$s" --height "$s" --steps "$steps" --seed "$seed" --products "$p" -v \
          -o "$work/zimage-$p-$t-$s.png"
      done
    done
  done
}

table() {
  printf '%-14s %5s %5s %8s %8s %9s %10s %7s %7s\n' program type size 'wall s' 'step s' 'decode s' 'peak RSS' 'wall x' 'RSS x'
  for t in "${type_list[@]}"; do
    for s in "${size_list[@]}"; do
      ref="$work/logs/sd-cpp-$t-$s.log"
      [ -f "$ref" ] || continue
      labels=("sd-cpp-$t-$s")
      for p in "${product_list[@]}"; do labels+=("zimage-$p-$t-$s"); done
      for label in "${labels[@]}"; do
        log="$work/logs/$label.log"
        [ -f "$log" ] || continue
        awk -v label="${label%-$t-$s}" -v t="$t" -v s="$s" -v steps="$steps" -v ref="$ref" '
          function seconds(v,  n, p) { n = split(v, p, ":"); return n == 3 ? p[1]*3600 + p[2]*60 + p[3] : p[1]*60 + p[2] }
          function facts(file, out,  line) {
            while ((getline line < file) > 0) {
              if (line ~ /Elapsed \(wall clock\)/) { sub(/.*: /, "", line); out["wall"] = seconds(line) }
              if (line ~ /Maximum resident set size/) { sub(/.*: /, "", line); out["rss"] = line * 1024 }
              if (line ~ /sampling completed, taking/) { sub(/.*taking /, "", line); out["step"] = (line + 0) / steps }
              if (line ~ /decode_first_stage completed, taking/) { sub(/.*taking /, "", line); out["decode"] = line + 0 }
              if (line ~ /^step  /) { split(line, f, " "); out["step"] = f[2] }
              if (line ~ /^decode  /) { split(line, f, " "); out["decode"] = f[2] }
            }
            close(file)
          }
          BEGIN {
            facts(ARGV[1], me); facts(ref, base)
            printf "%-14s %5s %5s %8.1f %8.2f %9.2f %7.2f GB %7.2f %7.2f\n", label, t, s, me["wall"], me["step"], me["decode"], me["rss"] / 1e9, me["wall"] / base["wall"], me["rss"] / base["rss"]
          }' "$log"
      done
    done
  done
}

case $stage in
  all) build; model; convert; import; run; table ;;
  build) build ;;
  model) model ;;
  convert) convert ;;
  import) import ;;
  run) run; table ;;
  table) table ;;
esac
