#!/bin/bash
# The next device calls. Carry build/libflashattn_test.so (make -s) and the
# shims each PART names: build/rev_head.so (main's CUDA test shim), and
# rev_cand.so, rev_pg256.so (with build/pg256_test_paged.py), rev_tc.so,
# main with the wip patches applied; bash bench/log/build-shims.sh makes
# them here (~2.5 min each). Set FA_COMMIT to the commit they were built from.
# PART=cand first (any Hopper, ~7 min; carry build/rev_cand.so, main with
#   bench/log/wip-fp8-d256-k128.patch): the FP8 d = 256 128 x 128 tile, the
#   producer warp and FP8's 24 / 240 registers: gpu_fp8, gpu_fwd, gpu_varlen
#   and gpu_paged_prefill on it, then the FP8 A/B at d = 256 and 128; if it
#   pays, PART=candfull (every GPU test on it) before it lands.
# PART=pg256 (any Hopper, ~4 min): the patch's tests (gpu_paged, its test
#   file copied in) and its A/B on d = 256 paged prefill chunks.
# PART=tc (any Hopper, ~3 min): wip-paged-one-table-copy's paged tests
#   and its A/B on small paged decode calls (build/rev_tc.so, built as
#   rev_pg256.so with that patch).
# PART=decode, PART=varlen (an H200; the issues' targets are measured
#   there and the last H200 tables predate the decode kernels d11 / d12
#   and the varlen backward's hoist): `make bench-decode` with pages of 16
#   and 64 beside (~8 min), then the varlen table (~2 min).
# PART=fp8prof (any Hopper, ~3 min): the FP8 d = 128 kernels' SASS and an
#   ncu per-line profile of t0 (summed by bench/sass_summary.py), for what
#   holds the FP8 step.
set -u
out=$OUT
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
make -s build/libflashattn_test.so >$out/make.log 2>&1 || { tail $out/make.log; exit 1; }
t0=$SECONDS
case "${PART:-}" in
pg256)
  cp build/pg256_test_paged.py tests/test_paged.py # the patch's tests
  cp build/rev_pg256.so build/libflashattn_cuda_test.so
  timeout 200 python3 tests/run_tests.py gpu_paged > $out/test_gpu_paged.log 2>&1
  grep -v "^PASS" $out/test_gpu_paged.log | tail -8
  echo "gpu_paged passed: $(grep -c '^PASS' $out/test_gpu_paged.log) at $((SECONDS - t0)) s"
  timeout 200 python3 bench/bench_decode.py --paged 16,32,64 --device-tables 16 \
    --extra main=build/rev_head.so \
    --rows "1,8192,512,256;4,8192,512,256;1,16384,2048,256;1,32768,1024,256;1,8192,512,128" \
    --out /tmp/pg > $out/pg256_ab.log 2>&1
  grep "^|" $out/pg256_ab.log;;
tc)  # wip-paged-one-table-copy: its tests and A/B on small paged decode calls
  cp build/rev_tc.so build/libflashattn_cuda_test.so
  timeout 150 python3 tests/run_tests.py gpu_paged_decode gpu_paged_prefill gpu_paged_speculative gpu_paged_workspace \
    > $out/test_tc.log 2>&1
  grep -v "^PASS" $out/test_tc.log | tail -6; echo "passed: $(grep -c '^PASS' $out/test_tc.log)"
  timeout 200 python3 bench/bench_decode.py --paged 16,64 --extra main=build/rev_head.so \
    --rows "8,1024,4,128;1,4096,1,128;8,4096,1,128;1,32768,1,128;8,4096,16,128;32,4096,1,128" \
    --out /tmp/tc > $out/tc_ab.log 2>&1
  grep "^|" $out/tc_ab.log;;
f8k128)  # FP8 d = 256 on 128 x 128 tiles (build/rev_f8k128_d256_fp8.so): its tests, then the A/B
  cp build/rev_f8k128_d256_fp8.so build/libflashattn_cuda_test.so
  timeout 150 python3 tests/run_tests.py gpu_fp8_fwd_d256 > $out/test_f8k128.log 2>&1
  grep -v "^PASS" $out/test_f8k128.log | tail -6; echo "passed: $(grep -c '^PASS' $out/test_f8k128.log)"
  cp build/rev_head.so build/libflashattn_cuda_test.so
  timeout 300 python3 bench/bench_fp8.py --speed-only --dims 256 --sizes 2048,4096,16384 --rounds 5 \
    --extra k128=build/rev_f8k128_d256_fp8.so > $out/f8k128_ab.log 2>&1
  grep "^{" $out/f8k128_ab.log;;
cand)  # the candidate tree (build/rev_cand.so, FA_COMMIT its base): FP8 d = 256 on 128 x 128
  # tiles, the producer as a warp, FP8's 24 / 240 registers; tests, then the FP8 A/B
  cp build/rev_cand.so build/libflashattn_cuda_test.so
  for g in gpu_fp8 gpu_fwd gpu_varlen gpu_paged_prefill; do
    timeout 110 python3 tests/run_tests.py $g > $out/test_$g.log 2>&1
    echo "$g: rc $? passed $(grep -c '^PASS' $out/test_$g.log) failed $(grep -c '^FAIL' $out/test_$g.log)"
    grep "^FAIL" $out/test_$g.log | head -3
  done
  cp build/rev_head.so build/libflashattn_cuda_test.so
  timeout 170 python3 bench/bench_fp8.py --speed-only --dims 256,128 --sizes 4096,16384 --rounds 3 \
    --extra cand=build/rev_cand.so > $out/cand_fp8.log 2>&1
  grep "^{\|Error\|error" $out/cand_fp8.log;;
candfull)  # before landing the candidate: every GPU test on it (~6 min)
  cp build/rev_cand.so build/libflashattn_cuda_test.so
  timeout 560 python3 tests/run_tests.py gpu > $out/test_candfull.log 2>&1
  echo "rc $? passed $(grep -c '^PASS' $out/test_candfull.log) failed $(grep -c '^FAIL' $out/test_candfull.log)"
  grep "^FAIL" $out/test_candfull.log | head -5;;
decode)
  cp build/rev_head.so build/libflashattn_cuda_test.so
  timeout 500 python3 bench/bench_decode.py --paged 16,64 --out $out/decode > $out/decode.log 2>&1
  echo "decode rc=$? rows: $(grep -c '^| [0-9]' $out/decode.log)";;
varlen)
  cp build/rev_head.so build/libflashattn_cuda_test.so
  timeout 300 python3 bench/bench_varlen.py --out $out/varlen > $out/varlen.log 2>&1
  echo "varlen rc=$?"; grep "^| " $out/varlen.log;;
fp8prof)  # what holds the FP8 step (DESIGN.md, FP8): its SASS and a per-line profile
  cp build/rev_head.so build/libflashattn_cuda_test.so
  # the kernels are static (internal names): every function's SASS, kept for these two
  # (cuobjdump is also on PyPI: nvidia-cuda-cuobjdump, for SASS without a GPU)
  cuobjdump -sass build/rev_head.so | awk '/Function :/ { p = /e4m3_d128_t[01]/ } p' \
    | gzip > $out/fp8_d128.sass.gz
  timeout 400 ncu --section SourceCounters --section WarpStateStats -k regex:e4m3_d128_t0 -c 1 \
    -o $out/fp8_t0 python3 bench/profile_gpu.py --dtype fp8 --d 128 --n 16384 \
    --lib libflashattn_cuda_test.so > $out/ncu.log 2>&1
  ncu -i $out/fp8_t0.ncu-rep -k regex:e4m3_d128_t0 --page source --csv --print-source sass \
    > $out/fp8_t0_lines.csv && gzip $out/fp8_t0_lines.csv
  tail -3 $out/ncu.log;;
*) echo "PART=pg256, tc, decode, varlen or fp8prof"; exit 1;;
esac
echo "all: $((SECONDS - t0)) s"
