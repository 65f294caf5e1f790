"""GPU tests: the CPU suite's cases on the GPU kernels, against the float64
reference. They run where `make test` found a GPU and built the CUDA shims;
elsewhere each one is skipped and says why. Outputs start as NaN poison, so an
unwritten element fails. Tests whose names hold `gpu_small` form the reduced
suite that `make sanitize` runs under compute-sanitizer."""
import ctypes

import numpy as np

import fa
import reference
from harness import case, test, Skip
from test_cpu import backward_case, combine_case, forward_case, nonfinite_case, rng_for

HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)


def need_gpu(lib_name="GPU"):
    lib = getattr(fa, lib_name)
    if lib is None and lib_name != "GPU" and fa.GPU is not None:
        raise Skip(f"the {lib_name} build of the CUDA shim is missing (make test builds it)")
    if lib is None:
        raise Skip("no GPU here (the CUDA shim is built only where nvidia-smi sees a GPU)")
    if lib.fa_test_gpu_count() < 1:
        raise Skip("the CUDA shim sees no GPU")
    return lib


def gpu_forward(**cfg):
    """The default build (FA3 on Hopper: on the tiles of d 64/128/256) and, where built,
    the one with the Hopper kernel compiled out (FA2 everywhere)."""
    need_gpu()
    return forward_case(backends=("gpu", "gpu_fa2") if fa.GPU_FA2 else ("gpu",), **cfg)


def gpu_backward_on(lib_name, backends, **cfg):
    """backward_case on a build that may be missing (skipped then)."""
    need_gpu(lib_name)
    return backward_case(backends=backends, **cfg)


def gpu_backward(**cfg):
    """The default build's atomic (FA3 on Hopper at d = 64, 128, 256) and deterministic
    modes and, where built, the FA2 atomic kernel on its own."""
    need_gpu()
    return backward_case(backends=("gpu", "gpu_det") + (("gpu_fa2",) if fa.GPU_FA2 else ()),
                         **cfg)


def gpu_fa1_forward(**cfg):
    need_gpu("GPU_FA1")
    return forward_case(backends=("gpu_fa1",), **cfg)


for d in HEAD_DIMS:
    for dtype in ("f16", "bf16"):
        case(f"gpu_fwd_d{d}_{dtype}", gpu_forward, seqlen_q=200, seqlen_k=333, head_dim=d,
             dtype=dtype)
        case(f"gpu_bwd_d{d}_{dtype}", gpu_backward, seqlen_q=150, seqlen_k=190, head_dim=d,
             dtype=dtype)
        case(f"gpu_fwd_causal_d{d}_{dtype}", gpu_forward, seqlen_q=300, seqlen_k=300, head_dim=d,
             dtype=dtype, causal=True, heads_q=4, heads_kv=2)
        case(f"gpu_bwd_causal_d{d}_{dtype}", gpu_backward, seqlen_q=130, seqlen_k=257,
             head_dim=d, dtype=dtype, causal=True, heads_q=4, heads_kv=2)

# Head dims between the built ones (FlashAttention's own test list: 40, 80,
# 224, and more): a multiple of 8 runs on a larger head dim's tiles (FA3's on
# Hopper, FA2's in the FA2 build; the decode kernel's for few queries), the
# columns past d zero-filled on load and never stored; 59 or 47 in rows
# that are not 16-byte aligned is refused (gpu_head_dim_not_a_multiple_of_8).
for i, d in enumerate((8, 40, 80, 112, 136, 224, 248)):
    dtype = ("bf16", "f16")[i % 2]
    case(f"gpu_fwd_between_d{d}", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=200, seqlen_k=333,
         head_dim=d, dtype=dtype, layout=("bshd", "padded")[i % 2])
    case(f"gpu_fwd_between_causal_d{d}", gpu_forward, seqlen_q=300, seqlen_k=300, head_dim=d,
         dtype=dtype, causal=True)
    case(f"gpu_bwd_between_d{d}", gpu_backward, heads_q=4, heads_kv=2, seqlen_q=150,
         seqlen_k=190, head_dim=d, dtype=dtype, layout=("padded", "bshd")[i % 2])
    case(f"gpu_bwd_between_causal_d{d}", gpu_backward, seqlen_q=130, seqlen_k=257, head_dim=d,
         dtype=dtype, causal=True, window=(60, 0) if i % 3 == 0 else None)
    case(f"gpu_decode_between_d{d}", gpu_forward, batch=2, heads_q=8, heads_kv=2, seqlen_q=3,
         seqlen_k=2000, head_dim=d, dtype=dtype, causal=True, num_splits=(0, 3)[i % 2])

# Head dims that end inside a 16-byte chunk (FlashAttention's list has 59
# and 111): rows 16-byte aligned ('aligned': padded to a multiple of 8,
# poisoned), the tiles of the next head dim, the last chunk read and stored
# in part; the decode path too. Unpadded rows of such a d are refused.
for i, d in enumerate((59, 111, 47, 5, 250)):
    dtype = ("bf16", "f16")[i % 2]
    case(f"gpu_fwd_odd_d{d}", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=200, seqlen_k=333,
         head_dim=d, dtype=dtype, layout="aligned", causal=i % 2 == 1)
    case(f"gpu_bwd_odd_d{d}", gpu_backward, heads_q=4, heads_kv=2, seqlen_q=150, seqlen_k=190,
         head_dim=d, dtype=dtype, layout="aligned", causal=i % 2 == 0)
    case(f"gpu_decode_odd_d{d}", gpu_forward, batch=2, heads_q=8, heads_kv=2, seqlen_q=4,
         seqlen_k=1500, head_dim=d, dtype=dtype, layout="aligned", causal=True,
         num_splits=(0, 3)[i % 2])

# A V head dim of its own (forward): DeepSeek's 192 / 128 and others, on
# the tiles of the larger (FA3's on Hopper, FA2's, the decode kernel's).
for d, dv, nq in ((192, 128, 300), (128, 64, 200), (64, 128, 200), (192, 128, 5), (80, 48, 2)):
    case(f"gpu_fwd_head_dim_v_{d}_{dv}_q{nq}", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=nq,
         seqlen_k=333, head_dim=d, head_dim_v=dv, dtype="bf16", causal=True)
for d, dv in ((192, 128), (64, 128), (128, 40)):
    cfg = dict(heads_q=4, heads_kv=2, seqlen_q=150, seqlen_k=190, head_dim=d, head_dim_v=dv,
               dtype="f16", causal=True)
    case(f"gpu_bwd_head_dim_v_{d}_{dv}", lambda cfg=cfg: gpu_backward_head_dim_v(**cfg))
    # the FA2 kernels: the deterministic mode, and both modes where the
    # build acts as a 163 KB device (the pre-Hopper kernels' code)
    case(f"gpu_bwd_head_dim_v_det_{d}_{dv}", gpu_backward_on, "GPU", ("gpu_det",), **cfg)
    case(f"gpu_bwd_head_dim_v_163_{d}_{dv}", gpu_backward_on, "GPU_SMEM163", ("gpu163", "gpu163_det"),
         **cfg)

for nq, nk in ((1, 1), (1, 1000), (7, 63), (63, 64), (64, 65), (65, 257), (257, 7),
               (1000, 1000), (1000, 7)):
    for causal in (False, True):
        case(f"gpu_fwd_shape_{nq}x{nk}_causal{int(causal)}", gpu_forward, seqlen_q=nq,
             seqlen_k=nk, head_dim=64, dtype="bf16", causal=causal)
        case(f"gpu_bwd_shape_{nq}x{nk}_causal{int(causal)}", gpu_backward, seqlen_q=nq,
             seqlen_k=nk, head_dim=64, dtype="bf16", causal=causal)

# FA3's tiles: 192 x 128 (d 64; 128 x 128 when causal with Nq < 4096), 128 x
# 128 (d 128; 128 x 176 when unmasked with Nk >= 8192), 128 x 80 (d 256):
# edges, long pipelines, both tiles of d 64 and of d 128.
for d, nq, nk in ((256, 1, 1), (256, 65, 257), (256, 257, 81), (128, 129, 1000),
                  (128, 2048, 2048), (128, 1, 8192), (128, 130, 8300), (64, 3000, 2500),
                  (64, 4100, 4200)):
    for causal in (False, True):
        case(f"gpu_fwd_tiles_d{d}_{nq}x{nk}_causal{int(causal)}", gpu_forward, seqlen_q=nq,
             seqlen_k=nk, head_dim=d, dtype="bf16", causal=causal)

# More FA3 tiles than CTAs, so that each CTA runs several: at d 256, 3 key
# tiles each (O staged in alternating ring stages) and, causal, tiles that see
# no keys between them; at d 128, the 176-key tile.
for causal in (False, True):
    case(f"gpu_fwd_many_tiles_d256_causal{int(causal)}", gpu_forward, batch=5, heads_q=10,
         heads_kv=5, seqlen_q=1000, seqlen_k=170, head_dim=256, dtype="bf16", causal=causal)
# d 64's short causal tile (128 rows) over many tiles per CTA: tiles that see
# no keys after ones that do, and the reverse.
case("gpu_fwd_many_tiles_d64_causal", gpu_forward, batch=5, heads_q=10, heads_kv=5,
     seqlen_q=1000, seqlen_k=170, head_dim=64, dtype="bf16", causal=True)
# d 64's short causal tile where the diagonal meets key tiles at their start:
# Nk - Nq a multiple of 128 either way (Nq > Nk: rows that see no key), and
# with a window's start or a softcap on the diagonal tiles.
for nq, nk in ((300, 556), (428, 300)):
    case(f"gpu_fwd_diag_{nq}x{nk}", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=nq,
         seqlen_k=nk, head_dim=64, dtype="f16", causal=True)
case("gpu_fwd_diag_window", gpu_forward, seqlen_q=700, seqlen_k=700, head_dim=64,
     dtype="bf16", causal=True, window=(200, -1))
case("gpu_fwd_diag_softcap", gpu_forward, seqlen_q=700, seqlen_k=700, head_dim=64,
     dtype="bf16", causal=True, softcap=4.0, amplitude=3.0)
# d 64's short causal tile with logits whose row maxima rise by far more than
# 2^8 from one key tile to the next, so that its speculative exps are redone
# (FA_FA3_SPECULATIVE), with the rows' first keys in later tiles (a window).
case("gpu_fwd_diag_large_logits", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=700,
     seqlen_k=700, head_dim=64, dtype="bf16", causal=True, amplitude=8.0)
case("gpu_fwd_diag_large_logits_window", gpu_forward, seqlen_q=600, seqlen_k=650,
     head_dim=64, dtype="f16", causal=True, window=(150, -1), amplitude=6.0)
# The same at d 128 and 256, and on d 64's 192-row tile (not causal), whose
# tiles redo them after the wait for the previous PV, packing P straight into
# its operand (form 2).
for d, dtype, causal in ((128, "bf16", True), (256, "f16", True), (64, "bf16", False)):
    case(f"gpu_fwd_large_logits_rise_d{d}", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=500,
         seqlen_k=620, head_dim=d, dtype=dtype, causal=causal, window=(200, -1), amplitude=6.0)
case("gpu_fwd_many_tiles_d128_long_keys", gpu_forward, batch=70, heads_q=4, heads_kv=2,
     seqlen_q=3, seqlen_k=8200, head_dim=128, dtype="bf16")

# The FA3 backward's tiles: 128 keys per CTA (d 64, 128), 64 at d 256; 64-row
# query blocks.
for d, nq, nk in ((128, 1, 1), (128, 63, 64), (128, 65, 257), (128, 257, 7), (128, 1000, 129),
                  (128, 129, 1000), (128, 700, 2100), (64, 1, 1), (64, 65, 257), (64, 1000, 129),
                  (64, 700, 2100), (256, 1, 1), (256, 63, 64), (256, 65, 257), (256, 1000, 129),
                  (256, 700, 2100)):
    for causal in (False, True):
        case(f"gpu_bwd_tiles_d{d}_{nq}x{nk}_causal{int(causal)}", gpu_backward, seqlen_q=nq,
             seqlen_k=nk, head_dim=d, dtype="bf16", causal=causal, heads_q=4, heads_kv=2)

for window in ((0, 0), (16, 0), (-1, 5), (7, -1), (40, 3)):
    case(f"gpu_fwd_window_{window[0]}_{window[1]}", gpu_forward, seqlen_q=300, seqlen_k=350,
         head_dim=64, window=window, dtype="f16")
    case(f"gpu_bwd_window_{window[0]}_{window[1]}", gpu_backward, seqlen_q=300, seqlen_k=350,
         head_dim=64, window=window, dtype="f16")
case("gpu_fwd_softcap", gpu_forward, seqlen_q=170, seqlen_k=190, head_dim=128, softcap=5.0,
     amplitude=3.0, dtype="bf16")
case("gpu_bwd_softcap", gpu_backward, seqlen_q=170, seqlen_k=190, head_dim=128, softcap=5.0,
     amplitude=3.0, dtype="bf16")
case("gpu_fwd_gqa_long_keys_d128", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=257,
     seqlen_k=9000, head_dim=128, layout="bhsd", dtype="f16")
case("gpu_fwd_mqa_bhsd", gpu_forward, batch=2, heads_q=8, heads_kv=1, seqlen_q=129,
     seqlen_k=300, head_dim=128, layout="bhsd", dtype="f16")
case("gpu_bwd_gqa_padded", gpu_backward, batch=2, heads_q=6, heads_kv=2, seqlen_q=177,
     seqlen_k=99, head_dim=96, layout="padded", dtype="bf16", causal=True)
case("gpu_bwd_mqa_bhsd", gpu_backward, batch=2, heads_q=8, heads_kv=1, seqlen_q=129,
     seqlen_k=300, head_dim=128, layout="bhsd", dtype="f16")
# More kv heads x batch (144) than a group of the causal dK/dV kernel's
# heavy-first order holds at 2 key blocks (128, fa_i_bwd_cta): two groups, the
# last one partial.
case("gpu_bwd_causal_many_heads", gpu_backward, batch=9, heads_q=32, heads_kv=16, seqlen_q=130,
     seqlen_k=130, head_dim=64, dtype="bf16", causal=True)
case("gpu_fwd_large_logits", gpu_forward, seqlen_q=128, seqlen_k=400, head_dim=64,
     amplitude=30.0, dtype="bf16")
case("gpu_bwd_large_logits", gpu_backward, seqlen_q=128, seqlen_k=400, head_dim=64,
     amplitude=8.0, dtype="bf16")
case("gpu_small_fwd", gpu_forward, batch=2, heads_q=4, heads_kv=2, seqlen_q=77, seqlen_k=130,
     head_dim=64, dtype="bf16", causal=True)
case("gpu_small_fwd_noncausal", gpu_forward, heads_q=4, heads_kv=2, seqlen_q=200, seqlen_k=130,
     head_dim=64, dtype="bf16")
case("gpu_small_fwd_d256_window", gpu_forward, seqlen_q=70, seqlen_k=90, head_dim=256,
     dtype="f16", window=(20, 3))
case("gpu_small_fwd_d128_long_keys", gpu_forward, heads_q=2, heads_kv=1, seqlen_q=65,
     seqlen_k=8200, head_dim=128, dtype="bf16")
case("gpu_small_bwd", gpu_backward, batch=2, heads_q=4, heads_kv=2, seqlen_q=77, seqlen_k=130,
     head_dim=64, dtype="bf16", causal=True)
case("gpu_small_bwd_d256", gpu_backward, seqlen_q=70, seqlen_k=90, head_dim=256, dtype="f16")
case("gpu_small_bwd_d128_window_softcap", gpu_backward, heads_q=4, heads_kv=2, seqlen_q=50,
     seqlen_k=140, head_dim=128, dtype="bf16", window=(30, 5), softcap=4.0)
for d in (64, 128, 256):
    case(f"gpu_fa1_fwd_d{d}", gpu_fa1_forward, heads_q=4, heads_kv=2, seqlen_q=130,
         seqlen_k=257, head_dim=d, dtype="bf16", causal=True)
case("gpu_fa1_fwd_window_softcap", gpu_fa1_forward, seqlen_q=100, seqlen_k=70, head_dim=64,
     dtype="f16", window=(10, 10), softcap=4.0)


# The decode path (seqlen_q <= 16: GQA-packed rows, split-KV): query counts 1
# to 16, key counts from 1 to 2^17 + 1, GQA groups 1 to 16, every mask,
# split counts forced (1 = unsplit) and the library's own (0), head dims
# beyond the three the issue names at least correct.
DECODE_MASKS = ({}, dict(causal=True), dict(window=(100, 0)), dict(softcap=4.0, amplitude=3.0),
                dict(causal=True, window=(40, -1)))
for i, (nq, nk) in enumerate((nq, nk) for nq in (1, 2, 4, 8, 16) for nk in (1, 7, 1000, 65537)):
    group = (1, 4, 8, 16)[i % 4]
    splits = (0, 1, 3, 64, 0, 7)[i % 6]
    d = (64, 128, 256)[i % 3]
    extra = DECODE_MASKS[i % len(DECODE_MASKS)]
    case(f"gpu_decode_q{nq}_k{nk}_g{group}_s{splits}_d{d}", gpu_forward, heads_q=2 * group,
         heads_kv=2, seqlen_q=nq, seqlen_k=nk, head_dim=d, dtype=("bf16", "f16")[i % 2],
         num_splits=splits, **extra)
for nq, group, extra in ((1, 8, {}), (16, 4, dict(causal=True))):
    case(f"gpu_decode_q{nq}_k131072_g{group}", gpu_forward, heads_q=2 * group, heads_kv=2,
         seqlen_q=nq, seqlen_k=131072, head_dim=128, dtype="bf16", **extra)
# More than 32 packed rows at d = 64, 128 and 256 run Hopper's wgmma kernel
# (64 rows a CTA): a partial block, a whole one, one and a partial.
for name, cfg in (("rows48_d128", dict(heads_q=32, heads_kv=2, seqlen_q=3, seqlen_k=777,
                                       head_dim=128, dtype="f16", window=(100, 0), num_splits=3)),
                  ("rows48_d256", dict(heads_q=16, heads_kv=2, seqlen_q=6, seqlen_k=3001,
                                       head_dim=256, dtype="f16", window=(200, 0), num_splits=2)),
                  ("rows128_d256", dict(batch=2, heads_q=32, heads_kv=4, seqlen_q=16,
                                        seqlen_k=4100, head_dim=256, dtype="bf16", causal=True,
                                        softcap=4.0, amplitude=3.0)),
                  ("rows80_between_d200", dict(heads_q=20, heads_kv=2, seqlen_q=8, seqlen_k=900,
                                               head_dim=200, dtype="bf16", num_splits=3)),
                  ("rows64_d64", dict(heads_q=16, heads_kv=4, seqlen_q=16, seqlen_k=5000,
                                      head_dim=64, dtype="bf16", causal=True, softcap=4.0,
                                      amplitude=3.0)),
                  ("rows80_d128", dict(heads_q=10, heads_kv=2, seqlen_q=16, seqlen_k=2049,
                                       head_dim=128, dtype="bf16", causal=True)),
                  # head dims below the kernels' (their general kernel)
                  ("rows48_between_d80", dict(heads_q=16, heads_kv=2, seqlen_q=6, seqlen_k=1500,
                                              head_dim=80, dtype="bf16", causal=True)),
                  ("rows40_between_d40_v24", dict(heads_q=8, heads_kv=1, seqlen_q=5,
                                                  seqlen_k=333, head_dim=40, head_dim_v=24,
                                                  dtype="f16", num_splits=2))):
    case(f"gpu_decode_wgmma_{name}", gpu_forward, **cfg)
for d in (32, 96, 160, 192):
    case(f"gpu_decode_d{d}", gpu_forward, batch=3, heads_q=8, heads_kv=2, seqlen_q=5,
         seqlen_k=777, head_dim=d, dtype="bf16", causal=True)
case("gpu_decode_many_ctas_bhsd", gpu_forward, batch=40, heads_q=12, heads_kv=3, seqlen_q=3,
     seqlen_k=300, head_dim=128, dtype="f16", layout="bhsd", num_splits=2)
case("gpu_small_decode_split", gpu_forward, heads_q=8, heads_kv=2, seqlen_q=2, seqlen_k=3000,
     head_dim=64, dtype="bf16", num_splits=5, causal=True)
for dtype, part_dtype in (("bf16", "f32"), ("f16", "f16"), ("f32", "f32")):
    case(f"gpu_combine_{dtype}_parts_{part_dtype}", lambda dt=dtype, pdt=part_dtype:
         (need_gpu(), combine_case("gpu", dt, pdt, parts=5))[1])
case("gpu_combine_in_place_many", lambda: (need_gpu(), combine_case(
    "gpu", "f32", "f32", parts=70, in_place=True, layout="padded"))[1])


@test
def gpu_decode_path_is_taken():
    """fa_cuda_forward_algorithm says 4 (decode) for seqlen_q <= 16, not above."""
    lib = need_gpu()
    prob = fa.Problem(rng_for("dec_dispatch"), heads_q=8, heads_kv=2, seqlen_q=16, seqlen_k=100,
                      head_dim=128, dtype="bf16")
    t = {n: prob.tensor(n, np.zeros(prob._shape(n))) for n in ("q", "k", "v", "o")}
    p = prob.params(t)
    assert lib.fa_cuda_forward_algorithm(ctypes.byref(p)) == 4
    p.seqlen_q = 17
    assert lib.fa_cuda_forward_algorithm(ctypes.byref(p)) in (2, 3)


@test
def gpu_decode_is_bitwise_stable():
    """The same split count gives the same bits run after run."""
    need_gpu()
    prob = fa.Problem(rng_for("dec_det"), heads_q=16, heads_kv=4, seqlen_q=4, seqlen_k=9000,
                      head_dim=128, dtype="bf16", num_splits=9)
    first = prob.forward("gpu")
    for _ in range(4):
        again = prob.forward("gpu")
        assert np.array_equal(first[1], again[1]) and np.array_equal(first[2], again[2])


# As on GPUs that allow less shared memory per block than the H200 (the
# FA_SM90=0 build with the device's limit capped): 163 KB (compute capability
# 8.0) runs every head dim, the backward at d = 64 and 256 on the sm_80 tiles
# that the H200 leaves for its 227 KB ones; 99 KB (8.6, 8.9) runs the forward
# where its tile fits and the backward on its 99 KB tile, and every other call
# is FA_ERR_UNSUPPORTED and writes nothing.
CAPPED = {  # backend: (library, forward head dims, backward head dims, dims tested)
    "gpu163": ("GPU_SMEM163", HEAD_DIMS, HEAD_DIMS, (64, 256)),
    "gpu99": ("GPU_SMEM99", (32, 64, 96, 128, 256), (32, 64, 96, 128), (32, 64, 96, 128)),
}


def gpu_capped_backward(backend, **cfg):
    need_gpu(CAPPED[backend][0])
    return backward_case(backends=(backend, backend + "_det"), **cfg)


def gpu_capped_support(backend):
    """fa_cuda_supported per head dim and pass as the table says, and a refused call
    writes nothing."""
    lib_name, forward_dims, backward_dims, _ = CAPPED[backend]
    lib = need_gpu(lib_name)
    prob = fa.Problem(rng_for("gpu_" + backend), seqlen_q=70, seqlen_k=90, dtype="bf16")
    seen = []
    for d in HEAD_DIMS:
        prob.d = prob.dv = d
        t = {n: prob.tensor(n, np.zeros(prob._shape(n))) for n in ("q", "k", "v", "dout")}
        for n in ("o", "dq", "dk", "dv"):
            t[n] = prob.tensor(n, np.full(prob._shape(n), 7.0))
        t["lse"] = np.zeros((1, prob.hq, prob.nq), np.float32)
        p = prob.params(t)
        for pas, runs, call in ((0, forward_dims, fa.call_forward),
                                (1, backward_dims, fa.call_backward)):
            status = lib.fa_cuda_supported(ctypes.byref(p), pas)
            expected = fa.FA_OK if d in runs else fa.STATUS["FA_ERR_UNSUPPORTED"]
            assert status == expected, f"d = {d}, pass {pas}: {fa.status_name(status)}"
            if d not in runs:  # the call itself refuses, and writes nothing
                before = {n: t[n].storage.copy() for n in ("o", "dq", "dk", "dv")}
                assert call(backend, p) == expected
                assert all(np.array_equal(old, t[n].storage) for n, old in before.items())
        seen.append(f"d{d}:" + "F" * (d in forward_dims) + "B" * (d in backward_dims))
    return " ".join(seen)


for backend, (_, _, _, tested) in CAPPED.items():
    kb = backend[3:]
    for d in tested:
        case(f"gpu_smem{kb}_bwd_d{d}", gpu_capped_backward, backend, heads_q=4, heads_kv=2,
             seqlen_q=150, seqlen_k=190, head_dim=d, dtype="bf16")
        case(f"gpu_smem{kb}_bwd_causal_d{d}", gpu_capped_backward, backend, seqlen_q=130,
             seqlen_k=257, head_dim=d, dtype="f16", causal=True)
    case(f"gpu_smem{kb}_support", gpu_capped_support, backend)


# The non-finite policy (test_cpu's nonfinite_case): NaN or +inf scores make
# NaN rows on every GPU path (FA3 at d = 128, FA2, FA1, decode with splits).
def gpu_nonfinite(tensor, at, value, **cfg):
    need_gpu()
    fa1 = fa.GPU_FA1 and not cfg.get("num_splits")  # the FA1 kernel takes no key splits
    backends = ("gpu",) + (("gpu_fa2",) if fa.GPU_FA2 else ()) + (("gpu_fa1",) if fa1 else ())
    return nonfinite_case(tensor, at, value, backends=backends, **cfg)


for name, tensor, at, value, cfg in (
        ("nan_in_q", "q", (0, 70, 1, 5), float("nan"), dict(causal=True)),
        ("nan_in_k_gqa", "k", (0, 40, 1, 3), float("nan"), dict(heads_q=4, heads_kv=2, causal=True)),
        ("inf_in_k", "k", (0, 9, 0, 7), float("inf"), dict(window=(30, 30))),
        ("minus_inf_in_k", "k", (0, 2, 1, 1), -float("inf"), dict(softcap=5.0)),
        ("nan_in_v", "v", (0, 0, 0, 2), float("nan"), dict()),
        ("nan_in_k_decode_split", "k", (0, 2000, 0, 0), float("nan"),
         dict(seqlen_q=2, seqlen_k=4000, heads_q=8, heads_kv=2, num_splits=4)),
):
    for dtype in ("bf16", "f16"):
        cfg.update(dtype=dtype, head_dim=128)
        cfg.setdefault("seqlen_q", 150)
        cfg.setdefault("seqlen_k", 170)
        case(f"gpu_nonfinite_{name}_{dtype}", gpu_nonfinite, tensor, at, value, **dict(cfg))


@test
def gpu_fully_masked_rows():
    need_gpu()
    prob = fa.Problem(rng_for("gpu_masked"), seqlen_q=150, seqlen_k=40, head_dim=64,
                      causal=True, dtype="bf16")
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK
    assert np.all(o[:, :110] == 0.0) and np.all(np.isneginf(lse[:, :, :110]))
    for backend in ("gpu", "gpu_det"):
        status, dq, dk, dv = prob.backward(o, lse, backend)
        assert status == fa.FA_OK and np.all(dq[:, :110] == 0.0)
        assert np.isfinite(dk).all() and np.isfinite(dv).all()
    return forward_case(backends=("gpu",), seqlen_q=150, seqlen_k=40, head_dim=64, causal=True,
                        dtype="bf16")


def _algorithm_dispatch(seed, algorithm, fa3_dims):
    """algorithm(lib, p) is 3 (FA3) exactly for the head dims fa3_dims on
    compute capability 9.0 in the default build, 2 (FA2) everywhere else and
    in the FA_SM90=0 build, 0 for an unsupported head dim."""
    lib = need_gpu()
    cc = lib.fa_test_gpu_cc()
    prob = fa.Problem(rng_for(seed), seqlen_q=100, seqlen_k=100, dtype="bf16")
    seen = []
    for d in HEAD_DIMS:
        prob.d = prob.dv = d
        names = ("q", "k", "v", "o", "dout", "dq", "dk", "dv")
        t = {n: prob.tensor(n, np.zeros(prob._shape(n))) for n in names}
        t["lse"] = np.zeros((1, prob.hq, prob.nq), np.float32)
        p = prob.params(t)
        expected = 3 if cc == 90 and d in fa3_dims else 2
        got = algorithm(lib, p)
        assert got == expected, f"d={d} cc={cc}: algorithm {got}, expected {expected}"
        if fa.GPU_FA2:
            assert algorithm(fa.GPU_FA2, p) == 2
        seen.append(f"d{d}:FA{got}")
    # neither built nor a multiple of 8, in unpadded rows (88 bytes: not
    # 16-byte aligned, so no larger head dim's kernels take it either)
    p.head_dim = p.head_dim_v = 44
    for n in names:
        setattr(p, n + "_layout", fa.Layout(0, 0, 0))
    assert algorithm(lib, p) == 0
    return f"cc {cc}: " + " ".join(seen)


# The forward runs every head dim on Hopper's kernels (those of 32, 96, 160
# and 192 on the next larger tile with one); the atomic backward all but 32
# and 160, whose FA2 kernels outrun FA3's wider tiles.
case("gpu_forward_algorithm_dispatch", _algorithm_dispatch, "dispatch",
     lambda lib, p: lib.fa_cuda_forward_algorithm(ctypes.byref(p)), HEAD_DIMS)
case("gpu_backward_algorithm_dispatch", _algorithm_dispatch, "bwd_dispatch",
     lambda lib, p: lib.fa_cuda_backward_algorithm(ctypes.byref(p), 0), (64, 96, 128, 192, 256))
case("gpu_deterministic_backward_algorithm_dispatch", _algorithm_dispatch, "det_dispatch",
     lambda lib, p: lib.fa_cuda_backward_algorithm(ctypes.byref(p), 1), ())


@test
def gpu_deterministic_backward_is_bitwise_stable():
    need_gpu()
    for d in (128, 256):  # one warp per key tile, and the warp pairs of d >= 160
        prob = fa.Problem(rng_for(f"gpu_det{d}"), batch=2, heads_q=8, heads_kv=2, seqlen_q=1000,
                          seqlen_k=1000, head_dim=d, dtype="bf16", causal=True)
        _, o, lse = prob.forward("gpu")
        first = prob.backward(o, lse, "gpu_det")
        for _ in range(9):
            again = prob.backward(o, lse, "gpu_det")
            for a, b in zip(first[1:], again[1:]):
                assert np.array_equal(a, b), f"d = {d}: deterministic backward changed between runs"


@test
def gpu_forward_is_bitwise_stable():
    need_gpu()
    prob = fa.Problem(rng_for("gpu_fwd_det"), heads_q=8, seqlen_q=777, seqlen_k=900,
                      head_dim=128, dtype="f16")
    first = prob.forward("gpu")
    for _ in range(3):
        again = prob.forward("gpu")
        assert np.array_equal(first[1], again[1]) and np.array_equal(first[2], again[2])


@test
def gpu_far_keys_use_64bit_offsets():
    """K, V, dK and dV span more than 2^31 elements; the visible keys sit at
    the end, past element 2^31."""
    lib = need_gpu()
    big_nk = (1 << 31) // 128 + 4096  # 16.8 M keys of 128 elements: 2^31 + 2^19
    small_nk, nq = 1024, 256
    prob = fa.Problem(rng_for("far"), seqlen_q=nq, seqlen_k=small_nk, head_dim=128,
                      dtype="bf16", causal=True, window=(300, 0))
    names = ("q", "k", "v", "dout")
    t = {n: prob.tensor(n, getattr(prob, n)) for n in names}
    for n in ("o", "dq", "dk", "dv"):
        t[n] = prob.tensor(n)
    t["lse"] = np.full((1, prob.hq, nq), np.nan, np.float32)
    p = prob.params(t)
    zero = ctypes.c_int(0)
    status = lib.fa_test_gpu_far_keys(ctypes.byref(p), big_nk, ctypes.byref(zero))
    assert status == fa.FA_OK, fa.status_name(status)
    assert zero.value == 1, "keys that no query sees got nonzero gradients"
    ref_o, ref_lse = reference.forward(prob.q, prob.k, prob.v, **prob.reference_args())
    err = fa.rel_err(t["o"].values(), ref_o)
    assert err < 1e-2, f"O error {err:.3g}"
    grads = reference.backward(prob.q, prob.k, prob.v, prob.dout, **prob.reference_args())
    for name, ref in zip(("dq", "dk", "dv"), grads):
        e = fa.rel_err(t[name].values(), ref)
        assert e < 2e-2, f"{name} error {e:.3g}"
    return f"O err {err:.1e}"


def _gpu_status(mutate, expected, backward=False):
    need_gpu()
    prob = fa.Problem(rng_for("gpu_bad"), heads_q=4, heads_kv=2, seqlen_q=20, seqlen_k=30,
                      head_dim=64, dtype="bf16", layout="padded")
    t = {n: prob.tensor(n, getattr(prob, n)) for n in ("q", "k", "v", "dout")}
    for n in ("o", "dq", "dk", "dv"):
        t[n] = prob.tensor(n, np.full(prob._shape(n), 7.0))
    t["lse"] = np.zeros((1, 4, 20), np.float32)
    p = prob.params(t)
    mutate(p, t)
    before = {n: t[n].storage.copy() for n in ("o", "dq", "dk", "dv")}
    status = fa.call_backward("gpu", p) if backward else fa.call_forward("gpu", p)
    assert status == fa.STATUS[expected], f"got {fa.status_name(status)}, expected {expected}"
    for n, old in before.items():
        assert np.array_equal(old, t[n].storage), f"{n} was written"
    return fa.GPU.fa_last_error_detail().decode()


def _field(**fields):
    def mutate(p, t):
        for k, v in fields.items():
            setattr(p, k, fa.Layout(*v) if isinstance(v, tuple) else v)
    return mutate


case("gpu_bad_f32_unsupported", _gpu_status, _field(dtype=0), "FA_ERR_UNSUPPORTED")
# d = 59 / 47 in unpadded rows (heads 59 elements apart: not 16-byte
# aligned), and with accumulate_grads (gradients staged in rows of d)
case("gpu_head_dim_not_a_multiple_of_8", _gpu_status,
     _field(head_dim=59, q_layout=(20 * 4 * 59, 59, 4 * 59)), "FA_ERR_UNSUPPORTED")
case("gpu_head_dim_not_a_multiple_of_8_bwd", _gpu_status,
     _field(head_dim=47, k_layout=(30 * 2 * 47, 47, 2 * 47)), "FA_ERR_UNSUPPORTED", True)
case("gpu_head_dim_not_a_multiple_of_8_accumulate_grads", _gpu_status,
     _field(head_dim=59, accumulate_grads=1), "FA_ERR_UNSUPPORTED", True)
@test
def gpu_head_dim_v_backward_fa2_atomic_on_hopper_refused():
    """head_dim_v != head_dim in the atomic mode of a build without the FA3
    kernels (gpu_fa2) on compute capability 9.0: refused with nothing
    written (its FA2 kernels for sm_90 read V with Q's column count); the
    deterministic mode runs the same problem."""
    need_gpu("GPU_FA2")
    prob = fa.Problem(rng_for("gpu_dv_fa2"), heads_q=4, heads_kv=2, seqlen_q=20, seqlen_k=30,
                      head_dim=64, head_dim_v=32, dtype="bf16")
    t = {n: prob.tensor(n, getattr(prob, n)) for n in ("q", "k", "v", "dout")}
    for n in ("o", "dq", "dk", "dv"):
        t[n] = prob.tensor(n, np.full(prob._shape(n), 7.0))
    t["lse"] = np.zeros((1, 4, 20), np.float32)
    p = prob.params(t)
    if fa.GPU_FA2.fa_test_gpu_cc() < 90:
        raise Skip("compute capability below 9.0: the atomic mode runs it (gpu163 tests)")
    before = {n: t[n].storage.copy() for n in ("o", "dq", "dk", "dv")}
    status = fa.call_backward("gpu_fa2", p)
    assert status == fa.STATUS["FA_ERR_UNSUPPORTED"], fa.status_name(status)
    assert all(np.array_equal(old, t[n].storage) for n, old in before.items()), "wrote an output"
    backward_case(backends=("gpu_fa2_det",), heads_q=4, heads_kv=2, seqlen_q=20, seqlen_k=30,
                  head_dim=64, head_dim_v=32, dtype="bf16")
    return fa.GPU_FA2.fa_last_error_detail().decode()


def gpu_backward_head_dim_v(**cfg):
    """The atomic backward with its own V head dim: FA3's kernel on Hopper
    (elsewhere refused, which is what the test then expects)."""
    need_gpu()
    prob = fa.Problem(rng_for("probe"), **cfg)
    t = {n: prob.tensor(n, getattr(prob, n)) for n in ("q", "k", "v", "dout")}
    for n in ("o", "dq", "dk", "dv"):
        t[n] = prob.tensor(n)
    t["lse"] = np.zeros((1, prob.hq, prob.nq), np.float32)
    if fa.GPU.fa_cuda_backward_algorithm(ctypes.byref(prob.params(t)), 0) != 3:
        assert fa.GPU.fa_cuda_supported(ctypes.byref(prob.params(t)), 1) == \
            fa.STATUS["FA_ERR_UNSUPPORTED"]
        raise Skip("no Hopper kernel here: refused, as documented")
    return backward_case(backends=("gpu",), **cfg)
case("gpu_bad_misaligned_rows", _gpu_status, _field(q_layout=(20 * 4 * 72, 68, 4 * 72)),
     "FA_ERR_UNSUPPORTED")
case("gpu_bad_null_k", _gpu_status, _field(k=None), "FA_ERR_NULL_POINTER")
case("gpu_bad_heads", _gpu_status, _field(heads_kv=3), "FA_ERR_INVALID_HEADS", True)
case("gpu_bad_overlap", _gpu_status, _field(dv_layout=(0, 8, 8)), "FA_ERR_INVALID_LAYOUT", True)
case("gpu_bad_seqlen_q_past_max", _gpu_status, _field(seqlen_q=2**31 - 1), "FA_ERR_INVALID_SIZE")
case("gpu_bad_alias_o_k", _gpu_status, lambda p, t: setattr(p, "o", p.k), "FA_ERR_INVALID_LAYOUT")
case("gpu_bad_alias_dq_dout", _gpu_status, lambda p, t: setattr(p, "dq", p.dout),
     "FA_ERR_INVALID_LAYOUT", True)


@test
def gpu_bad_workspace_too_small():
    lib = need_gpu()

    def shrink(p, t):
        need = lib.fa_test_gpu_backward_workspace_size(ctypes.byref(p), 0)
        assert need > 0
        status = lib.fa_test_gpu_backward_workspace(ctypes.byref(p), need - 4)
        assert status == fa.STATUS["FA_ERR_WORKSPACE"], fa.status_name(status)
        p.heads_kv = 3  # then the wrapper's own call fails cleanly too

    return _gpu_status(shrink, "FA_ERR_INVALID_HEADS", True)


@test
def gpu_bad_workspace_over_an_output():
    lib = need_gpu()

    def overlap(p, t):
        before = t["dq"].storage.copy()
        status = lib.fa_test_gpu_backward_workspace_on_dq(ctypes.byref(p))
        assert status == fa.STATUS["FA_ERR_INVALID_LAYOUT"], fa.status_name(status)
        assert "workspace" in lib.fa_last_error_detail().decode()
        assert np.array_equal(before, t["dq"].storage), "dq was written"
        p.heads_kv = 3  # then the wrapper's own call fails cleanly too

    return _gpu_status(overlap, "FA_ERR_INVALID_HEADS", True)


def _decode_status(mutate, expected, ws_size=None, seqlen_q=2):
    need_gpu()
    prob = fa.Problem(rng_for("dec_bad"), heads_q=8, heads_kv=2, seqlen_q=seqlen_q,
                      seqlen_k=3000, head_dim=64, dtype="bf16", num_splits=8)
    t = {n: prob.tensor(n, getattr(prob, n)) for n in ("q", "k", "v")}
    t["o"] = prob.tensor("o", np.full(prob._shape("o"), 7.0))
    t["lse"] = np.full((1, 8, seqlen_q), 7.0, np.float32)
    p = prob.params(t)
    mutate(p, t)
    before, lse_before = t["o"].storage.copy(), t["lse"].copy()
    if ws_size is None:
        status = fa.GPU.fa_test_gpu_forward(ctypes.byref(p))
    else:
        need = fa.GPU.fa_test_gpu_forward_workspace_size(ctypes.byref(p))
        assert need > 0
        status = fa.GPU.fa_test_gpu_forward_workspace(ctypes.byref(p), ws_size(need))
    assert status == fa.STATUS[expected], f"got {fa.status_name(status)}, expected {expected}"
    assert np.array_equal(before, t["o"].storage) and np.array_equal(lse_before, t["lse"])
    return fa.GPU.fa_last_error_detail().decode()


case("gpu_bad_split_workspace_too_small", _decode_status, _field(), "FA_ERR_WORKSPACE",
     lambda need: need - 16)
case("gpu_bad_split_no_workspace", _decode_status, _field(), "FA_ERR_WORKSPACE",
     lambda need: 0)
case("gpu_bad_split_negative", _decode_status, _field(num_splits=-3), "FA_ERR_INVALID_ARGUMENT")
case("gpu_bad_split_long_queries", _decode_status, _field(), "FA_ERR_UNSUPPORTED", seqlen_q=17)


# ---- graphs, faults, determinism, concurrency ----------------------------------

def _gpu_run(prob):
    """Forward, then the deterministic backward, on the default GPU build:
    O, LSE, dQ, dK, dV."""
    status, o, lse = prob.forward("gpu")
    assert status == fa.FA_OK, fa.status_name(status)
    status, *grads = prob.backward(o, lse, "gpu_det")
    assert status == fa.FA_OK, fa.status_name(status)
    return [o, lse] + grads


@test
def gpu_graph_capture_gives_the_direct_bits():
    """Forward and deterministic backward captured into a CUDA graph on a
    stream and launched (twice) give the bits of direct calls: FA3, FA2's
    head dims, and the decode path's split with its combine."""
    need_gpu()
    for cfg in (dict(seqlen_q=300, seqlen_k=500, head_dim=128, causal=True),
                dict(seqlen_q=200, seqlen_k=333, head_dim=96),
                dict(heads_q=8, heads_kv=2, seqlen_q=4, seqlen_k=3000, head_dim=64,
                     num_splits=5)):
        prob = fa.Problem(rng_for("graph" + str(cfg)), dtype="bf16", **cfg)
        direct = _gpu_run(prob)
        t = {n: prob.tensor(n, getattr(prob, n)) for n in ("q", "k", "v", "dout")}
        for n in ("o", "dq", "dk", "dv"):
            t[n] = prob.tensor(n)
        t["lse"] = np.full((prob.b, prob.hq, prob.nq), np.nan, np.float32)
        p = prob.params(t)
        status = fa.GPU.fa_test_gpu_graph(ctypes.byref(p), 1)
        assert status == fa.FA_OK, f"{cfg}: {fa.status_name(status)} " + \
            fa.GPU.fa_last_error_detail().decode()
        graph = [t["o"].values(), t["lse"].astype(np.float64)] + \
                [t[n].values() for n in ("dq", "dk", "dv")]
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), direct, graph):
            assert np.array_equal(a, b, equal_nan=True), f"{cfg}: {name} differs under a graph"


FAULTS = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import fa
prob = fa.Problem(np.random.default_rng(1), seqlen_q=64, seqlen_k=64, head_dim=64, dtype="bf16")
t = {n: prob.tensor(n, getattr(prob, n)) for n in ("q", "k", "v")}
t["o"] = prob.tensor("o")
t["lse"] = np.zeros((1, 2, 64), np.float32)
p = prob.params(t)
sticky, stream = ctypes.c_int(), ctypes.c_int()
fa.GPU.fa_test_gpu_faults(ctypes.byref(p), ctypes.byref(sticky), ctypes.byref(stream))
print(sticky.value, stream.value, fa.GPU.fa_last_error_detail().decode())
"""


@test
def gpu_faults_are_reported_as_cuda_errors():
    """A CUDA error left sticky by an earlier kernel fault, and a destroyed
    stream: FA_ERR_CUDA with CUDA's message, never success (in a process of
    its own: the fault ruins the context)."""
    import os
    import subprocess
    import sys
    need_gpu()
    out = subprocess.run([sys.executable, "-c", FAULTS, os.path.dirname(os.path.abspath(__file__))],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    sticky, stream, detail = out.stdout.strip().split(" ", 2)
    assert int(sticky) == fa.STATUS["FA_ERR_CUDA"], f"sticky error: {sticky} {detail}"
    assert int(stream) == fa.STATUS["FA_ERR_CUDA"], f"destroyed stream: {stream}"
    assert detail, "no CUDA message"
    return detail


@test
def gpu_deterministic_backward_bitwise_over_1000_runs():
    """The deterministic backward on 20 random shapes, 50 runs each: every
    run's dQ, dK, dV equal the first's bit for bit."""
    need_gpu()
    rng = rng_for("det1000")
    runs = 0
    for _ in range(20):
        d = int(rng.choice(HEAD_DIMS))
        hkv = int(rng.integers(1, 3))
        prob = fa.Problem(rng, batch=int(rng.integers(1, 3)), heads_q=hkv * int(rng.integers(1, 3)),
                          heads_kv=hkv, seqlen_q=int(rng.integers(1, 400)),
                          seqlen_k=int(rng.integers(1, 400)), head_dim=d, dtype="bf16",
                          causal=bool(rng.integers(2)))
        status, o, lse = prob.forward("gpu")
        assert status == fa.FA_OK
        first = None
        for _ in range(50):
            status, *grads = prob.backward(o, lse, "gpu_det")
            assert status == fa.FA_OK
            if first is None:
                first = grads
            assert all(np.array_equal(a, b) for a, b in zip(first, grads)), \
                f"run {runs}: d {d}, Nq {prob.nq}, Nk {prob.nk}"
            runs += 1
    return f"{runs} runs"


@test
def gpu_concurrent_host_threads():
    """Four host threads at once: three run their own problems (forward and
    deterministic backward through the wrappers, which mirror, call and copy
    back on the default stream), each result the bits of a serial run; one
    makes bad calls, its status and (thread-local) detail its own. Streams
    of their own per call: gpu_graph_capture_gives_the_direct_bits."""
    import threading
    need_gpu()
    probs = [fa.Problem(rng_for(f"gconc{i}"), heads_q=4, heads_kv=2, seqlen_q=100 + 50 * i,
                        seqlen_k=300, head_dim=(64, 128, 96)[i], causal=bool(i % 2),
                        dtype="bf16") for i in range(3)]
    serial = [_gpu_run(prob) for prob in probs]
    errors = []

    def good(i):
        for _ in range(5):
            got = _gpu_run(probs[i])
            if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(got, serial[i])):
                errors.append(f"thread {i}: results differ from the serial run")

    def bad():
        p = fa.Problem(rng_for("gconcbad"), seqlen_q=8, seqlen_k=8, head_dim=64).params({})
        p.seqlen_q = -7
        for _ in range(200):
            status = fa.GPU.fa_test_gpu_forward(ctypes.byref(p))
            detail = fa.GPU.fa_last_error_detail().decode()
            if status != fa.STATUS["FA_ERR_INVALID_SIZE"] or "seqlen_q -7," not in detail:
                errors.append(f"bad thread: {fa.status_name(status)} '{detail}'")
                return

    workers = [threading.Thread(target=good, args=(i,)) for i in range(3)]
    workers.append(threading.Thread(target=bad))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors[:3]


# ---- GPU fuzz -----------------------------------------------------------------

GPU_FUZZ_PROBLEMS = 1000
GPU_FUZZ_SECONDS = 300  # a bound on the run, not a target: fewer problems fail the test


def _gpu_fuzz_config(rng):
    """A random valid problem: head dims compiled or between (multiples of 8;
    a tenth any d in 16-byte rows), sometimes a V head dim of its own; small lengths (1 .. 300) so that a
    thousand run in minutes; every mask, softcap, GQA, layouts, splits."""
    d = int(rng.choice(HEAD_DIMS)) if rng.random() < 0.6 else 8 * int(rng.integers(1, 33))
    group = int(rng.choice((1, 2, 4)))
    cfg = dict(batch=int(rng.integers(1, 3)), heads_kv=int(rng.integers(1, 3)),
               seqlen_q=int(rng.integers(1, 301)) if rng.random() < 0.8 else int(rng.integers(1, 17)),
               seqlen_k=int(rng.integers(1, 301)), head_dim=d,
               dtype=str(rng.choice(("f16", "bf16"))), layout=str(rng.choice(("bshd", "padded", "bhsd"))),
               causal=bool(rng.random() < 0.35))
    cfg["heads_q"] = cfg["heads_kv"] * group
    if rng.random() < 0.2:
        cfg["window"] = (int(rng.integers(-1, 80)), int(rng.integers(-1, 20)))
    if rng.random() < 0.15:
        cfg["softcap"] = float(rng.uniform(2.0, 30.0))
    if rng.random() < 0.1:  # a head dim that ends inside a 16-byte chunk, in 16-byte rows
        cfg["head_dim"], cfg["layout"] = int(rng.integers(1, 257)), "aligned"
    elif rng.random() < 0.15:
        cfg["head_dim_v"] = 8 * int(rng.integers(1, 33))
    if cfg["seqlen_q"] <= 16 and rng.random() < 0.5:
        cfg["num_splits"] = int(rng.integers(1, 9))
    return cfg


def _gpu_fuzz_supported(lib, cfg, pass_):
    prob = fa.Problem(rng_for("gpu_fuzz_probe"), **cfg)
    t = {n: prob.tensor(n) for n in ("q", "k", "v", "o", "dout", "dq", "dk", "dv")}
    t["lse"] = np.zeros((prob.b, prob.hq, prob.nq), np.float32)
    return lib.fa_cuda_supported(ctypes.byref(prob.params(t)), pass_) == fa.FA_OK


@test
def gpu_fuzz_random_problems():
    """GPU_FUZZ_PROBLEMS random valid problems (_gpu_fuzz_config) spread over
    every GPU build there is (default, FA2-only, FA1, 163 and 99 KB), forward
    and, for two in five, backward (atomic and deterministic), each against
    the float64 reference with the suite's bounds. A configuration a build
    refuses (FA_ERR_UNSUPPORTED: fa_cuda_supported) counts as refused, not
    run; the refusals themselves are tested elsewhere."""
    import time
    need_gpu()
    builds = [(name, lib) for name, lib in (("gpu", fa.GPU), ("gpu_fa2", fa.GPU_FA2),
                                            ("gpu_fa1", fa.GPU_FA1), ("gpu163", fa.GPU_SMEM163),
                                            ("gpu99", fa.GPU_SMEM99)) if lib is not None]
    rng = rng_for("gpu_fuzz")
    start, ran, refused, per_build = time.time(), 0, 0, {name: 0 for name, _ in builds}
    while ran < GPU_FUZZ_PROBLEMS and time.time() - start < GPU_FUZZ_SECONDS:
        name, lib = builds[int(rng.integers(len(builds)))]
        cfg = _gpu_fuzz_config(rng)
        backward = rng.random() < 0.4 and name != "gpu_fa1" and not cfg.get("num_splits")
        if not _gpu_fuzz_supported(lib, cfg, 1 if backward else 0):
            refused += 1
            continue
        try:
            if backward:
                modes = (name,) + ((name + "_det",) if name in ("gpu", "gpu_fa2", "gpu163", "gpu99")
                                   else ())
                backward_case(backends=modes, **cfg)
            else:
                forward_case(backends=(name,), **cfg)
        except AssertionError as e:
            raise AssertionError(f"{name} {'backward' if backward else 'forward'} {cfg}: {e}")
        ran += 1
        per_build[name] += 1
    assert ran >= GPU_FUZZ_PROBLEMS, f"{ran} problems in {GPU_FUZZ_SECONDS} s"
    return (f"{ran} problems ({refused} configurations refused) in {time.time() - start:.0f} s: "
            + ", ".join(f"{n} {c}" for n, c in per_build.items()))
