#!/usr/bin/env bash
# Builds forward variants of the CUDA shim (bf16, one head dim each) and times
# them side by side with the default build and the peers (forward only).
# Usage: [SIZES=1024,4096,16384] bash bench/variants.sh OUTDIR "name:DEFINES" ...
# DEFINES as bench/tile_variant.sh takes them and holding `FA_HEAD_DIM <d>`,
# e.g. "k192:FA_HEAD_DIM 64; FA_FA3_FWD_TILE_64_0 192, 192, 2, 2, 1, 2, 0";
# the table lands in OUTDIR/results_gpu.md.
set -uo pipefail
out=$1
shift
extra=()
dims=()
for spec in "$@"; do
    name=${spec%%:*}
    defines=${spec#*:}
    bash bench/tile_variant.sh "$name" "FA_CUDA_DTYPE 2; $defines" &
    extra+=(--extra "$name=build/variant_$name.so")
    dims+=("$(sed -n 's/.*FA_HEAD_DIM \([0-9]*\).*/\1/p' <<<"$defines")")
done
wait
dimlist=$(printf '%s\n' "${dims[@]}" | sort -un | paste -sd,)
python3 bench/bench_gpu.py --dtypes bf16 --dims "$dimlist" --no-backward --out "$out" \
    --sizes "${SIZES:-1024,4096,16384}" "${extra[@]}" | tail -40
