"""Clock trace of the FA3 forward's consumer warpgroups, tile by tile (a
profiling aid for bench/NOTES.md, never a test or a benchmark).

`build` copies the headers to build/trace/, adds clock reads (%clock64) at
fixed points of the sm_90a forward's consumer loop, each stored by thread 0
of each consumer warpgroup into a device array, and compiles a shim of
tests/shim_cuda.cu for one head dim (bf16). `run` times each given build
(CUDA events), traces one forward and prints, per build, the median cycles
of each part of a tile and a fit of a tile's cycles against its key steps:
the intercept is what a tile costs besides its steps. The clock reads cost
2 - 5% of the run time; compare traced builds with traced builds.

Usage:
  python3 bench/fa3_trace.py build D OUT.so [extra nvcc flags]
  python3 bench/fa3_trace.py run "d,n,causal;..." NAME=lib.so ...
Shapes as in the sweep (B = 16384 / n, H = 2048 / d, bf16); with
FA_TRACE_DUMP=DIR, `run` also saves each raw trace there (.npy, [CTA,
warpgroup, tile, slot]). `build` needs
the headers as on main; where an anchor no longer matches, it says which."""
import ctypes
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TILES, SLOTS, CTAS, WGS = 48, 16, 132, 3  # traced tiles per CTA (the last row holds CTA times)

# The parts of a tile, between the clock reads (slot numbers as in PROBES).
PARTS = [("top_to_q", 11, 1), ("spans", 11, 0), ("first", 1, 2), ("loop", 2, 3),
         ("v_wait", 3, 8), ("pv+lse", 8, 9), ("coords", 9, 10), ("pv_wait", 10, 4),
         ("st_wait", 4, 5), ("epilogue", 5, 6)]

TR = """
#ifndef FA_TR_DEF
#define FA_TR_DEF
#define FA_TR_AT(kk, slot) fa_trace[(((size_t)blockIdx.x * %d + cw) * %d + (kk)) * %d + (slot)]
#define FA_TR(slot) do { if (t == 0 && k < %d) FA_TR_AT(k, slot) = fa_tr_clk(); } while (0)
static __device__ __forceinline__ unsigned long long fa_tr_clk(void)
{ unsigned long long c; asm volatile("mov.u64 %%0, %%%%clock64;" : "=l"(c) :: "memory"); return c; }
static __device__ __forceinline__ unsigned long long fa_tr_ns(void)
{ unsigned long long c; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(c) :: "memory"); return c; }
#endif
""" % (WGS, TILES, SLOTS, TILES - 1)

# (anchor, text put before it, text put after it); an anchor found once in
# the header, a leading newline only to tell it from a deeper-indented line
PROBES = [
    ("static __global__ void __launch_bounds__(128 * (FA_I_CFG(FA_I_SM90_CFG, FA_I_FIRST) / 64 + 1), 1)\n"
     "    FA_I_SNAME(fwd_sm90)", TR, ""),
    ("\n        have = fa_i_sm90_tile(&p, 0, blocks_m, &mb, &h, &b);\n",
     "        if (t == 0) { FA_TR_AT(%d, 0) = fa_tr_ns(); FA_TR_AT(%d, 2) = fa_tr_clk(); }\n"
     % (TILES - 1, TILES - 1), ""),
    ("        if (PINGPONG && cw == 0) fa_i_named_sync(1, 256);",
     "        if (t == 0) { FA_TR_AT(%d, 1) = fa_tr_ns(); FA_TR_AT(%d, 3) = fa_tr_clk(); }\n"
     % (TILES - 1, TILES - 1), ""),
    ("            const int h_now = h, b_now = b;\n", "", "            FA_TR(11);\n"),
    ("            last_stage = FA_I_STAGE(n_end - 1); /* used only where the tile saw keys */\n", "",
     "            FA_TR(0);\n            if (t == 0 && k < %d) FA_TR_AT(k, 7) = n_end - n_first;\n"
     % (TILES - 1)),
    ("            fa_i_mbar_wait(q_full + 8 * qb, (uint32_t)((k / Q_BUFS) & 1));\n", "",
     "            FA_TR(1);\n"),
    ("                FA_I_SM90_SCORES(n_first);\n", "", "                FA_TR(2);\n"),
    ("                fa_i_mbar_wait(v_full + 8 * last_stage, FA_I_PARITY(n_end - 1));\n",
     "                FA_TR(3);\n", "                FA_TR(8);\n"),
    ("\n            have = fa_i_sm90_tile(&p, k + 1, blocks_m, &mb, &h, &b);\n",
     "            FA_TR(9);\n", "            FA_TR(10);\n"),
    ("            if (n_first < n_end && lane == 0) fa_i_mbar_arrive(v_empty + 8 * last_stage);\n", "",
     "            FA_TR(4);\n"),
    ("                fa_i_named_sync(1 + NC + cw, 128);\n            }\n", "", "            FA_TR(5);\n"),
    ("                    fa_i_tma_store_commit();\n", "", "                    FA_TR(6);\n"),
]

SHIM = """__device__ unsigned long long fa_trace[%d];
#include "shim_cuda.cu"
extern "C" int fa_trace_get(void *dst)
{
    return (int)cudaMemcpyFromSymbol(dst, fa_trace, sizeof fa_trace);
}
extern "C" int fa_trace_reset(void)
{
    static unsigned long long zero[%d];
    return (int)cudaMemcpyToSymbol(fa_trace, zero, sizeof zero);
}
""" % ((CTAS * WGS * TILES * SLOTS,) * 2)


def build(d, out, flags):
    src = os.path.join(ROOT, "build", "trace")
    os.makedirs(os.path.join(src, "tests"), exist_ok=True)
    text = open(os.path.join(ROOT, "flashattn_cuda.cuh")).read()
    for anchor, before, after in PROBES:
        if text.count(anchor) != 1:
            sys.exit(f"fa3_trace: anchor found {text.count(anchor)} times, not once: {anchor!r}")
        lead = 1 if anchor.startswith("\n") else 0
        text = text.replace(anchor, anchor[:lead] + before + anchor[lead:] + after)
    open(os.path.join(src, "flashattn_cuda.cuh"), "w").write(text)
    shutil.copy(os.path.join(ROOT, "flashattn.h"), src)
    shutil.copy(os.path.join(ROOT, "tests", "shim_cuda.cu"), os.path.join(src, "tests"))
    open(os.path.join(src, "tests", "trace_shim.cu"), "w").write(SHIM)
    cmd = ["nvcc", "-O3", "-Xcompiler", "-fPIC", "-gencode=arch=compute_90a,code=sm_90a",
           f"-DFA_HEAD_DIM={d}", "-DFA_CUDA_DTYPE=2", "-shared", "-o", out,
           os.path.join(src, "tests", "trace_shim.cu")] + flags
    subprocess.run(cmd, check=True)


def report(np, buf, wgs):
    """Lines of medians and the fit, from a [CTAS, WGS, TILES, SLOTS] trace."""
    cta = buf[:, :wgs, TILES - 1, :]
    span_us = (cta[:, :, 1].max() - cta[:, :, 0].min()) / 1e3
    mhz = ((cta[:, 0, 3] - cta[:, 0, 2]) / (cta[:, 0, 1] - cta[:, 0, 0])).mean() * 1e3
    rows = []
    for c in range(CTAS):
        for w in range(wgs):
            for k in range(TILES - 1):
                s = buf[c, w, k]
                if s[0] == 0:
                    continue
                nxt = buf[c, w, k + 1, 11] if buf[c, w, k + 1, 0] else cta[c, w, 3]
                rows.append([s[7], nxt - s[11], nxt - s[6]] + [s[b] - s[a] for _, a, b in PARTS])
    r = np.array(rows, dtype=np.float64)
    fit = np.linalg.lstsq(np.stack([np.ones(len(r)), r[:, 0]], 1), r[:, 1], rcond=None)[0]
    several = r[r[:, 0] >= 2]
    per_step = np.median(several[:, 6] / (several[:, 0] - 1))
    names = ["tile", "to_next"] + [n for n, _, _ in PARTS]
    return (f"kernel {span_us:.1f} us at {mhz:.0f} MHz; a tile = {fit[0]:.0f} + {fit[1]:.0f} x key steps "
            f"cycles (loop: {per_step:.0f} a step); medians: "
            + ", ".join(f"{n} {np.median(r[:, 1 + i]):.0f}" for i, n in enumerate(names)))


def run(configs, specs):
    import numpy as np
    import torch
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import bench_gpu as bg
    import fa
    libs = [(s.split("=")[0], fa.load_gpu(os.path.abspath(s.split("=")[1]))) for s in specs]
    for d, n, causal in configs:
        b, h = max(1, 16384 // n), 2048 // d
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
        lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
        ref = bg.peer(bg.SDPBackend.FLASH_ATTENTION, q, k, v, dout, bool(causal))[2].float()
        print(f"d{d} N{n} causal{causal}", flush=True)
        for name, lib in libs:
            impl = bg.Ours(q, k, v, o, lse, dout, dq, dk, dv, bool(causal), lib)
            o.fill_(float("nan"))
            impl.forward()
            torch.cuda.synchronize()
            err = ((o.float() - ref).norm() / ref.norm()).item()
            line = f"  {name}: error {err:.1e}, {bg.median_ms(impl.forward, 30, 0.1):.4f} ms"
            if hasattr(lib, "fa_trace_get"):
                lib.fa_trace_reset()
                impl.forward()
                torch.cuda.synchronize()
                buf = np.zeros(CTAS * WGS * TILES * SLOTS, dtype=np.uint64)
                assert lib.fa_trace_get(ctypes.c_void_p(buf.ctypes.data)) == 0
                buf = buf.reshape(CTAS, WGS, TILES, SLOTS).astype(np.int64)
                if os.environ.get("FA_TRACE_DUMP"):  # the raw clocks, for offline analysis
                    np.save(os.path.join(os.environ["FA_TRACE_DUMP"], f"{name}_d{d}_n{n}_c{causal}.npy"), buf)
                wgs = int((buf[:, :, TILES - 1, 0] != 0).sum(1).max())
                line += "; " + report(np, buf, wgs)
            print(line, flush=True)


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "build":
        build(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "run":
        run([tuple(int(x) for x in c.split(",")) for c in sys.argv[2].split(";")], sys.argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
