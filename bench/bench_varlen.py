"""Ragged batches on the GPU (`make bench-varlen`): a varlen batch (32
sequences, lengths drawn from 128 .. 8k, ~140k tokens) against a dense batch
of the same tokens at the one length that gives the same FLOPs
(sum n_i^2 / sum n_i), forward and backward, bf16, Hq = Hkv = 16, d = 128,
causal and not. TFLOP/s count each sequence's own 4 H n^2 d (halved when
causal; x2.5 backward); the time is the median of alternating rounds
(bench_gpu.alternating_ms). "host ms": how long the varlen call takes to
return while the stream still runs the one before it (a call that waited
for the GPU would show the GPU's time there). Prints the table and writes
bench/results_varlen.md (or OUT/results_varlen.md with --out OUT).

--profile: no timing; the non-causal varlen and dense calls made (a
forward each), then one backward of each, for a profiler, e.g.
  ncu -k regex:bwd --section SpeedOfLight python3 bench/bench_varlen.py --profile
--extra NAME=SHIM (repeatable): another build's varlen forward and backward
(host offsets) timed in the same rotation, printed as ratios to this
build's (a same-process A/B; not written to the results file).
--uniform: the varlen call also over the dense batch's sequences (equal
lengths, host offsets), printed as its ratio to the dense call: what the
varlen instance costs apart from the length mix (not written to the
results file); with --profile, the profiled varlen calls take those
lengths.

--ab ROUNDS: only the backward of the varlen batch (this build's and each
--extra's) and, with --uniform, of the dense batch and of the varlen call
over its lengths (each build's), over ROUNDS alternating rounds; prints the
ratios, writes no results file (a tighter A/B of the backward).

Usage: python3 bench/bench_varlen.py [--out DIR] [--profile] [--uniform] [--ab ROUNDS]
                                     [--extra NAME=SHIM ...]
"""
import ctypes
import datetime
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402

import bench_gpu as bg  # noqa: E402
import fa  # noqa: E402

HEADS, DIM, ROUNDS, REPS = 16, 128, 5, 10


def make_call(lengths, causal, varlen, device_offsets=False, lib=None):
    """(forward, backward) closures over fresh bf16 inputs; varlen: one packed
    batch with host cu_seqlens (device_offsets: in device memory), else a dense batch of len(lengths) sequences of
    lengths[0] tokens. lib: the build (default fa.GPU)."""
    lib = lib or fa.GPU
    total = int(sum(lengths))
    shape = (1, total, HEADS, DIM) if varlen else (len(lengths), lengths[0], HEADS, DIM)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    p = fa.Params()
    p.dtype, p.heads_q, p.heads_kv, p.head_dim = fa.DTYPES["bf16"], HEADS, HEADS, DIM
    p.causal = int(causal)
    keep = []
    if varlen:
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        keep.append(cu)
        lse = torch.empty((HEADS, total), device="cuda", dtype=torch.float32)
        p.batch, p.seqlen_q, p.seqlen_k = len(lengths), int(max(lengths)), int(max(lengths))
        p.cu_seqlens_q = p.cu_seqlens_k = cu.ctypes.data
        if device_offsets:
            cu_dev = torch.from_numpy(cu).cuda()
            keep.append(cu_dev)
            p.cu_seqlens_q = p.cu_seqlens_k = cu_dev.data_ptr()
            p.tables_on_device, p.total_q, p.total_k = 1, total, total
    else:
        lse = torch.empty((shape[0], HEADS, shape[1]), device="cuda", dtype=torch.float32)
        p.batch, p.seqlen_q, p.seqlen_k = shape[0], shape[1], shape[1]
    for name, t in dict(q=q, k=k, v=v, o=o, dout=dout, dq=dq, dk=dk, dv=dv).items():
        setattr(p, name, t.data_ptr())
    p.lse = lse.data_ptr()
    size = max(lib.fa_cuda_forward_workspace_size(ctypes.byref(p)),
               lib.fa_cuda_backward_workspace_size(ctypes.byref(p), 0), 16)
    ws = torch.empty(size, device="cuda", dtype=torch.uint8)
    keep += [q, k, v, dout, o, dq, dk, dv, lse, ws]

    def stream():
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def forward():
        s = lib.fa_cuda_forward(ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()),
                                   ctypes.c_size_t(size), stream())
        assert s == fa.FA_OK and keep, lib.fa_last_error_detail().decode()

    def backward():
        s = lib.fa_cuda_backward(ctypes.byref(p), 0, ctypes.c_void_p(ws.data_ptr()),
                                    ctypes.c_size_t(size), stream())
        assert s == fa.FA_OK, lib.fa_last_error_detail().decode()

    forward()
    return forward, backward


def host_ms(fn, reps=5):
    """Median wall time of fn's return, each call queued behind another."""
    times = []
    for _ in range(reps):
        fn()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def main():
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else HERE
    extra = [(a.split("=", 1)[0], fa.load_gpu(os.path.abspath(a.split("=", 1)[1])))
             for i, a in enumerate(sys.argv) if i > 0 and sys.argv[i - 1] == "--extra"]
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(128, 8193, 32)]
    dense_n = int(round(sum(x * x for x in lengths) / sum(lengths)))
    dense_b = max(1, int(round(sum(lengths) / dense_n)))
    dense = [dense_n] * dense_b  # the dense batch's sequences
    if "--profile" in sys.argv:  # with --uniform, the varlen call over the dense batch's lengths
        mix = dense if "--uniform" in sys.argv else lengths
        backwards = make_call(mix, False, True)[1], make_call(dense, False, False)[1]
        for backward in backwards:
            backward()
        torch.cuda.synchronize()
        return
    if "--ab" in sys.argv:
        rounds = int(sys.argv[sys.argv.index("--ab") + 1])
        for causal in (False, True):
            fns = {"vb": make_call(lengths, causal, True)[1]}
            for name, lib in extra:
                fns[name + "_b"] = make_call(lengths, causal, True, lib=lib)[1]
            if "--uniform" in sys.argv:
                fns["db"], fns["ub"] = make_call(dense, causal, False)[1], make_call(dense, causal, True)[1]
                for name, lib in extra:
                    fns[name + "_ub"] = make_call(dense, causal, True, lib=lib)[1]
            t = bg.alternating_ms(fns, rounds, REPS, 0.1)
            med = {k: sorted(x)[len(x) // 2] for k, x in t.items()}
            for name, _ in extra:
                ratios = sorted(a / b for a, b in zip(t["vb"], t[name + "_b"]))
                print(f"A/B causal={causal} {name}: varlen bwd {med['vb'] / med[name + '_b']:.3f} "
                      f"(this build's time / {name}'s; rounds {ratios[0]:.3f} - {ratios[-1]:.3f})",
                      flush=True)
            if "--uniform" in sys.argv:
                for name in [""] + [name for name, _ in extra]:
                    ub = med[(name + "_" if name else "") + "ub"]
                    print(f"uniform causal={causal}{' ' + name if name else ''}: varlen over "
                          f"{dense_b} x {dense_n} / dense: bwd {med['db'] / ub:.3f} (TFLOP/s ratio)",
                          flush=True)
        return
    os.makedirs(out, exist_ok=True)
    rows = []
    for causal in (False, True):
        flops = 4.0 * HEADS * DIM * sum(x * x for x in lengths) / (2 if causal else 1)
        dense_flops = 4.0 * HEADS * DIM * dense_b * dense_n ** 2 / (2 if causal else 1)
        vf, vb = make_call(lengths, causal, True)
        df, db = make_call(dense, causal, False)
        ddf, ddb = make_call(lengths, causal, True, device_offsets=True)
        fns = {"vf": vf, "df": df, "vb": vb, "db": db, "ddf": ddf, "ddb": ddb}
        for name, lib in extra:
            fns[name + "_f"], fns[name + "_b"] = make_call(lengths, causal, True, lib=lib)
        if "--uniform" in sys.argv:
            fns["uf"], fns["ub"] = make_call(dense, causal, True)
        t = bg.alternating_ms(fns, ROUNDS, REPS, 0.1)
        med = {k: sorted(x)[len(x) // 2] for k, x in t.items()}
        r = dict(causal=causal, v_fwd=flops / med["vf"] * 1e-9, d_fwd=dense_flops / med["df"] * 1e-9,
                 dev_fwd=flops / med["ddf"] * 1e-9, host_dev=host_ms(ddf),
                 v_bwd=2.5 * flops / med["vb"] * 1e-9, d_bwd=2.5 * dense_flops / med["db"] * 1e-9,
                 dev_bwd=2.5 * flops / med["ddb"] * 1e-9, host_dev_bwd=host_ms(ddb),
                 ms_fwd=med["vf"], ms_bwd=med["vb"], host_fwd=host_ms(vf), host_bwd=host_ms(vb))
        rows.append(r)
        print(r, flush=True)
        for name, _ in extra:  # time ratios: above 1 is faster than this build
            print(f"A/B causal={causal} {name}: varlen fwd {med['vf'] / med[name + '_f']:.3f}, "
                  f"bwd {med['vb'] / med[name + '_b']:.3f} (this build's time / {name}'s)",
                  flush=True)
        if "--uniform" in sys.argv:  # the same FLOPs as the dense call
            print(f"uniform causal={causal}: varlen over {dense_b} x {dense_n} / dense: fwd "
                  f"{med['df'] / med['uf']:.3f}, bwd {med['db'] / med['ub']:.3f} (TFLOP/s ratios)",
                  flush=True)
    lines = [
        "# Ragged batches on the GPU",
        "",
        f"- date: {datetime.date.today()}; GPU: {torch.cuda.get_device_name()}; commit: "
        f"{os.environ.get('FA_COMMIT', 'unknown')}; command: `python3 bench/bench_varlen.py`",
        f"- varlen: {len(lengths)} sequences, {sum(lengths)} tokens, lengths {min(lengths)} .. "
        f"{max(lengths)}; dense: {dense_b} x {dense_n} (the same FLOPs); bf16, H = {HEADS}, "
        f"d = {DIM}; TFLOP/s",
        "",
        "\"device offsets\": cu_seqlens in device memory (tables_on_device), the schedule "
        "made on the GPU.",
        "",
        "| causal | varlen fwd | dense fwd | ratio | varlen fwd, device offsets | ratio | "
        "varlen bwd | dense bwd | ratio | varlen bwd, device offsets | ratio | "
        "fwd ms GPU / host (device offsets: host) | bwd ms GPU / host (device offsets: host) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ] + [f"| {'yes' if r['causal'] else 'no'} | {r['v_fwd']:.0f} | {r['d_fwd']:.0f} | "
         f"{r['v_fwd'] / r['d_fwd']:.2f} | {r['dev_fwd']:.0f} | {r['dev_fwd'] / r['d_fwd']:.2f} | "
         f"{r['v_bwd']:.0f} | {r['d_bwd']:.0f} | "
         f"{r['v_bwd'] / r['d_bwd']:.2f} | {r['dev_bwd']:.0f} | {r['dev_bwd'] / r['d_bwd']:.2f} | "
         f"{r['ms_fwd']:.2f} / {r['host_fwd']:.3f} ({r['host_dev']:.3f}) | "
         f"{r['ms_bwd']:.2f} / {r['host_bwd']:.3f} ({r['host_dev_bwd']:.3f}) |" for r in rows]
    with open(os.path.join(out, "results_varlen.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
