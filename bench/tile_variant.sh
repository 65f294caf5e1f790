#!/usr/bin/env bash
# Builds build/variant_NAME.so: the CUDA test shim over a copy of the headers
# with one internal tile-table line replaced, for bench_gpu.py --extra (tables
# with no public macro, such as the backward's FA_I_BWD_<d>).
# Usage: bash bench/tile_variant.sh NAME 'FA_I_BWD_128 128, 32, 1' [nvcc flags...]
set -euo pipefail
name=$1
line=$2
shift 2
dir=build/variant_src_$name
mkdir -p "$dir/tests"
macro=${line%% *}
grep -q "^#define $macro " flashattn_cuda.cuh || { echo "no #define $macro"; exit 1; }
sed "s/^#define $macro .*/#define $line/" flashattn_cuda.cuh >"$dir/flashattn_cuda.cuh"
cp flashattn.h "$dir/"
cp tests/shim_cuda.cu "$dir/tests/"
nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a "$@" -shared \
    -o "build/variant_$name.so" "$dir/tests/shim_cuda.cu"
