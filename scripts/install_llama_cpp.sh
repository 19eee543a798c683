#!/usr/bin/env bash
# Build llama-cpp-python from source once per machine, then install it into the given venv.
#
#   scripts/install_llama_cpp.sh .venv/bin/python
#
# llama.cpp is compiled for this CPU (GGML_NATIVE) with llamafile's sgemm given a run-time switch
# (scripts/llama_cpp_switch.py): that kernel is the fastest for prefill and long verification
# passes, but it takes batches of 2+ tokens only, so a verified chunk would round differently
# from one-token decoding (docs/design.md, "Exactness on llama.cpp"). The default mode runs it;
# `--exact` sets GGML_CPU_LLAMAFILE=0. The same script adds LLAMA_KV_CELL_ORDER, which `--exact`
# sets to keep each sequence's cache cells in position order. The wheel is kept under $SPECSERVE_WHEELS (default
# ~/.cache/specserve/wheels), keyed by version, flags, patch and CPU, so a second virtualenv or a
# fresh clone on the same machine installs it in seconds.
#
# For a GPU, add llama.cpp's own CMake flags: SPECSERVE_LLAMA_CMAKE_ARGS="-DGGML_CUDA=ON
# -DCMAKE_CUDA_ARCHITECTURES=90" make venv (docs/gpu.md; they are part of the wheel's key).
set -euo pipefail
PY=${1:?usage: install_llama_cpp.sh PYTHON}
VERSION=0.3.36
ARGS="-DGGML_LLAMAFILE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF"
# ggml's AMX kernels (compiled in by GGML_NATIVE on CPUs with AMX, such as Sapphire Rapids) crash
# in ggml_backend_amx_mul_mat on K-quant weights as llama-cpp-python 0.3.36 ships them (upstream
# llama.cpp#20824; every pass of 2+ tokens on the Qwen Q4_K_M pack segfaults), so they are compiled
# out there; the backend also keeps any build that has them from repacking weights for them.
if grep -q -m1 -w amx_int8 /proc/cpuinfo 2>/dev/null; then
    NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    ARGS="$ARGS -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"
fi
[ -z "${SPECSERVE_LLAMA_CMAKE_ARGS:-}" ] || ARGS="$ARGS $SPECSERVE_LLAMA_CMAKE_ARGS"
CPU=$( (grep -m1 -o -w -E 'flags.*' /proc/cpuinfo 2>/dev/null || uname -m) | md5sum | cut -c1-8)
HERE=$(cd "$(dirname "$0")" && pwd)
PATCH=$(md5sum <"$HERE/llama_cpp_switch.py" | cut -c1-8)
KEY=$(printf '%s %s %s %s' "$VERSION" "$ARGS" "$CPU" "$PATCH" | md5sum | cut -c1-12)
DIR=${SPECSERVE_WHEELS:-$HOME/.cache/specserve/wheels}/llama-cpp-python-$VERSION-$KEY

if ! ls "$DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $VERSION from source (about 5 minutes on 2 idle cores, once per machine)" >&2
    mkdir -p "$DIR.tmp"
    start=$(date +%s)
    SRC=$(mktemp -d)
    "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$SRC"
    tar -xzf "$SRC"/llama_cpp_python-$VERSION.tar.gz -C "$SRC"
    "$PY" "$HERE/llama_cpp_switch.py" "$SRC/llama_cpp_python-$VERSION"
    CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip wheel --quiet --no-deps \
        --no-cache-dir "$SRC/llama_cpp_python-$VERSION" -w "$DIR.tmp"
    rm -rf "$SRC"
    rm -rf "$DIR" && mv "$DIR.tmp" "$DIR"
    echo "built llama-cpp-python in $(( $(date +%s) - start )) s: $DIR" >&2
fi
"$PY" -m pip install --quiet --no-deps --force-reinstall "$DIR"/llama_cpp_python-*.whl
# its runtime dependencies (numpy, typing-extensions, diskcache, jinja2) from the index
"$PY" -m pip install --quiet "numpy>=1.20" "typing-extensions>=4.5" "diskcache>=5.6.1" "jinja2>=2.11.3"
