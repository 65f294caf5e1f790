#!/bin/bash
# The next device call: the GPU tests of the build with all three patches
# in bench/log (wip-varlen-bwd-hoist: its A/B ran in the thirty-first
# session, its tests did not), then the FP8 A/Bs of wip-fp8-head-descales
# (f8h) and wip-fp8-spec (spec: form 2 on the d = 128 t0 and d = 256
# tiles), and on an H200 issue 48's decode rows. PART=tests runs the
# tests alone (~8 min), PART=bench the rest (~6 min). Builds it
# carries (sm_90a, made here; build/rev_all.so ~4 min on 2 cores):
#   S="nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Xptxas --split-compile=0 -shared"
#   build/rev_main.so   $S on main's tests/shim_cuda.cu
#   build/rev_all.so    the same with the three patches applied (git apply)
#   build/rev_{main,f8h,spec}_d128_fp8.so, build/rev_{main,spec}_d256_fp8.so:
#     DTYPE=3 bash bench/rev_variant.sh build NAME D, build/rev/NAME holding
#     main's headers and tests/shim_cuda.cu (stage main HEAD), or those of a
#     tree with wip-fp8-head-descales (f8h) or wip-fp8-spec (spec) applied
set -u
out=$OUT
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
make -s build/libflashattn_test.so >$out/make.log 2>&1 || { tail $out/make.log; exit 1; }
t0=$SECONDS
export PYTHONUNBUFFERED=1
cp build/rev_all.so build/libflashattn_cuda_test.so
if [ "${PART:-all}" != bench ]; then
  for tst in gpu_varlen gpu_fp8 gpu_bwd; do
    timeout 170 python3 tests/run_tests.py $tst > $out/test_$tst.log 2>&1
    grep -v "^PASS" $out/test_$tst.log | tail -6; echo "$tst passed: $(grep -c '^PASS' $out/test_$tst.log)  at $((SECONDS-t0)) s"
  done
  [ "${PART:-all}" = tests ] && exit 0
fi
cp build/rev_main.so build/libflashattn_cuda_test.so
fp8ab() {  # d, then NAME=shim pairs
    local d=$1; shift
    local ex=(); for e in "$@"; do ex+=(--extra "$e"); done
    timeout 100 python3 bench/bench_fp8.py --speed-only --dims $d --sizes 4096,16384 --rounds 5 --out /tmp/f8 "${ex[@]}" > $out/fp8_ab_d$d.log 2>&1
    grep "^{" $out/fp8_ab_d$d.log | python3 -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l)
    names = [k for k in r if k.endswith('_head') and k[:-5] in r and k != 'fp8_head' and k != 'main_head']
    s = ' '.join('%s/main block %.3f head %.3f' % (k[:-5], r[k[:-5]] / r['main'], r[k] / r['main_head']) for k in names)
    print(r['d'], r['n'], int(r['causal']), s, '| main %.0f head %.0f bf16 %.0f' % (r['main'], r['main_head'], r['bf16']))
"; tail -1 $out/fp8_ab_d$d.log
}
fp8ab 128 main=build/rev_main_d128_fp8.so f8h=build/rev_f8h_d128_fp8.so spec=build/rev_spec_d128_fp8.so
fp8ab 256 main=build/rev_main_d256_fp8.so spec=build/rev_spec_d256_fp8.so
echo "fp8 ab: $((SECONDS-t0)) s"
case "$gpu" in *H200*)  # issue 48's H200 rows (the one-token rows under cuDNN, the 16-token rows)
  timeout $((540-SECONDS+t0)) python3 bench/bench_decode.py --paged 64 --rows "1,131072,1,128;1,131072,16,128;8,131072,1,128;8,32768,16,128;32,4096,1,128;32,4096,16,128;32,131072,1,128;128,1024,1,128;8,4096,16,128;1,32768,16,128;8,32768,4,128" --out $out/decode > $out/decode.log 2>&1
  grep "^|" $out/decode.log;;
esac
echo "all: $((SECONDS-t0)) s"
