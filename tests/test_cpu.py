"""CPU path and reference: accuracy, masks, layouts, gradients, bad input, memory."""
import ctypes
import os
import subprocess
import sys
import zlib

import numpy as np

import fa
import reference
from harness import case, test, Skip

RNG_SEED = [0]  # set by run_tests.py

# Error bound, per the GPU issue's rule: at most twice the error of the same
# computation done in low precision by NumPy (fp32 arithmetic, outputs rounded
# to the storage dtype), plus FLOOR for the library's polynomial exp2 (relative
# error 2e-7) where NumPy's float32 result happens to be nearly exact. Inputs
# are rounded to the storage dtype before either side sees them. Large logits
# make fp32 itself inaccurate; this bound follows that, a fixed one cannot.
# Both passes also allow max|S| * 2^-24: rounding each logit to fp32 moves P
# by up to that much (relative), and two fp32 computations differ by luck there.
FLOOR = 2e-6


def rng_for(name):
    # crc32, not hash(): str hashes change per process, and FA_TEST_SEED must repeat a run
    return np.random.default_rng([RNG_SEED[0], zlib.crc32(name.encode())])


def bound(low_precision, ref, dtype, logit_rounding=0.0):
    return 2.0 * fa.rel_err(fa.quantize(low_precision, dtype), ref) + FLOOR + logit_rounding


def check(name, got, ref, low_precision, dtype, logit_rounding=0.0):
    err, limit = fa.rel_err(got, ref), bound(low_precision, ref, dtype, logit_rounding)
    assert err <= limit, f"{name}: relative error {err:.3g} > bound {limit:.3g}"
    return err


def check_lse(lse, ref_lse):
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse), ~finite), "LSE = -inf must mark exactly the empty rows"
    if finite.any():
        diff = np.abs(lse[finite] - ref_lse[finite]).max()
        assert diff <= 1e-4 * (1 + np.abs(ref_lse[finite]).max()), f"LSE off by {diff:.3g}"


def tensor_core_rounding(prob, backends):
    """GPU kernels feed 16-bit P and dS to the tensor cores; their low-precision
    mirror rounds the same way."""
    if any(b.startswith("gpu") for b in backends) and prob.dtype != "f32":
        return lambda x: fa.quantize(x, prob.dtype)
    return None


def forward_case(backends=("fa2", "fa1", "ref"), **cfg):
    prob = fa.Problem(rng_for(str(cfg)), **cfg)
    ref_o, ref_lse = reference.forward(prob.q, prob.k, prob.v, **prob.reference_args())
    low_o, _ = reference.forward(prob.q, prob.k, prob.v, precision=np.float32,
                                 round_p=tensor_core_rounding(prob, backends),
                                 **prob.reference_args())
    logit_rounding = reference.max_logit(prob.q, prob.k, prob.scale) * 2.0**-24
    errs = []
    for backend in backends:
        status, o, lse = prob.forward(backend)
        assert status == fa.FA_OK, f"{backend}: {fa.status_name(status)} ({fa.last_detail(backend)})"
        errs.append(check(backend, o, ref_o, low_o, prob.dtype, logit_rounding))
        check_lse(lse, ref_lse)
    return "err " + " ".join(f"{b}={e:.1e}" for b, e in zip(backends, errs))


def backward_case(backends=("fa2", "ref"), **cfg):
    """Gradient errors are measured against the magnitude of the summed terms
    (see reference.backward), which equals ‖ref‖ unless the gradient cancels.
    O and LSE come from the first backend's own forward."""
    prob = fa.Problem(rng_for("bwd" + str(cfg)), **cfg)
    args = prob.reference_args()
    status, o, lse = prob.forward(backends[0].replace("_det", ""))
    assert status == fa.FA_OK
    grads, mags = reference.backward(prob.q, prob.k, prob.v, prob.dout, magnitudes=True, **args)
    low = reference.backward(prob.q, prob.k, prob.v, prob.dout, precision=np.float32, o=o,
                             lse=lse, round_p=tensor_core_rounding(prob, backends), **args)
    logit_rounding = reference.max_logit(prob.q, prob.k, prob.scale) * 2.0**-24
    errs = []
    for backend in backends:
        status, *got = prob.backward(o, lse, backend)
        assert status == fa.FA_OK, f"{backend}: {fa.status_name(status)} ({fa.last_detail(backend)})"
        for gname, g, r, lp, mag in zip(("dq", "dk", "dv"), got, grads, low, mags):
            scale = max(np.linalg.norm(mag), np.linalg.norm(r))
            err = np.linalg.norm(g - r) / scale if not np.isnan(g).any() else np.inf
            limit = (2.0 * np.linalg.norm(fa.quantize(lp, prob.dtype) - r) / scale + FLOOR +
                     logit_rounding)
            assert err <= limit, f"{backend} {gname}: error {err:.3g} > bound {limit:.3g}"
            errs.append(err)
    return f"max err {max(errs):.1e}"


# ---- forward coverage -------------------------------------------------------

for d in (32, 64, 96, 128, 160, 256):
    for dtype in ("f32", "f16", "bf16"):
        case(f"fwd_d{d}_{dtype}", forward_case, seqlen_q=65, seqlen_k=130, head_dim=d,
             dtype=dtype)

for nq, nk in ((1, 1), (1, 1000), (7, 63), (63, 64), (64, 65), (65, 257), (257, 7),
               (1000, 1000), (1000, 7)):
    for causal in (False, True):
        case(f"fwd_shape_{nq}x{nk}_causal{int(causal)}", forward_case, seqlen_q=nq,
             seqlen_k=nk, head_dim=32, causal=causal)

for window in ((0, 0), (16, 0), (-1, 5), (7, -1), (40, 3)):
    case(f"fwd_window_{window[0]}_{window[1]}", forward_case, seqlen_q=100, seqlen_k=150,
         head_dim=64, window=window)
case("fwd_window_causal", forward_case, seqlen_q=150, seqlen_k=100, head_dim=64,
     window=(20, 10), causal=True)
case("fwd_softcap", forward_case, seqlen_q=70, seqlen_k=90, head_dim=64, softcap=5.0,
     amplitude=3.0)
case("fwd_softcap_causal_bf16", forward_case, seqlen_q=90, seqlen_k=70, head_dim=128,
     softcap=20.0, causal=True, dtype="bf16")
case("fwd_gqa", forward_case, batch=2, heads_q=6, heads_kv=2, seqlen_q=77, seqlen_k=99,
     head_dim=64)
case("fwd_mqa_f16", forward_case, heads_q=4, heads_kv=1, seqlen_q=65, seqlen_k=64,
     head_dim=128, dtype="f16")
for layout in ("bhsd", "padded"):
    for dtype in ("f32", "bf16"):
        case(f"fwd_layout_{layout}_{dtype}", forward_case, batch=2, heads_q=4, heads_kv=2,
             seqlen_q=70, seqlen_k=66, head_dim=96, layout=layout, dtype=dtype, causal=True)
case("fwd_scale_explicit", forward_case, seqlen_q=33, seqlen_k=45, head_dim=64, scale=0.3)
for dtype in ("f32", "f16", "bf16"):
    case(f"fwd_large_logits_{dtype}", forward_case, seqlen_q=64, seqlen_k=200, head_dim=64,
         amplitude=30.0, dtype=dtype)


@test
def fwd_fully_masked_rows():
    """Causal with Nq > Nk: the first Nq − Nk rows see no key: O = 0, LSE = −inf."""
    prob = fa.Problem(rng_for("masked"), seqlen_q=90, seqlen_k=40, head_dim=64, causal=True)
    for backend in ("fa2", "fa1", "ref"):
        status, o, lse = prob.forward(backend)
        assert status == fa.FA_OK
        assert np.all(o[:, :50] == 0.0), f"{backend}: O of empty rows is not 0"
        assert np.all(np.isneginf(lse[:, :, :50])), f"{backend}: LSE of empty rows is not -inf"
        assert np.all(np.isfinite(lse[:, :, 50:]))
    status, dq, dk, dv = prob.backward(o, lse, "fa2")
    assert status == fa.FA_OK and np.all(dq[:, :50] == 0.0) and np.isfinite(dk).all()
    return forward_case(seqlen_q=90, seqlen_k=40, head_dim=64, causal=True)


@test
def fwd_threads_bitwise_equal():
    """The result does not depend on the thread count."""
    prob = fa.Problem(rng_for("threads"), heads_q=3, seqlen_q=200, seqlen_k=150, head_dim=64,
                      causal=True)
    _, o1, l1 = prob.forward("fa2", threads=1)
    _, o3, l3 = prob.forward("fa2", threads=3)
    assert np.array_equal(o1, o3) and np.array_equal(l1, l3)


@test
def thread_pool_gives_the_same_bits():
    """A caller-owned pool (created once, used by many calls, from two threads
    at once) gives the bits of per-call threads; bad sizes are refused."""
    import threading
    pool = ctypes.c_void_p()
    for bad in (0, 65):
        status = fa.CPU.fa_cpu_pool_create(bad, ctypes.byref(pool))
        assert status == fa.STATUS["FA_ERR_INVALID_ARGUMENT"], fa.status_name(status)
    assert fa.CPU.fa_cpu_pool_create(3, ctypes.byref(pool)) == fa.FA_OK
    probs = [fa.Problem(rng_for(f"pool{i}"), heads_q=4, heads_kv=2, seqlen_q=130 + i,
                        seqlen_k=200, head_dim=64, causal=True, dtype="bf16") for i in range(2)]
    plain = [prob.forward("fa2", threads=3) for prob in probs]
    grads = [prob.backward(r[1], r[2], "fa2", threads=3) for prob, r in zip(probs, plain)]
    results = {}
    try:
        fa.POOL[0] = pool
        def run(i):
            for _ in range(3):
                results[i] = (probs[i].forward("fa2"), probs[i].backward(plain[i][1], plain[i][2], "fa2"))
        workers = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        fa.POOL[0] = None
        fa.CPU.fa_cpu_pool_destroy(pool)
    for i in range(2):
        (fs, o, lse), (bs, *g) = results[i]
        assert fs == fa.FA_OK and bs == fa.FA_OK
        assert np.array_equal(o, plain[i][1]) and np.array_equal(lse, plain[i][2])
        assert all(np.array_equal(a, b) for a, b in zip(g, grads[i][1:]))


@test
def concurrent_calls_keep_their_own_results_and_error_detail():
    """Six host threads at once, each with its own problem (and its own
    threads inside): three run valid forwards and backwards, three bad
    inputs; each valid result equals a serial run's bits, each bad call's
    status and detail (thread-local) are its own."""
    import threading
    probs = [fa.Problem(rng_for(f"conc{i}"), heads_q=2, seqlen_q=60 + 7 * i, seqlen_k=90,
                        head_dim=32 + 16 * i, causal=bool(i % 2), dtype="f16") for i in range(3)]
    serial = [prob.forward("fa2", threads=2) for prob in probs]
    grads = [prob.backward(r[1], r[2], "fa2", threads=2) for prob, r in zip(probs, serial)]
    errors = []

    def good(i):
        for _ in range(8):
            f = probs[i].forward("fa2", threads=2)
            g = probs[i].backward(serial[i][1], serial[i][2], "fa2", threads=2)
            if not (f[0] == g[0] == fa.FA_OK and np.array_equal(f[1], serial[i][1]) and
                    all(np.array_equal(a, b) for a, b in zip(g[1:], grads[i][1:]))):
                errors.append(f"thread {i}: results differ from the serial run")

    def bad(i):
        p = fa.Problem(rng_for("concbad"), seqlen_q=8, seqlen_k=8, head_dim=16).params({})
        p.seqlen_q = -(i + 1)
        for _ in range(200):
            status = fa.CPU.fa_cpu_forward(ctypes.byref(p), None)
            detail = fa.CPU.fa_last_error_detail().decode()
            if status != fa.STATUS["FA_ERR_INVALID_SIZE"] or f"seqlen_q {-(i + 1)}," not in detail:
                errors.append(f"thread {i}: {fa.status_name(status)} '{detail}'")
                return

    workers = [threading.Thread(target=good, args=(i,)) for i in range(3)] + \
              [threading.Thread(target=bad, args=(i,)) for i in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors[:3]


def with_cpu_library(name, fn):
    """Runs fn() with fa.CPU replaced by another build of the CPU library."""
    lib = getattr(fa, name)
    if lib is None:
        raise Skip(f"fa.{name} is not built: run the tests through `make test`")
    assert lib._name != fa.CPU._name
    saved = fa.CPU
    try:
        fa.CPU = lib
        return fn()
    finally:
        fa.CPU = saved


@test
def no_threads_build_gives_the_same_bits():
    """The FA_NO_THREADS build runs the same tasks in one thread."""
    prob = fa.Problem(rng_for("nothreads"), heads_q=4, heads_kv=2, seqlen_q=150, seqlen_k=130,
                      head_dim=64, causal=True, dtype="bf16")

    def run():
        _, o, lse = prob.forward("fa2", threads=3)
        return o, lse, prob.backward(o, lse, "fa2", threads=3)[1:]

    o, lse, grads = run()
    o1, lse1, grads1 = with_cpu_library("CPU_NO_THREADS", run)
    assert np.array_equal(o, o1) and np.array_equal(lse, lse1)
    assert all(np.array_equal(a, b) for a, b in zip(grads, grads1))


def with_pack_bytes(cap, fn):
    saved = fa.PACK_BYTES[0]
    try:
        fa.PACK_BYTES[0] = cap
        return fn()
    finally:
        fa.PACK_BYTES[0] = saved


# Packed K/V and Q/dO (fa_cpu_options.pack_bytes): the tiles hold the same
# fp32 values, read in the same order, whether the forward (K/V) and the
# backward (Q/dO) pack them first, pack a few (batch, kv head) pairs at a
# time, or load them per block, so the bits agree. Forward query blocks of at
# most 4 rows (decode, a short last block) take the packed GEMM instead of
# dot products with K's rows: there only the reference decides.
PACK_CASES = [
    dict(seqlen_q=300, seqlen_k=257, head_dim=64, batch=2, heads_q=6, heads_kv=2, causal=True),
    dict(seqlen_q=200, seqlen_k=450, head_dim=33, heads_q=4, heads_kv=4, window=(100, 20),
         dtype="bf16"),
    dict(seqlen_q=250, seqlen_k=70, head_dim=128, batch=3, heads_q=2, heads_kv=1,
         layout="padded", dtype="f16", softcap=10.0, amplitude=3.0),
    dict(seqlen_q=400, seqlen_k=300, head_dim=192, head_dim_v=128, heads_q=4, heads_kv=2,
         causal=True, dtype="bf16"),
]


def packed_matches_unpacked(cfg):
    prob = fa.Problem(rng_for("pack" + str(cfg)), **cfg)
    pad = lambda n: -(-n // 16) * 16  # FA_I_PAD of the SIMD build
    dims = pad(cfg["head_dim"]) + pad(cfg.get("head_dim_v") or cfg["head_dim"])
    pair = 4 * dims * (-(-cfg["seqlen_k"] // 64) * 64)  # fp32 K^T and V of one pair
    group = cfg.get("heads_q", 2) // cfg.get("heads_kv", cfg.get("heads_q", 2))
    bwd_pair = 4 * dims * group * (-(-cfg["seqlen_q"] // 192) * 192)  # Q and dO slots of one pair
    runs = []
    # unpacked, default, then one pair a group and two, for each pass's pair size
    for cap in (-1, 0, pair, 2 * pair + 1, bwd_pair, 2 * bwd_pair + 1):
        status, o, lse = with_pack_bytes(cap, lambda: prob.forward("fa2", threads=3))
        assert status == fa.FA_OK, fa.status_name(status)
        status, *grads = with_pack_bytes(cap, lambda: prob.backward(o, lse, "fa2", threads=3))
        assert status == fa.FA_OK, fa.status_name(status)
        runs.append([o, lse] + grads)
    for run in runs[1:]:
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(run, runs[0]))
    with_pack_bytes(pair, lambda: forward_case(backends=("fa2",), **cfg))
    with_pack_bytes(pair, lambda: backward_case(backends=("fa2",), **cfg))
    return f"{len(runs)} caps agree bitwise, forward and backward"


for i, cfg in enumerate(PACK_CASES):
    case(f"packed_matches_unpacked_{i}", packed_matches_unpacked, cfg)
case("packed_decode_gqa", with_pack_bytes, 1 << 20,  # BHSD: BSHD decode takes the sweep
     lambda: forward_case(backends=("fa2",), seqlen_q=3, seqlen_k=777, head_dim=96, heads_q=8,
                          heads_kv=2, batch=2, causal=True, layout="bhsd"))


for nq, nk in ((1, 33), (47, 17), (100, 130)):
    case(f"small_tiles_fwd_{nq}x{nk}", with_cpu_library, "CPU_SMALL_TILES",
         lambda nq=nq, nk=nk: forward_case(backends=("fa2", "fa1"), heads_q=4, heads_kv=2,
                                           seqlen_q=nq, seqlen_k=nk, head_dim=96, causal=True,
                                           window=(40, -1)))
    case(f"small_tiles_bwd_{nq}x{nk}", with_cpu_library, "CPU_SMALL_TILES",
         lambda nq=nq, nk=nk: backward_case(backends=("fa2",), heads_q=4, heads_kv=2,
                                            seqlen_q=nq, seqlen_k=nk, head_dim=96, causal=True,
                                            window=(40, -1)))


# The SIMD kernels (the default build where the compiler targets AVX2 + FMA)
# against the portable C kernels, both against the reference: head dims that
# are not multiples of the vector width, lengths around the tile sizes, every
# mask, GQA, strided layouts.
SIMD_CASES = [
    dict(seqlen_q=1, seqlen_k=1, head_dim=1),
    dict(seqlen_q=5, seqlen_k=1000, head_dim=3, causal=True),
    dict(seqlen_q=1000, seqlen_k=5, head_dim=17, window=(2, 1)),
    dict(seqlen_q=191, seqlen_k=193, head_dim=33, heads_q=6, heads_kv=2, causal=True),
    dict(seqlen_q=193, seqlen_k=65, head_dim=100, window=(30, -1), dtype="bf16"),
    dict(seqlen_q=300, seqlen_k=257, head_dim=255, softcap=10.0, amplitude=3.0, dtype="f16"),
    dict(seqlen_q=70, seqlen_k=400, head_dim=256, batch=2, heads_q=4, heads_kv=1,
         layout="padded", causal=True),
    dict(seqlen_q=129, seqlen_k=130, head_dim=128, layout="bhsd", dtype="bf16"),
]


def _cpu_fwd_bwd(prob):
    """A closure: prob's forward, then its backward from that O and LSE, on
    fa.CPU as it is when called: [O, LSE, dQ, dK, dV]."""
    def run():
        status, o, lse = prob.forward("fa2")
        assert status == fa.FA_OK, fa.status_name(status)
        status, *grads = prob.backward(o, lse, "fa2")
        assert status == fa.FA_OK, fa.status_name(status)
        return [o, lse] + grads
    return run


def simd_matches_portable(cfg):
    if fa.CPU_PORTABLE is None:
        raise Skip("fa.CPU_PORTABLE is not built: run the tests through `make test`")
    prob = fa.Problem(rng_for("simd" + str(cfg)), **cfg)
    run = _cpu_fwd_bwd(prob)
    simd, portable = run(), with_cpu_library("CPU_PORTABLE", run)
    assert np.array_equal(np.isinf(simd[1]), np.isinf(portable[1]))  # rows that see no key
    simd[1], portable[1] = (np.where(np.isinf(x), 0.0, x) for x in (simd[1], portable[1]))
    diffs = [fa.rel_err(a.astype(np.float64), b.astype(np.float64))
             for a, b in zip(simd, portable)]
    limit = 1e-5 if prob.dtype == "f32" else 2.0**-7  # one 16-bit rounding step apart
    assert max(diffs) < limit, f"SIMD vs portable relative difference {max(diffs):.3g}"
    forward_case(backends=("fa2",), **cfg)
    with_cpu_library("CPU_PORTABLE", lambda: forward_case(backends=("fa2",), **cfg))
    backward_case(backends=("fa2",), **cfg)
    with_cpu_library("CPU_PORTABLE", lambda: backward_case(backends=("fa2",), **cfg))
    return f"diff {max(diffs):.1e}"


for i, cfg in enumerate(SIMD_CASES):
    case(f"simd_matches_portable_{i}_d{cfg['head_dim']}", simd_matches_portable, cfg)


@test
def avx512_microkernels_give_the_avx2_bits():
    """Where the default build runs its products on AVX-512 microkernels, the
    AVX2 ones (FA_CPU_AVX512=0) give the same bits: every element sums its
    products in the same order with one FMA each."""
    if not fa.CPU.fa_test_cpu_avx512():
        raise Skip("this build targets no AVX-512 (its products run on the AVX2 microkernels)")
    if fa.CPU_AVX2 is None:
        raise Skip("fa.CPU_AVX2 is not built: run the tests through `make test`")
    for i, cfg in enumerate(SIMD_CASES):
        run = _cpu_fwd_bwd(fa.Problem(rng_for(f"avx512{i}"), **cfg))
        wide, narrow = run(), with_cpu_library("CPU_AVX2", run)
        for a, b in zip(wide, narrow):
            assert np.array_equal(a, b, equal_nan=True), cfg
    return f"{len(SIMD_CASES)} problems, forward and backward"


@test
def exp2_error_under_one_ulp():
    """The softmax's exp2 (vector lanes and scalar tail, in every build) on
    [-126, 0] against float64, and exact 0 below -126 and at -inf; the
    AVX-512 lanes give the AVX2 lanes' bits."""
    x = np.concatenate([-np.linspace(0.0, 126.0, 1_000_001, dtype=np.float32),
                        -rng_for("exp2").uniform(0.0, 126.0, 500_003).astype(np.float32)])
    ref = np.exp2(x.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    worst, rows = 0.0, {}
    for lib in (fa.CPU, fa.CPU_AVX2, fa.CPU_PORTABLE):
        if lib is None:
            continue
        y = rows[id(lib)] = x.copy()
        lib.fa_test_exp_row(y.ctypes.data, len(y), 0.0)
        worst = max(worst, float(np.max(np.abs(y - ref) / ulp)))
        low = np.array([-126.5, -200.0, -np.inf] * 3, np.float32)
        lib.fa_test_exp_row(low.ctypes.data, len(low), 0.0)
        assert not low.any(), low
        nan = np.full(11, np.nan, np.float32)  # NaN stays NaN (the non-finite policy)
        lib.fa_test_exp_row(nan.ctypes.data, len(nan), 0.0)
        assert np.isnan(nan).all(), nan
    assert worst < 1.0, f"exp2 error {worst:.3f} ulp"
    if fa.CPU_AVX2 is not None:
        assert np.array_equal(rows[id(fa.CPU)], rows[id(fa.CPU_AVX2)]), "AVX-512 and AVX2 bits differ"
    return f"max {worst:.2f} ulp"


@test
def fa1_and_fa2_orders_agree():
    prob = fa.Problem(rng_for("orders"), batch=2, heads_q=4, heads_kv=2, seqlen_q=300,
                      seqlen_k=257, head_dim=64, window=(100, 20))
    _, o2, l2 = prob.forward("fa2")
    _, o1, l1 = prob.forward("fa1")
    err = fa.rel_err(o1, o2)
    assert err < 1e-5, f"FA1 vs FA2 relative difference {err:.3g}"
    check_lse(l1, l2)
    return f"diff {err:.1e}"


# ---- split-KV and combine ---------------------------------------------------------

def combine_case(backend, dtype, part_dtype, parts=3, in_place=False, layout="bshd"):
    """Random parts with empty ones (LSE -inf, O garbage that must not be
    read): some rows lose a part, some all; against reference.combine."""
    rng = rng_for(f"combine{backend}{dtype}{part_dtype}{parts}{in_place}{layout}")
    b, n, h, d = 2, 9, 3, 40
    o_parts = [fa.quantize(rng.standard_normal((b, n, h, d)), part_dtype) for _ in range(parts)]
    lse_parts = [(rng.standard_normal((b, h, n)) * 4).astype(np.float32) for _ in range(parts)]
    for i in range(parts):
        empty = rng.random((b, h, n)) < 0.3
        lse_parts[i][empty] = -np.inf
        o_parts[i][empty.transpose(0, 2, 1)] = np.nan if part_dtype != "bf16" else 1e30
    for i in range(parts):  # row (0, 0, 0) sees nothing in any part
        lse_parts[i][0, 0, 0] = -np.inf
    ref_o, ref_lse = reference.combine(o_parts, lse_parts)
    status, o, lse = fa.combine(backend, o_parts, lse_parts, dtype, part_dtype, layout, in_place)
    assert status == fa.FA_OK, fa.status_name(status)
    assert np.all(o[0, 0, 0] == 0.0) and np.isneginf(lse[0, 0, 0])
    err = fa.rel_err(o, ref_o)
    limit = 2 * fa.rel_err(fa.quantize(ref_o, dtype), ref_o) + 1e-6
    assert err <= limit, f"combine error {err:.3g} > {limit:.3g}"
    check_lse(lse, ref_lse)
    return f"err {err:.1e}"


for dtype, part_dtype in (("f32", "f32"), ("bf16", "f32"), ("f16", "f16"), ("bf16", "bf16")):
    case(f"combine_{dtype}_parts_{part_dtype}", combine_case, "cpu", dtype, part_dtype)
case("combine_one_part", combine_case, "cpu", "f32", "f32", parts=1)
case("combine_many_parts_padded", combine_case, "cpu", "f16", "f32", parts=40, layout="padded")
case("combine_in_place", combine_case, "cpu", "f32", "f32", parts=4, in_place=True)


@test
def combine_of_key_ranges_is_the_whole():
    """Attention over two key ranges, merged, is attention over their union
    (the cascade / context-parallel use)."""
    prob = fa.Problem(rng_for("ranges"), heads_q=4, heads_kv=2, seqlen_q=30, seqlen_k=100,
                      head_dim=64, causal=True)
    args = prob.reference_args()
    parts = [reference.forward(prob.q, prob.k, prob.v, keys=r, **args) for r in ((0, 37), (37, 100))]
    status, o, lse = fa.combine("cpu", [p[0] for p in parts], [p[1] for p in parts], "f32", "f32")
    ref_o, ref_lse = reference.forward(prob.q, prob.k, prob.v, **args)
    assert status == fa.FA_OK
    err = fa.rel_err(o, ref_o)
    assert err < 1e-6, err
    check_lse(lse, ref_lse)
    return f"err {err:.1e}"


# Forced split counts on decode shapes (Nq <= 16, GQA) and the library's own
# choice; every mask; against the float64 reference.
for nq, nk, splits, extra in ((1, 1, 3, {}), (1, 1000, 7, dict(causal=True)),
                              (2, 1000, 64, dict(window=(100, 0))), (4, 65537, 0, {}),
                              (8, 333, 2, dict(softcap=4.0, amplitude=3.0)),
                              (16, 1000, 5, dict(causal=True, window=(40, -1))),
                              (16, 7, 0, dict(causal=True)), (1, 4096, 0, {})):
    case(f"fwd_split_{nq}x{nk}_s{splits}", forward_case, backends=("fa2",), heads_q=8,
         heads_kv=2, seqlen_q=nq, seqlen_k=nk, head_dim=64, num_splits=splits, **extra)


def decode_sweep_matches_head_path(cfg):
    """Decode in BSHD streams each K and V row once for every head (the
    sweep); in BHSD, where a row's heads are not side by side, a task takes
    one head. With the same split count they form the same sums in the same
    order, so the bits agree; both against the float64 reference too."""
    runs = []
    for layout in ("bshd", "bhsd"):
        prob = fa.Problem(rng_for("sweep" + str(cfg)), layout=layout, **cfg)
        status, o, lse = with_pack_bytes(-1, lambda: prob.forward("fa2", threads=3))
        assert status == fa.FA_OK, fa.status_name(status)
        runs.append((o, lse))
        forward_case(backends=("fa2",), layout=layout, **cfg)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*runs))
    return "bits agree"


for i, cfg in enumerate((dict(seqlen_q=1, seqlen_k=3000, heads_q=8, heads_kv=2, num_splits=3),
                         dict(seqlen_q=4, seqlen_k=700, heads_q=6, heads_kv=6, num_splits=1,
                              causal=True, dtype="bf16"),
                         dict(seqlen_q=3, seqlen_k=515, heads_q=4, heads_kv=1, num_splits=2,
                              window=(200, 0), softcap=5.0, head_dim=40, head_dim_v=24),
                         dict(seqlen_q=2, seqlen_k=1, batch=3, heads_q=2, heads_kv=1),
                         dict(seqlen_q=1, seqlen_k=300, heads_q=4, heads_kv=2, head_dim=40,
                              head_dim_v=72, dtype="f16"))):
    case(f"fwd_decode_sweep_{i}", decode_sweep_matches_head_path,
         dict(dict(head_dim=64), **cfg))


@test
def fwd_split_threads_bitwise_equal():
    """A decode forward that the library splits gives the same bits on any
    thread count (the split count is a function of the problem)."""
    prob = fa.Problem(rng_for("split_threads"), heads_q=4, heads_kv=1, seqlen_q=1,
                      seqlen_k=5000, head_dim=64)
    _, o1, l1 = prob.forward("fa2", threads=1)
    _, o3, l3 = prob.forward("fa2", threads=3)
    assert np.array_equal(o1, o3) and np.array_equal(l1, l3)


def _bad_combine(mutate, expected):
    """A valid merge with one thing wrong: the status is `expected`, o and lse untouched."""
    b, n, h, d = 1, 4, 2, 16
    parts = [fa.Tensor((b, n, h, d), "f32", values=np.ones((b, n, h, d))) for _ in range(2)]
    lses = [np.zeros((b, h, n), np.float32) for _ in range(2)]
    o = fa.Tensor((b, n, h, d), "f32", values=np.full((b, n, h, d), 7.0))
    lse = np.full((b, h, n), 7.0, np.float32)
    c = fa.CombineParams()
    c.num_parts, c.batch, c.heads, c.seqlen, c.head_dim = 2, b, h, n, d
    c.part_dtype = c.dtype = fa.DTYPES["f32"]
    ptrs = (ctypes.c_void_p * 2)(*[t.ptr for t in parts])
    lptrs = (ctypes.c_void_p * 2)(*[x.ctypes.data for x in lses])
    c.o_parts = ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p))
    c.lse_parts = ctypes.cast(lptrs, ctypes.POINTER(ctypes.c_void_p))
    c.o, c.lse = o.ptr, lse.ctypes.data
    mutate(c, ptrs)
    before = o.storage.copy()
    status = fa.CPU.fa_cpu_combine(ctypes.byref(c), None)
    assert status == fa.STATUS[expected], f"got {fa.status_name(status)}, expected {expected}"
    assert np.array_equal(before, o.storage) and (lse == 7.0).all(), "an output was written"
    return fa.CPU.fa_last_error_detail().decode()


def _cset(**fields):
    def mutate(c, ptrs):
        for k, v in fields.items():
            setattr(c, k, v)
    return mutate


def _null_part(c, ptrs):
    ptrs[1] = None


def _o_is_part(c, ptrs):
    c.accumulate, ptrs[1] = 1, c.o


for name, mutate, expected in (
        ("parts_0", _cset(num_parts=0), "FA_ERR_INVALID_ARGUMENT"),
        ("parts_too_many", _cset(num_parts=129), "FA_ERR_INVALID_ARGUMENT"),
        ("null_part", _null_part, "FA_ERR_NULL_POINTER"),
        ("null_o", _cset(o=None), "FA_ERR_NULL_POINTER"),
        ("part_dtype_fp8", _cset(part_dtype=fa.DTYPES["fp8"]), "FA_ERR_INVALID_ARGUMENT"),
        ("accumulate_without_lse", _cset(accumulate=1, lse=None), "FA_ERR_NULL_POINTER"),
        ("accumulate_into_a_part", _o_is_part, "FA_ERR_INVALID_ARGUMENT"),
        ("heads_0", _cset(heads=0), "FA_ERR_INVALID_SIZE"),
        ("o_rows_overlap", _cset(o_layout=fa.Layout(0, 8, 16)), "FA_ERR_INVALID_LAYOUT")):
    case(f"bad_combine_{name}", _bad_combine, mutate, expected)


# ---- backward coverage ------------------------------------------------------

for d in (32, 64, 96, 128, 160, 256):
    for dtype in ("f32", "bf16"):
        case(f"bwd_d{d}_{dtype}", backward_case, seqlen_q=65, seqlen_k=70, head_dim=d,
             dtype=dtype)
case("bwd_f16", backward_case, seqlen_q=100, seqlen_k=65, head_dim=64, dtype="f16")
for nq, nk in ((1, 1), (1, 300), (300, 1), (63, 64), (257, 65)):
    for causal in (False, True):
        case(f"bwd_shape_{nq}x{nk}_causal{int(causal)}", backward_case, seqlen_q=nq,
             seqlen_k=nk, head_dim=32, causal=causal)
case("bwd_window", backward_case, seqlen_q=130, seqlen_k=100, head_dim=64, window=(30, 4))
case("bwd_softcap", backward_case, seqlen_q=70, seqlen_k=90, head_dim=64, softcap=5.0,
     amplitude=3.0)
case("bwd_gqa_bhsd", backward_case, batch=2, heads_q=6, heads_kv=2, seqlen_q=77,
     seqlen_k=99, head_dim=64, layout="bhsd", causal=True)
case("bwd_mqa_padded", backward_case, heads_q=4, heads_kv=1, seqlen_q=65, seqlen_k=64,
     head_dim=128, layout="padded")
case("bwd_large_logits", backward_case, seqlen_q=64, seqlen_k=100, head_dim=64,
     amplitude=30.0)


# A separate V head dim (head_dim_v): DeepSeek's MLA prefill (QK 192, V 128),
# smaller and larger V than QK, odd dims, decode with splits, every mask.
HEAD_DIM_V_CASES = [
    dict(head_dim=192, head_dim_v=128, seqlen_q=100, seqlen_k=150, heads_q=4, heads_kv=2,
         causal=True, dtype="bf16"),
    dict(head_dim=64, head_dim_v=32, seqlen_q=257, seqlen_k=65),
    dict(head_dim=17, head_dim_v=100, seqlen_q=5, seqlen_k=300, window=(20, 3), dtype="f16"),
    dict(head_dim=128, head_dim_v=256, seqlen_q=1, seqlen_k=700, heads_q=8, heads_kv=1),
    dict(head_dim=96, head_dim_v=48, seqlen_q=200, seqlen_k=200, softcap=5.0, amplitude=3.0,
         layout="bhsd"),
    dict(head_dim=40, head_dim_v=8, seqlen_q=70, seqlen_k=1000, num_splits=3, layout="padded"),
]
for i, cfg in enumerate(HEAD_DIM_V_CASES):
    case(f"head_dim_v_fwd_{i}_{cfg['head_dim']}_{cfg['head_dim_v']}", forward_case, **cfg)
    if "num_splits" not in cfg:
        case(f"head_dim_v_bwd_{i}_{cfg['head_dim']}_{cfg['head_dim_v']}", backward_case, **cfg)
case("head_dim_v_small_tiles", with_cpu_library, "CPU_SMALL_TILES",
     lambda: backward_case(backends=("fa2",), **HEAD_DIM_V_CASES[0]))
case("head_dim_v_portable_kernels", with_cpu_library, "CPU_PORTABLE",
     lambda: backward_case(backends=("fa2",), **HEAD_DIM_V_CASES[2]))


@test
def bwd_deterministic():
    prob = fa.Problem(rng_for("det"), heads_q=4, heads_kv=2, seqlen_q=200, seqlen_k=170,
                      head_dim=64, causal=True)
    _, o, lse = prob.forward("fa2")
    first = prob.backward(o, lse, "fa2", threads=1)
    for threads in (2, 3):
        again = prob.backward(o, lse, "fa2", threads=threads)
        assert all(np.array_equal(a, b) for a, b in zip(first[1:], again[1:]))


@test
def reference_gradient_matches_finite_differences():
    """The NumPy analytic gradient itself, against central differences in float64."""
    rng = rng_for("fd")
    for cfg in (dict(causal=True), dict(window=(1, 1)), dict(softcap=2.0)):
        q = rng.standard_normal((1, 4, 2, 3))
        k = rng.standard_normal((1, 5, 1, 3))
        v = rng.standard_normal((1, 5, 1, 3))
        dout = rng.standard_normal((1, 4, 2, 3))
        grads = reference.backward(q, k, v, dout, 0.7, **cfg)
        for x, g in zip((q, k, v), grads):
            num = np.zeros_like(x)
            for idx in np.ndindex(x.shape):
                old = x[idx]
                x[idx] = old + 1e-6
                plus = (reference.forward(q, k, v, 0.7, **cfg)[0] * dout).sum()
                x[idx] = old - 1e-6
                minus = (reference.forward(q, k, v, 0.7, **cfg)[0] * dout).sum()
                x[idx] = old
                num[idx] = (plus - minus) / 2e-6
            assert np.abs(num - g).max() < 1e-7, f"{cfg}: {np.abs(num - g).max():.3g}"


# ---- non-finite input ---------------------------------------------------------
# The policy (README, "Non-finite input"): a NaN or +inf among a row's
# allowed scores (from Q or K, or a scale that overflows) gives O = NaN and
# LSE = NaN, as a plain softmax gives; -inf scores get weight 0 (all -inf:
# O = 0, LSE = -inf, like a row without keys); NaN or Inf in V reaches O
# through P V. Outputs start finite (7) here, so that a
# NaN shows a write.

def _forward_sentinel(prob, backend):
    t = {"q": prob.tensor("q", prob.q), "k": prob.tensor("k", prob.k),
         "v": prob.tensor("v", prob.v),
         "o": prob.tensor("o", np.full((prob.b, prob.nq, prob.hq, prob.dv), 7.0))}
    t["lse"] = np.full((prob.b, prob.hq, prob.nq), 7.0, np.float32)
    status = fa.call_forward(backend, prob.params(t))
    assert status == fa.FA_OK, f"{backend}: {fa.status_name(status)}"
    return t["o"].values(), t["lse"].astype(np.float64)


def nonfinite_case(tensor, at, value, backends=("fa2", "fa1", "ref"), **cfg):
    """Puts value into one element of q, k or v (at = (b, n, h, i)) and
    checks every backend against the float64 reference, row by row: the
    same rows NaN (O and LSE), the rest finite and within the usual bound."""
    prob = fa.Problem(rng_for("nonfinite" + tensor + str(at) + str(cfg)), **cfg)
    getattr(prob, tensor)[at] = value
    if tensor in ("q", "k") and np.isinf(value):  # its scores all +inf (or all -inf)
        other = prob.q if tensor == "k" else prob.k
        other[..., at[3]] = np.abs(other[..., at[3]])
    ref_o, ref_lse = reference.forward(prob.q, prob.k, prob.v, **prob.reference_args())
    with np.errstate(invalid="ignore"):
        low_o, _ = reference.forward(prob.q, prob.k, prob.v, precision=np.float32,
                                     round_p=tensor_core_rounding(prob, backends),
                                     **prob.reference_args())
    bad_rows = np.isnan(ref_lse).transpose(0, 2, 1)  # [B, Nq, Hq]
    bad_o = ~np.isfinite(ref_o)
    assert bad_rows.any() == (tensor != "v" and value != -np.inf), "rows NaN or not, as planned"
    for backend in backends:
        o, lse = _forward_sentinel(prob, backend)
        assert np.array_equal(np.isnan(lse), np.isnan(ref_lse)), f"{backend}: NaN LSE rows differ"
        assert np.array_equal(np.isnan(o), np.isnan(ref_o)), f"{backend}: NaN O entries differ"
        assert np.array_equal(np.isinf(o), np.isinf(ref_o)), f"{backend}: Inf O entries differ"
        fine = np.isfinite(ref_o)
        check(backend, np.where(fine, o, 0.0), np.where(fine, ref_o, 0.0),
              np.where(fine, low_o, 0.0), prob.dtype)
        check_lse(np.where(np.isnan(lse), 0.0, lse), np.where(np.isnan(ref_lse), 0.0, ref_lse))
    return f"{int(bad_rows.sum())} of {bad_rows.size} rows NaN"


NAN = float("nan")
for name, tensor, at, value, cfg in (
        ("nan_in_q", "q", (0, 70, 1, 5), NAN, dict(causal=True)),
        ("inf_in_q", "q", (1, 50, 0, 0), float("inf"), dict(batch=2, window=(5, 5))),
        ("nan_in_k_causal_gqa", "k", (0, 40, 1, 3), NAN, dict(heads_q=4, heads_kv=2, causal=True)),
        ("nan_in_k_bf16", "k", (0, 100, 0, 0), NAN, dict(dtype="bf16", seqlen_k=150)),
        ("inf_in_k_f16", "k", (0, 9, 0, 7), float("inf"), dict(dtype="f16", seqlen_q=1)),
        ("minus_inf_in_k", "k", (0, 2, 1, 1), -float("inf"), dict(seqlen_q=3, seqlen_k=200)),
        ("nan_in_v", "v", (0, 0, 0, 2), NAN, dict(seqlen_k=100)),
        ("inf_in_v", "v", (0, 0, 1, 4), float("inf"), dict(seqlen_k=100)),
        ("nan_in_k_split", "k", (0, 130, 0, 0), NAN, dict(seqlen_q=2, seqlen_k=600, num_splits=3)),
        ("nan_in_k_softcap", "k", (0, 7, 0, 0), NAN, dict(softcap=4.0, causal=True)),
):
    cfg.setdefault("seqlen_q", 100)
    cfg.setdefault("seqlen_k", 90)
    cfg.setdefault("head_dim", 16)
    case(f"nonfinite_{name}", nonfinite_case, tensor, at, value, **cfg)
case("nonfinite_portable_kernels", with_cpu_library, "CPU_PORTABLE",
     lambda: nonfinite_case("k", (0, 30, 0, 1), NAN, heads_q=2, heads_kv=1, seqlen_q=50,
                            seqlen_k=70, head_dim=9, causal=True))


@test
def nonfinite_scale_overflow_makes_nan_rows():
    """scale 3e38: scale * log2(e) overflows fp32; with Q and K positive every
    score is +inf and every row NaN (the float64 reference would not
    overflow; the policy is about the library's own arithmetic)."""
    prob = fa.Problem(rng_for("overflow"), seqlen_q=40, seqlen_k=50, head_dim=32, scale=3e38,
                      causal=True)
    prob.q, prob.k = np.abs(prob.q), np.abs(prob.k)
    for backend in ("fa2", "fa1"):
        o, lse = _forward_sentinel(prob, backend)
        assert np.isnan(o).all() and np.isnan(lse).all(), backend


@test
def nonfinite_backward_keeps_nan_rows():
    """The backward from a forward with NaN rows: their dQ rows are NaN; the
    other head stays finite (rows of the same head that mask the NaN key may
    see 0 * NaN in dS K, as a plain matmul would)."""
    prob = fa.Problem(rng_for("nanbwd"), seqlen_q=80, seqlen_k=80, head_dim=16, causal=True)
    prob.k[0, 50, 0, 3] = NAN
    status, o, lse = prob.forward("fa2")
    assert status == fa.FA_OK
    status, dq, dk, dv = prob.backward(o, lse, "fa2")
    assert status == fa.FA_OK
    rows = np.isnan(lse[0, 0])
    assert rows[50:].all() and not rows[:50].any(), np.flatnonzero(rows)
    assert np.isnan(dq[0, 50:, 0]).all()
    assert np.isfinite(dq[0, :, 1]).all() and np.isfinite(dk[0, :, 1]).all()


@test
def nonfinite_combine_keeps_nan_rows():
    rng = rng_for("nancombine")
    parts = [rng.standard_normal((1, 6, 2, 8)) for _ in range(3)]
    lses = [rng.standard_normal((1, 2, 6)) for _ in range(3)]
    lses[1][0, 1, 4] = NAN
    status, o, lse = fa.combine("cpu", parts, lses, "f32", "f32")
    assert status == fa.FA_OK
    ro, rl = reference.combine(parts, lses)
    assert np.array_equal(np.isnan(lse), np.isnan(rl)) and np.isnan(lse[0, 1, 4])
    assert np.array_equal(np.isnan(o), np.isnan(ro)) and np.isnan(o[0, 4, 1]).all()
    fine = ~np.isnan(ro)
    assert np.abs(o[fine] - ro[fine]).max() < 1e-5


# ---- API surface --------------------------------------------------------------

@test
def params_struct_matches_ctypes_mirror():
    assert fa.CPU.fa_test_params_size() == ctypes.sizeof(fa.Params)
    for name, _ in fa.Params._fields_:
        assert fa.CPU.fa_test_params_offset(name.encode()) == getattr(fa.Params, name).offset, name
    for stem, mirror in (("combine_params", fa.CombineParams),
                         ("quantize_params", fa.QuantizeParams)):
        assert getattr(fa.CPU, f"fa_test_{stem}_size")() == ctypes.sizeof(mirror), stem
        for name, _ in mirror._fields_:
            assert (getattr(fa.CPU, f"fa_test_{stem}_offset")(name.encode()) ==
                    getattr(mirror, name).offset), (stem, name)


@test
def rows_seeing_keys_cover_the_mask():
    """fa_i_rows_seeing_keys (the GPU backward's row span per key block, in
    closed form) against reference.mask: every row that sees a key of the
    block lies in the span, and the span's ends see the block or see nothing."""
    rng = rng_for("rows_seeing_keys")
    windows = (None, (0, 0), (3, -1), (-1, 2), (5, 9), (-1, -1), (0, -1), (40, 0), (2**31 - 1, 5))
    first, last = ctypes.c_int(), ctypes.c_int()
    for _ in range(300):
        nq, nk = (int(x) for x in rng.integers(1, 200, 2))
        causal, window = bool(rng.integers(2)), windows[rng.integers(len(windows))]
        p = fa.Problem(rng, seqlen_q=1, seqlen_k=1).params({})
        p.seqlen_q, p.seqlen_k, p.causal = nq, nk, int(causal)
        if window is not None:
            p.window, (p.window_left, p.window_right) = 1, window
        shift = None
        if rng.integers(3) == 0:  # a chunk pair's positions
            p.positions, p.q_position, p.k_position = 1, *(int(x) for x in rng.integers(0, 400, 2))
            shift = p.q_position - p.k_position
        visible = ~reference.mask(nq, nk, causal, window, shift)
        empty = ~visible.any(axis=1)
        bn = int(rng.integers(1, 70))
        for c0 in range(0, nk, bn):
            c1 = min(c0 + bn, nk)
            fa.CPU.fa_test_rows_seeing_keys(ctypes.byref(p), c0, c1, ctypes.byref(first),
                                           ctypes.byref(last))
            rows = np.nonzero(visible[:, c0:c1].any(axis=1))[0]
            cfg = (nq, nk, causal, window, c0, c1, first.value, last.value)
            if len(rows):
                assert first.value <= rows[0] and last.value >= rows[-1], cfg
            for end in (first.value, last.value):
                if first.value <= last.value:
                    assert end in rows or empty[end], cfg


@test
def conversions_match_numpy():
    bits = np.arange(65536, dtype=np.uint16)
    ours = np.array([fa.CPU.fa_f16_to_f32(int(b)) for b in bits], np.float32)
    theirs = bits.view(np.float16).astype(np.float32)
    assert np.array_equal(ours, theirs, equal_nan=True)
    rng = rng_for("conv")
    xs = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000),
                         [0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e9, -1e9, 6e-8, 2.98e-8,
                          np.inf, -np.inf, np.nan]]).astype(np.float32)
    f16 = np.array([fa.CPU.fa_f32_to_f16(float(x)) for x in xs], np.uint16)
    with np.errstate(over="ignore"):  # 1e9 and inf become inf on purpose
        assert np.array_equal(f16.view(np.float16), xs.astype(np.float16), equal_nan=True)
    b16 = np.array([fa.CPU.fa_f32_to_bf16(float(x)) for x in xs], np.uint16)
    ref = fa.bf16_bits(xs)
    same = (b16 == ref) | (np.isnan(xs) & ((b16 & 0x7FFF) > 0x7F80))
    assert same.all(), xs[~same][:5]
    back = np.array([fa.CPU.fa_bf16_to_f32(int(b)) for b in b16[:100]], np.float32)
    assert np.array_equal(back, fa.bf16_value(b16[:100]).astype(np.float32), equal_nan=True)


def _bad(mutate, expected, backward=False):
    """A valid problem with one thing wrong: the status is `expected` and no
    output changed."""
    prob = fa.Problem(rng_for("bad"), heads_q=4, heads_kv=2, seqlen_q=20, seqlen_k=30,
                      head_dim=64)
    names = ("q", "k", "v", "o", "dout", "dq", "dk", "dv")
    t = {n: prob.tensor(n, getattr(prob, n, None) if n in "q k v dout".split() else None)
         for n in names}
    for n in ("o", "dq", "dk", "dv"):
        t[n].view[...] = fa.to_storage(np.full(t[n].view.shape, 7.0), prob.dtype)
    t["lse"] = np.full((1, 4, 20), 7.0, np.float32)
    p = prob.params(t)
    mutate(p)
    before = {n: t[n].storage.copy() for n in ("o", "dq", "dk", "dv")}
    lse_before = t["lse"].copy()
    backends = ("fa2", "fa1", "ref") if not backward else ("fa2", "ref")
    for backend in backends:
        call = fa.call_backward if backward else fa.call_forward
        status = call(backend, p)
        assert status == fa.STATUS[expected], \
            f"{backend}: got {fa.status_name(status)}, expected {expected}"
        detail = fa.CPU.fa_last_error_detail().decode()
        assert detail, "no error detail"
        for n, old in before.items():
            assert np.array_equal(old, t[n].storage), f"{backend} wrote {n}"
        assert np.array_equal(lse_before, t["lse"]), f"{backend} wrote lse"
    return detail


def _set(**fields):
    def mutate(p):
        for k, v in fields.items():
            if isinstance(v, tuple):
                setattr(p, k, fa.Layout(*v))
            else:
                setattr(p, k, v)
    return mutate


BAD_INPUTS = [
    ("null_q", _set(q=None), "FA_ERR_NULL_POINTER", False),
    ("null_o", _set(o=None), "FA_ERR_NULL_POINTER", False),
    ("null_dout", _set(dout=None), "FA_ERR_NULL_POINTER", True),
    ("null_lse_backward", _set(lse=None), "FA_ERR_NULL_POINTER", True),
    ("head_dim_0", _set(head_dim=0), "FA_ERR_INVALID_SIZE", False),
    ("head_dim_512", _set(head_dim=512), "FA_ERR_UNSUPPORTED", False),
    ("batch_0", _set(batch=0), "FA_ERR_INVALID_SIZE", False),
    ("seqlen_q_negative", _set(seqlen_q=-5), "FA_ERR_INVALID_SIZE", False),
    ("seqlen_k_0", _set(seqlen_k=0), "FA_ERR_INVALID_SIZE", True),
    ("heads_kv_negative", _set(heads_kv=-2), "FA_ERR_INVALID_SIZE", False),
    ("heads_not_divisible", _set(heads_kv=3), "FA_ERR_INVALID_HEADS", False),
    ("heads_not_divisible_bwd", _set(heads_kv=3), "FA_ERR_INVALID_HEADS", True),
    ("rows_overlap", _set(q_layout=(20 * 4 * 64, 64, 32)), "FA_ERR_INVALID_LAYOUT", False),
    ("heads_overlap", _set(o_layout=(20 * 4 * 64, 0, 256)), "FA_ERR_INVALID_LAYOUT", False),
    ("negative_stride", _set(k_layout=(-1, 64, 128)), "FA_ERR_INVALID_LAYOUT", False),
    ("dk_overlap", _set(dk_layout=(64, 32, 128)), "FA_ERR_INVALID_LAYOUT", True),
    ("dtype_unknown", _set(dtype=7), "FA_ERR_INVALID_ARGUMENT", False),
    ("dtype_fp8_without_descales", _set(dtype=3), "FA_ERR_NULL_POINTER", False),
    ("scale_negative", _set(scale=-1.0), "FA_ERR_INVALID_ARGUMENT", False),
    ("scale_nan", _set(scale=float("nan")), "FA_ERR_INVALID_ARGUMENT", False),
    ("softcap_inf", _set(softcap=float("inf")), "FA_ERR_INVALID_ARGUMENT", True),
    ("softcap_denormal", _set(softcap=1e-40), "FA_ERR_INVALID_ARGUMENT", True),
    ("head_dim_v_negative", _set(head_dim_v=-1), "FA_ERR_INVALID_SIZE", True),
    ("head_dim_v_past_256", _set(head_dim_v=257), "FA_ERR_UNSUPPORTED", False),
    ("softcap_past_the_scale", _set(softcap=1e-38, scale=100.0), "FA_ERR_INVALID_ARGUMENT", False),
    ("num_splits_negative", _set(num_splits=-1), "FA_ERR_INVALID_ARGUMENT", False),
    ("num_splits_too_many", _set(num_splits=129), "FA_ERR_INVALID_ARGUMENT", False),
]
for name, mutate, expected, backward in BAD_INPUTS:
    case(f"bad_input_{name}", _bad, mutate, expected, backward)


def _alias(out, inp):
    """p.out points at p.inp's storage (with its layout)."""
    def mutate(p):
        setattr(p, out, getattr(p, inp))
        setattr(p, out + "_layout", getattr(p, inp + "_layout"))
    return mutate


def _shift(out, inp, elements):
    """p.out starts `elements` into p.inp's storage (a partial overlap)."""
    def mutate(p):
        setattr(p, out, getattr(p, inp) + elements * 4)
    return mutate


# Sizes past the limits (issue 52's reproducers): refused at validation, so
# the small buffers behind them are never read. And aliasing: an output
# over an input (or another output) would be read after it was written.
LIMIT_INPUTS = [
    ("seqlen_k_past_max", _set(seqlen_k=2**31 - 63), "FA_ERR_INVALID_SIZE", False),
    ("seqlen_q_past_max", _set(seqlen_q=2**31 - 64), "FA_ERR_INVALID_SIZE", False),
    ("seqlen_k_one_past_max", _set(seqlen_k=0x7FFF0000 + 1), "FA_ERR_INVALID_SIZE", False),
    ("backward_seqlen_k_past_max", _set(heads_q=65, heads_kv=65, seqlen_q=1, seqlen_k=2**31 - 65,
                                        head_dim=1), "FA_ERR_INVALID_SIZE", True),
    ("default_strides_past_int64", _set(batch=2, heads_q=2**31 - 1, heads_kv=2**31 - 1,
                                        seqlen_q=2**30, seqlen_k=2**30, head_dim=256,
                                        q_layout=(0, 0, 0), k_layout=(0, 0, 0),
                                        v_layout=(0, 0, 0), o_layout=(0, 0, 0)),
     "FA_ERR_INVALID_SIZE", False),
    ("alias_o_k", _alias("o", "k"), "FA_ERR_INVALID_LAYOUT", False),
    ("alias_o_v", _alias("o", "v"), "FA_ERR_INVALID_LAYOUT", False),
    ("alias_o_q", _alias("o", "q"), "FA_ERR_INVALID_LAYOUT", False),
    ("alias_o_inside_k", _shift("o", "k", 100), "FA_ERR_INVALID_LAYOUT", False),
    ("alias_dq_q", _alias("dq", "q"), "FA_ERR_INVALID_LAYOUT", True),
    ("alias_dq_dout", _alias("dq", "dout"), "FA_ERR_INVALID_LAYOUT", True),
    ("alias_dk_dv", _alias("dk", "dv"), "FA_ERR_INVALID_LAYOUT", True),
]
for name, mutate, expected, backward in LIMIT_INPUTS:
    case(f"bad_input_{name}", _bad, mutate, expected, backward)


def _reserve(nbytes):
    """nbytes of address space, never backed unless touched (MAP_NORESERVE)."""
    import mmap
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


@test
def backward_refuses_key_tiles_past_2_31_before_writing_dq():
    """2^21 kv heads of 2^16 keys: 2^31 dK/dV tiles, one past the task limit;
    K, V, dK, dV reserved as 256 GB each, never touched. The refusal comes
    before the dQ pass writes anything."""
    hk, nk = 2**21, 2**16
    prob = fa.Problem(rng_for("tiles"), heads_q=1, seqlen_q=1, seqlen_k=1, head_dim=1, dtype="f16")
    small = {n: np.full((1, 1, hk, 1), 7.0, np.float16) for n in ("q", "o", "dout", "dq")}
    try:
        maps = {n: _reserve(2 * hk * nk) for n in ("k", "v", "dk", "dv")}
    except (OSError, ValueError, OverflowError) as why:
        raise Skip(f"cannot reserve 1 TB of address space here: {why}")
    lse = np.zeros((1, hk, 1), np.float32)
    p = prob.params({})
    p.heads_q = p.heads_kv = hk
    p.seqlen_k = nk
    for n, a in small.items():
        setattr(p, n, a.ctypes.data)
    for n, (_, addr) in maps.items():
        setattr(p, n, addr)
    p.lse = lse.ctypes.data
    for layout in ("q_layout", "k_layout", "v_layout", "o_layout", "dout_layout", "dq_layout",
                   "dk_layout", "dv_layout"):
        setattr(p, layout, fa.Layout(0, 0, 0))
    status = fa.call_backward("fa2", p)
    assert status == fa.STATUS["FA_ERR_INVALID_SIZE"], fa.status_name(status)
    assert np.all(small["dq"] == 7.0), "dq was written"
    return fa.CPU.fa_last_error_detail().decode()


def _fuzz_run(cc, flags, seconds, runner=()):
    """Builds tests/fuzz.c with compiler cc and flags, runs it (under runner:
    an emulator's command) for `seconds` of CPU time with a seed from this
    run's, and asserts that it passed; its output. The build's stderr where
    it fails: returned as (None, stderr)."""
    import tempfile
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "fuzz")
        build = subprocess.run([cc, "-std=c99"] + flags +
                               ["-o", exe, os.path.join(here, "fuzz.c"), "-lm", "-pthread"],
                               capture_output=True, text=True)
        if build.returncode != 0:
            return None, build.stderr
        seed = int(rng_for("fuzz " + cc + " " + " ".join(flags)).integers(2**31))
        run = subprocess.run(list(runner) + [exe, str(seconds), str(seed)], capture_output=True,
                             text=True)
    assert run.returncode == 0, run.stdout[-1500:] + run.stderr[-1500:]
    return run.stdout.strip(), None


def _fuzz(seconds, flags):
    """The fuzz built by this machine's gcc for its own CPU."""
    import shutil
    if not shutil.which("gcc"):
        raise Skip("gcc not found")
    out, err = _fuzz_run("gcc", ["-march=native"] + flags, seconds)
    if out is None:
        if "-fsanitize=address,undefined" in flags:
            raise Skip("this gcc cannot build with the sanitizers: " + err[-200:])
        raise AssertionError(err)
    return out.replace("\n", "; ")


@test
def fuzz_cpu_arm64():
    """The CPU path on arm64: tests/fuzz.c cross-built by aarch64-linux-gnu-gcc
    and run under qemu-aarch64, 10 s with the NEON microkernels and exps
    (the default there) and 10 s with the portable C kernels
    (-DFA_CPU_NEON=0), where both tools are installed (Debian:
    gcc-aarch64-linux-gnu, qemu-user); skipped elsewhere."""
    import shutil
    if not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")):
        raise Skip("aarch64-linux-gnu-gcc or qemu-aarch64 not installed")
    results = []
    for name, flags in (("NEON", []), ("portable", ["-DFA_CPU_NEON=0"])):
        out, err = _fuzz_run("aarch64-linux-gnu-gcc",
                             ["-O3", "-ffp-contract=fast", "-Wall", "-Werror", "-static"] + flags,
                             10, runner=("qemu-aarch64",))
        assert out is not None, name + ": " + err[-1500:]
        results.append(name + ": " + out.splitlines()[-1])
    return "arm64 under qemu; " + "; ".join(results)


case("fuzz_cpu_against_reference", _fuzz, 20, ["-O3", "-ffp-contract=fast"])
case("fuzz_cpu_asan_ubsan", _fuzz, 20, ["-O1", "-g", "-fsanitize=address,undefined",
                                         "-fno-sanitize-recover=all"])


@test
def runner_fails_when_no_test_matches():
    """Alone or beside a prefix that does pick a test (which then runs)."""
    runner = os.path.join(os.path.dirname(__file__), "run_tests.py")
    for args in (["no_test_is_called_this"], ["bad_input_null_params", "no_test_is_called_this"]):
        run = subprocess.run([sys.executable, runner] + args, capture_output=True, text=True)
        assert run.returncode != 0 and "no test name starts with 'no_test_is_called_this'" in \
            run.stdout, run.stdout[-300:]
        assert ("PASS bad_input_null_params" in run.stdout) == (len(args) == 2), run.stdout[-300:]


@test
def bad_input_null_params_and_options():
    assert fa.CPU.fa_cpu_forward(None, None) == fa.STATUS["FA_ERR_NULL_POINTER"]
    assert fa.CPU.fa_ref_backward(None) == fa.STATUS["FA_ERR_NULL_POINTER"]
    prob = fa.Problem(rng_for("opts"), seqlen_q=8, seqlen_k=8, head_dim=32)
    t = {n: prob.tensor(n, getattr(prob, n)) for n in "qkv"}
    t["o"] = prob.tensor("o")
    p = prob.params(t)
    for opts in (fa.CpuOptions(-1, 0), fa.CpuOptions(1, 9)):
        status = fa.CPU.fa_cpu_forward(ctypes.byref(p), ctypes.byref(opts))
        assert status == fa.STATUS["FA_ERR_INVALID_ARGUMENT"]
    assert np.isnan(t["o"].values()).all(), "o was written"
    for code in fa.STATUS.values():
        assert fa.CPU.fa_status_string(code)


# ---- memory ---------------------------------------------------------------------

LINEAR_MEMORY_CHILD = r"""
import ctypes, resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import fa, reference
n, d = 65536, 32
rng = np.random.default_rng(int(sys.argv[3]))
prob = fa.Problem(rng, heads_q=1, seqlen_q=n, seqlen_k=n, head_dim=d, causal=True)
status, o, lse = prob.forward("fa2", threads=2)
assert status == 0, status
for r in (0, 1, 4095, 40000, n - 1):  # each sampled row against its own float64 softmax
    s = prob.k[0, : r + 1, 0] @ prob.q[0, r, 0] * prob.scale
    w = np.exp(s - s.max())
    ref = (w / w.sum()) @ prob.v[0, : r + 1, 0]
    err = np.abs(o[0, r, 0] - ref).max()
    assert err < 1e-5, (r, err)
print("ok")
"""


@test
def forward_memory_is_linear_in_n():
    """Nq = Nk = 65536 under an address-space limit 4x smaller than one N×N
    fp32 buffer (16 GiB)."""
    limit = 4 << 30
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", LINEAR_MEMORY_CHILD, here, str(limit),
                          str(RNG_SEED[0])], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr
    return "N=65536 causal d=32 under a 4 GiB address-space limit"
