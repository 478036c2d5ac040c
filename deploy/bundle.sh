#!/usr/bin/env bash
# Writes a self-contained zimage: a folder (and a .tar.gz of it) with the program and the MLX
# libraries it links, found beside the program at run time, so that it runs on a machine with
# no Rust, no Python and no zimage cache. See docs/scale-out.md.
#
#   deploy/bundle.sh [PROGRAM] [FOLDER]
#
# PROGRAM: the built program (default target/release/zimage; any profile works).
# FOLDER: where to write (default dist/zimage-<os>-<arch>); replaced if it exists.
#
# Linux: the libraries the program (and, in the CUDA builds, the libzimage_mlx.so it opens)
# resolves outside the system's folders go to FOLDER/lib, found by an rpath of $ORIGIN/lib
# (patchelf); libzimage_mlx.so goes beside the program, where it is looked for first.
# macOS: libmlx.dylib and mlx.metallib go to FOLDER/lib, found by @executable_path/lib.
set -euo pipefail

program=${1:-target/release/zimage}
[ -f "$program" ] || { echo "bundle: no program at $program; build it first (cargo build --release)" >&2; exit 1; }
os=$(uname -s | tr '[:upper:]' '[:lower:]')
folder=${2:-dist/zimage-$os-$(uname -m)}
rm -rf "$folder"
mkdir -p "$folder/lib"
cp "$program" "$folder/zimage"
chmod u+w "$folder/zimage"

# A library the system provides (the C and C++ runtimes, the loader) stays out of the bundle.
system_lib() {
  case "$1" in
    /lib/*|/lib64/*|/usr/lib/*|/usr/lib64/*|/usr/local/lib/*) return 0 ;;
    *) return 1 ;;
  esac
}

bundle_linux() {
  command -v patchelf >/dev/null || { echo "bundle: patchelf is needed (apt-get install patchelf)" >&2; exit 1; }
  local objects=("$program") runtime=""
  # The CUDA builds open libzimage_mlx.so at start: beside the program, else where the build
  # wrote it (the program names that path).
  runtime=$(dirname "$program")/libzimage_mlx.so
  if [ ! -f "$runtime" ]; then
    runtime=$(grep -aoE -m1 '/[^[:space:][:cntrl:]]*/libzimage_mlx\.so' "$program" | head -n1 || true)
  fi
  if [ -n "$runtime" ] && [ -f "$runtime" ]; then
    cp "$runtime" "$folder/libzimage_mlx.so"
    objects+=("$runtime")
  fi
  local object line path
  for object in "${objects[@]}"; do
    while read -r line; do
      # `name => /path (0x…)`; the driver's libcuda.so.1 is `not found` here and comes from
      # the machine that runs it.
      path=$(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<< "$line")
      [ -n "$path" ] || continue
      system_lib "$path" && continue
      cp -L "$path" "$folder/lib/"
      case "$(basename "$path")" in
        # These open parts of themselves by name at run time, from their own folder.
        libnvrtc.so*) cp -L "$(dirname "$path")"/libnvrtc-builtins* "$folder/lib/" 2>/dev/null || true ;;
        libcudnn.so*) cp -L "$(dirname "$path")"/libcudnn_* "$folder/lib/" 2>/dev/null || true ;;
      esac
    done < <(ldd "$object")
  done
  chmod u+w "$folder"/lib/*
  patchelf --set-rpath '$ORIGIN/lib' "$folder/zimage"
  [ -f "$folder/libzimage_mlx.so" ] && patchelf --set-rpath '$ORIGIN/lib' "$folder/libzimage_mlx.so"
  local lib
  for lib in "$folder"/lib/*; do
    patchelf --set-rpath '$ORIGIN' "$lib"
  done
  # Every library but the NVIDIA driver's must resolve, and from the bundle.
  local missing
  missing=$(ldd "$folder/zimage" | awk '/not found/ && $1 != "libcuda.so.1" {print $1}')
  if [ -n "$missing" ]; then
    echo "bundle: $folder/zimage does not find: $missing" >&2
    exit 1
  fi
}

bundle_macos() {
  local lib dir
  lib=$(otool -L "$program" | awk '/libmlx\.dylib/ {print $1; exit}')
  case "$lib" in
    @rpath/*)
      for dir in $(otool -l "$program" | awk '/LC_RPATH/ {getline; getline; print $2}'); do
        if [ -f "$dir/libmlx.dylib" ]; then
          cp "$dir/libmlx.dylib" "$folder/lib/"
          [ -f "$dir/mlx.metallib" ] && cp "$dir/mlx.metallib" "$folder/lib/"
        fi
        install_name_tool -delete_rpath "$dir" "$folder/zimage"
      done ;;
    /*) cp "$lib" "$folder/lib/"; [ -f "$(dirname "$lib")/mlx.metallib" ] && cp "$(dirname "$lib")/mlx.metallib" "$folder/lib/"
        install_name_tool -change "$lib" @rpath/libmlx.dylib "$folder/zimage" ;;
  esac
  [ -f "$folder/lib/libmlx.dylib" ] || { echo "bundle: cannot find libmlx.dylib for $program" >&2; exit 1; }
  install_name_tool -add_rpath @executable_path/lib "$folder/zimage"
  # Changed binaries need a signature again to run on Apple silicon; an ad hoc one does.
  codesign --force --sign - "$folder/lib/libmlx.dylib" "$folder/zimage"
}

case "$os" in
  linux) bundle_linux ;;
  darwin) bundle_macos ;;
  *) echo "bundle: $os is not supported" >&2; exit 1 ;;
esac

tar -C "$(dirname "$folder")" -czf "$folder.tar.gz" "$(basename "$folder")"
echo "bundle: $folder and $folder.tar.gz"
