#!/usr/bin/env bash
# Builds build/variant_NAME.so, the CUDA test shim for bench_gpu.py --extra,
# with the given nvcc flags and, unless LINES is empty, over a copy of the
# headers with internal tile-table lines replaced (tables with no public
# macro, such as the backward's FA_I_BWD_<d>); LINES separates them by ';'.
# Usage: bash bench/tile_variant.sh NAME 'FA_I_BWD_128 128, 64, 2, 1, 2, 4, 2' [nvcc flags...]
#        bash bench/tile_variant.sh NAME 'FA_I_BWD_64 ...; FA_I_BWDQ_64 ...' ...
#        bash bench/tile_variant.sh NAME '' -DFA_SM90_KEYS_64=192 ...
set -euo pipefail
name=$1
lines=$2
shift 2
src=tests/shim_cuda.cu
if [ -n "$lines" ]; then
    dir=build/variant_src_$name
    mkdir -p "$dir/tests"
    cp flashattn_cuda.cuh flashattn.h "$dir/"
    IFS=';' read -ra edits <<<"$lines"
    for line in "${edits[@]}"; do
        line=$(sed 's/^ *//' <<<"$line")
        macro=${line%% *}
        grep -q "^#define $macro " "$dir/flashattn_cuda.cuh" || { echo "no #define $macro"; exit 1; }
        sed -i "s/^#define $macro .*/#define $line/" "$dir/flashattn_cuda.cuh"
    done
    cp "$src" "$dir/tests/"
    src=$dir/tests/shim_cuda.cu
fi
nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a "$@" -shared \
    -o "build/variant_$name.so" "$src"
