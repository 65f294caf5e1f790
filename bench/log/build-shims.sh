#!/bin/bash
# Builds the CUDA test shims next-device-call.sh carries, each from HEAD with
# its patches applied in a scratch worktree (~2.5 min a shim on 2 cores):
#   build/rev_head.so   HEAD
#   build/rev_cand.so   + wip-fp8-d256-k128.patch
#   build/rev_pg256.so  + wip-paged-d256-t1.patch (and build/pg256_test_paged.py)
#   build/rev_tc.so     + wip-paged-d256-t1.patch + wip-paged-one-table-copy.patch
# Usage: bash bench/log/build-shims.sh [NAME ...]   (default: all four)
# A patch that no longer applies (it landed, or HEAD moved under it) stops
# the script: drop it from the list above.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p build
log=bench/log
declare -A patches=(
    [head]=""
    [cand]="$log/wip-fp8-d256-k128.patch"
    [pg256]="$log/wip-paged-d256-t1.patch"
    [tc]="$log/wip-paged-d256-t1.patch $log/wip-paged-one-table-copy.patch"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(head cand pg256 tc)
for name in "${names[@]}"; do
    tree=$(mktemp -d)
    git worktree add -q --detach "$tree" HEAD
    for patch in ${patches[$name]}; do git -C "$tree" apply "$PWD/$patch"; done
    [ "$name" = pg256 ] && cp "$tree/tests/test_paged.py" build/pg256_test_paged.py
    nvcc -O3 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Xptxas --split-compile=0 \
        -shared -o "build/rev_$name.so" "$tree/tests/shim_cuda.cu"
    git worktree remove --force "$tree"
    echo "build/rev_$name.so from $(git rev-parse --short HEAD) ${patches[$name]}"
done
