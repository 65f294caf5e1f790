#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, demo, then the benchmark.
# Logs go to $OUT (the device tool's folder) or /tmp/flashattn-device.
# Usage: [TEST_PART=k/n] [TOOL=memcheck|...] [EXCLUDE=regex] bash bench/device_run.sh
#        [tests|bench|fp8|varlen|paged|ring|sanitize|all] [bench args...]
set -uo pipefail
out=${OUT:-/tmp/flashattn-device}
mkdir -p "$out"
what=${1:-all}
shift || true
export PYTHONUNBUFFERED=1
# Run `git rev-parse --short HEAD` here and pass it: the copy on the device has no .git.
export FA_COMMIT=${FA_COMMIT:-unknown}
nvidia-smi --query-gpu=name,compute_cap,clocks.sm,clocks.max.sm,power.draw --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
# NO_BUILD=1: the libraries came built (carried); only the CPU ones are made here.
# The varlen and paged modes build the default test library alone (and the
# A/B shims of build/rev/main and build/rev/vl where staged: rev_variant.sh).
cpu_libs=$(make -s -p -n 2>/dev/null | sed -n 's/^CPU_LIBS := //p' | head -1)
targets="all bench-libs"
[ "$what" = varlen ] || [ "$what" = paged ] && targets="build/libflashattn_cuda_test.so $cpu_libs"
[ -n "${NO_BUILD:-}" ] && targets=$cpu_libs
if [ "$what" = varlen ] || [ "$what" = paged ] && [ -d build/rev/main ] && [ -d build/rev/vl ]; then
    # (shims already there are kept: built here and carried, or a warm machine's)
    for n in main vl; do
        for d in 128 $([ "$what" = paged ] && echo 256); do  # paged: the tile of 256 too
            [ -f "build/rev_${n}_d$d.so" ] && continue
            bash bench/rev_variant.sh build $n $d >"$out/rev_${n}_$d.log" 2>&1 &
        done
    done
fi
if ! make -j14 $targets >"$out/build.log" 2>&1; then tail -40 "$out/build.log"; exit 1; fi
wait
# The GPU suite outlasts one call: TEST_PART=k/n takes the k-th of n slices
# of its names (chunks of CHUNK names a process, each bounded by CHUNK_S
# seconds); $1 is the command a chunk runs under (empty: none), $2 the log.
gpu_slices() {
    local runner=$1 log=$2 part=${TEST_PART:-1/1} total k n first last chunk t0 rc
    # EXCLUDE: names left out (e.g. the 2-minute fuzz under a sanitizer)
    python3 tests/run_tests.py --list gpu_ | grep '^gpu_' | grep -v -E "${EXCLUDE:-^$}" >"$out/names.txt"
    total=$(wc -l <"$out/names.txt")
    k=${part%/*} n=${part#*/}
    first=$(( (k - 1) * total / n + 1 )) last=$(( k * total / n ))
    sed -n "${first},${last}p" "$out/names.txt" | split -l "${CHUNK:-30}" - "$out/chunk."
    t0=$SECONDS
    for chunk in "$out"/chunk.*; do
        timeout "${CHUNK_S:-240}" $runner python3 tests/run_tests.py "@$chunk" >>"$log" 2>&1 ||
            { rc=$?; echo "chunk $(basename "$chunk") ($(head -1 "$chunk") ...): exit $rc" >>"$log"; }
    done
    rm -f "$out"/chunk.* "$out/names.txt"
    grep -v "^PASS\|^random seed" "$log" | tail -60
    echo "GPU tests $part (names $first-$last of $total, $(( SECONDS - t0 )) s): $(grep -c '^PASS' \
        "$log") passed, $(grep -c '^FAIL' "$log") failed, $(grep -c '^SKIP' "$log") skipped"
}
if [ "$what" = tests ] || [ "$what" = all ]; then
    gpu_slices "" "$out/test_gpu.log"
    part=${TEST_PART:-1/1}
    [ "${part%/*}" = 1 ] && [ -x build/gpu_attention ] && ./build/gpu_attention | tee "$out/demo.log"
fi
if [ "$what" = fp8 ]; then  # the FP8 tests, then the FP8 benchmark (args: bench_fp8.py's)
    for prefix in fp8 gpu_fp8; do
        timeout 200 python3 tests/run_tests.py $prefix >"$out/test_$prefix.log" 2>&1
        grep -v "^PASS" "$out/test_$prefix.log" | tail -40
    done
    timeout 300 python3 bench/bench_fp8.py --out "$out" "$@" 2>&1 | tail -60
fi
if [ "$what" = varlen ]; then
    # the ragged-batch GPU tests, bench_varlen.py, then (shims staged) the
    # dense FA3 forward and backward and the FP8 quantizer beside main's
    timeout 240 python3 tests/run_tests.py gpu_varlen gpu_graph gpu_fp8_quantize gpu_bwd_shape \
        gpu_bwd_causal >"$out/test_varlen.log" 2>&1
    grep -v "^PASS" "$out/test_varlen.log" | tail -40
    timeout 120 python3 bench/bench_varlen.py --out "$out" 2>&1 | tail -6
    if [ -f build/rev_main_d128.so ] && [ -f build/rev_vl_d128.so ]; then
        ab="main=build/rev_main_d128.so vl=build/rev_vl_d128.so"
        timeout 60 python3 bench/ab_gpu.py "128,8192,0;128,4096,1" $ab 2>&1 | tail -4
        timeout 80 python3 bench/ab_gpu.py --bwd "128,8192,0;128,2048,0;128,4096,1" $ab 2>&1 | tail -4
        timeout 60 python3 bench/ab_quantize.py $ab 2>&1 | tail -9
    fi
fi
if [ "$what" = paged ]; then
    # the paged, varlen, quantizer and head-dim GPU tests, then prefill
    # chunks and decode over pages of 64, 128, 256 beside contiguous K/V (and beside
    # main's build where staged: its dense and paged columns), then main's
    # FA3 forward (tiles of 128 and 256) and quantizer beside vl's
    # PAGED_PART=tests or bench: that half alone (the whole outlasts a call
    # when the shims build too; run bench second, on the warm machine, NO_BUILD=1)
    if [ "${PAGED_PART:-}" != bench ]; then
        timeout 240 python3 tests/run_tests.py gpu_paged gpu_varlen gpu_fp8_quantize \
            gpu_fwd_head_dim_v gpu_fwd_between >"$out/test_paged.log" 2>&1
        grep -v "^PASS" "$out/test_paged.log" | tail -40
    fi
    [ "${PAGED_PART:-}" = tests ] && exit 0
    extra=; [ -f build/rev_main_d128.so ] && extra="--extra main=build/rev_main_d128.so"
    timeout 240 python3 bench/bench_decode.py --paged 64,128,256 $extra --out "$out" \
        --rows "1,8192,512,128;4,16384,2048,128;1,32768,1024,128;1,131072,1,128;1,32768,16,128;8,32768,16,128" \
        2>&1 | tail -10
    [ -f build/rev_vl_d128.so ] && timeout 80 python3 bench/ab_gpu.py \
        "128,8192,0;128,4096,1;128,1024,0" main=build/rev_main_d128.so vl=build/rev_vl_d128.so \
        2>&1 | tail -4
    [ -f build/rev_vl_d256.so ] && timeout 90 python3 bench/ab_gpu.py \
        "192/128,4096,0;192/128,8192,1;160,8192,0;256,8192,0" main=build/rev_main_d256.so \
        vl=build/rev_vl_d256.so 2>&1 | tail -4
    [ -f build/rev_vl_d128.so ] && timeout 60 python3 bench/ab_quantize.py \
        main=build/rev_main_d128.so vl=build/rev_vl_d128.so 2>&1 | tail -9
fi
if [ "$what" = ring ]; then  # the ring example, a rank per GPU here (args: sequence lengths)
    cmd=$(head -1 examples/ring_attention.cu | sed 's|^/\* Build: ||; s| \*/$||; s|-o ring_attention|-o build/ring_attention|')
    if ! eval "$cmd" >"$out/ring_build.log" 2>&1; then tail -20 "$out/ring_build.log"; exit 1; fi
    for n in ${@:-32768 131072}; do
        for causal in 1 0; do ./build/ring_attention "$n" "$causal" | tee -a "$out/ring.log"; done
    done
fi
if [ "$what" = sanitize ]; then
    # TOOL=memcheck|racecheck|synccheck|initcheck: the GPU suite's slice
    # under that compute-sanitizer tool (a chunk that reports an error
    # exits 1, listed in the log); without TOOL, `make sanitize` (gpu_small
    # under the first three).
    if [ "${TOOL:-}" = initcheck ]; then
        # initcheck checks a copy that follows a kernel in a CUDA graph before
        # it accounts for the kernel's writes (bench/log/initcheck_graph_probe.cu,
        # a plain kernel): the graph tests run without its check of API copies
        # (the kernels' own reads still checked), in the first slice
        sanitizer="compute-sanitizer --tool initcheck --error-exitcode 1 --print-limit 20"
        EXCLUDE="${EXCLUDE:+$EXCLUDE|}graph_capture" gpu_slices "$sanitizer" "$out/sanitize_initcheck.log"
        part=${TEST_PART:-1/1}
        if [ "${part%/*}" = 1 ]; then
            python3 tests/run_tests.py --list gpu_ | grep graph_capture >"$out/graph_names.txt"
            timeout "${CHUNK_S:-240}" $sanitizer --check-api-memory-access no \
                python3 tests/run_tests.py "@$out/graph_names.txt" >"$out/sanitize_graph.log" 2>&1
            echo "graph tests under initcheck (no API copy check): exit $?, $(grep -c '^PASS' \
                "$out/sanitize_graph.log") passed"
        fi
    elif [ -n "${TOOL:-}" ]; then
        gpu_slices "compute-sanitizer --tool $TOOL --error-exitcode 1 --print-limit 20" \
            "$out/sanitize_$TOOL.log"
    else
        make sanitize >"$out/sanitize.log" 2>&1; echo "sanitize exit $?"; tail -30 "$out/sanitize.log"
    fi
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    python3 bench/bench_gpu.py --out "$out" "$@" 2>&1 | tail -80
fi
