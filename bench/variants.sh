#!/usr/bin/env bash
# Builds forward variants of the CUDA shim (bf16, one head dim each) and times
# them side by side with the default build and the peers (forward only).
# Usage: [SIZES=1024,4096,16384] bash bench/variants.sh OUTDIR "name:flags" ...
# (flags must hold -DFA_HEAD_DIM=<d>); the table lands in OUTDIR/results_gpu.md.
set -uo pipefail
out=$1
shift
extra=()
dims=()
for spec in "$@"; do
    name=${spec%%:*}
    flags=${spec#*:}
    bash bench/tile_variant.sh "$name" '' -DFA_CUDA_DTYPE=2 $flags &
    extra+=(--extra "$name=build/variant_$name.so")
    dims+=("$(sed -n 's/.*-DFA_HEAD_DIM=\([0-9]*\).*/\1/p' <<<"$flags")")
done
wait
dimlist=$(printf '%s\n' "${dims[@]}" | sort -un | paste -sd,)
python3 bench/bench_gpu.py --dtypes bf16 --dims "$dimlist" --no-backward --out "$out" \
    --sizes "${SIZES:-1024,4096,16384}" "${extra[@]}" | tail -40
