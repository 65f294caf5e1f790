#!/usr/bin/env bash
# Builds another revision's code as a shim for the same-process A/Bs
# (ab_gpu.py, bench_decode.py --extra), in two steps because the GPU machine
# has no .git: here, `stage` writes revision REV's headers and test shim to
# build/rev/NAME (carry build/rev to the device); there, `build` compiles
# build/rev/NAME into build/rev_NAME_d<D>.so (head dim D, sm_90a; bf16, or
# with DTYPE=3 the FP8 forward into build/rev_NAME_d<D>_fp8.so).
# Usage: bash bench/rev_variant.sh stage NAME REV
#        bash bench/rev_variant.sh build NAME D [nvcc flags...]
# (nvcc splits -D values at commas: a tile row goes into the staged
# build/rev/NAME/flashattn_cuda.cuh by hand, not into the flags)
set -euo pipefail
mode=$1 name=$2
dir=build/rev/$name
if [ "$mode" = stage ]; then
    mkdir -p "$dir/tests"
    for f in flashattn.h flashattn_cuda.cuh tests/shim_cuda.cu; do git show "$3:$f" >"$dir/$f"; done
    exit 0
fi
d=$3
shift 3
suffix=; [ "${DTYPE:-2}" = 3 ] && suffix=_fp8
printf '#define FA_CUDA_DTYPE %s\n#define FA_HEAD_DIM %s\n#include "shim_cuda.cu"\n' "${DTYPE:-2}" "$d" \
    >"$dir/tests/d$d$suffix.cu"
nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a "$@" -shared \
    -o "build/rev_${name}_d$d$suffix.so" "$dir/tests/d$d$suffix.cu"
