#!/usr/bin/env bash
# Stands in for the C and C++ compiler of aarch64-apple-darwin while the Mac build is type-checked
# on Linux (.ci/check_macos.sh). Dependencies that carry C (ring, zstd, blake3) need Apple's SDK to
# compile, and a type-check links none of it, so each object they ask for is an empty arm64
# Mach-O object. zimage's own shim never comes through here: under ZIMAGE_CHECK_ONLY the build
# script compiles it with clang for arm64, for real.
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  prev=$arg
done
if [ -n "$out" ]; then
  exec clang --target=arm64-apple-macos11 -c -x c /dev/null -o "$out"
fi
exec clang "$@"
