"""Same-process A/B of the FP8 quantizer of several builds of tests/shim_cuda.cu
(rev_variant.sh shims: any head dim's serves, the quantizer is shared): bf16 in,
block descales; the builds' descales checked equal and their codes nearly
(a change in the order of roundings may move a code lying on a rounding edge),
then timed beside a device copy of the same tensor in alternating rounds
(bench_gpu.alternating_ms), each shape without and with the Hadamard rotation.
Prints GB/s (bf16 read, e4m3 written) and the ratio to the copy's.

Usage: python3 bench/ab_quantize.py NAME=lib.so [NAME=lib.so ...]
"""
import ctypes
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402

import bench_fp8 as bf  # noqa: E402
import fa  # noqa: E402
from bench_gpu import alternating_ms  # noqa: E402

SHAPES = ((1, 16384, 32, 128), (8, 4096, 16, 128), (1, 16384, 16, 256), (4, 8192, 32, 64))


def quantize_call(lib, x, out, ds, hadamard):
    b, n, h, d = x.shape
    qp = fa.QuantizeParams()
    qp.batch, qp.heads, qp.seqlen, qp.head_dim = b, h, n, d
    qp.dtype = fa.DTYPES["bf16"]
    qp.x, qp.x_layout, qp.out, qp.out_layout = x.data_ptr(), bf.layout_of(x), out.data_ptr(), bf.layout_of(out)
    qp.descale, qp.scaling, qp.hadamard, qp.hadamard_seed = ds.data_ptr(), 0, hadamard, 7

    def run():
        assert lib.fa_cuda_quantize_fp8(ctypes.byref(qp), bf.stream()) == fa.FA_OK
    return run


def main():
    libs = {name: ctypes.CDLL(path) for name, path in (a.split("=", 1) for a in sys.argv[1:])}
    for (b, n, h, d), hadamard in ((s, r) for s in SHAPES for r in (0, 1)):
        x = torch.randn(b, n, h, d, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        calls, outs = {"copy": lambda: y.copy_(x)}, []
        for name, lib in libs.items():
            out = torch.empty(x.shape, dtype=torch.uint8, device="cuda")
            ds = torch.empty(b, h, -(-n // fa.FP8_BLOCK), dtype=torch.float32, device="cuda")
            calls[name] = quantize_call(lib, x, out, ds, hadamard)
            calls[name]()
            outs.append((out, ds))
        assert all(torch.equal(outs[0][1], s) for _, s in outs), "the builds' descales differ"
        differ = max(int((outs[0][0] != o).sum()) for o, _ in outs)
        assert differ <= x.numel() * 1e-5, f"{differ} codes differ"
        t = alternating_ms(calls, 5, 20, 0.1)
        copy = 4 * x.numel() / statistics.median(t["copy"]) / 1e6
        moved = 3 * x.numel() + 4 * b * h * -(-n // fa.FP8_BLOCK)
        row = {"shape": f"{b}x{n}x{h}x{d}", "hadamard": hadamard, "copy GB/s": round(copy),
               "codes that differ": differ}
        for name in libs:
            gbs = moved / statistics.median(t[name]) / 1e6
            row[name] = f"{gbs:.0f} GB/s ({gbs / copy:.2f}x copy)"
        print(row, flush=True)


if __name__ == "__main__":
    main()
