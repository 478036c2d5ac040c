#!/usr/bin/env bash
# Builds stable-diffusion.cpp's `sd-cli` from the sources vendored in PyPI's
# stable-diffusion-cpp-python 0.4.7 sdist, with CMake and Ninja from PyPI: no network beyond
# the package registry. About 10 minutes on 2 cores. The binary lands in
# $DIR/stable_diffusion_cpp_python-0.4.7/vendor/stable-diffusion.cpp/build/bin/sd-cli.
#
#   benches/build_sd_cli.sh [DIR]     # DIR defaults to ./target/sd-cpp
#
# Then, for GGUF files as people download them:
#   sd-cli -M convert -m transformer.safetensors -o transformer-q4_0.gguf --type q4_0
set -euo pipefail
dir=${1:-target/sd-cpp}
mkdir -p "$dir"
cd "$dir"
[ -x v/bin/python ] || python3 -m venv v
./v/bin/pip install -q cmake ninja
[ -d stable_diffusion_cpp_python-0.4.7 ] || {
    ./v/bin/pip download -q --no-deps stable-diffusion-cpp-python==0.4.7 -d dl
    tar xzf dl/stable_diffusion_cpp_python-0.4.7.tar.gz
}
cd stable_diffusion_cpp_python-0.4.7/vendor/stable-diffusion.cpp
export PATH="$PWD/../../../v/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSD_BUILD_EXAMPLES=ON -DGGML_NATIVE=ON
cmake --build build -j"$(nproc)" --target sd-cli
echo "sd-cli: $PWD/build/bin/sd-cli"
