#!/bin/bash
# The thirtieth session's device call, never run (no machine came): the two
# A/Bs of bench/log/wip-varlen-bwd-hoist.patch and wip-fp8-head-descales.patch
# and the tests of a build with both. Build here first (sm_90a shims, ~2 min
# each for the full ones, 15 s for the FP8 d = 128 ones):
#   S="nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Xptxas --split-compile=0 -shared"
#   $S -o build/rev_main.so tests/shim_cuda.cu                      # main
#   git apply bench/log/wip-varlen-bwd-hoist.patch; $S -o build/rev_vl1.so tests/shim_cuda.cu
#   git apply bench/log/wip-fp8-head-descales.patch; $S -o build/rev_new.so tests/shim_cuda.cu
#   bash bench/rev_variant.sh stage main HEAD; DTYPE=3 bash bench/rev_variant.sh build main 128
#   mkdir -p build/rev/f8h/tests; cp flashattn.h flashattn_cuda.cuh build/rev/f8h/
#   cp tests/shim_cuda.cu build/rev/f8h/tests/; DTYPE=3 bash bench/rev_variant.sh build f8h 128
# then run this script on the device carrying those five .so files (the
# working tree with the varlen patch applied, for bench_varlen's --uniform
# extras).
set -u
out=$OUT
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
cp build/rev_main.so build/libflashattn_cuda_test.so
make -s build/libflashattn_test.so >$out/make.log 2>&1 || { tail $out/make.log; exit 1; }
t0=$SECONDS
case "$gpu" in *H200*)  # issue 48's H200 rows first (the one-token rows under cuDNN, the 16-token rows)
  timeout 200 python3 bench/bench_decode.py --paged 64 --rows "1,131072,1,128;1,131072,16,128;8,131072,1,128;8,32768,16,128;32,4096,1,128;32,4096,16,128;32,131072,1,128;128,1024,1,128;8,4096,16,128;1,32768,16,128;8,32768,4,128" --out $out/decode > $out/decode.log 2>&1
  grep "^|" $out/decode.log;;
esac
python3 bench/bench_varlen.py --ab 7 --uniform --extra vl1=build/rev_vl1.so > $out/ab.log 2>&1; tail -8 $out/ab.log
echo "ab: $((SECONDS-t0)) s"
python3 bench/bench_fp8.py --speed-only --dims 128 --sizes 4096,16384 --rounds 5 --out /tmp/f8 \
    --extra main=build/rev_main_d128_fp8.so --extra f8h=build/rev_f8h_d128_fp8.so > $out/fp8_ab.log 2>&1
grep "^{" $out/fp8_ab.log | python3 -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l)
    print(r['d'], r['n'], r['causal'], 'block f8h/main %.3f' % (r['f8h'] / r['main']), 'head f8h/main %.3f' % (r['f8h_head'] / r['main_head']), 'main_head %.0f f8h_head %.0f bf16 %.0f' % (r['main_head'], r['f8h_head'], r['bf16']))
"; tail -2 $out/fp8_ab.log
echo "fp8 ab: $((SECONDS-t0)) s"
cp build/rev_new.so build/libflashattn_cuda_test.so
timeout $((500-SECONDS+t0)) python3 tests/run_tests.py gpu_varlen gpu_fp8 > $out/test_new.log 2>&1
grep -v "^PASS" $out/test_new.log | tail -8; echo "passed: $(grep -c '^PASS' $out/test_new.log)"
echo "all: $((SECONDS-t0)) s"
