"""Context parallelism: chunk pairs of a sharded sequence (fa_params.positions),
gradients added into fp32 buffers (accumulate_grads, grads_f32), the running
merge (fa_combine_params.accumulate), and a ring of ranks simulated on one
device against the whole sequence. GPU cases run where a GPU is."""
import ctypes

import numpy as np

import fa
import reference
from harness import case, test
from test_cpu import FLOOR, _bad, _set, backward_case, check_lse, forward_case, rng_for
from test_gpu import gpu_backward, gpu_forward, need_gpu

# ---- one chunk pair against the float64 reference ---------------------------

# (q_position, k_position): keys all before the queries, the diagonal, a
# diagonal that crosses the pair, windows reaching across chunks, positions
# near 2^31, and top-left alignment (both 0) with Nq != Nk.
POSITION_CASES = [
    ("diagonal", dict(seqlen_q=100, seqlen_k=100, positions=(1000, 1000), causal=True)),
    ("keys_before", dict(seqlen_q=70, seqlen_k=130, positions=(5000, 100), causal=True)),
    ("crossing", dict(seqlen_q=77, seqlen_k=99, positions=(100, 60), causal=True)),
    ("window", dict(seqlen_q=100, seqlen_k=150, positions=(300, 200), window=(50, 10))),
    ("window_causal_gqa", dict(heads_q=4, heads_kv=2, seqlen_q=65, seqlen_k=257,
                               positions=(64, 0), causal=True, window=(100, -1))),
    ("far", dict(seqlen_q=30, seqlen_k=40, positions=(2**31 - 31, 2**31 - 90), causal=True)),
    ("top_left_bf16", dict(seqlen_q=50, seqlen_k=200, positions=(0, 0), causal=True,
                           dtype="bf16")),
]
for name, cfg in POSITION_CASES:
    case(f"positions_fwd_{name}", forward_case, head_dim=64, **cfg)
    case(f"positions_bwd_{name}", backward_case, head_dim=64, **cfg)
    gpu_cfg = dict(cfg, dtype="bf16")
    case(f"gpu_positions_fwd_{name}", gpu_forward, head_dim=64, **gpu_cfg)
    case(f"gpu_positions_bwd_{name}", gpu_backward, head_dim=64, **gpu_cfg)
# long enough for several tiles of every GPU kernel, decode-sized query counts
for d, nq, nk, pos in ((128, 1000, 1500, (3000, 2600)), (64, 2000, 700, (700, 0)),
                       (256, 300, 900, (1000, 300)), (128, 4, 5000, (4990, 0)),
                       (128, 16, 3000, (100, 50))):
    case(f"gpu_positions_fwd_d{d}_{nq}x{nk}", gpu_forward, heads_q=8, heads_kv=2, seqlen_q=nq,
         seqlen_k=nk, head_dim=d, dtype="bf16", causal=True, positions=pos)
    case(f"gpu_positions_bwd_d{d}_{nq}x{nk}", gpu_backward, heads_q=4, heads_kv=2, seqlen_q=nq,
         seqlen_k=nk, head_dim=d, dtype="bf16", causal=True, positions=pos)


def _keys_after_queries(backend):
    """Keys that all come after the queries: every row sees none, O = 0,
    LSE = -inf, and the gradients are exactly zero."""
    prob = fa.Problem(rng_for("keys_after"), heads_q=4, heads_kv=2, seqlen_q=64, seqlen_k=80,
                      head_dim=64, dtype="f32" if backend in ("fa2", "fa1") else "bf16",
                      causal=True, positions=(0, 500))
    status, o, lse = prob.forward(backend)
    assert status == fa.FA_OK, fa.status_name(status)
    assert (o == 0).all() and np.isneginf(lse).all(), "rows that see no key"
    if backend == "fa1":
        return None
    status, dq, dk, dv = prob.backward(o, lse, "gpu" if backend == "gpu" else backend)
    assert status == fa.FA_OK, fa.status_name(status)
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all(), "gradients of no key"
    return None


for backend in ("fa2", "fa1"):
    case(f"positions_keys_after_queries_{backend}", _keys_after_queries, backend)


@test
def gpu_positions_keys_after_queries():
    need_gpu()
    _keys_after_queries("gpu")


@test
def positions_chunk_is_the_whole_sequence_restricted():
    """A chunk pair with positions is the whole sequence's attention of those
    query rows to those keys only (reference.forward with keys=), so the mask
    means what it says independently of reference.mask's shift."""
    rng = rng_for("chunk_whole")
    n, d = 300, 32
    for causal, window in ((True, None), (False, (40, 7)), (True, (25, -1))):
        whole = fa.Problem(rng, heads_q=2, seqlen_q=n, seqlen_k=n, head_dim=d, causal=causal,
                           window=window)
        for q0, q1, k0, k1 in ((0, 100, 0, 100), (200, 300, 50, 260), (120, 121, 100, 300),
                               (10, 290, 150, 151)):
            chunk = fa.Problem(rng, heads_q=2, seqlen_q=q1 - q0, seqlen_k=k1 - k0, head_dim=d,
                               causal=causal, window=window, positions=(q0, k0))
            chunk.q, chunk.k, chunk.v = whole.q[:, q0:q1], whole.k[:, k0:k1], whole.v[:, k0:k1]
            ref_o, ref_lse = reference.forward(whole.q, whole.k, whole.v, keys=(k0, k1),
                                               **whole.reference_args())
            status, o, lse = chunk.forward("fa2")
            assert status == fa.FA_OK
            err = fa.rel_err(o, ref_o[:, q0:q1])
            assert err < 1e-5, (causal, window, q0, k0, err)
            check_lse(lse, ref_lse[:, :, q0:q1])


# ---- the gradients' storage and accumulation --------------------------------

def _grad_buffers(prob, f32, rng):
    """dq, dk, dv in fp32 (f32) or the dtype, each filled with fresh values."""
    out = {}
    for name in ("dq", "dk", "dv"):
        t = fa.Tensor(prob._shape(name), "f32" if f32 else prob.dtype, prob.layout)
        t.view[...] = fa.to_storage(rng.standard_normal(t.view.shape), t.dtype)
        out[name] = t
    return out


def _run_backward(prob, o, lse, backend, grads, accumulate, f32):
    t = {"q": prob.tensor("q", prob.q), "k": prob.tensor("k", prob.k),
         "v": prob.tensor("v", prob.v), "o": prob.tensor("o", o),
         "dout": prob.tensor("dout", prob.dout)}
    t.update(grads)
    t["lse"] = np.ascontiguousarray(lse, np.float32)
    p = prob.params(t)
    p.accumulate_grads, p.grads_f32 = int(accumulate), int(f32)
    status = fa.call_backward(backend, p)
    assert status == fa.FA_OK, f"{backend}: {fa.status_name(status)}"
    return [grads[n].values() for n in ("dq", "dk", "dv")]


def accumulate_grads_case(backend, dtype, f32):
    """dq, dk, dv written in fp32 (grads_f32), then the same gradients added
    to fresh values already in the buffers (accumulate_grads): the sum is
    the buffers' values plus the gradients, to one rounding of the storage."""
    rng = rng_for(f"acc{backend}{dtype}{f32}")
    prob = fa.Problem(rng, heads_q=4, heads_kv=2, seqlen_q=130, seqlen_k=90, head_dim=64,
                      dtype=dtype, causal=True)
    status, o, lse = prob.forward(backend.replace("_det", ""))
    assert status == fa.FA_OK
    written = _run_backward(prob, o, lse, backend, _grad_buffers(prob, f32, rng), False, f32)
    start = _grad_buffers(prob, f32, rng)
    before = [t.values() for t in start.values()]
    added = _run_backward(prob, o, lse, backend, start, True, f32)
    # two roundings of half an ulp (the gradient's, the sum's): one ulp of the storage
    ulp = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7}
    unit = ulp["f32" if f32 else dtype]
    for name, w, b, a in zip(("dq", "dk", "dv"), written, before, added):
        exact = b + w
        limit = unit * (np.abs(b) + np.abs(w))
        if backend == "gpu" and name == "dq":  # atomic adds: each run's dQ rounds its own way
            limit += ulp[dtype] * np.abs(w)
        assert (np.abs(a - exact) <= limit + 1e-30).all(), name
    if f32 and dtype != "f32" and not backend.startswith("gpu"):  # not rounded to the dtype
        assert any((fa.quantize(w, dtype) != w).any() for w in written), "fp32 grads rounded"
    return None


for backend in ("fa2",):
    for dtype, f32 in (("f32", False), ("bf16", False), ("bf16", True), ("f16", True)):
        case(f"accumulate_grads_{dtype}_f32{int(f32)}", accumulate_grads_case, backend, dtype,
             f32)


def gpu_accumulate_grads_case(backend, dtype, f32):
    need_gpu()
    return accumulate_grads_case(backend, dtype, f32)


for backend in ("gpu", "gpu_det"):
    for dtype, f32 in (("bf16", False), ("bf16", True), ("f16", True)):
        case(f"{backend}_accumulate_grads_{dtype}_f32{int(f32)}", gpu_accumulate_grads_case,
             backend, dtype, f32)


# ---- the running merge ------------------------------------------------------

def running_merge_case(backend, part_dtype, shape=(2, 33, 3, 96)):
    """Parts merged one at a time into an fp32 o and its lse (accumulate),
    starting from lse = -inf, equal the merge of all parts at once; parts
    that saw no key (LSE -inf) and rows no part saw included."""
    rng = rng_for("running" + backend + part_dtype + str(shape))
    (b, n, h, d), parts = shape, 5
    o_parts = [fa.quantize(rng.standard_normal((b, n, h, d)), part_dtype) for _ in range(parts)]
    lse_parts = [rng.standard_normal((b, h, n)) * 3 for _ in range(parts)]
    lse_parts[2][:, :, :10] = -np.inf
    for x in lse_parts:
        x[0, 1, 5] = -np.inf  # no part saw this row
    ref_o, ref_lse = reference.combine(o_parts, lse_parts)
    acc = fa.Tensor((b, n, h, d), "f32", values=np.zeros((b, n, h, d)))
    acc_lse = np.full((b, h, n), -np.inf, np.float32)
    for x, y in zip(o_parts, lse_parts):
        part = fa.Tensor((b, n, h, d), part_dtype, values=x)
        part_lse = np.ascontiguousarray(y, np.float32)
        c = fa.CombineParams()
        c.num_parts, c.batch, c.heads, c.seqlen, c.head_dim = 1, b, h, n, d
        c.part_dtype, c.dtype, c.accumulate = fa.DTYPES[part_dtype], fa.DTYPES["f32"], 1
        ptrs, lptrs = (ctypes.c_void_p * 1)(part.ptr), (ctypes.c_void_p * 1)(part_lse.ctypes.data)
        c.o_parts = ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p))
        c.lse_parts = ctypes.cast(lptrs, ctypes.POINTER(ctypes.c_void_p))
        c.part_layout, c.o, c.o_layout = part.layout, acc.ptr, acc.layout
        c.lse = acc_lse.ctypes.data
        status = (fa.CPU.fa_cpu_combine(ctypes.byref(c), None) if backend == "cpu"
                  else fa.GPU.fa_test_gpu_combine(ctypes.byref(c)))
        assert status == fa.FA_OK, fa.status_name(status)
    err = fa.rel_err(acc.values(), ref_o)
    assert err < 1e-5, err
    check_lse(acc_lse.astype(np.float64), ref_lse)
    assert (acc.values()[0, 5, 1] == 0).all()
    return f"err {err:.1e}"


for part_dtype in ("f32", "bf16", "f16"):
    case(f"combine_running_merge_{part_dtype}", running_merge_case, "cpu", part_dtype)


def gpu_running_merge_case(part_dtype, shape=(2, 33, 3, 96)):
    need_gpu()
    return running_merge_case("gpu", part_dtype, shape)


for part_dtype in ("f32", "bf16"):
    case(f"gpu_combine_running_merge_{part_dtype}", gpu_running_merge_case, part_dtype)
# enough rows for the combine kernel's 4-columns-a-lane form (d = 96: rows
# of 3 warps, d = 72: a lane's last columns past the end)
for d in (96, 72):
    case(f"gpu_combine_running_merge_many_rows_d{d}", gpu_running_merge_case, "bf16",
         (1, 4096, 17, d))


# ---- a ring simulated on one device -----------------------------------------

def ring_chunks(n, ranks, zigzag):
    """The (start, length) chunks of the sequence each rank holds: zigzag
    (rank r: chunks r and 2R - 1 - r of 2R, the causal load balanced), or
    one contiguous chunk each, uneven where n does not divide."""
    if zigzag:
        c = n // (2 * ranks)
        assert c * 2 * ranks == n
        return [[(r * c, c), ((2 * ranks - 1 - r) * c, c)] for r in range(ranks)]
    bounds = [n * r // ranks for r in range(ranks + 1)]
    return [[(bounds[r], bounds[r + 1] - bounds[r])] for r in range(ranks)]


def _rows(t, start):
    """Pointer to row `start` of a fa.Tensor (same layout)."""
    return t.ptr + start * t.layout.seq * t.storage.itemsize


def _pair_params(prob, t, qc, kc):
    """fa_params of query chunk qc against key chunk kc: views of the whole
    tensors by pointer, no copies, and the chunks' positions."""
    (qs, ql), (ks, kl) = qc, kc
    p = fa.Params()
    p.dtype = fa.DTYPES[prob.dtype]
    p.batch, p.heads_q, p.heads_kv, p.head_dim = prob.b, prob.hq, prob.hkv, prob.d
    p.seqlen_q, p.seqlen_k, p.causal, p.softcap = ql, kl, int(prob.causal), prob.softcap
    if prob.window is not None:
        p.window, (p.window_left, p.window_right) = 1, prob.window
    p.positions, p.q_position, p.k_position = 1, qs, ks
    for name, start in (("q", qs), ("o", qs), ("dout", qs), ("dq", qs), ("k", ks), ("v", ks),
                        ("dk", ks), ("dv", ks)):
        if name in t:
            setattr(p, name, _rows(t[name], start))
            setattr(p, name + "_layout", t[name].layout)
    return p


def ring_case(backend, n, ranks, zigzag, **cfg):
    """Every rank attends its query chunks to the key chunks in the order a
    ring passes them (its own first), merging each step into an fp32 running
    output (fa_*_combine with accumulate); the backward then walks the ring
    again with the merged O and LSE, adding each step's gradients into fp32
    dQ, dK, dV (accumulate_grads, grads_f32). Both against the whole
    sequence's float64 reference, the bound twice the error of the same
    chunked computation in float32 NumPy (each step's O rounded to the
    dtype; on the GPU each step's gradients too)."""
    gpu = backend.startswith("gpu")
    if gpu:
        need_gpu()
    prob = fa.Problem(rng_for(f"ring{backend}{n}{ranks}{zigzag}{cfg}"), seqlen_q=n, seqlen_k=n,
                      **cfg)
    args = prob.reference_args()
    chunks = ring_chunks(n, ranks, zigzag)
    t = {name: prob.tensor(name, getattr(prob, name)) for name in ("q", "k", "v", "dout")}
    tensor_core = None
    if gpu and prob.dtype != "f32":
        tensor_core = lambda x: fa.quantize(x, prob.dtype)  # noqa: E731
    # forward: o_acc [B, N, H, dv] fp32 and one LSE per query chunk
    o_acc = fa.Tensor((prob.b, n, prob.hq, prob.dv), "f32", prob.layout,
                      np.zeros((prob.b, n, prob.hq, prob.dv)))
    lse_acc = {qc: np.full((prob.b, prob.hq, qc[1]), -np.inf, np.float32)
               for rank in chunks for qc in rank}
    low_parts = {qc: [] for qc in lse_acc}
    for r, mine in enumerate(chunks):
        for step in range(ranks):
            for kc in chunks[(r - step) % ranks]:
                for qc in mine:
                    part = fa.Tensor((prob.b, qc[1], prob.hq, prob.dv), prob.dtype, prob.layout)
                    part_lse = np.full((prob.b, prob.hq, qc[1]), np.nan, np.float32)
                    p = _pair_params(prob, dict(t, o=part), qc, kc)
                    p.o, p.o_layout, p.lse = part.ptr, part.layout, part_lse.ctypes.data
                    status = fa.call_forward(backend, p)
                    assert status == fa.FA_OK, f"forward {qc} x {kc}: {fa.status_name(status)}"
                    _merge(backend, prob, o_acc, qc, lse_acc[qc], part, part_lse)
                    lo, ll = reference.forward(prob.q, prob.k, prob.v, precision=np.float32,
                                               keys=(kc[0], kc[0] + kc[1]), round_p=tensor_core,
                                               **args)
                    low_parts[qc].append((fa.quantize(lo[:, qc[0]:qc[0] + qc[1]], prob.dtype),
                                          ll[:, :, qc[0]:qc[0] + qc[1]]))
    ref_o, ref_lse = reference.forward(prob.q, prob.k, prob.v, **args)
    o = fa.quantize(o_acc.values(), prob.dtype)  # the ring's output, stored in the dtype
    lse = np.zeros((prob.b, prob.hq, n))
    low_o = np.zeros_like(ref_o)
    for qc, acc in lse_acc.items():
        lse[:, :, qc[0]:qc[0] + qc[1]] = acc
        merged, _ = reference.combine([x for x, _ in low_parts[qc]], [y for _, y in low_parts[qc]])
        low_o[:, qc[0]:qc[0] + qc[1]] = merged
    logit_rounding = reference.max_logit(prob.q, prob.k, prob.scale) * 2.0**-24
    err = fa.rel_err(o, ref_o)
    limit = 2.0 * fa.rel_err(fa.quantize(low_o, prob.dtype), ref_o) + FLOOR + logit_rounding
    assert err <= limit, f"ring forward: error {err:.3g} > bound {limit:.3g}"
    check_lse(lse, ref_lse)
    # backward: fp32 accumulators, each step's gradients added in
    g = {name: fa.Tensor(prob._shape(name), "f32", prob.layout, np.zeros(prob._shape(name)))
         for name in ("dq", "dk", "dv")}
    t.update(g, o=prob.tensor("o", o))
    low = [np.zeros(prob._shape(name)) for name in ("dq", "dk", "dv")]
    for r, mine in enumerate(chunks):
        for step in range(ranks):
            for kc in chunks[(r - step) % ranks]:
                for qc in mine:
                    (qs, ql), (ks, kl) = qc, kc
                    chunk_lse = np.ascontiguousarray(lse[:, :, qs:qs + ql], np.float32)
                    p = _pair_params(prob, t, qc, kc)
                    p.lse, p.accumulate_grads, p.grads_f32 = chunk_lse.ctypes.data, 1, 1
                    status = fa.call_backward(backend, p)
                    assert status == fa.FA_OK, f"backward {qc} x {kc}: {fa.status_name(status)}"
                    part = reference.backward(
                        prob.q[:, qs:qs + ql], prob.k[:, ks:ks + kl], prob.v[:, ks:ks + kl],
                        prob.dout[:, qs:qs + ql], precision=np.float32, o=o[:, qs:qs + ql],
                        lse=chunk_lse, round_p=tensor_core, shift=qs - ks,
                        **{k: v for k, v in args.items() if k != "shift"})
                    if gpu:  # the GPU adds each step's gradients rounded to the dtype
                        part = [fa.quantize(x, prob.dtype) for x in part]
                    low[0][:, qs:qs + ql] += part[0]
                    low[1][:, ks:ks + kl] += part[1]
                    low[2][:, ks:ks + kl] += part[2]
    grads, mags = reference.backward(prob.q, prob.k, prob.v, prob.dout, magnitudes=True, **args)
    errs = [err]
    for name, r_, lp, mag in zip(("dq", "dk", "dv"), grads, low, mags):
        got = g[name].values()
        scale = max(np.linalg.norm(mag), np.linalg.norm(r_))
        e = np.linalg.norm(got - r_) / scale
        limit = 2.0 * np.linalg.norm(lp - r_) / scale + FLOOR + logit_rounding
        assert e <= limit, f"ring {name}: error {e:.3g} > bound {limit:.3g}"
        errs.append(e)
    return "errs " + " ".join(f"{e:.1e}" for e in errs)


def _merge(backend, prob, o_acc, qc, acc_lse, part, part_lse):
    """part (a query chunk's O over one key chunk) merged into the rows of
    o_acc and acc_lse that the chunk owns."""
    c = fa.CombineParams()
    c.num_parts, c.batch, c.heads, c.seqlen, c.head_dim = 1, prob.b, prob.hq, qc[1], prob.dv
    c.part_dtype, c.dtype, c.accumulate = fa.DTYPES[prob.dtype], fa.DTYPES["f32"], 1
    ptrs = (ctypes.c_void_p * 1)(part.ptr)
    lptrs = (ctypes.c_void_p * 1)(part_lse.ctypes.data)
    c.o_parts = ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p))
    c.lse_parts = ctypes.cast(lptrs, ctypes.POINTER(ctypes.c_void_p))
    c.part_layout, c.o, c.o_layout = part.layout, _rows(o_acc, qc[0]), o_acc.layout
    c.lse = acc_lse.ctypes.data
    status = (fa.CPU.fa_cpu_combine(ctypes.byref(c), None) if not backend.startswith("gpu")
              else fa.GPU.fa_test_gpu_combine(ctypes.byref(c)))
    assert status == fa.FA_OK, f"combine: {fa.status_name(status)}"


RING_CASES = [
    ("zigzag3_causal", 300, 3, True, dict(heads_q=4, heads_kv=2, head_dim=64, causal=True)),
    ("zigzag2_causal_bf16", 256, 2, True, dict(head_dim=64, causal=True, dtype="bf16")),
    ("contiguous3_uneven_window", 301, 3, False, dict(head_dim=32, window=(70, 0))),
    ("contiguous4_full_f16", 203, 4, False, dict(heads_q=2, heads_kv=1, head_dim=64,
                                                 dtype="f16")),
    ("zigzag2_causal_softcap", 200, 2, True, dict(head_dim=64, causal=True, softcap=5.0,
                                                  amplitude=2.0)),
]
for name, n, ranks, zigzag, cfg in RING_CASES:
    case(f"ring_cpu_{name}", ring_case, "fa2", n, ranks, zigzag, **cfg)
    gpu_cfg = dict(cfg, dtype=cfg.get("dtype", "bf16").replace("f32", "bf16"))
    case(f"gpu_ring_{name}", ring_case, "gpu", n, ranks, zigzag, **gpu_cfg)
case("gpu_ring_zigzag2_causal_d128_long", ring_case, "gpu", 2048, 2, True,
     heads_q=8, heads_kv=2, head_dim=128, causal=True, dtype="bf16")


# ---- bad input --------------------------------------------------------------

CU = np.array([0, 20], np.int32)  # a one-sequence varlen offset array, kept alive
for name, mutate, expected, backward in (
        ("positions_negative", _set(positions=1, q_position=-1), "FA_ERR_INVALID_ARGUMENT", False),
        ("positions_negative_k", _set(positions=1, k_position=-5), "FA_ERR_INVALID_ARGUMENT",
         True),
        ("positions_with_varlen", _set(positions=1, cu_seqlens_q=CU.ctypes.data,
                                       cu_seqlens_k=CU.ctypes.data), "FA_ERR_UNSUPPORTED", False)):
    case(f"bad_input_{name}", _bad, mutate, expected, backward)
