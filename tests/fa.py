"""ctypes binding of the flashattn shared objects and helpers to build problems.

A Problem holds one attention configuration and its random inputs as float64
logical [B, N, H, d] arrays (already rounded to the storage dtype), stores
them in the requested layout, and runs a backend on them: 'fa2' and 'fa1'
(CPU loop orders), 'ref' (flashattn_ref.h) or 'gpu' (flashattn_cuda.cuh;
also 'gpu_fa2' with the Hopper kernel compiled out, 'gpu_fa1', and 'gpu163',
'gpu99' as on devices with 163 or 99 KB of shared memory per block).
"""
import ctypes
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")

FA_OK = 0
STATUS = {
    "FA_OK": 0, "FA_ERR_NULL_POINTER": -1, "FA_ERR_INVALID_SIZE": -2,
    "FA_ERR_INVALID_HEADS": -3, "FA_ERR_INVALID_LAYOUT": -4, "FA_ERR_INVALID_ARGUMENT": -5,
    "FA_ERR_UNSUPPORTED": -6, "FA_ERR_OUT_OF_MEMORY": -7, "FA_ERR_THREAD": -8,
    "FA_ERR_WORKSPACE": -9, "FA_ERR_CUDA": -10,
}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "fp8": 3}
STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "fp8": np.uint8}
POISON = {"f32": np.float32(np.nan), "f16": np.float16(np.nan), "bf16": np.uint16(0x7FC0),
          "fp8": np.uint8(0x7F)}
SCALINGS = {"block": 0, "head": 1, "tensor": 2}
FP8_BLOCK = 128


class Layout(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("head", ctypes.c_int64), ("seq", ctypes.c_int64)]


class Params(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int), ("dtype", ctypes.c_int), ("heads_q", ctypes.c_int),
        ("heads_kv", ctypes.c_int), ("seqlen_q", ctypes.c_int), ("seqlen_k", ctypes.c_int),
        ("head_dim", ctypes.c_int), ("head_dim_v", ctypes.c_int), ("scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("window", ctypes.c_int), ("window_left", ctypes.c_int), ("window_right", ctypes.c_int),
        ("softcap", ctypes.c_float),
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p), ("lse", ctypes.c_void_p),
        ("q_layout", Layout), ("k_layout", Layout), ("v_layout", Layout), ("o_layout", Layout),
        ("dout", ctypes.c_void_p), ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("dout_layout", Layout), ("dq_layout", Layout), ("dk_layout", Layout),
        ("dv_layout", Layout), ("num_splits", ctypes.c_int),
        ("o_dtype", ctypes.c_int), ("fp8_scaling", ctypes.c_int),
        ("q_descale", ctypes.c_void_p), ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p), ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p), ("seqused_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int), ("total_k", ctypes.c_int),
        ("block_table", ctypes.c_void_p), ("max_pages", ctypes.c_int), ("page_size", ctypes.c_int),
        ("num_pages", ctypes.c_int), ("cache_seqlens", ctypes.c_void_p),
        ("tables_on_device", ctypes.c_int), ("k_new", ctypes.c_void_p), ("v_new", ctypes.c_void_p),
        ("k_new_layout", Layout), ("v_new_layout", Layout), ("seqlen_new", ctypes.c_int),
        ("positions", ctypes.c_int), ("q_position", ctypes.c_int),
        ("k_position", ctypes.c_int), ("accumulate_grads", ctypes.c_int),
        ("grads_f32", ctypes.c_int),
    ]


class QuantizeParams(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int), ("heads", ctypes.c_int), ("seqlen", ctypes.c_int),
        ("head_dim", ctypes.c_int), ("dtype", ctypes.c_int), ("x", ctypes.c_void_p),
        ("x_layout", Layout), ("out", ctypes.c_void_p), ("out_layout", Layout),
        ("descale", ctypes.c_void_p), ("scaling", ctypes.c_int), ("hadamard", ctypes.c_int),
        ("hadamard_seed", ctypes.c_uint64), ("pow2_descale", ctypes.c_int),
    ]


class CombineParams(ctypes.Structure):
    _fields_ = [
        ("num_parts", ctypes.c_int), ("batch", ctypes.c_int), ("heads", ctypes.c_int),
        ("seqlen", ctypes.c_int), ("head_dim", ctypes.c_int), ("part_dtype", ctypes.c_int),
        ("o_parts", ctypes.POINTER(ctypes.c_void_p)), ("lse_parts", ctypes.POINTER(ctypes.c_void_p)),
        ("part_layout", Layout), ("dtype", ctypes.c_int), ("o", ctypes.c_void_p),
        ("o_layout", Layout), ("lse", ctypes.c_void_p), ("accumulate", ctypes.c_int),
    ]


class CpuOptions(ctypes.Structure):
    _fields_ = [("num_threads", ctypes.c_int), ("order", ctypes.c_int), ("pool", ctypes.c_void_p),
                ("pack_bytes", ctypes.c_int64)]


def _load(name):
    path = os.path.join(BUILD, name)  # an absolute name is taken as it is
    if not os.path.exists(path):
        return None
    lib = ctypes.CDLL(path)
    lib.fa_status_string.restype = ctypes.c_char_p
    lib.fa_last_error_detail.restype = ctypes.c_char_p
    if hasattr(lib, "fa_test_exp_row"):
        lib.fa_test_exp_row.restype = ctypes.c_float
        lib.fa_test_exp_row.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_float]
    return lib


CPU = _load("libflashattn_test.so")
if CPU is None:
    raise SystemExit("build/libflashattn_test.so is missing: run the tests through `make test`")
CPU_NO_THREADS = _load("libflashattn_nothreads_test.so")  # built with FA_NO_THREADS
CPU_SMALL_TILES = _load("libflashattn_tiles_test.so")  # FA_CPU_BLOCK_M=32, FA_CPU_BLOCK_N=FA_CPU_BWD_BLOCK_N=16
CPU_PORTABLE = _load("libflashattn_portable_test.so")  # FA_CPU_SIMD=0: the portable C kernels
CPU_AVX2 = _load("libflashattn_avx2_test.so")  # FA_CPU_AVX512=0: AVX2 microkernels only
CPU.fa_test_params_size.restype = ctypes.c_size_t
CPU.fa_test_params_offset.restype = ctypes.c_size_t
CPU.fa_test_params_offset.argtypes = [ctypes.c_char_p]
CPU.fa_test_combine_params_size.restype = ctypes.c_size_t
CPU.fa_test_combine_params_offset.restype = ctypes.c_size_t
CPU.fa_test_combine_params_offset.argtypes = [ctypes.c_char_p]
CPU.fa_f32_to_f16.restype = ctypes.c_uint16
CPU.fa_f32_to_f16.argtypes = [ctypes.c_float]
CPU.fa_f32_to_bf16.restype = ctypes.c_uint16
CPU.fa_f32_to_bf16.argtypes = [ctypes.c_float]
CPU.fa_f16_to_f32.restype = ctypes.c_float
CPU.fa_f16_to_f32.argtypes = [ctypes.c_uint16]
CPU.fa_bf16_to_f32.restype = ctypes.c_float
CPU.fa_bf16_to_f32.argtypes = [ctypes.c_uint16]
CPU.fa_e4m3_to_f32.restype = ctypes.c_float
CPU.fa_e4m3_to_f32.argtypes = [ctypes.c_uint8]
CPU.fa_f32_to_e4m3.restype = ctypes.c_uint8
CPU.fa_f32_to_e4m3.argtypes = [ctypes.c_float]
CPU.fa_test_quantize_params_size.restype = ctypes.c_size_t
CPU.fa_test_quantize_params_offset.restype = ctypes.c_size_t
CPU.fa_test_quantize_params_offset.argtypes = [ctypes.c_char_p]


def bf16_bits(x):
    """float -> bf16 bit patterns, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), out)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


def _e4m3_table():
    """The 256 e4m3 values from the format's definition (bias 7, 3 mantissa
    bits, no infinities, S.1111.111 NaN)."""
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)
    e, m = (code >> 3) & 15, code & 7
    mag = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    return np.where((e == 15) & (m == 7), np.nan, sign * mag)


E4M3 = _e4m3_table()
_E4M3_POS = np.nan_to_num(E4M3[:127], nan=np.inf)  # codes 0..126: 0 to 448, increasing


def e4m3_bits(x):
    """float -> e4m3 codes: nearest value, ties to the even code, finite
    values past 448 saturated, NaN as 0x7F. Independent of the C code."""
    x = np.asarray(x, np.float64)
    a = np.minimum(np.abs(np.nan_to_num(x, nan=0.0)), 448.0)
    hi = np.clip(np.searchsorted(_E4M3_POS, a), 0, 126)
    lo = np.maximum(hi - 1, 0)
    dl, dh = a - _E4M3_POS[lo], _E4M3_POS[hi] - a
    code = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    code = code | np.where(np.signbit(x), 0x80, 0)
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint8)


def to_storage(x, dtype):
    """float64 values -> storage array of dtype."""
    if dtype == "bf16":
        return bf16_bits(x)
    if dtype == "fp8":
        return e4m3_bits(x)
    return np.asarray(x).astype(STORAGE[dtype])


def from_storage(s, dtype):
    if dtype == "bf16":
        return bf16_value(s)
    if dtype == "fp8":
        return E4M3[np.asarray(s)]
    return np.asarray(s).astype(np.float64)


def quantize(x, dtype):
    """The float64 value that x has once stored in dtype."""
    return from_storage(to_storage(x, dtype), dtype)


class Tensor:
    """A [B, N, H, d] tensor stored in one of the layouts 'bshd', 'bhsd', 'padded',
    'aligned' (rows padded to a multiple of 8 elements, then 8 more: 16-byte
    rows for any d), 'unaligned' (rows padded by one element: most rows
    start off a 16-byte boundary)."""

    def __init__(self, shape, dtype, layout="bshd", values=None):
        b, n, h, d = shape
        self.dtype = dtype
        if layout == "bshd":
            self.storage = np.empty((b, n, h, d), STORAGE[dtype])
            self.view = self.storage
        elif layout == "bhsd":
            self.storage = np.empty((b, h, n, d), STORAGE[dtype])
            self.view = self.storage.transpose(0, 2, 1, 3)
        elif layout in ("padded", "aligned", "unaligned"):  # every row padded, poisoned
            pad = 1 if layout == "unaligned" else 8 + (-d % 8 if layout == "aligned" else 0)
            self.storage = np.full((b, n, h, d + pad), POISON[dtype], STORAGE[dtype])
            self.view = self.storage[..., :d]
        else:
            raise ValueError(layout)
        if values is None:
            self.view[...] = POISON[dtype]
        else:
            self.view[...] = to_storage(values, dtype)
        item = self.storage.itemsize
        st = self.view.strides
        self.layout = Layout(st[0] // item, st[2] // item, st[1] // item)

    @property
    def ptr(self):
        return self.storage.ctypes.data

    def values(self):
        return from_storage(self.view, self.dtype)


class Problem:
    """One attention configuration with fresh random inputs."""

    def __init__(self, rng, batch=1, heads_q=2, heads_kv=0, seqlen_q=64, seqlen_k=64,
                 head_dim=64, dtype="f32", layout="bshd", causal=False, window=None,
                 softcap=0.0, scale=0.0, amplitude=1.0, num_splits=0, head_dim_v=0,
                 positions=None):
        self.b, self.hq, self.hkv = batch, heads_q, heads_kv or heads_q
        self.nq, self.nk, self.d = seqlen_q, seqlen_k, head_dim
        self.dv_arg, self.dv = head_dim_v, head_dim_v or head_dim
        self.dtype, self.layout = dtype, layout
        self.causal, self.window, self.softcap = causal, window, softcap
        self.scale_arg, self.num_splits = scale, num_splits
        self.positions = positions  # (q_position, k_position) of a chunk pair, or None
        self.scale = scale or 1.0 / np.sqrt(head_dim)
        qs, ks = (batch, seqlen_q, heads_q, head_dim), (batch, seqlen_k, self.hkv, head_dim)
        self.q = quantize(rng.standard_normal(qs) * amplitude, dtype)
        self.k = quantize(rng.standard_normal(ks) * amplitude, dtype)
        self.v = quantize(rng.standard_normal(ks[:3] + (self.dv,)), dtype)
        self.dout = quantize(rng.standard_normal(qs[:3] + (self.dv,)), dtype)

    def reference_args(self):
        shift = None if self.positions is None else self.positions[0] - self.positions[1]
        return dict(scale=self.scale, causal=self.causal, window=self.window,
                    softcap=self.softcap, shift=shift)

    def params(self, tensors):
        p = Params()
        p.dtype = DTYPES[self.dtype]
        p.batch, p.heads_q, p.heads_kv = self.b, self.hq, self.hkv
        p.seqlen_q, p.seqlen_k, p.head_dim, p.head_dim_v = self.nq, self.nk, self.d, self.dv_arg
        p.scale, p.causal, p.softcap = self.scale_arg, int(self.causal), self.softcap
        p.num_splits = self.num_splits
        if self.window is not None:
            p.window, (p.window_left, p.window_right) = 1, self.window
        if self.positions is not None:
            p.positions, (p.q_position, p.k_position) = 1, self.positions
        for name, t in tensors.items():
            if name == "lse":
                p.lse = t.ctypes.data
            else:
                setattr(p, name, t.ptr)
                setattr(p, name + "_layout", t.layout)
        return p

    def _shape(self, name):
        key_side = name in ("k", "v", "dk", "dv")
        return (self.b, self.nk if key_side else self.nq, self.hkv if key_side else self.hq,
                self.dv if name in ("v", "o", "dout", "dv") else self.d)

    def tensor(self, name, values=None):
        return Tensor(self._shape(name), self.dtype, self.layout, values)

    def forward(self, backend="fa2", threads=2):
        """Runs the forward; returns (status, O, LSE) as float64."""
        t = {"q": self.tensor("q", self.q), "k": self.tensor("k", self.k),
             "v": self.tensor("v", self.v), "o": self.tensor("o")}
        t["lse"] = np.full((self.b, self.hq, self.nq), np.nan, np.float32)
        p = self.params(t)
        status = call_forward(backend, p, threads)
        return status, t["o"].values(), t["lse"].astype(np.float64)

    def backward(self, o, lse, backend="fa2", threads=2):
        """Runs the backward from O and LSE; returns (status, dQ, dK, dV)."""
        t = {"q": self.tensor("q", self.q), "k": self.tensor("k", self.k),
             "v": self.tensor("v", self.v), "o": self.tensor("o", o),
             "dout": self.tensor("dout", self.dout), "dq": self.tensor("dq"),
             "dk": self.tensor("dk"), "dv": self.tensor("dv")}
        t["lse"] = np.ascontiguousarray(lse, dtype=np.float32)
        p = self.params(t)
        status = call_backward(backend, p, threads)
        return status, t["dq"].values(), t["dk"].values(), t["dv"].values()


POOL = [None]  # a fa_cpu_pool the CPU backends run on where set (tests of the pool)
PACK_BYTES = [0]  # fa_cpu_options.pack_bytes of the CPU backends (tests of K/V packing)


def _cpu_options(backend, threads):
    return CpuOptions(threads, 1 if backend == "fa1" else 0, POOL[0], PACK_BYTES[0])


def call_forward(backend, p, threads=2):
    if backend == "ref":
        return CPU.fa_ref_forward(ctypes.byref(p))
    if backend == "gpu":
        return GPU.fa_test_gpu_forward(ctypes.byref(p))
    if backend == "gpu_fa1":
        return GPU_FA1.fa_test_gpu_forward(ctypes.byref(p))
    if backend == "gpu_fa2":
        return GPU_FA2.fa_test_gpu_forward(ctypes.byref(p))
    if backend in GPU_CAPPED:
        return GPU_CAPPED[backend].fa_test_gpu_forward(ctypes.byref(p))
    return CPU.fa_cpu_forward(ctypes.byref(p), ctypes.byref(_cpu_options(backend, threads)))


def call_backward(backend, p, threads=2):
    if backend == "ref":
        return CPU.fa_ref_backward(ctypes.byref(p))
    if backend in ("gpu", "gpu_det"):
        return GPU.fa_test_gpu_backward(ctypes.byref(p), int(backend == "gpu_det"))
    if backend in ("gpu_fa2", "gpu_fa2_det"):
        return GPU_FA2.fa_test_gpu_backward(ctypes.byref(p), int(backend == "gpu_fa2_det"))
    if backend.removesuffix("_det") in GPU_CAPPED:
        return GPU_CAPPED[backend.removesuffix("_det")].fa_test_gpu_backward(
            ctypes.byref(p), int(backend.endswith("_det")))
    return CPU.fa_cpu_backward(ctypes.byref(p), ctypes.byref(_cpu_options(backend, threads)))


def last_detail(backend):
    """The last error detail of the library that ran `backend` (this thread's)."""
    base = backend.removesuffix("_det")
    lib = {"gpu": GPU, "gpu_fa1": GPU_FA1, "gpu_fa2": GPU_FA2}.get(base) or GPU_CAPPED.get(base)
    return (lib or CPU).fa_last_error_detail().decode()


def combine(backend, o_parts, lse_parts, dtype, part_dtype, layout="bshd", in_place=False,
            threads=2):
    """Merges parts (float64 [B, N, H, d] values, LSE [B, H, N]) with
    fa_cpu_combine ('cpu') or fa_cuda_combine ('gpu'); o_parts are stored in
    part_dtype and the layout, o in dtype (in_place: o is part 0's storage).
    Returns (status, O, LSE) as float64."""
    b, n, h, d = o_parts[0].shape
    parts = [Tensor((b, n, h, d), part_dtype, layout, x) for x in o_parts]
    lses = [np.ascontiguousarray(x, np.float32) for x in lse_parts]
    o = parts[0] if in_place else Tensor((b, n, h, d), dtype, layout)
    lse = np.full((b, h, n), np.nan, np.float32)
    c = CombineParams()
    c.num_parts, c.batch, c.heads, c.seqlen, c.head_dim = len(parts), b, h, n, d
    c.part_dtype, c.dtype = DTYPES[part_dtype], DTYPES[dtype]
    ptrs = (ctypes.c_void_p * len(parts))(*[t.ptr for t in parts])
    lptrs = (ctypes.c_void_p * len(parts))(*[x.ctypes.data for x in lses])
    c.o_parts = ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p))
    c.lse_parts = ctypes.cast(lptrs, ctypes.POINTER(ctypes.c_void_p))
    c.part_layout, c.o, c.o_layout, c.lse = parts[0].layout, o.ptr, o.layout, lse.ctypes.data
    if backend == "cpu":
        status = CPU.fa_cpu_combine(ctypes.byref(c), ctypes.byref(CpuOptions(threads, 0)))
    else:
        status = GPU.fa_test_gpu_combine(ctypes.byref(c))
    return status, o.values(), lse.astype(np.float64)


def rel_err(x, ref):
    """‖x − ref‖ / ‖ref‖ over finite reference entries; NaN anywhere in x fails."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    if np.isnan(x).any():
        return np.inf
    denom = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (denom if denom > 0 else 1.0)


def status_name(code):
    for name, value in STATUS.items():
        if value == code:
            return name
    return str(code)


# GPU shims, built by `make test` only where a GPU is present: the default
# build (FA3 on Hopper, FA2 elsewhere), FA2 forced (FA_SM90=0), FA1, and FA2
# as on devices that allow 163 KB (compute capability 8.0) or 99 KB (8.6,
# 8.9) of shared memory per block.
def load_gpu(name):
    """A build of tests/shim_cuda.cu (in build/, or an absolute path), or None."""
    lib = _load(name)
    if lib is not None:
        lib.fa_test_gpu_backward_workspace_size.restype = ctypes.c_size_t
        lib.fa_cuda_backward_workspace_size.restype = ctypes.c_size_t
        lib.fa_test_gpu_backward_workspace.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        if hasattr(lib, "fa_test_gpu_forward_workspace"):  # builds before 0.2 lack it (A/B)
            lib.fa_test_gpu_forward_workspace_size.restype = ctypes.c_size_t
            lib.fa_test_gpu_forward_workspace.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        if hasattr(lib, "fa_test_gpu_tables_graph"):  # builds before 0.13 lack it (A/B)
            lib.fa_test_gpu_tables_graph.argtypes = [ctypes.c_void_p] * 4
    return lib


GPU = load_gpu("libflashattn_cuda_test.so")
GPU_FA2 = load_gpu("libflashattn_cuda_fa2_test.so")
GPU_FA1 = load_gpu("libflashattn_cuda_fa1_test.so")
GPU_SMEM163 = load_gpu("libflashattn_cuda_smem163_test.so")
GPU_SMEM99 = load_gpu("libflashattn_cuda_smem99_test.so")
GPU_CAPPED = {"gpu163": GPU_SMEM163, "gpu99": GPU_SMEM99}
