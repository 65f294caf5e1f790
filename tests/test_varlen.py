"""Ragged batches (varlen: cu_seqlens_q / cu_seqlens_k, seqused_k) on the CPU
and GPU paths, forward and backward, against the float64 reference run
sequence by sequence; empty sequences, GQA, masks aligned per sequence,
padded rows, the [Hq, total_q] LSE layout; bad offsets; the reference
refuses."""
import ctypes

import numpy as np

import fa
import reference
from harness import case, Skip
from test_cpu import FLOOR, check, check_lse, rng_for
from test_gpu import need_gpu


class VarlenProblem:
    def __init__(self, rng, lengths_q, lengths_k, used_k=None, heads_q=4, heads_kv=2,
                 head_dim=64, dtype="f32", causal=False, window=None, softcap=0.0, pad=0,
                 head_dim_v=0, poison_unused=False, device_offsets=False):
        self.device_offsets = device_offsets  # tables_on_device, with the totals given
        self.lq, self.lk, self.used = list(lengths_q), list(lengths_k), used_k
        self.b, self.hq, self.hkv, self.d, self.dtype = len(lengths_q), heads_q, heads_kv, head_dim, dtype
        self.dv = head_dim_v or head_dim
        self.causal, self.window, self.softcap, self.pad = causal, window, softcap, pad
        self.scale = 1.0 / np.sqrt(head_dim)
        self.cu_q = np.concatenate([[0], np.cumsum(self.lq)]).astype(np.int32)
        self.cu_k = np.concatenate([[0], np.cumsum(self.lk)]).astype(np.int32)
        self.tq, self.tk = int(self.cu_q[-1]), int(self.cu_k[-1])
        self.q = fa.quantize(rng.standard_normal((self.tq, heads_q, head_dim)), dtype)
        self.k = fa.quantize(rng.standard_normal((self.tk, heads_kv, head_dim)), dtype)
        self.v = fa.quantize(rng.standard_normal((self.tk, heads_kv, self.dv)), dtype)
        self.dout = fa.quantize(rng.standard_normal((self.tq, heads_q, self.dv)), dtype)
        self.used_arr = None if used_k is None else np.array(used_k, np.int32)
        if poison_unused:  # NaN in the K and V rows past each sequence's used keys
            for b in range(self.b):
                self.k[self.cu_k[b] + self.keys(b):self.cu_k[b + 1]] = np.nan
                self.v[self.cu_k[b] + self.keys(b):self.cu_k[b + 1]] = np.nan

    def keys(self, b):
        return self.used[b] if self.used is not None else self.lk[b]

    def tensor(self, rows, heads, values=None, v_side=False):
        """A packed [rows, heads, d] tensor (d: head_dim_v for v, o, dout, dv;
        with pad, rows padded to 16 bytes and 8 elements more, poisoned)."""
        t = fa.Tensor((1, max(rows, 1), heads, self.dv if v_side else self.d), self.dtype,
                      "aligned" if self.pad else "bshd")
        if values is not None and rows:
            t.view[0] = fa.to_storage(values, self.dtype)
        return t

    def params(self, t, lse):
        p = fa.Params()
        p.dtype = fa.DTYPES[self.dtype]
        p.batch, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v = self.b, self.hq, self.hkv, self.d, self.dv
        p.seqlen_q, p.seqlen_k = max(max(self.lq), 1), max(max(self.lk), 1)
        p.causal, p.softcap = int(self.causal), self.softcap
        if self.window is not None:
            p.window, (p.window_left, p.window_right) = 1, self.window
        for name, x in t.items():
            setattr(p, name, x.ptr)
            setattr(p, name + "_layout", x.layout)
        p.lse = lse.ctypes.data
        p.cu_seqlens_q, p.cu_seqlens_k = self.cu_q.ctypes.data, self.cu_k.ctypes.data
        if self.used_arr is not None:
            p.seqused_k = self.used_arr.ctypes.data
        if self.device_offsets:
            p.tables_on_device, p.total_q, p.total_k = 1, max(self.tq, 1), max(self.tk, 1)
        return p

    def forward_tensors(self, o_value=None):
        """q, k, v and an O to write (filled with o_value, else poisoned)."""
        o = None if o_value is None else np.full((self.tq, self.hq, self.dv), o_value)
        return {"q": self.tensor(self.tq, self.hq, self.q), "k": self.tensor(self.tk, self.hkv, self.k),
                "v": self.tensor(self.tk, self.hkv, self.v, True), "o": self.tensor(self.tq, self.hq, o, True)}

    def forward(self, backend="fa2"):
        t = self.forward_tensors()
        lse = np.full((self.hq, max(self.tq, 1)), np.nan, np.float32)
        status = fa.call_forward(backend, self.params(t, lse))
        return status, t["o"].values()[0][:self.tq], lse[:, :self.tq].astype(np.float64)

    def backward_tensors(self, o, grad_value=None):
        """The forward's tensors with o and dout, and dq, dk, dv to write
        (filled with grad_value, else poisoned)."""
        def grad(rows, heads, d):
            return None if grad_value is None else np.full((rows, heads, d), grad_value)
        t = self.forward_tensors()
        t["o"] = self.tensor(self.tq, self.hq, o, True)
        t["dout"] = self.tensor(self.tq, self.hq, self.dout, True)
        t["dq"] = self.tensor(self.tq, self.hq, grad(self.tq, self.hq, self.d))
        t["dk"] = self.tensor(self.tk, self.hkv, grad(self.tk, self.hkv, self.d))
        t["dv"] = self.tensor(self.tk, self.hkv, grad(self.tk, self.hkv, self.dv), True)
        return t

    def backward_lse(self, lse):
        """The LSE the backward reads (the caller keeps it alive over the call)."""
        lse_in = np.zeros((self.hq, max(self.tq, 1)), np.float32)
        lse_in[:, :self.tq] = lse
        return lse_in

    def backward(self, o, lse, backend="fa2"):
        t, lse_in = self.backward_tensors(o), self.backward_lse(lse)
        status = fa.call_backward(backend, self.params(t, lse_in))
        return (status, t["dq"].values()[0][:self.tq], t["dk"].values()[0][:self.tk],
                t["dv"].values()[0][:self.tk])

    def reference(self, precision=np.float64, o=None, lse=None, round_p=None):
        """Per sequence: O [tq, Hq, d], LSE [Hq, tq], and (dq, dk, dv) with
        their magnitudes, from the sequence's own q rows and used keys
        (round_p: P and dS rounded as a GPU's tensor cores take them)."""
        args = dict(scale=self.scale, causal=self.causal, window=self.window, softcap=self.softcap,
                    round_p=round_p)
        out_o = np.zeros((self.tq, self.hq, self.dv))
        out_lse = np.full((self.hq, self.tq), -np.inf)
        grads = [np.zeros((self.tq, self.hq, self.d)), np.zeros((self.tk, self.hkv, self.d)),
                 np.zeros((self.tk, self.hkv, self.dv))]
        mags = [np.zeros_like(g) for g in grads]
        for b in range(self.b):
            q0, q1, k0 = self.cu_q[b], self.cu_q[b + 1], self.cu_k[b]
            nk = self.keys(b)
            if q1 == q0 or nk == 0:
                continue
            qb, kb, vb = self.q[None, q0:q1], self.k[None, k0:k0 + nk], self.v[None, k0:k0 + nk]
            ob, lb = reference.forward(qb, kb, vb, precision=precision, **args)
            out_o[q0:q1], out_lse[:, q0:q1] = ob[0], lb[0]
            if o is None:
                g, m = reference.backward(qb, kb, vb, self.dout[None, q0:q1], magnitudes=True,
                                          **dict(args, round_p=None))
            else:
                g = reference.backward(qb, kb, vb, self.dout[None, q0:q1], precision=precision,
                                       o=o[None, q0:q1], lse=lse[None, :, q0:q1], **args)
                m = g
            for x, y, r0, n in zip(grads, g, (q0, k0, k0), (q1 - q0, nk, nk)):
                x[r0:r0 + n] = y[0]
            for x, y, r0, n in zip(mags, m, (q0, k0, k0), (q1 - q0, nk, nk)):
                x[r0:r0 + n] = y[0]
        return out_o, out_lse, grads, mags


def varlen_case(backward=True, fwd="fa2", bwds=("fa2",), **cfg):
    """The forward on backend fwd, the backward from its O and LSE on each of
    bwds, against the float64 reference per sequence (the bound: twice the
    float32 computation's error; on the GPU with P and dS rounded to the
    dtype as its tensor cores take them)."""
    prob = VarlenProblem(rng_for("varlen" + str(cfg)), **cfg)
    lib = fa.GPU if fwd.startswith("gpu") else fa.CPU
    round_p = (lambda x: fa.quantize(x, prob.dtype)) if fwd.startswith("gpu") else None
    ref_o, ref_lse, grads, mags = prob.reference()
    low_o, _, _, _ = prob.reference(np.float32, round_p=round_p)
    status, o, lse = prob.forward(fwd)
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {lib.fa_last_error_detail().decode()}"
    err = check("varlen o", o, ref_o, low_o, prob.dtype)
    check_lse(lse, ref_lse)
    if not backward:
        return f"err {err:.1e}"
    low = prob.reference(np.float32, o=o, lse=lse, round_p=round_p)[2]
    errs = []
    for bwd in bwds:
        status, *got = prob.backward(o, lse, bwd)
        assert status == fa.FA_OK, f"{bwd}: {fa.status_name(status)}: " + \
            lib.fa_last_error_detail().decode()
        for name, g, r, lp, mag in zip(("dq", "dk", "dv"), got, grads, low, mags):
            scale = max(np.linalg.norm(mag), np.linalg.norm(r), 1e-30)
            e = np.linalg.norm(g - r) / scale if not np.isnan(g).any() else np.inf
            limit = 2.0 * np.linalg.norm(fa.quantize(lp, prob.dtype) - r) / scale + FLOOR
            assert e <= limit, f"{bwd} {name}: error {e:.3g} > bound {limit:.3g}"
            errs.append(e)
    return f"err {err:.1e}, grads {max(errs):.1e}"


def gpu_varlen_case(**cfg):
    need_gpu()
    return varlen_case(fwd="gpu", bwds=("gpu", "gpu_det"), **cfg)


# empty, single-row and tile-edge sequences, causal, GQA: the first case of the
# one-launch comparisons and of the device offsets
RAGGED_CAUSAL_GQA = dict(lengths_q=[0, 1, 63, 64, 65, 1000, 300, 129],
                         lengths_k=[5, 1, 63, 90, 65, 1000, 700, 129], causal=True, heads_q=6,
                         heads_kv=2, head_dim=128)


def _need_device_schedule():
    need_gpu()
    if fa.GPU.fa_test_gpu_cc() != 90:
        raise Skip("the device-built schedule runs on the FA3 kernel (compute capability 9.0)")


def gpu_varlen_device_offsets_case(**cfg):
    """tables_on_device: the offsets in device memory, the schedule made on
    the device; forward and backward against the float64 reference, and
    against the host offsets where these take the one launch of the same
    FA3 kernel: the forward (the longest sequence has more than 16
    queries, and the bounds are its lengths) bit for bit, each tile seeing
    the same key tiles in the same order, only the order the CTAs take the
    tiles in may differ; the backward's dK and dV bit for bit (a key
    block is one CTA's), dQ within 2^-7 of the host's (its atomics add in
    any order)."""
    _need_device_schedule()
    result = varlen_case(fwd="gpu", bwds=("gpu",), device_offsets=True, **cfg)
    prob = VarlenProblem(rng_for("varlen_device" + str(cfg)), device_offsets=True, **cfg)
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    status, dq, dk, dv = prob.backward(o, lse, "gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    prob.device_offsets = False
    status, host_dq, host_dk, host_dv = prob.backward(o, lse, "gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    assert np.array_equal(dk, host_dk) and np.array_equal(dv, host_dv), \
        "dK or dV differ from the host offsets'"
    _close_dq(dq, host_dq)
    if max(prob.lq) <= 16:
        return result + ", backward as the host offsets; their forward takes the decode path"
    status, host_o, host_lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    assert np.array_equal(o, host_o, equal_nan=True) and \
        np.array_equal(lse, host_lse, equal_nan=True), "device offsets differ from host offsets"
    return result + ", bits of the host offsets"


def _close_dq(got, want):
    """dQ of the same atomic-mode backward, its fp32 sums added in another
    order: each element within 2^-7 of the other's (a bf16 rounding and
    then some), or 1e-3 of the largest."""
    limit = 2.0 ** -7 * np.abs(want) + 1e-3 * np.abs(want).max()
    assert not np.isnan(got).any() and np.all(np.abs(got - want) <= limit), \
        f"dQ differs by {np.abs(got - want).max():.3g}"


case("varlen_ragged", varlen_case, lengths_q=[5, 130, 1, 64], lengths_k=[9, 200, 1, 64])
case("varlen_empty_sequences", varlen_case, lengths_q=[0, 17, 33, 0], lengths_k=[4, 0, 40, 0])
case("varlen_causal_bottom_right", varlen_case, lengths_q=[20, 70, 3], lengths_k=[50, 70, 9],
     causal=True, heads_q=6, heads_kv=3)
case("varlen_causal_more_queries", varlen_case, lengths_q=[90, 8], lengths_k=[30, 8], causal=True)
case("varlen_window_softcap_bf16", varlen_case, lengths_q=[77, 200], lengths_k=[150, 120],
     window=(32, 4), softcap=10.0, dtype="bf16", head_dim=80)
case("varlen_seqused_k", varlen_case, lengths_q=[10, 40, 7], lengths_k=[64, 100, 12],
     used_k=[33, 100, 0], causal=True)
case("varlen_padded_rows_f16_mqa", varlen_case, lengths_q=[31, 2, 65], lengths_k=[31, 90, 1],
     heads_q=4, heads_kv=1, dtype="f16", pad=8)
case("varlen_head_dim_v_192_128", varlen_case, lengths_q=[40, 0, 130], lengths_k=[70, 5, 130],
     head_dim=192, head_dim_v=128, causal=True, dtype="bf16")
case("varlen_head_dim_v_33_70_padded", varlen_case, lengths_q=[3, 66], lengths_k=[100, 60],
     head_dim=33, head_dim_v=70, window=(20, 2), pad=8)


# The GPU: on Hopper the whole batch in one launch of the FA3 kernel where
# the longest sequence's dense plan is FA3's; else each sequence a dense
# problem on the dense path's kernels (FA2, the decode path).
for name, cfg in (
        ("ragged", dict(lengths_q=[5, 130, 1, 64], lengths_k=[9, 200, 1, 64])),
        ("empty_sequences", dict(lengths_q=[0, 17, 33, 0], lengths_k=[4, 0, 40, 0])),
        ("lengths_0_1_63_64_65_1000", dict(lengths_q=[0, 1, 63, 64, 65, 1000],
                                           lengths_k=[3, 1, 63, 64, 65, 1000], causal=True)),
        ("causal_gqa_d128", dict(lengths_q=[20, 70, 3], lengths_k=[50, 70, 9], causal=True,
                                 heads_q=6, heads_kv=3, head_dim=128)),
        ("window_softcap_d96", dict(lengths_q=[77, 200], lengths_k=[150, 120], window=(32, 4),
                                    softcap=10.0, head_dim=96)),
        ("seqused_k_decode_rows", dict(lengths_q=[1, 4, 16], lengths_k=[640, 100, 300],
                                       used_k=[333, 100, 0], causal=True)),
        ("padded_rows_f16_mqa_d256", dict(lengths_q=[31, 2, 65], lengths_k=[31, 90, 1],
                                          heads_q=4, heads_kv=1, dtype="f16", pad=8,
                                          head_dim=256))):
    case(f"gpu_varlen_{name}", gpu_varlen_case, **dict(dict(dtype="bf16"), **cfg))


for name, cfg in (
        ("lengths_0_1_63_64_65_1000", dict(lengths_q=[0, 1, 63, 64, 65, 1000],
                                           lengths_k=[3, 1, 63, 64, 65, 1000], causal=True)),
        ("empty_sequences_d64", dict(lengths_q=[0, 17, 33, 0, 5], lengths_k=[4, 0, 40, 0, 9],
                                     head_dim=64)),
        ("causal_gqa_d128", RAGGED_CAUSAL_GQA),
        ("window_softcap_d96", dict(lengths_q=[77, 200], lengths_k=[150, 120], window=(32, 4),
                                    softcap=10.0, head_dim=96)),
        ("seqused_k_poisoned_d128", dict(lengths_q=[40, 300, 0, 17], lengths_k=[64, 500, 9, 200],
                                         used_k=[33, 410, 9, 0], causal=True, head_dim=128,
                                         poison_unused=True)),
        ("decode_rows_only", dict(lengths_q=[1, 4, 16], lengths_k=[640, 100, 300],
                                  used_k=[333, 100, 0], causal=True)),
        ("padded_rows_f16_mqa_d256", dict(lengths_q=[31, 2, 65], lengths_k=[31, 90, 1],
                                          heads_q=4, heads_kv=1, dtype="f16", pad=8,
                                          head_dim=256)),
        ("head_dim_v_192_128", dict(lengths_q=[40, 0, 130], lengths_k=[70, 5, 130],
                                    head_dim=192, head_dim_v=128, causal=True))):
    case(f"gpu_varlen_device_offsets_{name}", gpu_varlen_device_offsets_case,
         **dict(dict(dtype="bf16"), **cfg))


case("gpu_varlen_seqused_k_poisoned_d128", gpu_varlen_case, lengths_q=[40, 300, 0, 17],
     lengths_k=[64, 500, 9, 200], used_k=[33, 410, 9, 0], causal=True, head_dim=128,
     dtype="bf16", poison_unused=True)


def gpu_varlen_many_sequences(count, longest, **cfg):
    """More sequences (and query blocks) than one staged copy holds."""
    need_gpu()
    rng = rng_for(f"varlen_many{count}")
    lq = [int(x) for x in rng.integers(1, longest + 1, count)]
    lk = [int(x) for x in rng.integers(1, longest + 1, count)]
    lq[0] = longest
    return varlen_case(backward=False, fwd="gpu", lengths_q=lq, lengths_k=lk, dtype="bf16", **cfg)


case("gpu_varlen_many_sequences_600", gpu_varlen_many_sequences, 600, 40, causal=True,
     heads_q=2, heads_kv=1)
case("gpu_varlen_many_sequences_20_d256", gpu_varlen_many_sequences, 20, 300, head_dim=256,
     window=(50, 10))


def gpu_varlen_equals_dense_calls(**cfg):
    """The ragged batch against a dense batch-1 call per sequence: O and LSE
    equal bit for bit where both run the FA3 kernel's tile (each row sees the
    same key tiles in the same order); sequences of 16 or fewer queries,
    which a dense call runs on the decode kernel, are left to the float64
    checks above."""
    need_gpu()
    prob = VarlenProblem(rng_for("varlen_dense" + str(cfg)), **cfg)
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    compared = 0
    for b in range(prob.b):
        q0, q1, k0, nk = prob.cu_q[b], prob.cu_q[b + 1], prob.cu_k[b], prob.keys(b)
        if q1 - q0 <= 16 or nk == 0:
            continue
        t = {"q": fa.Tensor((1, q1 - q0, prob.hq, prob.d), prob.dtype, values=prob.q[None, q0:q1]),
             "k": fa.Tensor((1, nk, prob.hkv, prob.d), prob.dtype, values=prob.k[None, k0:k0 + nk]),
             "v": fa.Tensor((1, nk, prob.hkv, prob.dv), prob.dtype, values=prob.v[None, k0:k0 + nk]),
             "o": fa.Tensor((1, q1 - q0, prob.hq, prob.dv), prob.dtype)}
        dense_lse = np.full((1, prob.hq, q1 - q0), np.nan, np.float32)
        p = prob.params(t, dense_lse)
        p.batch, p.seqlen_q, p.seqlen_k = 1, int(q1 - q0), int(nk)
        p.cu_seqlens_q = p.cu_seqlens_k = p.seqused_k = None
        status = fa.call_forward("gpu", p)
        assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
        assert np.array_equal(t["o"].storage[0], fa.to_storage(o[q0:q1], prob.dtype)), \
            f"sequence {b}: O differs"
        assert np.array_equal(dense_lse[0], lse[:, q0:q1].astype(np.float32)), \
            f"sequence {b}: LSE differs"
        compared += 1
    assert compared >= 3
    return f"{compared} sequences bit for bit"


for name, cfg in (
        ("d128_causal_gqa", RAGGED_CAUSAL_GQA),
        ("d64_window_softcap", dict(lengths_q=[200, 17, 513], lengths_k=[100, 300, 513],
                                    window=(64, 0), softcap=20.0, head_dim=64)),
        ("d256_seqused_k", dict(lengths_q=[100, 257, 40], lengths_k=[300, 257, 90],
                                used_k=[280, 1, 90], head_dim=256, causal=True)),
        # 352 tiles a long sequence: the host's 512-tile staging chunk fills
        # inside the second sequence, whose maps must keep their slot
        ("d64_staging_chunks", dict(lengths_q=[4224, 4224, 3000, 100],
                                    lengths_k=[4224, 4224, 3000, 100], heads_q=16, heads_kv=4,
                                    head_dim=64))):
    case(f"gpu_varlen_equals_dense_calls_{name}", gpu_varlen_equals_dense_calls,
         **dict(dict(dtype="bf16"), **cfg))


def gpu_varlen_backward_equals_dense_calls(**cfg):
    """The ragged batch's backward (atomic mode) against a dense batch-1 call
    per sequence from the same O and LSE: dK and dV equal bit for bit (each
    key block walks the same query blocks in the same order); dQ, summed by
    atomic adds in another order, equal to within its fp32 rounding."""
    need_gpu()
    prob = VarlenProblem(rng_for("varlen_dense_bwd" + str(cfg)), **cfg)
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    status, dq, dk, dv = prob.backward(o, lse, "gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    compared = 0
    for b in range(prob.b):
        q0, q1, k0, nk = prob.cu_q[b], prob.cu_q[b + 1], prob.cu_k[b], prob.keys(b)
        nq = q1 - q0
        if nq == 0 or nk == 0:
            continue
        shapes = dict(q=(nq, prob.hq, prob.d, prob.q[q0:q1]), k=(nk, prob.hkv, prob.d, prob.k[k0:k0 + nk]),
                      v=(nk, prob.hkv, prob.dv, prob.v[k0:k0 + nk]), o=(nq, prob.hq, prob.dv, o[q0:q1]),
                      dout=(nq, prob.hq, prob.dv, prob.dout[q0:q1]), dq=(nq, prob.hq, prob.d, None),
                      dk=(nk, prob.hkv, prob.d, None), dv=(nk, prob.hkv, prob.dv, None))
        t = {name: fa.Tensor((1, n, h, d), prob.dtype, values=None if x is None else x[None])
             for name, (n, h, d, x) in shapes.items()}
        dense_lse = np.ascontiguousarray(lse[None, :, q0:q1].astype(np.float32))
        p = prob.params(t, dense_lse)
        p.batch, p.seqlen_q, p.seqlen_k = 1, int(nq), int(nk)
        p.cu_seqlens_q = p.cu_seqlens_k = p.seqused_k = None
        status = fa.call_backward("gpu", p)
        assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
        for name, got in (("dk", dk[k0:k0 + nk]), ("dv", dv[k0:k0 + nk])):
            assert np.array_equal(t[name].storage[0], fa.to_storage(got, prob.dtype)), \
                f"sequence {b}: {name} differs"
        want = t["dq"].values()[0]
        err = np.abs(dq[q0:q1] - want).max() / max(np.abs(want).max(), 1e-30)
        assert err <= 1e-2, f"sequence {b}: dq differs by {err:.2g} of its largest"
        compared += 1
    assert compared >= 3
    return f"{compared} sequences"


for name, cfg in (
        ("d128_causal_gqa", RAGGED_CAUSAL_GQA),
        ("d64_seqused_k", dict(lengths_q=[200, 17, 513, 40], lengths_k=[100, 300, 513, 9],
                               used_k=[100, 250, 400, 0], head_dim=64)),
        ("d256_window", dict(lengths_q=[100, 257, 40], lengths_k=[300, 257, 90], head_dim=256,
                             window=(60, 20))),
        # 313 key blocks a long sequence: the staging chunk fills inside the second
        ("d64_staging_chunks", dict(lengths_q=[40000, 40000, 300],
                                    lengths_k=[40000, 40000, 300], heads_q=2, heads_kv=1,
                                    head_dim=64))):
    case(f"gpu_varlen_backward_equals_dense_calls_{name}", gpu_varlen_backward_equals_dense_calls,
         **dict(dict(dtype="bf16"), **cfg))


def gpu_varlen_graph_capture():
    """Captured into a CUDA graph (forward, deterministic backward) a ragged
    batch runs sequence by sequence (the one-launch schedule comes from host
    memory): the bits of the direct calls, which on Hopper take the one
    launch (sequences of more than 16 queries: the same tile either way),
    and of each sequence called alone as a dense batch of one."""
    need_gpu()
    prob = VarlenProblem(rng_for("varlen_graph"), [300, 0, 65, 1000], [500, 7, 65, 900],
                         causal=True, head_dim=128, dtype="bf16")
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    for b in range(prob.b):
        q0, q1, k0, k1 = prob.cu_q[b], prob.cu_q[b + 1], prob.cu_k[b], prob.cu_k[b + 1]
        if q1 == q0:
            continue
        seq = fa.Problem(rng_for("varlen_graph_seq"), heads_q=prob.hq, heads_kv=prob.hkv,
                         seqlen_q=int(q1 - q0), seqlen_k=int(k1 - k0), head_dim=prob.d,
                         dtype=prob.dtype, causal=prob.causal)
        seq.q, seq.k, seq.v = prob.q[None, q0:q1], prob.k[None, k0:k1], prob.v[None, k0:k1]
        status, seq_o, seq_lse = seq.forward("gpu")
        assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
        assert np.array_equal(seq_o[0], o[q0:q1]) and np.array_equal(seq_lse[0], lse[:, q0:q1]), \
            f"sequence {b}: the one launch and the dense call differ"
    status, *grads = prob.backward(o, lse, "gpu_det")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    t = {"q": prob.tensor(prob.tq, prob.hq, prob.q), "k": prob.tensor(prob.tk, prob.hkv, prob.k),
         "v": prob.tensor(prob.tk, prob.hkv, prob.v, True), "o": prob.tensor(prob.tq, prob.hq, None, True),
         "dout": prob.tensor(prob.tq, prob.hq, prob.dout, True), "dq": prob.tensor(prob.tq, prob.hq),
         "dk": prob.tensor(prob.tk, prob.hkv), "dv": prob.tensor(prob.tk, prob.hkv, None, True)}
    graph_lse = np.full((prob.hq, prob.tq), np.nan, np.float32)
    status = fa.GPU.fa_test_gpu_graph(ctypes.byref(prob.params(t, graph_lse)), 1)
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    got = [t["o"].values()[0], graph_lse.astype(np.float64)] + \
          [t[n].values()[0] for n in ("dq", "dk", "dv")]
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), [o, lse] + grads, got):
        assert np.array_equal(a, b, equal_nan=True), f"{name} differs under a graph"


case("gpu_varlen_graph_capture", gpu_varlen_graph_capture)


def _varlen_bad(mutate, expected, backends=("fa2", "ref", "gpu")):
    prob = VarlenProblem(rng_for("varlen_bad"), [5, 7], [6, 8])
    t = prob.forward_tensors(7.0)
    lse = np.full((prob.hq, prob.tq), 7.0, np.float32)
    p = prob.params(t, lse)
    keep = mutate(p, prob)
    before = t["o"].storage.copy()
    ran = 0
    for backend in backends:
        if backend == "gpu" and fa.GPU is None:
            continue
        want = "FA_ERR_UNSUPPORTED" if backend == "ref" and expected == "ok" else expected
        if want == "ok":
            continue
        status = fa.call_forward(backend, p)
        assert status == fa.STATUS[want], f"{backend}: {fa.status_name(status)}, expected {want}"
        assert np.array_equal(before, t["o"].storage) and np.all(lse == 7.0), f"{backend} wrote"
        ran += 1
    if not ran:
        raise Skip("no backend here refuses this")
    del keep
    return fa.CPU.fa_last_error_detail().decode()


def _cu(which, values):
    def mutate(p, prob):
        arr = np.array(values, np.int32)
        setattr(p, which, arr.ctypes.data)
        return arr
    return mutate


def _fields(**fields):
    def mutate(p, prob):
        for k, v in fields.items():
            setattr(p, k, v)
    return mutate


for name, mutate, expected in (
        ("decreasing", _cu("cu_seqlens_q", [0, 6, 5]), "FA_ERR_INVALID_SIZE"),
        ("negative_start", _cu("cu_seqlens_k", [-1, 6, 14]), "FA_ERR_INVALID_SIZE"),
        ("longer_than_seqlen", _fields(seqlen_q=6), "FA_ERR_INVALID_SIZE"),
        ("seqused_past_span", _cu("seqused_k", [6, 9]), "FA_ERR_INVALID_SIZE"),
        ("only_q_offsets", _fields(cu_seqlens_k=None), "FA_ERR_NULL_POINTER"),
        ("fp8", lambda p, prob: [setattr(p, n, p.lse) for n in ("q_descale", "k_descale",
                                                                  "v_descale", "dtype")] and
         setattr(p, "dtype", 3), "FA_ERR_UNSUPPORTED"),
        ("o_over_k", lambda p, prob: setattr(p, "o", p.k), "FA_ERR_INVALID_LAYOUT"),
        ("valid_but_reference_is_dense_only", _fields(), "ok")):
    case(f"varlen_bad_{name}", _varlen_bad, mutate, expected,
         ("fa2", "gpu") if expected != "ok" else ("ref",))

for name, mutate, expected, backends in (
        ("offsets_past_total_q", _fields(total_q=11), "FA_ERR_INVALID_SIZE", ("fa2", "gpu")),
        ("negative_total_k", _fields(total_k=-1), "FA_ERR_INVALID_SIZE", ("fa2", "gpu")),
        ("device_offsets_without_totals", _fields(tables_on_device=1), "FA_ERR_INVALID_SIZE",
         ("fa2", "gpu")),
        ("device_offsets_on_the_cpu", _fields(tables_on_device=1, total_q=12, total_k=14),
         "FA_ERR_UNSUPPORTED", ("fa2",)),
        ("device_offsets_forced_split", _fields(tables_on_device=1, total_q=12, total_k=14,
                                                num_splits=2), "FA_ERR_UNSUPPORTED", ("gpu",))):
    case(f"varlen_bad_{name}", _varlen_bad, mutate, expected, backends)


# tables_on_device: offsets the host cannot check. Sequence lengths q [40,
# 30, 50, 20], k [60, 30, 70, 25]; each mutation names the sequences whose
# O and LSE rows must be NaN and those whose rows must keep their 7.0 (not
# placed: the query offsets out of order or past total_q from there on);
# every other sequence has the bits of the valid offsets.
DEVICE_BAD_LQ, DEVICE_BAD_LK = [40, 30, 50, 20], [60, 30, 70, 25]


def _device_bad_problem():
    """The problem the bad-offset cases mutate, and its valid forward."""
    _need_device_schedule()
    prob = VarlenProblem(rng_for("varlen_device_bad"), DEVICE_BAD_LQ, DEVICE_BAD_LK, causal=True,
                         head_dim=128, dtype="bf16", device_offsets=True)
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    return prob, o, lse


def _device_offsets_bad(mutate, nan_seqs, kept_seqs, check_lse=True):
    prob, good_o, good_lse = _device_bad_problem()
    t = prob.forward_tensors(7.0)
    lse = np.full((prob.hq, prob.tq), 7.0, np.float32)
    p = prob.params(t, lse)
    keep = mutate(p)
    if not check_lse:
        p.lse = None
    status = fa.call_forward("gpu", p)
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.GPU.fa_last_error_detail().decode()}"
    del keep
    o = t["o"].values()[0]
    for b in range(prob.b):
        rows = slice(prob.cu_q[b], prob.cu_q[b + 1])
        got, got_lse = o[rows], lse[:, rows].astype(np.float64)
        if b in nan_seqs:
            assert np.isnan(got).all() and (not check_lse or np.isnan(got_lse).all()), \
                f"sequence {b}: not NaN"
        elif b in kept_seqs:
            assert np.all(got == 7.0) and np.all(got_lse == 7.0), f"sequence {b}: written"
        else:
            assert np.array_equal(got, good_o[rows]) and \
                (not check_lse or np.array_equal(got_lse, good_lse[:, rows])), \
                f"sequence {b}: differs from the valid offsets' result"
    return f"NaN {sorted(nan_seqs)}, kept {sorted(kept_seqs)}"


def _device_array(field, values):
    def mutate(p):
        arr = np.array(values, np.int32)
        setattr(p, field, arr.ctypes.data)
        return arr
    return mutate


for name, mutate, nan_seqs, kept_seqs, lse_too in (
        ("seqused_k_past_its_span", _device_array("seqused_k", [60, 30, 71, 25]), {2}, set(), True),
        ("keys_past_total_k", _device_array("cu_seqlens_k", [0, 60, 90, 160, 190]), {3}, set(),
         True),
        ("keys_decreasing", _device_array("cu_seqlens_k", [0, 60, 50, 160, 185]), {1, 2}, set(),
         True),
        ("negative_key_start", _device_array("cu_seqlens_k", [0, 60, 90, -1, 185]), {2, 3}, set(),
         True),
        ("queries_decreasing", _device_array("cu_seqlens_q", [0, 40, 70, 60, 140]), set(), {2, 3},
         True),
        ("negative_query_start", _device_array("cu_seqlens_q", [-5, 40, 70, 120, 140]), set(),
         {0, 1, 2, 3}, True),
        ("longer_than_seqlen_q", lambda p: setattr(p, "seqlen_q", 45), {2}, set(), True),
        # total_q 120: the tensors' rows end inside sequence 3 (the LSE's head
        # stride changes with it, so only O is checked)
        ("queries_past_total_q", lambda p: setattr(p, "total_q", 120), set(), {3}, False)):
    case(f"gpu_varlen_device_offsets_bad_{name}", _device_offsets_bad, mutate, nan_seqs,
         kept_seqs, lse_too)


def _device_offsets_bad_backward(mutate, nan_seqs, kept_seqs):
    """The backward over the same bad offsets: the dQ rows and the dK and dV
    rows (their whole key span) of the sequences in nan_seqs NaN, of
    kept_seqs their 7.0 (not placed: the query or key offsets out of order
    or past the totals from there on); every other sequence's dK and dV
    the bits of the valid offsets', its dQ as close as _close_dq allows."""
    prob, o, lse = _device_bad_problem()
    status, *good = prob.backward(o, lse, "gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    t, lse_in = prob.backward_tensors(o, 7.0), prob.backward_lse(lse)
    p = prob.params(t, lse_in)
    keep = mutate(p)
    status = fa.call_backward("gpu", p)
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.GPU.fa_last_error_detail().decode()}"
    del keep
    for name, want in zip(("dq", "dk", "dv"), good):
        got, cu = t[name].values()[0], prob.cu_q if name == "dq" else prob.cu_k
        for b in range(prob.b):
            rows = slice(cu[b], cu[b + 1])
            if b in nan_seqs:
                assert np.isnan(got[rows]).all(), f"{name} of sequence {b}: not NaN"
            elif b in kept_seqs:
                assert np.all(got[rows] == 7.0), f"{name} of sequence {b}: written"
            elif name == "dq":
                _close_dq(got[rows], want[rows])
            else:
                assert np.array_equal(got[rows], want[rows]), \
                    f"{name} of sequence {b}: differs from the valid offsets' result"
    return f"NaN {sorted(nan_seqs)}, kept {sorted(kept_seqs)}"


for name, mutate, nan_seqs, kept_seqs in (
        ("seqused_k_past_its_span", _device_array("seqused_k", [60, 30, 71, 25]), {2}, set()),
        ("longer_than_seqlen_k", lambda p: setattr(p, "seqlen_k", 65), {2}, set()),
        ("keys_past_total_k", _device_array("cu_seqlens_k", [0, 60, 90, 160, 190]), set(), {3}),
        ("keys_decreasing", _device_array("cu_seqlens_k", [0, 60, 90, 80, 185]), set(), {2, 3}),
        ("negative_key_start", _device_array("cu_seqlens_k", [0, 60, 90, -1, 185]), set(),
         {2, 3}),
        ("queries_decreasing", _device_array("cu_seqlens_q", [0, 40, 70, 60, 140]), set(),
         {2, 3})):
    case(f"gpu_varlen_device_offsets_bad_backward_{name}", _device_offsets_bad_backward, mutate,
         nan_seqs, kept_seqs)


def gpu_varlen_device_offsets_graph():
    """tables_on_device: a ragged forward captured once into a CUDA graph
    reads the offsets as they are at each launch: the second launch, after
    other offsets (the same totals) were written into the same device
    arrays, equals a direct call over those, bit for bit, as the first
    equals one over the first offsets."""
    _need_device_schedule()
    prob = VarlenProblem(rng_for("varlen_device_graph"), [100, 0, 65, 300], [200, 7, 65, 250],
                         causal=True, head_dim=128, dtype="bf16", device_offsets=True)
    cu_q2 = np.array([0, 50, 100, 265, 465], np.int32)
    cu_k2 = np.array([0, 100, 207, 272, 522], np.int32)
    t = prob.forward_tensors()
    o1 = prob.tensor(prob.tq, prob.hq, None, True)
    lse1 = np.full((prob.hq, prob.tq), np.nan, np.float32)
    lse2 = np.full((prob.hq, prob.tq), np.nan, np.float32)
    second = (ctypes.c_void_p * 5)(None, None, cu_q2.ctypes.data, cu_k2.ctypes.data, None)
    status = fa.GPU.fa_test_gpu_tables_graph(ctypes.byref(prob.params(t, lse2)), second, o1.ptr,
                                             lse1.ctypes.data)
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.GPU.fa_last_error_detail().decode()}"
    first = prob.forward("gpu")
    prob.cu_q, prob.cu_k = cu_q2, cu_k2
    again = prob.forward("gpu")
    for name, got, want in (("o, first launch", o1.values()[0], first[1]),
                            ("lse, first launch", lse1.astype(np.float64), first[2]),
                            ("o, second launch", t["o"].values()[0], again[1]),
                            ("lse, second launch", lse2.astype(np.float64), again[2])):
        assert np.array_equal(got, want, equal_nan=True), f"{name} differs from the direct call"
    assert not np.array_equal(first[2], again[2], equal_nan=True), "the offsets changed nothing"


case("gpu_varlen_device_offsets_graph", gpu_varlen_device_offsets_graph)


def gpu_varlen_device_offsets_graph_backward():
    """tables_on_device: a forward and a backward captured into one CUDA
    graph (launched twice: the backward's memsets and schedule replay too)
    equal the direct calls: O, LSE, dK and dV bit for bit, dQ as _close_dq
    allows."""
    _need_device_schedule()
    prob = VarlenProblem(rng_for("varlen_device_graph_bwd"), [100, 0, 65, 300], [200, 7, 65, 250],
                         used_k=[150, 7, 0, 250], causal=True, head_dim=128, dtype="bf16",
                         device_offsets=True)
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    status, *direct = prob.backward(o, lse, "gpu")
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    t = prob.backward_tensors(np.full(o.shape, np.nan))  # O from the graph's forward
    graph_lse = np.full((prob.hq, prob.tq), np.nan, np.float32)
    status = fa.GPU.fa_test_gpu_graph(ctypes.byref(prob.params(t, graph_lse)), 0)
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.GPU.fa_last_error_detail().decode()}"
    got = [t[n].values()[0] for n in ("o", "dq", "dk", "dv")]
    assert np.array_equal(got[0], o) and np.array_equal(graph_lse.astype(np.float64), lse), \
        "the graph's forward differs"
    assert np.array_equal(got[2], direct[1]) and np.array_equal(got[3], direct[2]), \
        "the graph's dK or dV differ"
    _close_dq(got[1], direct[0])
    return "equal to the direct calls"


case("gpu_varlen_device_offsets_graph_backward", gpu_varlen_device_offsets_graph_backward)


def gpu_varlen_device_offsets_refused():
    """tables_on_device with varlen: the deterministic backward and one with
    accumulate_grads answer FA_ERR_UNSUPPORTED, a workspace one byte short
    FA_ERR_WORKSPACE (forward and backward), nothing written; not on
    Hopper, the forward FA_ERR_UNSUPPORTED."""
    need_gpu()
    prob = VarlenProblem(rng_for("varlen_device_refused"), [20, 9], [30, 12], head_dim=64,
                         dtype="bf16", device_offsets=True)
    status, o, lse = prob.forward("gpu")
    if fa.GPU.fa_test_gpu_cc() != 90:
        assert status == fa.STATUS["FA_ERR_UNSUPPORTED"], fa.status_name(status)
        assert np.isnan(o).all(), "O was written"
        return "not Hopper: the forward refused"
    assert status == fa.FA_OK, fa.GPU.fa_last_error_detail().decode()
    status, dq, dk, dv = prob.backward(o, lse, "gpu_det")
    assert status == fa.STATUS["FA_ERR_UNSUPPORTED"], fa.status_name(status)
    assert all(np.isnan(g).all() for g in (dq, dk, dv)), "a gradient was written"
    t, lse_in = prob.backward_tensors(o), prob.backward_lse(lse)
    p = prob.params(t, lse_in)
    p.accumulate_grads = 1
    status = fa.call_backward("gpu", p)
    assert status == fa.STATUS["FA_ERR_UNSUPPORTED"], fa.status_name(status)
    p.accumulate_grads = 0
    need = fa.GPU.fa_test_gpu_backward_workspace_size(ctypes.byref(p), 0)
    assert need > 0, "no backward workspace asked for"
    status = fa.GPU.fa_test_gpu_backward_workspace(ctypes.byref(p), need - 1)
    assert status == fa.STATUS["FA_ERR_WORKSPACE"], fa.status_name(status)
    assert all(np.isnan(t[n].values()).all() for n in ("dq", "dk", "dv")), "a gradient was written"
    t = prob.forward_tensors()
    short_lse = np.full((prob.hq, prob.tq), np.nan, np.float32)
    p = prob.params(t, short_lse)
    need_fwd = fa.GPU.fa_test_gpu_forward_workspace_size(ctypes.byref(p))
    assert need_fwd > 0, "no forward workspace asked for"
    status = fa.GPU.fa_test_gpu_forward_workspace(ctypes.byref(p), need_fwd - 1)
    assert status == fa.STATUS["FA_ERR_WORKSPACE"], fa.status_name(status)
    assert np.isnan(t["o"].values()).all() and np.isnan(short_lse).all(), "written"
    return f"workspace {need_fwd} / {need} bytes"


case("gpu_varlen_device_offsets_refused", gpu_varlen_device_offsets_refused)


def gpu_varlen_head_dim_59_refused():
    """A head dim that ends inside a 16-byte chunk (59) with varlen, its rows
    16-byte aligned: FA_ERR_UNSUPPORTED (the workspace holds rows of d
    elements), O untouched."""
    need_gpu()
    prob = VarlenProblem(rng_for("varlen_d59"), [5, 9], [7, 12], head_dim=59, dtype="bf16", pad=1)
    status, o, _ = prob.forward("gpu")
    assert status == fa.STATUS["FA_ERR_UNSUPPORTED"], fa.status_name(status)
    assert np.isnan(o).all(), "O was written"


case("gpu_varlen_head_dim_59_refused", gpu_varlen_head_dim_59_refused)
