"""The key-step loop of a kernel in SASS, block by block, without a GPU (a
reading aid, never a benchmark): the innermost loop that issues wgmma
(HGMMA / QGMMA) and at least MIN_EXPS MUFU.EX2, each basic block with its
instruction count, its commonest opcodes and its last instruction, so that
the path a step takes (unmasked, no softcap, no rescale: which blocks it
skips reads off the branches) can be summed by hand.

Usage: python3 bench/sass_blocks.py LIB.so KERNEL_SUBSTRING [MIN_EXPS]
e.g.   python3 bench/sass_blocks.py build/libflashattn_cuda_test.so e4m3_d128_t0 64
cuobjdump must be on PATH; without a CUDA toolkit's, the PyPI wheel
nvidia-cuda-cuobjdump carries one (unzip it: nvidia/cu13/bin/cuobjdump)."""
import collections
import re
import subprocess
import sys

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA(?:\.[A-Z]+)*\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)")


def kernel_sass(lib, name):
    """(address, text) of each instruction of the first function whose name
    holds `name` (FA3 kernels are static: their names carry no prefix)."""
    out = subprocess.run(["cuobjdump", "-sass", lib], capture_output=True, text=True,
                         check=True).stdout
    ins, inside = [], False
    for line in out.splitlines():
        if "Function :" in line:
            if inside:
                break
            inside = name in line
        elif inside:
            m = INSTR.match(line)
            if m:
                ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def opcode(text):
    words = text.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def main():
    lib, name = sys.argv[1], sys.argv[2]
    min_exps = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    ins = kernel_sass(lib, name)
    if not ins:
        raise SystemExit(f"no function with {name!r} in {lib}")
    at = {a: i for i, (a, _) in enumerate(ins)}
    loops = []  # (first, last) index of each backward branch's span
    for i, (a, text) in enumerate(ins):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            loops.append((at[int(m.group(1), 16)], i))

    def holds(span, word):
        return sum(word in ins[k][1] for k in range(span[0], span[1] + 1))

    steps = [s for s in loops if holds(s, "GMMA") and holds(s, "MUFU.EX2") >= min_exps]
    if not steps:
        raise SystemExit("no loop with wgmma and that many exps")
    first, last = min(steps, key=lambda s: s[1] - s[0])
    leaders = {first, last + 1}
    for k in range(first, last + 1):
        m = BRANCH.search(ins[k][1])
        if m:
            leaders.add(k + 1)
            target = at.get(int(m.group(1), 16))
            if target is not None and first <= target <= last:
                leaders.add(target)
    starts = sorted(x for x in leaders if x <= last + 1)
    print(f"{name}: step loop {ins[first][0]:#x}-{ins[last][0]:#x}, {last - first + 1} instructions"
          f" on all its paths, {holds((first, last), 'MUFU.EX2')} MUFU.EX2")
    for b, e in zip(starts, starts[1:]):
        ops = collections.Counter(opcode(ins[k][1]) for k in range(b, e))
        top = ", ".join(f"{op} {n}" for op, n in ops.most_common(5))
        print(f"{ins[b][0]:#8x} {e - b:5d}  {top:<60} | {ins[e - 1][1][:70]}")


if __name__ == "__main__":
    main()
