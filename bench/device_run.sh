#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, demo, then the benchmark.
# Logs go to $OUT (the device tool's folder) or /tmp/flashattn-device.
# Usage: [TEST_PART=k/n] bash bench/device_run.sh [tests|bench|fp8|ring|sanitize|all] [bench args...]
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
if ! make -j16 all bench-libs >"$out/build.log" 2>&1; then tail -40 "$out/build.log"; exit 1; fi
if [ "$what" = tests ] || [ "$what" = all ]; then
    # The GPU suite outlasts one call: TEST_PART=k/n runs the k-th of n
    # slices of its names, 30 names a process, each process bounded.
    part=${TEST_PART:-1/1}
    python3 tests/run_tests.py --list gpu_ | grep '^gpu_' >"$out/names.txt"
    total=$(wc -l <"$out/names.txt")
    k=${part%/*} n=${part#*/}
    first=$(( (k - 1) * total / n + 1 )) last=$(( k * total / n ))
    sed -n "${first},${last}p" "$out/names.txt" | split -l 30 - "$out/chunk."
    for chunk in "$out"/chunk.*; do
        timeout 240 python3 tests/run_tests.py "@$chunk" >>"$out/test_gpu.log" 2>&1 ||
            echo "chunk $(basename "$chunk"): exit $?" >>"$out/test_gpu.log"
    done
    rm -f "$out"/chunk.* "$out/names.txt"
    grep -v "^PASS\|^random seed" "$out/test_gpu.log" | tail -60
    echo "GPU tests $part: $(grep -c '^PASS' "$out/test_gpu.log") passed, $(grep -c '^FAIL' \
        "$out/test_gpu.log") failed, $(grep -c '^SKIP' "$out/test_gpu.log") skipped"
    [ "$k" = 1 ] && ./build/gpu_attention | tee "$out/demo.log"
fi
if [ "$what" = fp8 ]; then  # the FP8 tests, then the FP8 benchmark (args: bench_fp8.py's)
    for prefix in fp8 gpu_fp8; do
        timeout 200 python3 tests/run_tests.py $prefix >"$out/test_$prefix.log" 2>&1
        grep -v "^PASS" "$out/test_$prefix.log" | tail -40
    done
    timeout 300 python3 bench/bench_fp8.py --out "$out" "$@" 2>&1 | tail -60
fi
if [ "$what" = ring ]; then  # the ring example, a rank per GPU here (args: sequence lengths)
    cmd=$(head -1 examples/ring_attention.cu | sed 's|^/\* Build: ||; s| \*/$||; s|-o ring_attention|-o build/ring_attention|')
    if ! eval "$cmd" >"$out/ring_build.log" 2>&1; then tail -20 "$out/ring_build.log"; exit 1; fi
    for n in ${@:-32768 131072}; do
        for causal in 1 0; do ./build/ring_attention "$n" "$causal" | tee -a "$out/ring.log"; done
    done
fi
if [ "$what" = sanitize ]; then
    make sanitize >"$out/sanitize.log" 2>&1; echo "sanitize exit $?"; tail -30 "$out/sanitize.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    python3 bench/bench_gpu.py --out "$out" "$@" 2>&1 | tail -80
fi
