#!/usr/bin/env bash
# Builds build/variant_NAME.so, the CUDA test shim (tests/shim_cuda.cu) for
# bench_gpu.py --extra and ab_gpu.py, with tile-table rows or options replaced.
# DEFINES holds `NAME VALUE` pairs separated by ';' (tile rows have commas,
# which nvcc's -D would split): they become #defines ahead of the shim.
# Usage: bash bench/tile_variant.sh NAME 'FA_FA2_BWD_TILE_128_163 128, 64, 2, 1, 2, 4, 2' [nvcc flags...]
#        bash bench/tile_variant.sh NAME 'FA_FA3_FWD_TILE_64_0 192, 192, 2, 2, 1, 2, 0; FA_FA3_PINGPONG 0'
#        bash bench/tile_variant.sh NAME '' -DFA_HEAD_DIM=64 ...
set -euo pipefail
name=$1
defines=$2
shift 2
mkdir -p build
src=build/variant_$name.cu
: >"$src"
IFS=';' read -ra lines <<<"$defines"
for line in "${lines[@]}"; do
    line=$(sed 's/^ *//; s/ *$//' <<<"$line")
    [ -n "$line" ] && echo "#define $line" >>"$src"
done
echo "#include \"../tests/shim_cuda.cu\"" >>"$src"
nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a "$@" -shared \
    -o "build/variant_$name.so" "$src"
