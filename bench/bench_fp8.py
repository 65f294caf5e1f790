"""FP8 benchmark and accuracy table (part of `make bench`).

1. Accuracy, the FlashAttention-3 paper's experiment (section 4.3): Q, K, V ~
   N(0, 1) plus N(0, 100) at 0.1% of the entries (and, as a control, without
   the outliers); RMSE of O against float64 attention of the unrounded
   inputs, for our bf16 forward, FP8 with one descale per tensor (quantized
   by fa_cpu_quantize_fp8), FP8 with block descales, and FP8 with block
   descales and the Hadamard rotation of Q and K (fa_cuda_quantize_fp8),
   also with power-of-two descales (pow2_descale).
2. Speed: the FP8 forward (block descales as amax / 448 and as powers of
   two, and one descale per head, as FlashAttention-3 takes them) against
   our bf16 forward on the same shapes, and cuDNN's FP8
   attention where its frontend is installed (../shared/peers), side by side
   in one process (the sweep of bench_gpu.py: hidden 2048, B N = 16384),
   every FP8 output checked against the bf16 one first.
3. The quantize kernel's GB/s (bf16 in, e4m3 and descales out, with the
   Hadamard rotation) against a device copy of the same tensor.
Writes bench/results_fp8.md and .json (or --out DIR).

Usage: python3 bench/bench_fp8.py [--quick] [--out DIR] [--dims 64,128] [--sizes 4096,16384]
       [--speed-only] [--extra NAME=shim.so ...] [--timing-only]
"""
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
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fa  # noqa: E402
from bench_gpu import alternating_ms  # noqa: E402

LIB = fa.GPU
SEED = 5  # the Hadamard signs, shared by Q and K


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def layout_of(t):
    """fa.Layout of a [B, N, H, d] torch tensor (element strides)."""
    s = t.stride()
    return fa.Layout(s[0], s[2], s[1])


def quantize_gpu(x, hadamard, pow2=False):
    """bf16 [B, N, H, d] on the device -> (e4m3 codes as uint8, block descales
    (powers of two with pow2), the call that redoes it)."""
    b, n, h, d = x.shape
    out = torch.empty(x.shape, dtype=torch.uint8, device="cuda")
    ds = torch.empty(b, h, -(-n // fa.FP8_BLOCK), dtype=torch.float32, device="cuda")
    qp = fa.QuantizeParams()
    qp.batch, qp.heads, qp.seqlen, qp.head_dim = b, h, n, d
    qp.dtype = fa.DTYPES["bf16"]
    qp.x, qp.x_layout, qp.out, qp.out_layout = x.data_ptr(), layout_of(x), out.data_ptr(), layout_of(out)
    qp.descale, qp.scaling, qp.hadamard, qp.hadamard_seed = ds.data_ptr(), 0, int(hadamard), SEED
    qp.pow2_descale = int(pow2)

    def run():
        status = LIB.fa_cuda_quantize_fp8(ctypes.byref(qp), stream())
        assert status == fa.FA_OK, LIB.fa_last_error_detail().decode()

    run()
    return out, ds, run


def quantize_qkv(q, k, v, hadamard=True, pow2=False):
    """Q, K (rotated where hadamard) and V quantized by quantize_gpu:
    ([codes of Q, K, V], [their block descales])."""
    out = [quantize_gpu(x, had, pow2) for x, had in ((q, hadamard), (k, hadamard), (v, False))]
    return [c for c, _, _ in out], [ds for _, ds, _ in out]


def quantize_head(x):
    """bf16 [B, N, H, d] on the device -> (e4m3 codes, [B, H] descales amax / 448),
    one descale per (batch, head), by PyTorch's float8 cast."""
    ds = (x.float().abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-30)
    codes = (x.float() / ds[:, None, :, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.contiguous(), ds.contiguous()


def quantize_cpu_tensor(x):
    """float32 host array -> (codes, one descale) by fa_cpu_quantize_fp8, per tensor."""
    b, n, h, d = x.shape
    xs = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.shape, np.uint8)
    ds = np.empty(1, np.float32)
    qp = fa.QuantizeParams()
    qp.batch, qp.heads, qp.seqlen, qp.head_dim = b, h, n, d
    qp.dtype = fa.DTYPES["f32"]
    qp.x, qp.out, qp.descale = xs.ctypes.data, out.ctypes.data, ds.ctypes.data
    qp.scaling = fa.SCALINGS["tensor"]
    status = fa.CPU.fa_cpu_quantize_fp8(ctypes.byref(qp), ctypes.byref(fa.CpuOptions(16, 0)))
    assert status == fa.FA_OK
    return torch.from_numpy(out).cuda(), torch.from_numpy(ds).cuda()


class Attention:
    """Our forward on device tensors: bf16 (q, k, v torch bf16) or fp8
    (uint8 codes with descales of a scaling)."""

    def __init__(self, q, k, v, causal, descales=None, scaling="block", lib=None):
        self.lib = lib or LIB
        b, n, h, d = q.shape
        self.o = torch.empty(b, n, h, d, dtype=torch.bfloat16, device="cuda")
        p = fa.Params()
        p.dtype = fa.DTYPES["fp8" if descales else "bf16"]
        p.batch, p.seqlen_q, p.heads_q, p.head_dim = b, n, h, d
        p.heads_kv, p.seqlen_k, p.causal = k.shape[2], k.shape[1], int(causal)
        for name, t in (("q", q), ("k", k), ("v", v), ("o", self.o)):
            setattr(p, name, t.data_ptr())
            setattr(p, name + "_layout", layout_of(t))
        if descales:
            p.o_dtype, p.fp8_scaling = fa.DTYPES["bf16"], fa.SCALINGS[scaling]
            p.q_descale, p.k_descale, p.v_descale = (t.data_ptr() for t in descales)
        self.p, self.keep = p, (q, k, v, descales)

    def algorithm(self):
        return self.lib.fa_cuda_forward_algorithm(ctypes.byref(self.p))

    def forward(self):
        status = self.lib.fa_cuda_forward(ctypes.byref(self.p), None, ctypes.c_size_t(0), stream())
        assert status == fa.FA_OK, self.lib.fa_last_error_detail().decode()
        return self.o


def reference(q, k, v, causal):
    """float64 attention of [B, N, H, d] float64 device tensors."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), -float("inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


def accuracy(dims, n=2048, heads=8):
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(42)
    for d in dims:
        for dist in ("outliers", "normal"):
            xs = []
            for _ in range(3):
                x = torch.randn(1, n, heads, d, dtype=torch.float64, device="cuda", generator=gen)
                if dist == "outliers":
                    hit = torch.rand(x.shape, device="cuda", generator=gen, dtype=torch.float64) < 0.001
                    x = x + hit * torch.randn(x.shape, dtype=torch.float64, device="cuda",
                                              generator=gen) * 10.0
                xs.append(x)
            ref = reference(*xs, causal=False)

            def rmse(o):
                return ((o.double() - ref) ** 2).mean().sqrt().item()

            bf = [x.to(torch.bfloat16) for x in xs]
            row = dict(d=d, dist=dist, bf16=rmse(Attention(*bf, False).forward()))
            tensor = [quantize_cpu_tensor(x.float().cpu().numpy()) for x in xs]
            row["fp8_tensor"] = rmse(Attention(*(t[0] for t in tensor), False,
                                               [t[1] for t in tensor], "tensor").forward())
            for name, had, pow2 in (("fp8_block", False, False), ("fp8_block_hadamard", True, False),
                                    ("fp8_block_hadamard_pow2", True, True)):
                codes, ds = quantize_qkv(*bf, had, pow2)
                row[name] = rmse(Attention(*codes, False, ds).forward())
            rows.append(row)
            print(row, flush=True)
    return rows


def cudnn_fp8(q, k, v, causal):
    """cuDNN's FP8 attention through its Python frontend (nvidia-cudnn-frontend,
    staged by ../shared/peers): Q, K, V (bf16 [B, N, H, d]) cast to e4m3 with
    one descale per tensor (the frontend's sdpa_fp8 takes no others), P
    scaled by 448 into e4m3, O out in e4m3 at scale 1. Returns (the call, its
    O as float32) or None where the frontend is missing or declines."""
    try:
        import cudnn
    except ImportError:
        return None
    try:
        d = q.shape[3]

        def cast(x):
            ds = (x.float().abs().amax() / 448.0).clamp(min=1e-30)
            return (x.float() / ds).to(torch.float8_e4m3fn), ds.reshape(1, 1, 1, 1)

        (q8, dq), (k8, dk), (v8, dv) = cast(q), cast(k), cast(v)
        o8 = torch.empty_like(q8)
        one = torch.ones(1, 1, 1, 1, dtype=torch.float32, device="cuda")
        s_scale, s_descale = one * 448.0, one / 448.0
        amax_s, amax_o = torch.empty_like(one), torch.empty_like(one)
        handle = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        g = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3,
                          intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)

        def bhsd(x):  # the frontend's [B, H, N, d] dims over our BSHD storage
            return x.transpose(1, 2)

        tq, tk, tv = (g.tensor_like(bhsd(x)).set_data_type(cudnn.data_type.FP8_E4M3)
                      for x in (q8, k8, v8))
        scalars = (dq, dk, dv, s_descale, s_scale, one)
        td = [g.tensor_like(x) for x in scalars]
        args = dict(q=tq, k=tk, v=tv, descale_q=td[0], descale_k=td[1], descale_v=td[2],
                    descale_s=td[3], scale_s=td[4], scale_o=td[5], attn_scale=d ** -0.5,
                    use_causal_mask=causal)
        try:
            to, _, ts, tmo = g.sdpa_fp8(generate_stats=False, **args)
        except TypeError:  # older frontends name it is_inference
            to, _, ts, tmo = g.sdpa_fp8(is_inference=True, **args)
        to.set_output(True).set_dim(list(bhsd(o8).shape)).set_stride(list(bhsd(o8).stride()))
        to.set_data_type(cudnn.data_type.FP8_E4M3)
        for t in (ts, tmo):
            t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1])
            t.set_data_type(cudnn.data_type.FLOAT)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        workspace = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
        pack = {tq: q8, tk: k8, tv: v8, to: o8, ts: amax_s, tmo: amax_o}
        pack.update(zip(td, scalars))

        def run():
            g.execute(pack, workspace, handle=handle)

        run()
        torch.cuda.synchronize()
        return run, o8.float()
    except Exception as e:  # noqa: BLE001 (a peer that declines leaves its column out)
        print(f"cuDNN FP8 not run: {type(e).__name__}: {e}", flush=True)
        return None


EXTRA = {}  # --extra NAME=build.so: further builds' FP8 forward, timed beside
TIMING_ONLY = False  # --timing-only: extras with parts taken out on purpose (errors printed)


def speed(dims, sizes, rounds, reps, warm_s):
    rows = []
    for d in dims:
        for n in sizes:
            for causal in (False, True):
                b, h = max(1, 16384 // n), 2048 // d
                gen = torch.Generator(device="cuda").manual_seed(n + d)
                q, k, v = (torch.randn(b, n, h, d, dtype=torch.bfloat16, device="cuda", generator=gen)
                           for _ in range(3))
                bf = Attention(q, k, v, causal)
                codes, ds = quantize_qkv(q, k, v)
                f8 = Attention(*codes, causal, ds)
                # the same with power-of-two descales (fa_quantize_params.pow2_descale)
                codes2, ds2 = quantize_qkv(q, k, v, pow2=True)
                f8p = Attention(*codes2, causal, ds2)
                heads = [quantize_head(x) for x in (q, k, v)]
                f8h = Attention(*(c for c, _ in heads), causal, [ds for _, ds in heads], "head")
                # Correct first: FP8 (with the rotation, which keeps Q K^T) against bf16.
                o_bf = bf.forward().float().clone()
                o_f8 = f8.forward().float()
                torch.cuda.synchronize()
                err = ((o_f8 - o_bf).norm() / o_bf.norm()).item()
                assert err < 0.08, f"d={d} N={n} causal={causal}: fp8 vs bf16 error {err:.3g}"
                err2 = ((f8p.forward().float() - o_bf).norm() / o_bf.norm()).item()
                assert err2 < 0.08, f"d={d} N={n} causal={causal}: fp8 pow2 vs bf16 error {err2:.3g}"
                err3 = ((f8h.forward().float() - o_bf).norm() / o_bf.norm()).item()
                assert err3 < 0.08, f"d={d} N={n} causal={causal}: fp8 head vs bf16 error {err3:.3g}"
                flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
                fns = {"bf16": bf.forward, "fp8": f8.forward, "fp8_pow2": f8p.forward,
                       "fp8_head": f8h.forward}
                peer = cudnn_fp8(q, k, v, causal)
                if peer is not None:
                    c_err = ((peer[1] - o_bf).norm() / o_bf.norm()).item()
                    if c_err < 0.1:
                        fns["cudnn_fp8"] = peer[0]
                    else:
                        print(f"cuDNN FP8: d={d} N={n} causal={causal}: error {c_err:.3g}, not timed")
                for name, lib in EXTRA.items():  # block descales, then one a head
                    for key, impl in ((name, Attention(*codes, causal, ds, lib=lib)),
                                      (name + "_head",
                                       Attention(*(c for c, _ in heads), causal,
                                                 [x for _, x in heads], "head", lib=lib))):
                        if impl.algorithm() != 3:
                            continue
                        o_x = impl.forward().float()
                        torch.cuda.synchronize()
                        x_err = ((o_x - o_bf).norm() / o_bf.norm()).item()
                        if TIMING_ONLY:
                            print(f"{key}: d={d} N={n} causal={causal}: error {x_err:.3g}")
                        else:
                            assert x_err < 0.08, f"{key}: d={d} N={n} causal={causal}: error {x_err:.3g}"
                        fns[key] = impl.forward
                times = alternating_ms(fns, rounds, reps, warm_s)
                row = dict(d=d, n=n, causal=causal, batch=b, heads=h, err_vs_bf16=err,
                           algorithm=f8.algorithm())
                for key in times:
                    row[key] = flops / statistics.median(times[key]) / 1e9
                rows.append(row)
                print(row, flush=True)
                del q, k, v, codes, codes2, heads, bf, f8, f8p, f8h
    return rows


def quantize_speed(rounds, reps, warm_s):
    rows = []
    for b, n, h, d in ((1, 16384, 32, 128), (8, 4096, 16, 128), (1, 16384, 16, 256), (4, 8192, 32, 64)):
        x = torch.randn(b, n, h, d, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        _, _, had = quantize_gpu(x, True)
        _, _, plain = quantize_gpu(x, False)
        times = alternating_ms({"copy": lambda: y.copy_(x), "quantize_hadamard": had,
                                "quantize": plain}, rounds, reps, warm_s)
        elems = x.numel()
        row = dict(shape=f"{b}x{n}x{h}x{d}")
        row["copy_gbs"] = 4 * elems / statistics.median(times["copy"]) / 1e6
        for key in ("quantize", "quantize_hadamard"):
            moved = 3 * elems + 4 * b * h * -(-n // fa.FP8_BLOCK)
            row[key + "_gbs"] = moved / statistics.median(times[key]) / 1e6
        rows.append(row)
        print(row, flush=True)
    return rows


def write(out, acc, spd, qnt):
    commit = os.environ.get("FA_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results_fp8.json"), "w") as f:
        json.dump(dict(date=date, gpu=gpu, commit=commit, accuracy=acc, speed=spd, quantize=qnt), f,
                  indent=1)
    lines = [f"# FP8 forward: accuracy and speed\n", f"{date}, {gpu}, commit {commit}.\n",
             "## Accuracy (RMSE of O against float64; B = 1, H = 8, N = 2048)\n",
             "| d | inputs | bf16 | FP8 per tensor | FP8 block | FP8 block + Hadamard | "
             "the same, power-of-two descales | per tensor / block + Hadamard |",
             "|---|---|---|---|---|---|---|---|"]
    for r in acc:
        lines.append(f"| {r['d']} | {r['dist']} | {r['bf16']:.2e} | {r['fp8_tensor']:.2e} | "
                     f"{r['fp8_block']:.2e} | {r['fp8_block_hadamard']:.2e} | "
                     f"{r['fp8_block_hadamard_pow2']:.2e} | "
                     f"{r['fp8_tensor'] / r['fp8_block_hadamard']:.2f} |")
    lines += ["", "## Speed (TFLOP/s; hidden 2048, B N = 16384; same process, alternating rounds)\n",
              "| d | N | causal | bf16 | FP8 | FP8 / bf16 | FP8, power-of-two descales | "
              "its / bf16 | FP8, a descale per head | its / bf16 | cuDNN FP8 (per tensor) | "
              "ours per head / cuDNN | rel. diff vs bf16 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in spd:
        cud = r.get("cudnn_fp8")
        peer = f"{cud:.0f} | {r['fp8_head'] / cud:.2f}" if cud else "- | -"
        lines.append(f"| {r['d']} | {r['n']} | {int(r['causal'])} | {r['bf16']:.0f} | {r['fp8']:.0f} | "
                     f"{r['fp8'] / r['bf16']:.2f} | {r['fp8_pow2']:.0f} | "
                     f"{r['fp8_pow2'] / r['bf16']:.2f} | {r['fp8_head']:.0f} | "
                     f"{r['fp8_head'] / r['bf16']:.2f} | {peer} | {r['err_vs_bf16']:.3f} |")
    ran = any(r.get("cudnn_fp8") for r in spd)
    lines += ["", ("cuDNN FP8: its Python frontend's sdpa_fp8 in the same process (one descale "
                   "per tensor, O in e4m3). " if ran else
                   "cuDNN's FP8 attention was not run side by side (its frontend wheel comes "
                   "staged through ../shared/peers, which this run lacked). ") +
              "Published: cuDNN 9.27's H200 FP8 forward (GQA 64/8, d = 128) 1039 TFLOP/s at "
              "8k, 976 at 16k; FlashAttention-3's paper (H100) d = 128 ~1008, d = 256 ~1171 at 16k."]
    lines += ["", "## Quantize kernel (GB/s: bf16 read, e4m3 and descales written)\n",
              "| shape B x N x H x d | copy | quantize | with Hadamard | Hadamard / copy |",
              "|---|---|---|---|---|"]
    for r in qnt:
        lines.append(f"| {r['shape']} | {r['copy_gbs']:.0f} | {r['quantize_gbs']:.0f} | "
                     f"{r['quantize_hadamard_gbs']:.0f} | {r['quantize_hadamard_gbs'] / r['copy_gbs']:.2f} |")
    with open(os.path.join(out, "results_fp8.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=float, default=0.1)
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=lib.so")
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--sizes")
    ap.add_argument("--timing-only", action="store_true")
    a = ap.parse_args()
    global TIMING_ONLY
    TIMING_ONLY = a.timing_only
    for spec in a.extra:
        name, path = spec.split("=", 1)
        EXTRA[name] = fa.load_gpu(os.path.abspath(path))
    if LIB is None:
        raise SystemExit("no CUDA test shim (build/libflashattn_cuda_test.so): run on a GPU machine")
    dims = [int(x) for x in a.dims.split(",")]
    sizes = (1024, 4096, 16384) if a.quick else (512, 1024, 2048, 4096, 8192, 16384)
    if a.sizes:
        sizes = [int(x) for x in a.sizes.split(",")]
    acc = [] if a.speed_only else accuracy(dims)
    spd = speed(dims, sizes, a.rounds, 10 if a.quick else 20, a.warm)
    qnt = quantize_speed(a.rounds, 20, a.warm)
    if a.speed_only:
        return
    write(a.out, acc, spd, qnt)


if __name__ == "__main__":
    main()
