"""One configuration, each kernel launched once, for a profiler (never a
benchmark): our forward and our backward in both modes (from the FA_SM90=0
build unless --lib names another), then the forward and backward of
PyTorch's backends named by --peers on the same inputs. --dtype fp8: our
bf16 forward, then the quantizer (Q and K with the Hadamard rotation) and
the FP8 forward on the same inputs (the default build: FA3 on Hopper), no
backward and no peers.

Usage: ncu --section SpeedOfLight ... python3 bench/profile_gpu.py [--d 128] [--n 4096]
           [--causal] [--dtype bf16|fp16|fp8] [--lib libflashattn_cuda_test.so] [--peers flash,cudnn]
e.g. ncu --clock-control none -k regex:fa3 --section ComputeWorkloadAnalysis
     --section WarpStateStats python3 bench/profile_gpu.py --dtype fp8 --n 16384
--lib: a build of tests/shim_cuda.cu in build/ or an absolute path (the default
build, libflashattn_cuda_test.so, runs FA3 on Hopper; bench/tile_variant.sh
makes others). B = 16384 / N and H = 2048 / d, as in the benchmark's sweep."""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

from bench_gpu import Ours
import fa


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--lib", default="libflashattn_cuda_fa2_test.so")
    ap.add_argument("--peers", default="flash")
    args = ap.parse_args()
    if args.dtype == "fp8":
        return profile_fp8(args)
    lib = fa.load_gpu(args.lib)
    assert lib is not None, f"no build {args.lib}"
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    b, h, n, d = 16384 // args.n, 2048 // args.d, args.n, args.d
    q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(4))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
    ours = Ours(q, k, v, o, lse, dout, dq, dk, dv, args.causal, lib=lib)
    ours.forward()
    ours.backward(0)
    ours.backward(1)
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    for peer in args.peers.split(","):
        with sdpa_kernel(backends[peer]):
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        torch.autograd.grad(out, (qt, kt, vt), dout.transpose(1, 2))
    torch.cuda.synchronize()


def profile_fp8(args):
    import bench_fp8 as f8
    b, h, n, d = 16384 // args.n, 2048 // args.d, args.n, args.d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    f8.Attention(q, k, v, args.causal).forward()
    codes, ds = f8.quantize_qkv(q, k, v)
    f8.Attention(*codes, args.causal, ds).forward()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
