#!/usr/bin/env bash
# The CUDA variant is self-contained: built afresh (in its own target folder, the dependencies
# kept between runs, MLX's wheels from zimage's cache; the dev profile, since what is checked is
# how the program and its MLX library link, not their speed), its program needs only the system's
# libraries, its MLX library finds every library but the NVIDIA driver's libcuda.so.1, and on a
# machine without the driver the program says so in one line instead of failing to load.
set -euo pipefail
cd "$(dirname "$0")/.."
target=target/cuda13-ci
profile=${ZIMAGE_LDD_PROFILE:-debug}   # or release
flags=(); [ "$profile" = release ] && flags=(--release)
# The dependencies are those of the CPU build's same profile: start from its, hard-linked.
if [ ! -d "$target/$profile" ] && [ -d "target/$profile/deps" ]; then
  mkdir -p "$target" && cp -al "target/$profile" "$target/$profile"
fi
cargo clean "${flags[@]}" -p zimage --target-dir "$target" -q 2>/dev/null || true
ZIMAGE_MLX_VARIANT=cuda13 CARGO_TARGET_DIR="$target" cargo build "${flags[@]}" --bin zimage -q
bin="$target/$profile/zimage"
mapfile -t libs < <(find "$target/$profile/build" -name libzimage_mlx.so)
[ "${#libs[@]}" -eq 1 ] || { echo "cuda_ldd: expected one libzimage_mlx.so, found ${#libs[@]}" >&2; exit 1; }

fail=0
missing=$(ldd "$bin" | grep 'not found' || true)
if [ -n "$missing" ]; then echo "cuda_ldd: $bin lacks:"; echo "$missing"; fail=1; fi
missing=$(ldd "${libs[0]}" | grep 'not found' | awk '{print $1}' | sort -u | tr '\n' ' ')
if [ "$missing" != "libcuda.so.1 " ] && [ "$missing" != "" ]; then
  echo "cuda_ldd: ${libs[0]} lacks more than the driver: $missing"; fail=1
fi
if ! ldconfig -p | grep -q 'libcuda\.so\.1'; then
  [ "$missing" = "libcuda.so.1 " ] || { echo "cuda_ldd: libcuda.so.1 should be missing here"; fail=1; }
  rc=0; err=$("$bin" info 2>&1 >/dev/null) || rc=$?
  if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] \
     || ! grep -q '^error: no NVIDIA driver found (libcuda.so.1' <<< "$err"; then
    echo "cuda_ldd: without the driver, \`zimage info\` exited $rc saying:"; echo "$err"; fail=1
  fi
fi
[ "$fail" -eq 0 ] && echo "cuda_ldd: the cuda13 build needs only the NVIDIA driver"
exit "$fail"
