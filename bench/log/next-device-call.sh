#!/bin/bash
# The next device call, for an H200 (the issues' targets are measured
# there; the last H200 tables predate the decode kernels d11 / d12 and the
# varlen backward's hoist): issue 48's decode table (`make bench-decode`,
# pages of 16 and 64 beside), then issue 50's varlen table. On an H100 it
# runs the varlen table alone (its H100 table is current: c74cdb0).
# Carry build/libflashattn_test.so and build/rev_head.so, main's CUDA
# test shim built here (~2.5 min on 2 cores):
#   nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a \
#        -Xptxas --split-compile=0 -shared -o build/rev_head.so tests/shim_cuda.cu
# and set FA_COMMIT to the commit it was built from. ~9 min on an H200:
# PART=decode / PART=varlen split it over two calls.
set -u
out=$OUT
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
make -s build/libflashattn_test.so >$out/make.log 2>&1 || { tail $out/make.log; exit 1; }
cp build/rev_head.so build/libflashattn_cuda_test.so
t0=$SECONDS
case "$gpu" in *H200*)
  if [ "${PART:-all}" != varlen ]; then
    timeout 500 python3 bench/bench_decode.py --paged 16,64 --out $out/decode > $out/decode.log 2>&1
    echo "decode rc=$? rows: $(grep -c '^| [0-9]' $out/decode.log) at $((SECONDS - t0)) s"
  fi;;
esac
if [ "${PART:-all}" != decode ]; then
  timeout 300 python3 bench/bench_varlen.py --out $out/varlen > $out/varlen.log 2>&1
  echo "varlen rc=$?"; grep "^| " $out/varlen.log
fi
echo "all: $((SECONDS - t0)) s"
