/* flashattn.h - v0.16.0 - exact attention with the FlashAttention algorithms.
   MIT licence and revision history: see the end of this file.

   This header holds the public C API (shared by the CPU and GPU paths) and the
   CPU implementation. The GPU kernels live in flashattn_cuda.cuh, the plain
   three-step reference in flashattn_ref.h.

   DO THIS in exactly one C or C++ file:
       #define FLASHATTN_IMPLEMENTATION
       #include "flashattn.h"
   Everywhere else just include it. Link with -lm, and -pthread unless the
   build defines FA_NO_THREADS.

   QUICK USE
       fa_params p = {0};                  // zero means default everywhere
       p.dtype = FA_DTYPE_F32;
       p.batch = 1; p.heads_q = 8; p.seqlen_q = p.seqlen_k = 1024; p.head_dim = 64;
       p.q = q; p.k = k; p.v = v; p.o = o;   // contiguous [B, N, H, d]
       fa_status s = fa_cpu_forward(&p, NULL);
       if (s != FA_OK) fprintf(stderr, "%s: %s\n", fa_status_string(s), fa_last_error_detail());

   SEMANTICS
     S = scale * Q K^T; with softcap c > 0, S = c * tanh(S / c); masked
     entries are -inf; P = softmax(S) by rows; O = P V; LSE = log(sum exp S)
     per query row (natural log, fp32, contiguous [B, Hq, Nq]).
     Query r and key c, with off = Nk - Nq (masks are aligned bottom-right),
     or off = q_position - k_position with positions set (chunks of a sharded
     sequence):
       causal:          c is masked when c > r + off
       sliding window:  c is masked when c > r + off + window_right (if >= 0)
                                      or c < r + off - window_left  (if >= 0)
     A row with every key masked has O = 0, LSE = -inf, and zero gradients.
     Non-finite input: a row with a NaN or +inf among its allowed scores has
     O = NaN, LSE = NaN, as a plain softmax gives; -inf scores get weight 0
     (all -inf: as if every key were masked).
     GQA/MQA: query head h reads key/value head h / (Hq / Hkv).
     head_dim_v: V, O, dout and dv rows of another head dim than Q and K
     (0: the same; the GPU's limits: flashattn_cuda.cuh).
     num_splits: keys in chunks merged by LSE (0: the library's choice).
     fa_cpu_combine / fa_cuda_combine merge partial results over disjoint
     key ranges by their LSE (fa_combine_params).
     Backward with accumulate_grads adds into dq, dk, dv; grads_f32 makes
     them fp32 (context parallelism: fa_params' comments).
     Varlen: cu_seqlens_q/k give a ragged batch in packed tensors; paged
     K/V (forward): block_table, cache_seqlens and an optional append of
     k_new/v_new. These arrays are in host memory, or with tables_on_device
     in device memory where the GPU reads them in place (varlen: Hopper's
     forward and backward; paged: the decode path, Hopper's prefill); the
     fields' comments in fa_params.
     FP8 (dtype FA_DTYPE_FP8_E4M3, forward): q, k, v are e4m3 elements times
     their descales (fa_fp8_scaling), o is written in o_dtype;
     fa_*_quantize_fp8 makes such inputs (fa_quantize_params).

   LAYOUT
     Every tensor is [batch, seq, heads, head_dim] addressed by element
     strides (fa_layout) with the head dim contiguous; an all-zero layout means
     contiguous BSHD. BHSD is {N*H*d, N*d, d}. Strides are 64-bit; a tensor
     must not overlap itself.

   STATUS
     Every call validates first and returns a fa_status; on a validation
     error no output is touched. fa_status_string() names the code and
     fa_last_error_detail() (per thread) says which field is wrong. The
     library never prints, exits or aborts.

   COMPILE-TIME OPTIONS (define before the implementation)
     FA_NO_THREADS            single-threaded build, no pthreads
     FA_CPU_SIMD              1 = AVX2 + FMA microkernels, 0 = portable C
                              (default 1 where __AVX2__ and __FMA__ are defined)
     FA_CPU_AVX512            1 = the products and exps on AVX-512 (the
                              same bits; default 1 where __AVX512F__ and
                              FA_CPU_SIMD)
     FA_CPU_NEON              1 = the products and exps on arm64's NEON,
                              the rest portable C (default 1 where
                              __aarch64__ and __ARM_NEON)
     FA_CPU_BLOCK_M           query rows per CPU tile      (default 192)
     FA_CPU_BLOCK_M_MASKED    the same, forward with a causal mask or window
                              (default 128)
     FA_CPU_BLOCK_N           key rows per forward tile    (default 128)
     FA_CPU_BWD_BLOCK_N       key rows per backward tile   (default 64)
     FA_CPU_PACK_BYTES        most bytes of K/V (forward) or Q/dO (backward)
                              packed at a time (default 16 MiB; 0: never
                              pack), where fa_cpu_options.pack_bytes is 0
     FA_MALLOC / FA_FREE      allocator hooks (define both or neither)
     FLASHATTN_STATIC         make every function static to the including file

   CPU MEMORY: workspace is O(tiles) per thread for the FA2 order, plus
   O(Nq * d) per thread for the FA1 order (its carried O, m, l state),
   O(B * Hq * Nq) floats for the backward's D = rowsum(dO * O) and
   O(splits * B * Hq * Nq * d) for a split forward's parts, and at most
   FA_CPU_PACK_BYTES (or fa_cpu_options.pack_bytes) for packed K/V or Q/dO. Never
   O(Nq * Nk). The CPU path allocates that through FA_MALLOC per call.
*/
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 16
#define FA_VERSION_PATCH 0

/* Largest head dim any path supports. */
#define FA_MAX_HEAD_DIM 256
/* Longest seqlen_q, seqlen_k (and quantize seqlen) any path takes: 2^31 -
   2^16, so that every tile index and tile end stays in 32 bits. */
#define FA_MAX_SEQLEN 0x7FFF0000
/* Most parts fa_*_combine merges, and most key splits a forward takes. */
#define FA_MAX_PARTS 128

#ifdef FLASHATTN_STATIC
#define FA_API static
#else
#define FA_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One list makes the enum and the message table. */
#define FA_STATUS_LIST(X)                                                              \
    X(FA_OK, 0, "success")                                                             \
    X(FA_ERR_NULL_POINTER, -1, "a required pointer is NULL")                           \
    X(FA_ERR_INVALID_SIZE, -2, "a size is zero, negative or too large")                \
    X(FA_ERR_INVALID_HEADS, -3, "heads_q is not a multiple of heads_kv")               \
    X(FA_ERR_INVALID_LAYOUT, -4, "a tensor layout has negative or overlapping strides") \
    X(FA_ERR_INVALID_ARGUMENT, -5, "an invalid dtype, scale, softcap or option")       \
    X(FA_ERR_UNSUPPORTED, -6, "not supported by this build or device")                 \
    X(FA_ERR_OUT_OF_MEMORY, -7, "an allocation failed")                                \
    X(FA_ERR_THREAD, -8, "a worker thread could not be started")                       \
    X(FA_ERR_WORKSPACE, -9, "the workspace is missing or too small")                   \
    X(FA_ERR_CUDA, -10, "a CUDA runtime call failed")

typedef enum fa_status {
#define FA_I_STATUS_ENUM(name, value, text) name = value,
    FA_STATUS_LIST(FA_I_STATUS_ENUM)
#undef FA_I_STATUS_ENUM
    FA_STATUS_MIN = -10
} fa_status;

typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,
    FA_DTYPE_F16 = 1,
    FA_DTYPE_BF16 = 2,
    FA_DTYPE_FP8_E4M3 = 3, /* q, k, v of the forward (with descales; o in o_dtype) */
    FA_DTYPE_COUNT
} fa_dtype;

/* FP8 descales: a tensor's value is descale * its e4m3 element, with one
   descale per block of FA_FP8_BLOCK rows of a head (the GPU kernel's query
   and key tiles), per head, or per tensor; fp32 arrays, positive and finite:
     FA_FP8_SCALE_BLOCK   [batch, heads, ceil(seqlen / FA_FP8_BLOCK)]
     FA_FP8_SCALE_HEAD    [batch, heads]
     FA_FP8_SCALE_TENSOR  [1] */
#define FA_FP8_BLOCK 128
typedef enum fa_fp8_scaling {
    FA_FP8_SCALE_BLOCK = 0,
    FA_FP8_SCALE_HEAD = 1,
    FA_FP8_SCALE_TENSOR = 2,
    FA_FP8_SCALE_COUNT
} fa_fp8_scaling;

/* Element strides of a [batch, seq, heads, head_dim] tensor; all zero = contiguous BSHD. */
typedef struct fa_layout {
    int64_t batch;
    int64_t head;
    int64_t seq;
} fa_layout;

typedef struct fa_params {
    int batch;            /* first, so that `fa_params p = {0};` is valid C and C++ */
    fa_dtype dtype;       /* storage of q, k, v, o, dout, dq, dk, dv; fp32 accumulation */
    int heads_q;
    int heads_kv;         /* 0 = heads_q; heads_q % heads_kv == 0 (GQA, MQA) */
    int seqlen_q;
    int seqlen_k;
    int head_dim;         /* of q and k */
    int head_dim_v;       /* of v, o, dout and dv; 0 = head_dim */
    float scale;          /* 0 = 1/sqrt(head_dim) */
    int causal;           /* nonzero: causal mask, bottom-right aligned */
    int window;           /* nonzero: sliding window of window_left/right keys */
    int window_left;      /* with window: keys before the diagonal; negative = unbounded */
    int window_right;     /* with window: keys after the diagonal; negative = unbounded */
    float softcap;        /* 0 = off; c > 0: S = c * tanh(S / c) */

    const void *q;
    const void *k;
    const void *v;
    void *o;              /* forward output, backward input */
    float *lse;           /* [B, Hq, Nq]; optional in forward (NULL), required in backward */
    fa_layout q_layout, k_layout, v_layout, o_layout;

    /* backward only */
    const void *dout;
    void *dq;
    void *dk;
    void *dv;
    fa_layout dout_layout, dq_layout, dk_layout, dv_layout;

    /* forward: the keys of each query block in num_splits chunks, merged by
       LSE (split-KV). 0 = the library's choice; 1 = no split; n <= FA_MAX_PARTS */
    int num_splits;

    /* FP8 forward (dtype FA_DTYPE_FP8_E4M3): q, k, v in e4m3 with their
       descales at fp8_scaling's granularity (FA_FP8_SCALE_*); o in o_dtype */
    fa_dtype o_dtype;     /* FP8: FA_DTYPE_BF16 (0: the default) or F16; else 0 or dtype */
    fa_fp8_scaling fp8_scaling;
    const float *q_descale;
    const float *k_descale;
    const float *v_descale;

    /* Ragged batches (varlen; CPU and GPU): with cu_seqlens_q and cu_seqlens_k
       set (B + 1 int32 offsets each, host memory, non-decreasing), q, o, dout
       and dq are packed [total_q, Hq, d] and k, v, dk, dv [total_k, Hkv, d]:
       sequence b owns rows cu[b] .. cu[b + 1] - 1 (layouts' batch strides are
       not used); seqlen_q and seqlen_k bound every sequence's length; masks
       align bottom-right per sequence; lse is [Hq, total_q]. seqused_k
       (optional): the keys sequence b attends, at most its span (a cache
       longer than its content). Empty sequences are allowed. total_q,
       total_k: the packed tensors' rows; 0 means cu_seqlens_q[B] and
       cu_seqlens_k[B] (host offsets), else the offsets must stay within.
       tables_on_device (GPU, Hopper's FA3 kernels: the forward without a
       forced split; the atomic-mode backward without accumulate_grads or
       grads_f32, at the head dims it runs on FA3, all but d <= 32 and
       129 .. 160; else FA_ERR_UNSUPPORTED): the three arrays in device
       memory, read by the kernels alone (no host copy, no wait; a CUDA
       graph's replays read them as they are then); total_q and total_k
       required (at least 1).
       Nothing checks them on the host: the kernels read and write only
       rows below the totals. A sequence whose offsets are past a total
       or its bound, or whose seqused_k is past its span, gets NaN in its
       rows (O and LSE; dQ, and dK and dV of its key span). From the first
       sequence whose query offsets (backward: or key offsets) are out of
       order or past the totals on, nothing is written: its rows could
       overlap another's. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    const int32_t *seqused_k;
    int total_q, total_k;

    /* Paged K/V cache (forward): with block_table set, k and v are
       caches of num_pages pages, [num_pages, page_size, Hkv, d] (k_layout,
       v_layout: the batch stride steps from page to page), and key c of
       sequence b is row c % page_size of page block_table[b * max_pages +
       c / page_size]. cache_seqlens[b] keys are cached; k_new and v_new
       (optional, [B, seqlen_new, Hkv, d] in dtype) are first written into the
       pages at rows cache_seqlens[b] .. + seqlen_new - 1, then attended with
       the rest: sequence b has cache_seqlens[b] + seqlen_new keys, at most
       seqlen_k. Host arrays (the GPU copies them into its workspace); every
       page entry those keys use must be in 0 .. num_pages - 1 (else
       FA_ERR_INVALID_ARGUMENT, nothing written).
       tables_on_device (GPU: seqlen_q <= 16, and on Hopper longer query
       chunks of 16-bit K/V, read in place by the FA3 forward at power-of-two
       pages of 32 keys and up at d <= 128, else gathered first into the
       workspace: batch x min(seqlen_k, max_pages x page_size) rows of K and
       V; else FA_ERR_UNSUPPORTED; varlen's offsets: above): block_table and
       cache_seqlens in device memory,
       read by the kernels alone, so the call neither copies nor waits on the host and may be
       captured in a CUDA graph whose replays read the tables' contents at
       the time. Nothing checks them on the host: the kernels never touch
       memory outside the cache, and a sequence whose length or page
       entries are out of range gets O and LSE rows of NaN, its append not
       written (for a bad entry: the rows that fall on it). */
    const int32_t *block_table;
    int max_pages;        /* block_table entries per sequence */
    int page_size;        /* keys per page */
    int num_pages;
    const int32_t *cache_seqlens;
    int tables_on_device;
    const void *k_new;
    const void *v_new;
    fa_layout k_new_layout, v_new_layout;
    int seqlen_new;

    /* A chunk pair of a sharded sequence (context parallelism): with
       positions nonzero, query row r stands at position q_position + r and
       key c at k_position + c of the whole sequence (both >= 0), and the
       masks compare those positions, so each call on a pair of chunks masks
       as one call on the whole sequence would; a row that sees no key of the
       chunk gets O = 0, LSE = -inf, which fa_*_combine skips. Not with
       varlen or paged K/V. Zero: bottom-right alignment, which
       fa_params_resolve writes as the positions max(0, seqlen_k - seqlen_q)
       and max(0, seqlen_q - seqlen_k). */
    int positions;
    int q_position, k_position;

    /* Backward: with accumulate_grads nonzero, dQ, dK and dV are added to
       what dq, dk and dv hold instead of replacing it (a ring's steps, each
       given the whole sequence's o and lse); with grads_f32 nonzero, dq, dk
       and dv are fp32 tensors whatever dtype is (a ring's accumulators). */
    int accumulate_grads;
    int grads_f32;
} fa_params;

/* Quantization to e4m3 for the FP8 forward (fa_cpu_quantize_fp8,
   fa_cuda_quantize_fp8): per block (fa_fp8_scaling) descale = amax / 448 (1
   for an all-zero block) and out = RNE(x / descale), saturated to +-448.
   With pow2_descale, each descale is instead the power of two at or above
   amax / 448 (as OCP's MX formats scale): the codes then span [224, 448]
   at a block's largest instead of 448, and the FP8 forward, given such V
   descales, keeps O in one scale across key blocks (fewer rescales).
   With hadamard, each row is first rotated by x -> H diag(s) x / sqrt(d)
   (H the Walsh-Hadamard matrix, s random signs from hadamard_seed, the same
   for every head and row): an orthogonal map, so Q and K rotated with the
   same seed keep Q K^T while outliers spread over the row (incoherent
   processing, FlashAttention-3 section 3.3). V is quantized without it. */
typedef struct fa_quantize_params {
    int batch, heads, seqlen, head_dim; /* head_dim a power of two with hadamard */
    fa_dtype dtype;                     /* of x: F32, F16 or BF16 */
    const void *x;
    fa_layout x_layout;
    void *out;                          /* e4m3, [B, N, H, d] in out_layout */
    fa_layout out_layout;
    float *descale;                     /* written, shaped as fp8_scaling says */
    fa_fp8_scaling scaling;
    int hadamard;
    uint64_t hadamard_seed;
    int pow2_descale; /* nonzero: descales rounded up to powers of two */
} fa_quantize_params;

/* Partial results of one attention problem over disjoint key ranges (from
   split-KV, cascade attention over a shared prefix, or ranks of a context
   parallel ring), merged by fa_cpu_combine / fa_cuda_combine: per query row
     LSE = log sum_i exp(LSE_i),  O = sum_i exp(LSE_i - LSE) O_i
   where O_i is part i's output (normalized over its own keys) and LSE_i its
   log-sum-exp; a part with LSE_i = -inf saw no key and contributes nothing
   (its O_i is not read); rows whose parts are all empty get O = 0, LSE = -inf.
   o may be o_parts[0] itself when both have the same dtype and layout, and
   lse may be lse_parts[0]. With accumulate, o and lse already hold a result
   (an earlier merge's, or a first part's) that counts as one more part: a
   running merge as a ring's steps arrive, o kept in fp32 while the parts
   come in 16 bits; o is then none of the parts, and lse is required. */
typedef struct fa_combine_params {
    int num_parts;                 /* 1 .. FA_MAX_PARTS */
    int batch, heads, seqlen, head_dim; /* rows [batch, seqlen, heads] of head_dim */
    fa_dtype part_dtype;           /* of the O parts: F32, F16 or BF16 */
    const void *const *o_parts;    /* num_parts pointers, each [B, N, H, d] in part_layout */
    const float *const *lse_parts; /* num_parts pointers, each [B, H, N] contiguous */
    fa_layout part_layout;         /* all zero: contiguous BSHD */
    fa_dtype dtype;                /* of o */
    void *o;
    fa_layout o_layout;
    float *lse;                    /* optional: [B, H, N] (required with accumulate) */
    int accumulate;                /* nonzero: merge the parts into o and lse */
} fa_combine_params;

typedef enum fa_pass { FA_PASS_FORWARD = 0, FA_PASS_BACKWARD = 1 } fa_pass;

#ifdef __CUDACC__
#define FA_HOST_DEVICE __host__ __device__
#else
#define FA_HOST_DEVICE
#endif

/* The default mask alignment as positions: the last query at the last key
   (also per sequence of a paged cache, in the decode kernel). */
static inline FA_HOST_DEVICE void fa_i_bottom_right(fa_params *p)
{
    p->q_position = p->seqlen_k > p->seqlen_q ? p->seqlen_k - p->seqlen_q : 0;
    p->k_position = p->seqlen_q > p->seqlen_k ? p->seqlen_q - p->seqlen_k : 0;
}

/* Query row r stands at key position r + fa_i_diag_shift(p) (p resolved:
   its positions hold the bottom-right default). */
static inline FA_HOST_DEVICE int64_t fa_i_diag_shift(const fa_params *p)
{
    return (int64_t)p->q_position - p->k_position;
}

/* The mask as one interval: query row r may see keys [*lo, *hi) (empty when
   *lo >= *hi). Shared by every path, CPU and GPU. p must be resolved. */
static inline FA_HOST_DEVICE void fa_i_key_range(const fa_params *p, int r, int *lo, int *hi)
{
    /* r + fa_i_diag_shift(p), from the two 32-bit fields as written: other
       forms (a select, 64-bit positions) made the FA2 forward at d = 128 on
       sm_80 and the FA3 forward at d = 256 spill */
    const int64_t diag = (int64_t)r + p->q_position - p->k_position;
    int64_t a = 0, b = p->seqlen_k;
    if (p->causal && diag + 1 < b) b = diag + 1;
    if (p->window && p->window_right >= 0 && diag + p->window_right + 1 < b)
        b = diag + p->window_right + 1;
    if (p->window && p->window_left >= 0 && diag - p->window_left > a) a = diag - p->window_left;
    if (a > p->seqlen_k) a = p->seqlen_k;
    if (b < a) b = a;
    *lo = (int)a;
    *hi = (int)b;
}

/* Every key that query rows [r0, r1) may see lies in [*lo, *hi): key ranges
   grow with the row, so these are the first row's start and the last's end. */
static inline FA_HOST_DEVICE void fa_i_rows_key_span(const fa_params *p, int r0, int r1, int *lo,
                                                     int *hi)
{
    int unused;
    fa_i_key_range(p, r0, lo, &unused);
    fa_i_key_range(p, r1 - 1, &unused, hi);
}

/* The keys [*lo, *hi) that every query row of [r0, r1) sees (empty when
   *lo >= *hi): the last row's start to the first row's end. A key tile inside
   needs no mask. */
static inline FA_HOST_DEVICE void fa_i_rows_common_keys(const fa_params *p, int r0, int r1,
                                                        int *lo, int *hi)
{
    int unused;
    fa_i_key_range(p, r1 - 1, lo, &unused);
    fa_i_key_range(p, r0, &unused, hi);
}

/* The query rows that may see keys [c0, c1), 0 <= c0 < c1 <= seqlen_k:
   [*first, *last] (empty when first > last), the first row whose range ends
   after c0 to the last whose range starts before c1. In closed form from
   fa_i_key_range: a row's range ends at min(diag + 1 + e, Nk), e the mask's
   reach right of the diagonal (0 causal, window_right, or none), or at its
   start where that is later; it starts at diag - window_left (clamped to
   [0, Nk]) or 0. */
static inline FA_HOST_DEVICE void fa_i_rows_seeing_keys(const fa_params *p, int c0, int c1,
                                                        int *first, int *last)
{
    const int64_t off = fa_i_diag_shift(p), nq = p->seqlen_q;
    const int has_left = p->window && p->window_left >= 0;
    int64_t e = -1, f = nq, l = nq; /* e < 0: no bound on the right */
    if (p->window && p->window_right >= 0) e = p->window_right;
    if (p->causal) e = 0;
    if (c0 < p->seqlen_k) {
        const int64_t start_passes = (int64_t)c0 + p->window_left - off + 1;
        f = e < 0 ? 0 : c0 - off - e; /* the end passes c0 ... */
        if (has_left && start_passes < f) f = start_passes; /* ... or the start does */
    }
    if (has_left) l = (int64_t)c1 + p->window_left - off; /* first row starting at c1 or later */
    *first = (int)(f < 0 ? 0 : f > nq ? nq : f);
    *last = (int)(l < 0 ? 0 : l > nq ? nq : l) - 1;
}

/* How much of the tile rows [r0, r1) x keys [c0, c1) is visible:
   0 none, 1 some (needs masking), 2 all. */
static inline FA_HOST_DEVICE int fa_i_tile_visibility(const fa_params *p, int r0, int r1, int c0,
                                                      int c1)
{
    int lo_first, hi_first, lo_last, hi_last;
    fa_i_key_range(p, r0, &lo_first, &hi_first);
    fa_i_key_range(p, r1 - 1, &lo_last, &hi_last);
    if (hi_last <= c0 || lo_first >= c1) return 0;
    return lo_last <= c0 && hi_first >= c1 ? 2 : 1;
}

/* Sign j (+1 or -1) of the randomized Hadamard transform of this seed
   (splitmix64 of seed and j), the same on the CPU and the GPU. */
static inline FA_HOST_DEVICE float fa_i_hadamard_sign(uint64_t seed, int j)
{
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(j + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return ((z ^ (z >> 31)) & 1) ? -1.0f : 1.0f;
}

/* A group's descale from its amax (fa_quantize_params): amax / 448, or
   with pow2 the power of two at or above it (2^-126 at least); 1 for an
   all-zero group. The same bits on the CPU and the GPU. */
static inline FA_HOST_DEVICE float fa_i_fp8_descale(float amax, int pow2)
{
    union {
        float f;
        uint32_t u;
    } d;
    if (!(amax > 0.0f)) return 1.0f;
    d.f = amax / 448.0f;
    if (pow2) {
        if (d.u < 0x00800000u) d.u = 0x00800000u; /* subnormal: 2^-126 */
        if (d.u & 0x007fffffu) d.u = (d.u & 0x7f800000u) + 0x00800000u;
    }
    return d.f;
}

/* Where the descale of row `row` of (b, h) sits in an array of the
   scaling's shape (fa_fp8_scaling). */
static inline FA_HOST_DEVICE int64_t fa_i_descale_index(fa_fp8_scaling scaling, int b, int h,
                                                        int heads, int seqlen, int row)
{
    if (scaling == FA_FP8_SCALE_TENSOR) return 0;
    if (scaling == FA_FP8_SCALE_HEAD) return (int64_t)b * heads + h;
    return ((int64_t)b * heads + h) * ((seqlen + FA_FP8_BLOCK - 1) / FA_FP8_BLOCK) +
           row / FA_FP8_BLOCK;
}

typedef enum fa_cpu_order {
    FA_CPU_ORDER_FA2 = 0, /* query blocks outer, deferred normalization (default) */
    FA_CPU_ORDER_FA1 = 1  /* key/value blocks outer, O/m/l state carried (FlashAttention 1) */
} fa_cpu_order;

/* A set of worker threads created once and reused by every call given it
   (fa_cpu_options.pool), so that small calls pay no thread start-up. A pool
   runs one call at a time; calls from other threads wait their turn. */
typedef struct fa_cpu_pool fa_cpu_pool;

typedef struct fa_cpu_options {
    int num_threads;      /* 0 = 1; ignored with FA_NO_THREADS, and where pool is set */
    fa_cpu_order order;   /* forward loop order */
    fa_cpu_pool *pool;    /* optional: run on this pool's threads (and the caller's) */
    int64_t pack_bytes;   /* most bytes of packed K/V (forward) or Q/dO (backward)
                             held at a time (0: FA_CPU_PACK_BYTES; negative: never) */
} fa_cpu_options;

/* Most threads a call uses (more asked for: this many) or a pool holds,
   the caller's included. */
#define FA_MAX_THREADS 64

FA_API const char *fa_status_string(fa_status status);
/* Detail of the last error on the calling thread ("" when none). */
FA_API const char *fa_last_error_detail(void);
FA_API size_t fa_dtype_size(fa_dtype dtype);

/* Validates p for the given pass and writes the resolved copy (defaults
   filled in: heads_kv, scale, layouts, the bottom-right positions) to
   *resolved, which may be NULL. A resolved copy whose sizes change must be
   resolved again. */
FA_API fa_status fa_params_resolve(const fa_params *p, fa_pass pass, fa_params *resolved);

/* Allowed keys of query row r are [*lo, *hi); empty when *lo >= *hi. p resolved. */
FA_API void fa_key_range(const fa_params *p, int r, int *lo, int *hi);

/* Storage conversions (round to nearest even). */
FA_API float fa_f16_to_f32(uint16_t h);
FA_API uint16_t fa_f32_to_f16(float f);
FA_API float fa_bf16_to_f32(uint16_t h);
FA_API uint16_t fa_f32_to_bf16(float f);
/* e4m3 (the "fn" variant: no infinities, 0x7F and 0xFF NaN, max 448);
   fa_f32_to_e4m3 saturates finite values past 448 and keeps NaN. */
FA_API float fa_e4m3_to_f32(uint8_t x);
FA_API uint8_t fa_f32_to_e4m3(float f);

/* CPU path. opt may be NULL. Forward writes o (and lse if not NULL);
   backward reads q, k, v, o, lse, dout and writes dq, dk, dv. */
FA_API fa_status fa_cpu_forward(const fa_params *p, const fa_cpu_options *opt);
FA_API fa_status fa_cpu_backward(const fa_params *p, const fa_cpu_options *opt);
/* A pool of num_threads threads in all (1 .. FA_MAX_THREADS; the calling
   thread is one of them): *pool is set on FA_OK. With FA_NO_THREADS a pool
   runs everything on the caller. */
FA_API fa_status fa_cpu_pool_create(int num_threads, fa_cpu_pool **pool);
/* Joins the pool's threads and frees it (NULL: nothing); no call may be
   using it. */
FA_API void fa_cpu_pool_destroy(fa_cpu_pool *pool);
/* Quantizes x to e4m3 with descales (fa_quantize_params); host pointers. */
FA_API fa_status fa_cpu_quantize_fp8(const fa_quantize_params *p, const fa_cpu_options *opt);
/* Validates p (layouts filled in) into *resolved (may be NULL). */
FA_API fa_status fa_quantize_resolve(const fa_quantize_params *p, fa_quantize_params *resolved);
/* Merges partial results (fa_combine_params); host pointers. */
FA_API fa_status fa_cpu_combine(const fa_combine_params *p, const fa_cpu_options *opt);
/* Validates p and writes the resolved copy (layouts filled in) to *resolved
   (may be NULL). */
FA_API fa_status fa_combine_resolve(const fa_combine_params *p, fa_combine_params *resolved);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */

/* ======================================================================== */
#ifdef FLASHATTN_IMPLEMENTATION
#ifndef FLASHATTN_IMPLEMENTATION_DONE
#define FLASHATTN_IMPLEMENTATION_DONE

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#if defined(FA_MALLOC) != defined(FA_FREE)
#error "flashattn: define both FA_MALLOC and FA_FREE, or neither"
#endif
#ifndef FA_MALLOC
#include <stdlib.h>
#define FA_MALLOC(size) malloc(size)
#define FA_FREE(ptr) free(ptr)
#endif

#ifndef FA_CPU_BLOCK_M
#define FA_CPU_BLOCK_M 192
#endif
#ifndef FA_CPU_BLOCK_N
#define FA_CPU_BLOCK_N 128
#endif
#ifndef FA_CPU_BWD_BLOCK_N
#define FA_CPU_BWD_BLOCK_N 64
#endif
#ifndef FA_CPU_BLOCK_M_MASKED
#define FA_CPU_BLOCK_M_MASKED (FA_CPU_BLOCK_M < 128 ? FA_CPU_BLOCK_M : 128)
#endif
#ifndef FA_CPU_PACK_BYTES /* small enough for the C library's heap to keep between calls: glibc maps
                             (and the kernel zeroes) fresh pages for every request above its
                             adaptive mmap threshold, which stops at 32 MiB */
#define FA_CPU_PACK_BYTES (16 << 20)
#endif
#if FA_CPU_BLOCK_M < 4 || FA_CPU_BLOCK_M > 512 || FA_CPU_BLOCK_M % 4 != 0 || \
    FA_CPU_BLOCK_M_MASKED < 4 || FA_CPU_BLOCK_M_MASKED > FA_CPU_BLOCK_M ||    \
    FA_CPU_BLOCK_M_MASKED % 4 != 0
#error "flashattn: FA_CPU_BLOCK_M a multiple of 4 in [4, 512], FA_CPU_BLOCK_M_MASKED one up to it"
#endif
#if FA_CPU_BLOCK_N < 4 || FA_CPU_BLOCK_N > 512 || FA_CPU_BLOCK_N % 4 != 0 || \
    FA_CPU_BWD_BLOCK_N < 4 || FA_CPU_BWD_BLOCK_N > 512 || FA_CPU_BWD_BLOCK_N % 4 != 0
#error "flashattn: FA_CPU_BLOCK_N and FA_CPU_BWD_BLOCK_N must be multiples of 4 in [4, 512]"
#endif

#ifndef FA_NO_THREADS
#include <pthread.h>
#endif

/* The CPU path's SIMD kernels: 1 where the compiler targets AVX2 and FMA
   (-march=native, or -mavx2 -mfma), else 0, the portable C kernels. With
   them, FA_CPU_AVX512 1 (where the compiler targets AVX-512F) runs the
   products on AVX-512 microkernels and the softmax's exps 16 lanes wide;
   the rest stays AVX2. */
#ifndef FA_CPU_SIMD
#if defined(__AVX2__) && defined(__FMA__)
#define FA_CPU_SIMD 1
#else
#define FA_CPU_SIMD 0
#endif
#endif
#ifndef FA_CPU_AVX512
#if FA_CPU_SIMD && defined(__AVX512F__)
#define FA_CPU_AVX512 1
#else
#define FA_CPU_AVX512 0
#endif
#endif
#if FA_CPU_AVX512 && (!FA_CPU_SIMD || !defined(__AVX512F__))
#error "flashattn: FA_CPU_AVX512 1 needs FA_CPU_SIMD and AVX-512F (-mavx512f, or -march=native)"
#endif
#ifndef FA_CPU_NEON
#if !FA_CPU_SIMD && defined(__aarch64__) && defined(__ARM_NEON)
#define FA_CPU_NEON 1
#else
#define FA_CPU_NEON 0
#endif
#endif
#if FA_CPU_NEON && (FA_CPU_SIMD || !defined(__aarch64__) || !defined(__ARM_NEON))
#error "flashattn: FA_CPU_NEON 1 needs an arm64 target with NEON, and FA_CPU_SIMD 0"
#endif
/* The products on register-blocked microkernels over tiles padded to 16
   floats a row (x86's SIMD or NEON), else on the portable C kernels. */
#define FA_I_UKERNELS (FA_CPU_SIMD || FA_CPU_NEON)
#if FA_I_UKERNELS && (FA_CPU_BLOCK_N % 16 != 0 || FA_CPU_BWD_BLOCK_N % 16 != 0)
#error "flashattn: with FA_CPU_SIMD or FA_CPU_NEON, FA_CPU_BLOCK_N, FA_CPU_BWD_BLOCK_N multiples of 16"
#endif
#if FA_CPU_SIMD
#if !defined(__AVX2__) || !defined(__FMA__)
#error "flashattn: FA_CPU_SIMD 1 needs AVX2 and FMA (-mavx2 -mfma, or -march=native)"
#endif
#include <immintrin.h>
#endif
#if FA_CPU_NEON
#include <arm_neon.h>
#endif

#ifdef __cplusplus
#define FA_RESTRICT __restrict
#else
#define FA_RESTRICT restrict
#endif

#if defined(_MSC_VER)
#define FA_THREAD_LOCAL __declspec(thread)
#elif defined(__GNUC__) || defined(__clang__)
#define FA_THREAD_LOCAL __thread
#else
#define FA_THREAD_LOCAL /* no thread-local storage: the detail string is shared */
#endif

#define FA_I_LOG2E 1.4426950408889634f
#define FA_I_LN2 0.6931471805599453f

static FA_THREAD_LOCAL char fa_i_detail[256];

#ifdef __cplusplus
extern "C" {
#endif

/* Records the detail string and returns the status, so validation reads
   `return fa_i_fail(FA_ERR_..., "fmt", ...)`. */
static fa_status fa_i_fail(fa_status status, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(fa_i_detail, sizeof fa_i_detail, fmt, args);
    va_end(args);
    return status;
}

FA_API const char *fa_status_string(fa_status status)
{
    switch (status) {
#define FA_I_STATUS_CASE(name, value, text) \
    case name:                              \
        return #name ": " text;
        FA_STATUS_LIST(FA_I_STATUS_CASE)
#undef FA_I_STATUS_CASE
    default:
        return "unknown fa_status";
    }
}

FA_API const char *fa_last_error_detail(void) { return fa_i_detail; }

FA_API size_t fa_dtype_size(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16: return 2;
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_FP8_E4M3: return 1;
    default: return 0;
    }
}

/* ---- conversions ------------------------------------------------------- */

static float fa_i_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t fa_i_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

FA_API float fa_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return fa_i_bits_to_f32(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24 is exact in fp32 */
        float f = (float)mantissa * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    return fa_i_bits_to_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

FA_API uint16_t fa_f32_to_f16(float f)
{
    uint32_t u = fa_i_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x47800000u) /* >= 65536, inf or nan */
        return (uint16_t)(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (u < 0x38800000u) { /* below 2^-14: the fp32 adder rounds to the subnormal grid */
        float a = fa_i_bits_to_f32(u) + 0.5f;
        return (uint16_t)(sign | (fa_i_f32_to_bits(a) - 0x3f000000u));
    }
    u += 0xc8000fffu + ((u >> 13) & 1u); /* rebias exponent, round to nearest even */
    return (uint16_t)(sign | (u >> 13));
}

FA_API float fa_bf16_to_f32(uint16_t h) { return fa_i_bits_to_f32((uint32_t)h << 16); }

FA_API uint16_t fa_f32_to_bf16(float f)
{
    uint32_t u = fa_i_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

FA_API float fa_e4m3_to_f32(uint8_t x)
{
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, e = (x >> 3) & 15u, m = x & 7u;
    if (e == 15 && m == 7) return fa_i_bits_to_f32(0x7fc00000u | sign);
    if (e == 0) { /* zero or subnormal: m * 2^-9 */
        const float f = (float)m * (1.0f / 512.0f);
        return sign ? -f : f;
    }
    return fa_i_bits_to_f32(sign | ((e + 120u) << 23) | (m << 20));
}

FA_API uint8_t fa_f32_to_e4m3(float f)
{
    uint32_t u = fa_i_f32_to_bits(f);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    float a;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return (uint8_t)(sign | 0x7f); /* NaN */
    a = fa_i_bits_to_f32(u);
    if (a < 0.015625f) /* below 2^-6: the subnormal grid of 2^-9, codes 0..8 */
        return (uint8_t)(sign | (uint8_t)rintf(a * 512.0f));
    u += 0x7ffffu + ((u >> 20) & 1u); /* round the mantissa to 3 bits, to nearest even */
    if (u >= 0x43f00000u) return (uint8_t)(sign | 0x7e); /* 480 and past: saturate to 448 */
    return (uint8_t)(sign | (((u >> 23) - 120u) << 3) | ((u >> 20) & 7u));
}

/* dst[i] = mul * src[i] for n elements of a row (8 at a time where SIMD is). */
static void fa_i_load_row(float *FA_RESTRICT dst, const void *base, int64_t offset, int n,
                          fa_dtype dtype, float mul)
{
    int i = 0;
#if FA_CPU_SIMD
    const __m256 m = _mm256_set1_ps(mul);
    if (dtype == FA_DTYPE_F32) {
        const float *src = (const float *)base + offset;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(m, _mm256_loadu_ps(src + i)));
    } else if (dtype == FA_DTYPE_BF16) {
        const uint16_t *src = (const uint16_t *)base + offset;
        for (; i + 8 <= n; i += 8) {
            const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(m, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16))));
        }
    }
#if defined(__F16C__)
    else if (dtype == FA_DTYPE_F16) {
        const uint16_t *src = (const uint16_t *)base + offset;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(m, _mm256_cvtph_ps(_mm_loadu_si128(
                                                          (const __m128i *)(src + i)))));
    }
#endif
#endif
    if (dtype == FA_DTYPE_F32) {
        const float *src = (const float *)base + offset;
        for (; i < n; ++i) dst[i] = mul * src[i];
    } else if (dtype == FA_DTYPE_F16) {
        const uint16_t *src = (const uint16_t *)base + offset;
        for (; i < n; ++i) dst[i] = mul * fa_f16_to_f32(src[i]);
    } else if (dtype == FA_DTYPE_FP8_E4M3) {
        const uint8_t *src = (const uint8_t *)base + offset;
        for (; i < n; ++i) dst[i] = mul * fa_e4m3_to_f32(src[i]);
    } else {
        const uint16_t *src = (const uint16_t *)base + offset;
        for (; i < n; ++i) dst[i] = mul * fa_i_bits_to_f32((uint32_t)src[i] << 16);
    }
}

static void fa_i_store_row(void *base, int64_t offset, const float *src, int n, fa_dtype dtype,
                           float mul)
{
    int i;
    if (dtype == FA_DTYPE_F32) {
        float *dst = (float *)base + offset;
        for (i = 0; i < n; ++i) dst[i] = mul * src[i];
    } else if (dtype == FA_DTYPE_F16) {
        uint16_t *dst = (uint16_t *)base + offset;
        for (i = 0; i < n; ++i) dst[i] = fa_f32_to_f16(mul * src[i]);
    } else {
        uint16_t *dst = (uint16_t *)base + offset;
        for (i = 0; i < n; ++i) dst[i] = fa_f32_to_bf16(mul * src[i]);
    }
}

/* ---- validation -------------------------------------------------------- */

static int64_t fa_i_offset(const fa_layout *l, int b, int h, int s)
{
    return (int64_t)b * l->batch + (int64_t)h * l->head + (int64_t)s * l->seq;
}

/* Fills an all-zero layout with contiguous BSHD and checks that the
   (b, s, h) -> offset map cannot make two rows of head_dim elements overlap:
   sorted by stride, each stride must exceed the span of the smaller ones. */
static fa_status fa_i_check_layout(fa_layout *l, const char *name, int batch, int seq, int heads,
                                   int d)
{
    int64_t stride[3], extent[3], span = d;
    int i, j, n = 0;
    if (l->batch == 0 && l->head == 0 && l->seq == 0) {
        if ((int64_t)heads * d > (INT64_MAX / 4) / seq / batch)
            return fa_i_fail(FA_ERR_INVALID_SIZE,
                             "%s: %d x %d x %d x %d elements overflow 64-bit offsets", name, batch,
                             seq, heads, d);
        l->head = d;
        l->seq = (int64_t)heads * d;
        l->batch = (int64_t)seq * heads * d;
    }
    if (l->batch < 0 || l->head < 0 || l->seq < 0)
        return fa_i_fail(FA_ERR_INVALID_LAYOUT, "%s: negative stride", name);
    if (batch > 1) { stride[n] = l->batch; extent[n++] = batch; }
    if (heads > 1) { stride[n] = l->head; extent[n++] = heads; }
    if (seq > 1) { stride[n] = l->seq; extent[n++] = seq; }
    for (i = 1; i < n; ++i) /* insertion sort of at most three */
        for (j = i; j > 0 && stride[j] < stride[j - 1]; --j) {
            int64_t ts = stride[j], te = extent[j];
            stride[j] = stride[j - 1]; extent[j] = extent[j - 1];
            stride[j - 1] = ts; extent[j - 1] = te;
        }
    for (i = 0; i < n; ++i) {
        if (stride[i] < span)
            return fa_i_fail(FA_ERR_INVALID_LAYOUT,
                             "%s: stride %lld makes rows overlap (needs >= %lld)", name,
                             (long long)stride[i], (long long)span);
        if (stride[i] > (INT64_MAX / 4) / extent[i])
            return fa_i_fail(FA_ERR_INVALID_LAYOUT, "%s: stride %lld overflows 64-bit offsets",
                             name, (long long)stride[i]);
        span += (extent[i] - 1) * stride[i];
    }
    return FA_OK;
}

/* Every layout of p the pass reads or writes (fa_i_check_layout), batch
   sequences each; with_kv 0 leaves K's and V's (a paged cache's, checked as
   pages). */
static fa_status fa_i_check_layouts(fa_params *p, fa_pass pass, int batch, int with_kv)
{
    fa_status s;
#define FA_I_CHECK(field, seq, heads, dim)                                                   \
    if ((s = fa_i_check_layout(&p->field, #field, batch, p->seq, p->heads, p->dim)) != FA_OK) \
        return s;
    FA_I_CHECK(q_layout, seqlen_q, heads_q, head_dim)
    if (with_kv) {
        FA_I_CHECK(k_layout, seqlen_k, heads_kv, head_dim)
        FA_I_CHECK(v_layout, seqlen_k, heads_kv, head_dim_v)
    }
    FA_I_CHECK(o_layout, seqlen_q, heads_q, head_dim_v)
    if (pass == FA_PASS_BACKWARD) {
        FA_I_CHECK(dout_layout, seqlen_q, heads_q, head_dim_v)
        FA_I_CHECK(dq_layout, seqlen_q, heads_q, head_dim)
        FA_I_CHECK(dk_layout, seqlen_k, heads_kv, head_dim)
        FA_I_CHECK(dv_layout, seqlen_k, heads_kv, head_dim_v)
    }
#undef FA_I_CHECK
    return FA_OK;
}

/* Storage of dq, dk, dv. */
static fa_dtype fa_i_grad_dtype(const fa_params *p)
{
    return p->grads_f32 ? FA_DTYPE_F32 : p->dtype;
}

/* The bytes [lo, hi) a tensor's elements lie in (layout resolved). */
typedef struct fa_i_span {
    const char *name;
    uintptr_t lo, hi;
} fa_i_span;

static fa_i_span fa_i_span_of(const char *name, const void *ptr, const fa_layout *l, int batch,
                              int seq, int heads, int d, fa_dtype dtype)
{
    fa_i_span s;
    s.name = name;
    s.lo = (uintptr_t)ptr;
    s.hi = s.lo + (uintptr_t)(((int64_t)(batch - 1) * l->batch + (int64_t)(heads - 1) * l->head +
                               (int64_t)(seq - 1) * l->seq + d) *
                              (int64_t)fa_dtype_size(dtype));
    return s;
}

/* Aliasing rule: no output may overlap an input or another output (an
   output over an input would be read after it was written: FA_ERR_INVALID_LAYOUT);
   nor may a GPU call's workspace (ws_bytes at ws, 0: none) overlap either. */
static fa_status fa_i_check_aliasing(const fa_params *p, fa_pass pass, const void *ws,
                                     size_t ws_bytes)
{
    const int b = p->batch, nq = p->seqlen_q, nk = p->seqlen_k, hq = p->heads_q, hk = p->heads_kv;
    const int d = p->head_dim, dv = p->head_dim_v;
    const int64_t lse_bytes = (int64_t)b * hq * nq * 4;
    const fa_dtype gt = fa_i_grad_dtype(p);
    fa_i_span in[8], out[4];
    int ni = 0, no = 0, i, j;
    /* a paged cache spans its pages (and takes k_new, v_new in) */
    const int kb = p->block_table ? p->num_pages : b, kn = p->block_table ? p->page_size : nk;
    in[ni++] = fa_i_span_of("q", p->q, &p->q_layout, b, nq, hq, d, p->dtype);
    in[ni++] = fa_i_span_of("k", p->k, &p->k_layout, kb, kn, hk, d, p->dtype);
    in[ni++] = fa_i_span_of("v", p->v, &p->v_layout, kb, kn, hk, dv, p->dtype);
    if (p->block_table && p->seqlen_new > 0) {
        in[ni++] = fa_i_span_of("k_new", p->k_new, &p->k_new_layout, b, p->seqlen_new, hk, d, p->dtype);
        in[ni++] = fa_i_span_of("v_new", p->v_new, &p->v_new_layout, b, p->seqlen_new, hk, dv, p->dtype);
    }
    if (pass == FA_PASS_FORWARD) {
        out[no++] = fa_i_span_of("o", p->o, &p->o_layout, b, nq, hq, dv, p->o_dtype);
        if (p->lse) {
            out[no].name = "lse", out[no].lo = (uintptr_t)p->lse;
            out[no].hi = out[no].lo + (uintptr_t)lse_bytes, ++no;
        }
    } else {
        in[ni++] = fa_i_span_of("o", p->o, &p->o_layout, b, nq, hq, dv, p->dtype);
        in[ni++] = fa_i_span_of("dout", p->dout, &p->dout_layout, b, nq, hq, dv, p->dtype);
        in[ni].name = "lse", in[ni].lo = (uintptr_t)p->lse;
        in[ni].hi = in[ni].lo + (uintptr_t)lse_bytes, ++ni;
        out[no++] = fa_i_span_of("dq", p->dq, &p->dq_layout, b, nq, hq, d, gt);
        out[no++] = fa_i_span_of("dk", p->dk, &p->dk_layout, b, nk, hk, d, gt);
        out[no++] = fa_i_span_of("dv", p->dv, &p->dv_layout, b, nk, hk, dv, gt);
    }
    if (ws_bytes) {
        out[no].name = "the workspace", out[no].lo = (uintptr_t)ws;
        out[no].hi = out[no].lo + (uintptr_t)ws_bytes, ++no;
    }
    for (i = 0; i < no; ++i) {
        for (j = 0; j < ni; ++j)
            if (out[i].lo < in[j].hi && in[j].lo < out[i].hi)
                return fa_i_fail(FA_ERR_INVALID_LAYOUT, "%s overlaps %s", out[i].name, in[j].name);
        for (j = 0; j < i; ++j)
            if (out[i].lo < out[j].hi && out[j].lo < out[i].hi)
                return fa_i_fail(FA_ERR_INVALID_LAYOUT, "%s overlaps %s", out[i].name, out[j].name);
    }
    return FA_OK;
}

FA_API fa_status fa_params_resolve(const fa_params *p, fa_pass pass, fa_params *resolved)
{
    fa_params r;
    fa_status s;
    fa_i_detail[0] = '\0';
    if (!p) return fa_i_fail(FA_ERR_NULL_POINTER, "params is NULL");
    r = *p;
    if (pass != FA_PASS_FORWARD && pass != FA_PASS_BACKWARD)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "pass %d is not a fa_pass", (int)pass);
    if ((int)r.dtype < 0 || r.dtype >= FA_DTYPE_COUNT)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "dtype %d is not a fa_dtype", (int)r.dtype);
    if (r.dtype == FA_DTYPE_FP8_E4M3) {
        if (pass == FA_PASS_BACKWARD)
            return fa_i_fail(FA_ERR_UNSUPPORTED, "dtype fp8 e4m3 is forward only");
        if (r.o_dtype == FA_DTYPE_F32) r.o_dtype = FA_DTYPE_BF16;
        if (r.o_dtype != FA_DTYPE_BF16 && r.o_dtype != FA_DTYPE_F16)
            return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "o_dtype %d: fp8 writes o in bf16 or f16",
                             (int)r.o_dtype);
        if ((int)r.fp8_scaling < 0 || r.fp8_scaling >= FA_FP8_SCALE_COUNT)
            return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "fp8_scaling %d is not a fa_fp8_scaling",
                             (int)r.fp8_scaling);
        if (!r.q_descale || !r.k_descale || !r.v_descale)
            return fa_i_fail(FA_ERR_NULL_POINTER, "fp8 needs q_descale, k_descale and v_descale");
    } else {
        if (r.o_dtype != FA_DTYPE_F32 && r.o_dtype != r.dtype)
            return fa_i_fail(FA_ERR_INVALID_ARGUMENT,
                             "o_dtype %d: only fp8 writes o in another dtype than its inputs",
                             (int)r.o_dtype);
        r.o_dtype = r.dtype;
    }
    if (r.batch <= 0 || r.heads_q <= 0 || r.heads_kv < 0 || r.seqlen_q <= 0 || r.seqlen_k <= 0 ||
        r.head_dim <= 0)
        return fa_i_fail(FA_ERR_INVALID_SIZE,
                         "batch %d, heads_q %d, heads_kv %d, seqlen_q %d, seqlen_k %d, "
                         "head_dim %d: each must be positive (heads_kv may be 0)",
                         r.batch, r.heads_q, r.heads_kv, r.seqlen_q, r.seqlen_k, r.head_dim);
    if (r.head_dim_v == 0) r.head_dim_v = r.head_dim;
    if (r.head_dim_v < 0)
        return fa_i_fail(FA_ERR_INVALID_SIZE, "head_dim_v %d is negative", r.head_dim_v);
    if (r.head_dim > FA_MAX_HEAD_DIM || r.head_dim_v > FA_MAX_HEAD_DIM)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "head_dim %d, head_dim_v %d: each must be <= %d",
                         r.head_dim, r.head_dim_v, FA_MAX_HEAD_DIM);
    if (r.seqlen_q > FA_MAX_SEQLEN || r.seqlen_k > FA_MAX_SEQLEN)
        return fa_i_fail(FA_ERR_INVALID_SIZE, "%s %d > FA_MAX_SEQLEN (%d)",
                         r.seqlen_q > FA_MAX_SEQLEN ? "seqlen_q" : "seqlen_k",
                         r.seqlen_q > FA_MAX_SEQLEN ? r.seqlen_q : r.seqlen_k, FA_MAX_SEQLEN);
    if (r.heads_kv == 0) r.heads_kv = r.heads_q;
    if (r.heads_q % r.heads_kv != 0)
        return fa_i_fail(FA_ERR_INVALID_HEADS, "heads_q %d %% heads_kv %d != 0", r.heads_q,
                         r.heads_kv);
    if (!(r.scale >= 0.0f) || isinf(r.scale))
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "scale must be finite and >= 0");
    if (r.scale == 0.0f) r.scale = 1.0f / sqrtf((float)r.head_dim);
    if (!(r.softcap >= 0.0f) || isinf(r.softcap))
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "softcap must be finite and >= 0");
    /* The kernels scale Q by scale / softcap (and by 1 / softcap in the
       backward): a float, or every score would be NaN. */
    if (r.softcap > 0.0f && (r.softcap < FLT_MIN || (double)r.scale / r.softcap > FLT_MAX / 2))
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT,
                         "softcap %g: below FLT_MIN or scale / softcap past FLT_MAX / 2", r.softcap);
    if (r.num_splits < 0 || r.num_splits > FA_MAX_PARTS)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "num_splits %d is not in 0 .. %d", r.num_splits,
                         FA_MAX_PARTS);
    if (!r.q || !r.k || !r.v || !r.o)
        return fa_i_fail(FA_ERR_NULL_POINTER, "q, k, v and o are required");
    if (pass == FA_PASS_BACKWARD && (!r.lse || !r.dout || !r.dq || !r.dk || !r.dv))
        return fa_i_fail(FA_ERR_NULL_POINTER, "backward needs lse, dout, dq, dk and dv");
    if (!r.cu_seqlens_q != !r.cu_seqlens_k || (r.seqused_k && !r.cu_seqlens_k))
        return fa_i_fail(FA_ERR_NULL_POINTER,
                         "varlen needs both cu_seqlens_q and cu_seqlens_k (seqused_k with them)");
    if (r.cu_seqlens_q && r.dtype == FA_DTYPE_FP8_E4M3)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "varlen takes no fp8 inputs");
    if (r.block_table) {
        if (pass == FA_PASS_BACKWARD || r.cu_seqlens_q || r.dtype == FA_DTYPE_FP8_E4M3)
            return fa_i_fail(FA_ERR_UNSUPPORTED, "paged K/V: forward only, not varlen or fp8");
        if (!r.cache_seqlens || (r.seqlen_new > 0 && (!r.k_new || !r.v_new)))
            return fa_i_fail(FA_ERR_NULL_POINTER,
                             "paged K/V needs cache_seqlens (and k_new, v_new with seqlen_new)");
        if (r.max_pages <= 0 || r.page_size <= 0 || r.num_pages <= 0 || r.seqlen_new < 0)
            return fa_i_fail(FA_ERR_INVALID_SIZE,
                             "max_pages %d, page_size %d, num_pages %d, seqlen_new %d: pages "
                             "must be positive, seqlen_new not negative",
                             r.max_pages, r.page_size, r.num_pages, r.seqlen_new);
        if ((s = fa_i_check_layout(&r.k_layout, "k_layout", r.num_pages, r.page_size, r.heads_kv,
                                   r.head_dim)) != FA_OK ||
            (s = fa_i_check_layout(&r.v_layout, "v_layout", r.num_pages, r.page_size, r.heads_kv,
                                   r.head_dim_v)) != FA_OK)
            return s;
        if (r.seqlen_new > 0 &&
            ((s = fa_i_check_layout(&r.k_new_layout, "k_new_layout", r.batch, r.seqlen_new,
                                    r.heads_kv, r.head_dim)) != FA_OK ||
             (s = fa_i_check_layout(&r.v_new_layout, "v_new_layout", r.batch, r.seqlen_new,
                                    r.heads_kv, r.head_dim_v)) != FA_OK))
            return s;
    } else if (r.cache_seqlens || r.k_new || r.v_new || (r.tables_on_device && !r.cu_seqlens_q)) {
        return fa_i_fail(FA_ERR_NULL_POINTER, "cache_seqlens, k_new and v_new need a block_table, "
                         "tables_on_device a block_table or cu_seqlens");
    }
    if (r.cu_seqlens_q && (r.total_q < 0 || r.total_k < 0 ||
                           (r.tables_on_device && (r.total_q < 1 || r.total_k < 1))))
        return fa_i_fail(FA_ERR_INVALID_SIZE, "total_q %d, total_k %d: not negative (with "
                         "tables_on_device, at least 1)", r.total_q, r.total_k);
    if (r.positions) {
        if (r.cu_seqlens_q || r.block_table)
            return fa_i_fail(FA_ERR_UNSUPPORTED, "positions: dense problems only, not varlen or paged");
        if (r.q_position < 0 || r.k_position < 0)
            return fa_i_fail(FA_ERR_INVALID_ARGUMENT,
                             "q_position %d, k_position %d: positions are not negative",
                             r.q_position, r.k_position);
    } else {
        fa_i_bottom_right(&r);
    }
    /* varlen: strides checked here for one sequence, and for the packed
       totals where the offsets are read (fa_i_varlen_check); a paged
       cache's K and V above, as pages */
    if ((s = fa_i_check_layouts(&r, pass, r.cu_seqlens_q ? 1 : r.batch, !r.block_table)) != FA_OK)
        return s;
    if (!r.cu_seqlens_q && (s = fa_i_check_aliasing(&r, pass, NULL, 0)) != FA_OK) return s;
    if (resolved) *resolved = r;
    return FA_OK;
}

FA_API void fa_key_range(const fa_params *p, int r, int *lo, int *hi)
{
    fa_i_key_range(p, r, lo, hi);
}

FA_API fa_status fa_combine_resolve(const fa_combine_params *p, fa_combine_params *resolved)
{
    fa_combine_params r;
    fa_status s;
    int i;
    fa_i_detail[0] = '\0';
    if (!p) return fa_i_fail(FA_ERR_NULL_POINTER, "params is NULL");
    r = *p;
    if (r.num_parts < 1 || r.num_parts > FA_MAX_PARTS)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "num_parts %d is not in 1 .. %d", r.num_parts,
                         FA_MAX_PARTS);
    if (r.batch <= 0 || r.heads <= 0 || r.seqlen <= 0 || r.head_dim <= 0)
        return fa_i_fail(FA_ERR_INVALID_SIZE,
                         "batch %d, heads %d, seqlen %d, head_dim %d: each must be positive",
                         r.batch, r.heads, r.seqlen, r.head_dim);
    if ((int)r.dtype < 0 || r.dtype >= FA_DTYPE_FP8_E4M3)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "dtype %d is not f32, f16 or bf16", (int)r.dtype);
    if ((int)r.part_dtype < 0 || r.part_dtype >= FA_DTYPE_FP8_E4M3)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "part_dtype %d is not f32, f16 or bf16",
                         (int)r.part_dtype);
    if (!r.o_parts || !r.lse_parts || !r.o || (r.accumulate && !r.lse))
        return fa_i_fail(FA_ERR_NULL_POINTER,
                         "o_parts, lse_parts and o are required (and lse with accumulate)");
    for (i = 0; i < r.num_parts; ++i) {
        if (!r.o_parts[i] || !r.lse_parts[i])
            return fa_i_fail(FA_ERR_NULL_POINTER, "part %d has a NULL pointer", i);
        if (r.accumulate && (r.o_parts[i] == r.o || r.lse_parts[i] == r.lse))
            return fa_i_fail(FA_ERR_INVALID_ARGUMENT,
                             "accumulate: part %d is o or lse, which count as a part already", i);
    }
    if ((s = fa_i_check_layout(&r.part_layout, "part_layout", r.batch, r.seqlen, r.heads,
                               r.head_dim)) != FA_OK ||
        (s = fa_i_check_layout(&r.o_layout, "o_layout", r.batch, r.seqlen, r.heads, r.head_dim)) !=
            FA_OK)
        return s;
    if (resolved) *resolved = r;
    return FA_OK;
}

/* ---- CPU math kernels ----------------------------------------------------------
   Tiles live in fp32 scratch with rows of FA_I_PAD(n) floats. With
   FA_CPU_SIMD (AVX2 + FMA, on where the compiler targets them) the products
   run on register-blocked microkernels over whole 16-float column blocks,
   so every N a product takes is padded (zeros in the padding) and the
   exps, row maxima and 16-bit loads are vectorized; with FA_CPU_NEON
   (arm64) the products and the exps; without either the portable C
   kernels run (and are the tests' oracle for the SIMD ones). */
#define FA_I_PREFETCH_ROWS 16
#if FA_I_UKERNELS
#define FA_I_PAD(n) (((n) + 15) / 16 * 16)
#else
#define FA_I_PAD(n) (n)
#endif

/* The Cephes exp2f polynomial of f in [-0.5, 0.5] by Horner's rule, into
   poly, with a type's constant (SET1) and multiply-add (FMA): one table of
   coefficients for the scalar, 8- and 16-lane forms. */
#define FA_I_EXP2_POLY(poly, f, SET1, FMA)                     \
    poly = SET1(1.535336188319500e-4f);                        \
    poly = FMA(poly, f, SET1(1.339887440266574e-3f));          \
    poly = FMA(poly, f, SET1(9.618437357674640e-3f));          \
    poly = FMA(poly, f, SET1(5.550332471162809e-2f));          \
    poly = FMA(poly, f, SET1(2.402264791363012e-1f));          \
    poly = FMA(poly, f, SET1(6.931472028550421e-1f));          \
    poly = FMA(poly, f, SET1(1.0f))
#define FA_I_SCALAR(x) (x)
#define FA_I_SCALAR_FMA(a, b, c) ((a) * (b) + (c))

/* 2^x for x <= 0 (exact 0 below -126, including -inf; NaN stays NaN, so
   that a NaN score reaches O). Cephes exp2f polynomial on [-0.5, 0.5]:
   under 1 ulp from exp2 over [-126, 0] (a test measures it), the vector
   form below computing the same operations. */
static float fa_i_exp2(float x)
{
    float xi, f, poly;
    int keep = x >= -126.0f;
    if (x != x) return x;
    x = keep ? x : -126.0f;
    xi = floorf(x + 0.5f);
    f = x - xi;
    FA_I_EXP2_POLY(poly, f, FA_I_SCALAR, FA_I_SCALAR_FMA);
    return keep ? poly * fa_i_bits_to_f32((uint32_t)((int32_t)xi + 127) << 23) : 0.0f;
}

#if FA_CPU_SIMD
static __m256 fa_i_exp2_v(__m256 x)
{
    const __m256 lowest = _mm256_set1_ps(-126.0f);
    const __m256 keep = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ), nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xi, f, poly;
    x = _mm256_max_ps(x, lowest);
    xi = _mm256_floor_ps(_mm256_add_ps(x, _mm256_set1_ps(0.5f)));
    f = _mm256_sub_ps(x, xi);
    FA_I_EXP2_POLY(poly, f, _mm256_set1_ps, _mm256_fmadd_ps);
    poly = _mm256_mul_ps(poly, _mm256_castsi256_ps(_mm256_slli_epi32(
                                   _mm256_add_epi32(_mm256_cvtps_epi32(xi), _mm256_set1_epi32(127)), 23)));
    return _mm256_or_ps(_mm256_and_ps(poly, keep), nan); /* all ones: a NaN */
}

#if FA_CPU_AVX512
/* fa_i_exp2_v on 16 lanes, the same bits: the same polynomial of the same
   f, its product with 2^xi by scalef (one rounding, as the multiply), the
   lanes below -126 zeroed and NaN kept by one mask (not-less-than is true
   for NaN, whose polynomial is NaN). Those lanes need no clamp, as the
   8-lane form's integer 2^xi does: whatever their polynomial, the mask
   decides them. */
static __m512 fa_i_exp2_v16(__m512 x)
{
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    __m512 xi, f, poly;
    xi = _mm512_roundscale_ps(_mm512_add_ps(x, _mm512_set1_ps(0.5f)),
                              _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    f = _mm512_sub_ps(x, xi);
    FA_I_EXP2_POLY(poly, f, _mm512_set1_ps, _mm512_fmadd_ps);
    return _mm512_maskz_scalef_ps(keep, poly, xi);
}
#endif

static float fa_i_hsum(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static float fa_i_hmax(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
#endif /* FA_CPU_SIMD */

#if FA_CPU_NEON
/* fa_i_exp2 on 4 lanes: the same operations (the scalar's floorf(x + 0.5)
   as a rounding toward minus infinity, its 2^xi from the exponent bits). */
static float32x4_t fa_i_exp2_neon(float32x4_t x)
{
    const float32x4_t lowest = vdupq_n_f32(-126.0f);
    const uint32x4_t keep = vcgeq_f32(x, lowest), nan = vmvnq_u32(vceqq_f32(x, x));
    float32x4_t xi, f, poly;
    x = vmaxq_f32(x, lowest);
    xi = vrndmq_f32(vaddq_f32(x, vdupq_n_f32(0.5f)));
    f = vsubq_f32(x, xi);
#define FA_I_NEON_FMA(a, b, c) vfmaq_f32((c), (a), (b))
    FA_I_EXP2_POLY(poly, f, vdupq_n_f32, FA_I_NEON_FMA);
#undef FA_I_NEON_FMA
    poly = vmulq_f32(poly, vreinterpretq_f32_s32(
                               vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(xi), vdupq_n_s32(127)), 23)));
    return vreinterpretq_f32_u32(vorrq_u32(vandq_u32(vreinterpretq_u32_f32(poly), keep), nan));
}
#endif

#if FA_I_UKERNELS

/* C[R][V w] (+)= A[R][K] B[K][V w] (row-major, leading dimensions), w the
   vector width: the R x V w block of C in R V vector registers, K streaming
   past (AVX2: R <= 6, V = 2, 12 of its 16 ymm registers beside B's two and a
   broadcast; AVX-512: R <= 12, V = 2 or 1, 24 of its 32 zmm). Each element
   of C sums its K products in order with one FMA each in both, so the two
   give the same bits. The accumulators are named variables, not an array:
   GCC keeps an array in memory and stores it every step. One macro stamps
   the row counts and widths. NEON: R <= 8, V = 2 (8 floats), 16 of its 32
   registers beside B's two and the 8 A values that GCC loads as scalars
   for its multiply-adds by element (12 rows spilled). */
#if FA_CPU_NEON
#define FA_I_VEC float32x4_t
#define FA_I_VLOAD vld1q_f32
#define FA_I_VSTORE vst1q_f32
#define FA_I_VZERO() vdupq_n_f32(0.0f)
#define FA_I_VFMA(a, b, c) vfmaq_f32((c), (a), (b))
#define FA_I_VBROADCAST(p) vld1q_dup_f32(p)
#define FA_I_VW 4
#define FA_I_UK_MAX_ROWS 8
#elif FA_CPU_AVX512
#define FA_I_VEC __m512
#define FA_I_VLOAD _mm512_loadu_ps
#define FA_I_VSTORE _mm512_storeu_ps
#define FA_I_VZERO _mm512_setzero_ps
#define FA_I_VFMA _mm512_fmadd_ps
#define FA_I_VBROADCAST(p) _mm512_set1_ps(*(p))
#define FA_I_VW 16          /* floats a vector */
#define FA_I_UK_MAX_ROWS 12 /* rows a microkernel holds */
#else
#define FA_I_VEC __m256
#define FA_I_VLOAD _mm256_loadu_ps
#define FA_I_VSTORE _mm256_storeu_ps
#define FA_I_VZERO _mm256_setzero_ps
#define FA_I_VFMA _mm256_fmadd_ps
#define FA_I_VBROADCAST(p) _mm256_broadcast_ss(p)
#define FA_I_VW 8
#define FA_I_UK_MAX_ROWS 6
#endif
#define FA_I_UK_ROWS_1(X, V) X(0, V)
#define FA_I_UK_ROWS_2(X, V) FA_I_UK_ROWS_1(X, V) X(1, V)
#define FA_I_UK_ROWS_3(X, V) FA_I_UK_ROWS_2(X, V) X(2, V)
#define FA_I_UK_ROWS_4(X, V) FA_I_UK_ROWS_3(X, V) X(3, V)
#define FA_I_UK_ROWS_5(X, V) FA_I_UK_ROWS_4(X, V) X(4, V)
#define FA_I_UK_ROWS_6(X, V) FA_I_UK_ROWS_5(X, V) X(5, V)
#define FA_I_UK_ROWS_7(X, V) FA_I_UK_ROWS_6(X, V) X(6, V)
#define FA_I_UK_ROWS_8(X, V) FA_I_UK_ROWS_7(X, V) X(7, V)
#define FA_I_UK_ROWS_9(X, V) FA_I_UK_ROWS_8(X, V) X(8, V)
#define FA_I_UK_ROWS_10(X, V) FA_I_UK_ROWS_9(X, V) X(9, V)
#define FA_I_UK_ROWS_11(X, V) FA_I_UK_ROWS_10(X, V) X(10, V)
#define FA_I_UK_ROWS_12(X, V) FA_I_UK_ROWS_11(X, V) X(11, V)
/* Vector j (< V) of row r: accumulator c<r>_<j>. */
#define FA_I_UK_VECS_1(X, r) X(r, 0)
#define FA_I_UK_VECS_2(X, r) X(r, 0) X(r, 1)
#define FA_I_UK_DECL1(r, j) FA_I_VEC c##r##_##j;
#define FA_I_UK_INIT1(r, j)                                                                     \
    c##r##_##j = accumulate ? FA_I_VLOAD(c + (size_t)(r) * ldc + (j) * FA_I_VW) : FA_I_VZERO();
#define FA_I_UK_FMA1(r, j) c##r##_##j = FA_I_VFMA(x_, b##j, c##r##_##j);
#define FA_I_UK_STORE1(r, j) FA_I_VSTORE(c + (size_t)(r) * ldc + (j) * FA_I_VW, c##r##_##j);
#define FA_I_UK_DECL(r, V) FA_I_UK_VECS_##V(FA_I_UK_DECL1, r)
#define FA_I_UK_INIT(r, V) FA_I_UK_VECS_##V(FA_I_UK_INIT1, r)
#define FA_I_UK_STORE(r, V) FA_I_UK_VECS_##V(FA_I_UK_STORE1, r)
#define FA_I_UK_FMA(r, V)                                                                        \
    {                                                                                            \
        const FA_I_VEC x_ = FA_I_VBROADCAST(a + (size_t)(r) * lda + k);                          \
        FA_I_UK_VECS_##V(FA_I_UK_FMA1, r)                                                        \
    }
#define FA_I_UK_LOADB1(r, j) const FA_I_VEC b##j = FA_I_VLOAD(b + (size_t)k * ldb + (j) * FA_I_VW);
#define FA_I_DEFINE_UKERNEL(R, V)                                                                \
    static void fa_i_ukernel_##R##_##V(float *FA_RESTRICT c, int ldc, const float *FA_RESTRICT a, \
                                       int lda, const float *FA_RESTRICT b, int ldb, int K,      \
                                       int accumulate)                                          \
    {                                                                                            \
        FA_I_UK_ROWS_##R(FA_I_UK_DECL, V) int k;                                                 \
        FA_I_UK_ROWS_##R(FA_I_UK_INIT, V)                                                        \
        for (k = 0; k < K; ++k) {                                                                \
            FA_I_UK_VECS_##V(FA_I_UK_LOADB1, ~)                                                  \
            FA_I_UK_ROWS_##R(FA_I_UK_FMA, V)                                                     \
        }                                                                                        \
        FA_I_UK_ROWS_##R(FA_I_UK_STORE, V)                                                       \
    }
typedef void (*fa_i_ukernel)(float *FA_RESTRICT c, int ldc, const float *FA_RESTRICT a, int lda,
                             const float *FA_RESTRICT b, int ldb, int K, int accumulate);
/* The microkernel table: fa_i_ukernels[V - 1][R - 1] holds R rows of V vectors. */
#define FA_I_UK_AVX2_ROWS(X, V) X(1, V) X(2, V) X(3, V) X(4, V) X(5, V) X(6, V)
#if FA_CPU_AVX512
#define FA_I_UK_ALL_ROWS(X, V) \
    FA_I_UK_AVX2_ROWS(X, V) X(7, V) X(8, V) X(9, V) X(10, V) X(11, V) X(12, V)
#elif FA_CPU_NEON
#define FA_I_UK_ALL_ROWS(X, V) FA_I_UK_AVX2_ROWS(X, V) X(7, V) X(8, V)
#else
#define FA_I_UK_ALL_ROWS(X, V) FA_I_UK_AVX2_ROWS(X, V)
#endif
#define FA_I_UK_STAMP(R, V) FA_I_DEFINE_UKERNEL(R, V)
#define FA_I_UK_ENTRY(R, V) fa_i_ukernel_##R##_##V,
FA_I_UK_ALL_ROWS(FA_I_UK_STAMP, 1)
FA_I_UK_ALL_ROWS(FA_I_UK_STAMP, 2)
static const fa_i_ukernel fa_i_ukernels[2][FA_I_UK_MAX_ROWS] = {
    {FA_I_UK_ALL_ROWS(FA_I_UK_ENTRY, 1)}, {FA_I_UK_ALL_ROWS(FA_I_UK_ENTRY, 2)}};
#undef FA_I_UK_STAMP
#undef FA_I_UK_ENTRY
#undef FA_I_UK_ALL_ROWS
#undef FA_I_UK_AVX2_ROWS
#undef FA_I_DEFINE_UKERNEL
#undef FA_I_UK_LOADB1
#undef FA_I_UK_FMA
#undef FA_I_UK_STORE
#undef FA_I_UK_INIT
#undef FA_I_UK_DECL
#undef FA_I_UK_STORE1
#undef FA_I_UK_FMA1
#undef FA_I_UK_INIT1
#undef FA_I_UK_DECL1
#endif /* FA_I_UKERNELS */

#if !FA_I_UKERNELS
/* fa_i_matmul_<R>: C[R x N] += A[R x K] * B[K x N], row-major with leading
   dimensions, the portable kernel: an R x FA_I_NR block of C in an array
   the compiler may keep in registers while K streams past. */
#define FA_I_NR 32
#define FA_I_DEFINE_MATMUL_ROWS(R)                                                            \
    static void fa_i_matmul_##R(float *FA_RESTRICT c, int ldc, const float *FA_RESTRICT a,     \
                                int lda, const float *FA_RESTRICT b, int ldb, int N, int K)   \
    {                                                                                         \
        int k, n, j, r;                                                                       \
        for (n = 0; n + FA_I_NR <= N; n += FA_I_NR) {                                         \
            float acc[R][FA_I_NR];                                                            \
            for (r = 0; r < R; ++r)                                                           \
                for (j = 0; j < FA_I_NR; ++j) acc[r][j] = c[(size_t)r * ldc + n + j];         \
            for (k = 0; k < K; ++k) {                                                         \
                const float *FA_RESTRICT bk = b + (size_t)k * ldb + n;                        \
                for (r = 0; r < R; ++r) {                                                     \
                    const float x = a[(size_t)r * lda + k];                                   \
                    for (j = 0; j < FA_I_NR; ++j) acc[r][j] += x * bk[j];                     \
                }                                                                             \
            }                                                                                 \
            for (r = 0; r < R; ++r)                                                           \
                for (j = 0; j < FA_I_NR; ++j) c[(size_t)r * ldc + n + j] = acc[r][j];         \
        }                                                                                     \
        for (; n < N; ++n) /* column tail */                                                  \
            for (r = 0; r < R; ++r) {                                                         \
                float sum = c[(size_t)r * ldc + n];                                           \
                for (k = 0; k < K; ++k) sum += a[(size_t)r * lda + k] * b[(size_t)k * ldb + n]; \
                c[(size_t)r * ldc + n] = sum;                                                 \
            }                                                                                 \
    }
FA_I_DEFINE_MATMUL_ROWS(8)
FA_I_DEFINE_MATMUL_ROWS(4)
FA_I_DEFINE_MATMUL_ROWS(1)
#undef FA_I_DEFINE_MATMUL_ROWS
#undef FA_I_NR
#endif /* !FA_I_UKERNELS */

/* C[M x N] (+)= A[M x K] * B[K x N] (accumulate 0: C = A B). SIMD: column
   blocks of C outer (2 vectors wide, a last one of 1 where N leaves 16
   columns; B's block, K x 64 or 128 bytes, stays in L1 while the rows of A
   stream past), microkernels of up to FA_I_UK_MAX_ROWS rows inner; N must
   be a multiple of 16 (FA_I_PAD). Portable: blocks of 8 rows, then 4, then
   single rows. */
static void fa_i_gemm(float *FA_RESTRICT c, int ldc, const float *FA_RESTRICT a, int lda,
                      const float *FA_RESTRICT b, int ldb, int M, int N, int K, int accumulate)
{
    int i, n;
#if FA_I_UKERNELS
    for (n = 0; n < N;) {
        const int vecs = N - n >= 2 * FA_I_VW ? 2 : 1;
        for (i = 0; i < M;) {
            const int rows = M - i < FA_I_UK_MAX_ROWS ? M - i : FA_I_UK_MAX_ROWS;
            fa_i_ukernels[vecs - 1][rows - 1](c + (size_t)i * ldc + n, ldc, a + (size_t)i * lda,
                                              lda, b + n, ldb, K, accumulate);
            i += rows;
        }
        n += vecs * FA_I_VW;
    }
#else
    if (!accumulate)
        for (i = 0; i < M; ++i)
            for (n = 0; n < N; ++n) c[(size_t)i * ldc + n] = 0.0f;
    for (i = 0; i + 8 <= M; i += 8)
        fa_i_matmul_8(c + (size_t)i * ldc, ldc, a + (size_t)i * lda, lda, b, ldb, N, K);
    for (; i + 4 <= M; i += 4)
        fa_i_matmul_4(c + (size_t)i * ldc, ldc, a + (size_t)i * lda, lda, b, ldb, N, K);
    for (; i < M; ++i)
        fa_i_matmul_1(c + (size_t)i * ldc, ldc, a + (size_t)i * lda, lda, b, ldb, N, K);
#endif
}

#if FA_CPU_SIMD
/* An 8 x 8 block of dst[c][r] = src[r][c] in eight ymm registers: pairs of
   rows interleaved, then quadruples, then the 128-bit halves exchanged. */
static void fa_i_transpose_8x8(float *FA_RESTRICT dst, int ldd, const float *FA_RESTRICT src,
                               int lds)
{
    __m256 r[8], t[8];
    int i;
    for (i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (size_t)i * lds);
    for (i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0)); /* column 0 | 4 */
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2)); /* 1 | 5 */
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0)); /* 2 | 6 */
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2)); /* 3 | 7 */
    }
    for (i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + (size_t)i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (size_t)(i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#endif

/* dst[c][r] = src[r][c] for an R x C tile (SIMD: 8 x 8 blocks, then the edges). */
static void fa_i_transpose(float *FA_RESTRICT dst, int ldd, const float *FA_RESTRICT src, int lds,
                           int R, int C)
{
    int r = 0, c;
#if FA_CPU_SIMD
    for (; r + 8 <= R; r += 8) {
        for (c = 0; c + 8 <= C; c += 8)
            fa_i_transpose_8x8(dst + (size_t)c * ldd + r, ldd, src + (size_t)r * lds + c, lds);
        for (; c < C; ++c) {
            int i;
            for (i = r; i < r + 8; ++i) dst[(size_t)c * ldd + i] = src[(size_t)i * lds + c];
        }
    }
#endif
    for (; r < R; ++r)
        for (c = 0; c < C; ++c) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

/* dst[dp][ldd] = src[cols][dp] transposed, the key columns past cols zero. */
static void fa_i_transpose_keys(float *FA_RESTRICT dst, int ldd, const float *FA_RESTRICT src,
                                int dp, int cols)
{
    int i, c;
    fa_i_transpose(dst, ldd, src, dp, cols, dp);
    for (i = 0; i < dp; ++i)
        for (c = cols; c < ldd; ++c) dst[(size_t)i * ldd + c] = 0.0f;
}

/* The FP8 descales of one head's rows: row r's is at[r / FA_FP8_BLOCK] with
   per_block, else at[0]; at NULL (16- and 32-bit storage): 1. */
typedef struct fa_i_descale {
    const float *at;
    int per_block;
} fa_i_descale;

static const fa_i_descale fa_i_no_descale = {NULL, 0};

/* Row r's descale (1 without). */
static float fa_i_descale_at(fa_i_descale ds, int r)
{
    return ds.at ? ds.at[ds.per_block ? r / FA_FP8_BLOCK : 0] : 1.0f;
}

/* The descales of head h of batch b in `all` (q_descale, k_descale or
   v_descale of p, whose tensor has `heads` heads of seqlen rows). */
static fa_i_descale fa_i_descale_of(const fa_params *p, const float *all, int b, int h, int heads,
                                    int seqlen)
{
    fa_i_descale r = fa_i_no_descale;
    if (p->dtype != FA_DTYPE_FP8_E4M3) return r;
    r.at = all + fa_i_descale_index(p->fp8_scaling, b, h, heads, seqlen, 0);
    r.per_block = p->fp8_scaling == FA_FP8_SCALE_BLOCK;
    return r;
}

/* Where a tensor's rows are: dense (table NULL), or in pages of `size`
   rows, row r in page table[r / size] (the layout's batch stride steps
   from page to page). */
typedef struct fa_i_pages {
    const int32_t *table;
    int size;
} fa_i_pages;

static const fa_i_pages fa_i_dense = {NULL, 0};

/* The key rows of p: paged where p has a block table (one sequence's row). */
static fa_i_pages fa_i_pages_of(const fa_params *p)
{
    fa_i_pages pg;
    pg.table = p->block_table;
    pg.size = p->page_size;
    return pg;
}

static int64_t fa_i_row_at(const fa_layout *l, fa_i_pages pg, int b, int h, int r)
{
    if (!pg.table) return fa_i_offset(l, b, h, r);
    return (int64_t)pg.table[r / pg.size] * l->batch + (int64_t)(r % pg.size) * l->seq +
           (int64_t)h * l->head;
}

/* Loads rows [r0, r0 + rows) of one head, scaled by mul and their descales,
   into dst[rows][ld] (d values, then zeros up to ld). */
static void fa_i_load_tile(float *dst, int ld, const void *base, const fa_layout *l, int b,
                           int h, int r0, int rows, int d, fa_dtype dtype, float mul,
                           fa_i_descale ds, fa_i_pages pg)
{
    const int64_t esize = (int64_t)fa_dtype_size(dtype);
    int r, c;
    for (r = 0; r < rows; ++r) {
        float *row = dst + (size_t)r * ld;
        const float row_mul = mul * fa_i_descale_at(ds, r0 + r);
#if FA_CPU_SIMD
        /* Rows of a BSHD tensor sit H * d elements apart, often a page each,
           where the hardware prefetcher stops: fetch a few rows ahead. */
        if (r + FA_I_PREFETCH_ROWS < rows) {
            const char *ahead =
                (const char *)base + fa_i_row_at(l, pg, b, h, r0 + r + FA_I_PREFETCH_ROWS) * esize;
            for (c = 0; c < d * esize; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
        }
#else
        (void)esize;
#endif
        fa_i_load_row(row, base, fa_i_row_at(l, pg, b, h, r0 + r), d, dtype, row_mul);
        for (c = d; c < ld; ++c) row[c] = 0.0f;
    }
}

/* Loads key rows [c0, c0 + cols) transposed into kt[ld rows][FA_CPU_BLOCK_N]
   (head-dim rows past d and key columns past cols as zeros): the rows load
   whole into stage[FA_CPU_BLOCK_N][ld] (contiguous reads, prefetched), then
   one blocked transpose, where a row at a time would scatter each value. */
static void fa_i_load_kt(float *kt, int ld, float *stage, const fa_params *p, int b, int hk,
                         int c0, int cols)
{
    fa_i_load_tile(stage, ld, p->k, &p->k_layout, b, hk, c0, cols, p->head_dim, p->dtype, 1.0f,
                   fa_i_descale_of(p, p->k_descale, b, hk, p->heads_kv, p->seqlen_k),
                   fa_i_pages_of(p));
    fa_i_transpose_keys(kt, FA_CPU_BLOCK_N, stage, ld, cols);
}

/* Turns raw logits of a tile (already scaled) into base-2 scores: softcap,
   then the mask (-inf outside each row's key range). */
static void fa_i_scores(const fa_params *p, float *s, int lds, int r0, int rows, int c0,
                        int cols, int visibility)
{
    int r, c;
    if (p->softcap > 0.0f) {
        const float outer = p->softcap * FA_I_LOG2E;
        for (r = 0; r < rows; ++r)
            for (c = 0; c < cols; ++c) s[(size_t)r * lds + c] = outer * tanhf(s[(size_t)r * lds + c]);
    }
    if (visibility == 2) return;
    for (r = 0; r < rows; ++r) {
        int lo, hi;
        float *row = s + (size_t)r * lds;
        fa_key_range(p, r0 + r, &lo, &hi);
        for (c = 0; c < cols; ++c)
            if (c0 + c < lo || c0 + c >= hi) row[c] = -INFINITY;
    }
}

/* Factor applied to Q at load so that Q K^T is the base-2 score (or, with
   softcap, the argument of tanh). */
static float fa_i_q_multiplier(const fa_params *p)
{
    return p->softcap > 0.0f ? p->scale / p->softcap : p->scale * FA_I_LOG2E;
}

/* Overwrites the base-2 scores of one row with 2^(s - max) and returns their sum. */
static float fa_i_exp_row(float *row, int n, float max)
{
    float sum = 0.0f;
    int c = 0;
#if FA_CPU_SIMD
    /* two sums, of the first and the second 8 columns of every 16: one
       16-lane accumulator with AVX-512, the same bits as two 8-lane ones */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256 m = _mm256_set1_ps(max);
#if FA_CPU_AVX512
    const __m512 m16 = _mm512_set1_ps(max);
    __m512 acc16 = _mm512_setzero_ps();
    for (; c + 16 <= n; c += 16) {
        const __m512 e = fa_i_exp2_v16(_mm512_sub_ps(_mm512_loadu_ps(row + c), m16));
        _mm512_storeu_ps(row + c, e);
        acc16 = _mm512_add_ps(acc16, e);
    }
    acc0 = _mm512_castps512_ps256(acc16);
    acc1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc16), 1));
#endif
    for (; c + 16 <= n; c += 16) {
        const __m256 e0 = fa_i_exp2_v(_mm256_sub_ps(_mm256_loadu_ps(row + c), m));
        const __m256 e1 = fa_i_exp2_v(_mm256_sub_ps(_mm256_loadu_ps(row + c + 8), m));
        _mm256_storeu_ps(row + c, e0);
        _mm256_storeu_ps(row + c + 8, e1);
        acc0 = _mm256_add_ps(acc0, e0);
        acc1 = _mm256_add_ps(acc1, e1);
    }
    for (; c + 8 <= n; c += 8) {
        const __m256 e = fa_i_exp2_v(_mm256_sub_ps(_mm256_loadu_ps(row + c), m));
        _mm256_storeu_ps(row + c, e);
        acc0 = _mm256_add_ps(acc0, e);
    }
    sum = fa_i_hsum(_mm256_add_ps(acc0, acc1));
#elif FA_CPU_NEON
    float32x4_t acc = vdupq_n_f32(0.0f);
    const float32x4_t m = vdupq_n_f32(max);
    for (; c + 4 <= n; c += 4) {
        const float32x4_t e = fa_i_exp2_neon(vsubq_f32(vld1q_f32(row + c), m));
        vst1q_f32(row + c, e);
        acc = vaddq_f32(acc, e);
    }
    sum = vaddvq_f32(acc);
#endif
    for (; c < n; ++c) {
        row[c] = fa_i_exp2(row[c] - max);
        sum += row[c];
    }
    return sum;
}

/* out[i] = 2^(a[i] - b[i]) for i < n (n a multiple of 16 with SIMD): the
   rescale factors of a tile's rows, vector exps where one a row would sit
   on the critical path of its row's update. */
static void fa_i_exp2_diff(float *out, const float *a, const float *b, int n)
{
    int i = 0;
#if FA_CPU_SIMD
#if FA_CPU_AVX512
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, fa_i_exp2_v16(_mm512_sub_ps(_mm512_loadu_ps(a + i),
                                                              _mm512_loadu_ps(b + i))));
#endif
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, fa_i_exp2_v(_mm256_sub_ps(_mm256_loadu_ps(a + i),
                                                            _mm256_loadu_ps(b + i))));
#elif FA_CPU_NEON
    for (; i + 4 <= n; i += 4)
        vst1q_f32(out + i, fa_i_exp2_neon(vsubq_f32(vld1q_f32(a + i), vld1q_f32(b + i))));
#endif
    for (; i < n; ++i) out[i] = fa_i_exp2(a[i] - b[i]);
}

/* The dot product of two rows of n floats (n a multiple of 16 with SIMD). */
static float fa_i_dot(const float *FA_RESTRICT x, const float *FA_RESTRICT y, int n)
{
    float sum = 0.0f;
    int i = 0;
#if FA_CPU_SIMD
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i < n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    sum = fa_i_hsum(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; ++i) sum += x[i] * y[i];
    return sum;
}

static float fa_i_row_max(const float *row, int n, float init)
{
    float m = init;
    int c = 0;
#if FA_CPU_SIMD
    __m256 v = _mm256_set1_ps(init);
#if FA_CPU_AVX512 /* max is exact: any lane order gives the same bits */
    __m512 v16 = _mm512_set1_ps(init);
    for (; c + 16 <= n; c += 16) v16 = _mm512_max_ps(v16, _mm512_loadu_ps(row + c));
    v = _mm256_max_ps(_mm512_castps512_ps256(v16),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v16), 1)));
#endif
    for (; c + 8 <= n; c += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(row + c));
    m = fa_i_hmax(v);
#endif
    for (; c < n; ++c) m = row[c] > m ? row[c] : m;
    return m;
}

/* row[0 .. n) *= x */
static void fa_i_scale_row(float *row, int n, float x)
{
    int c = 0;
#if FA_CPU_SIMD
    const __m256 v = _mm256_set1_ps(x);
#if FA_CPU_AVX512
    const __m512 v16 = _mm512_set1_ps(x);
    for (; c + 16 <= n; c += 16)
        _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_loadu_ps(row + c), v16));
#endif
    for (; c + 8 <= n; c += 8) _mm256_storeu_ps(row + c, _mm256_mul_ps(_mm256_loadu_ps(row + c), v));
#endif
    for (; c < n; ++c) row[c] *= x;
}

/* Several rows against one, x read once: out[i * ld] = q_i . x for the rows
   q_i = q + i * ldq, i < rows, each the sum fa_i_dot forms (the same bits),
   four rows at a time. */
static void fa_i_dots(float *out, int ld, const float *FA_RESTRICT q, int ldq,
                      const float *FA_RESTRICT x, int n, int rows)
{
    int i = 0;
#if FA_CPU_SIMD && FA_CPU_AVX512
    for (; i + 4 <= rows; i += 4) { /* lanes 0-7 and 8-15: fa_i_dot's two accumulators */
        const float *q0 = q + (size_t)i * ldq;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int k, j;
        for (k = 0; k < n; k += 16) {
            const __m512 xk = _mm512_loadu_ps(x + k);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + k), xk, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + ldq + k), xk, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + 2 * (size_t)ldq + k), xk, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + 3 * (size_t)ldq + k), xk, a3);
        }
        for (j = 0; j < 4; ++j) {
            const __m512 a = j == 0 ? a0 : j == 1 ? a1 : j == 2 ? a2 : a3;
            const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
            out[(size_t)(i + j) * ld] = fa_i_hsum(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
        }
    }
#endif
    for (; i < rows; ++i) out[(size_t)i * ld] = fa_i_dot(q + (size_t)i * ldq, x, n);
}

/* y_i[0 .. n) += w[i * ldw] x[0 .. n) for the rows y_i = y + i * ldy, i <
   rows (n a multiple of 16 with SIMD): one multiply-add an element, x read
   once per 16 floats for every row. */
static void fa_i_axpys(float *FA_RESTRICT y, int ldy, const float *w, int ldw,
                       const float *FA_RESTRICT x, int n, int rows)
{
    int i, k = 0;
#if FA_I_UKERNELS /* the microkernels' vectors */
    for (; k + FA_I_VW <= n; k += FA_I_VW) {
        const FA_I_VEC xk = FA_I_VLOAD(x + k);
        for (i = 0; i < rows; ++i) {
            float *yi = y + (size_t)i * ldy + k;
            FA_I_VSTORE(yi, FA_I_VFMA(FA_I_VBROADCAST(w + (size_t)i * ldw), xk, FA_I_VLOAD(yi)));
        }
    }
#endif
    for (; k < n; ++k)
        for (i = 0; i < rows; ++i) y[(size_t)i * ldy + k] += w[(size_t)i * ldw] * x[k];
}

/* ---- a tiny task pool ----------------------------------------------------- */

struct fa_i_job;
typedef void (*fa_i_task_fn)(const struct fa_i_job *job, int task, float *scratch);

typedef struct fa_i_job {
    const fa_params *p;
    const fa_combine_params *combine; /* the combine job's */
    const fa_quantize_params *quantize; /* the quantize job's */
    fa_i_task_fn run;
    int num_tasks;
    size_t scratch_floats;
    float *shared;          /* job-wide buffer (backward's D; split-KV's partial O, then LSE) */
    int splits;             /* forward: key chunks per query block */
    int first_task;         /* task numbers start here (a group of packed pairs) */
    float *packed;          /* K/V tiles (forward), Q/dO tiles (backward) of the (b, kv head)
                               pairs from pair0, or NULL */
    int pair0;
    int next_task;
    float *scratch; /* one slot of scratch_floats (rounded up) per thread */
    int next_slot;
    fa_status status;
#ifndef FA_NO_THREADS
    pthread_mutex_t lock;
#endif
} fa_i_job;

static int fa_i_take_task(fa_i_job *job)
{
    int t;
#ifndef FA_NO_THREADS
    pthread_mutex_lock(&job->lock);
#endif
    t = job->status == FA_OK && job->next_task < job->num_tasks ? job->next_task++ : -1;
#ifndef FA_NO_THREADS
    pthread_mutex_unlock(&job->lock);
#endif
    return t;
}

#ifndef FA_NO_THREADS
static void fa_i_set_status(fa_i_job *job, fa_status s)
{
    pthread_mutex_lock(&job->lock);
    if (job->status == FA_OK) job->status = s;
    pthread_mutex_unlock(&job->lock);
}
#endif

/* A thread's scratch: its slot, whole cache lines, of one allocation made
   before any thread starts (so that a failed one is reported before any
   task runs). */
static size_t fa_i_slot_floats(const fa_i_job *job) { return (job->scratch_floats + 15) / 16 * 16; }

static void *fa_i_worker(void *arg)
{
    fa_i_job *job = (fa_i_job *)arg;
    float *scratch;
    int t;
#ifndef FA_NO_THREADS
    pthread_mutex_lock(&job->lock);
#endif
    scratch = job->scratch + (size_t)job->next_slot++ * fa_i_slot_floats(job);
#ifndef FA_NO_THREADS
    pthread_mutex_unlock(&job->lock);
#endif
    while ((t = fa_i_take_task(job)) >= 0) job->run(job, t, scratch);
    return NULL;
}

struct fa_cpu_pool {
    int workers; /* threads besides the caller's */
#ifndef FA_NO_THREADS
    pthread_t threads[FA_MAX_THREADS];
    pthread_mutex_t lock, call; /* lock: the fields below; call: one job at a time */
    pthread_cond_t wake, done;
    fa_i_job *job;
    unsigned generation; /* counts the jobs handed out */
    int running, quit;   /* workers still on the job; destroy asked */
#endif
};

#ifndef FA_NO_THREADS
static void *fa_i_pool_worker(void *arg)
{
    fa_cpu_pool *pool = (fa_cpu_pool *)arg;
    unsigned seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        fa_i_job *job;
        while (pool->generation == seen && !pool->quit) pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->quit) break;
        seen = pool->generation;
        job = pool->job;
        pthread_mutex_unlock(&pool->lock);
        fa_i_worker(job);
        pthread_mutex_lock(&pool->lock);
        if (--pool->running == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}
#endif

FA_API fa_status fa_cpu_pool_create(int num_threads, fa_cpu_pool **pool)
{
    fa_cpu_pool *x;
    fa_i_detail[0] = '\0';
    if (!pool) return fa_i_fail(FA_ERR_NULL_POINTER, "pool is NULL");
    if (num_threads < 1 || num_threads > FA_MAX_THREADS)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "num_threads %d is not in 1 .. %d", num_threads,
                         FA_MAX_THREADS);
    x = (fa_cpu_pool *)FA_MALLOC(sizeof *x);
    if (!x) return fa_i_fail(FA_ERR_OUT_OF_MEMORY, "a pool of %d threads", num_threads);
    memset(x, 0, sizeof *x);
#ifndef FA_NO_THREADS
    if (pthread_mutex_init(&x->lock, NULL) != 0 || pthread_mutex_init(&x->call, NULL) != 0 ||
        pthread_cond_init(&x->wake, NULL) != 0 || pthread_cond_init(&x->done, NULL) != 0) {
        FA_FREE(x);
        return fa_i_fail(FA_ERR_THREAD, "pthread mutex or condition init failed");
    }
    for (; x->workers < num_threads - 1; ++x->workers)
        if (pthread_create(&x->threads[x->workers], NULL, fa_i_pool_worker, x) != 0) {
            fa_cpu_pool_destroy(x);
            return fa_i_fail(FA_ERR_THREAD, "pthread_create failed");
        }
#endif
    *pool = x;
    return FA_OK;
}

FA_API void fa_cpu_pool_destroy(fa_cpu_pool *pool)
{
#ifndef FA_NO_THREADS
    int i;
#endif
    if (!pool) return;
#ifndef FA_NO_THREADS
    pthread_mutex_lock(&pool->lock);
    pool->quit = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (i = 0; i < pool->workers; ++i) pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->call);
#endif
    FA_FREE(pool);
}

/* Runs every task of the job on o's pool, or on o->num_threads threads
   started for it (the caller's included). */
static fa_status fa_i_run_job(fa_i_job *job, const fa_cpu_options *o)
{
    int threads_used = 1;
#ifndef FA_NO_THREADS
    pthread_t threads[FA_MAX_THREADS];
    int i, started = 0;
    threads_used = o->pool ? o->pool->workers + 1 : o->num_threads;
    if (threads_used > FA_MAX_THREADS) threads_used = FA_MAX_THREADS;
    if (!o->pool && threads_used > job->num_tasks) threads_used = job->num_tasks;
    if (threads_used < 1) threads_used = 1;
#else
    (void)o;
#endif
    job->scratch = (float *)FA_MALLOC((size_t)threads_used * fa_i_slot_floats(job) * sizeof(float));
    if (!job->scratch)
        return fa_i_fail(FA_ERR_OUT_OF_MEMORY, "CPU scratch of %d x %zu floats", threads_used,
                         job->scratch_floats);
    job->next_slot = 0;
#ifndef FA_NO_THREADS
    if (pthread_mutex_init(&job->lock, NULL) != 0) {
        FA_FREE(job->scratch);
        return fa_i_fail(FA_ERR_THREAD, "pthread_mutex_init failed");
    }
    if (o->pool) {
        fa_cpu_pool *pool = o->pool;
        pthread_mutex_lock(&pool->call);
        pthread_mutex_lock(&pool->lock);
        pool->job = job;
        pool->running = pool->workers;
        ++pool->generation;
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->lock);
        fa_i_worker(job);
        pthread_mutex_lock(&pool->lock);
        while (pool->running > 0) pthread_cond_wait(&pool->done, &pool->lock);
        pthread_mutex_unlock(&pool->lock);
        pthread_mutex_unlock(&pool->call);
    } else {
        for (i = 1; i < threads_used; ++i) {
            if (pthread_create(&threads[started], NULL, fa_i_worker, job) != 0) {
                fa_i_set_status(job, FA_ERR_THREAD);
                break;
            }
            ++started;
        }
        fa_i_worker(job);
        for (i = 0; i < started; ++i) pthread_join(threads[i], NULL);
    }
    pthread_mutex_destroy(&job->lock);
#else
    fa_i_worker(job);
#endif
    FA_FREE(job->scratch);
    if (job->status != FA_OK) return fa_i_fail(job->status, "pthread_create failed");
    return FA_OK;
}

static int fa_i_ceil_div(int a, int b) { return (a + b - 1) / b; }

/* Task counts are ints; refuse problems whose tile count would overflow one. */
static fa_status fa_i_task_count(int64_t count, int *out)
{
    if (count > 0x7fffffff) return fa_i_fail(FA_ERR_INVALID_SIZE, "%lld tiles", (long long)count);
    *out = (int)count;
    return FA_OK;
}


/* ---- forward, FA2 order ---------------------------------------------------
   One task per (batch, query head, query block). The block's O accumulator,
   row max m and row sum l stay in scratch while every visible key block
   streams past; O is divided by l once at the end (deferred normalization). */

#define FA_I_BM FA_CPU_BLOCK_M
#define FA_I_BN FA_CPU_BLOCK_N         /* the forward's key tile */
#define FA_I_BWD_BN FA_CPU_BWD_BLOCK_N /* the backward's */
/* Query blocks of at most this many rows (decode) take S from dot products:
   transposing a K tile costs as much as one row's products with it. */
#define FA_I_DOT_ROWS 4

/* The query block a task number names: batch b, query head h (reading
   key/value head hk), rows [r0, r0 + rows). Tasks run over (b, h, block). */
typedef struct fa_i_query_block {
    int b, h, hk, r0, rows;
} fa_i_query_block;

static fa_i_query_block fa_i_query_task(const fa_params *p, int task, int bm)
{
    fa_i_query_block x;
    const int nqb = fa_i_ceil_div(p->seqlen_q, bm);
    x.b = task / (nqb * p->heads_q);
    x.h = (task / nqb) % p->heads_q;
    x.hk = x.h / (p->heads_q / p->heads_kv);
    /* causal: a head's last blocks see the most keys; they go first, so that
       the threads do not wait on one long task at the end */
    x.r0 = (p->causal ? nqb - 1 - task % nqb : task % nqb) * bm;
    x.rows = p->seqlen_q - x.r0 < bm ? p->seqlen_q - x.r0 : bm;
    return x;
}

/* The FA2-order forward's query rows per task: fewer where a mask lets
   tiles be skipped (a smaller block skips more of the keys it cannot see). */
static int fa_i_fwd_rows(const fa_params *p)
{
    return p->causal || p->window ? FA_CPU_BLOCK_M_MASKED : FA_I_BM;
}

/* The partial results of a split forward in job->shared: O of split i at
   i * B * Nq * Hq * d (fp32, contiguous BSHD), then the LSEs, split i at
   splits * B * Nq * Hq * d + i * B * Hq * Nq. */
static size_t fa_i_split_o_floats(const fa_params *p)
{
    return (size_t)p->batch * p->seqlen_q * p->heads_q * p->head_dim_v;
}

/* Packed K/V (FA_CPU_PACK_BYTES): where several query blocks read each K/V
   tile, the forward first converts the tiles of a group of (batch, kv head)
   pairs once into one buffer, K^T as the product takes it and V, tile after
   tile, so that each query block streams them contiguous in fp32 instead of
   gathering, converting and transposing rows that sit a page apart. */
static size_t fa_i_pack_tile_floats(const fa_params *p)
{
    return (size_t)(FA_I_PAD(p->head_dim) + FA_I_PAD(p->head_dim_v)) * FA_I_BN;
}

static size_t fa_i_pack_pair_floats(const fa_params *p)
{
    return (size_t)fa_i_ceil_div(p->seqlen_k, FA_I_BN) * fa_i_pack_tile_floats(p);
}

/* Where packing is worth it and one (batch, kv head) pair's pair_bytes fit
   the cap (fa_cpu_options.pack_bytes, else FA_CPU_PACK_BYTES), *buffer gets
   room for as many pairs as fit and that count is returned; otherwise
   *buffer is NULL and all pairs are one group. */
static int fa_i_pack_group(const fa_cpu_options *o, int worth, uint64_t pair_bytes, int pairs,
                           float **buffer)
{
    const int64_t cap = o->pack_bytes ? o->pack_bytes : (int64_t)FA_CPU_PACK_BYTES;
    int n;
    *buffer = NULL;
    if (!worth || cap <= 0 || pair_bytes > (uint64_t)cap) return pairs;
    n = (uint64_t)cap / pair_bytes < (uint64_t)pairs ? (int)((uint64_t)cap / pair_bytes) : pairs;
    *buffer = (float *)FA_MALLOC((size_t)(pair_bytes * (uint64_t)n));
    return *buffer ? n : pairs;
}

/* Task: K^T and V of key block task % blocks of pair pair0 + task / blocks. */
static void fa_i_pack_kv_task(const fa_i_job *job, int task, float *scratch)
{
    const fa_params *p = job->p;
    const int blocks = fa_i_ceil_div(p->seqlen_k, FA_I_BN), pair = job->pair0 + task / blocks;
    const int b = pair / p->heads_kv, hk = pair % p->heads_kv, c0 = task % blocks * FA_I_BN;
    const int cols = p->seqlen_k - c0 < FA_I_BN ? p->seqlen_k - c0 : FA_I_BN, dp = FA_I_PAD(p->head_dim);
    float *kt = job->packed + (size_t)task * fa_i_pack_tile_floats(p), *v = kt + (size_t)dp * FA_I_BN;
    if (!fa_i_tile_visibility(p, 0, p->seqlen_q, c0, c0 + cols)) return; /* no row sees it */
    fa_i_load_kt(kt, dp, scratch, p, b, hk, c0, cols);
    fa_i_load_tile(v, FA_I_PAD(p->head_dim_v), p->v, &p->v_layout, b, hk, c0, cols, p->head_dim_v,
                   p->dtype, 1.0f, fa_i_descale_of(p, p->v_descale, b, hk, p->heads_kv, p->seqlen_k),
                   fa_i_pages_of(p));
}

/* Whether a row of scores holds a NaN. Its max can miss one (max drops
   NaN); a row with a NaN score gets O = NaN, LSE = NaN, as a plain softmax
   gives (the README's "Non-finite input"). */
static int fa_i_row_has_nan(const float *row, int n)
{
    int c, nan = 0;
    for (c = 0; c < n; ++c) nan |= row[c] != row[c];
    return nan;
}

/* The key range [*c0, *c_end) of split `split` of the key blocks that rows
   with keys [lo, hi) see: the blocks in job->splits near-equal chunks. */
static void fa_i_split_keys(const fa_i_job *job, int split, int lo, int hi, int *c0, int *c_end)
{
    const int first = lo / FA_I_BN, blocks = hi > lo ? fa_i_ceil_div(hi, FA_I_BN) - first : 0;
    const int per = fa_i_ceil_div(blocks, job->splits);
    *c0 = (first + split * per) * FA_I_BN;
    *c_end = (first + (split + 1 < job->splits ? (split + 1) * per : blocks)) * FA_I_BN;
    if (*c_end > hi) *c_end = hi;
}

/* The online softmax over one tile of `rows` rows of base-2 scores
   (s[rows][FA_I_BN], cols of them valid): each row's max m and sum l move
   on, its scores become P = 2^(s - m) and its O row (o[rows][dvp], dv
   values) is rescaled. m_new and alpha: scratch of FA_I_PAD(rows) floats,
   m's padding -inf. */
static void fa_i_softmax_tile(float *s, int rows, int cols, float *m, float *l, float *m_new,
                              float *alpha, float *o, int dvp, int dv)
{
    int r;
    for (r = 0; r < rows; ++r) m_new[r] = fa_i_row_max(s + (size_t)r * FA_I_BN, cols, m[r]);
    fa_i_exp2_diff(alpha, m, m_new, FA_I_PAD(rows));
    for (r = 0; r < rows; ++r) {
        float *srow = s + (size_t)r * FA_I_BN;
        if (m_new[r] == -INFINITY) { /* nothing visible yet in this row */
            if (fa_i_row_has_nan(srow, cols)) l[r] = NAN; /* -inf scores are weight 0 */
            memset(srow, 0, sizeof(float) * cols);
            continue;
        }
        l[r] = l[r] * alpha[r] + fa_i_exp_row(srow, cols, m_new[r]);
        m[r] = m_new[r];
        if (alpha[r] != 1.0f) fa_i_scale_row(o + (size_t)r * dvp, dv, alpha[r]);
    }
}

/* Rows [r0, r0 + rows) of query head h of batch b: O (o[rows][dvp]) divided
   by l and the LSE, into p->o and p->lse, or with splits into the split's
   partial O and LSE. */
static void fa_i_store_rows(const fa_i_job *job, int split, int b, int h, int r0, int rows,
                            const float *o, int dvp, const float *m, const float *l)
{
    const fa_params *p = job->p;
    const int dv = p->head_dim_v;
    int r, c;
    for (r = 0; r < rows; ++r) {
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r]; /* NaN stays NaN */
        const float lse = l[r] == 0.0f ? -INFINITY : (m[r] + log2f(l[r])) * FA_I_LN2;
        const size_t lse_at = ((size_t)b * p->heads_q + h) * p->seqlen_q + r0 + r;
        if (job->splits > 1) { /* O of these keys, normalized, and its LSE */
            float *part = job->shared + split * fa_i_split_o_floats(p);
            float *part_lse = job->shared + job->splits * fa_i_split_o_floats(p) +
                              split * (size_t)p->batch * p->heads_q * p->seqlen_q;
            const size_t row = (((size_t)b * p->seqlen_q + r0 + r) * p->heads_q + h) * dv;
            for (c = 0; c < dv; ++c) part[row + c] = o[(size_t)r * dvp + c] * inv;
            part_lse[lse_at] = lse;
            continue;
        }
        fa_i_store_row(p->o, fa_i_offset(&p->o_layout, b, h, r0 + r), o + (size_t)r * dvp, dv,
                       p->o_dtype, inv);
        if (p->lse) p->lse[lse_at] = lse;
    }
}

static void fa_i_forward_fa2_task(const fa_i_job *job, int task, float *scratch)
{
    const fa_params *p = job->p;
    const int split = (task += job->first_task) % job->splits;
    const fa_i_query_block blk = fa_i_query_task(p, task / job->splits, fa_i_fwd_rows(p));
    const int d = p->head_dim, dp = FA_I_PAD(d), dv = p->head_dim_v, dvp = FA_I_PAD(dv);
    const int b = blk.b, h = blk.h, hk = blk.hk, r0 = blk.r0, rows = blk.rows;
    float *q = scratch, *kt = q + FA_I_BM * dp, *v = kt + (size_t)dp * FA_I_BN;
    float *s = v + (size_t)FA_I_BN * dvp, *o = s + FA_I_BM * FA_I_BN, *m = o + FA_I_BM * dvp;
    float *l = m + FA_I_PAD(FA_I_BM), *m_new = l + FA_I_PAD(FA_I_BM);
    float *alpha = m_new + FA_I_PAD(FA_I_BM), *kstage = alpha + FA_I_PAD(FA_I_BM);
    int lo, hi, c0, c_end, r, c;

    fa_i_load_tile(q, dp, p->q, &p->q_layout, b, h, r0, rows, d, p->dtype, fa_i_q_multiplier(p),
                   fa_i_descale_of(p, p->q_descale, b, h, p->heads_q, p->seqlen_q), fa_i_dense);
    memset(o, 0, sizeof(float) * rows * dvp);
    for (r = 0; r < FA_I_PAD(FA_I_BM); ++r) m[r] = m_new[r] = -INFINITY, l[r] = 0.0f;
    fa_i_rows_key_span(p, r0, r0 + rows, &lo, &hi);
    fa_i_split_keys(job, split, lo, hi, &c0, &c_end);
    for (; c0 < c_end; c0 += FA_I_BN) {
        const int cols = p->seqlen_k - c0 < FA_I_BN ? p->seqlen_k - c0 : FA_I_BN;
        const int vis = fa_i_tile_visibility(p, r0, r0 + rows, c0, c0 + cols);
        if (!vis) continue;
        if (job->packed) { /* this block's tiles, packed */
            kt = job->packed + ((size_t)(b * p->heads_kv + hk - job->pair0) * fa_i_ceil_div(p->seqlen_k, FA_I_BN) +
                                c0 / FA_I_BN) * fa_i_pack_tile_floats(p);
            v = kt + (size_t)dp * FA_I_BN;
            fa_i_gemm(s, FA_I_BN, q, dp, kt, FA_I_BN, rows, FA_I_BN, dp, 0);
        } else if (rows <= FA_I_DOT_ROWS) { /* decode: dot products with K's own rows, no transpose */
            fa_i_load_tile(kt, dp, p->k, &p->k_layout, b, hk, c0, cols, d, p->dtype, 1.0f,
                           fa_i_descale_of(p, p->k_descale, b, hk, p->heads_kv, p->seqlen_k),
                           fa_i_pages_of(p));
            for (r = 0; r < rows; ++r)
                for (c = 0; c < cols; ++c)
                    s[(size_t)r * FA_I_BN + c] = fa_i_dot(q + (size_t)r * dp, kt + (size_t)c * dp, dp);
        } else { /* S = Q K^T as a plain product */
            fa_i_load_kt(kt, dp, kstage, p, b, hk, c0, cols);
            fa_i_gemm(s, FA_I_BN, q, dp, kt, FA_I_BN, rows, FA_I_BN, dp, 0);
        }
        if (!job->packed)
            fa_i_load_tile(v, dvp, p->v, &p->v_layout, b, hk, c0, cols, dv, p->dtype, 1.0f,
                           fa_i_descale_of(p, p->v_descale, b, hk, p->heads_kv, p->seqlen_k),
                           fa_i_pages_of(p));
        fa_i_scores(p, s, FA_I_BN, r0, rows, c0, cols, vis);
        fa_i_softmax_tile(s, rows, cols, m, l, m_new, alpha, o, dvp, dv);
        fa_i_gemm(o, dvp, s, FA_I_BN, v, dvp, rows, dvp, cols, 1);
    }
    fa_i_store_rows(job, split, b, h, r0, rows, o, dvp, m, l);
}

static size_t fa_i_forward_fa2_scratch(const fa_params *p)
{
    const size_t dp = (size_t)FA_I_PAD(p->head_dim), dvp = (size_t)FA_I_PAD(p->head_dim_v);
    return FA_I_BM * (dp + dvp) + (dp + dvp) * FA_I_BN + FA_I_BM * FA_I_BN +
           4 * FA_I_PAD(FA_I_BM) + FA_I_BN * dp;
}

/* Decode where each key row holds its heads side by side (the K and V
   layouts' head stride is the head dim, as in BSHD and paged caches): a
   task takes every head of one batch over its split of the keys, so that K
   and V stream row after row in memory order, each row read once for all
   the query heads that share it. (A head at a time reads a slice of every
   row, a stride the hardware prefetchers do not follow.) S from dot
   products, O += P V by multiply-adds or a product (the same sums), each K
   or V row read once for the query rows of its head. Its rows x = h * Nq
   + r (those of kv head hk contiguous) run through the same online softmax
   as a query block's. */
#define FA_I_SWEEP_ROWS 16 /* K or V rows (every head's) a step stages */
#define FA_I_SWEEP_GEMM 4  /* query rows a kv head needs before the step is a product */
static int fa_i_sweep_applies(const fa_params *p) /* its scratch grows with Hq: at most a tile's */
{
    return p->seqlen_q <= FA_I_DOT_ROWS && (int64_t)p->heads_q * p->seqlen_q <= 4 * FA_I_BM &&
           p->k_layout.head == p->head_dim && p->v_layout.head == p->head_dim_v;
}

/* Key row c of batch b, every kv head's n values (scaled by their
   descales), into dst[heads_kv][ld]. */
static void fa_i_load_heads(float *dst, int ld, const void *base, const fa_layout *l,
                            const float *descales, const fa_params *p, int b, int c, int n)
{
    const fa_i_pages pg = fa_i_pages_of(p);
    int hk;
    for (hk = 0; hk < p->heads_kv; ++hk) {
        const fa_i_descale ds = fa_i_descale_of(p, descales, b, hk, p->heads_kv, p->seqlen_k);
        fa_i_load_row(dst + (size_t)hk * ld, base, fa_i_row_at(l, pg, b, hk, c), n, p->dtype,
                      fa_i_descale_at(ds, c));
    }
}

static void fa_i_forward_sweep_task(const fa_i_job *job, int task, float *scratch)
{
    const fa_params *p = job->p;
    const int b = task / job->splits, split = task % job->splits, nq = p->seqlen_q;
    const int hq = p->heads_q, hkv = p->heads_kv, rows = hq * nq, per = rows / hkv;
    const int d = p->head_dim, dp = FA_I_PAD(d), dv = p->head_dim_v, dvp = FA_I_PAD(dv);
    /* Where a kv head has enough query rows, FA_I_SWEEP_ROWS K or V rows (every
       head's) are staged and each head takes them in turn, its Q or O rows
       kept in L1 (O += P V a product); else a row at a time, in L1 whole. */
    const int step = per < FA_I_SWEEP_GEMM ? 1 : FA_I_SWEEP_ROWS;
    float *q = scratch, *s = q + (size_t)rows * dp, *o = s + (size_t)rows * FA_I_BN;
    float *m = o + (size_t)rows * dvp, *l = m + FA_I_PAD(rows), *m_new = l + FA_I_PAD(rows);
    float *alpha = m_new + FA_I_PAD(rows);
    float *krow = alpha + FA_I_PAD(rows), *vrow = krow + (size_t)step * hkv * dp; /* staged */
    int lo, hi, c0, c_end, c, h, hk, x;

    for (h = 0; h < hq; ++h)
        fa_i_load_tile(q + (size_t)h * nq * dp, dp, p->q, &p->q_layout, b, h, 0, nq, d, p->dtype,
                       fa_i_q_multiplier(p), fa_i_descale_of(p, p->q_descale, b, h, hq, nq),
                       fa_i_dense);
    memset(o, 0, sizeof(float) * rows * dvp);
    memset(krow, 0, sizeof(float) * step * hkv * (size_t)(dp + dvp)); /* the padding stays 0 */
    for (x = 0; x < FA_I_PAD(rows); ++x) m[x] = m_new[x] = -INFINITY, l[x] = 0.0f;
    fa_i_rows_key_span(p, 0, nq, &lo, &hi);
    fa_i_split_keys(job, split, lo, hi, &c0, &c_end);
    for (; c0 < c_end; c0 += FA_I_BN) {
        const int cols = p->seqlen_k - c0 < FA_I_BN ? p->seqlen_k - c0 : FA_I_BN;
        const int vis = fa_i_tile_visibility(p, 0, nq, c0, c0 + cols);
        if (!vis) continue;
        for (c = 0; c < cols; c += step) { /* S, `step` keys at a time */
            const int n = cols - c < step ? cols - c : step;
            int i;
            for (i = 0; i < n; ++i)
                fa_i_load_heads(krow + (size_t)i * hkv * dp, dp, p->k, &p->k_layout,
                                p->k_descale, p, b, c0 + c + i, d);
            for (hk = 0; hk < hkv; ++hk) /* rows hk * per ..: the query rows reading kv head hk */
                for (i = 0; i < n; ++i)
                    fa_i_dots(s + (size_t)hk * per * FA_I_BN + c + i, FA_I_BN,
                              q + (size_t)hk * per * dp, dp, krow + ((size_t)i * hkv + hk) * dp, dp,
                              per);
        }
        for (h = 0; h < hq; ++h)
            fa_i_scores(p, s + (size_t)h * nq * FA_I_BN, FA_I_BN, 0, nq, c0, cols, vis);
        fa_i_softmax_tile(s, rows, cols, m, l, m_new, alpha, o, dvp, dv);
        for (c = 0; c < cols; c += step) { /* O += P V */
            const int n = cols - c < step ? cols - c : step;
            int i;
            for (i = 0; i < n; ++i)
                fa_i_load_heads(vrow + (size_t)i * hkv * dvp, dvp, p->v, &p->v_layout,
                                p->v_descale, p, b, c0 + c + i, dv);
            for (hk = 0; hk < hkv; ++hk) {
                float *o_hk = o + (size_t)hk * per * dvp, *p_hk = s + (size_t)hk * per * FA_I_BN + c;
                if (step == 1)
                    for (i = 0; i < n; ++i)
                        fa_i_axpys(o_hk, dvp, p_hk + i, FA_I_BN, vrow + ((size_t)i * hkv + hk) * dvp,
                                   dvp, per);
                else
                    fa_i_gemm(o_hk, dvp, p_hk, FA_I_BN, vrow + (size_t)hk * dvp, hkv * dvp, per, dvp,
                              n, 1);
            }
        }
    }
    for (h = 0; h < hq; ++h)
        fa_i_store_rows(job, split, b, h, 0, nq, o + (size_t)h * nq * dvp, dvp, m + h * nq,
                        l + h * nq);
}

static size_t fa_i_forward_sweep_scratch(const fa_params *p)
{
    const size_t dp = (size_t)FA_I_PAD(p->head_dim), dvp = (size_t)FA_I_PAD(p->head_dim_v);
    const size_t rows = (size_t)p->heads_q * p->seqlen_q;
    return rows * (dp + FA_I_BN + dvp) + 4 * (size_t)FA_I_PAD(rows) +
           (size_t)FA_I_SWEEP_ROWS * p->heads_kv * (dp + dvp);
}

/* ---- forward, FA1 order ---------------------------------------------------
   One task per (batch, query head). Key/value blocks are the outer loop and
   each is loaded once; every query block's normalized O, m and l are read
   and written back per key block, as in FlashAttention 1. */

static void fa_i_forward_fa1_task(const fa_i_job *job, int task, float *scratch)
{
    const fa_params *p = job->p;
    const int d = p->head_dim, dp = FA_I_PAD(d), dv = p->head_dim_v, dvp = FA_I_PAD(dv);
    const int nq = p->seqlen_q;
    const int b = task / p->heads_q, h = task % p->heads_q;
    const int hk = h / (p->heads_q / p->heads_kv);
    /* o_state, m_state, l_state stand in for the O, m, l arrays in HBM. */
    float *o_state = scratch, *m_state = o_state + (size_t)nq * dv, *l_state = m_state + nq;
    float *q = l_state + nq, *kt = q + FA_I_BM * dp, *v = kt + (size_t)dp * FA_I_BN;
    float *s = v + (size_t)FA_I_BN * dvp, *pv = s + FA_I_BM * FA_I_BN, *m_tile = pv + FA_I_BM * dvp;
    float *l_tile = m_tile + FA_I_BM, *kstage = l_tile + FA_I_BM;
    int c0, r0, r, c;

    memset(o_state, 0, sizeof(float) * nq * dv);
    for (r = 0; r < nq; ++r) { m_state[r] = -INFINITY; l_state[r] = 0.0f; }
    for (c0 = 0; c0 < p->seqlen_k; c0 += FA_I_BN) {
        const int cols = p->seqlen_k - c0 < FA_I_BN ? p->seqlen_k - c0 : FA_I_BN;
        fa_i_load_kt(kt, dp, kstage, p, b, hk, c0, cols);
        fa_i_load_tile(v, dvp, p->v, &p->v_layout, b, hk, c0, cols, dv, p->dtype, 1.0f,
                       fa_i_descale_of(p, p->v_descale, b, hk, p->heads_kv, p->seqlen_k),
                       fa_i_pages_of(p));
        for (r0 = 0; r0 < nq; r0 += FA_I_BM) {
            const int rows = nq - r0 < FA_I_BM ? nq - r0 : FA_I_BM;
            const int vis = fa_i_tile_visibility(p, r0, r0 + rows, c0, c0 + cols);
            if (!vis) continue;
            fa_i_load_tile(q, dp, p->q, &p->q_layout, b, h, r0, rows, d, p->dtype,
                           fa_i_q_multiplier(p),
                           fa_i_descale_of(p, p->q_descale, b, h, p->heads_q, p->seqlen_q), fa_i_dense);
            fa_i_gemm(s, FA_I_BN, q, dp, kt, FA_I_BN, rows, FA_I_BN, dp, 0);
            fa_i_scores(p, s, FA_I_BN, r0, rows, c0, cols, vis);
            for (r = 0; r < rows; ++r) { /* P~ = exp(S - m~), l~ = rowsum(P~) */
                float *srow = s + (size_t)r * FA_I_BN;
                m_tile[r] = fa_i_row_max(srow, cols, -INFINITY);
                if (m_tile[r] == -INFINITY) { /* l~ NaN: a NaN score */
                    l_tile[r] = fa_i_row_has_nan(srow, cols) ? NAN : 0.0f;
                    memset(srow, 0, sizeof(float) * cols);
                } else {
                    l_tile[r] = fa_i_exp_row(srow, cols, m_tile[r]);
                }
            }
            fa_i_gemm(pv, dvp, s, FA_I_BN, v, dvp, rows, dvp, cols, 0);
            for (r = 0; r < rows; ++r) { /* merge with the carried, normalized state */
                float *orow = o_state + (size_t)(r0 + r) * dv, *pvrow = pv + (size_t)r * dvp;
                const float m_old = m_state[r0 + r];
                float m_new, w_old, w_tile, l_new;
                if (m_tile[r] == -INFINITY) {
                    if (l_tile[r] != 0.0f) /* a NaN row */
                        for (c = 0, l_state[r0 + r] = NAN; c < dv; ++c) orow[c] = NAN;
                    continue;
                }
                m_new = m_old > m_tile[r] ? m_old : m_tile[r];
                w_old = l_state[r0 + r] * fa_i_exp2(m_old - m_new);
                w_tile = fa_i_exp2(m_tile[r] - m_new);
                l_new = w_old + w_tile * l_tile[r];
                for (c = 0; c < dv; ++c) orow[c] = (w_old * orow[c] + w_tile * pvrow[c]) / l_new;
                m_state[r0 + r] = m_new;
                l_state[r0 + r] = l_new;
            }
        }
    }
    for (r = 0; r < nq; ++r) {
        fa_i_store_row(p->o, fa_i_offset(&p->o_layout, b, h, r), o_state + (size_t)r * dv, dv,
                       p->o_dtype, 1.0f);
        if (p->lse)
            p->lse[((size_t)b * p->heads_q + h) * nq + r] =
                l_state[r] == 0.0f ? -INFINITY : (m_state[r] + log2f(l_state[r])) * FA_I_LN2;
    }
}

static size_t fa_i_forward_fa1_scratch(const fa_params *p)
{
    const size_t dv = (size_t)p->head_dim_v, dp = (size_t)FA_I_PAD(p->head_dim);
    const size_t dvp = (size_t)FA_I_PAD(p->head_dim_v);
    return (size_t)p->seqlen_q * (dv + 2) + FA_I_BM * (dp + dvp) + (dp + dvp) * FA_I_BN +
           FA_I_BM * FA_I_BN + 2 * FA_I_BM + FA_I_BN * dp;
}

/* ---- backward ---------------------------------------------------------------
   By recomputation from LSE, in two passes so that every output row has one
   owner (no atomics, bitwise deterministic for any thread count):
     dQ pass, one task per (batch, query head, query block): D = rowsum(dO*O),
       then for each visible key block P, dP = dO V^T, dS = P (dP - D),
       dQ += scale dS K.
     dK/dV pass, one task per (batch, kv head, key block): for each query head
       of the group and visible query block, dV += P^T dO, dK += scale dS^T Q.
   The price is recomputing S and dP in both passes (7 tile matmuls, not 5). */

typedef struct fa_i_bwd_scratch {
    float *q, *dout, *k, *kt, *vt, *s, *dp, *t, *acc, *acc2, *lse2, *dsum, *row;
} fa_i_bwd_scratch;

/* Rows of dp = FA_I_PAD(d) and dvp = FA_I_PAD(dv) floats: q [BM][dp], dout
   [BM][dvp]; k [BN][dp]; kt [dp][BN], vt [dvp][BN]; s, dp [BM][BN]; t
   [BN][max(BM, dvp)] (P^T, dS^T, V rows or one dO row); acc [max(BM, BN)][dp]
   (dQ or dK), acc2 [BN][dvp] (dV); row [max(dp, dvp)]. The carve and the
   size come from one function. */
static size_t fa_i_bwd_carve(float *w, const fa_params *p, fa_i_bwd_scratch *x)
{
    const size_t dp = (size_t)FA_I_PAD(p->head_dim), dvp = (size_t)FA_I_PAD(p->head_dim_v);
    const size_t bmn = FA_I_BM > FA_I_BWD_BN ? FA_I_BM : FA_I_BWD_BN;
    const size_t t_cols = FA_I_BM > dvp ? FA_I_BM : dvp, row = dp > dvp ? dp : dvp;
    const size_t at_dout = FA_I_BM * dp, at_k = at_dout + FA_I_BM * dvp;
    const size_t at_kt = at_k + FA_I_BWD_BN * dp;
    const size_t at_vt = at_kt + FA_I_BWD_BN * dp, at_s = at_vt + FA_I_BWD_BN * dvp;
    const size_t at_dp = at_s + FA_I_BM * FA_I_BWD_BN, at_t = at_dp + FA_I_BM * FA_I_BWD_BN;
    const size_t at_acc = at_t + FA_I_BWD_BN * t_cols, at_acc2 = at_acc + bmn * dp;
    const size_t at_lse2 = at_acc2 + FA_I_BWD_BN * dvp, at_dsum = at_lse2 + FA_I_BM;
    const size_t at_row = at_dsum + FA_I_BM;
    if (x) {
        x->q = w; x->dout = w + at_dout; x->k = w + at_k; x->kt = w + at_kt; x->vt = w + at_vt;
        x->s = w + at_s; x->dp = w + at_dp; x->t = w + at_t; x->acc = w + at_acc;
        x->acc2 = w + at_acc2; x->lse2 = w + at_lse2; x->dsum = w + at_dsum; x->row = w + at_row;
    }
    return at_row + row;
}

static size_t fa_i_backward_scratch(const fa_params *p) { return fa_i_bwd_carve(NULL, p, NULL); }

/* Packed Q and dO (the backward's counterpart of the forward's packed K/V):
   the dQ pass loads each query block's Q and dO tiles into a slot of
   job->packed, and the dK/dV pass, which reads every one of them once per
   key block, takes them from there. Slots of the (batch, kv head) pairs
   from job->pair0, each [BM][dp] of Q then [BM][dvp] of dO; NULL where the
   backward does not pack. */
static size_t fa_i_bwd_slot_floats(const fa_params *p)
{
    return (size_t)FA_I_BM * (FA_I_PAD(p->head_dim) + FA_I_PAD(p->head_dim_v));
}

static float *fa_i_bwd_slot(const fa_i_job *job, int b, int h, int r0)
{
    const fa_params *p = job->p;
    const int group = p->heads_q / p->heads_kv, nqb = fa_i_ceil_div(p->seqlen_q, FA_I_BM);
    const int local = (b * p->heads_kv + h / group - job->pair0) * group + h % group;
    if (!job->packed) return NULL;
    return job->packed + ((size_t)local * nqb + r0 / FA_I_BM) * fa_i_bwd_slot_floats(p);
}

/* The query-side rows of a tile: raw Q and dO (loaded unless `load` is 0
   and they are packed), base-2 LSE and D. */
static void fa_i_bwd_load_rows(const fa_i_job *job, fa_i_bwd_scratch *x, int b, int h, int r0,
                               int rows, int load)
{
    const fa_params *p = job->p;
    const size_t lse_base = ((size_t)b * p->heads_q + h) * p->seqlen_q + r0;
    float *slot = fa_i_bwd_slot(job, b, h, r0);
    int r;
    if (slot) x->q = slot, x->dout = slot + (size_t)FA_I_BM * FA_I_PAD(p->head_dim);
    if (!slot || load) {
        fa_i_load_tile(x->q, FA_I_PAD(p->head_dim), p->q, &p->q_layout, b, h, r0, rows,
                       p->head_dim, p->dtype, 1.0f, fa_i_no_descale, fa_i_dense);
        fa_i_load_tile(x->dout, FA_I_PAD(p->head_dim_v), p->dout, &p->dout_layout, b, h, r0, rows,
                       p->head_dim_v, p->dtype, 1.0f, fa_i_no_descale, fa_i_dense);
    }
    for (r = 0; r < rows; ++r) {
        /* A fully masked row has LSE = -inf; +inf makes its P = 2^(-inf) = 0. */
        const float lse = p->lse[lse_base + r];
        x->lse2[r] = lse == -INFINITY ? INFINITY : lse * FA_I_LOG2E;
        x->dsum[r] = job->shared[lse_base + r];
    }
}

/* Loads a key block: K (rows), K^T and V^T. */
static void fa_i_bwd_load_keys(const fa_params *p, fa_i_bwd_scratch *x, int b, int hk, int c0,
                               int cols)
{
    const int d = p->head_dim, dp = FA_I_PAD(d), dv = p->head_dim_v, dvp = FA_I_PAD(dv);
    fa_i_load_tile(x->k, dp, p->k, &p->k_layout, b, hk, c0, cols, d, p->dtype, 1.0f,
                   fa_i_no_descale, fa_i_dense);
    fa_i_transpose_keys(x->kt, FA_I_BWD_BN, x->k, dp, cols);
    fa_i_load_tile(x->t, dvp, p->v, &p->v_layout, b, hk, c0, cols, dv, p->dtype, 1.0f,
                   fa_i_no_descale, fa_i_dense);
    fa_i_transpose_keys(x->vt, FA_I_BWD_BN, x->t, dvp, cols);
}

/* Recomputes a tile: x->s becomes P and x->dp becomes dS (including the
   softcap's tanh derivative; the final factor scale is applied on store). */
static void fa_i_bwd_tile(const fa_params *p, fa_i_bwd_scratch *x, int r0, int rows, int c0,
                          int cols, int vis)
{
    const int dp = FA_I_PAD(p->head_dim), dvp = FA_I_PAD(p->head_dim_v);
    const float qmul = fa_i_q_multiplier(p);
    const float inv_cap = p->softcap > 0.0f ? 1.0f / (p->softcap * FA_I_LOG2E) : 0.0f;
    int r, c;
    fa_i_gemm(x->s, FA_I_BWD_BN, x->q, dp, x->kt, FA_I_BWD_BN, rows, FA_I_BWD_BN, dp, 0);
    for (r = 0; r < rows; ++r) fa_i_scale_row(x->s + (size_t)r * FA_I_BWD_BN, cols, qmul);
    fa_i_scores(p, x->s, FA_I_BWD_BN, r0, rows, c0, cols, vis);
    fa_i_gemm(x->dp, FA_I_BWD_BN, x->dout, dvp, x->vt, FA_I_BWD_BN, rows, FA_I_BWD_BN, dvp, 0);
    /* Plain loops over a row, so that they vectorize; the exps are
       fa_i_exp_row's. */
    for (r = 0; r < rows; ++r) {
        float *FA_RESTRICT srow = x->s + (size_t)r * FA_I_BWD_BN;
        float *FA_RESTRICT dprow = x->dp + (size_t)r * FA_I_BWD_BN;
        const float dsum = x->dsum[r];
        if (p->softcap > 0.0f) { /* d(c tanh(x/c))/dx = 1 - tanh^2; 0 where masked */
            for (c = 0; c < cols; ++c) {
                const float th = srow[c] * inv_cap;
                dprow[c] = srow[c] > -INFINITY ? (dprow[c] - dsum) * (1.0f - th * th) : 0.0f;
            }
            fa_i_exp_row(srow, cols, x->lse2[r]);
            for (c = 0; c < cols; ++c) dprow[c] *= srow[c];
        } else {
            fa_i_exp_row(srow, cols, x->lse2[r]);
            for (c = 0; c < cols; ++c) dprow[c] = srow[c] * (dprow[c] - dsum);
        }
    }
}

/* A gradient row, mul * src, into its tensor in the gradients' storage:
   written, or added to what the row holds (accumulate_grads; row: n floats
   of scratch). src is clobbered. */
static void fa_i_store_grad(const fa_params *p, void *base, int64_t offset, float *src, int n,
                            float mul, float *row)
{
    const fa_dtype gt = fa_i_grad_dtype(p);
    int i;
    if (p->accumulate_grads) {
        fa_i_load_row(row, base, offset, n, gt, 1.0f);
        for (i = 0; i < n; ++i) src[i] = mul * src[i] + row[i];
        mul = 1.0f;
    }
    fa_i_store_row(base, offset, src, n, gt, mul);
}

static void fa_i_backward_dq_task(const fa_i_job *job, int task, float *scratch)
{
    const fa_params *p = job->p;
    const fa_i_query_block blk = fa_i_query_task(p, task + job->first_task, FA_I_BM);
    const int d = p->head_dim, dp = FA_I_PAD(d), dv = p->head_dim_v, b = blk.b, h = blk.h;
    const int hk = blk.hk, r0 = blk.r0, rows = blk.rows;
    const size_t lse_base = ((size_t)b * p->heads_q + h) * p->seqlen_q + r0;
    fa_i_bwd_scratch x;
    int lo, hi, c0, r, c;

    fa_i_bwd_carve(scratch, p, &x);
    for (r = 0; r < rows; ++r) { /* D = rowsum(dO * O), kept for the dK/dV pass */
        float sum = 0.0f;
        fa_i_load_row(x.row, p->o, fa_i_offset(&p->o_layout, b, h, r0 + r), dv, p->dtype, 1.0f);
        fa_i_load_row(x.t, p->dout, fa_i_offset(&p->dout_layout, b, h, r0 + r), dv, p->dtype,
                      1.0f);
        for (c = 0; c < dv; ++c) sum += x.row[c] * x.t[c];
        job->shared[lse_base + r] = sum;
    }
    fa_i_bwd_load_rows(job, &x, b, h, r0, rows, 1);
    memset(x.acc, 0, sizeof(float) * FA_I_BM * dp);
    fa_i_rows_key_span(p, r0, r0 + rows, &lo, &hi);
    for (c0 = lo / FA_I_BWD_BN * FA_I_BWD_BN; c0 < hi; c0 += FA_I_BWD_BN) {
        const int cols = p->seqlen_k - c0 < FA_I_BWD_BN ? p->seqlen_k - c0 : FA_I_BWD_BN;
        const int vis = fa_i_tile_visibility(p, r0, r0 + rows, c0, c0 + cols);
        if (!vis) continue;
        fa_i_bwd_load_keys(p, &x, b, hk, c0, cols);
        fa_i_bwd_tile(p, &x, r0, rows, c0, cols, vis);
        fa_i_gemm(x.acc, dp, x.dp, FA_I_BWD_BN, x.k, dp, rows, dp, cols, 1);
    }
    for (r = 0; r < rows; ++r)
        fa_i_store_grad(p, p->dq, fa_i_offset(&p->dq_layout, b, h, r0 + r), x.acc + (size_t)r * dp,
                        d, p->scale, x.row);
}

static void fa_i_backward_dkv_task(const fa_i_job *job, int task, float *scratch)
{
    const fa_params *p = job->p;
    const int d = p->head_dim, dp = FA_I_PAD(d), dv = p->head_dim_v, dvp = FA_I_PAD(dv);
    const int nkb = fa_i_ceil_div(p->seqlen_k, FA_I_BWD_BN);
    const int b = (task += job->first_task) / (nkb * p->heads_kv), hk = (task / nkb) % p->heads_kv;
    const int group = p->heads_q / p->heads_kv;
    const int c0 = (task % nkb) * FA_I_BWD_BN;
    const int cols = p->seqlen_k - c0 < FA_I_BWD_BN ? p->seqlen_k - c0 : FA_I_BWD_BN;
    fa_i_bwd_scratch x;
    int h, r0, r;

    fa_i_bwd_carve(scratch, p, &x);
    fa_i_bwd_load_keys(p, &x, b, hk, c0, cols);
    memset(x.acc, 0, sizeof(float) * FA_I_BWD_BN * dp);   /* dK */
    memset(x.acc2, 0, sizeof(float) * FA_I_BWD_BN * dvp); /* dV */
    for (h = hk * group; h < (hk + 1) * group; ++h)
        for (r0 = 0; r0 < p->seqlen_q; r0 += FA_I_BM) {
            const int rows = p->seqlen_q - r0 < FA_I_BM ? p->seqlen_q - r0 : FA_I_BM;
            const int vis = fa_i_tile_visibility(p, r0, r0 + rows, c0, c0 + cols);
            if (!vis) continue;
            fa_i_bwd_load_rows(job, &x, b, h, r0, rows, 0);
            fa_i_bwd_tile(p, &x, r0, rows, c0, cols, vis);
            fa_i_transpose(x.t, FA_I_BM, x.s, FA_I_BWD_BN, rows, cols);
            fa_i_gemm(x.acc2, dvp, x.t, FA_I_BM, x.dout, dvp, cols, dvp, rows, 1);
            fa_i_transpose(x.t, FA_I_BM, x.dp, FA_I_BWD_BN, rows, cols);
            fa_i_gemm(x.acc, dp, x.t, FA_I_BM, x.q, dp, cols, dp, rows, 1);
        }
    for (r = 0; r < cols; ++r) {
        fa_i_store_grad(p, p->dk, fa_i_offset(&p->dk_layout, b, hk, c0 + r), x.acc + (size_t)r * dp,
                        d, p->scale, x.row);
        fa_i_store_grad(p, p->dv, fa_i_offset(&p->dv_layout, b, hk, c0 + r),
                        x.acc2 + (size_t)r * dvp, dv, 1.0f, x.row);
    }
}

/* ---- combine ------------------------------------------------------------------
   Partial results merged by LSE, row by row: every part's row is read before
   o's row is written, so o may be o_parts[0] (same dtype and layout). */

#define FA_I_COMBINE_ROWS 64 /* rows per combine task */

/* Row (b, n, h) of the merge into out[d] (row[d] is scratch); returns its
   LSE. Part num_parts, with accumulate, is o and lse themselves. */
static float fa_i_combine_row(const fa_combine_params *p, int b, int n, int h, float *out,
                              float *row)
{
    const size_t lse_at = ((size_t)b * p->heads + h) * p->seqlen + n;
    const int64_t at = fa_i_offset(&p->part_layout, b, h, n);
    const int parts = p->num_parts + (p->accumulate != 0);
    float mx = -INFINITY, sum = 0.0f;
    int i, c;
    for (i = 0; i < parts; ++i) {
        const float lse = i < p->num_parts ? p->lse_parts[i][lse_at] : p->lse[lse_at];
        if (lse != lse) { /* a NaN part makes a NaN row */
            for (c = 0; c < p->head_dim; ++c) out[c] = NAN;
            return NAN;
        }
        if (lse > mx) mx = lse;
    }
    memset(out, 0, sizeof(float) * p->head_dim);
    if (mx == -INFINITY) return -INFINITY;
    for (i = 0; i < parts; ++i) {
        const float lse = i < p->num_parts ? p->lse_parts[i][lse_at] : p->lse[lse_at];
        float w;
        if (lse == -INFINITY) continue; /* saw no key: its O is not read */
        w = expf(lse - mx);
        sum += w;
        if (i < p->num_parts)
            fa_i_load_row(row, p->o_parts[i], at, p->head_dim, p->part_dtype, w);
        else
            fa_i_load_row(row, p->o, fa_i_offset(&p->o_layout, b, h, n), p->head_dim, p->dtype, w);
        for (c = 0; c < p->head_dim; ++c) out[c] += row[c];
    }
    for (c = 0; c < p->head_dim; ++c) out[c] /= sum;
    return mx + logf(sum);
}

static void fa_i_combine_task(const fa_i_job *job, int task, float *scratch)
{
    const fa_combine_params *p = job->combine;
    const int64_t rows = (int64_t)p->batch * p->seqlen * p->heads;
    int64_t x;
    for (x = (int64_t)task * FA_I_COMBINE_ROWS; x < rows && x < (int64_t)(task + 1) * FA_I_COMBINE_ROWS;
         ++x) {
        const int h = (int)(x % p->heads), n = (int)(x / p->heads % p->seqlen);
        const int b = (int)(x / ((int64_t)p->heads * p->seqlen));
        const float lse = fa_i_combine_row(p, b, n, h, scratch, scratch + p->head_dim);
        fa_i_store_row(p->o, fa_i_offset(&p->o_layout, b, h, n), scratch, p->head_dim, p->dtype,
                       1.0f);
        if (p->lse) p->lse[((size_t)b * p->heads + h) * p->seqlen + n] = lse;
    }
}

/* Runs a resolved merge with the resolved options o. */
static fa_status fa_i_run_combine(const fa_combine_params *p, const fa_cpu_options *o)
{
    fa_i_job job;
    fa_status s;
    memset(&job, 0, sizeof job);
    job.combine = p;
    job.run = fa_i_combine_task;
    job.scratch_floats = 2 * (size_t)p->head_dim;
    s = fa_i_task_count(((int64_t)p->batch * p->seqlen * p->heads + FA_I_COMBINE_ROWS - 1) /
                            FA_I_COMBINE_ROWS,
                        &job.num_tasks);
    return s != FA_OK ? s : fa_i_run_job(&job, o);
}

/* ---- entry points ---------------------------------------------------------- */

static fa_status fa_i_cpu_options(const fa_cpu_options *opt, fa_cpu_options *out)
{
    fa_cpu_options o;
    memset(&o, 0, sizeof o);
    if (opt) o = *opt;
    if (o.num_threads < 0)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "num_threads %d < 0", o.num_threads);
    if (o.order != FA_CPU_ORDER_FA2 && o.order != FA_CPU_ORDER_FA1)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "order %d is not a fa_cpu_order", (int)o.order);
    if (o.num_threads == 0) o.num_threads = 1;
    *out = o;
    return FA_OK;
}

/* Key splits of the FA2-order forward: p->num_splits, or where the query
   tasks are fewer than FA_I_SPLIT_WORK (decode), enough to reach that many
   tasks with at least 4 key blocks each. A function of the problem alone, so
   that results do not depend on the thread count. */
#define FA_I_SPLIT_WORK 32
static int fa_i_cpu_splits(const fa_params *p, int64_t query_tasks)
{
    int64_t splits;
    if (p->num_splits) return p->num_splits;
    if (query_tasks >= FA_I_SPLIT_WORK) return 1;
    splits = (FA_I_SPLIT_WORK + query_tasks - 1) / query_tasks;
    if (splits > fa_i_ceil_div(p->seqlen_k, FA_I_BN) / 4) splits = fa_i_ceil_div(p->seqlen_k, FA_I_BN) / 4;
    return splits < 2 ? 1 : (int)splits;
}

/* The FA2-order forward with its keys in job->splits chunks: every chunk's
   partial result into job->shared, then the merge into o and lse. */
static fa_status fa_i_forward_split(fa_i_job *job, const fa_cpu_options *o)
{
    const fa_params *p = job->p;
    const size_t o_floats = fa_i_split_o_floats(p);
    const size_t lse_floats = (size_t)p->batch * p->heads_q * p->seqlen_q;
    const void *o_parts[FA_MAX_PARTS];
    const float *lse_parts[FA_MAX_PARTS];
    fa_combine_params c;
    fa_status s;
    int i;
    job->shared = (float *)FA_MALLOC(sizeof(float) * job->splits * (o_floats + lse_floats));
    if (!job->shared)
        return fa_i_fail(FA_ERR_OUT_OF_MEMORY, "split-KV partials of %d splits", job->splits);
    s = fa_i_run_job(job, o);
    memset(&c, 0, sizeof c);
    c.num_parts = job->splits;
    c.batch = p->batch, c.heads = p->heads_q, c.seqlen = p->seqlen_q, c.head_dim = p->head_dim_v;
    c.part_dtype = FA_DTYPE_F32;
    for (i = 0; i < job->splits; ++i) {
        o_parts[i] = job->shared + i * o_floats;
        lse_parts[i] = job->shared + job->splits * o_floats + i * lse_floats;
    }
    c.o_parts = o_parts, c.lse_parts = lse_parts;
    c.dtype = p->o_dtype, c.o = p->o, c.o_layout = p->o_layout, c.lse = p->lse;
    if (s == FA_OK) s = fa_combine_resolve(&c, &c);
    if (s == FA_OK) s = fa_i_run_combine(&c, o);
    FA_FREE(job->shared);
    return s;
}

/* The FA2-order forward, unsplit, over packed K/V where that pays: every
   K/V tile read by at least two query blocks (query blocks of more than
   FA_I_DOT_ROWS rows, or GQA), one (batch, kv head) pair's tiles within
   FA_CPU_PACK_BYTES. Pairs go in groups that fit it: a job packs a group,
   a second runs its query tasks (a contiguous range of task numbers).
   Otherwise, or where the buffer cannot be had, tiles load per query block. */
static fa_status fa_i_forward_packed(fa_i_job *job, const fa_cpu_options *o)
{
    const fa_params *p = job->p;
    const int group = p->heads_q / p->heads_kv, blocks = fa_i_ceil_div(p->seqlen_k, FA_I_BN);
    const int pairs = p->batch * p->heads_kv, tasks_per_pair = job->num_tasks / pairs;
    const size_t pair_bytes = fa_i_pack_pair_floats(p) * sizeof(float);
    const int worth = tasks_per_pair >= 2 && (p->seqlen_q > FA_I_DOT_ROWS || group > 1);
    const int per_group = fa_i_pack_group(o, worth, pair_bytes, pairs, &job->packed);
    int pair0;
    fa_i_job pack;
    fa_status s = FA_OK;
    if (!job->packed) return fa_i_run_job(job, o);
    memset(&pack, 0, sizeof pack);
    pack.p = p, pack.run = fa_i_pack_kv_task, pack.packed = job->packed, pack.splits = 1;
    pack.scratch_floats = (size_t)FA_I_BN * FA_I_PAD(p->head_dim);
    for (pair0 = 0; pair0 < pairs && s == FA_OK; pair0 += per_group) {
        const int n = pairs - pair0 < per_group ? pairs - pair0 : per_group;
        fa_i_job attend = *job;
        pack.pair0 = pair0, pack.num_tasks = n * blocks, pack.next_task = 0;
        s = fa_i_run_job(&pack, o);
        attend.pair0 = pair0, attend.first_task = pair0 * tasks_per_pair;
        attend.num_tasks = n * tasks_per_pair, attend.next_task = 0;
        if (s == FA_OK) s = fa_i_run_job(&attend, o);
    }
    FA_FREE(job->packed);
    return s;
}

/* ---- varlen: ragged batches as one dense problem per sequence ------------- */

/* The packed tensors of a resolved varlen p as one sequence of total_q and
   total_k rows (at least 1): their strides and aliasing checked. */
static fa_status fa_i_varlen_check_packed(const fa_params *p, fa_pass pass, int total_q,
                                          int total_k)
{
    fa_params whole = *p;
    fa_status s;
    whole.batch = 1;
    whole.seqlen_q = total_q > 0 ? total_q : 1;
    whole.seqlen_k = total_k > 0 ? total_k : 1;
    if ((s = fa_i_check_layouts(&whole, pass, 1, 1)) != FA_OK) return s;
    return fa_i_check_aliasing(&whole, pass, NULL, 0);
}

/* Validates a resolved varlen p's offsets (host arrays) and its packed
   tensors (fa_i_varlen_check_packed); *total_q, *total_k out. */
static fa_status fa_i_varlen_check(const fa_params *p, fa_pass pass, int *total_q, int *total_k)
{
    int b;
    if (p->tables_on_device)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device with varlen: Hopper's FA3 "
                         "kernels only (the GPU path)");
    for (b = 0; b < p->batch; ++b) {
        const int64_t nq = (int64_t)p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
        const int64_t nk = (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
        if (p->cu_seqlens_q[b] < 0 || p->cu_seqlens_k[b] < 0 || nq < 0 || nk < 0)
            return fa_i_fail(FA_ERR_INVALID_SIZE, "cu_seqlens decrease (or start below 0) at %d",
                             b);
        if (nq > p->seqlen_q || nk > p->seqlen_k)
            return fa_i_fail(FA_ERR_INVALID_SIZE,
                             "sequence %d: %lld queries, %lld keys past seqlen_q %d, seqlen_k %d",
                             b, (long long)nq, (long long)nk, p->seqlen_q, p->seqlen_k);
        if (p->seqused_k && (p->seqused_k[b] < 0 || p->seqused_k[b] > nk))
            return fa_i_fail(FA_ERR_INVALID_SIZE, "seqused_k[%d] = %d is not in 0 .. %lld", b,
                             p->seqused_k[b], (long long)nk);
    }
    *total_q = p->cu_seqlens_q[p->batch];
    *total_k = p->cu_seqlens_k[p->batch];
    if ((p->total_q && *total_q > p->total_q) || (p->total_k && *total_k > p->total_k))
        return fa_i_fail(FA_ERR_INVALID_SIZE, "cu_seqlens end at %d queries, %d keys: past "
                         "total_q %d, total_k %d", *total_q, *total_k, p->total_q, p->total_k);
    return fa_i_varlen_check_packed(p, pass, *total_q, *total_k);
}

/* Rows [r0, r1) of every head of a packed tensor set to zero. */
static void fa_i_zero_rows(void *base, const fa_layout *l, fa_dtype dtype, int heads, int d,
                           int r0, int r1)
{
    static const float zeros[FA_MAX_HEAD_DIM] = {0.0f};
    int h, r;
    for (h = 0; h < heads; ++h)
        for (r = r0; r < r1; ++r)
            fa_i_store_row(base, fa_i_offset(l, 0, h, r), zeros, d, dtype, 1.0f);
}

/* Sequence b of a varlen p as a dense problem of batch 1 (its queries nq and
   the keys it uses nk out; the caller skips it where either is 0). */
static fa_params fa_i_varlen_sequence(const fa_params *p, int b, int *nq, int *nk)
{
    fa_params s = *p;
    const int64_t es = (int64_t)fa_dtype_size(p->dtype), qr = p->cu_seqlens_q[b];
    const int64_t kr = p->cu_seqlens_k[b], ges = (int64_t)fa_dtype_size(fa_i_grad_dtype(p));
    *nq = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
    *nk = p->seqused_k ? p->seqused_k[b] : p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
    s.batch = 1;
    s.seqlen_q = *nq;
    s.seqlen_k = *nk;
    s.cu_seqlens_q = s.cu_seqlens_k = s.seqused_k = NULL;
    s.q = (const char *)p->q + qr * p->q_layout.seq * es;
    s.k = (const char *)p->k + kr * p->k_layout.seq * es;
    s.v = (const char *)p->v + kr * p->v_layout.seq * es;
    s.o = (char *)p->o + qr * p->o_layout.seq * (int64_t)fa_dtype_size(p->o_dtype);
    if (p->dout) s.dout = (const char *)p->dout + qr * p->dout_layout.seq * es;
    if (p->dq) s.dq = (char *)p->dq + qr * p->dq_layout.seq * ges;
    if (p->dk) s.dk = (char *)p->dk + kr * p->dk_layout.seq * ges;
    if (p->dv) s.dv = (char *)p->dv + kr * p->dv_layout.seq * ges;
    return s;
}

/* The varlen forward or backward: each sequence in turn as a dense problem
   (every thread on it), its LSE rows moved between p's [Hq, total_q] and the
   dense call's [Hq, nq] in scratch. Rows that see no key: O = 0, LSE = -inf,
   dQ = 0; keys no row sees (no queries, or past seqused_k): dK = dV = 0. */
static fa_status fa_i_run_varlen(const fa_params *p, fa_pass pass, const fa_cpu_options *opt)
{
    const int hq = p->heads_q, d = p->head_dim;
    int total_q = 0, total_k = 0, b, h, r;
    float *lse = NULL;
    fa_status s = fa_i_varlen_check(p, pass, &total_q, &total_k);
    if (s != FA_OK) return s;
    if (p->lse && !(lse = (float *)FA_MALLOC(sizeof(float) * (size_t)hq * p->seqlen_q)))
        return fa_i_fail(FA_ERR_OUT_OF_MEMORY, "varlen LSE rows of %d heads", hq);
    for (b = 0; b < p->batch && s == FA_OK; ++b) {
        int nq, nk;
        fa_params seq = fa_i_varlen_sequence(p, b, &nq, &nk);
        const int q0 = p->cu_seqlens_q[b], span_k = p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
        seq.lse = lse;
        if (pass == FA_PASS_BACKWARD) {
            /* zero gradients where no query sees a key (accumulating: nothing to add) */
            const fa_dtype gt = fa_i_grad_dtype(p);
            const int seen = nq == 0 || nk == 0 ? 0 : nk, zero = !p->accumulate_grads;
            if (seen) {
                for (h = 0; h < hq; ++h)
                    for (r = 0; r < nq; ++r) lse[h * nq + r] = p->lse[(int64_t)h * total_q + q0 + r];
                s = fa_cpu_backward(&seq, opt);
            } else if (zero) {
                fa_i_zero_rows(seq.dq, &p->dq_layout, gt, hq, d, 0, nq);
            }
            if (zero) {
                fa_i_zero_rows(seq.dk, &p->dk_layout, gt, p->heads_kv, d, seen, span_k);
                fa_i_zero_rows(seq.dv, &p->dv_layout, gt, p->heads_kv, p->head_dim_v, seen, span_k);
            }
            continue;
        }
        if (nq == 0) continue;
        if (nk == 0) {
            fa_i_zero_rows(seq.o, &p->o_layout, p->o_dtype, hq, p->head_dim_v, 0, nq);
        } else {
            if ((s = fa_cpu_forward(&seq, opt)) != FA_OK) break;
        }
        if (p->lse)
            for (h = 0; h < hq; ++h)
                for (r = 0; r < nq; ++r)
                    p->lse[(int64_t)h * total_q + q0 + r] = nk ? lse[h * nq + r] : -INFINITY;
    }
    FA_FREE(lse);
    return s;
}

/* ---- paged K/V: the append, then one dense problem per sequence ----------- */

/* Sequence b's keys after the append, checked against seqlen_k, its pages
   and the cache (host arrays; before anything is written). */
static fa_status fa_i_paged_check(const fa_params *p)
{
    int b, j;
    for (b = 0; b < p->batch; ++b) {
        const int64_t keys = (int64_t)p->cache_seqlens[b] + p->seqlen_new;
        const int32_t *row = p->block_table + (int64_t)b * p->max_pages;
        if (p->cache_seqlens[b] < 0 || keys > p->seqlen_k ||
            keys > (int64_t)p->max_pages * p->page_size)
            return fa_i_fail(FA_ERR_INVALID_SIZE,
                             "sequence %d: %lld keys (cache_seqlens %d + seqlen_new %d) past "
                             "seqlen_k %d or max_pages x page_size",
                             b, (long long)keys, p->cache_seqlens[b], p->seqlen_new, p->seqlen_k);
        for (j = 0; j < (keys + p->page_size - 1) / p->page_size; ++j)
            if (row[j] < 0 || row[j] >= p->num_pages)
                return fa_i_fail(FA_ERR_INVALID_ARGUMENT,
                                 "block_table[%d][%d] = %d is not a page (0 .. %d)", b, j, row[j],
                                 p->num_pages - 1);
    }
    return FA_OK;
}

/* k_new, v_new rows into their pages at each sequence's cache length. */
static void fa_i_paged_append(const fa_params *p)
{
    const int64_t es = (int64_t)fa_dtype_size(p->dtype);
    int b, h, r, t;
    for (b = 0; b < p->batch; ++b) {
        fa_i_pages pg;
        pg.table = p->block_table + (int64_t)b * p->max_pages;
        pg.size = p->page_size;
        for (h = 0; h < p->heads_kv; ++h)
            for (r = 0; r < p->seqlen_new; ++r)
                for (t = 0; t < 2; ++t) {
                    const fa_layout *cl = t ? &p->v_layout : &p->k_layout;
                    const fa_layout *nl = t ? &p->v_new_layout : &p->k_new_layout;
                    char *cache = (char *)(t ? p->v : p->k);
                    const char *src = (const char *)(t ? p->v_new : p->k_new);
                    memcpy(cache + fa_i_row_at(cl, pg, 0, h, p->cache_seqlens[b] + r) * es,
                           src + fa_i_offset(nl, b, h, r) * es,
                           (size_t)(t ? p->head_dim_v : p->head_dim) * es);
                }
    }
}

static fa_status fa_i_forward_resolved(const fa_params *p, const fa_cpu_options *o);

/* The paged forward: checks, the append, then each sequence as a dense
   problem of batch 1 over its pages (rows with no key: O = 0, LSE = -inf). */
static fa_status fa_i_run_paged(const fa_params *p, const fa_cpu_options *o)
{
    const int64_t qes = (int64_t)fa_dtype_size(p->dtype), oes = (int64_t)fa_dtype_size(p->o_dtype);
    fa_status s;
    int b, h, r;
    if (p->tables_on_device)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device: the CPU reads block_table and "
                         "cache_seqlens in host memory");
    if ((s = fa_i_paged_check(p)) != FA_OK) return s;
    fa_i_paged_append(p);
    for (b = 0; b < p->batch && s == FA_OK; ++b) {
        fa_params seq = *p;
        seq.batch = 1;
        seq.seqlen_k = p->cache_seqlens[b] + p->seqlen_new;
        fa_i_bottom_right(&seq); /* queries at the end of this sequence's keys */
        seq.block_table = p->block_table + (int64_t)b * p->max_pages;
        seq.q = (const char *)p->q + b * p->q_layout.batch * qes;
        seq.o = (char *)p->o + b * p->o_layout.batch * oes;
        seq.lse = p->lse ? p->lse + (int64_t)b * p->heads_q * p->seqlen_q : NULL;
        if (seq.seqlen_k == 0) {
            fa_i_zero_rows(seq.o, &p->o_layout, p->o_dtype, p->heads_q, p->head_dim_v, 0, p->seqlen_q);
            if (seq.lse)
                for (h = 0; h < p->heads_q; ++h)
                    for (r = 0; r < p->seqlen_q; ++r) seq.lse[(int64_t)h * p->seqlen_q + r] = -INFINITY;
            continue;
        }
        s = fa_i_forward_resolved(&seq, o);
    }
    return s;
}

FA_API fa_status fa_cpu_forward(const fa_params *params, const fa_cpu_options *opt)
{
    fa_params p;
    fa_cpu_options o;
    fa_status s;
    if ((s = fa_params_resolve(params, FA_PASS_FORWARD, &p)) != FA_OK) return s;
    if ((s = fa_i_cpu_options(opt, &o)) != FA_OK) return s;
    if (p.cu_seqlens_q) return fa_i_run_varlen(&p, FA_PASS_FORWARD, &o);
    if (p.block_table) return fa_i_run_paged(&p, &o);
    return fa_i_forward_resolved(&p, &o);
}

/* The dense forward of a resolved p (a paged p: one sequence's pages). */
static fa_status fa_i_forward_resolved(const fa_params *params, const fa_cpu_options *opt)
{
    fa_params p = *params;
    fa_cpu_options o = *opt;
    fa_i_job job;
    fa_status s;
    int64_t bh, query_tasks;
    memset(&job, 0, sizeof job);
    job.p = &p;
    job.splits = 1;
    bh = (int64_t)p.batch * p.heads_q;
    if (o.order == FA_CPU_ORDER_FA1) {
        job.run = fa_i_forward_fa1_task;
        job.scratch_floats = fa_i_forward_fa1_scratch(&p);
        s = fa_i_task_count(bh, &job.num_tasks);
        return s != FA_OK ? s : fa_i_run_job(&job, &o);
    }
    if (fa_i_sweep_applies(&p)) {
        job.run = fa_i_forward_sweep_task;
        job.scratch_floats = fa_i_forward_sweep_scratch(&p);
        job.splits = fa_i_cpu_splits(&p, p.batch);
        if ((s = fa_i_task_count((int64_t)p.batch * job.splits, &job.num_tasks)) != FA_OK) return s;
        return job.splits > 1 ? fa_i_forward_split(&job, &o) : fa_i_run_job(&job, &o);
    }
    job.run = fa_i_forward_fa2_task;
    job.scratch_floats = fa_i_forward_fa2_scratch(&p);
    query_tasks = bh * fa_i_ceil_div(p.seqlen_q, fa_i_fwd_rows(&p));
    job.splits = fa_i_cpu_splits(&p, query_tasks);
    if ((s = fa_i_task_count(query_tasks * job.splits, &job.num_tasks)) != FA_OK) return s;
    if (job.splits > 1) return fa_i_forward_split(&job, &o);
    return fa_i_forward_packed(&job, &o);
}

FA_API fa_status fa_cpu_combine(const fa_combine_params *params, const fa_cpu_options *opt)
{
    fa_combine_params p;
    fa_cpu_options o;
    fa_status s;
    if ((s = fa_combine_resolve(params, &p)) != FA_OK) return s;
    if ((s = fa_i_cpu_options(opt, &o)) != FA_OK) return s;
    return fa_i_run_combine(&p, &o);
}

FA_API fa_status fa_cpu_backward(const fa_params *params, const fa_cpu_options *opt)
{
    fa_params p;
    fa_cpu_options o;
    fa_i_job job;
    fa_status s;
    int dkv_tasks = 0, dq_tasks = 0;
    const int64_t bh = params ? (int64_t)params->batch * params->heads_q : 0;
    if ((s = fa_params_resolve(params, FA_PASS_BACKWARD, &p)) != FA_OK) return s;
    if ((s = fa_i_cpu_options(opt, &o)) != FA_OK) return s;
    if (p.cu_seqlens_q) return fa_i_run_varlen(&p, FA_PASS_BACKWARD, &o);
    memset(&job, 0, sizeof job);
    job.p = &p;
    job.scratch_floats = fa_i_backward_scratch(&p);
    job.shared = (float *)FA_MALLOC(sizeof(float) * (size_t)bh * p.seqlen_q);
    if (!job.shared) return fa_i_fail(FA_ERR_OUT_OF_MEMORY, "D of %lld floats", (long long)bh);
    /* both passes' task counts before either runs: a refusal writes nothing */
    s = fa_i_task_count((int64_t)p.batch * p.heads_kv * fa_i_ceil_div(p.seqlen_k, FA_I_BWD_BN),
                        &dkv_tasks);
    if (s == FA_OK) s = fa_i_task_count(bh * fa_i_ceil_div(p.seqlen_q, FA_I_BM), &dq_tasks);
    if (s == FA_OK) { /* packed Q and dO where key blocks are several: pairs in groups */
        const int pairs = p.batch * p.heads_kv, nkb = fa_i_ceil_div(p.seqlen_k, FA_I_BWD_BN);
        const uint64_t pair_bytes = (uint64_t)(dq_tasks / pairs) * fa_i_bwd_slot_floats(&p) * 4;
        const int per_group = fa_i_pack_group(&o, nkb > 1, pair_bytes, pairs, &job.packed);
        int pair0;
        for (pair0 = 0; pair0 < pairs && s == FA_OK; pair0 += per_group) {
            const int n = pairs - pair0 < per_group ? pairs - pair0 : per_group;
            job.pair0 = pair0, job.next_task = 0;
            job.run = fa_i_backward_dq_task;
            job.first_task = pair0 * (dq_tasks / pairs), job.num_tasks = n * (dq_tasks / pairs);
            s = fa_i_run_job(&job, &o);
            job.run = fa_i_backward_dkv_task, job.next_task = 0;
            job.first_task = pair0 * nkb, job.num_tasks = n * nkb;
            if (s == FA_OK) s = fa_i_run_job(&job, &o);
        }
        if (job.packed) FA_FREE(job.packed);
    }
    FA_FREE(job.shared);
    return s;
}

/* ---- FP8 quantization ------------------------------------------------------
   Two passes over the row blocks of FA_FP8_BLOCK rows of each head: each
   block's amax (job->shared), then, with the descale of its group (block,
   head or tensor) fixed, the e4m3 values. The Hadamard rotation is redone
   in the second pass rather than kept (d floats of scratch). */

/* Row r of (b, h) of the quantize job's x, rotated if it asks, into row. */
static void fa_i_quantize_row(const fa_quantize_params *p, int b, int h, int r, float *row)
{
    const int d = p->head_dim;
    int len, i, j;
    fa_i_load_row(row, p->x, fa_i_offset(&p->x_layout, b, h, r), d, p->dtype, 1.0f);
    if (!p->hadamard) return;
    for (i = 0; i < d; ++i) row[i] *= fa_i_hadamard_sign(p->hadamard_seed, i);
    for (len = 1; len < d; len <<= 1) /* fast Walsh-Hadamard transform */
        for (i = 0; i < d; i += 2 * len)
            for (j = i; j < i + len; ++j) {
                const float a = row[j], c = row[j + len];
                row[j] = a + c;
                row[j + len] = a - c;
            }
    for (i = 0; i < d; ++i) row[i] *= 1.0f / sqrtf((float)d);
}

static int fa_i_quantize_blocks(const fa_quantize_params *p)
{
    return (int)(((int64_t)p->seqlen + FA_FP8_BLOCK - 1) / FA_FP8_BLOCK);
}

/* A quantize task's block: head h of batch b, rows [r0, r1). */
typedef struct fa_i_quant_block {
    int b, h, r0, r1;
} fa_i_quant_block;

static fa_i_quant_block fa_i_quantize_block_of(const fa_quantize_params *p, int task)
{
    const int blocks = fa_i_quantize_blocks(p), blk = task % blocks, bh = task / blocks;
    fa_i_quant_block q;
    q.b = bh / p->heads, q.h = bh % p->heads;
    q.r0 = blk * FA_FP8_BLOCK;
    q.r1 = p->seqlen - q.r0 < FA_FP8_BLOCK ? p->seqlen : q.r0 + FA_FP8_BLOCK;
    return q;
}

/* Pass 1, task = block of (b, h): its amax into job->shared[task]. */
static void fa_i_quantize_amax_task(const fa_i_job *job, int task, float *row)
{
    const fa_quantize_params *p = job->quantize;
    const fa_i_quant_block q = fa_i_quantize_block_of(p, task);
    float amax = 0.0f;
    int r, i;
    for (r = q.r0; r < q.r1; ++r) {
        fa_i_quantize_row(p, q.b, q.h, r, row);
        for (i = 0; i < p->head_dim; ++i) amax = fabsf(row[i]) > amax ? fabsf(row[i]) : amax;
    }
    job->shared[task] = amax;
}

/* Pass 2, task = block of (b, h): e4m3 values by its group's descale. */
static void fa_i_quantize_store_task(const fa_i_job *job, int task, float *row)
{
    const fa_quantize_params *p = job->quantize;
    const fa_i_quant_block q = fa_i_quantize_block_of(p, task);
    const float inv =
        1.0f / p->descale[fa_i_descale_index(p->scaling, q.b, q.h, p->heads, p->seqlen, q.r0)];
    int r, i;
    for (r = q.r0; r < q.r1; ++r) {
        uint8_t *out = (uint8_t *)p->out + fa_i_offset(&p->out_layout, q.b, q.h, r);
        fa_i_quantize_row(p, q.b, q.h, r, row);
        for (i = 0; i < p->head_dim; ++i) out[i] = fa_f32_to_e4m3(row[i] * inv);
    }
}

FA_API fa_status fa_quantize_resolve(const fa_quantize_params *p, fa_quantize_params *resolved)
{
    fa_quantize_params r;
    fa_status s;
    fa_i_detail[0] = '\0';
    if (!p) return fa_i_fail(FA_ERR_NULL_POINTER, "params is NULL");
    r = *p;
    if (r.batch <= 0 || r.heads <= 0 || r.seqlen <= 0 || r.head_dim <= 0)
        return fa_i_fail(FA_ERR_INVALID_SIZE,
                         "batch %d, heads %d, seqlen %d, head_dim %d: each must be positive",
                         r.batch, r.heads, r.seqlen, r.head_dim);
    if (r.head_dim > FA_MAX_HEAD_DIM)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "head_dim %d > %d", r.head_dim, FA_MAX_HEAD_DIM);
    if (r.seqlen > FA_MAX_SEQLEN)
        return fa_i_fail(FA_ERR_INVALID_SIZE, "seqlen %d > FA_MAX_SEQLEN (%d)", r.seqlen,
                         FA_MAX_SEQLEN);
    if (r.dtype != FA_DTYPE_F32 && r.dtype != FA_DTYPE_F16 && r.dtype != FA_DTYPE_BF16)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "dtype %d: quantize takes f32, f16 or bf16",
                         (int)r.dtype);
    if ((int)r.scaling < 0 || r.scaling >= FA_FP8_SCALE_COUNT)
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT, "scaling %d is not a fa_fp8_scaling",
                         (int)r.scaling);
    if (r.hadamard && (r.head_dim & (r.head_dim - 1)))
        return fa_i_fail(FA_ERR_INVALID_ARGUMENT,
                         "hadamard needs a power-of-two head_dim, not %d", r.head_dim);
    if (!r.x || !r.out || !r.descale)
        return fa_i_fail(FA_ERR_NULL_POINTER, "x, out and descale are required");
    if ((s = fa_i_check_layout(&r.x_layout, "x_layout", r.batch, r.seqlen, r.heads, r.head_dim)) !=
            FA_OK ||
        (s = fa_i_check_layout(&r.out_layout, "out_layout", r.batch, r.seqlen, r.heads,
                               r.head_dim)) != FA_OK)
        return s;
    if ((int64_t)r.batch * r.heads * (((int64_t)r.seqlen + FA_FP8_BLOCK - 1) / FA_FP8_BLOCK) >
        0x7fffffff)
        return fa_i_fail(FA_ERR_INVALID_SIZE, "more than 2^31 - 1 row blocks");
    if (resolved) *resolved = r;
    return FA_OK;
}

FA_API fa_status fa_cpu_quantize_fp8(const fa_quantize_params *params, const fa_cpu_options *opt)
{
    fa_quantize_params p;
    fa_cpu_options o;
    fa_i_job job;
    fa_status s;
    int blocks, bh, i, j;
    if ((s = fa_quantize_resolve(params, &p)) != FA_OK) return s;
    if ((s = fa_i_cpu_options(opt, &o)) != FA_OK) return s;
    blocks = fa_i_quantize_blocks(&p);
    bh = p.batch * p.heads;
    memset(&job, 0, sizeof job);
    job.quantize = &p;
    job.scratch_floats = (size_t)p.head_dim;
    job.num_tasks = bh * blocks;
    job.shared = (float *)FA_MALLOC(sizeof(float) * (size_t)job.num_tasks);
    if (!job.shared) return fa_i_fail(FA_ERR_OUT_OF_MEMORY, "%d block maxima", job.num_tasks);
    job.run = fa_i_quantize_amax_task;
    s = fa_i_run_job(&job, &o);
    if (s == FA_OK) { /* each group's descale from its amax */
        const int groups = p.scaling == FA_FP8_SCALE_BLOCK ? job.num_tasks
                           : p.scaling == FA_FP8_SCALE_HEAD ? bh : 1;
        const int per = job.num_tasks / groups;
        for (i = 0; i < groups; ++i) {
            float amax = 0.0f;
            for (j = 0; j < per; ++j)
                amax = job.shared[i * per + j] > amax ? job.shared[i * per + j] : amax;
            p.descale[i] = fa_i_fp8_descale(amax, p.pow2_descale);
        }
        job.run = fa_i_quantize_store_task;
        job.next_task = 0;
        s = fa_i_run_job(&job, &o);
    }
    FA_FREE(job.shared);
    return s;
}

#undef FA_I_BM
#undef FA_I_BN
#undef FA_I_BWD_BN

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_IMPLEMENTATION_DONE */
#endif /* FLASHATTN_IMPLEMENTATION */

/*
REVISION HISTORY
   0.16.0 GPU paged prefill: pages of 4 to 16 keys at d <= 128 read in
          place by the FA3 forward, its producer warpgroup's threads
          copying the key tiles (cp.async); with device tables from 4096
          query rows x GQA group they gather into the workspace first
   0.15.2 GPU decode: the split-KV combine specialized for fp32 parts;
          the wgmma decode kernel overlaps a tile's softmax with the
          previous tile's P V (d <= 128)
   0.15.1 GPU: paged decode over pages of whole key tiles (page_size a
          multiple of 64) and of whole 16-key slices (a multiple of 16,
          d = 64 and 128) on decode kernels of their own
   0.15.0 tables_on_device: a paged cache's device tables for every
          prefill chunk of 16-bit K/V on Hopper (pages the FA3 forward
          does not read in place gathered on the device first; the
          workspace holds batch x capacity rows); the CPU's products and
          exps on NEON on arm64 (FA_CPU_NEON)
   0.14.0 tables_on_device: varlen's device offsets also for Hopper's
          atomic-mode FA3 backward (the schedule made on the GPU; bad
          offsets: NaN rows of dQ, dK, dV or nothing), and a paged cache's
          device tables for prefill chunks (seqlen_q > 16) where Hopper's
          FA3 forward reads the pages in place
   0.13.0 varlen: total_q, total_k (the packed tensors' rows); with
          tables_on_device cu_seqlens_q/k and seqused_k in device memory
          on Hopper's FA3 forward, the schedule made on the GPU (no host
          copy, graph capturable; bad offsets: NaN rows or nothing);
          the decode split rule keeps the CTAs an SM holds for the page
          walk at every head dim
   0.12.0 paged K/V: tables_on_device, block_table and cache_seqlens in
          device memory on the GPU decode path (no host copy, graph
          capturable), checked by the kernels (bad sequences: NaN rows);
          an entry that is not a page read as page 0
   0.11.1 GPU: the decode split rule keeps the CTAs an SM holds where row
          blocks share each K/V tile (16 tokens at groups of 8 and 16)
   0.11.0 GPU: the wgmma decode kernel at d = 256 (more than 32 packed
          rows, dense or paged); the split rule's one CTA an SM also for
          the dense wgmma kernel at d = 64
   0.10.1 GPU: the decode split rule fills one CTA an SM (fewer, longer
          splits), but for the page walk and the wgmma kernel at d <= 64;
          version macros in step with this line again
   0.10.0 GPU: head dims that are not a multiple of 8 (59, 111, ...) in
          16-byte rows (padded layouts), forward, backward and decode;
          paged prefill reads pages of 32 in place (table entries loaded
          ahead); the wgmma decode over paged caches and smaller head dims;
          the page gather in one launch; the split library's ptxas on every
          core (CUDA_LIB_PTXAS)
   0.9.0  GPU: decode with more than 32 GQA-packed rows (speculative
          tokens) runs a wgmma kernel on Hopper at d = 64 and 128; FA3
          forward grids take one tile per CTA where tiles are no more than
          the SMs; paged prefill reads pages of 64 keys in place below the
          key tile; FP8 at d = 128 takes 192-key tiles with per-head or
          per-tensor descales (tile table FA_FA3_FP8_TILE_<d>_<v>)
   0.8.0  GPU: paged prefill chunks read the pages in place on Hopper's FA3
          forward where its key tile divides the page; the atomic backward
          at d = 96 and 192 on FA3's tiles of 128 and 256, and at d <= 32
          and 129 ... 160 on FA2's of 32 and 160; O += P V on the tile of
          256 issues only V's chunks up to head_dim_v; the quantizer's
          rotation butterflies as one FMA; the varlen backward in one launch
          on Hopper (a varlen instance of the FA3 backward)
   0.7.2  GPU: the paged decode copy runs one loop per row mode and walks
          its pages from tile to tile; the FA2 forward orders its warp's
          Q reads before its O writes (__syncwarp)
   0.7.1  FP8: fa_quantize_params.pow2_descale (descales as powers of two);
          the GPU forward keeps O in one V scale where V's descales allow
          and rescales O only where a row's max rose by more than 0.75 (base
          2); the V transpose's address arithmetic trimmed
   0.7.0  GPU: decode takes 32 keys a warp step where a warp owns a row
          tile, its combine a programmatic dependent launch on 9.0+; paged
          decode walks a slice's rows from one address; the FA2 backward
          with head_dim_v; an unsupported backward answers before the
          workspace check
   0.6.2  CPU: K tiles and the backward's P and dS transposed by 8 x 8 SIMD
          blocks; the forward's rescale factors as vector exps; one scratch
          allocation a job, made before its threads start; decode streams K
          and V rows once for all heads (BSHD and paged), GQA products over
          staged K and V rows; FA_CPU_PACK_BYTES 16 MiB
   0.6.1  GPU: the forward on Hopper's kernels at every head dim (32, 96,
          160, 192 on the next FA3 tile); head_dim_v backward at 192 / 128;
          paged decode looks up a tile's pages a tile ahead. CPU: the
          forward's key tile 128 (FA_CPU_BWD_BLOCK_N keeps the backward's
          64), 128 query rows for masked forwards (FA_CPU_BLOCK_M_MASKED),
          the AVX-512 exp by scalef
   0.6.0  GPU: paged K/V caches (decode reading the pages in place, longer
          query chunks gathered), the append, examples/decode_loop.cu; any
          head dim that is a multiple of 8 up to 256 on a larger compiled
          one's kernels; head_dim_v in the forward (and the Hopper backward)
   0.5.0  Context parallelism: positions (a chunk pair masks as the whole
          sequence), backward accumulate_grads and grads_f32, the running
          merge (fa_combine_params.accumulate, any 16-bit or fp32 parts);
          examples/ring_attention.cu
   0.4.0  FP8 (e4m3) forward: block, head or tensor descales, o in bf16 or
          f16; fa_cpu/fa_cuda_quantize_fp8 with the Hadamard rotation; the
          CPU forward and the reference take fp8 inputs. Ragged batches
          (cu_seqlens, seqused_k) and paged K/V caches with the append
          (block_table, cache_seqlens, k_new/v_new) on the CPU.
          FA_MAX_SEQLEN; outputs that overlap inputs are refused
   0.3.0  CPU: AVX2 + FMA microkernels, vector exp and 16-bit loads, 192 x 64
          tiles, caller-owned thread pools (fa_cpu_pool_create)
   0.2.0  split-KV and fa_*_combine; the GPU decode path (seqlen_q <= 16);
          flashattn_cuda.cuh laid out in dataflow order, tile tables per family
   0.1.0  first release: CPU FA1/FA2 orders, GPU FA1/FA2/FA3 forward and backward

------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the flashattn authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
