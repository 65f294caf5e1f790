"""GPU benchmark (`make bench`): flashattn against PyTorch SDPA's flash
(FlashAttention-2) and cuDNN backends, side by side in one process on the same
inputs. The sweep is the FlashAttention papers' (targets.md): hidden 2048,
H = 2048 / d, B = 16384 / N. Every configuration is validated against
PyTorch's output before it is timed. The implementations of a configuration
take turns over --rounds rounds, each round starting one further along, and
each runs back to back for --warm seconds before its timed runs: under a
sustained load the H200 holds its power cap by lowering its clock, and a
kernel otherwise inherits the clock its predecessor left (bench/DESIGN.md). The time is the median over the rounds of each round's CUDA-event
median.

Our forward runs in four builds: the default one ("ours": FA3 on Hopper for
d 64/128/256), FA_SM90=0 ("fa2": the portable mma.sync kernel) and the FA3
ablations FA_FA3_OVERLAP=0 and FA_FA3_PINGPONG=0. The backward is the same
code in every build and is timed once.
Writes bench/results_gpu.md, bench/results_gpu.json and (with matplotlib)
bench/results_gpu.png.

Usage: python3 bench/bench_gpu.py [--quick] [--dtypes bf16,fp16] [--dims 64,128,256]
           [--sizes 1024,4096] [--no-backward] [--extra NAME=path/to/shim.so ...]
           [--rounds 3] [--warm 0.1] [--resume earlier/results_gpu.json] [--out DIR]
--extra times further builds of tests/shim_cuda.cu (tile or ablation
variants), forward and backward, as columns NAME; a build that lacks a head
dim is skipped. --resume keeps an earlier run's rows and measures only the
configurations it lacks (a sweep split over several calls, or cut short:
the results files are rewritten after every configuration).
"""
import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import fa  # noqa: E402

try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
except ImportError:  # the peers are optional; our own numbers still come out
    torch = None


def median_ms(fn, reps, warm_s=0.0):
    """Median CUDA-event time of reps runs of fn, after running it back to back
    for warm_s seconds (at least twice)."""
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    t0, runs = time.perf_counter(), 0
    while runs < 2 or time.perf_counter() - t0 < warm_s:
        fn()
        runs += 1
        if runs % 4 == 0:
            torch.cuda.synchronize()
    for a, b in zip(start, stop):
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(start, stop))
    return times[len(times) // 2]


def alternating_ms(fns, rounds, reps, warm_s=0.0):
    """{name: fn} -> {name: [each round's median in ms]}. The fns take turns,
    each round starting one further along, so that no fn always follows the
    same one; each warms for warm_s before its timed runs. Under a sustained
    load the H200 holds its power cap by lowering the SM clock (1980 to ~1650
    MHz for the FA3 forward), and the clock a kernel inherits from the one
    before it takes a while to settle (bench/DESIGN.md, Method)."""
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(median_ms(fns[name], reps, warm_s))
    return times


# Forward builds timed side by side: name -> shared object (None if not built).
FORWARD_BUILDS = {
    "ours": fa.GPU,
    "fa2": fa.GPU_FA2,
    "nooverlap": fa.load_gpu("libflashattn_cuda_nooverlap.so"),
    "nopingpong": fa.load_gpu("libflashattn_cuda_nopingpong.so"),
}


# --extra builds (tile variants), timed forward and backward as columns of their own.
EXTRA = []


class Ours:
    """flashattn on torch tensors [B, N, H, d] (BSHD), through a CUDA shim."""

    def __init__(self, q, k, v, o, lse, dout, dq, dk, dv, causal, lib=None):
        self.lib = lib or fa.GPU
        dtype = {torch.bfloat16: "bf16", torch.float16: "f16"}[q.dtype]
        p = fa.Params()
        p.dtype = fa.DTYPES[dtype]
        p.batch, p.seqlen_q, p.heads_q, p.head_dim = q.shape
        p.heads_kv, p.seqlen_k, p.head_dim_v = k.shape[2], k.shape[1], v.shape[3]
        p.causal = int(causal)
        for name, t in dict(q=q, k=k, v=v, o=o, dout=dout, dq=dq, dk=dk, dv=dv).items():
            setattr(p, name, t.data_ptr())
        p.lse = lse.data_ptr()
        self.p = p
        self.tensors = (q, k, v, o, lse, dout, dq, dk, dv)  # p holds their addresses
        size = self.lib.fa_cuda_backward_workspace_size(ctypes.byref(p), 0)  # the larger one
        self.workspace = torch.empty(size, dtype=torch.uint8, device="cuda")

    def stream(self):
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def forward(self):
        status = self.lib.fa_cuda_forward(ctypes.byref(self.p), None, ctypes.c_size_t(0),
                                          self.stream())
        assert status == fa.FA_OK, self.lib.fa_last_error_detail().decode()

    def algorithm(self):
        return self.lib.fa_cuda_forward_algorithm(ctypes.byref(self.p))

    def backward_algorithm(self):
        return self.lib.fa_cuda_backward_algorithm(ctypes.byref(self.p), 0)

    def backward(self, deterministic=0):
        status = self.lib.fa_cuda_backward(ctypes.byref(self.p), deterministic,
                                           ctypes.c_void_p(self.workspace.data_ptr()),
                                           ctypes.c_size_t(self.workspace.numel()), self.stream())
        assert status == fa.FA_OK, self.lib.fa_last_error_detail().decode()


def peer(backend, q, k, v, dout, causal):
    """(forward, backward) closures of SDPA with one backend, or None if it refuses."""
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    try:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    except RuntimeError:
        return None
    gt = dout.transpose(1, 2)

    def forward():
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def backward():
        torch.autograd.grad(out, (qt, kt, vt), gt, retain_graph=True)

    return forward, backward, out.transpose(1, 2)


def run_config(dtype, d, n, causal, rounds, reps, warm_s, backward=True):
    b, h = max(1, 16384 // n), 2048 // d
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(n * 7 + d)
    q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=tdt, generator=gen)
                     for _ in range(4))
    o, dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(4))
    lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
    ours = Ours(q, k, v, o, lse, dout, dq, dk, dv, causal)
    flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
    row = dict(dtype=dtype, d=d, n=n, causal=causal, batch=b, heads=h,
               algorithm=ours.algorithm(), bwd_algorithm=ours.backward_algorithm())

    ours.forward()
    ours.backward()
    torch.cuda.synchronize()
    # Correct before timing: against PyTorch's fp32 math path where S fits in
    # memory (N <= 2048), else against its flash backend.
    small = n <= 2048
    qt, kt, vt = (x.transpose(1, 2).detach().to(torch.float32 if small else tdt).requires_grad_()
                  for x in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH if small else SDPBackend.FLASH_ATTENTION):
        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    grads = torch.autograd.grad(ref, (qt, kt, vt), dout.transpose(1, 2).to(ref.dtype))

    def check(name, got, want):
        got, want = got.transpose(1, 2).float(), want.float()
        err = ((got - want).norm() / want.norm()).item()
        row[f"err_{name}"] = err
        assert err < 2e-2, f"{dtype} d={d} N={n} causal={causal}: {name} error {err:.3g}"

    def check_grads(suffix):
        for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
            check(name + suffix, got, want)

    check("o", o, ref)
    check_grads("")
    builds = {}
    for build, lib in FORWARD_BUILDS.items():
        if lib is None or build == "ours":
            continue
        impl = Ours(q, k, v, o, lse, dout, dq, dk, dv, causal, lib)
        if impl.algorithm() == 0:  # this build lacks the head dim or dtype
            continue
        o.fill_(float("nan"))
        builds[build] = impl
        impl.forward()
        torch.cuda.synchronize()
        check(f"o_{build}", o, ref)
        if backward and (build in EXTRA or build == "fa2"):  # its own backward too
            for deterministic in ((0, 1) if build in EXTRA else (0,)):
                for t in (dq, dk, dv):
                    t.fill_(float("nan"))
                impl.backward(deterministic)
                torch.cuda.synchronize()
                check_grads(f"_{build}{deterministic}")
    del qt, kt, vt, ref, grads

    # Everything timed, keyed by its row field; TFLOP/s factor: 1 forward, 2.5 backward.
    timed = {"ours_fwd": (ours.forward, 1.0)}
    for build, impl in builds.items():
        timed[f"{build}_fwd"] = (impl.forward, 1.0)
        if backward and (build in EXTRA or build == "fa2"):
            timed[f"{build}_bwd"] = (impl.backward, 2.5)
        if backward and build in EXTRA:
            timed[f"{build}_bwd_det"] = (lambda impl=impl: impl.backward(1), 2.5)
    if backward:
        timed["ours_bwd"] = (ours.backward, 2.5)
        timed["ours_bwd_det"] = (lambda: ours.backward(1), 2.5)
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        fns = peer(backend, q, k, v, dout, causal)
        if fns is None:
            continue
        timed[f"{name}_fwd"] = (fns[0], 1.0)
        if backward:
            timed[f"{name}_bwd"] = (fns[1], 2.5)
    times = alternating_ms({key: fn for key, (fn, _) in timed.items()}, rounds, reps, warm_s)
    for key, (_, factor) in timed.items():
        row[key] = factor * flops / statistics.median(times[key]) / 1e9
    return row


def fmt(row, key):
    return f"{row[key]:.0f}" if key in row else "-"


def ratio(row, a, b):
    return f"{row[a] / row[b]:.2f}" if a in row and b in row else "-"


ALGORITHMS = {1: "FA1", 2: "FA2", 3: "FA3"}


def forward_table(rows):
    head = ("| dtype | d | N | causal | ours | ours fwd | flash fwd | cuDNN fwd | ours/flash | "
            "ours/cuDNN | ours FA2 fwd | FA2/flash | no overlap | no ping-pong |" +
            "".join(f" {b} |" for b in EXTRA))
    lines = [head, "|" + "---|" * (14 + len(EXTRA))]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['d']} | {r['n']} | {int(r['causal'])} | "
            f"{ALGORITHMS.get(r.get('algorithm'), '-')} | {fmt(r, 'ours_fwd')} | "
            f"{fmt(r, 'flash_fwd')} | {fmt(r, 'cudnn_fwd')} | {ratio(r, 'ours_fwd', 'flash_fwd')} | "
            f"{ratio(r, 'ours_fwd', 'cudnn_fwd')} | {fmt(r, 'fa2_fwd')} | "
            f"{ratio(r, 'fa2_fwd', 'flash_fwd')} | {fmt(r, 'nooverlap_fwd')} | "
            f"{fmt(r, 'nopingpong_fwd')} |" + "".join(f" {fmt(r, b + '_fwd')} |" for b in EXTRA))
    return lines


def backward_table(rows):
    head = ("| dtype | d | N | causal | ours | ours bwd | flash bwd | cuDNN bwd | ours/flash | "
            "ours/cuDNN | ours bwd deterministic | ours FA2 bwd | FA2/flash |" +
            "".join(f" {b} bwd | {b} deterministic |" for b in EXTRA))
    lines = [head, "|" + "---|" * (13 + 2 * len(EXTRA))]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['d']} | {r['n']} | {int(r['causal'])} | "
            f"{ALGORITHMS.get(r.get('bwd_algorithm'), '-')} | {fmt(r, 'ours_bwd')} | "
            f"{fmt(r, 'flash_bwd')} | {fmt(r, 'cudnn_bwd')} | {ratio(r, 'ours_bwd', 'flash_bwd')} | "
            f"{ratio(r, 'ours_bwd', 'cudnn_bwd')} | {fmt(r, 'ours_bwd_det')} | "
            f"{fmt(r, 'fa2_bwd')} | {ratio(r, 'fa2_bwd', 'flash_bwd')} |" +
            "".join(f" {fmt(r, b + '_bwd')} | {fmt(r, b + '_bwd_det')} |" for b in EXTRA))
    return lines


def plot(rows, path, dtype="bf16"):
    """A grid of panels, one per (pass, causal) row and head dim column:
    TFLOP/s over N for ours and the peers, and above each of our points its
    ratio to the best peer at that N. One shared legend."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in rows if r["dtype"] == dtype]
    dims = sorted({r["d"] for r in rows})
    panels = [(pass_, causal) for pass_ in ("fwd", "bwd") for causal in (False, True)]
    styles = {"ours": ("ours", "tab:red", "o"), "flash": ("FlashAttention-2 (SDPA flash)",
              "tab:blue", "s"), "cudnn": ("cuDNN (SDPA)", "tab:green", "^"),
              "fa4": ("FlashAttention-4", "tab:purple", "D")}
    fig, axes = plt.subplots(len(panels), len(dims), figsize=(4.2 * len(dims), 3.1 * len(panels)),
                             squeeze=False, sharex=True)
    for i, (pass_, causal) in enumerate(panels):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r["d"] == d and r["causal"] == causal),
                         key=lambda r: r["n"])
            for impl, (label, color, marker) in styles.items():
                pts = [(r["n"], r[f"{impl}_{pass_}"]) for r in sel if f"{impl}_{pass_}" in r]
                if pts:
                    ax.plot(*zip(*pts), marker=marker, color=color, label=label, lw=1.5, ms=4)
            for r in sel:
                peers = [r[f"{x}_{pass_}"] for x in ("flash", "cudnn", "fa4") if f"{x}_{pass_}" in r]
                if peers and f"ours_{pass_}" in r:
                    q = r[f"ours_{pass_}"] / max(peers)
                    ax.annotate(f"{q:.2f}", (r["n"], r[f"ours_{pass_}"]), textcoords="offset points",
                                xytext=(0, 5 if q >= 1 else -12), ha="center", fontsize=7,
                                color="tab:red")
            ax.set_xscale("log", base=2)
            ns = [r["n"] for r in sel]
            ax.set_xticks(ns)
            ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ns])
            ax.set_title(f"{'forward' if pass_ == 'fwd' else 'backward'}, d = {d}"
                         f"{', causal' if causal else ''}", fontsize=10)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == len(panels) - 1:
                ax.set_xlabel("sequence length N")
            ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.12)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=10,
               title=f"{dtype}, H200; numbers: ours / best peer at that N", title_fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=90)
    return True


def write_results(rows, out, method, final=True):
    """results_gpu.md and .json in out, and at the end (final) the .png where
    matplotlib is; returns the tables as lines of text."""
    # The device machine gets a copy of the tree without .git: FA_COMMIT names it.
    commit = os.environ.get("FA_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=ROOT).stdout.strip() or "unknown"
    header = [
        "# GPU benchmark: flashattn vs PyTorch SDPA (flash = FlashAttention-2, cuDNN)",
        "",
        f"- date: {datetime.date.today()}",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, "
        f"cuDNN {torch.backends.cudnn.version()}",
        f"- commit: {commit}",
        "- TFLOP/s; forward 4·B·H·N²·d (halved when causal), backward 2.5× forward;"
        f" B = 16384/N, H = 2048/d; {method}; ratios > 1 mean flashattn is faster",
        "- ours = the default build (column `ours` names the kernel it ran: FA3 backward at"
        " d = 64, 128, 256 in the atomic mode on Hopper, FA2 else; the deterministic mode is FA2);"
        " ours FA2 = built with FA_SM90=0; no overlap / no ping-pong = FA3 built with"
        " FA_FA3_OVERLAP=0 / FA_FA3_PINGPONG=0",
        "- command: `make bench`",
        "",
    ]
    tables = ["## Forward", ""] + forward_table(rows) + ["", "## Backward", ""] + \
        backward_table(rows)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results_gpu.md"), "w") as f:
        f.write("\n".join(header + tables) + "\n")
    with open(os.path.join(out, "results_gpu.json"), "w") as f:
        json.dump(dict(commit=commit, gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    if final:
        plot(rows, os.path.join(out, "results_gpu.png"))
    return tables


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=SO")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=float, default=0.1, help="seconds each fn runs before timing")
    ap.add_argument("--resume", metavar="JSON", help="keep this earlier run's rows; skip their configs")
    args = ap.parse_args()
    for spec in args.extra:
        name, path = spec.split("=", 1)
        FORWARD_BUILDS[name] = fa.load_gpu(os.path.abspath(path))
        if FORWARD_BUILDS[name] is None:
            raise SystemExit(f"bench_gpu: {path} does not exist")
        EXTRA.append(name)
    if torch is None or not torch.cuda.is_available() or fa.GPU is None:
        print("bench_gpu: needs a GPU, the CUDA shim (make) and PyTorch; skipped")
        return
    sizes = [1024, 4096, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    method = (f"each time the median over {args.rounds} rounds, the implementations taking turns"
              f" (each round starting one further along), of a CUDA-event median of 6 runs"
              f" (3 at N >= 8192) after {args.warm} s of running back to back")
    rows = json.load(open(args.resume))["rows"] if args.resume else []
    done = {(r["dtype"], r["d"], r["n"], r["causal"]) for r in rows}
    for dtype in args.dtypes.split(","):
        for d in map(int, args.dims.split(",")):
            for causal in (False, True):
                for n in sizes:
                    if (dtype, d, n, causal) in done:
                        continue
                    r = run_config(dtype, d, n, causal, args.rounds,
                                   reps=3 if n >= 8192 else 6, warm_s=args.warm,
                                   backward=not args.no_backward)
                    rows.append(r)
                    print(forward_table([r])[2], flush=True)
                    print(backward_table([r])[2], flush=True)
                    write_results(rows, args.out, method, final=False)  # kept if cut short
    print("\n".join(write_results(rows, args.out, method)))


if __name__ == "__main__":
    main()
