"""Build-time benchmark (`make bench-build`): wall seconds of the builds a
user runs, on this machine, one at a time. Writes bench/results_build.md.

  default       examples/gpu_attention.cu as its first line says: one unit,
                every head dim and dtype, sm_80 and sm_90a
  default split `make -j<cpus> cuda-lib`: the same kernels over a host unit
                and one kernel unit per head dim, in parallel
  one           one configuration (d = 128, bf16, sm_90a), one unit
  one split     the same as `make -j<cpus> cuda-lib` units
  cpu           examples/cpu_attention.c
"""
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GPU_CMD = ["nvcc", "-O3", "-gencode=arch=compute_80,code=sm_80",
           "-gencode=arch=compute_90a,code=sm_90a"]


def timed(cmd):
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(" ".join(cmd) + "\n" + run.stderr[-2000:])
    return time.perf_counter() - t0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        jobs = f"-j{os.cpu_count()}"
        one = ["CUDA_LIB_ARCH=-gencode=arch=compute_90a,code=sm_90a", "CUDA_LIB_DIMS=128",
               "CUDA_LIB_FLAGS=-DFA_HEAD_DIM=128 -DFA_CUDA_DTYPE=2"]
        rows = [
            ("default library, one unit (every head dim and dtype, sm_80 + sm_90a)",
             GPU_CMD + ["-o", os.path.join(tmp, "g"), "examples/gpu_attention.cu"]),
            (f"default library, `make {jobs} cuda-lib` (host unit + 7 kernel units)",
             ["make", jobs, "cuda-lib", "BUILD=" + os.path.join(tmp, "b1")]),
            ("one configuration (d = 128, bf16, sm_90a), one unit",
             ["nvcc", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-DFA_HEAD_DIM=128",
              "-DFA_CUDA_DTYPE=2", "-o", os.path.join(tmp, "g1"), "examples/gpu_attention.cu"]),
            (f"one configuration, `make {jobs} cuda-lib` (host unit + 1 kernel unit)",
             ["make", jobs, "cuda-lib", "BUILD=" + os.path.join(tmp, "b2")] + one),
            ("CPU example", ["cc", "-std=c99", "-O3", "-march=native", "-o", os.path.join(tmp, "c"),
                             "examples/cpu_attention.c", "-lm", "-pthread"]),
        ]
        results = [(name, timed(cmd)) for name, cmd in rows]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    cpus = os.cpu_count()
    lines = ["# Build times\n",
             f"{datetime.date.today().isoformat()}, commit {commit}, {platform.processor() or platform.machine()}, "
             f"{cpus} CPUs, nvcc from PATH; one build at a time, wall seconds.\n",
             "| build | seconds |", "|---|---|"]
    lines += [f"| {name} | {sec:.0f} |" for name, sec in results]
    with open(os.path.join(HERE, "results_build.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
