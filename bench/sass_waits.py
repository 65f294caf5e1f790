"""Where ptxas put the FA3 forward's softmax relative to its wgmma waits (a
profiling aid for bench/NOTES.md, never a test).

The key loop issues S(n) with PV(n - 1), waits for S(n) (`wgmma.wait_group 1`),
runs the softmax of tile n, then waits for PV(n - 1) (`wgmma.wait_group 0`).
The softmax overlaps PV(n - 1) only if its exps (MUFU.EX2) stay above that
second wait in the SASS; ptxas may sink them below it. For each FA3 forward
kernel this prints, for every `WARPGROUP.DEPBAR.LE`, the MUFU.EX2 in the 80
instructions above it and in the straight-line code below it (up to the next
branch), and exits 1 if the loop's wait is followed by exps (as it is, by
choice, at d = 64 and 128: FA_I_SM90_PIN_SOFTMAX_<d>, bench/NOTES.md f21).

Usage: python3 bench/sass_waits.py build/libflashattn_cuda_test.so
cuobjdump comes from $CUOBJDUMP, else PATH (the CUDA Toolkit has it; on a
machine without it, the `nvidia-cuda-cuobjdump` wheel holds the binary)."""
import os
import re
import subprocess
import sys


def kernels(lib):
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    sass = subprocess.run([tool, "-sass", lib], capture_output=True, text=True, check=True).stdout
    name, found = None, {}
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            found[name] = []
            continue
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m and name:
            found[name].append(m.group(1))
    return {k: v for k, v in found.items() if "fwd_sm90" in k}


def main():
    late = 0
    for name, ops in sorted(kernels(sys.argv[1]).items()):
        waits = [i for i, op in enumerate(ops) if op.startswith("WARPGROUP.DEPBAR.LE")]
        report, sunk = [], False
        for w in waits:
            above = sum("MUFU.EX2" in op for op in ops[max(0, w - 80):w])
            below = 0
            for op in ops[w + 1:]:
                if re.search(r"\bBRA\b", op):
                    break
                below += "MUFU.EX2" in op
            report.append(f"{ops[w].split()[-1]} ex2 above {above} below {below}")
            # the loop's wait for PV(n - 1): a wait for 0 that follows the wait for 1
            if ops[w].endswith("0x0") and any(ops[v].endswith("0x1") for v in waits if v < w):
                sunk = sunk or below > 0
        late += sunk
        print(f"{name}: " + "; ".join(report))
    print(f"{late} kernel(s) with exps below the wait for PV(n - 1)" if late else
          "every kernel's exps are above the wait for PV(n - 1)")
    sys.exit(1 if late else 0)


if __name__ == "__main__":
    main()
