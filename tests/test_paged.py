"""Paged K/V caches (block_table, cache_seqlens, page_size,
and the append of k_new / v_new into the pages), forward, against the
float64 reference of each sequence's gathered keys; the cache after the
append; bad tables and sizes refused with nothing written; the same on the
GPU (decode kernel over the pages; prefill chunks on the FA3 kernel reading
pages of a power of two in place, by TMA where its key tile divides the
page or a page divides the tile in at most 4 boxes, else copied by its
producer warpgroup's threads; other page sizes gathered into the workspace
for the dense kernels); the reference refuses."""
import ctypes

import numpy as np

import fa
import reference
from harness import case, test, Skip
from test_cpu import check, check_lse, rng_for
from test_gpu import need_gpu


class PagedProblem:
    def __init__(self, rng, cache_lens, seqlen_new=0, seqlen_q=1, page_size=16, max_pages=8,
                 heads_q=4, heads_kv=2, head_dim=64, dtype="f32", causal=False, window=None,
                 softcap=0.0, layout="bshd", head_dim_v=0, poison=False):
        self.b, self.hq, self.hkv, self.d, self.dtype = len(cache_lens), heads_q, heads_kv, head_dim, dtype
        self.dv = head_dim_v or head_dim
        self.lens, self.new, self.nq = np.array(cache_lens, np.int32), seqlen_new, seqlen_q
        self.ps, self.mp, self.layout = page_size, max_pages, layout
        self.causal, self.window, self.softcap = causal, window, softcap
        self.scale = 1.0 / np.sqrt(head_dim)
        self.num_pages = self.b * max_pages + 3
        pages = rng.permutation(self.num_pages).astype(np.int32)
        self.table = np.full((self.b, max_pages), -1, np.int32)  # unused entries: not pages
        for b in range(self.b):
            used = -(-(int(self.lens[b]) + seqlen_new) // page_size)
            self.table[b, :used] = pages[b * max_pages:b * max_pages + used]
        shape = (self.num_pages, page_size, heads_kv)
        self.k_cache = fa.quantize(rng.standard_normal(shape + (head_dim,)), dtype)
        self.v_cache = fa.quantize(rng.standard_normal(shape + (self.dv,)), dtype)
        if poison:  # NaN in every cache row that holds no key after the append
            live = np.zeros(shape[:2], bool)
            for b in range(self.b):
                for c in range(int(self.lens[b]) + seqlen_new):
                    live[self.table[b, c // page_size], c % page_size] = True
            self.k_cache[~live] = np.nan
            self.v_cache[~live] = np.nan
        new = (self.b, max(seqlen_new, 1), heads_kv)
        self.k_new = fa.quantize(rng.standard_normal(new + (head_dim,)), dtype)
        self.v_new = fa.quantize(rng.standard_normal(new + (self.dv,)), dtype)
        self.q = fa.quantize(rng.standard_normal((self.b, seqlen_q, heads_q, head_dim)), dtype)

    def keys(self, b):
        """Sequence b's keys and values after the append, [1, L, Hkv, d]."""
        n = int(self.lens[b])
        rows = [self.table[b, c // self.ps] for c in range(n)], [c % self.ps for c in range(n)]
        k = np.concatenate([self.k_cache[rows[0], rows[1]], self.k_new[b, :self.new]])
        v = np.concatenate([self.v_cache[rows[0], rows[1]], self.v_new[b, :self.new]])
        return k[None], v[None]

    def run(self, backend="fa2", mutate=None, backward=False, workspace=None, call=None):
        """Status, tensors and LSE of one call; workspace: the GPU forward with
        that many bytes (None: the size the library asks for); call: a
        function of the params that makes the call instead."""
        t = {"q": fa.Tensor(self.q.shape, self.dtype, self.layout, self.q),
             "k": fa.Tensor(self.k_cache.shape, self.dtype, self.layout, self.k_cache),
             "v": fa.Tensor(self.v_cache.shape, self.dtype, self.layout, self.v_cache),
             "o": fa.Tensor(self.q.shape[:3] + (self.dv,), self.dtype, self.layout),
             "k_new": fa.Tensor(self.k_new.shape, self.dtype, self.layout, self.k_new),
             "v_new": fa.Tensor(self.v_new.shape, self.dtype, self.layout, self.v_new)}
        lse = np.full((self.b, self.hq, self.nq), np.nan, np.float32)
        p = fa.Params()
        p.dtype = fa.DTYPES[self.dtype]
        p.batch, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v = self.b, self.hq, self.hkv, self.d, self.dv
        p.seqlen_q = self.nq
        p.seqlen_k = max(int((self.lens + self.new).max()), 1)
        p.causal, p.softcap = int(self.causal), self.softcap
        if self.window is not None:
            p.window, (p.window_left, p.window_right) = 1, self.window
        for name, x in t.items():
            setattr(p, name, x.ptr)
            setattr(p, name + "_layout", x.layout)
        p.lse = lse.ctypes.data
        p.block_table, p.max_pages, p.page_size = self.table.ctypes.data, self.mp, self.ps
        p.num_pages, p.cache_seqlens, p.seqlen_new = self.num_pages, self.lens.ctypes.data, self.new
        keep = mutate(p) if mutate else None
        if call is not None:
            status = call(p)
        elif workspace is not None:
            status = fa.GPU.fa_test_gpu_forward_workspace(ctypes.byref(p), workspace)
        else:
            status = (fa.call_backward if backward else fa.call_forward)(backend, p)
        if backend == "gpu" and not backward and call is None:
            self.workspace_size = fa.GPU.fa_test_gpu_forward_workspace_size(ctypes.byref(p))
        del keep
        return status, t, lse.astype(np.float64)


def _need_fa3():
    if fa.GPU.fa_test_gpu_cc() != 90:
        raise Skip("prefill chunks over tables in device memory run on the FA3 kernel "
                   "(compute capability 9.0)")


def paged_case(backend="fa2", num_splits=0, device_tables=False, host_bits=True, **cfg):
    """device_tables: the GPU with tables_on_device, and (host_bits) its
    bits equal to those of host tables (the same plan and kernels; only
    where the kernels read the tables differs)."""
    if backend == "gpu":
        need_gpu()
    if device_tables and cfg.get("seqlen_q", 1) > 16:
        _need_fa3()
    prob = PagedProblem(rng_for("paged" + backend + str(cfg)), **cfg)
    args = dict(scale=prob.scale, causal=prob.causal, window=prob.window, softcap=prob.softcap)
    # the GPU's tensor cores take P in the storage dtype; its mirror rounds the same way
    round_p = (lambda x: fa.quantize(x, prob.dtype)) if backend == "gpu" else None
    ref_o = np.zeros(prob.q.shape[:3] + (prob.dv,))
    low_o = np.zeros_like(ref_o)
    ref_lse = np.full((prob.b, prob.hq, prob.nq), -np.inf)
    for b in range(prob.b):
        k, v = prob.keys(b)
        if k.shape[1] == 0:
            continue
        o, lse = reference.forward(prob.q[b:b + 1], k, v, **args)
        ref_o[b], ref_lse[b] = o[0], lse[0]
        low_o[b] = reference.forward(prob.q[b:b + 1], k, v, precision=np.float32, round_p=round_p,
                                     **args)[0][0]
    status, t, lse = prob.run(backend, _set(num_splits=num_splits, tables_on_device=int(device_tables)))
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.last_detail(backend)}"
    if device_tables and host_bits:
        host = prob.run(backend, _set(num_splits=num_splits))
        assert host[0] == fa.FA_OK, fa.status_name(host[0])
        for name, a, b in (("o", t["o"].values(), host[1]["o"].values()), ("lse", lse, host[2]),
                           ("k", t["k"].values(), host[1]["k"].values()),
                           ("v", t["v"].values(), host[1]["v"].values())):
            assert np.array_equal(a, b, equal_nan=True), f"{name}: device tables differ from host ones"
    err = check("paged o", t["o"].values(), ref_o, low_o, prob.dtype)
    check_lse(lse, ref_lse)
    # the cache after the append: k_new, v_new rows in their pages, nothing else changed
    want_k, want_v = prob.k_cache.copy(), prob.v_cache.copy()
    for b in range(prob.b):
        for r in range(prob.new):
            c = int(prob.lens[b]) + r
            want_k[prob.table[b, c // prob.ps], c % prob.ps] = prob.k_new[b, r]
            want_v[prob.table[b, c // prob.ps], c % prob.ps] = prob.v_new[b, r]
    assert np.array_equal(t["k"].values(), want_k, equal_nan=True) and \
        np.array_equal(t["v"].values(), want_v, equal_nan=True), "the cache after the append"
    return f"err {err:.1e}"


case("paged_decode", paged_case, cache_lens=[37, 100, 1, 64], page_size=16)
case("paged_head_dim_v_append", paged_case, cache_lens=[37, 0, 64], seqlen_new=2, seqlen_q=2,
     page_size=16, head_dim=192, head_dim_v=128, causal=True, layout="padded")
case("paged_decode_append", paged_case, cache_lens=[37, 100, 0, 64], seqlen_new=1, page_size=16)
case("paged_prefill_chunk_causal", paged_case, cache_lens=[20, 70, 0], seqlen_new=9, seqlen_q=9,
     causal=True, page_size=32, max_pages=4, heads_q=6, heads_kv=3)
case("paged_page_size_1_gqa_window", paged_case, cache_lens=[13, 5], seqlen_new=3, seqlen_q=3,
     page_size=1, max_pages=20, window=(6, 0), causal=True, heads_q=8, heads_kv=2)
case("paged_page_256_bf16_softcap", paged_case, cache_lens=[300, 511], seqlen_new=1, seqlen_q=4,
     page_size=256, max_pages=2, dtype="bf16", softcap=20.0, causal=True, layout="padded")
case("paged_prefill_poison", paged_case, cache_lens=[17, 40, 0], seqlen_new=3, seqlen_q=5,
     page_size=16, max_pages=4, causal=True, poison=True)
case("paged_empty_sequence_f16", paged_case, cache_lens=[0, 40], seqlen_q=2, dtype="f16",
     page_size=16, max_pages=4)

# The GPU: seqlen_q <= 16 on the decode kernel reading the pages in place
# (split or not), longer query chunks on the FA3 kernel reading them in
# place (Hopper, pages of a power of two: by TMA or by the producer's
# threads) or gathered per sequence onto the dense kernels (other sizes);
# page sizes from 1 to past the key tiles, empty sequences, appends.
GPU_CASES = (
        ("decode_append_d128", dict(cache_lens=[37, 1000, 1, 64], seqlen_new=1, page_size=16,
                                    max_pages=64, heads_q=8, heads_kv=2, head_dim=128)),
        ("decode_split_7", dict(cache_lens=[300, 1000], seqlen_new=1, page_size=64, max_pages=16,
                                heads_q=4, heads_kv=1, num_splits=7)),
        ("decode_split_1_page_1", dict(cache_lens=[77, 130], seqlen_new=2, seqlen_q=2, page_size=1,
                                       max_pages=140, causal=True, num_splits=1)),
        ("speculative_16_window_softcap_f16", dict(cache_lens=[500, 0, 33], seqlen_new=16,
                                                   seqlen_q=16, page_size=32, max_pages=20,
                                                   causal=True, window=(100, 0), softcap=30.0,
                                                   dtype="f16", heads_q=16, heads_kv=4)),
        # more than 32 packed rows: Hopper's wgmma kernel over the pages
        # (sliced by 16, and a page a row's lookup)
        ("decode_wgmma_page_16_d128_gqa8", dict(cache_lens=[37, 1000, 1, 64], seqlen_new=8,
                                                seqlen_q=8, page_size=16, max_pages=64,
                                                heads_q=16, heads_kv=2, head_dim=128, causal=True,
                                                poison=True)),
        ("decode_wgmma_page_7_d64_split_5", dict(cache_lens=[300, 3], seqlen_q=12, page_size=7,
                                                 max_pages=50, heads_q=12, heads_kv=3,
                                                 num_splits=5, poison=True)),
        ("decode_page_256_d256_padded", dict(cache_lens=[600, 255], seqlen_q=1, page_size=256,
                                             max_pages=3, head_dim=256, layout="padded")),
        ("decode_empty_sequences", dict(cache_lens=[0, 0, 5], seqlen_q=3, page_size=16,
                                        max_pages=2, causal=True)),
        ("prefill_chunk_causal_d128", dict(cache_lens=[200, 0, 513], seqlen_new=40, seqlen_q=40,
                                           page_size=16, max_pages=40, causal=True, heads_q=8,
                                           heads_kv=2, head_dim=128)),
        ("prefill_chunk_empty_sequence_d64", dict(cache_lens=[0, 90], seqlen_q=33, page_size=8,
                                                  max_pages=16, causal=True, dtype="f16")),
        ("prefill_window_page_48", dict(cache_lens=[100, 260], seqlen_new=20, seqlen_q=20,
                                        page_size=48, max_pages=8, window=(64, 8), heads_q=6,
                                        heads_kv=3)),
        # The cache rows that hold no key are NaN below, so a read of one
        # shows: page sizes 16 to 256, lengths on both sides of a page and
        # of the key tiles (64, 80, 128, 176).
        ("prefill_poison_page_16_d64", dict(cache_lens=[0, 1, 15, 16, 17, 100], seqlen_new=3,
                                            seqlen_q=19, page_size=16, max_pages=8, causal=True,
                                            poison=True)),
        ("prefill_poison_page_64_d128", dict(cache_lens=[63, 64, 65, 1000], seqlen_q=40,
                                             page_size=64, max_pages=16, heads_q=8, heads_kv=2,
                                             head_dim=128, poison=True)),
        ("prefill_poison_page_256_d128_causal", dict(cache_lens=[127, 128, 129, 700], seqlen_new=24,
                                                     seqlen_q=24, page_size=256, max_pages=4,
                                                     causal=True, head_dim=128, poison=True)),
        ("prefill_poison_page_256_d128_long_keys", dict(cache_lens=[8300], seqlen_q=20,
                                                        page_size=256, max_pages=33, head_dim=128,
                                                        poison=True)),
        ("prefill_poison_page_64_d256_f16", dict(cache_lens=[79, 80, 81, 300], seqlen_q=17,
                                                 page_size=64, max_pages=5, head_dim=256,
                                                 dtype="f16", poison=True)),
        ("prefill_poison_page_32_dv", dict(cache_lens=[50, 31], seqlen_new=5, seqlen_q=21,
                                           page_size=32, max_pages=3, head_dim=192,
                                           head_dim_v=128, causal=True, poison=True)),
        # pages the FA3 forward reads in place (a whole key tile of 128 in a
        # page): sequences on both sides of a page, several query blocks,
        # empty sequences, a head dim between the compiled ones, and 24
        # sequences of 24 tiles, so the schedule's 512-tile staging chunk
        # fills inside a sequence
        ("prefill_in_place_page_128_d64_causal_gqa", dict(
            cache_lens=[1, 127, 128, 129, 1000], seqlen_new=7, seqlen_q=300, page_size=128,
            max_pages=10, heads_q=8, heads_kv=2, causal=True, poison=True)),
        ("prefill_in_place_page_256_d128_window_softcap_f16", dict(
            cache_lens=[255, 256, 257, 3000], seqlen_q=200, page_size=256, max_pages=13,
            head_dim=128, window=(300, 40), softcap=25.0, dtype="f16", poison=True)),
        ("prefill_in_place_page_128_d96_empty", dict(
            cache_lens=[0, 300, 0], seqlen_q=40, page_size=128, max_pages=3, head_dim=96,
            causal=True, poison=True)),
        ("prefill_in_place_page_128_24_sequences", dict(
            cache_lens=[17 * i + 90 for i in range(24)], seqlen_new=3, seqlen_q=300,
            page_size=128, max_pages=5, heads_q=8, heads_kv=4, causal=True)),
        # pages smaller than the key tile, a box of keys from each: 2 boxes a
        # tile of 128, and the unmasked long-key problem whose 176-key tile a
        # page of 64 does not divide (t0 then); pages of 32 at d = 256 gather
        ("prefill_in_place_page_64_d128_causal_gqa", dict(
            cache_lens=[63, 64, 65, 1000], seqlen_new=5, seqlen_q=300, page_size=64,
            max_pages=17, heads_q=8, heads_kv=2, head_dim=128, causal=True, poison=True)),
        ("prefill_in_place_page_64_d128_long_keys", dict(
            cache_lens=[8300], seqlen_q=20, page_size=64, max_pages=130, head_dim=128,
            poison=True)),
        ("prefill_gathered_page_32_d256_window", dict(
            cache_lens=[15, 16, 17, 400], seqlen_q=100, page_size=32, max_pages=13,
            head_dim=256, window=(50, 10), poison=True)),
        # pages that are no power of two gather too (an empty sequence, the
        # append crossing pages)
        ("prefill_gathered_page_24_d128_gqa", dict(
            cache_lens=[0, 23, 24, 25, 500], seqlen_new=9, seqlen_q=33, page_size=24,
            max_pages=23, heads_q=8, heads_kv=2, head_dim=128, causal=True, poison=True)),
        # pages the TMA's boxes do not fit, copied by the producer's threads
        # (d <= 128, pages of 4 and up): many key tiles and query blocks over
        # pages of 16, pages of 4 (a key tile's 32 pages), a head dim
        # between the compiled ones (columns zero-filled); pages of 2 gather
        ("prefill_threads_page_16_d128_long_causal_gqa", dict(
            cache_lens=[2000, 129, 1], seqlen_new=4, seqlen_q=260, page_size=16, max_pages=126,
            heads_q=8, heads_kv=2, head_dim=128, causal=True, poison=True)),
        ("prefill_threads_page_4_d64", dict(
            cache_lens=[300, 3], seqlen_new=2, seqlen_q=33, page_size=4, max_pages=76,
            causal=True, poison=True)),
        ("prefill_gathered_page_2_d128", dict(
            cache_lens=[70, 3], seqlen_q=33, page_size=2, max_pages=35, head_dim=128,
            poison=True)),
        ("prefill_threads_page_16_d96_window_softcap_f16", dict(
            cache_lens=[300, 17], seqlen_q=64, page_size=16, max_pages=19, head_dim=96,
            window=(100, 0), softcap=20.0, dtype="f16", poison=True)),
        ("decode_poison_page_16", dict(cache_lens=[37, 1000, 1, 64], seqlen_new=1, page_size=16,
                                       max_pages=64, heads_q=8, heads_kv=2, head_dim=128,
                                       poison=True)),
        # the decode kernel's page walks: pages of one key tile, of two (a
        # split starting in a page's second half), pages that tiles cross
        # (48), pages that are not whole slices (24: a page a row), d = 256
        ("decode_poison_page_64_split_3_d64", dict(cache_lens=[63, 64, 65, 1000], seqlen_q=4,
                                                   page_size=64, max_pages=16, heads_q=8,
                                                   heads_kv=2, num_splits=3, poison=True)),
        ("decode_poison_page_128_split_5_d128", dict(cache_lens=[127, 128, 129, 2000], seqlen_q=2,
                                                     page_size=128, max_pages=16, head_dim=128,
                                                     causal=True, num_splits=5, poison=True)),
        ("decode_poison_page_48_split_4_d128", dict(cache_lens=[47, 48, 49, 500], seqlen_q=16,
                                                    page_size=48, max_pages=12, head_dim=128,
                                                    heads_q=8, heads_kv=2, causal=True,
                                                    num_splits=4, poison=True)),
        ("decode_poison_page_24_split_2_d64", dict(cache_lens=[23, 24, 25, 300], seqlen_new=1,
                                                   page_size=24, max_pages=14, num_splits=2,
                                                   poison=True)),
        ("decode_poison_page_256_split_4_d256", dict(cache_lens=[255, 256, 257, 1500], seqlen_q=3,
                                                     page_size=256, max_pages=6, head_dim=256,
                                                     num_splits=4, poison=True)),
        # more than 32 packed rows at d = 256: the wgmma kernel's page walk
        ("decode_poison_page_16_d256_rows64", dict(cache_lens=[15, 16, 17, 900], seqlen_q=16,
                                                   page_size=16, max_pages=60, heads_q=8,
                                                   heads_kv=2, head_dim=256, causal=True,
                                                   num_splits=3, poison=True)),
        ("decode_poison_page_24_d256_rows48", dict(cache_lens=[23, 400], seqlen_q=6,
                                                   page_size=24, max_pages=18, heads_q=16,
                                                   heads_kv=2, head_dim=256, poison=True)),
        ("decode_poison_page_64_d160", dict(cache_lens=[65, 700], seqlen_q=5, page_size=64,
                                            max_pages=12, head_dim=160, num_splits=2,
                                            poison=True)),
        # pages of whole key tiles (the _pages kernels): a multiple of the
        # 64-key tile that is no power of two, and the wgmma kernel's
        ("decode_poison_page_192_split_3_d128", dict(cache_lens=[191, 192, 193, 1500],
                                                     seqlen_new=1, page_size=192, max_pages=8,
                                                     head_dim=128, num_splits=3, poison=True)),
        ("decode_wgmma_poison_page_64_d128_split_3", dict(cache_lens=[63, 64, 65, 1000],
                                                          seqlen_new=16, seqlen_q=16,
                                                          page_size=64, max_pages=17, heads_q=8,
                                                          heads_kv=2, head_dim=128, causal=True,
                                                          num_splits=3, poison=True)),
        # pages of whole 16-key slices (the _slices kernels, d = 64 and
        # 128): a split starting inside a page, pages that tiles cross (48)
        ("decode_poison_page_32_split_5_d128", dict(cache_lens=[31, 32, 33, 1500], seqlen_q=3,
                                                    page_size=32, max_pages=48, head_dim=128,
                                                    heads_q=8, heads_kv=2, num_splits=5,
                                                    poison=True)),
        ("decode_poison_page_16_d64_gqa", dict(cache_lens=[15, 16, 17, 900], seqlen_new=1,
                                               seqlen_q=2, page_size=16, max_pages=60,
                                               heads_q=8, heads_kv=2, causal=True, poison=True)),
        ("decode_wgmma_poison_page_48_d128_split_2", dict(cache_lens=[47, 48, 49, 700],
                                                          seqlen_new=16, seqlen_q=16,
                                                          page_size=48, max_pages=16, heads_q=8,
                                                          heads_kv=2, head_dim=128, causal=True,
                                                          num_splits=2, poison=True)))
for name, cfg in GPU_CASES:
    case(f"gpu_paged_{name}", paged_case, backend="gpu", **dict(dict(dtype="bf16"), **cfg))
# tables_on_device: the decode path's walks (pages sliced by 16 and a page a
# row's lookup, splits, the wgmma kernel, d = 256), appends, empty
# sequences; prefill chunks on the FA3 kernel reading the pages in place
# (a tile from a page, boxes from several) or gathered first (pages of 16,
# 24, d = 256, another V head dim), on the schedule made on the GPU
for name, cfg in GPU_CASES:
    if name in ("decode_append_d128", "decode_split_7", "decode_split_1_page_1",
                "speculative_16_window_softcap_f16", "decode_wgmma_page_16_d128_gqa8",
                "decode_wgmma_page_7_d64_split_5", "decode_page_256_d256_padded",
                "decode_empty_sequences", "decode_poison_page_24_split_2_d64",
                "decode_poison_page_16_d256_rows64", "decode_poison_page_192_split_3_d128",
                "decode_wgmma_poison_page_64_d128_split_3", "decode_poison_page_32_split_5_d128",
                "decode_wgmma_poison_page_48_d128_split_2", "decode_poison_page_16_d64_gqa",
                "prefill_poison_page_64_d128",
                "prefill_poison_page_256_d128_causal", "prefill_poison_page_256_d128_long_keys",
                "prefill_in_place_page_128_d64_causal_gqa",
                "prefill_in_place_page_256_d128_window_softcap_f16",
                "prefill_in_place_page_128_d96_empty", "prefill_in_place_page_128_24_sequences",
                "prefill_in_place_page_64_d128_causal_gqa",
                "prefill_in_place_page_64_d128_long_keys",
                "prefill_poison_page_16_d64", "prefill_poison_page_64_d256_f16",
                "prefill_poison_page_32_dv", "prefill_gathered_page_32_d256_window",
                "prefill_gathered_page_24_d128_gqa"):
        case(f"gpu_paged_device_tables_{name}", paged_case, backend="gpu", device_tables=True,
             **dict(dict(dtype="bf16"), **cfg))
# pages of 16 under 4096 query rows x group or more: device tables gather
# into the workspace for the dense kernel (FA_I_PAGED_GATHER_ROWS) where host
# tables keep the producer's copies, so the bits may differ; queries that
# see no key in the short sequence
case("gpu_paged_device_tables_prefill_gathered_rows_page_16_d128", paged_case, backend="gpu",
     device_tables=True, host_bits=False, dtype="bf16", cache_lens=[1500, 40], seqlen_new=3,
     seqlen_q=1100, page_size=16, max_pages=95, heads_q=8, heads_kv=2, head_dim=128,
     causal=True, poison=True)


def _paged_bad(mutate, expected, backends=("fa2", "gpu")):
    prob = PagedProblem(rng_for("paged_bad"), cache_lens=[10, 20], seqlen_new=2, page_size=8,
                        max_pages=4, dtype="bf16")  # a dtype both paths take
    ran = 0
    for backend in backends:
        if backend == "gpu" and (fa.GPU is None or fa.GPU.fa_test_gpu_count() < 1):
            continue
        status, t, lse = prob.run(backend, mutate)
        assert status == fa.STATUS[expected], f"{backend}: {fa.status_name(status)}, expected {expected}"
        assert np.isnan(t["o"].values()).all() and np.isnan(lse).all(), f"{backend} wrote o or lse"
        assert np.array_equal(t["k"].values(), prob.k_cache) and \
            np.array_equal(t["v"].values(), prob.v_cache), f"{backend} wrote the cache"
        ran += 1
    if not ran:
        raise Skip("no GPU here")
    return fa.CPU.fa_last_error_detail().decode()


def _table(b, j, value):
    def mutate(p):
        table = np.ctypeslib.as_array(ctypes.cast(p.block_table, ctypes.POINTER(ctypes.c_int32)),
                                      (p.batch, p.max_pages)).copy()
        table[b, j] = value
        p.block_table = table.ctypes.data
        return table
    return mutate


def _set(**fields):
    def mutate(p):
        for k, v in fields.items():
            setattr(p, k, v)
    return mutate


for name, mutate, expected in (
        ("page_past_the_cache", _table(1, 2, 11), "FA_ERR_INVALID_ARGUMENT"),
        ("negative_page", _table(0, 1, -1), "FA_ERR_INVALID_ARGUMENT"),
        ("keys_past_seqlen_k", _set(seqlen_k=20), "FA_ERR_INVALID_SIZE"),
        ("keys_past_the_table", _set(max_pages=2), "FA_ERR_INVALID_SIZE"),
        ("page_size_0", _set(page_size=0), "FA_ERR_INVALID_SIZE"),
        ("no_cache_seqlens", _set(cache_seqlens=None), "FA_ERR_NULL_POINTER"),
        ("no_k_new", _set(k_new=None), "FA_ERR_NULL_POINTER"),
        ("cache_rows_overlap", lambda p: setattr(p, "k_layout", fa.Layout(8 * 2 * 64, 0, 128)),
         "FA_ERR_INVALID_LAYOUT"),
        ("o_over_the_cache", lambda p: setattr(p, "o", p.v), "FA_ERR_INVALID_LAYOUT")):
    case(f"paged_bad_{name}", _paged_bad, mutate, expected)
case("paged_bad_reference_refuses", _paged_bad, None, "FA_ERR_UNSUPPORTED", ("ref",))


@test
def gpu_paged_workspace_too_small():
    """The GPU's paged call takes its workspace from the caller (the block
    table's copy, the split parts): one byte short is FA_ERR_WORKSPACE with
    nothing written, the cache included."""
    need_gpu()
    prob = PagedProblem(rng_for("paged_ws"), cache_lens=[10, 20], seqlen_new=2, page_size=8,
                        max_pages=4, dtype="bf16")
    status, t, lse = prob.run("gpu")
    assert status == fa.FA_OK, fa.status_name(status)
    need = prob.workspace_size
    assert need >= 4 * (2 * 4 + 2), f"{need} bytes cannot hold the block table"
    status, t, lse = prob.run("gpu", workspace=need - 1)
    assert status == fa.STATUS["FA_ERR_WORKSPACE"], fa.status_name(status)
    assert np.isnan(t["o"].values()).all() and np.isnan(lse).all(), "wrote o or lse"
    assert np.array_equal(t["k"].values(), prob.k_cache), "wrote the cache"
    return f"needs {need} bytes"


@test
def gpu_paged_device_tables_gathered_workspace():
    """A prefill chunk over device tables whose pages the FA3 forward does
    not read in place (2 keys: a key tile spans more pages than its gathering
    producer's warp holds) gathers every sequence's keys into the
    caller's workspace: its size holds [B, capacity] K and V, and one byte
    short is FA_ERR_WORKSPACE with nothing written, the cache included."""
    need_gpu()
    _need_fa3()
    prob = PagedProblem(rng_for("paged_ws_gathered"), cache_lens=[10, 20], seqlen_new=2,
                        seqlen_q=17, page_size=2, max_pages=12, dtype="bf16")
    status, t, lse = prob.run("gpu", _set(tables_on_device=1))
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.last_detail('gpu')}"
    need = prob.workspace_size
    capacity = min(int((prob.lens + prob.new).max()), prob.mp * prob.ps)  # seqlen_k, the table
    kv = prob.b * capacity * prob.hkv * (prob.d + prob.dv) * 2
    assert need >= kv, f"{need} bytes cannot hold the gathered K and V ({kv})"
    status, t, lse = prob.run("gpu", _set(tables_on_device=1), workspace=need - 1)
    assert status == fa.STATUS["FA_ERR_WORKSPACE"], fa.status_name(status)
    assert np.isnan(t["o"].values()).all() and np.isnan(lse).all(), "wrote o or lse"
    assert np.array_equal(t["k"].values(), prob.k_cache), "wrote the cache"
    return f"needs {need} bytes"


@test
def paged_backward_is_refused():
    """Paged K/V is forward only: the backward answers FA_ERR_UNSUPPORTED."""
    prob = PagedProblem(rng_for("paged_bwd"), cache_lens=[10], page_size=8, max_pages=2)

    def as_backward(p):
        p.dout = p.dq = p.dk = p.dv = p.o
        return None

    status, t, lse = prob.run(mutate=as_backward, backward=True)
    assert status == fa.STATUS["FA_ERR_UNSUPPORTED"], fa.status_name(status)
    return fa.CPU.fa_last_error_detail().decode()


def _device_tables_graph(seqlen_q, page_size, max_pages):
    """tables_on_device: a call captured once into a CUDA graph reads the
    tables as they are at each launch: the second launch, after new cache
    lengths were written into the same device array, equals a direct call
    over those lengths, bit for bit, as the first equals one over the old."""
    need_gpu()
    if seqlen_q > 16:
        _need_fa3()
    prob = PagedProblem(rng_for("paged_graph"), cache_lens=[37, 1000, 1, 64],
                        page_size=page_size, max_pages=max_pages, heads_q=8, heads_kv=2,
                        head_dim=128, dtype="bf16", seqlen_q=seqlen_q, causal=True)
    lens2 = np.array([20, 999, 0, 64], np.int32)  # within each sequence's filled entries
    o1 = fa.Tensor(prob.q.shape[:3] + (prob.dv,), prob.dtype, prob.layout)
    lse1 = np.full((prob.b, prob.hq, prob.nq), np.nan, np.float32)

    def graph(p):
        p.tables_on_device = 1
        second = (ctypes.c_void_p * 5)(None, lens2.ctypes.data, None, None, None)
        return fa.GPU.fa_test_gpu_tables_graph(ctypes.byref(p), second, o1.ptr, lse1.ctypes.data)

    status, t2, lse2 = prob.run("gpu", call=graph)
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.last_detail('gpu')}"
    first = prob.run("gpu")
    prob.lens = lens2
    second = prob.run("gpu")
    for name, got, want in (("o, first launch", o1.values(), first[1]["o"].values()),
                            ("lse, first launch", lse1.astype(np.float64), first[2]),
                            ("o, second launch", t2["o"].values(), second[1]["o"].values()),
                            ("lse, second launch", lse2, second[2])):
        assert np.array_equal(got, want, equal_nan=True), f"{name} differs from the direct call"
    assert not np.array_equal(first[2], second[2], equal_nan=True), "the lengths changed nothing"


case("gpu_paged_device_tables_graph", _device_tables_graph, 4, 16, 64)
case("gpu_paged_device_tables_graph_prefill", _device_tables_graph, 40, 64, 16)
case("gpu_paged_device_tables_graph_prefill_gathered", _device_tables_graph, 40, 16, 64)


def _device_tables_bad(mutate, bad_seq, prefill_page=0, decode_page=0):
    """tables_on_device with a bad entry or length in sequence bad_seq: no
    fault, that sequence's O and LSE all NaN, the others' bits those of the
    valid tables, and the cache written only where the valid tables' append
    wrote (never past the cache). A decode step over pages of 8 keys (the
    general kernel's page walk) or of decode_page keys (64: whole key tiles,
    the _pages kernel), or a prefill chunk of 20 queries over pages of
    prefill_page keys (64: the FA3 kernel reads them in place; 16: gathered
    first); 384 keys a sequence at most with either page size given (a
    decode step over pages of 16: whole slices, the _slices kernel)."""
    need_gpu()
    if prefill_page or decode_page:
        if prefill_page:
            _need_fa3()
        prob = PagedProblem(rng_for("paged_dev_bad_pages"), cache_lens=[100, 200, 300],
                            seqlen_new=20 if prefill_page else 2,
                            page_size=prefill_page or decode_page,
                            max_pages=384 // (prefill_page or decode_page), heads_q=8, heads_kv=2,
                            head_dim=128, dtype="bf16", seqlen_q=20 if prefill_page else 2,
                            causal=True)
    else:
        prob = PagedProblem(rng_for("paged_dev_bad"), cache_lens=[10, 20, 30], seqlen_new=2,
                            page_size=8, max_pages=5, heads_q=8, heads_kv=2, head_dim=128,
                            dtype="bf16", seqlen_q=2, causal=True)
    good = prob.run("gpu")
    assert good[0] == fa.FA_OK, fa.status_name(good[0])

    def bad(p):
        keep = mutate(p)
        p.tables_on_device = 1
        return keep

    status, t, lse = prob.run("gpu", bad)
    assert status == fa.FA_OK, f"{fa.status_name(status)}: {fa.last_detail('gpu')}"
    o, good_o = t["o"].values(), good[1]["o"].values()
    others = [b for b in range(prob.b) if b != bad_seq]
    assert np.isnan(o[bad_seq]).all() and np.isnan(lse[bad_seq]).all(), "the bad sequence's rows"
    assert np.array_equal(o[others], good_o[others]) and \
        np.array_equal(lse[others], good[2][others]), "the other sequences' rows"
    for name in ("k", "v"):
        before = getattr(prob, name + "_cache")
        after, want = t[name].values(), good[1][name].values()
        changed = ~np.all(after == before, axis=-1)
        assert np.array_equal(after[changed], want[changed]), f"{name}: rows the append does not write"
    return f"sequence {bad_seq}: NaN"


def _lens(b, value):
    def mutate(p):
        lens = np.ctypeslib.as_array(ctypes.cast(p.cache_seqlens, ctypes.POINTER(ctypes.c_int32)),
                                     (p.batch,)).copy()
        lens[b] = value
        p.cache_seqlens = lens.ctypes.data
        return lens
    return mutate


for name, mutate, bad_seq in (("page_past_the_cache", _table(1, 1, 10 ** 6), 1),
                              ("negative_page", _table(2, 0, -7), 2),
                              ("page_of_the_append_past_the_cache", _table(0, 1, 99), 0),
                              ("length_past_the_table", _lens(1, 39), 1),
                              ("negative_length", _lens(0, -3), 0)):
    case(f"gpu_paged_device_tables_bad_{name}", _device_tables_bad, mutate, bad_seq)
for prefix, page, kind in (("prefill_bad", 64, "prefill_page"),
                           ("prefill_bad", 16, "prefill_page"),
                           ("bad", 64, "decode_page"),
                           ("bad", 16, "decode_page")):
    suffix = ("" if kind == "prefill_page" and page == 64 else "_gathered" if kind == "prefill_page"
              else "_whole_pages" if page == 64 else "_whole_slices")
    # sequence 0's append (keys 100 - 119, or 100 - 101) starts in entry 100 // page
    for name, mutate, bad_seq in (("page_past_the_cache", _table(1, 1, 10 ** 6), 1),
                                  ("negative_page", _table(2, 0, -7), 2),
                                  ("page_of_the_append_past_the_cache",
                                   _table(0, 100 // page, 99), 0),
                                  ("length_past_the_table", _lens(1, 400), 1),
                                  ("negative_length", _lens(0, -3), 0)):
        case(f"gpu_paged_device_tables_{prefix}_{name}{suffix}", _device_tables_bad, mutate,
             bad_seq, **{kind: page})


@test
def paged_device_tables_refused():
    """tables_on_device where no kernel reads the tables: a prefill chunk
    (seqlen_q > 16) on a GPU without Hopper's FA3 forward and every call on
    the CPU answer FA_ERR_UNSUPPORTED, the flag without a block_table
    FA_ERR_NULL_POINTER, with nothing written."""
    prob = PagedProblem(rng_for("paged_dev_refused"), cache_lens=[10, 20], seqlen_new=2,
                        seqlen_q=17, page_size=8, max_pages=4, dtype="bf16")
    decode = PagedProblem(rng_for("paged_dev_refused"), cache_lens=[10, 20], page_size=8,
                          max_pages=4, dtype="bf16")
    gpu = fa.GPU is not None and fa.GPU.fa_test_gpu_count() > 0
    fa3 = gpu and fa.GPU.fa_test_gpu_cc() == 90
    for pr, backend, mutate, expected in (
            (prob, "gpu" if not fa3 else None, _set(tables_on_device=1), "FA_ERR_UNSUPPORTED"),
            (decode, "fa2", _set(tables_on_device=1), "FA_ERR_UNSUPPORTED"),
            (decode, "fa2", _set(tables_on_device=1, block_table=None, cache_seqlens=None,
                                 k_new=None, v_new=None), "FA_ERR_NULL_POINTER"),
            (decode, "gpu", _set(tables_on_device=1, block_table=None, cache_seqlens=None,
                                 k_new=None, v_new=None), "FA_ERR_NULL_POINTER")):
        if backend is None or (backend == "gpu" and not gpu):
            continue
        status, t, lse = pr.run(backend, mutate)
        assert status == fa.STATUS[expected], f"{backend}: {fa.status_name(status)}, expected {expected}"
        assert np.isnan(t["o"].values()).all() and np.isnan(lse).all(), f"{backend} wrote o or lse"
        assert np.array_equal(t["k"].values(), pr.k_cache), f"{backend} wrote the cache"
    return ("GPU included" + (" (its prefill runs: Hopper)" if fa3 else "")) if gpu \
        else "CPU only (no GPU here)"
