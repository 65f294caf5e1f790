"""CPU benchmark (`make bench-cpu`): flashattn's fp32 FA2-order forward against
NumPy's BLAS-backed materialized attention (S = QK^T, softmax, PV) on the same
cores. Each measurement runs in a fresh process so its peak resident memory
(above the inputs) can be read. Writes bench/results_cpu.md.

Usage: python3 bench/bench_cpu.py [--quick]
"""
import datetime
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import ctypes, json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import fa
which, n, d, heads, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng = np.random.default_rng(n * 1000 + d)
q, k, v = (rng.standard_normal((1, n, heads, d)).astype(np.float32) for _ in range(3))
o = np.empty_like(q)
scale = np.float32(1.0 / np.sqrt(d))

def run_numpy():
    for h in range(heads):
        s = q[0, :, h] @ k[0, :, h].T
        s *= scale
        s -= s.max(axis=1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=1, keepdims=True)
        o[0, :, h] = s @ v[0, :, h]

p = fa.Params()
p.dtype, p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, p.head_dim = 0, 1, heads, n, n, d
p.q, p.k, p.v, p.o = q.ctypes.data, k.ctypes.data, v.ctypes.data, o.ctypes.data
opts = fa.CpuOptions(threads, 0)

def run_flashattn():
    assert fa.CPU.fa_cpu_forward(ctypes.byref(p), ctypes.byref(opts)) == 0

fn = run_numpy if which == "numpy" else run_flashattn
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
fn()  # warm-up; also the peak-memory run
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
times = []
reps = 3 if n <= 4096 else 1
for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
print(json.dumps({"seconds": sorted(times)[len(times) // 2], "peak_mib": peak_kib / 1024}))
"""


def measure(which, n, d, heads, threads):
    out = subprocess.run([sys.executable, "-c", CHILD, os.path.join(ROOT, "tests"), which,
                          str(n), str(d), str(heads), str(threads)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    quick = "--quick" in sys.argv
    threads = os.cpu_count() or 1
    heads = 2
    sizes = [1024, 2048] if quick else [1024, 2048, 4096, 8192, 16384]
    rows = []
    header = ("| d | N | flashattn GFLOP/s | NumPy GFLOP/s | ratio | flashattn extra MiB |"
              " NumPy extra MiB |")
    print(header)
    for d in (64, 128):
        for n in sizes:
            flops = 4.0 * heads * n * n * d
            ours, theirs = measure("flashattn", n, d, heads, threads), measure("numpy", n, d,
                                                                                heads, threads)
            row = (d, n, flops / ours["seconds"] / 1e9, flops / theirs["seconds"] / 1e9,
                   theirs["seconds"] / ours["seconds"], ours["peak_mib"], theirs["peak_mib"])
            rows.append(row)
            print("| %d | %d | %.1f | %.1f | %.2f | %.1f | %.1f |" % row, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip() or "uncommitted"
    lines = [
        "# CPU forward benchmark",
        "",
        f"- date: {datetime.date.today()}",
        f"- CPU: {cpu_name()}, {threads} threads; NumPy {__import__('numpy').__version__}",
        f"- commit: {commit}",
        f"- shape: B=1, H={heads}, Nq=Nk=N, fp32, non-causal; FLOPs = 4·H·N²·d",
        "- extra MiB: peak resident memory of the call above the inputs (fresh process)",
        "- command: `make bench-cpu`",
        "",
        header,
        "|---|---|---|---|---|---|---|",
    ] + ["| %d | %d | %.1f | %.1f | %.2f | %.1f | %.1f |" % r for r in rows]
    if not quick:
        with open(os.path.join(HERE, "results_cpu.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
