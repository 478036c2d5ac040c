#!/usr/bin/env bash
# The Mac build, checked on Linux: the Rust code (library, programs, tests, examples)
# type-checked for aarch64-apple-darwin with clippy's warnings as errors, and the shim's C++
# compiled by clang for arm64 with warnings as errors (the build script does both under
# ZIMAGE_CHECK_ONLY=1, taking MLX's headers from the MLX a Linux build installed). What it needs
# it installs: the target's standard library (rustup), clang and the arm64 cross headers (apt).
# It fails, never skips, when it cannot get them.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-apple-darwin

if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target" ||
    { echo "check_macos: cannot install Rust's standard library for $target (rustup target add $target)" >&2; exit 1; }
fi
if ! command -v clang++ >/dev/null || ! [ -d /usr/aarch64-linux-gnu/include ] ||
   ! compgen -G '/usr/aarch64-linux-gnu/include/c++/*' >/dev/null; then
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      clang libstdc++-12-dev-arm64-cross libc6-dev-arm64-cross; } ||
    { echo "check_macos: cannot install clang and the arm64 cross headers (Debian: clang libstdc++-12-dev-arm64-cross libc6-dev-arm64-cross)" >&2; exit 1; }
fi
# MLX's headers come from the MLX that a build for this machine installs.
compgen -G "${ZIMAGE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zimage}/mlx-*/mlx/include/mlx/mlx.h" >/dev/null ||
  [ -n "${MLX_DIR:-}" ] || cargo build -q --lib

# Dependencies' C objects are left empty (.ci/empty_cc.sh says why); the shim is compiled.
export CC_aarch64_apple_darwin="$PWD/.ci/empty_cc.sh" CXX_aarch64_apple_darwin="$PWD/.ci/empty_cc.sh"
ZIMAGE_CHECK_ONLY=1 cargo clippy --target "$target" --lib --bins --tests --examples -- -D warnings
echo "check_macos: $target type-checks and the shim compiles for arm64 with clang, without warnings"
