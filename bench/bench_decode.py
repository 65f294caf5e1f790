"""Decode benchmark (part of `make bench`): few query rows against a long K/V
cache, GQA, bf16, the bandwidth that matters: K and V bytes over the time.
flashattn's decode path (GQA-packed rows, split-KV chosen by the library,
its workspace given) side by side with PyTorch SDPA's flash and cuDNN
backends (enable_gqa=True) and FlashAttention-4 where it runs, and a
device-to-device copy of 2 GiB timed beside every row (read + write counted). Every implementation's output is checked against PyTorch's math
backend in fp32 on the same inputs first. Rows whose K/V fit in L2 several
times over rotate through enough input sets to cover 256 MB, so that no run
reads a cache warmed by the one before. Non-causal (SDPA's is_causal aligns
the mask top-left, the library bottom-right); the library's masks are tested
in the test suite.

Writes results_decode.md and .json (in --out, default bench/).
The library also reads the same K/V from paged caches (--paged, page sizes
16, 64 and 256 by default: shuffled pages, fa_params.block_table), timed in
the same rotation: the paged / dense columns, the block table in host
memory; --device-tables PAGE_SIZES (default 64) times those page sizes
again with the tables in device memory (fa_params.tables_on_device, where
the library serves it: Nq <= 16, and on Hopper prefill chunks over pages
the FA3 forward reads in place): the "dev" columns; --ordered PAGE_SIZES
times those page sizes with the pages in order (a sequence's pages
consecutive in the cache, host tables): the page walk's cost apart from the
scattered pages' locality, the "ordered" columns. Rows with Nq > 16 (the
last three by default) are prefill chunks against the cache.

--extra NAME=SHIM times another build's dense and paged decode in the same
rotation (a same-process A/B: the NAME / ours, NAME paged / dense and NAME
paged dev / dense columns);
--split-factors F,... times the dense decode again with the split count
forced to F times the library's choice (fa_params.num_splits; the "xF /
ours" columns: how far the split rule is from a better count); --rows
"B,NK,NQ,D;..." runs those rows alone; --heads HQ,HKV sets the query and kv
heads (default 32,8).

Usage: python3 bench/bench_decode.py [--quick] [--paged PAGE_SIZES] [--device-tables PAGE_SIZES]
           [--ordered PAGE_SIZES] [--extra NAME=SHIM] [--split-factors F,...] [--rows B,NK,NQ,D;...]
           [--heads HQ,HKV] [--out DIR]"""
import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import fa  # noqa: E402
import numpy as np  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import bench_gpu as bg
except ImportError:
    torch = None

try:  # FlashAttention-4 (../shared/peers/README.md stages it for the device)
    from flash_attn.cute import flash_attn_func as fa4_func
except Exception:  # noqa: BLE001 - any import failure means no FA4 column
    fa4_func = None

HQ, HKV = 32, 8
ROTATE_BYTES = 256 << 20
COPY_BYTES = 2 << 30  # the copy timed beside every row: 2 GiB read, 2 GiB written
COPY = None
PAGE_SIZES = []  # --paged
DEVICE_PAGE_SIZES = []  # --device-tables
ORDERED_PAGE_SIZES = []  # --ordered
EXTRA = []  # (name, shim) of --extra builds
SPLIT_FACTORS = []  # --split-factors


class Decode:
    """flashattn's forward on torch tensors [B, N, H, d] with the workspace it
    asks for; with page_size, on a copy of K and V in a paged cache (pages of
    every sequence in a shuffled order, a block table in host memory, or
    with device_tables in device memory; ordered: each sequence's pages
    consecutive)."""

    def __init__(self, q, k, v, o, lib, page_size=0, device_tables=False, ordered=False,
                 num_splits=0):
        self.lib = lib
        p = fa.Params()
        p.num_splits = num_splits
        p.dtype = fa.DTYPES["bf16"]
        p.batch, p.seqlen_q, p.heads_q, p.head_dim = q.shape
        p.seqlen_k, p.heads_kv = k.shape[1], k.shape[2]
        p.q, p.k, p.v, p.o = (t.data_ptr() for t in (q, k, v, o))
        if page_size:
            b, nk = k.shape[:2]
            per = -(-nk // page_size)
            order = (torch.arange(b * per) if ordered else
                     torch.randperm(b * per, generator=torch.Generator().manual_seed(nk)))
            self.caches = []
            for x in (k, v):
                padded = torch.zeros(b, per * page_size, *x.shape[2:], dtype=x.dtype, device=x.device)
                padded[:, :nk] = x
                cache = torch.empty_like(padded).view(b * per, page_size, *x.shape[2:])
                cache[order.to(x.device)] = padded.view(b * per, page_size, *x.shape[2:])
                self.caches.append(cache)
            self.table = order.to(torch.int32).view(b, per).numpy().copy()
            self.lens = np.full(b, nk, np.int32)
            p.k, p.v = (c.data_ptr() for c in self.caches)
            p.block_table, p.max_pages, p.page_size = self.table.ctypes.data, per, page_size
            p.num_pages, p.cache_seqlens = b * per, self.lens.ctypes.data
            if device_tables:
                self.table, self.lens = (torch.from_numpy(x).cuda() for x in (self.table, self.lens))
                p.block_table, p.cache_seqlens = self.table.data_ptr(), self.lens.data_ptr()
                p.tables_on_device = 1
        self.p = p
        self.tensors = (q, k, v, o)  # p holds their addresses
        lib.fa_cuda_forward_workspace_size.restype = ctypes.c_size_t
        size = lib.fa_cuda_forward_workspace_size(ctypes.byref(p))
        self.workspace = torch.empty(max(size, 16), dtype=torch.uint8, device="cuda")
        self.size = size

    def __call__(self):
        status = self.lib.fa_cuda_forward(
            ctypes.byref(self.p), ctypes.c_void_p(self.workspace.data_ptr()),
            ctypes.c_size_t(self.size), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        assert status == fa.FA_OK, self.lib.fa_last_error_detail().decode()


def splits_of(ours, d):
    """The split count the workspace size says the library chose."""
    p = ours.p
    r4 = lambda n: (n + 3) // 4 * 4  # noqa: E731
    per = 4 * (r4(p.batch * p.seqlen_q * p.heads_q * d) + r4(p.batch * p.heads_q * p.seqlen_q))
    return ours.size // per if ours.size else 1


def sdpa(backend, q, k, v):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    try:
        out = run()
    except RuntimeError:  # the backend refuses the shape, or runs out of memory
        torch.cuda.empty_cache()
        return None, None
    return run, out.transpose(1, 2)


def run_row(b, nk, nq, d, reps):
    kv_bytes = 2 * b * nk * HKV * d * 2
    sets = max(1, min(16, -(-ROTATE_BYTES // kv_bytes)))
    inputs = []
    for s in range(sets):
        gen = torch.Generator(device="cuda").manual_seed(1000 * s + nk + nq + d + b)
        q = torch.randn(b, nq, HQ, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, nk, HKV, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(b, nk, HKV, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        inputs.append((q, k, v))
    q, k, v = inputs[0]
    ref = F.scaled_dot_product_attention(*(x[:1].transpose(1, 2).float() for x in (q, k, v)),
                                         enable_gqa=True).transpose(1, 2)
    row = dict(batch=b, nk=nk, nq=nq, d=d, kv_mb=kv_bytes / 2**20, sets=sets)

    def err(x):  # on the first sequence of the batch
        return ((x[:1].float() - ref).norm() / ref.norm()).item()

    fns = {}

    def decode(key, lib, page_size=0, device_tables=False, ordered=False, num_splits=0):
        """lib's decode over every input set (pages of page_size, 0: contiguous),
        each with an O of its own; the first checked before any timing."""
        fns[key] = [Decode(q_, k_, v_, torch.full_like(q_, float("nan")), lib, page_size,
                           device_tables, ordered, num_splits) for q_, k_, v_ in inputs]
        if device_tables and lib.fa_cuda_supported(ctypes.byref(fns[key][0].p), 0) != fa.FA_OK:
            del fns[key]  # a shape tables_on_device does not serve (its column: "-")
            return
        fns[key][0]()
        torch.cuda.synchronize()
        row[f"err_{key}"] = err(fns[key][0].tensors[3])
        assert row[f"err_{key}"] < 1e-2, row

    decode("ours", fa.GPU)
    row["algorithm"] = fa.GPU.fa_cuda_forward_algorithm(ctypes.byref(fns["ours"][0].p))
    row["splits"] = splits_of(fns["ours"][0], d)
    for ps in PAGE_SIZES:
        decode(f"paged{ps}", fa.GPU, ps)
    for ps in DEVICE_PAGE_SIZES:
        decode(f"dev{ps}", fa.GPU, ps, device_tables=True)
    for ps in ORDERED_PAGE_SIZES:
        decode(f"ord{ps}", fa.GPU, ps, ordered=True)
    for f in SPLIT_FACTORS:
        decode(f"x{f}", fa.GPU, num_splits=min(f * row["splits"], 64))
    for name, lib in EXTRA:  # other builds' dense and paged decode, for same-process A/B
        decode(name, lib)
        for ps in PAGE_SIZES:
            decode(f"{name}_paged{ps}", lib, ps)
        for ps in DEVICE_PAGE_SIZES:
            decode(f"{name}_dev{ps}", lib, ps, device_tables=True)
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        runs = []
        for q_, k_, v_ in inputs:
            fn, out = sdpa(backend, q_, k_, v_)
            if fn is None:
                break
            runs.append(fn)
        if len(runs) == sets:
            row[f"err_{name}"] = err(out) if sets == 1 else err(sdpa(backend, q, k, v)[1])
            fns[name] = runs
        torch.cuda.empty_cache()
    if fa4_func is not None:
        try:
            out = fa4_func(q, k, v)
            out = out[0] if isinstance(out, tuple) else out
            row["err_fa4"] = err(out)
            fns["fa4"] = [lambda q_=q_, k_=k_, v_=v_: fa4_func(q_, k_, v_)
                          for q_, k_, v_ in inputs]
        except Exception as why:  # noqa: BLE001 - FA4 refuses some shapes on sm_90
            row["fa4_error"] = str(why)[:120]
    fns["copy"] = [COPY]

    def rotating(runs):
        state = [0]

        def fn():
            runs[state[0] % len(runs)]()
            state[0] += 1
        return fn

    times = bg.alternating_ms({n: rotating(r) for n, r in fns.items()}, 3, reps, 0.05)
    for name in fns:
        ms = statistics.median(times[name])
        moved = 2 * COPY_BYTES if name == "copy" else kv_bytes
        row[f"{name}_gbs"] = moved / ms / 1e6
    return row


def fmt(row, key, digits=0):
    return f"{row[key]:.{digits}f}" if key in row else "-"


def table(rows):
    lines = ["| B | Nk | Nq | d | K+V MB | splits | ours GB/s | % of copy | % of 4.8 TB/s | "
             "flash | cuDNN | FA4 | ours/cuDNN | ours/FA4 |"
             + "".join(f" paged {ps} / dense |" for ps in PAGE_SIZES)
             + "".join(f" paged {ps} dev / dense |" for ps in DEVICE_PAGE_SIZES)
             + "".join(f" paged {ps} ordered / dense |" for ps in ORDERED_PAGE_SIZES)
             + "".join(f" x{f} / ours |" for f in SPLIT_FACTORS)
             + "".join(f" {name} / ours |"
                       + "".join(f" {name} paged {ps} / dense |" for ps in PAGE_SIZES)
                       + "".join(f" {name} paged {ps} dev / dense |" for ps in DEVICE_PAGE_SIZES)
                       for name, _ in EXTRA),
             "|" + "---|" * (14 + len(ORDERED_PAGE_SIZES) + len(SPLIT_FACTORS)
                            + (len(PAGE_SIZES) + len(DEVICE_PAGE_SIZES) + 1) * (len(EXTRA) + 1) - 1)]
    for r in rows:
        pct = 100 * r["ours_gbs"] / r["copy_gbs"]
        lines.append(
            f"| {r['batch']} | {r['nk']} | {r['nq']} | {r['d']} | {r['kv_mb']:.0f} | {r['splits']} | "
            f"{r['ours_gbs']:.0f} | {pct:.0f} | {r['ours_gbs'] / 48:.0f} | {fmt(r, 'flash_gbs')} | "
            f"{fmt(r, 'cudnn_gbs')} | {fmt(r, 'fa4_gbs')} | "
            + (f"{r['ours_gbs'] / r['cudnn_gbs']:.2f}" if "cudnn_gbs" in r else "-") + " | "
            + (f"{r['ours_gbs'] / r['fa4_gbs']:.2f}" if "fa4_gbs" in r else "-") + " |"
            + "".join(f" {r[f'paged{ps}_gbs'] / r['ours_gbs']:.3f} |" for ps in PAGE_SIZES)
            + "".join(f" {r[f'dev{ps}_gbs'] / r['ours_gbs']:.3f} |" if f"dev{ps}_gbs" in r else " - |"
                      for ps in DEVICE_PAGE_SIZES)
            + "".join(f" {r[f'ord{ps}_gbs'] / r['ours_gbs']:.3f} |" for ps in ORDERED_PAGE_SIZES)
            + "".join(f" {r[f'x{f}_gbs'] / r['ours_gbs']:.3f} |" for f in SPLIT_FACTORS)
            + "".join(f" {r[name + '_gbs'] / r['ours_gbs']:.3f} |"
                      + "".join(f" {r[f'{name}_paged{ps}_gbs'] / r['ours_gbs']:.3f} |"
                                for ps in PAGE_SIZES)
                      + "".join(f" {r[f'{name}_dev{ps}_gbs'] / r['ours_gbs']:.3f} |"
                                if f"{name}_dev{ps}_gbs" in r else " - |" for ps in DEVICE_PAGE_SIZES)
                      for name, _ in EXTRA))
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--paged", default="16,64,256", metavar="PAGE_SIZES",
                    help="also time the same K/V in paged caches of these page sizes ('': not)")
    ap.add_argument("--device-tables", default="64", metavar="PAGE_SIZES",
                    help="also time these page sizes with the tables in device memory ('': not)")
    ap.add_argument("--ordered", default="", metavar="PAGE_SIZES",
                    help="also time these page sizes with each sequence's pages in order")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=SHIM",
                    help="also time another build's dense decode (a tests/shim_cuda.cu .so)")
    ap.add_argument("--split-factors", default="", metavar="F,...",
                    help="also time the dense decode at F times the library's split count")
    ap.add_argument("--rows", default="", metavar="B,NK,NQ,D;...", help="only these rows")
    ap.add_argument("--heads", default="32,8", metavar="HQ,HKV", help="query and kv heads")
    args = ap.parse_args()
    global HQ, HKV
    HQ, HKV = (int(x) for x in args.heads.split(","))
    PAGE_SIZES.extend(int(x) for x in args.paged.split(",") if x)
    DEVICE_PAGE_SIZES.extend(int(x) for x in args.device_tables.split(",") if x)
    ORDERED_PAGE_SIZES.extend(int(x) for x in args.ordered.split(",") if x)
    SPLIT_FACTORS.extend(int(x) for x in args.split_factors.split(",") if x)
    EXTRA.extend((e.split("=")[0], fa.load_gpu(os.path.abspath(e.split("=")[1]))) for e in args.extra)
    if torch is None or not torch.cuda.is_available() or fa.GPU is None:
        print("bench_decode: needs a GPU, the CUDA shim (make) and PyTorch; skipped")
        return
    global COPY
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    COPY = lambda: dst.copy_(src)  # noqa: E731
    configs = [(b, nk, nq, 128) for b in (1, 8, 32, 128) for nk in (1024, 4096, 32768, 131072)
               for nq in (1, 4, 16) if b * nk <= 4 << 20]
    configs += [(b, nk, nq, 256) for b, nk in ((1, 131072), (8, 32768), (32, 8192))
                for nq in (1, 16)]
    configs += [(1, 8192, 512, 128), (1, 32768, 1024, 128), (1, 16384, 2048, 128)]  # prefill chunks
    if args.quick:
        configs = [c for c in configs if c[2] == 1 and c[3] == 128]
    if args.rows:
        configs = [tuple(int(x) for x in r.split(",")) for r in args.rows.split(";")]
    rows = []
    for b, nk, nq, d in configs:
        rows.append(run_row(b, nk, nq, d, reps=10))
        print(table(rows[-1:])[2], flush=True)
    commit = os.environ.get("FA_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=ROOT).stdout.strip() or "unknown"
    header = [
        "# Decode benchmark: K+V bandwidth, flashattn vs PyTorch SDPA (flash, cuDNN) and "
        "FlashAttention-4",
        "",
        f"- date: {datetime.date.today()}; GPU: {torch.cuda.get_device_name()}; torch "
        f"{torch.__version__}, cuDNN {torch.backends.cudnn.version()}; FA4 "
        + ("present" if fa4_func else "not installed") + f"; commit: {commit}",
        f"- Hq = {HQ}, Hkv = {HKV}, bf16, non-causal; GB/s = K and V bytes over the median time "
        "(3 rounds, implementations taking turns, of a 10-run CUDA-event median); copy = a "
        "device-to-device copy of 2 GiB timed in each row, read + write counted; splits = the library's "
        "choice; `make bench`",
        "",
    ]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results_decode.md"), "w") as f:
        f.write("\n".join(header + table(rows)) + "\n")
    with open(os.path.join(args.out, "results_decode.json"), "w") as f:
        json.dump(dict(commit=commit, rows=rows), f, indent=1)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
