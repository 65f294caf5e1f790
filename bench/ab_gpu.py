"""Same-process A/B of forward (or, with --bwd, backward) builds (`--extra`-style shims of tests/shim_cuda.cu):
each configuration's forward is timed in alternating rounds (build A, build B,
..., cuDNN, each round starting one further along; ROUNDS rounds of a
REPS-run CUDA-event median each, after WARM_S seconds of running back to
back) so that clock and power drift land on every build alike
(bench_gpu.alternating_ms; bench/DESIGN.md, Method). Every build's output is
checked against PyTorch's flash backend before timing; --timing-only prints
each error instead, for builds with parts taken out on purpose (forward only).

Usage: python3 bench/ab_gpu.py [--bwd | --bwd-det | --timing-only] "d[/dv],n,causal[,fp16];..." NAME=path/to/shim.so ...
The first build is the reference; ratios are to it. The peer is cuDNN's
forward, or with --bwd PyTorch flash's backward (builds with FA_SM90=0 time
the FA2 backward; --bwd-det times the deterministic mode). Sweep shapes as in
bench_gpu.py (B = 16384 / n, H = 2048 / d), bf16 unless a shape says fp16;
d/dv gives V (and O) a head dim of its own (forward only; FLOPs 2 (d + dv)
per query-key pair; checked against cuDNN's or PyTorch's math backend)."""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

import bench_gpu as bg  # noqa: E402
import fa  # noqa: E402

ROUNDS, REPS, WARM_S = 7, 15, 0.2


def main():
    args = sys.argv[1:]
    bwd = args[0] in ("--bwd", "--bwd-det")
    det = int(args[0] == "--bwd-det")
    timing_only = args[0] == "--timing-only"
    args = args[1:] if bwd or timing_only else args
    configs = []
    for c in args[0].split(";"):
        f = c.split(",")
        d, _, d_v = f[0].partition("/")
        configs.append((int(d), int(d_v or d), int(f[1]), int(f[2]), (f[3:4] or ["bf16"])[0]))
    builds = [(spec.split("=")[0], fa.load_gpu(os.path.abspath(spec.split("=")[1])))
              for spec in args[1:]]
    for d, d_v, n, causal, dtype in configs:
        causal = bool(causal)
        assert not bwd or d_v == d, "a V head dim of its own: forward only"
        b, h = max(1, 16384 // n), 2048 // d
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        q, k = (torch.randn(b, n, h, d, device="cuda", dtype=tdt) for _ in range(2))
        v, dout = (torch.randn(b, n, h, d_v, device="cuda", dtype=tdt) for _ in range(2))
        o, dv = torch.empty_like(v), torch.empty_like(v)
        dq, dk = torch.empty_like(q), torch.empty_like(q)
        lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
        flash = bg.peer(SDPBackend.FLASH_ATTENTION, q, k, v, dout, causal)
        ref = (flash or bg.peer(SDPBackend.CUDNN_ATTENTION, q, k, v, dout, causal) or
               bg.peer(SDPBackend.MATH, q, k, v, dout, causal))[2].float()
        if bwd:
            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            with bg.sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = bg.F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            grads = torch.autograd.grad(out, (qt, kt, vt), dout.transpose(1, 2))
            ref_grads = [g.transpose(1, 2).float() for g in grads]
        fns = {}
        for name, lib in builds:
            impl = bg.Ours(q, k, v, o, lse, dout, dq, dk, dv, causal, lib)
            if impl.algorithm() == 0:  # this build lacks the head dim
                continue
            o.fill_(float("nan"))
            impl.forward()
            torch.cuda.synchronize()
            err = ((o.float() - ref).norm() / ref.norm()).item()
            if timing_only:
                print(f"{name}: d={d} N={n} causal={int(causal)}: error {err:.2g} (not checked)")
            else:
                assert err < 1e-2, f"{name}: d={d} N={n} causal={causal}: error {err:.3g}"
            fns[name] = impl.forward
            if bwd:
                for g in (dq, dk, dv):
                    g.fill_(float("nan"))
                impl.backward(det)
                torch.cuda.synchronize()
                for g, r, what in zip((dq, dk, dv), ref_grads, ("dq", "dk", "dv")):
                    err = ((g.float() - r).norm() / r.norm()).item()
                    assert err < 2e-2, f"{name}: d={d} N={n} causal={causal}: {what} error {err:.3g}"
                fns[name] = (lambda impl=impl: impl.backward(det))
        if bwd:
            fns["flash"] = flash[1]
        else:
            cudnn = bg.peer(SDPBackend.CUDNN_ATTENTION, q, k, v, dout, causal)
            if cudnn:
                fns["cudnn"] = cudnn[0]
        times = bg.alternating_ms(fns, ROUNDS, REPS, WARM_S)
        flops = 2.0 * b * h * n * n * (d + d_v) / (2 if causal else 1) * (2.5 if bwd else 1)
        first = statistics.median(next(iter(times.values())))
        line = (f"d{d}" + ("" if d_v == d else f"/{d_v}") + f" N{n} causal{int(causal)}" +
                ("" if dtype == "bf16" else f" {dtype}") + ":")
        for name, ts in times.items():
            m = statistics.median(ts)
            line += (f" {name} {flops / m / 1e9:.0f} ({first / m:.3f},"
                     f" rounds {min(ts) / m:.2f}-{max(ts) / m:.2f})")
        print(line, flush=True)


if __name__ == "__main__":
    main()
