#!/usr/bin/env bash
# zimage's CUDA build against diffusers on one NVIDIA GPU, at the real Z-Image-Turbo size with
# random weights, measured the same way (wall clock, nvidia-smi's GPU memory sampled every 0.1 s),
# printed as one table. On a Linux box with an NVIDIA GPU, the driver, Rust, Python 3 and network:
#
#   benches/gpu_compare.sh                  # everything: build, model, imports, venv, runs, table
#   benches/gpu_compare.sh import --model-dir DIR --zimage BIN   # imports only (no GPU needed)
#   benches/gpu_compare.sh table            # the table again, from the recorded numbers
#
# Stages (`all` runs them in order): build (the cuda13 variant, in target/cuda13), model
# (make_synthetic), import (bf16 and int4 into a scratch store), venv (diffusers with a CUDA
# torch), run (both programs, recorded under WORK/results), table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
helper="$root/benches/gpu_compare.py"

usage() {
  cat <<EOF
usage: benches/gpu_compare.sh [STAGE] [OPTIONS]
stages: all (default), build, model, import, venv, run, table
  --work DIR            scratch folder: model, store, venv, results (default: target/gpu-compare)
  --sizes LIST          image sizes, comma-separated (default: 1024,2048; the first is timed)
  --steps N             denoising steps (default: 8)
  --layers N            transformer blocks of the synthetic model (default: 30, the real depth)
  --refiner-layers N    noise and context refiners, each (default: 2)
  --text-layers N       text encoder layers (default: 36)
  --model-dir DIR       an existing diffusers directory instead of writing the synthetic model
  --zimage BIN          the zimage binary (default: the cuda13 build)
  --diffusers VERSION   diffusers to compare with (default: 0.42.1)
  --torch-index URL     where pip finds a CUDA torch (default: PyTorch's cu130 index)
EOF
}

die() { echo "gpu_compare: $*" >&2; exit 2; }
whole() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 takes a positive whole number, got \`$2\`"; }

stage=all
case "${1:-}" in
  all|build|model|import|venv|run|table) stage=$1; shift ;;
esac
work="$root/target/gpu-compare"; sizes=1024,2048; steps=8
layers=30; refiner=2; text=36; model_dir=""; zimage=""; diffusers=0.42.1
torch_index=https://download.pytorch.org/whl/cu130
while [ $# -gt 0 ]; do
  [ "$1" = -h ] || [ "$1" = --help ] && { usage; exit 0; }
  [ $# -ge 2 ] || die "$1 needs a value (see --help)"
  case "$1" in
    --work) work=$2 ;;
    --sizes) [[ $2 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--sizes takes sizes like 1024,2048, got \`$2\`"; sizes=$2 ;;
    --steps) whole "$1" "$2"; steps=$2 ;;
    --layers) whole "$1" "$2"; layers=$2 ;;
    --refiner-layers) whole "$1" "$2"; refiner=$2 ;;
    --text-layers) whole "$1" "$2"; text=$2 ;;
    --model-dir) model_dir=$2 ;;
    --zimage) zimage=$2 ;;
    --diffusers) diffusers=$2 ;;
    --torch-index) torch_index=$2 ;;
    *) die "unknown option \`$1\` (see --help)" ;;
  esac
  shift 2
done
mkdir -p "$work"
work=$(cd "$work" && pwd)
model_dir=${model_dir:-$work/model}
zimage=${zimage:-$root/target/cuda13/release/zimage}
store="$work/store"; results="$work/results"; venv="$work/venv"
IFS=, read -r -a size_list <<< "$sizes"
prompt="a red fox in the snow"; seed=1

# Runs a command and records its wall time and the GPU memory peak nvidia-smi saw (whole device,
# every 0.1 s) into the file $1, as `wall_ms` and `gpu_peak_mib` lines.
probe() {
  local record=$1; shift
  "$@" & local pid=$! peak=0 m t0 t1
  t0=$(date +%s%N)
  while kill -0 "$pid" 2>/dev/null; do
    m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    [ "${m:-0}" -gt "$peak" ] && peak=$m
    sleep 0.1
  done
  local rc=0; wait "$pid" || rc=$?
  t1=$(date +%s%N)
  [ "$rc" -eq 0 ] || { echo "gpu_compare: failed ($rc): $*" >&2; exit 1; }
  printf 'wall_ms %s\ngpu_peak_mib %s\n' "$(( (t1 - t0) / 1000000 ))" "$peak" >> "$record"
}

need_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu_compare: no NVIDIA GPU (nvidia-smi finds none): the comparison needs one" >&2
    exit 3
  fi
}

do_build() {
  (cd "$root" && ZIMAGE_MLX_VARIANT=cuda13 CARGO_TARGET_DIR="$root/target/cuda13" \
    cargo build --release --bin zimage)
}

do_model() {
  [ -e "$model_dir/model_index.json" ] && return
  (cd "$root" && cargo run --release --example make_synthetic -- --out "$model_dir" \
    --layers "$layers" --refiner-layers "$refiner" --text-layers "$text")
}

do_import() {
  [ -x "$zimage" ] || die "no zimage binary at $zimage (build it, or pass --zimage)"
  for w in bf16 int4; do
    "$zimage" --store "$store" show "bench/synthetic:$w" >/dev/null 2>&1 && continue
    local flag=(--dtype bf16); [ "$w" = int4 ] && flag=(--quantize int4)
    "$zimage" --store "$store" create "bench/synthetic:$w" --from "$model_dir" "${flag[@]}"
  done
}

do_venv() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import diffusers, torch; assert torch.cuda.is_available()" 2>/dev/null && return
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --index-url "$torch_index" torch
  "$venv/bin/pip" install -q "diffusers==$diffusers" transformers accelerate safetensors numpy pillow
}

do_run() {
  rm -rf "$results"; mkdir -p "$results"
  local first=${size_list[0]} s w r
  for w in bf16 int4; do
    r="$results/zimage-$w"
    "$zimage" --store "$store" profile "bench/synthetic:$w" --json > "$r.profile.json"
    python3 "$helper" profile-rate "$r.profile.json" >> "$r.txt"
    for s in "${size_list[@]}"; do
      probe "$r.$s.txt" "$zimage" --store "$store" generate "$prompt" --model "bench/synthetic:$w" \
        --width "$s" --height "$s" --steps "$steps" --seed "$seed" -o "$r.$s.png"
    done
    "$zimage" --store "$store" generate "$prompt" --model "bench/synthetic:$w" --width "$first" \
      --height "$first" --steps "$steps" --seed "$seed" --runs 2 -v -o "$r.warm.png" 2> "$r.warm.log"
    python3 "$helper" zimage-log "$r.warm.log" >> "$r.txt"
  done
  r="$results/diffusers-bf16"
  for s in "${size_list[@]}"; do
    probe "$r.$s.txt" "$venv/bin/python" "$helper" diffusers "$model_dir" --size "$s" \
      --steps "$steps" --seed "$seed" --prompt "$prompt" --out "$r.$s.png" --json "$r.$s.json"
  done
  python3 "$helper" diffusers-record "$r.$first.json" "$model_dir" >> "$r.txt"
  for w in bf16 int4; do
    echo "psnr_db $("$venv/bin/python" "$helper" psnr "$results/zimage-$w.$first.png" "$r.$first.png")" \
      >> "$results/zimage-$w.txt"
  done
}

do_table() {
  python3 "$helper" table "$results" --sizes "$sizes"
}

case $stage in
  build) do_build ;;
  model) do_model ;;
  import) do_import ;;
  venv) do_venv ;;
  run) need_gpu; do_run; do_table ;;
  table) do_table ;;
  all) need_gpu; do_build; do_model; do_import; do_venv; do_run; do_table ;;
esac
