#!/usr/bin/env bash
# Builds build/variant_NAME.so, the CUDA test shim for bench_gpu.py --extra,
# with the given nvcc flags and, unless LINE is empty, over a copy of the
# headers with one internal tile-table line replaced (tables with no public
# macro, such as the backward's FA_I_BWD_<d>).
# Usage: bash bench/tile_variant.sh NAME 'FA_I_BWD_128 128, 32, 1' [nvcc flags...]
#        bash bench/tile_variant.sh NAME '' -DFA_SM90_KEYS_64=192 ...
set -euo pipefail
name=$1
line=$2
shift 2
src=tests/shim_cuda.cu
if [ -n "$line" ]; then
    dir=build/variant_src_$name
    mkdir -p "$dir/tests"
    macro=${line%% *}
    grep -q "^#define $macro " flashattn_cuda.cuh || { echo "no #define $macro"; exit 1; }
    sed "s/^#define $macro .*/#define $line/" flashattn_cuda.cuh >"$dir/flashattn_cuda.cuh"
    cp flashattn.h "$dir/"
    cp "$src" "$dir/tests/"
    src=$dir/tests/shim_cuda.cu
fi
nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a "$@" -shared \
    -o "build/variant_$name.so" "$src"
