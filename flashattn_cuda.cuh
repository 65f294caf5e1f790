/* flashattn_cuda.cuh - v0.16.0 - FlashAttention on NVIDIA GPUs, template-free CUDA C.
   MIT licence: see the end of flashattn.h.

   QUICK GUIDE
   In exactly one .cu file (FLASHATTN_IMPLEMENTATION too, unless another
   file of yours implements flashattn.h):
       #define FLASHATTN_IMPLEMENTATION
       #define FLASHATTN_CUDA_IMPLEMENTATION
       #include "flashattn_cuda.cuh"
   nvcc -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
   Pointers in fa_params (flashattn.h) are device pointers; every call is
   asynchronous on its stream, takes scratch only from the caller
   (fa_cuda_*_workspace_size) and validates everything before it writes.

   What runs where (fa_cuda_forward_algorithm / _backward_algorithm say it):
     forward   FA3 on compute capability 9.0 when the build has sm_90a, at
               d = 64, 128, 256: persistent warp-specialized CTAs, TMA, wgmma.
               FA2 (mma.sync, sm_80 and newer) everywhere else, and where FA3
               can't take a problem (the driver refuses a tensor map).
               FA1 with FA_VARIANT=1: the teaching kernel, global O/m/l state.
     decode    seqlen_q <= 16: the query heads sharing a kv head packed as
               one tile's rows, keys split over CTAs and merged by the
               combine; mma.sync, or on Hopper with more than 32 packed rows
               (the tiles of 64, 128 and 256; dense or paged) wgmma.
     fp8       the FA3 forward with e4m3 Q, K, V (d = 64, 128, 256), V
               transposed in the kernel; fa_cuda_quantize_fp8 makes its inputs.
     backward  FA3 on Hopper (dQ by bulk reduce-add) on the tiles of d = 64,
               128, 256, but for d <= 32 and 129 ... 160 (FA2's own tiles);
               FA2 elsewhere, and always in the deterministic mode (a
               separate dQ kernel, no atomics).
     varlen    cu_seqlens in host memory. On Hopper the whole batch in one
               launch of the FA3 forward or (atomic mode) backward kernel:
               tensor maps per sequence, the longest first. Otherwise each
               sequence as a dense problem of batch 1, in turn on the
               stream, the LSE rows moved by 2-D copies (>> host, at the end).
               tables_on_device (Hopper's FA3 forward and atomic-mode
               backward): the same one launch, its maps and work list made
               on the device (>> schedules).
     paged     the block table copied into the workspace (tables_on_device:
               read in place, checked by the kernels; the FA3 forward's
               schedule made on the device, >> schedules), k_new/v_new
               appended by a copy kernel; seqlen_q <= 16 on the decode
               kernel reading the pages in place, longer query chunks on
               the FA3 forward reading them in place where its key tile
               divides the page or a page divides the tile in at most 4
               boxes (one launch, as varlen), else gathered per
               sequence and run dense (>> host, at the end); with
               tables_on_device every sequence gathered at once, then
               the one launch.
   Head dims 32 64 96 128 160 192 256, f16 and bf16 (and fp8 as above);
   other head dims up to 256 run on a larger head dim's kernels, the
   columns past d zero-filled on load and never stored (fa_i_find_kernels);
   one that is not a multiple of 8 needs 16-byte rows (padded layouts), its
   last chunk read and stored in part (fa_i_chunk_bytes, fa_i_copy8_part).
   head_dim_v != head_dim likewise (16-bit, both multiples of 8); its
   backward on the Hopper kernel only (atomic mode).
   Options: >> options.

   CONTENTS  sections in dataflow order; search for ">> name"
     >> api  >> options  >> tile tables  >> types  >> ptx helpers  >> common
     >> fa1  >> fa2 forward  >> fa3 forward  >> decode  >> combine  >> schedules  >> quantize
     >> backward common  >> fa2 backward  >> fa3 backward  >> instantiation  >> host

   INCLUDE TREE  kernels are stamped per head dim and dtype by including this
   file again; FA_I_PASS names the one block that is live in such an include,
   and every such #include is in >> instantiation:
     flashattn_cuda.cuh                   api, options, helpers, host code
       FA_I_PASS_HEAD_DIM  per head dim   the kernel table fa_i_kernels_<d>
         FA_I_PASS_DTYPE   per dtype
           FA_I_PASS_FA2_FWD              fa_i_fwd_fa2_<dt>_d<d>
           FA_I_PASS_FA3_FWD   per tile   fa_i_fwd_fa3_<dt>_d<d>_t<v> (dt e4m3: FP8)
           FA_I_PASS_FA2_BWD_KV per tile  fa_i_bwd_kv_fa2[_dq]_<dt>_d<d>_s<kb>
           FA_I_PASS_FA2_BWD_Q            fa_i_bwd_q_fa2_<dt>_d<d>
           FA_I_PASS_FA3_BWD  dense, varlen fa_i_bwd_fa3_<dt>_d<d>[_varlen]
*/

/* >> api ====================================================================== */
#if !defined(FA_I_PASS) && !defined(FLASHATTN_CUDA_H)
#define FLASHATTN_CUDA_H

#include <cuda_runtime.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FA_OK when this build and the current device run p (the backward in its
   default, atomic mode: fa_cuda_backward_algorithm(p, 1) answers for the
   deterministic one); otherwise the status the call would return, with
   fa_last_error_detail() saying why. */
FA_API fa_status fa_cuda_supported(const fa_params *p, fa_pass pass);

/* The forward algorithm fa_cuda_forward runs for p on the current device:
   1 FA1, 2 FA2 (mma.sync), 3 FA3 (Hopper sm_90a), 4 decode (seqlen_q <= 16:
   GQA-packed, split-KV); 0 when p is unsupported. */
FA_API int fa_cuda_forward_algorithm(const fa_params *p);

/* The backward algorithm fa_cuda_backward runs for p: 2 FA2 (mma.sync), 3
   FA3 (Hopper sm_90a, d = 64, 128, 256, not deterministic); 0 when p is unsupported. */
FA_API int fa_cuda_backward_algorithm(const fa_params *p, int deterministic);

/* Bytes of workspace the forward would use on the current device: the
   split-KV parts of the decode path (seqlen_q <= 16), FA1's O, m and l; 0 for
   FA2 and FA3. With less (NULL, 0 included), the decode path runs unsplit
   unless p->num_splits forces a split, which then is FA_ERR_WORKSPACE. */
FA_API size_t fa_cuda_forward_workspace_size(const fa_params *p);
FA_API fa_status fa_cuda_forward(const fa_params *p, void *workspace, size_t workspace_size,
                                 cudaStream_t stream);

/* Backward: reads q, k, v, o, lse, dout; writes dq, dk, dv. deterministic
   nonzero gives bitwise-identical gradients run after run. */
FA_API size_t fa_cuda_backward_workspace_size(const fa_params *p, int deterministic);
FA_API fa_status fa_cuda_backward(const fa_params *p, int deterministic, void *workspace,
                                  size_t workspace_size, cudaStream_t stream);

/* Merges partial results (fa_combine_params in flashattn.h) on the stream:
   device pointers in o_parts, lse_parts (host arrays of them), o and lse. */
FA_API fa_status fa_cuda_combine(const fa_combine_params *p, cudaStream_t stream);

/* Quantizes x to e4m3 with block descales (fa_quantize_params in
   flashattn.h, scaling FA_FP8_SCALE_BLOCK; the others: fa_cpu_quantize_fp8)
   on the stream, device pointers; compute capability 8.9 and newer. */
FA_API fa_status fa_cuda_quantize_fp8(const fa_quantize_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_CUDA_H */

/* The include that implements the library (or, split, a kernel unit of it:
   FA_CUDA_SPLIT in >> options) sets FA_I_TOP for its own top-level sections
   (the kernel blocks below run in nested includes). FA_I_HOST: this unit
   has the host code and the kernels every head dim shares; FA_I_KERNELS:
   it has the per-head-dim kernels of FA_HEAD_DIM. */
#if (defined(FLASHATTN_CUDA_IMPLEMENTATION) || defined(FLASHATTN_CUDA_KERNELS)) && \
    !defined(FA_I_PASS) && !defined(FLASHATTN_CUDA_IMPLEMENTATION_DONE)
#define FLASHATTN_CUDA_IMPLEMENTATION_DONE
#define FA_I_TOP
#ifndef FA_CUDA_SPLIT
#define FA_CUDA_SPLIT 0
#endif
#if defined(FLASHATTN_CUDA_IMPLEMENTATION) && defined(FLASHATTN_CUDA_KERNELS)
#error "flashattn: a unit is FLASHATTN_CUDA_IMPLEMENTATION or FLASHATTN_CUDA_KERNELS, not both"
#endif
#if defined(FLASHATTN_CUDA_KERNELS) && !FA_CUDA_SPLIT
#error "flashattn: FLASHATTN_CUDA_KERNELS makes a kernel unit of a build with FA_CUDA_SPLIT 1"
#endif
#ifdef FLASHATTN_CUDA_IMPLEMENTATION
#define FA_I_HOST 1
#define FA_I_KERNELS (!FA_CUDA_SPLIT)
#else
#define FA_I_HOST 0
#define FA_I_KERNELS 1
#endif
#if FA_CUDA_SPLIT /* a unit calls only some of the shared device helpers */
#pragma nv_diagnostic push
#pragma nv_diag_suppress 177
#endif
#ifdef FLASHATTN_IMPLEMENTATION
#include "flashattn.h" /* the CPU implementation and validation, once */
#endif
#include <stdint.h>
#include <string.h>
#endif

/* >> options ================================================================== */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
/* User options (define before including):
     FA_VARIANT     2 (default): FA2/FA3 forward; 1: the FA1 teaching kernel
     FA_HEAD_DIM    0 (default: every head dim) or one of 32 64 96 128 160 192 256
     FA_CUDA_DTYPE  0 (default: f16, bf16 and the fp8 forward), 1 f16 only,
                    2 bf16 only, 3 fp8 (e4m3) only
     FA_SM90        1 (default): build the Hopper FA3 kernels (CUDA >= 12.5; they
                    run from a -gencode=arch=compute_90a,code=sm_90a build); 0: not
     FA_CUDA_SPLIT  0 (default): the implementation unit holds every kernel.
                    1: the library is split over translation units, each
                    compiled from this file (nvcc -x cu flashattn_cuda.cuh) with
                    the same options: the implementation unit
                    (FLASHATTN_CUDA_IMPLEMENTATION) has the host code and the
                    shared kernels, and links the head dims FA_HEAD_DIM
                    names; a kernel unit (-DFLASHATTN_CUDA_KERNELS) has the
                    kernels of one of them, FA_CUDA_UNIT_HEAD_DIM (by default
                    FA_HEAD_DIM). `make cuda-lib` builds them in parallel
                    (README, "Building").
   Lab switches (ablations; the default builds what the tile tables ask for):
     FA_FA3_OVERLAP      1: a key tile's S = QK^T is issued with the previous
                         tile's PV, so the softmax overlaps a GEMM; 0: one after
                         the other (and no FP8 kernels)
     FA_FA3_PINGPONG     1: tiles whose PINGPONG column is 1 alternate their
                         warpgroups' GEMMs; 0: no tile does
     FA_FA3_SPECULATIVE  1: tiles whose SOFTMAX column is 1 or 2 use speculative
                         exps; 0: every tile takes the row max first (form 0)
     FA_FA2_SPECULATIVE  1: FA2 forward tiles whose SPEC column is 1 do; 0: none
   Every tile table row (>> tile tables) can be replaced with -D as well. */
#ifndef FA_VARIANT
#define FA_VARIANT 2
#endif
#if FA_VARIANT != 1 && FA_VARIANT != 2
#error "flashattn: FA_VARIANT must be 1 or 2"
#endif
#ifndef FA_HEAD_DIM
#define FA_HEAD_DIM 0
#endif
/* The GPU head dims, as an X-macro list. */
#define FA_I_HEAD_DIMS(X) X(32) X(64) X(96) X(128) X(160) X(192) X(256)
#define FA_I_IS_HEAD_DIM(d) FA_HEAD_DIM == (d) ||
#if FA_HEAD_DIM != 0 && !(FA_I_HEAD_DIMS(FA_I_IS_HEAD_DIM) 0)
#error "flashattn: FA_HEAD_DIM must be 0 (all) or one of 32 64 96 128 160 192 256"
#endif
#ifndef FA_CUDA_DTYPE
#define FA_CUDA_DTYPE 0
#endif
#if FA_CUDA_DTYPE < 0 || FA_CUDA_DTYPE > 3
#error "flashattn: FA_CUDA_DTYPE must be 0 (all), 1 (f16), 2 (bf16) or 3 (fp8)"
#endif
#ifndef FA_SM90
#define FA_SM90 1
#endif
#ifndef FA_FA3_OVERLAP
#define FA_FA3_OVERLAP 1
#endif
#ifndef FA_FA3_PINGPONG
#define FA_FA3_PINGPONG 1
#endif
#ifndef FA_FA3_SPECULATIVE
#define FA_FA3_SPECULATIVE 1
#endif
#ifndef FA_FA2_SPECULATIVE
#define FA_FA2_SPECULATIVE 1
#endif
/* The Hopper path finds cuTensorMapEncodeTiled through the runtime's
   cudaGetDriverEntryPointByVersion (CUDA 12.5), so no -lcuda is needed. */
#if FA_SM90 && FA_VARIANT == 2 && CUDART_VERSION >= 12050
#define FA_I_SM90 1
#include <cuda.h>
#include <cudaTypedefs.h>
#else
#define FA_I_SM90 0
#endif

/* The head dims whose kernels this unit builds: the build's, or a kernel
   unit's own. */
#ifdef FLASHATTN_CUDA_KERNELS
#ifndef FA_CUDA_UNIT_HEAD_DIM
#define FA_CUDA_UNIT_HEAD_DIM FA_HEAD_DIM
#endif
#if FA_CUDA_UNIT_HEAD_DIM == 0 || !(FA_HEAD_DIM == 0 || FA_HEAD_DIM == FA_CUDA_UNIT_HEAD_DIM)
#error "flashattn: a kernel unit needs FA_CUDA_UNIT_HEAD_DIM, one of the build's head dims"
#endif
#define FA_I_BUILD_D(d) (FA_CUDA_UNIT_HEAD_DIM == (d))
#else
#define FA_I_BUILD_D(d) (FA_HEAD_DIM == 0 || FA_HEAD_DIM == (d))
#endif
#define FA_I_CAT2(a, b) a##b
#define FA_I_CAT(a, b) FA_I_CAT2(a, b)
#define FA_I_APPLY(f, args) f args
/* Kernel names: the literal stem at the definition, then dtype, head dim
   and (FA3 forward) tile variant, e.g. fa_i_fwd_fa3_bf16_d128_t0. */
#define FA_I_KNAME(stem) FA_I_CAT(stem, FA_I_CAT(FA_I_CAT(_, FA_I_DT), FA_I_CAT(_d, FA_I_D)))
#define FA_I_KNAME_V(stem) FA_I_CAT(FA_I_KNAME(stem), FA_I_CAT(_t, FA_I_V))

/* The blocks a nested include can make live (>> instantiation). */
#define FA_I_PASS_HEAD_DIM 1
#define FA_I_PASS_DTYPE 2
#define FA_I_PASS_FA2_FWD 3
#define FA_I_PASS_FA3_FWD 4
#define FA_I_PASS_FA2_BWD_KV 5
#define FA_I_PASS_FA2_BWD_Q 6
#define FA_I_PASS_FA3_BWD 7
#define FA_I_PASS_DECODE 8

/* FP8 forward: P = 2^(s - max + FA_I_FP8_P_SHIFT), in [0, 256], so that
   small probabilities keep e4m3's normal range (the row sums carry it, LSE
   takes it off). A row's max stays until some row of the warp rises past
   it by more than FA_I_FP8_MAX_SLACK (base 2), P then staying under
   2^(8 + slack) = 430 < 448, e4m3's largest. */
#define FA_I_FP8_P_SHIFT 8.0f
#define FA_I_FP8_MAX_SLACK 0.75f
#define FA_I_LOG2E_F 1.4426950408889634f
#define FA_I_LN2_F 0.6931471805599453f
#endif /* >> options */

/* >> tile tables =============================================================
   One table per kernel family, one row per head dim (and tile variant or
   shared-memory budget), each row a macro that -D can replace. Chosen so
   that no kernel spills registers (`make test` fails on a ptxas spill or a
   wgmma serialization warning) and every tile's shared memory fits its
   budget (static_asserts in >> instantiation). bench/DESIGN.md says why
   each row is what it is. */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
/* A column of a row: FA_I_COL(FA2_FWD, KEYS, FA_FA2_FWD_TILE_64). */
#define FA_I_COL(table, column, row) FA_I_APPLY(FA_I_##table##_##column, (row))
/* The same of a row given in parentheses, which passes through macros as one argument. */
#define FA_I_COLP(table, column, prow) FA_I_APPLY(FA_I_##table##_##column, prow)

/* FA2 forward (mma.sync): one CTA per query block.
     ROWS    query rows per CTA: 16 or 32 per warp
     KEYS    keys per K/V tile, a multiple of 16
     WARPS   warps per CTA; each owns ROWS / WARPS rows
     STAGES  K/V buffers: 2 double-buffers (one barrier per key tile); 1 loads
             V during QK^T and the next K during PV (two barriers)
     SPEC    1: speculative exps (as FA3's SOFTMAX form 1), 0: row max first
                              ROWS KEYS WARPS STAGES SPEC */
#ifndef FA_FA2_FWD_TILE_32
#define FA_FA2_FWD_TILE_32     128, 128, 4,    2,     0
#endif
#ifndef FA_FA2_FWD_TILE_64
#define FA_FA2_FWD_TILE_64     128, 128, 4,    2,     0
#endif
#ifndef FA_FA2_FWD_TILE_96
#define FA_FA2_FWD_TILE_96     128, 64,  4,    2,     0
#endif
#ifndef FA_FA2_FWD_TILE_128
#define FA_FA2_FWD_TILE_128    128, 64,  4,    2,     0
#endif
#ifndef FA_FA2_FWD_TILE_160
#define FA_FA2_FWD_TILE_160    64,  64,  4,    2,     0
#endif
#ifndef FA_FA2_FWD_TILE_192
#define FA_FA2_FWD_TILE_192    64,  64,  4,    2,     0
#endif
#ifndef FA_FA2_FWD_TILE_256
#define FA_FA2_FWD_TILE_256    64,  64,  4,    1,     1
#endif
#define FA_I_FA2_FWD_ROWS(rows, keys, warps, stages, spec) rows
#define FA_I_FA2_FWD_KEYS(rows, keys, warps, stages, spec) keys
#define FA_I_FA2_FWD_WARPS(rows, keys, warps, stages, spec) warps
#define FA_I_FA2_FWD_STAGES(rows, keys, warps, stages, spec) stages
#define FA_I_FA2_FWD_SPEC(rows, keys, warps, stages, spec) spec

/* FA2 backward dK/dV kernel (both modes): one CTA of 8 warps per key block,
   walking the query blocks that see it. A row per head dim and
   shared-memory budget: s163 for compute capability 8.0 (the default),
   s227 where the device allows 227 KB (9.0, 10.0), s99 where it allows
   less than s163 needs (99 KB: 8.6, 8.9); KEYS 0: no such tile.
     KEYS      keys per CTA
     ROWS      query rows per step
     QST, DOST buffers of Q and of dO (2: the next step's load during this one)
     SW        warps over the rows of S and dP (the rest split the keys)
     KVW       warps over the keys of dK and dV (the rest split d)
     QW        warps over the rows of dQ (the rest split d)
                                 KEYS ROWS QST DOST SW KVW QW */
#ifndef FA_FA2_BWD_TILE_32_163
#define FA_FA2_BWD_TILE_32_163    128, 128, 2,  2,   2, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_64_163
#define FA_FA2_BWD_TILE_64_163    128, 128, 1,  1,   2, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_96_163
#define FA_FA2_BWD_TILE_96_163    128, 64,  2,  1,   2, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_128_163
#define FA_FA2_BWD_TILE_128_163   128, 64,  2,  1,   2, 4,  2
#endif
#ifndef FA_FA2_BWD_TILE_160_163
#define FA_FA2_BWD_TILE_160_163   64,  64,  2,  1,   4, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_192_163
#define FA_FA2_BWD_TILE_192_163   64,  64,  2,  1,   4, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_256_163
#define FA_FA2_BWD_TILE_256_163   64,  64,  1,  1,   4, 2,  2
#endif
#ifndef FA_FA2_BWD_TILE_32_227
#define FA_FA2_BWD_TILE_32_227    0,   0,   0,  0,   0, 0,  0
#endif
#ifndef FA_FA2_BWD_TILE_64_227
#define FA_FA2_BWD_TILE_64_227    128, 128, 2,  2,   2, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_96_227
#define FA_FA2_BWD_TILE_96_227    0,   0,   0,  0,   0, 0,  0
#endif
#ifndef FA_FA2_BWD_TILE_128_227
#define FA_FA2_BWD_TILE_128_227   0,   0,   0,  0,   0, 0,  0
#endif
#ifndef FA_FA2_BWD_TILE_160_227
#define FA_FA2_BWD_TILE_160_227   0,   0,   0,  0,   0, 0,  0
#endif
#ifndef FA_FA2_BWD_TILE_192_227
#define FA_FA2_BWD_TILE_192_227   0,   0,   0,  0,   0, 0,  0
#endif
#ifndef FA_FA2_BWD_TILE_256_227
#define FA_FA2_BWD_TILE_256_227   64,  64,  2,  2,   4, 2,  2
#endif
#ifndef FA_FA2_BWD_TILE_32_99
#define FA_FA2_BWD_TILE_32_99     64,  64,  2,  2,   2, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_64_99
#define FA_FA2_BWD_TILE_64_99     64,  64,  2,  2,   2, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_96_99
#define FA_FA2_BWD_TILE_96_99     64,  64,  2,  1,   2, 4,  4
#endif
#ifndef FA_FA2_BWD_TILE_128_99
#define FA_FA2_BWD_TILE_128_99    64,  64,  1,  1,   2, 4,  2
#endif
#ifndef FA_FA2_BWD_TILE_160_99
#define FA_FA2_BWD_TILE_160_99    0,   0,   0,  0,   0, 0,  0
#endif
#ifndef FA_FA2_BWD_TILE_192_99
#define FA_FA2_BWD_TILE_192_99    0,   0,   0,  0,   0, 0,  0
#endif
#ifndef FA_FA2_BWD_TILE_256_99
#define FA_FA2_BWD_TILE_256_99    0,   0,   0,  0,   0, 0,  0
#endif
#define FA_I_FA2_BWD_KEYS(keys, rows, qst, dost, sw, kvw, qw) keys
#define FA_I_FA2_BWD_ROWS(keys, rows, qst, dost, sw, kvw, qw) rows
#define FA_I_FA2_BWD_QST(keys, rows, qst, dost, sw, kvw, qw) qst
#define FA_I_FA2_BWD_DOST(keys, rows, qst, dost, sw, kvw, qw) dost
#define FA_I_FA2_BWD_SW(keys, rows, qst, dost, sw, kvw, qw) sw
#define FA_I_FA2_BWD_KVW(keys, rows, qst, dost, sw, kvw, qw) kvw
#define FA_I_FA2_BWD_QW(keys, rows, qst, dost, sw, kvw, qw) qw

/* FA2 deterministic-mode dQ kernel: one CTA per query block, no atomics.
     ROWS  query rows per CTA (16 per warp)
     KEYS  keys per K/V tile (double-buffered)
     WARPS warps per CTA
                               ROWS KEYS WARPS */
#ifndef FA_FA2_BWDQ_TILE_32
#define FA_FA2_BWDQ_TILE_32     64,  64,  4
#endif
#ifndef FA_FA2_BWDQ_TILE_64
#define FA_FA2_BWDQ_TILE_64     64,  64,  4
#endif
#ifndef FA_FA2_BWDQ_TILE_96
#define FA_FA2_BWDQ_TILE_96     64,  64,  4
#endif
#ifndef FA_FA2_BWDQ_TILE_128
#define FA_FA2_BWDQ_TILE_128    64,  64,  4
#endif
#ifndef FA_FA2_BWDQ_TILE_160
#define FA_FA2_BWDQ_TILE_160    64,  32,  4
#endif
#ifndef FA_FA2_BWDQ_TILE_192
#define FA_FA2_BWDQ_TILE_192    64,  32,  4
#endif
#ifndef FA_FA2_BWDQ_TILE_256
#define FA_FA2_BWDQ_TILE_256    64,  32,  4
#endif
#define FA_I_FA2_BWDQ_ROWS(rows, keys, warps) rows
#define FA_I_FA2_BWDQ_KEYS(rows, keys, warps) keys
#define FA_I_FA2_BWDQ_WARPS(rows, keys, warps) warps

/* FA3 forward (Hopper): a row per head dim and tile variant. Variant t0
   serves every problem; t1 (ROWS 0: none) the problems fa_i_fa3_pick gives
   it: at d = 64 causal ones with Nq < 4096 (less diagonal waste than 192
   rows), at d = 128 unmasked ones with Nk >= 8192 (fewer tile boundaries).
     ROWS      query rows per CTA: 64 per consumer warpgroup (128 or 192)
     KEYS      keys per K/V tile, a multiple of 16 in 64..192
     STAGES    K/V ring stages
     QBUFS     Q buffers: 2 loads the next tile's Q during this one, where
               a second Q and O's own buffer fit in shared memory
     PINGPONG  1: the consumer warpgroups take turns on the tensor cores
     SOFTMAX   the key step's form: 0 row max first (the FA3 paper);
               speculative exps against the running max, redone only where
               it rose: 1 P kept in fp32 beside PV(n-1) (two warpgroups
               only), 2 P packed after PV(n-1)'s wait
     L2HINTS   1: Q and O evict-first, K and V evict-last in L2
                                 ROWS KEYS STAGES QBUFS PINGPONG SOFTMAX L2HINTS */
#ifndef FA_FA3_FWD_TILE_64_0
#define FA_FA3_FWD_TILE_64_0      192, 128, 2,     2,    1,       2,      0
#endif
#ifndef FA_FA3_FWD_TILE_64_1
#define FA_FA3_FWD_TILE_64_1      128, 128, 2,     2,    0,       1,      0
#endif
#ifndef FA_FA3_FWD_TILE_128_0
#define FA_FA3_FWD_TILE_128_0     128, 128, 2,     1,    0,       2,      0
#endif
#ifndef FA_FA3_FWD_TILE_128_1
#define FA_FA3_FWD_TILE_128_1     128, 176, 2,     1,    0,       0,      0
#endif
#ifndef FA_FA3_FWD_TILE_256_0
#define FA_FA3_FWD_TILE_256_0     128, 80,  2,     1,    1,       2,      1
#endif
#ifndef FA_FA3_FWD_TILE_256_1
#define FA_FA3_FWD_TILE_256_1     0,   0,   0,     0,    0,       0,      0
#endif
#define FA_I_FA3_FWD_ROWS(rows, keys, stages, qbufs, pingpong, softmax, l2) rows
#define FA_I_FA3_FWD_KEYS(rows, keys, stages, qbufs, pingpong, softmax, l2) keys
#define FA_I_FA3_FWD_STAGES(rows, keys, stages, qbufs, pingpong, softmax, l2) stages
#define FA_I_FA3_FWD_QBUFS(rows, keys, stages, qbufs, pingpong, softmax, l2) qbufs
#define FA_I_FA3_FWD_PINGPONG(rows, keys, stages, qbufs, pingpong, softmax, l2) pingpong
#define FA_I_FA3_FWD_SOFTMAX(rows, keys, stages, qbufs, pingpong, softmax, l2) softmax
#define FA_I_FA3_FWD_L2HINTS(rows, keys, stages, qbufs, pingpong, softmax, l2) l2

/* FA3 FP8 forward (Hopper, e4m3 Q, K, V): the FA3 forward's columns, with
   SOFTMAX 0; a row per head dim and variant (ROWS 0: none). t0 serves every
   problem: KEYS 64 or 128, so that a key tile has one descale of K and V
   (a divisor of FA_FP8_BLOCK), V^T rows of KEYS bytes. t1 serves those
   with one descale per head or tensor (fa_i_fp8_pick): KEYS 192, fewer
   steps' fixed costs, V^T in chunks of 64 keys.
                                 ROWS KEYS STAGES QBUFS PINGPONG SOFTMAX L2HINTS */
#ifndef FA_FA3_FP8_TILE_64_0
#define FA_FA3_FP8_TILE_64_0      192, 128, 2,     1,    0,       0,      0
#endif
#ifndef FA_FA3_FP8_TILE_64_1
#define FA_FA3_FP8_TILE_64_1      0,   0,   0,     0,    0,       0,      0
#endif
#ifndef FA_FA3_FP8_TILE_128_0
#define FA_FA3_FP8_TILE_128_0     128, 128, 2,     1,    0,       0,      0
#endif
#ifndef FA_FA3_FP8_TILE_128_1
#define FA_FA3_FP8_TILE_128_1     128, 192, 2,     1,    0,       0,      0
#endif
#ifndef FA_FA3_FP8_TILE_256_0
#define FA_FA3_FP8_TILE_256_0     128, 64,  2,     1,    0,       0,      0
#endif
#ifndef FA_FA3_FP8_TILE_256_1
#define FA_FA3_FP8_TILE_256_1     0,   0,   0,     0,    0,       0,      0
#endif

/* FA3 backward (Hopper, atomic mode): one CTA of two warpgroups per key block.
     KEYS    keys per CTA: 128 (a warpgroup owns 64) or 64 (both warpgroups
             on all of them, each with half of d: d = 256)
     STAGES  Q and dO buffers
                             KEYS STAGES */
#ifndef FA_FA3_BWD_TILE_64
#define FA_FA3_BWD_TILE_64    128, 2
#endif
#ifndef FA_FA3_BWD_TILE_128
#define FA_FA3_BWD_TILE_128   128, 2
#endif
#ifndef FA_FA3_BWD_TILE_256
#define FA_FA3_BWD_TILE_256   64,  1
#endif
#define FA_I_FA3_BWD_KEYS(keys, stages) keys
#define FA_I_FA3_BWD_STAGES(keys, stages) stages

/* Decode (>> decode: few query rows, GQA-packed, split-KV): 4 warps per CTA.
     KEYS    keys per K/V tile: a multiple of 64 (slices of 16)
     STAGES  K/V ring depth, at least 2
     DSPLIT  warps a row tile's O is split over by columns (2: each holds
             half of d; the registers of d = 256)
     STEP    16-key slices a warp takes at a time where the rows give each
             warp a whole row tile (2: two S chains in flight and one softmax
             pass over 32 keys; 1 where the registers don't hold them)
                              KEYS STAGES DSPLIT STEP */
#ifndef FA_DECODE_TILE_32
#define FA_DECODE_TILE_32      64,  4,     1,     2
#endif
#ifndef FA_DECODE_TILE_64
#define FA_DECODE_TILE_64      64,  4,     1,     2
#endif
#ifndef FA_DECODE_TILE_96
#define FA_DECODE_TILE_96      64,  3,     1,     2
#endif
#ifndef FA_DECODE_TILE_128
#define FA_DECODE_TILE_128     64,  3,     1,     2
#endif
#ifndef FA_DECODE_TILE_160
#define FA_DECODE_TILE_160     64,  2,     1,     2
#endif
#ifndef FA_DECODE_TILE_192
#define FA_DECODE_TILE_192     64,  2,     1,     1
#endif
#ifndef FA_DECODE_TILE_256
#define FA_DECODE_TILE_256     64,  2,     2,     2
#endif
#define FA_I_DECODE_KEYS(keys, stages, dsplit, step) keys
#define FA_I_DECODE_STAGES(keys, stages, dsplit, step) stages
#define FA_I_DECODE_DSPLIT(keys, stages, dsplit, step) dsplit
#define FA_I_DECODE_STEP(keys, stages, dsplit, step) step

/* Shared-memory budgets: the FA2 kernels' default tiles fit compute
   capability 8.0's 163 KB; Hopper allows 227 KB a block. */
#define FA_I_SMEM_MAX (163 * 1024)
#define FA_I_SM90_SMEM_MAX (227 * 1024)

/* FA3 registers per thread after setmaxnreg, for nc consumer warpgroups.
   setmaxnreg only moves registers within the CTA's launch allocation, 128
   (nc + 1) threads x 65536 / (128 (nc + 1)) rounded down to 8: asking for
   more makes the consumers' setmaxnreg.inc wait forever. The producer's
   tile loop spills at 24. nc = 2: 40 / 232 of 168; nc = 3: 32 / 160 of 128. */
#define FA_I_SM90_PRODUCER_REGS(nc) ((nc) == 2 ? 40 : 32)
#define FA_I_SM90_CONSUMER_REGS(nc) ((nc) == 2 ? 232 : 160)
/* The most boxes of keys the producer loads a key tile in from pages
   below the tile, their table entries held in its registers (pages of 32
   at the 128-key tiles; smaller pages its warpgroup's threads copy, or
   they are gathered: DESIGN.md). */
#define FA_I_FA3_BOXES 4
/* FP8's producer warpgroup also transposes V: with 3 consumers it keeps 40
   (its consumers need no more than 152: P is half the size). */
#define FA_I_SM90_PRODUCER_REGS_OF(nc, fp8) ((fp8) && (nc) == 3 ? 40 : FA_I_SM90_PRODUCER_REGS(nc))
#define FA_I_SM90_CONSUMER_REGS_OF(nc, fp8) ((fp8) && (nc) == 3 ? 152 : FA_I_SM90_CONSUMER_REGS(nc))
/* The gathering producer (paged caches, maps.gather) copies key tiles with
   all 128 threads: 56 registers, its two consumers (128-row tiles only)
   224 each. */
#define FA_I_SM90_GATHER_PRODUCER_REGS 56
#define FA_I_SM90_GATHER_CONSUMER_REGS 224
#define FA_I_SM90_LAUNCH_REGS(nc) (65536 / (128 * ((nc) + 1)) / 8 * 8)
static_assert(FA_I_SM90_PRODUCER_REGS(2) + 2 * FA_I_SM90_CONSUMER_REGS(2) <= 3 * FA_I_SM90_LAUNCH_REGS(2) &&
                  FA_I_SM90_PRODUCER_REGS(3) + 3 * FA_I_SM90_CONSUMER_REGS(3) <= 4 * FA_I_SM90_LAUNCH_REGS(3) &&
                  FA_I_SM90_PRODUCER_REGS_OF(3, 1) + 3 * FA_I_SM90_CONSUMER_REGS_OF(3, 1) <=
                      4 * FA_I_SM90_LAUNCH_REGS(3) &&
                  FA_I_SM90_GATHER_PRODUCER_REGS + 2 * FA_I_SM90_GATHER_CONSUMER_REGS <=
                      3 * FA_I_SM90_LAUNCH_REGS(2),
              "flashattn: setmaxnreg can't hand out more registers than the CTA launched with");
#endif /* >> tile tables */

/* >> types ==================================================================== */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
/* One compiled kernel and its launch shape. */
typedef struct fa_i_kernel {
    const void *fn; /* NULL: not in this build */
    int rows, keys; /* query rows and keys of its tile */
    int threads;
    size_t smem;    /* dynamic shared memory, bytes */
} fa_i_kernel;

/* What a decode kernel's key tiles read (a constant of each kernel, its
   name's suffix): dense rows of the tile's head dim; a paged cache's rows
   of that head dim in pages of whole key tiles (page_size a multiple of
   the tile's keys: one address a tile, _pages); in pages of whole 16-key
   slices (any other multiple of 16: an address a slice, the walk of
   fa_i_tile_pages, _slices); anything (every page size, a lookup a row
   where pages are not whole slices; head dims below the tile's, columns
   masked: _general, which serves the kinds a head dim does not build).
   Each path carried in a kernel that does not take it slowed that kernel
   (DESIGN.md, paged caches). */
typedef enum fa_i_decode_kind {
    FA_I_DECODE_DENSE,
    FA_I_DECODE_PAGES,
    FA_I_DECODE_SLICES,
    FA_I_DECODE_GENERAL,
    FA_I_DECODE_KINDS
} fa_i_decode_kind;

/* The kernels of one (head dim, dtype), built in >> instantiation. */
typedef struct fa_i_kernels {
    fa_i_kernel fa2_fwd;
    /* dK/dV per shared-memory budget, largest first (s227, s163, s99) and
       per mode ([0] adds dQ by atomics, [1] leaves dQ to fa2_bwd_q) */
    fa_i_kernel fa2_bwd_kv[3][2];
    fa_i_kernel fa2_bwd_q;  /* the deterministic mode's dQ */
    fa_i_kernel fa3_fwd[2]; /* tile variants t0, t1 */
    fa_i_kernel fa3_fwd_gather; /* paged: pages the TMA's boxes do not fit (FA_I_FA3_GATHER_V) */
    fa_i_kernel fa3_bwd;
    fa_i_kernel fa3_bwd_varlen; /* its instance for a ragged batch in one launch */
    /* by fa_i_decode_kind; rows: the most packed rows a CTA takes */
    fa_i_kernel decode[FA_I_DECODE_KINDS];
    fa_i_kernel decode_wg[FA_I_DECODE_KINDS]; /* Hopper: 64 rows by wgmma */
    int head_dim;           /* the tiles' (a problem's may be smaller: >> host) */
} fa_i_kernels;

/* The decode kernel's launch: row tiles of 16 per CTA, row blocks per kv
   head, key splits, and where splits > 1 the parts in the workspace: O of
   split i at o_part + i part_floats ([B, Nq, Hq, d] fp32), its LSE at
   lse_part + i lse_floats ([B, Hq, Nq]). */
typedef struct fa_i_decode_args {
    int row_tiles, row_blocks, splits;
    float *o_part, *lse_part;
    int64_t part_floats, lse_floats;
} fa_i_decode_args;

/* The parts the combine kernels merge (device pointers). */
typedef struct fa_i_combine_args {
    const void *o[FA_MAX_PARTS];
    const float *lse[FA_MAX_PARTS];
} fa_i_combine_args;

/* Arguments every backward kernel shares, beside the params. */
typedef struct fa_i_bwd_args {
    float *dsum;   /* [B, Hq, Nq] D = rowsum(dO * O) */
    float *dq_acc; /* fp32 dQ (atomic mode), else NULL: [B, Hq, 64-row blocks][64 acc_d], tiled
                      as fa_i_bwd_postprocess says */
    int acc_d;     /* the kernels' head dim (the tile's, >= the problem's) */
    const int2 *acc_rows; /* varlen: per 64-row block of a head's accumulator, its first packed
                             query row and its rows (NULL: dense) */
} fa_i_bwd_args;

/* A staged gradient (accumulate_grads, grads_f32): the backward's kernels
   write it contiguous [batch, seq, heads, d] in the dtype to src, and
   fa_i_bwd_grads_out adds it to (or writes it into) the caller's dst. */
typedef struct fa_i_grad_out {
    const uint16_t *src;
    void *dst;
    fa_layout dst_layout;
    int batch, seq, heads, d;
} fa_i_grad_out;

#if FA_I_SM90
/* A ragged batch (varlen) or a paged cache's sequences in one launch of an
   FA3 kernel: sequence s of the schedule (the host orders them by their
   work, largest first). */
typedef struct fa_i_fa3_seq {
    int nq, nk; /* its queries, the keys it uses */
    int q0, k0; /* its first rows in the packed tensors */
    int acc0;   /* backward: its first 64-row block in each head's dQ accumulator */
    int pad;
    int64_t lse0;   /* forward: its LSE rows, lse0 + h lse_head + r */
    int64_t pages0; /* paged: its row of the block table, b max_pages */
} fa_i_fa3_seq;

/* The FA3 forward's tensor maps {d, seq, head, batch}; each box is 64
   elements (128 bytes, one swizzle row) of the head dim by a tile's rows.
   By sequence (varlen, paged): every tile, {sequence, head << 16 | query
   block} in schedule order, and per sequence its entry and its own maps
   (batch 1, its rows only, so the TMA zero-fills keys past nk and drops O
   rows past nq), all in the workspace; NULL for a dense problem. Paged:
   k and v map the whole cache {d, row in page, head, page}, a sequence's
   own k and v only its last page's rows up to its last key. */
typedef struct fa_i_tma_maps {
    CUtensorMap q, k, v, o;
    const struct fa_i_tma_maps *seq_maps;
    const fa_i_fa3_seq *seqs;
    const int2 *tiles;
    int num_tiles;        /* with tile_count: a bound on it */
    const int *tile_count; /* a schedule made on the device (varlen, tables_on_device), else NULL */
    int lse_head;         /* by sequence: the LSE's head stride */
    const int32_t *pages; /* paged: the block table (the workspace's copy), else NULL */
    int page_shift;       /* paged: log2 of the page size */
    int gather;           /* paged: the producer warpgroup's threads copy the key tiles from
                             their pages (cp.async), where the TMA's boxes would be too many */
} fa_i_tma_maps;

/* The FA3 backward's arguments: tensor maps (boxes of 64 elements of d by 64
   query rows or the tile's keys) and the shared ones. Varlen: per sequence
   its own maps (batch 1, its rows only) and entry, per CTA column (grid x)
   its {sequence, first key}, and the dQ accumulator's 64-row blocks per
   head (every sequence's, each from a multiple of 128 rows); NULL and 0
   for a dense problem. */
typedef struct fa_i_fa3_bwd_args {
    CUtensorMap q, k, v, dout;
    fa_i_bwd_args a;
    const struct fa_i_fa3_bwd_args *seq_maps;
    const fa_i_fa3_seq *seqs;
    const int2 *key_blocks;
    int acc_blocks, total_q;
} fa_i_fa3_bwd_args;
#endif
#endif /* >> types */

/* >> ptx helpers ============================================================== */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
static __device__ __forceinline__ uint32_t fa_i_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; src_bytes 0 fills zeros (rows past the end). */
static __device__ __forceinline__ void fa_i_cp_async16_at(uint32_t smem, const void *gmem,
                                                          int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
                 "r"(src_bytes));
}
static __device__ __forceinline__ void fa_i_cp_async16(void *smem, const void *gmem, int src_bytes)
{
    fa_i_cp_async16_at(fa_i_smem_addr(smem), gmem, src_bytes);
}
/* A row of d columns ends inside its last 16-byte chunk where d % 8 != 0
   (rows 16-byte aligned: padded layouts): its bytes from that chunk on,
   as cp.async's src-size (the rest zero-filled), from `left` elements. */
static __device__ __forceinline__ int fa_i_chunk_bytes(int left)
{
    return min(16, max(0, 2 * left));
}

static __device__ __forceinline__ void fa_i_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}
static __device__ __forceinline__ void fa_i_cp_async_wait_0(void)
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
/* Waits until at most n of this thread's commit groups are pending. */
#define FA_I_CP_ASYNC_WAIT(n) asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory")
/* p[0..3] += v by reductions in L2: one vector instruction on sm_90 and
   newer, four scalar ones before. p is 16-byte aligned. */
static __device__ __forceinline__ void fa_i_red_add4(float *p, float4 v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
#else
    atomicAdd(p, v.x);
    atomicAdd(p + 1, v.y);
    atomicAdd(p + 2, v.z);
    atomicAdd(p + 3, v.w);
#endif
}
/* Programmatic dependent launch (fa_i_launch_ex): a CTA lets the stream's
   next kernel be scheduled; that kernel waits for this one's writes. Both
   are no-ops before sm_90 and for kernels launched without the attribute. */
static __device__ __forceinline__ void fa_i_launch_dependents(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}
static __device__ __forceinline__ void fa_i_wait_prerequisites(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/* Zeroes n mma.sync accumulator tiles. */
static __device__ __forceinline__ void fa_i_zero_acc(float (*c)[4], int n)
{
    int i;
#pragma unroll
    for (i = 0; i < n; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
}

/* Barrier `id` (1..15; __syncthreads owns 0) among `threads` threads. */
static __device__ __forceinline__ void fa_i_named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

static __device__ __forceinline__ void fa_i_ldmatrix_x4(uint32_t r[4], const void *smem)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_i_smem_addr(smem)));
}
static __device__ __forceinline__ void fa_i_ldmatrix_x4_trans(uint32_t r[4], const void *smem)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_i_smem_addr(smem)));
}

/* c += a * b on one m16n8k16 tile, fp32 accumulators. */
#define FA_I_DEFINE_MMA(name, type)                                                          \
    static __device__ __forceinline__ void name(float c[4], const uint32_t a[4], uint32_t b0, \
                                                uint32_t b1)                                  \
    {                                                                                        \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type                  \
                     ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"          \
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));        \
    }
FA_I_DEFINE_MMA(fa_i_mma_f16, "f16")
FA_I_DEFINE_MMA(fa_i_mma_bf16, "bf16")
#undef FA_I_DEFINE_MMA
static __device__ __forceinline__ void fa_i_mma(float c[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1, int bf16)
{
    if (bf16)
        fa_i_mma_bf16(c, a, b0, b1);
    else
        fa_i_mma_f16(c, a, b0, b1);
}

/* Two floats to one register of 16-bit pairs, lo in the low half. */
static __device__ __forceinline__ uint32_t fa_i_pack_f16(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
static __device__ __forceinline__ uint32_t fa_i_pack_bf16(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Four floats to one register of e4m3 bytes, a in the lowest (round to
   nearest even, saturated to +-448, NaN kept). The conversion exists from
   compute capability 8.9; the host runs no FP8 kernel below it. */
static __device__ __forceinline__ uint32_t fa_i_pack_e4m3(float a, float b, float c, float d)
{
    uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
#else
    (void)a, (void)b, (void)c, (void)d;
#endif
    return r;
}

static __device__ __forceinline__ float fa_i_dev_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* The online softmax's running max of one accumulator row, whose four
   lanes (lane % 4) hold mx, the max of their raw scores in this key step:
   fa_i_row_max gives the new running max in base-2 units; fa_i_row_max_move
   moves *m_run to it, with the factor for what was summed against the old
   one into *alpha, and returns the reference the exps subtract (0 for a
   row with nothing visible yet, which stays 0); fa_i_row_max_step does
   both. */
static __device__ __forceinline__ float fa_i_row_max(float mx, float log2_scale, float m_run)
{
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    return fmaxf(m_run, mx * log2_scale);
}
static __device__ __forceinline__ float fa_i_row_max_move(float mx, float *m_run, float *alpha)
{
    const float ref = mx == -INFINITY ? 0.0f : mx;
    *alpha = fa_i_dev_exp2(*m_run - ref);
    *m_run = mx;
    return ref;
}
static __device__ __forceinline__ float fa_i_row_max_step(float mx, float log2_scale, float *m_run,
                                                          float *alpha)
{
    return fa_i_row_max_move(fa_i_row_max(mx, log2_scale, *m_run), m_run, alpha);
}

/* The MUFU's log2 and reciprocal, for row sums (0, kept apart by the
   caller, or at least 1: never denormal). log2f and 1 / l compile to a
   polynomial and a division with a slow-path call (DESIGN.md f53). */
static __device__ __forceinline__ float fa_i_dev_log2(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
static __device__ __forceinline__ float fa_i_dev_rcp(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* FP8's V descales against O's units. O accumulates P V in units of one V
   descale, dv_ref; key tile n's V has descale dvn (positive). Where
   dvn / dv_ref is exactly a power of two at most 1 (equal descales, or
   both powers of two: fa_quantize_params.pow2_descale), P takes it as
   p_mul, exact in e4m3's exponent, and O keeps its units: returns 1.
   Otherwise P takes no factor and O moves to units of dvn: returns O's
   factor dv_ref / dvn, and dv_ref becomes dvn. */
static __device__ __forceinline__ float fa_i_fp8_v_units(float dvn, float *dv_ref, float *p_mul)
{
    const uint32_t a = __float_as_uint(dvn), r = __float_as_uint(*dv_ref);
    float o_mul;
    *p_mul = 1.0f;
    if (a == r) return 1.0f;
    if (!((a | r) & 0x007fffffu) && a < r && a >= 0x00800000u && r - a < (126u << 23)) {
        *p_mul = __uint_as_float(a - r + 0x3f800000u); /* 2^(exponent difference) */
        return 1.0f;
    }
    o_mul = *dv_ref * fa_i_dev_rcp(dvn);
    *dv_ref = dvn;
    return o_mul;
}

/* Scalar loads and stores of a 16-bit element for the small kernels. */
static __device__ __forceinline__ float fa_i_load16(const void *base, int64_t i, int bf16)
{
    const uint16_t h = ((const uint16_t *)base)[i];
    float f;
    if (bf16) return __uint_as_float((uint32_t)h << 16);
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
}
static __device__ __forceinline__ void fa_i_store16(void *base, int64_t i, float f, int bf16)
{
    uint16_t h;
    if (bf16) asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    else asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    ((uint16_t *)base)[i] = h;
}

#if FA_I_SM90 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Hopper (sm_90a): mbarriers, TMA, wgmma. Addresses are shared-memory
   (32-bit) addresses unless named otherwise. */

static __device__ __forceinline__ void fa_i_mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
/* Arrives once and tells the barrier to expect `bytes` from the copy engine. */
static __device__ __forceinline__ void fa_i_mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void fa_i_mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void fa_i_mbar_arrive_n(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count)
                 : "memory");
}
/* Waits until the barrier's phase of the given parity has completed. The
   suspend-time hint (10 ms) lets the thread sleep until then instead of
   spinning on the check (DESIGN.md, FA3 forward). */
static __device__ __forceinline__ void fa_i_mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, 10000000;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* Waits for two barriers: both checks issue before either result is
   needed, without the suspend-time hint (whose predicated sleep makes the
   next check wait for the first's result); only where one is not yet
   complete, the waits that suspend (DESIGN.md f44). */
static __device__ __forceinline__ void fa_i_mbar_wait2(uint32_t a, uint32_t parity_a, uint32_t b,
                                                       uint32_t parity_b)
{
    uint32_t done;
    asm volatile("{\n.reg .pred p, q;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 q, [%3], %4;\n"
                 "and.pred p, p, q;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(a), "r"(parity_a), "r"(b), "r"(parity_b)
                 : "memory");
    if (!done) {
        fa_i_mbar_wait(a, parity_a);
        fa_i_mbar_wait(b, parity_b);
    }
}

/* Brings a tensor map's descriptor into the cache before its first copy. */
static __device__ __forceinline__ void fa_i_tma_prefetch(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)(uintptr_t)map) : "memory");
}
/* Cache policies for the .L2::cache_hint forms below (the encodings CUTLASS
   uses for CacheHintSm90). */
#define FA_I_L2_EVICT_NORMAL 0x1000000000000000ull
#define FA_I_L2_EVICT_FIRST 0x12F0000000000000ull
#define FA_I_L2_EVICT_LAST 0x14F0000000000000ull
/* One box of a 4-D tensor map {d, seq, head, batch} into shared memory,
   completing on the mbarrier, with an L2 cache policy (FA_I_L2_EVICT_*).
   Out-of-range rows arrive as zeros. */
static __device__ __forceinline__ void fa_i_tma_load(uint32_t dst, const CUtensorMap *map, int c0,
                                                     int c1, int c2, int c3, uint32_t bar,
                                                     uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
                 "l"((uint64_t)(uintptr_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar),
                 "l"(policy)
                 : "memory");
}
/* Starts bringing one box of a 4-D tensor map into L2 (nothing waits on it). */
static __device__ __forceinline__ void fa_i_tma_prefetch_l2(const CUtensorMap *map, int c0, int c1,
                                                            int c2, int c3)
{
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                     (uint64_t)(uintptr_t)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
static __device__ __forceinline__ void fa_i_tma_store_commit(void)
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* One box from shared memory to global, with an L2 cache policy; rows past
   the tensor are dropped. */
static __device__ __forceinline__ void fa_i_tma_store(const CUtensorMap *map, uint32_t src, int c0,
                                                      int c1, int c2, int c3, uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group.L2::cache_hint"
                 " [%0, {%1, %2, %3, %4}], [%5], %6;\n" ::"l"((uint64_t)(uintptr_t)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src), "l"(policy)
                 : "memory");
}
/* Waits until this thread's stores have read their shared memory. */
static __device__ __forceinline__ void fa_i_tma_store_wait_read(void)
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/* Adds `bytes` of fp32 from shared memory into global memory (the copy
   engine's reduce-add; one bulk group, waited for like a TMA store). */
static __device__ __forceinline__ void fa_i_bulk_add_f32(float *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                     (uint64_t)(uintptr_t)dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
/* Orders this thread's ordinary shared-memory stores before later reads by
   the async proxy (TMA, wgmma). */
static __device__ __forceinline__ void fa_i_fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* An arrival on the mbarrier at shared address bar once every cp.async this
   thread has issued has landed (noinc: one of the arrivals its count
   expects); the thread goes on without waiting. */
static __device__ __forceinline__ void fa_i_cp_async_arrive(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void fa_i_named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

static __device__ __forceinline__ void fa_i_wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void fa_i_wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
#define FA_I_WGMMA_WAIT(n) asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n) : "memory")
/* After a wgmma wait: tells the compiler the registers changed here, so that
   no read of them moves above the wait and none of them is reused while a
   wgmma still reads or writes it. */
static __device__ __forceinline__ void fa_i_fence_f32(float *r, int n)
{
    int i;
#pragma unroll
    for (i = 0; i < n; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
static __device__ __forceinline__ void fa_i_fence_u32(uint32_t *r, int n)
{
    int i;
#pragma unroll
    for (i = 0; i < n; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

/* Shared-memory matrix descriptor with the 128-byte swizzle: start, leading
   and stride byte offsets (see the PTX ISA's wgmma section). */
static __device__ __forceinline__ uint64_t fa_i_wgmma_desc(uint32_t addr, uint32_t lead,
                                                           uint32_t stride)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lead & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((stride & 0x3FFFF) >> 4) << 32 | (uint64_t)1 << 62;
}
/* A K-major tile of rows of rb bytes (128: the 128-byte swizzle; 64: the
   64-byte one, FP8 at d = 64): 8-row groups rb * 8 bytes apart. */
static __device__ __forceinline__ uint64_t fa_i_wgmma_desc_rows(uint32_t addr, int rb)
{
    return rb == 128 ? fa_i_wgmma_desc(addr, 16, 1024)
                     : (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 |
                           (uint64_t)(512 >> 4) << 32 | (uint64_t)2 << 62;
}

/* The descriptor of a tile `bytes` further on. An opaque add, issued where
   it is used: left to itself the compiler keeps every k-step's descriptor of
   the loop-invariant Q tile in registers, which the accumulators need. */
static __device__ __forceinline__ uint64_t fa_i_desc_add(uint64_t desc, uint32_t bytes)
{
    uint64_t r;
    asm volatile("add.s64 %0, %1, %2;\n" : "=l"(r) : "l"(desc), "l"((uint64_t)(bytes >> 4)));
    return r;
}

/* Issues acc (=) A B^T over the head dim, one k16 step per wgmma (no fence,
   no commit): A and B are [d / 64][rows][64] tiles at shared addresses a
   and b with a_rows and b_rows rows, 128-byte swizzle; WGMMA is the SS
   wrapper whose N is B's rows; the first step overwrites acc. Used by the
   backward's S^T and dP^T. */
#define FA_I_SM90_GEMM_NT(WGMMA, acc, a, a_rows, b, b_rows) \
    FA_I_SM90_GEMM_K(WGMMA, acc, a, a_rows, b, b_rows, FA_I_D / 16, 128)
/* The same over `steps` steps of 32 bytes (k16 of 16-bit elements, k32 of
   FP8) in tiles [chunks][rows][rb] of rows of rb bytes (fa_i_wgmma_desc_rows). */
#define FA_I_SM90_GEMM_K(WGMMA, acc, a, a_rows, b, b_rows, steps, rb)                         \
    do {                                                                                      \
        const uint64_t ad_ = fa_i_wgmma_desc_rows(a, rb), bd_ = fa_i_wgmma_desc_rows(b, rb);  \
        int k_;                                                                               \
        _Pragma("unroll") for (k_ = 0; k_ < (steps); ++k_) /* chunk k / (rb / 32) */          \
            WGMMA(acc,                                                                        \
                  fa_i_desc_add(ad_, (k_ / ((rb) / 32)) * (a_rows) * (rb) + (k_ % ((rb) / 32)) * 32), \
                  fa_i_desc_add(bd_, (k_ / ((rb) / 32)) * (b_rows) * (rb) + (k_ % ((rb) / 32)) * 32), \
                  k_ > 0);                                                                    \
    } while (0)

/* Issues acc += A B over an inner dimension of kdim (one k16 step per
   wgmma, no fence, no commit): A (64 x kdim) from registers in 16-bit pairs,
   4 per step; B the [N / 64][b_rows][64] tile at b, stored inner dimension
   first (MN-major: V, dO or Q as [rows][...]), 128-byte swizzle; WGMMA is
   the RS wrapper of B's N. Used by the forward's O += P V and the
   backward's dV += P^T dO, dK += dS^T Q. */
#define FA_I_SM90_GEMM_RS(WGMMA, acc, a, b, b_rows, kdim)                                      \
    do {                                                                                      \
        const uint64_t bd_ = fa_i_wgmma_desc(b, (b_rows) * 128, 1024);                        \
        int k_;                                                                               \
        _Pragma("unroll") for (k_ = 0; k_ < (kdim) / 16; ++k_) /* 16 rows of 128 B a step */  \
            WGMMA(acc, (a) + 4 * k_, fa_i_desc_add(bd_, k_ * 2048));                          \
    } while (0)

/* Issues acc += P V over kdim keys (one k32 step per wgmma) with P in e4m3
   from registers, 4 per step, and V^T the K-major tile at b of d rows:
   [chunks][d][FA_I_VT_ROW(kdim)] (rows of 64 or 128 bytes; keys in the
   order of P's registers: see fa_i_fa3_transpose_v). The FP8 forward's
   O += P V. */
#define FA_I_VT_ROW(kdim) ((kdim) <= 128 ? (kdim) : 64) /* a swizzle's row */
#define FA_I_SM90_GEMM_RS8(WGMMA, acc, a, b, kdim, d)                                         \
    do {                                                                                      \
        enum { VR_ = FA_I_VT_ROW(kdim) };                                                     \
        const uint64_t bd_ = fa_i_wgmma_desc_rows(b, VR_);                                    \
        int k_;                                                                               \
        _Pragma("unroll") for (k_ = 0; k_ < (kdim) / 32; ++k_) /* chunk k / (VR_ / 32) */      \
            WGMMA(acc, (a) + 4 * k_,                                                          \
                  fa_i_desc_add(bd_, (k_ / (VR_ / 32)) * (d) * VR_ + (k_ % (VR_ / 32)) * 32)); \
    } while (0)

/* wgmma wrappers. The accumulator of m64nNk16 is N/2 floats per thread, each
   an asm operand: FA_I_REGS<n> spells "%0,...,%<n-1>", FA_I_ACC<n> binds
   d[0..n-1]. SS: A and B from shared memory (B K-major: K rows for QK^T).
   RS: A from 4 registers per thread, B transposed (V is [keys][d]). */
#define FA_I_R0 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9"
#define FA_I_R10(t) ",%" #t "0,%" #t "1,%" #t "2,%" #t "3,%" #t "4,%" #t "5,%" #t "6,%" #t "7,%" #t \
                    "8,%" #t "9"
/* Partial decade t: ",%t0,...,%t(k-1)". */
#define FA_I_P2(t) ",%" #t "0,%" #t "1"
#define FA_I_P4(t) FA_I_P2(t) ",%" #t "2,%" #t "3"
#define FA_I_P6(t) FA_I_P4(t) ",%" #t "4,%" #t "5"
#define FA_I_P8(t) FA_I_P6(t) ",%" #t "6,%" #t "7"
#define FA_I_REGS40 FA_I_R0 FA_I_R10(1) FA_I_R10(2) FA_I_R10(3)
#define FA_I_REGS80 FA_I_REGS40 FA_I_R10(4) FA_I_R10(5) FA_I_R10(6) FA_I_R10(7)
#define FA_I_REGS120 FA_I_REGS80 FA_I_R10(8) FA_I_R10(9) FA_I_R10(10) FA_I_R10(11)
#define FA_I_REGS32 FA_I_R0 FA_I_R10(1) FA_I_R10(2) FA_I_P2(3)
#define FA_I_REGS48 FA_I_REGS40 FA_I_P8(4)
#define FA_I_REGS56 FA_I_REGS40 FA_I_R10(4) FA_I_P6(5)
#define FA_I_REGS64 FA_I_REGS40 FA_I_R10(4) FA_I_R10(5) FA_I_P4(6)
#define FA_I_REGS72 FA_I_REGS40 FA_I_R10(4) FA_I_R10(5) FA_I_R10(6) FA_I_P2(7)
#define FA_I_REGS88 FA_I_REGS80 FA_I_P8(8)
#define FA_I_REGS96 FA_I_REGS80 FA_I_R10(8) FA_I_P6(9)
#define FA_I_REGS128 FA_I_REGS120 FA_I_P8(12)
#define FA_I_F8(d, i)                                                                         \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define FA_I_ACC8(d) FA_I_F8(d, 0)
#define FA_I_ACC16(d) FA_I_ACC8(d), FA_I_F8(d, 8)
#define FA_I_ACC24(d) FA_I_ACC16(d), FA_I_F8(d, 16)
#define FA_I_ACC32(d) FA_I_ACC24(d), FA_I_F8(d, 24)
#define FA_I_ACC40(d) FA_I_ACC32(d), FA_I_F8(d, 32)
#define FA_I_ACC48(d) FA_I_ACC40(d), FA_I_F8(d, 40)
#define FA_I_ACC56(d) FA_I_ACC48(d), FA_I_F8(d, 48)
#define FA_I_ACC64(d) FA_I_ACC56(d), FA_I_F8(d, 56)
#define FA_I_ACC72(d) FA_I_ACC64(d), FA_I_F8(d, 64)
#define FA_I_ACC80(d) FA_I_ACC72(d), FA_I_F8(d, 72)
#define FA_I_ACC88(d) FA_I_ACC80(d), FA_I_F8(d, 80)
#define FA_I_ACC96(d) FA_I_ACC88(d), FA_I_F8(d, 88)
#define FA_I_ACC128(d) FA_I_ACC96(d), FA_I_F8(d, 96), FA_I_F8(d, 104), FA_I_F8(d, 112), \
                       FA_I_F8(d, 120)

/* d (+)= A B for one k16 step; `accumulate` 0 overwrites d. IA, IB, IS: the
   operand numbers of the A descriptor, B descriptor and accumulate flag.
   KIND ss: both operands K-major; sst: both transposed (MN-major, the
   backward's dQ = dS K with dS^T and K stored [keys][...]). */
#define FA_I_DEFINE_WGMMA_SS(KIND, TRANS, N, NACC, DT, IA, IB, IS) \
    FA_I_DEFINE_WGMMA_SS_K(KIND, ", " TRANS, N, 16, NACC, DT, IA, IB, IS)
#define FA_I_DEFINE_WGMMA_RS(N, NACC, DT, IA, IB, IS) \
    FA_I_DEFINE_WGMMA_RS_K(", 1", N, 16, NACC, DT, IA, IB, IS)
/* The same of any K: TRANS is the transpose immediates with their comma
   (none for FP8, which has no transposes). */
#define FA_I_DEFINE_WGMMA_SS_K(KIND, TRANS, N, K, NACC, DT, IA, IB, IS)                       \
    static __device__ __forceinline__ void fa_i_wgmma_##KIND##_##DT##_n##N(                   \
        float *d, uint64_t a, uint64_t b, int accumulate)                                     \
    {                                                                                         \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IS ", 0;\n"                           \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." #DT "." #DT " {"     \
                     FA_I_REGS##NACC "}, " IA ", " IB ", p, 1, 1" TRANS ";\n}\n"                \
                     : FA_I_ACC##NACC(d)                                                      \
                     : "l"(a), "l"(b), "r"(accumulate));                                      \
    }
#define FA_I_DEFINE_WGMMA_RS_K(TRANS, N, K, NACC, DT, IA, IB, IS)                             \
    static __device__ __forceinline__ void fa_i_wgmma_rs_##DT##_n##N(float *d, const uint32_t *a, \
                                                                     uint64_t b)              \
    {                                                                                         \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IS ", 0;\n"                           \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." #DT "." #DT " {"     \
                     FA_I_REGS##NACC "}, " IA ", " IB ", p, 1, 1" TRANS ";\n}\n"                \
                     : FA_I_ACC##NACC(d)                                                      \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));           \
    }
/* S tiles of 64 to 192 keys (any the tile table may pick), O tiles of d and
   of the 64-column chunks of a smaller V head dim; the backward's 64 x 64
   dQ blocks. */
#define FA_I_DEFINE_WGMMA_SET(DT)                                                             \
    FA_I_DEFINE_WGMMA_SS(sst, "1, 1", 64, 32, DT, "%32", "%33", "%34")                        \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 64, 32, DT, "%32", "%33", "%34")                         \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 80, 40, DT, "%40", "%41", "%42")                         \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 96, 48, DT, "%48", "%49", "%50")                         \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 112, 56, DT, "%56", "%57", "%58")                        \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 128, 64, DT, "%64", "%65", "%66")                        \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 144, 72, DT, "%72", "%73", "%74")                        \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 160, 80, DT, "%80", "%81", "%82")                        \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 176, 88, DT, "%88", "%89", "%90")                        \
    FA_I_DEFINE_WGMMA_SS(ss, "0, 0", 192, 96, DT, "%96", "%97", "%98")                        \
    FA_I_DEFINE_WGMMA_RS(64, 32, DT, "{%32,%33,%34,%35}", "%36", "%37")                       \
    FA_I_DEFINE_WGMMA_RS(128, 64, DT, "{%64,%65,%66,%67}", "%68", "%69")                      \
    FA_I_DEFINE_WGMMA_RS(192, 96, DT, "{%96,%97,%98,%99}", "%100", "%101")                    \
    FA_I_DEFINE_WGMMA_RS(256, 128, DT, "{%128,%129,%130,%131}", "%132", "%133")
FA_I_DEFINE_WGMMA_SET(f16)
FA_I_DEFINE_WGMMA_SET(bf16)
/* FP8: S tiles of 64, 128 or 192 keys, O tiles of d. */
FA_I_DEFINE_WGMMA_SS_K(ss, "", 64, 32, 32, e4m3, "%32", "%33", "%34")
FA_I_DEFINE_WGMMA_SS_K(ss, "", 128, 32, 64, e4m3, "%64", "%65", "%66")
FA_I_DEFINE_WGMMA_SS_K(ss, "", 192, 32, 96, e4m3, "%96", "%97", "%98")
FA_I_DEFINE_WGMMA_RS_K("", 64, 32, 32, e4m3, "{%32,%33,%34,%35}", "%36", "%37")
FA_I_DEFINE_WGMMA_RS_K("", 128, 32, 64, e4m3, "{%64,%65,%66,%67}", "%68", "%69")
FA_I_DEFINE_WGMMA_RS_K("", 256, 32, 128, e4m3, "{%128,%129,%130,%131}", "%132", "%133")
#undef FA_I_DEFINE_WGMMA_SET
#undef FA_I_DEFINE_WGMMA_SS
#undef FA_I_DEFINE_WGMMA_RS
#undef FA_I_DEFINE_WGMMA_SS_K
#undef FA_I_DEFINE_WGMMA_RS_K

/* ldmatrix x4 with transpose and stmatrix x4 (16-bit), by shared-memory
   address: each lane gives one row address (lanes 8i..8i+7 the rows of
   matrix i). */
static __device__ __forceinline__ void fa_i_ldsm_x4_trans(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void fa_i_stsm_x4(uint32_t addr, const uint32_t r[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
#endif /* FA_I_SM90 && __CUDA_ARCH_FEAT_SM90_ALL */
#endif /* >> ptx helpers */

/* >> common ===================================================================
   Pieces every kernel family shares: scores and masks, CTA schedules,
   shared-memory tiles and the mma.sync fragments. Register tiles follow the
   mma.sync m16n8k16 fragments: lane = 4 * g + t; an accumulator tile holds
   rows g and g + 8, columns 2t and 2t + 1 of each 8-wide column block. */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
/* Speculative exps (FA3 SOFTMAX forms 1 and 2, FA2 SPEC): a thread whose
   exps of a row, taken against the running max, sum to at most this has
   no P above it; the warp keeps them when every thread's sums do. */
#define FA_I_SPEC_SUM_MAX 256.0f

/* The power of two of a sequence's work (nq nk), or -1 where it has none:
   the ragged schedules' classes, largest first. */
static __host__ __device__ __forceinline__ int fa_i_work_class(int nq, int nk)
{
    int c = 0;
    int64_t work;
    if (!nq || !nk) return -1;
    for (work = (int64_t)nq * nk; work > 1; work >>= 1) ++c;
    return c;
}

/* The r-th of a head's blocks_m query blocks in the FA3 forward's
   schedule: in order, or under causal masking M-1, 0, M-2, 1, ... (every
   pair one heavy and one light block: fa_i_fa3_tile). */
static __host__ __device__ __forceinline__ int fa_i_fa3_block_order(int causal, int r,
                                                                    int blocks_m)
{
    return !causal ? r : (r & 1) ? r >> 1 : blocks_m - 1 - (r >> 1);
}

/* A ragged batch's FA3 forward tile item: head h and the r-th of its
   blocks_m query blocks in the schedule's order. */
static __host__ __device__ __forceinline__ int fa_i_fa3_tile_item(int h, int r, int blocks_m,
                                                                  int causal)
{
    return (int)((uint32_t)h << 16 | (uint32_t)fa_i_fa3_block_order(causal, r, blocks_m));
}

/* A sequence's 64-row blocks in the ragged backward's dQ accumulator: its
   nq rows from a multiple of 128 (a 64-row block is one sequence's, in the
   MMA order fa_i_bwd_postprocess reads). */
static __host__ __device__ __forceinline__ int fa_i_varlen_acc_blocks(int nq)
{
    return (nq + 127) / 128 * 2;
}

/* Of a grid of (blocks, heads, batch) CTAs whose blocks differ in work
   (causal masking): this CTA's rank among its head's blocks (0 starts
   first), head and batch. Blocks start roughly in launch order (x
   fastest), which would interleave heavy and light blocks and leave heavy
   ones in the last wave; so the grid goes block-major within groups of
   heads that span ~2 waves (group_ctas; the group's inputs stay in L2), and
   the caller maps rank 0 to its heaviest block: each group runs heavy
   first and the grid ends on light blocks (DESIGN.md v14, v15). */
static __device__ __forceinline__ void fa_i_grouped_cta(unsigned group_ctas, int *rank, int *h, int *b)
{
    /* in launch order: head (of heads x batch) `pair`, in its group from `first` */
    const unsigned blocks = gridDim.x, pair = blockIdx.y + gridDim.y * blockIdx.z;
    const unsigned per_group = max(1u, group_ctas / blocks);
    const unsigned first = pair / per_group * per_group;
    const unsigned in_group = min(per_group, gridDim.y * gridDim.z - first);
    const unsigned within = blockIdx.x + blocks * (pair - first), head = first + within % in_group;
    *rank = (int)(within / in_group), *h = (int)(head % gridDim.y), *b = (int)(head / gridDim.y);
}

/* The query-block kernels' CTA (forward, deterministic dQ): query block *m
   of head *h of batch *b from a grid of (query blocks, heads, batch). Under
   causal masking later blocks see more keys: they go first. */
#define FA_I_FWD_GROUP_CTAS 512
static __device__ __forceinline__ void fa_i_query_cta(const fa_params *p, int *m, int *h, int *b)
{
    if (!p->causal) {
        *m = blockIdx.x, *h = blockIdx.y, *b = blockIdx.z;
        return;
    }
    fa_i_grouped_cta(FA_I_FWD_GROUP_CTAS, m, h, b);
    *m = (int)gridDim.x - 1 - *m;
}

static __device__ __forceinline__ int64_t fa_i_dev_offset(const fa_layout *l, int b, int h, int s)
{
    return (int64_t)b * l->batch + (int64_t)h * l->head + (int64_t)s * l->seq;
}

/* Pitch in elements of a 16-bit [rows][d] shared-memory tile: d where d is
   a multiple of 64 (rows of whole 128-byte lines, their 16-byte chunks
   XOR-swizzled by the row), else d + 8 (rows padded by 16 bytes). Either way
   the 8 rows an ldmatrix reads at one column lie in distinct banks. The
   swizzle also keeps each 32-byte sector a cp.async reads in one 32-byte
   piece of shared memory, where the padding splits every other row's
   sectors (DESIGN.md v13). */
#define FA_I_PITCH(d) ((d) % 64 == 0 ? (d) : (d) + 8)
/* The dK/dV kernels' pitch for Q and dO: FA_I_PITCH, but padded at d =
   128, where the swizzle's address registers cost more than it saves
   (DESIGN.md v13). Their K and V rows stay padded: swizzled, they spill. */
#define FA_I_BWD_Q_PITCH(d) ((d) == 128 ? (d) + 8 : FA_I_PITCH(d))
#define FA_I_BWD_KV_PITCH(d) ((d) + 8)
/* The FA2 atomic mode's dQ product per step, in parts over the columns, so
   that a warp's dQ tile fits beside dK and dV: at d = 256 in halves on
   sm_90 (quarters on sm_8x, where halves spill), at d = 128 in halves on
   sm_90 (DESIGN.md v14, v16). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FA_I_BWD_DQ_PARTS(d) ((d) == 256 ? 4 : 1)
#else
#define FA_I_BWD_DQ_PARTS(d) ((d) == 256 || (d) == 128 ? 2 : 1)
#endif
/* Element offset of (row, col) in a tile of pitch ld (FA_I_PITCH, or any
   pitch that is not a multiple of 64 for a plain padded tile). */
#define FA_I_SMEM_AT(row, col, ld) \
    ((row) * (ld) + ((ld) % 64 == 0 ? ((((col) >> 3) ^ ((row) & 7)) << 3) | ((col) & 7) : (col)))

/* Element offset of 16-byte chunk x (already swizzled) within a row of a
   tile of pitch ld: x * 8, or with ld = 64 below d, where the tile is
   [d / 64][rows][64], in 64-column slab x / 8 (the swizzle keeps a chunk
   in its slab). */
static __device__ __forceinline__ int fa_i_slab_at(int x, int ld, int d, int rows)
{
    return ld == 64 && d > 64 ? (x >> 3) * rows * 64 + (x & 7) * 8 : x * 8;
}

/* Where a paged tile's rows are (>> decode; NULL or no table: dense rows). With
   page_size a multiple of 16 (`sliced`), slice s of the tile (its rows
   16 s .. 16 s + 15) is rows in_page[s] + 0..15 of page page[s], found a tile
   ahead (fa_i_tile_pages_next), so the copy issues no table load; otherwise
   each row's page is looked up in `table` as the row is copied. The tiles
   are taken in order, so the walk carries its place (table entry `at`, row
   `at_row` of that page, key `at_key`) from one tile to the next and divides
   by the page size once, in fa_i_tile_pages_seek. An entry that is not a
   page reads as page 0, so no table (tables_on_device: unchecked before)
   makes a copy leave the cache. */
#define FA_I_TILE_SLICES 8 /* tiles of up to 128 keys */
typedef struct fa_i_tile_pages {
    const int32_t *table; /* the sequence's block table row */
    int sliced, num_pages;
    int page[FA_I_TILE_SLICES], in_page[FA_I_TILE_SLICES];
    int at, at_row, at_key;
} fa_i_tile_pages;

/* A table entry of tp as a page: 0 where it is not one. Applied where the
   copy makes its address, not as the entry is loaded a tile ahead: a use
   there would wait for the load. */
static __device__ __forceinline__ int fa_i_page_or_0(const fa_i_tile_pages *tp, int page)
{
    return (unsigned)page < (unsigned)tp->num_pages ? page : 0;
}

/* Whether sequence b's length in a paged p (tables_on_device) is out of
   range: a negative cache length, or keys past seqlen_k or the table. */
static __device__ __forceinline__ int fa_i_paged_length_bad(const fa_params *p, int b)
{
    const int64_t keys = (int64_t)p->cache_seqlens[b] + p->seqlen_new;
    return p->cache_seqlens[b] < 0 || keys > p->seqlen_k || keys > (int64_t)p->max_pages * p->page_size;
}

/* Whether a decode CTA's sequence b (tables_on_device) has a length out of
   range or a page entry out of range among those of keys [c0, c1), the
   CTA's threads taking entries in turn: 1 in every thread where any is. */
static __device__ __forceinline__ int fa_i_pages_bad(const fa_params *p, int b, const int32_t *pages,
                                                     int c0, int c1, int tid, int nthreads)
{
    int bad = fa_i_paged_length_bad(p, b), i;
    for (i = c0 / p->page_size + tid; c0 < c1 && i <= (c1 - 1) / p->page_size; i += nthreads)
        bad |= (unsigned)pages[i] >= (unsigned)p->num_pages;
    return __syncthreads_or(bad);
}

/* tp's walk to key c0 (a multiple of 16). */
static __device__ __forceinline__ void fa_i_tile_pages_seek(fa_i_tile_pages *tp, int page_size,
                                                            int c0)
{
    tp->at = (int)((unsigned)c0 / (unsigned)page_size);
    tp->at_row = c0 - tp->at * page_size;
    tp->at_key = c0;
}

/* tp's slices for the tile of tile_rows keys at the walk's place, then the
   walk past it (slices at or past `keys`: page 0, never read, and no table
   entry loaded for them). */
static __device__ __forceinline__ void fa_i_tile_pages_next(fa_i_tile_pages *tp, int page_size,
                                                            int keys, int tile_rows)
{
    int s;
#pragma unroll
    for (s = 0; s < tile_rows / 16; ++s) {
        tp->page[s] = tp->at_key < keys ? tp->table[tp->at] : 0;
        tp->in_page[s] = tp->at_row;
        tp->at_key += 16;
        tp->at_row += 16;
        if (tp->at_row == page_size) tp->at_row = 0, ++tp->at;
    }
}

/* Copies rows [row0, row0 + tile_rows) of a [rows][d] 16-bit matrix (row
   stride in elements) into a smem tile of pitch ld (FA_I_SMEM_AT); rows at
   or past `rows` are zero-filled. tpr threads share a row: the largest power
   of two that divides its 16-byte chunks (so a whole row, 32 threads, at d =
   256; a warp's copy then reads whole rows, DESIGN.md v12), each thread taking chunks 16 * tpr
   bytes apart. The passes are unrolled: one 64-bit address per row a thread
   copies, immediate offsets for its other chunks; a pass's rows r + k step
   (r < step, both powers of two) keep r's low bits, so the swizzle of a
   pass is the thread's first one XORed with a constant. tid is made opaque
   first: otherwise the compiler hoists the addresses out of the caller's key
   loop and holds them in registers, which spills the 64-key tiles.
   `mode` (a constant at each call, fa_i_async_rows picks it) says where the
   rows are: 0 dense, the address walking `step` rows a pass; 1 a sliced
   paged tile (fa_i_tile_pages), the address taken from the slice's page at
   its first pass and walking within the slice (step <= 16: a pass lies in
   slice pass step / 16; step 32: in slice 2 pass or the next, by the
   thread's row); 2 a page looked up for each row copied. Pages sit
   page_stride elements apart from g. Columns from `cols` (the problem's
   head dim, where it is below the tile's d) are zero-filled, read from
   nowhere (a chunk that cols ends inside is read in part). With ld = 64 below d the tile is
   [d / 64][tile_rows][64] (fa_i_slab_at: the wgmma's K-major tile with the
   128-byte swizzle, >> decode's wgmma kernel). */
static __device__ __forceinline__ void fa_i_async_rows_as(const int mode, uint16_t *smem,
                                                          const uint16_t *g, int64_t stride,
                                                          const fa_i_tile_pages *tp, int page_size,
                                                          int64_t page_stride, int row0, int rows,
                                                          int tile_rows, int d, int cols, int ld,
                                                          int tid, int nthreads)
{
    const int chunks = d / 8, tpr = chunks & -chunks, step = nthreads / tpr;
    const int swizzled = ld % 64 == 0;
    int r, x0, pass, c, chunk0;
    const uint16_t *src;
    asm volatile("" : "+r"(tid));
    r = tid / tpr;
    chunk0 = tid % tpr;
    x0 = swizzled ? chunk0 ^ (r & 7) : chunk0; /* this thread's first chunk in smem */
    smem += r * ld;
    src = g + (int64_t)(row0 + r) * stride + chunk0 * 8;
#pragma unroll
    for (pass = 0; pass < (tile_rows + step - 1) / step; ++pass, r += step, src += step * stride)
        if (tile_rows % step == 0 || r < tile_rows) {
            const int valid = row0 + r < rows, x = swizzled ? x0 ^ (pass * step & 7) : x0;
            const unsigned c_row = (unsigned)(row0 + r);
            const uint16_t *from;
            if (mode == 1 && pass * step % 16 == 0) { /* a slice's first pass */
                const int s = pass * step / 16, next = step > 16 && (r & 16); /* r's slice: s + next */
                src = g +
                      (int64_t)fa_i_page_or_0(tp, next ? tp->page[s + 1] : tp->page[s]) * page_stride +
                      (int64_t)((next ? tp->in_page[s + 1] : tp->in_page[s]) + (r & 15)) * stride +
                      chunk0 * 8;
            }
            from = !valid     ? g /* a row past the end reads nothing */
                   : mode < 2 ? src
                              : g + (int64_t)fa_i_page_or_0(tp, tp->table[c_row / page_size]) * page_stride +
                                    (int64_t)(c_row % page_size) * stride + chunk0 * 8;
#pragma unroll
            for (c = 0; c < chunks / tpr; ++c) {
                const int left = valid ? cols - 8 * (chunk0 + c * tpr) : 0; /* of the row */
                fa_i_cp_async16(smem + pass * step * ld + fa_i_slab_at(x + c * tpr, ld, d, tile_rows),
                                left > 0 ? from + c * tpr * 8 : g, fa_i_chunk_bytes(left));
            }
        }
}

/* fa_i_async_rows_as in the mode that tp says (NULL or no table: dense). */
static __device__ __forceinline__ void fa_i_async_rows(uint16_t *smem, const uint16_t *g,
                                                       int64_t stride, const fa_i_tile_pages *tp,
                                                       int page_size, int64_t page_stride,
                                                       int row0, int rows, int tile_rows, int d,
                                                       int cols, int ld, int tid, int nthreads)
{
#define FA_I_ROWS_AS(mode)                                                                   \
    fa_i_async_rows_as(mode, smem, g, stride, tp, page_size, page_stride, row0, rows, tile_rows, \
                       d, cols, ld, tid, nthreads)
    if (!tp || !tp->table)
        FA_I_ROWS_AS(0);
    else if (tp->sliced)
        FA_I_ROWS_AS(1);
    else
        FA_I_ROWS_AS(2);
#undef FA_I_ROWS_AS
}

/* fa_i_async_rows of dense rows. */
static __device__ __forceinline__ void fa_i_async_tile(uint16_t *smem, const uint16_t *g,
                                                       int64_t stride, int row0, int rows,
                                                       int tile_rows, int d, int cols, int ld,
                                                       int tid, int nthreads)
{
    fa_i_async_rows(smem, g, stride, NULL, 1, 0, row0, rows, tile_rows, d, cols, ld, tid, nthreads);
}

/* The FA3 forward's gather mode (>> fa3 forward): rows [row0, row0 +
   tile_rows) of one head's keys or values, in pages of 2^shift rows (pages
   and rows page_stride and stride elements apart from g), into the
   [d / 64][tile_rows][64] tile at shared address smem with the 128-byte
   swizzle, by the 128 threads of a warpgroup, tpr threads to a row (at
   most 8: 16 rows a pass or more); rows at or past `rows` and columns from
   `cols` zero-filled. row0 is a multiple of the page size, and the tile's
   pages are the warp's: lane i holds the block table's entry for page
   (row0 >> shift) + i (ent), each row's taken by a shuffle, so no copy
   waits on a table load. One warp per scheduler issues these copies beside
   the consumers' warps, a dependent chain each, so a row costs little: the
   pages gathered are at most 16 rows (larger ones go by TMA), so a
   thread's rows, a pass apart, sit at one place in their pages, and its
   columns and swizzle are fixed; per row a shuffle and one wide
   multiply-add, its chains interleaved by the unrolled loop, and no
   zero-fill tests where the tile's rows and columns all exist. */
static __device__ __forceinline__ void fa_i_gather_rows(uint32_t smem, const uint16_t *g,
                                                        int64_t stride, int ent, int shift,
                                                        int64_t page_stride, int row0,
                                                        int rows, int tile_rows, int d, int cols,
                                                        int tid)
{
    const int chunks = d / 8, tpr = min(chunks & -chunks, 8), step = 128 / tpr;
    const int chunk0 = tid % tpr, r0 = tid / tpr, sw = r0 & 7;
    const uint16_t *from0 = g + 8 * chunk0 + (int64_t)(r0 & ((1 << shift) - 1)) * stride;
    int i, j;
    if (row0 + tile_rows <= rows && cols == d) { /* (warp-uniform) every byte of the tile */
#pragma unroll
        for (i = 0; i < tile_rows / step; ++i) {
            const int r = r0 + i * step;
            const uint16_t *from =
                from0 + (int64_t)__shfl_sync(0xffffffffu, ent, (r >> shift) & 31) * page_stride;
#pragma unroll
            for (j = 0; j < chunks / tpr; ++j)
                fa_i_cp_async16_at(smem + 2 * (r * 64 + fa_i_slab_at((chunk0 + j * tpr) ^ sw, 64, d,
                                                                     tile_rows)),
                                   from + 8 * j * tpr, 16);
        }
        return;
    }
#pragma unroll 2
    for (i = 0; i < tile_rows / step; ++i) {
        const int r = r0 + i * step, valid = row0 + r < rows;
        const int page = __shfl_sync(0xffffffffu, ent, (r >> shift) & 31);
        const uint16_t *from = from0 + (int64_t)page * page_stride;
#pragma unroll
        for (j = 0; j < chunks / tpr; ++j) {
            const int c = chunk0 + j * tpr, left = valid ? cols - 8 * c : 0; /* of the row */
            fa_i_cp_async16_at(smem + 2 * (r * 64 + fa_i_slab_at(c ^ sw, 64, d, tile_rows)),
                               left > 0 ? from + 8 * j * tpr : g, fa_i_chunk_bytes(left));
        }
    }
}

/* The FA3 forward's gather mode: the block table's entries of the pages
   that a key tile from row row0 spans (at most 32: fa_i_paged_fa3_kernel),
   lane i the entry of the first page + i; 0 past the sequence's last page. */
static __device__ __forceinline__ int fa_i_fa3_gather_ent(const int32_t *seq_pages, int row0,
                                                          int rows, int shift)
{
    const int pg = (row0 >> shift) + (int)(threadIdx.x & 31);
    return pg <= (rows - 1) >> shift ? seq_pages[pg] : 0;
}

/* Copies key and value rows [c0, c0 + bn) (of the head at gk, gv; cols_k,
   cols_v columns of d) into the smem tiles sk, sv; tp: a paged tile's rows
   (NULL: dense). */
static __device__ __forceinline__ void fa_i_async_kv(uint16_t *sk, uint16_t *sv, const uint16_t *gk,
                                                     const uint16_t *gv, const fa_params *p,
                                                     const fa_i_tile_pages *tp, int c0, int bn,
                                                     int d, int cols_k, int cols_v, int ld,
                                                     int tid, int nthreads)
{
    fa_i_async_rows(sk, gk, p->k_layout.seq, tp, p->page_size, p->k_layout.batch, c0,
                    p->seqlen_k, bn, d, cols_k, ld, tid, nthreads);
    fa_i_async_rows(sv, gv, p->v_layout.seq, tp, p->page_size, p->v_layout.batch, c0,
                    p->seqlen_k, bn, d, cols_v, ld, tid, nthreads);
}

/* Base-2 score of a raw logit x = q.k: scale * log2(e) * x, or with softcap
   c: c * log2(e) * tanh(scale * x / c). */
static __device__ __forceinline__ float fa_i_score(const fa_params *p, float x)
{
    return p->softcap > 0.0f ? p->softcap * FA_I_LOG2E_F * tanhf(x * (p->scale / p->softcap))
                             : x * (p->scale * FA_I_LOG2E_F);
}

/* tanh(x / c) of a softcapped score, recovered from its probability:
   P = 2^(s - lse2) with s = c log2(e) tanh(x / c). 0 where P = 0 (masked). */
static __device__ __forceinline__ float fa_i_capped_tanh(const fa_params *p, float prob, float lse2)
{
    return prob > 0.0f ? (__log2f(prob) + lse2) / (p->softcap * FA_I_LOG2E_F) : 0.0f;
}

/* Whether a key tile [c0, c1) needs the mask for a block of query rows:
   unless every row sees all its keys. Key ranges grow with the row, so the
   first row's end and the last row's start say. */
#define FA_I_TILE_MASKED(first_hi, last_lo, c0, c1) ((first_hi) < (c1) || (last_lo) > (c0))

/* The 16-bit pair in bits 16 k ... 16 k + 31 of a (k = 0, 16) as floats. */
static __device__ __forceinline__ float2 fa_i_unpack2(uint32_t a, int bf16)
{
    float2 f;
    if (bf16) return make_float2(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u));
    asm("{\n.reg .f16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.f32.f16 %0, lo;\ncvt.f32.f16 %1, hi;\n}\n"
        : "=f"(f.x), "=f"(f.y)
        : "r"(a));
    return f;
}

/* Sum of the products of two rows of 8 16-bit elements. */
static __device__ __forceinline__ float fa_i_dot8(uint4 x, uint4 y, int bf16)
{
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
    float sum = 0.0f;
    int i;
#pragma unroll
    for (i = 0; i < 4; ++i) {
        const float2 a = fa_i_unpack2(xs[i], bf16), b = fa_i_unpack2(ys[i], bf16);
        sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
    }
    return sum;
}

/* The 8 16-bit elements at src of which the first n lie in the row: one
   16-byte load where all 8 do, else element by element, zeros past n. */
static __device__ __forceinline__ uint4 fa_i_load8_part(const uint16_t *src, int n)
{
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    int i;
    if (n >= 8) return *(const uint4 *)src;
#pragma unroll
    for (i = 0; i < 8; ++i)
        if (i < n) w[i / 2] |= (uint32_t)src[i] << (16 * (i & 1));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* The first n (>= 1) of the 8 16-bit elements at src (shared memory) to
   dst: 16 bytes where n >= 8, else element by element. */
static __device__ __forceinline__ void fa_i_copy8_part(uint16_t *dst, const uint16_t *src, int n)
{
    int i;
    if (n >= 8) {
        *(uint4 *)dst = *(const uint4 *)src;
        return;
    }
    for (i = 0; i < n; ++i) dst[i] = src[i];
}

/* Two adjacent 16-bit elements (the first in the low half of pair) at
   row[col], those below cols: one word where both are. */
static __device__ __forceinline__ void fa_i_store_pair(uint16_t *row, int col, int cols,
                                                       uint32_t pair)
{
    if (col + 1 < cols)
        *(uint32_t *)(row + col) = pair;
    else if (col < cols)
        row[col] = (uint16_t)pair;
}

/* Stores scale * f[0..n) (n >= 1, at most 8) as 16-bit elements at dst:
   16 bytes where n >= 8, else element by element. */
static __device__ __forceinline__ void fa_i_store8(uint16_t *dst, const float *f, float scale,
                                                   int bf16, int n)
{
    uint32_t r[4];
    int i;
#pragma unroll
    for (i = 0; i < 4; ++i)
        r[i] = bf16 ? fa_i_pack_bf16(f[2 * i] * scale, f[2 * i + 1] * scale)
                    : fa_i_pack_f16(f[2 * i] * scale, f[2 * i + 1] * scale);
    if (n >= 8) {
        *(uint4 *)dst = make_uint4(r[0], r[1], r[2], r[3]);
        return;
    }
#pragma unroll
    for (i = 0; i < 8; ++i)
        if (i < n) dst[i] = (uint16_t)(r[i / 2] >> (16 * (i & 1)));
}

/* Fragments from smem tiles of pitch ld (FA_I_SMEM_AT): base points at a
   row that is a multiple of 8 (the swizzle's period), columns count from the
   tile's first. A operand (16 rows x 16 k) from a row-major tile. */
#define FA_I_LOAD_A(frag, base, ld, row0, k0) \
    fa_i_ldmatrix_x4(frag, (base) + FA_I_SMEM_AT((row0) + (lane & 15), (k0) + (lane >> 4) * 8, ld))
/* B operands of two 8-wide column blocks from a [n][k] smem tile. */
#define FA_I_LOAD_B_NK(frag, base, ld, n0, k0)                                             \
    fa_i_ldmatrix_x4(frag, (base) + FA_I_SMEM_AT((n0) + (lane & 7) + ((lane >> 4) << 3), \
                                                 (k0) + ((lane >> 3) & 1) * 8, ld))
/* B operands of two 8-wide column blocks from a [k][n] smem tile. */
#define FA_I_LOAD_B_KN(frag, base, ld, k0, n0)                                                    \
    fa_i_ldmatrix_x4_trans(frag, (base) + FA_I_SMEM_AT((k0) + (lane & 7) + (((lane >> 3) & 1) << 3), \
                                                       (n0) + (lane >> 4) * 8, ld))
/* A operand (16 m x 16 k) from an smem tile stored transposed, [k][m]. */
#define FA_I_LOAD_A_KM(frag, base, ld, k0, m0)                                                \
    fa_i_ldmatrix_x4_trans(frag, (base) + FA_I_SMEM_AT((k0) + (lane & 7) + ((lane >> 4) << 3), \
                                                       (m0) + ((lane >> 3) & 1) * 8, ld))
/* A operand for the k16 slice kk taken from accumulator tiles acc (P as A). */
#define FA_I_ACC_AS_A(frag, acc, kk)                              \
    do {                                                          \
        frag[0] = FA_I_PACK(acc[2 * (kk)][0], acc[2 * (kk)][1]);         \
        frag[1] = FA_I_PACK(acc[2 * (kk)][2], acc[2 * (kk)][3]);         \
        frag[2] = FA_I_PACK(acc[2 * (kk) + 1][0], acc[2 * (kk) + 1][1]); \
        frag[3] = FA_I_PACK(acc[2 * (kk) + 1][2], acc[2 * (kk) + 1][3]); \
    } while (0)

/* c += A B for one warp's tile of 16 mt rows by 16 nt columns, over kdim
   (a multiple of 16): A from smem as [m][k] (pitch lda) or, if a_km,
   [k][m]; B as [n][k] (pitch ldb) or, if b_kn, [k][n]. a points at the
   warp's first row and column of A; b at its first row of B, whose first
   column is b_col (a swizzled tile, FA_I_SMEM_AT, needs it apart). c[m * 2 nt
   + n8] holds rows 16 m.., columns 8 n8..; each B fragment feeds 2 mt MMAs,
   each A fragment 2 nt. bf16: the operands' dtype (else f16). */
static __device__ __forceinline__ void fa_i_warp_gemm(float (*c)[4], int mt, int nt, int kdim,
                                                      const uint16_t *a, int lda, int a_km,
                                                      const uint16_t *b, int ldb, int b_col,
                                                      int b_kn, int bf16)
{
    const int lane = threadIdx.x & 31;
    int k, m, n;
#pragma unroll
    for (k = 0; k < kdim; k += 16) {
        uint32_t fa[4][4];
#pragma unroll
        for (m = 0; m < mt; ++m) {
            if (a_km)
                FA_I_LOAD_A_KM(fa[m], a, lda, k, 16 * m);
            else
                FA_I_LOAD_A(fa[m], a, lda, 16 * m, k);
        }
#pragma unroll
        for (n = 0; n < nt; ++n) {
            uint32_t fb[4];
            if (b_kn)
                FA_I_LOAD_B_KN(fb, b, ldb, k, b_col + 16 * n);
            else
                FA_I_LOAD_B_NK(fb, b, ldb, 16 * n, b_col + k);
#pragma unroll
            for (m = 0; m < mt; ++m) {
                fa_i_mma(c[m * 2 * nt + 2 * n], fa[m], fb[0], fb[1], bf16);
                fa_i_mma(c[m * 2 * nt + 2 * n + 1], fa[m], fb[2], fb[3], bf16);
            }
        }
    }
}

#endif /* >> common */

/* >> fa1 ======================================================================
   FlashAttention 1, the teaching variant (FA_VARIANT 1): one CTA per (batch,
   head); the outer loop streams K/V blocks through shared memory once; for
   each, every query row reads its normalized O, m and l from the global
   workspace `state`, merges the block, and writes them back. fp32 CUDA-core
   math. */
#if defined(FA_I_TOP) && !defined(FA_I_PASS) && FA_VARIANT == 1 && FA_I_HOST
#define FA_I_FA1_KEYS 32
#define FA_I_FA1_THREADS 128
static __global__ void __launch_bounds__(FA_I_FA1_THREADS)
    fa_i_fwd_fa1(const fa_params p, float *state)
{
    extern __shared__ float fa_i_fa1_smem[];
    const int d = p.head_dim, h = blockIdx.x % p.heads_q, b = blockIdx.x / p.heads_q;
    const int hk = h / (p.heads_q / p.heads_kv), bf16 = p.dtype == FA_DTYPE_BF16;
    float *sk = fa_i_fa1_smem, *sv = sk + FA_I_FA1_KEYS * d;
    float *sp = sv + FA_I_FA1_KEYS * d + threadIdx.x * FA_I_FA1_KEYS; /* this thread's P~ */
    float *o_state = state + ((int64_t)b * p.heads_q + h) * p.seqlen_q * (d + 2);
    int c0, r, c, e;
    for (r = threadIdx.x; r < p.seqlen_q; r += blockDim.x) {
        float *st = o_state + (int64_t)r * (d + 2);
        for (e = 0; e < d; ++e) st[e] = 0.0f;
        st[d] = -INFINITY; /* m */
        st[d + 1] = 0.0f;  /* l */
    }
    for (c0 = 0; c0 < p.seqlen_k; c0 += FA_I_FA1_KEYS) {
        const int n = min(FA_I_FA1_KEYS, p.seqlen_k - c0);
        __syncthreads();
        for (e = threadIdx.x; e < n * d; e += blockDim.x) {
            sk[e] = fa_i_load16(p.k, fa_i_dev_offset(&p.k_layout, b, hk, c0 + e / d) + e % d, bf16);
            sv[e] = fa_i_load16(p.v, fa_i_dev_offset(&p.v_layout, b, hk, c0 + e / d) + e % d, bf16);
        }
        __syncthreads();
        for (r = threadIdx.x; r < p.seqlen_q; r += blockDim.x) {
            const int64_t qo = fa_i_dev_offset(&p.q_layout, b, h, r);
            float *st = o_state + (int64_t)r * (d + 2);
            float m_tile = -INFINITY, l_tile = 0.0f, m_new, w_old, w_tile;
            int lo, hi;
            fa_i_key_range(&p, r, &lo, &hi);
            for (c = 0; c < n; ++c) { /* S~ = scores of this block */
                float x = 0.0f;
                for (e = 0; e < d; ++e) x += fa_i_load16(p.q, qo + e, bf16) * sk[c * d + e];
                sp[c] = (c0 + c < lo || c0 + c >= hi) ? -INFINITY : fa_i_score(&p, x);
                m_tile = fmaxf(m_tile, sp[c]);
            }
            if (m_tile == -INFINITY) { /* scores all -inf (weight 0) or NaN (a NaN row) */
                int nan = 0;
                for (c = 0; c < n; ++c) nan |= sp[c] != sp[c];
                if (nan)
                    for (e = 0; e < d + 2; ++e) st[e] = e == d ? -INFINITY : NAN;
                continue;
            }
            for (c = 0; c < n; ++c) {
                sp[c] = exp2f(sp[c] - m_tile);
                l_tile += sp[c];
            }
            m_new = fmaxf(st[d], m_tile);
            w_old = st[d + 1] * exp2f(st[d] - m_new);
            w_tile = exp2f(m_tile - m_new);
            st[d + 1] = w_old + w_tile * l_tile;
            st[d] = m_new;
            for (e = 0; e < d; ++e) {
                float pv = 0.0f;
                for (c = 0; c < n; ++c) pv += sp[c] * sv[c * d + e];
                st[e] = (w_old * st[e] + w_tile * pv) / st[d + 1];
            }
        }
    }
    for (r = threadIdx.x; r < p.seqlen_q; r += blockDim.x) {
        const float *st = o_state + (int64_t)r * (d + 2);
        const int64_t oo = fa_i_dev_offset(&p.o_layout, b, h, r);
        for (e = 0; e < d; ++e) fa_i_store16(p.o, oo + e, st[e], bf16);
        if (p.lse)
            p.lse[((int64_t)b * p.heads_q + h) * p.seqlen_q + r] =
                st[d + 1] == 0.0f ? -INFINITY : (st[d] + log2f(st[d + 1])) * FA_I_LN2_F;
    }
}
#endif /* >> fa1 */

/* >> fa2 forward ==============================================================
   One CTA per (query block, head, batch), FA_FA2_FWD_TILE_<d>. Each warp owns
   MT m16 row tiles (16 * MT query rows): every K and V fragment read from
   shared memory feeds MT MMAs. Per key block:
     wait for K(n), V(n); prefetch K(n+1), V(n+1) into the other stage
     S = Q K(n)^T                      mma.sync, Q and K from smem
     softcap, mask (diagonal, window and tail tiles only)
     exps (speculative where SPEC, else after the row max), P packed in registers
     O += P V(n)                       mma.sync, P as the A operand
   then O / l and LSE, out through shared memory in whole rows. */
#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_FA2_FWD
#define FA_I_FA2(column) FA_I_COL(FA2_FWD, column, FA_I_CAT(FA_FA2_FWD_TILE_, FA_I_D))
static __global__ void __launch_bounds__(32 * FA_I_FA2(WARPS))
    FA_I_KNAME(fa_i_fwd_fa2)(const fa_params p, void *unused)
{
    enum {
        D = FA_I_D, BM = FA_I_FA2(ROWS), BN = FA_I_FA2(KEYS), NW = FA_I_FA2(WARPS), NT = 32 * NW,
        MT = BM / (16 * NW), LD = FA_I_PITCH(D), STAGES = FA_I_FA2(STAGES),
        SPEC = FA_FA2_SPECULATIVE && FA_I_FA2(SPEC)
    };
    extern __shared__ uint4 fa_i_smem[];
    uint16_t *sq = (uint16_t *)fa_i_smem, *sk = sq + BM * LD, *sv = sk + STAGES * BN * LD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int m0, h, b;
    fa_i_query_cta(&p, &m0, &h, &b);
    m0 *= BM;
    const int hk = h / (p.heads_q / p.heads_kv);
    const int last = min(m0 + BM, p.seqlen_q) - 1;
    const int wrow = warp * 16 * MT; /* first row of this warp in the tile */
    const uint16_t *gq = (const uint16_t *)p.q + fa_i_dev_offset(&p.q_layout, b, h, 0);
    const uint16_t *gk = (const uint16_t *)p.k + fa_i_dev_offset(&p.k_layout, b, hk, 0);
    const uint16_t *gv = (const uint16_t *)p.v + fa_i_dev_offset(&p.v_layout, b, hk, 0);
    /* Row r = 2 * mt + half of this thread is m0 + wrow + 16 mt + 8 half + lane / 4. */
    float o[MT][D / 8][4], m_run[2 * MT], l_run[2 * MT];
    /* Raw logits times log2_scale are base-2 scores (softcap already gives them). */
    const float log2_scale = p.softcap > 0.0f ? 1.0f : p.scale * FA_I_LOG2E_F;
    int first_lo, last_hi, all_lo, all_hi, n, n_first, n_end, i, j, t;
    (void)unused;
#pragma unroll
    for (t = 0; t < 2 * MT; ++t) {
        m_run[t] = -INFINITY;
        l_run[t] = 0.0f;
    }
    fa_i_rows_key_span(&p, m0, last + 1, &first_lo, &last_hi);
    fa_i_rows_common_keys(&p, m0, last + 1, &all_lo, &all_hi);
    n_first = first_lo / BN; /* key blocks wholly outside every row's range are skipped */
    n_end = (last_hi + BN - 1) / BN;
#pragma unroll
    for (t = 0; t < MT; ++t) fa_i_zero_acc(o[t], D / 8);

    /* Q only for a block that sees keys: the key loop's first barrier orders
       the Q copies (a thread copies rows of other warps) before the epilogue
       writes O over them; without it a late copy would overwrite O's zeros. */
    if (n_first < n_end)
        fa_i_async_tile(sq, gq, p.q_layout.seq, m0, p.seqlen_q, BM, D, p.head_dim, LD, tid, NT);
    if (n_first < n_end && STAGES == 2)
        fa_i_async_kv(sk, sv, gk, gv, &p, NULL, n_first * BN, BN, D, p.head_dim, p.head_dim_v, LD,
                      tid, NT);
    if (n_first < n_end && STAGES == 1)
        fa_i_async_tile(sk, gk, p.k_layout.seq, n_first * BN, p.seqlen_k, BN, D, p.head_dim, LD,
                        tid, NT);
    fa_i_cp_async_commit();
    for (n = n_first; n < n_end; ++n) {
        const int stage = (n - n_first) & (STAGES - 1), c0 = n * BN;
        const uint16_t *skt = sk + stage * BN * LD, *svt = sv + stage * BN * LD;
        float s[MT][BN / 8][4];
        uint32_t pa[MT][BN / 16][4];
        float alpha[2 * MT]; /* per row: how much O shrinks for this block's new max */
        /* Two stages, one barrier per block: after it, block n is in smem for
           everyone and every warp is done with block n - 1, whose stage the
           prefetch of block n + 1 then overwrites while block n is computed.
           One stage: after it K(n) has landed and every warp is done with
           V(n - 1), which V(n) then overwrites during QK^T. */
        fa_i_cp_async_wait_0();
        __syncthreads();
        if (STAGES == 2 && n + 1 < n_end)
            fa_i_async_kv(sk + (stage ^ 1) * BN * LD, sv + (stage ^ 1) * BN * LD, gk, gv, &p, NULL,
                          c0 + BN, BN, D, p.head_dim, p.head_dim_v, LD, tid, NT);
        if (STAGES == 1)
            fa_i_async_tile(sv, gv, p.v_layout.seq, c0, p.seqlen_k, BN, D, p.head_dim_v, LD, tid,
                            NT);
        fa_i_cp_async_commit();

#pragma unroll
        for (t = 0; t < MT; ++t) fa_i_zero_acc(s[t], BN / 8);
#pragma unroll
        for (i = 0; i < D / 16; ++i) { /* S = Q K^T */
            uint32_t a[MT][4];
#pragma unroll
            for (t = 0; t < MT; ++t) FA_I_LOAD_A(a[t], sq, LD, wrow + 16 * t, i * 16);
#pragma unroll
            for (j = 0; j < BN / 16; ++j) {
                uint32_t bk[4];
                FA_I_LOAD_B_NK(bk, skt, LD, j * 16, i * 16);
#pragma unroll
                for (t = 0; t < MT; ++t) {
                    FA_I_MMA(s[t][2 * j], a[t], bk[0], bk[1]);
                    FA_I_MMA(s[t][2 * j + 1], a[t], bk[2], bk[3]);
                }
            }
        }
        if (p.softcap > 0.0f) /* a uniform branch around the loop, not one per element */
#pragma unroll
            for (t = 0; t < MT; ++t)
#pragma unroll
                for (i = 0; i < BN / 8; ++i)
#pragma unroll
                    for (j = 0; j < 4; ++j) s[t][i][j] = fa_i_score(&p, s[t][i][j]);
        /* diagonal, window and tail tiles */
        if (FA_I_TILE_MASKED(all_hi, all_lo, c0, c0 + BN))
#pragma unroll
            for (t = 0; t < 2 * MT; ++t) {
                int lo, hi;
                fa_i_key_range(&p, m0 + wrow + 8 * t + (lane >> 2), &lo, &hi);
#pragma unroll
                for (i = 0; i < BN / 8; ++i)
#pragma unroll
                    for (j = 0; j < 2; ++j) {
                        const int col = c0 + i * 8 + 2 * (lane & 3) + j;
                        if (col < lo || col >= hi) s[t >> 1][i][2 * (t & 1) + j] = -INFINITY;
                    }
            }
/* Row t's exps 2^(s c - ref), one FFMA and one MUFU each, added to sum and
   packed as A fragments of the PV MMA (so the scores die). */
#define FA_I_FWD_ROW_EXPS(t, ref, sum)                                                \
    _Pragma("unroll") for (i = 0; i < BN / 8; ++i) {                                  \
        const float *sc_ = s[(t) >> 1][i] + 2 * ((t) & 1);                            \
        const float e0_ = fa_i_dev_exp2(fmaf(sc_[0], log2_scale, -(ref)));            \
        const float e1_ = fa_i_dev_exp2(fmaf(sc_[1], log2_scale, -(ref)));            \
        (sum) += e0_ + e1_;                                                           \
        pa[(t) >> 1][i >> 1][2 * (i & 1) + ((t) & 1)] = FA_I_PACK(e0_, e1_);          \
    }
        /* Speculative exps (SPEC, as the FA3 forward's form 1): against the
           running max, without this block's row max; kept where every
           thread's part sum of a row is at most FA_I_SPEC_SUM_MAX, else
           the warp redoes them with the row max below. */
        {
            int rose = 0;
#pragma unroll
            for (t = 0; t < 2 * MT && SPEC; ++t) {
                float sum = 0.0f;
                FA_I_FWD_ROW_EXPS(t, m_run[t], sum);
                alpha[t] = sum; /* this block's part sum, until the vote */
                rose |= !(sum <= FA_I_SPEC_SUM_MAX);
            }
            if (!SPEC || __any_sync(0xffffffffu, rose)) {
#pragma unroll
                for (t = 0; t < 2 * MT; ++t) { /* online softmax, row by row */
                    float (*row)[4] = s[t >> 1];
                    const int e = 2 * (t & 1);
                    float mx = -INFINITY, ref, sum = 0.0f;
#pragma unroll
                    for (i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(row[i][e], row[i][e + 1]));
                    ref = fa_i_row_max_step(mx, log2_scale, &m_run[t], &alpha[t]);
                    FA_I_FWD_ROW_EXPS(t, ref, sum);
                    l_run[t] = l_run[t] * alpha[t] + sum; /* per-thread partial sums; reduced at the end */
                }
#pragma unroll
                for (t = 0; t < MT; ++t) /* O *= alpha, skipped (exactly) where no row's max moved */
                    if (__any_sync(0xffffffffu, alpha[2 * t] != 1.0f || alpha[2 * t + 1] != 1.0f))
#pragma unroll
                        for (i = 0; i < D / 8; ++i) {
                            o[t][i][0] *= alpha[2 * t];
                            o[t][i][1] *= alpha[2 * t];
                            o[t][i][2] *= alpha[2 * t + 1];
                            o[t][i][3] *= alpha[2 * t + 1];
                        }
            } else {
#pragma unroll
                for (t = 0; t < 2 * MT; ++t) l_run[t] += alpha[t];
            }
        }
#undef FA_I_FWD_ROW_EXPS
        if (STAGES == 1) { /* V(n) landed and K(n) is free: load K(n + 1) during PV */
            fa_i_cp_async_wait_0();
            __syncthreads();
            if (n + 1 < n_end)
                fa_i_async_tile(sk, gk, p.k_layout.seq, c0 + BN, p.seqlen_k, BN, D, p.head_dim, LD,
                                tid, NT);
            fa_i_cp_async_commit();
        }
#pragma unroll
        for (i = 0; i < BN / 16; ++i) { /* O += P V */
#pragma unroll
            for (j = 0; j < D / 16; ++j) {
                uint32_t bv[4];
                FA_I_LOAD_B_KN(bv, svt, LD, i * 16, j * 16);
#pragma unroll
                for (t = 0; t < MT; ++t) {
                    FA_I_MMA(o[t][2 * j], pa[t][i], bv[0], bv[1]);
                    FA_I_MMA(o[t][2 * j + 1], pa[t][i], bv[2], bv[3]);
                }
            }
        }
    }
    fa_i_cp_async_wait_0();

    { /* O goes over this warp's own Q rows (no other warp reads them), then
         leaves as whole rows in 16-byte pieces; the __syncwarp orders the
         lanes' reads of Q before other lanes' writes (racecheck) */
        uint16_t *go = (uint16_t *)p.o + fa_i_dev_offset(&p.o_layout, b, h, 0);
        float *lse = p.lse ? p.lse + ((int64_t)b * p.heads_q + h) * p.seqlen_q : NULL;
        __syncwarp();
#pragma unroll
        for (t = 0; t < 2 * MT; ++t) {
            const int r = wrow + 8 * t + (lane >> 2), e = 2 * (t & 1);
            float l = l_run[t], inv;
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv = l == 0.0f ? 0.0f : 1.0f / l; /* a NaN l (NaN or +inf scores) stays NaN */
#pragma unroll
            for (i = 0; i < D / 8; ++i)
                *(uint32_t *)(sq + FA_I_SMEM_AT(r, i * 8 + 2 * (lane & 3), LD)) =
                    FA_I_PACK(o[t >> 1][i][e] * inv, o[t >> 1][i][e + 1] * inv);
            if ((lane & 3) == 0 && lse && m0 + r < p.seqlen_q)
                lse[m0 + r] = l == 0.0f ? -INFINITY : (m_run[t] + log2f(l)) * FA_I_LN2_F;
        }
        __syncwarp();
#pragma unroll
        for (i = 0; i < 16 * MT * (D / 8) / 32; ++i) { /* a warp's pass: 512 bytes */
            const int r = wrow + (32 * i + lane) / (D / 8), c = 8 * ((32 * i + lane) % (D / 8));
            if (m0 + r < p.seqlen_q && c < p.head_dim_v)
                fa_i_copy8_part(go + (int64_t)(m0 + r) * p.o_layout.seq + c,
                                sq + FA_I_SMEM_AT(r, c, LD), p.head_dim_v - c);
        }
    }
}

#undef FA_I_FA2
#endif /* >> fa2 forward */

/* >> fa3 forward ==============================================================
   Hopper, one kernel per (head dim, dtype, tile variant: FA_FA3_FWD_TILE_<d>_<v>).
   Persistent CTAs, one per SM, take pairs of query tiles (fa_i_fa3_tile).
   Warpgroup 0 produces: one thread loads each tile's Q and its key tiles
   by TMA into a ring of STAGES stages (k_full/v_full complete when a stage
   has landed; every consumer warp arrives on k_empty/v_empty once its wgmma
   no longer reads it). The other NC = ROWS / 64 warpgroups consume, 64 query
   rows each:

     producer (fa_i_fa3_producer)          consumer (fa_i_fa3_consumer), per tile
     for each tile of this CTA:            wait Q
       wait Q free; load Q                 S = Q K(first)^T; softmax; P packed
       for each key tile n it sees:        for each later key tile n
         wait stage free; load K(n)          step: issue S(n) = Q K(n)^T with
         wait stage free; load V(n)            O += P V(n-1), then S(n)'s
                                               softmax under PV(n-1) (OVERLAP)
                                           issue O += P V(last)
                                           row sums, LSE; next tile's
                                             coordinates; wait for PV
                                           O / l to shared memory, TMA store

   The step has one function per SOFTMAX form of the tile table:
     fa_i_fa3_step_rowmax   form 0: wait S(n); row max, exps, O rescaled; wait PV(n-1)
     fa_i_fa3_step_spec     form 1: wait S(n); exps against the running max
                            into fp32 beside PV(n-1) (64 more registers); wait PV
     fa_i_fa3_step_packed   form 2: wait S(n) and PV(n-1); exps against the
                            running max packed straight into PV's operand
   In forms 1 and 2 a warp redoes its exps with the row max only where some
   row's max rose by more than FA_I_SPEC_SUM_MAX allows. The variants
   (FA_FA3_FWD_TILE_*) differ in these columns only; the layout of shared
   memory follows from them (FA_I_FA3_SMEM): Q, the K/V ring, and O's own
   buffer where it fits, else O staged in the last key tile's ring stage.
   Accumulator layout: a thread holds rows r and r + 8 (r = 16 warp +
   lane / 4) of S and O; element i of a row-pair array is column 8 (i / 4) +
   2 (lane % 4) + i % 2 of row r + 8 ((i / 2) % 2). Shared tiles are
   [d / 64][rows][64] with the 128-byte swizzle.
   FP8 (FA_I_FP8, dtype e4m3, FA_FA3_FP8_TILE_<d>_<v>): the same kernel with k32
   wgmma over rows of min(d, 128) bytes, form 0's softmax with P shifted into
   [0, 256] and packed to e4m3, V landing in a ring of its own (svr) that
   warps 1-3 of the producer warpgroup transpose into sv as V^T
   (fa_i_fa3_transpose_v), and the descales applied per tile. */
#if defined(FA_I_TOP) && !defined(FA_I_PASS) && FA_I_SM90
/* Which key bounds a key tile's softmax must apply. */
enum { FA_I_MASK_HI = 1, FA_I_MASK_LO = 2 };

/* The forward's shared memory: tile buffers and mbarrier arrays, as shared
   addresses. */
typedef struct fa_i_fa3_smem {
    uint32_t sq, sk, sv, so; /* Q buffers, K ring, V ring, O's own buffer */
    uint32_t svr;            /* FP8: the ring V arrives in, before its transpose into sv */
    uint32_t q_full, q_empty, k_full, v_full, k_empty, v_empty, o_read;
    uint32_t vr_full, vr_empty; /* FP8: svr's stages */
    int gather; /* the kernel's constant: K and V tiles come by cp.async (fa_i_fa3_landed) */
} fa_i_fa3_smem;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Entry `index` of a ring of `stages` buffers: its buffer, and the parity
   of the barrier phase that completes there (a fresh barrier passes a wait
   for parity 1, so a producer waits for a free buffer with phase ^ 1). */
typedef struct fa_i_ring {
    int stage;
    uint32_t phase;
} fa_i_ring;
static __device__ __forceinline__ fa_i_ring fa_i_ring_at(int index, int stages)
{
    fa_i_ring r;
    r.stage = index % stages;
    r.phase = (uint32_t)((index / stages) & 1);
    return r;
}
static __device__ __forceinline__ fa_i_ring fa_i_ring_at64(int64_t index, int stages)
{
    fa_i_ring r;
    r.stage = (int)(index % stages);
    r.phase = (uint32_t)((index / stages) & 1);
    return r;
}

/* After a wait for a full K or V stage: in gather mode cp.async wrote the
   tile through the generic proxy, which wgmma (the async proxy) sees only
   past a proxy fence of the reading thread. */
static __device__ __forceinline__ void fa_i_fa3_landed(const fa_i_fa3_smem *L)
{
    if (L->gather) fa_i_fence_proxy_async();
}

/* Ping-pong: consumer warpgroup cw of nc owns named barrier 1 + cw; it waits
   there before issuing its GEMMs and then lets the next one (cyclically) go.
   The last warpgroup arrives once before anyone's first turn (warpgroup 0
   goes first) and warpgroup 0 waits once after its last, so every arrival
   is matched. */
static __device__ __forceinline__ void fa_i_fa3_turn_begin(int pingpong, int cw)
{
    if (pingpong) fa_i_named_sync(1 + cw, 256);
}
static __device__ __forceinline__ void fa_i_fa3_turn_end(int pingpong, int cw, int nc)
{
    if (pingpong) fa_i_named_arrive(1 + (cw + 1) % nc, 256);
}

/* A consumer's wgmma results landed (after the wait): S(n)'s n_s registers
   fenced and K(n)'s stage handed back to the producer; or O's n_o and P's
   n_pr registers fenced and V(n - 1)'s stage handed back. */
static __device__ __forceinline__ void fa_i_fa3_s_landed(const fa_i_fa3_smem *L, fa_i_ring kn,
                                                         float *s, int n_s)
{
    fa_i_fence_f32(s, n_s);
    if ((threadIdx.x & 31) == 0) fa_i_mbar_arrive(L->k_empty + 8 * kn.stage);
}
static __device__ __forceinline__ void fa_i_fa3_pv_landed(const fa_i_fa3_smem *L, fa_i_ring vprev,
                                                          float *o, int n_o, uint32_t *pr, int n_pr)
{
    fa_i_fence_f32(o, n_o);
    fa_i_fence_u32(pr, n_pr);
    if ((threadIdx.x & 31) == 0) fa_i_mbar_arrive(L->v_empty + 8 * vprev.stage);
}

/* The persistent schedule: the k-th tile of this CTA (query blocks of bm
   rows), or 0 when it has no more. CTAs take pairs of tiles in turn (pair
   u: tiles 2u and 2u + 1); within a head the query blocks run M-1, 0, M-2,
   1, ... under causal masking, so every pair holds one heavy and one light
   block and static turns stay balanced. Where the grid has a CTA for every
   tile (fa_i_fa3_ctas: no more tiles than SMs) each takes one: pairs would
   leave half the SMs idle. Query blocks vary fastest: CTAs running
   together share a head's K and V in L2. Varlen: the tiles of maps->tiles
   (the host's order), *b the schedule's sequence. */
static __device__ __forceinline__ int fa_i_fa3_tile(const fa_params *p, const fa_i_tma_maps *maps,
                                                    int64_t k, int bm, int *mb, int *h, int *b)
{
    const int blocks_m = (p->seqlen_q + bm - 1) / bm;
    const int64_t tiles = !maps->seqs         ? (int64_t)blocks_m * p->heads_q * p->batch
                          : maps->tile_count ? *maps->tile_count
                                             : maps->num_tiles;
    const int64_t t = gridDim.x >= tiles ? blockIdx.x + k * gridDim.x
                                         : 2 * (blockIdx.x + (k >> 1) * gridDim.x) + (k & 1);
    int r;
    if (maps->seqs) { /* the host's list */
        int2 e;
        if (t >= tiles) return 0;
        e = maps->tiles[(int)t];
        *b = e.x;
        *h = (int)((uint32_t)e.y >> 16);
        *mb = e.y & 0xffff;
        return 1;
    }
    if (t >= tiles) return 0;
    if (t <= 0xFFFFFFFF) { /* 32-bit divisions where they do: far cheaper */
        const uint32_t hb = (uint32_t)t / (uint32_t)blocks_m;
        r = (int)((uint32_t)t - hb * (uint32_t)blocks_m);
        *h = (int)(hb % (uint32_t)p->heads_q);
        *b = (int)(hb / (uint32_t)p->heads_q);
    } else {
        const int64_t hb = t / blocks_m;
        r = (int)(t - hb * blocks_m);
        *h = (int)(hb % p->heads_q);
        *b = (int)(hb / p->heads_q);
    }
    *mb = fa_i_fa3_block_order(p->causal, r, blocks_m);
    return 1;
}

/* The problem a tile of fa_i_fa3_tile's b belongs to: p itself, or with
   varlen sequence b's lengths and bottom-right positions (*view); returns
   the maps its rows are in and *map_b, its batch coordinate there. */
static __device__ __forceinline__ const fa_i_tma_maps *fa_i_fa3_rows(const fa_params *p,
                                                                     const fa_i_tma_maps *maps,
                                                                     int b, fa_params *view,
                                                                     int *map_b)
{
    *view = *p;
    if (!maps->seqs) {
        *map_b = b;
        return maps;
    }
    view->seqlen_q = maps->seqs[b].nq;
    view->seqlen_k = maps->seqs[b].nk;
    fa_i_bottom_right(view);
    *map_b = 0;
    return maps->seq_maps + b;
}

/* The tile's LSE rows: [B, Hq, Nq], or by sequence where its entry says
   (varlen: [Hq, total_q] from the sequence's first row). */
static __device__ __forceinline__ float *fa_i_fa3_lse_rows(const fa_params *p,
                                                           const fa_i_tma_maps *maps, int b, int h)
{
    return maps->seqs ? p->lse + (int64_t)h * maps->lse_head + maps->seqs[b].lse0
                      : p->lse + ((int64_t)b * p->heads_q + h) * p->seqlen_q;
}

/* Paged: the block table's entry for the box of keys from `row` of a
   sequence (its table row `pages`, its last page from key `last`), or -1
   in that last page, which the sequence's own maps hold (batch 0: that
   page's rows up to the sequence's last key, so the TMA zero-fills the box
   past them). A box (a key tile, or a page where pages are smaller) never
   spans two pages. */
static __device__ __forceinline__ int fa_i_fa3_page(const fa_i_tma_maps *maps, const int32_t *pages,
                                                    int last, int row)
{
    return row >= last ? -1 : pages[row >> maps->page_shift];
}

/* A tensor map the host copied into the workspace: the tensormap proxy
   must not use what it cached from an earlier call's map at that address. */
static __device__ __forceinline__ void fa_i_tma_map_acquire(const CUtensorMap *map)
{
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(
                     (uint64_t)(uintptr_t)map)
                 : "memory");
}
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */
#endif /* FA_I_TOP && FA_I_SM90 */

#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_FA3_FWD
/* This variant's tile (FA_I_FA3_ROW, FA_I_FA3_* from >> instantiation). */
#define FA_I_FA3(column) FA_I_COL(FA3_FWD, column, FA_I_FA3_ROW)
/* Q, K, V elements: bytes each (FA_I_FP8: e4m3), bytes of a swizzled row
   (64 elements of 16 bits; FP8 rows of d, at most 128), elements of d per
   such row, and P's registers per thread (4 e4m3 or 2 16-bit values each). */
#define FA_I_FA3_ES (FA_I_FP8 ? 1 : 2)
#define FA_I_FA3_RB (FA_I_FP8 && FA_I_D < 128 ? FA_I_D : 128)
#define FA_I_FA3_CE (FA_I_FA3_RB / FA_I_FA3_ES)
#define FA_I_FA3_PR (FA_I_FA3(KEYS) * FA_I_FA3_ES / 8)
#define FA_I_FA3_P_SHIFT (FA_I_FP8 ? FA_I_FP8_P_SHIFT : 0.0f) /* log2 of P's factor */
/* Where the producer's TMA puts V and which barrier frees that buffer: the
   V ring, or with FP8 the ring V is transposed from. */
#define FA_I_FA3_V_IN(L) (FA_I_FP8 ? (L)->svr : (L)->sv)
#define FA_I_FA3_V_IN_EMPTY(L) (FA_I_FP8 ? (L)->vr_empty : (L)->v_empty)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_I_WGMMA_QK FA_I_CAT(FA_I_CAT(fa_i_wgmma_ss_, FA_I_DT), FA_I_CAT(_n, FA_I_FA3(KEYS)))
#define FA_I_WGMMA_PV FA_I_CAT(FA_I_CAT(fa_i_wgmma_rs_, FA_I_DT), FA_I_CAT(_n, FA_I_D))
/* What the tile's columns and the lab switches make of it; Q buffers and
   O's own buffer as FA_I_FA3_Q_BUFS and FA_I_FA3_O_APART (>> instantiation). */
#define FA_I_FA3_BN FA_I_FA3(KEYS)
#define FA_I_FA3_NC (FA_I_FA3(ROWS) / 64) /* consumer warpgroups */
#define FA_I_FA3_PP (FA_FA3_PINGPONG && FA_I_FA3(PINGPONG))
#define FA_I_FA3_FORM (FA_FA3_SPECULATIVE ? FA_I_FA3(SOFTMAX) : 0)
static_assert(FA_I_FA3_FORM != 1 || FA_I_FA3_NC == 2,
              "flashattn: FA3 SOFTMAX form 1 needs two consumer warpgroups");
static_assert(!FA_I_FP8 || (FA_I_FA3_FORM == 0 && FA_FP8_BLOCK % 64 == 0 &&
                            (FA_I_V == 0 ? (FA_I_FA3_BN == 64 || FA_I_FA3_BN == 128) &&
                                                   FA_FP8_BLOCK % FA_I_FA3_BN == 0
                                             : FA_I_FA3_BN == 192) &&
                            FA_I_FA3_O_APART),
              "flashattn: FP8 tiles take SOFTMAX form 0 and O's own buffer; t0 64 or 128 keys "
              "within one FA_FP8_BLOCK (one descale of K and V each; a warpgroup's 64 rows "
              "have one of Q), t1 192 (one descale per head or tensor)");

/* Issues S = Q K^T for this warpgroup's 64 rows (one commit group). A head
   dim below the tile's (d = 80 ... 224 on the tiles of 128 and 256) leaves
   Q's columns past it zero, so only the steps up to the next eighth of the
   tile's head dim are issued. One whole chain a branch: a branch inside a
   chain, or chains that join before their commit, make ptxas insert
   warpgroup.arrive waits (C7519). */
#define FA_I_FA3_QK_CHAIN(steps)                                                               \
    do {                                                                                      \
        fa_i_wgmma_fence();                                                                   \
        FA_I_SM90_GEMM_K(FA_I_WGMMA_QK, s, sq, BM, sk, BN, steps, FA_I_FA3_RB);                \
        fa_i_wgmma_commit();                                                                  \
    } while (0)
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_qk)(const fa_params *p, float *s,
                                                               uint32_t sq, uint32_t sk)
{
    enum { BM = FA_I_FA3(ROWS), BN = FA_I_FA3_BN, STEPS = FA_I_D * FA_I_FA3_ES / 32 };
    const int eighths = (8 * p->head_dim + FA_I_D - 1) / FA_I_D;
    if (eighths >= 8)
        FA_I_FA3_QK_CHAIN(STEPS);
    else if (eighths == 7)
        FA_I_FA3_QK_CHAIN((7 * STEPS + 7) / 8);
    else if (eighths == 6)
        FA_I_FA3_QK_CHAIN((6 * STEPS + 7) / 8);
    else if (eighths == 5)
        FA_I_FA3_QK_CHAIN((5 * STEPS + 7) / 8);
    else
        FA_I_FA3_QK_CHAIN((4 * STEPS + 7) / 8);
}
#undef FA_I_FA3_QK_CHAIN

/* Issues O += P V with P (16-bit pairs, or FP8 quads against V^T) in
   registers (one commit group). A V head dim below the tile's (192 / 128
   on the tile of 256) leaves V's columns past it zero and O's never
   stored, so only V's 64-column chunks up to dv are issued (N = 64 a
   chunk; a part of a chunk would not match the swizzled layout): one whole
   chain a branch, as for S. */
#define FA_I_FA3_PV_CHAIN(n)                                                                   \
    do {                                                                                      \
        fa_i_wgmma_fence();                                                                   \
        FA_I_SM90_GEMM_RS(FA_I_CAT(FA_I_CAT(fa_i_wgmma_rs_, FA_I_DT), FA_I_CAT(_n, n)), o, pr, sv, \
                          BN, BN);                                                            \
        fa_i_wgmma_commit();                                                                  \
    } while (0)
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_pv)(const fa_params *p, float *o,
                                                                const uint32_t *pr, uint32_t sv)
{
    enum { BN = FA_I_FA3_BN };
#if FA_I_FP8
    (void)p;
    fa_i_wgmma_fence();
    FA_I_SM90_GEMM_RS8(FA_I_WGMMA_PV, o, pr, sv, BN, FA_I_D);
    fa_i_wgmma_commit();
#elif FA_I_D == 256
    const int chunks = (p->head_dim_v + 63) / 64;
    if (chunks >= 4)
        FA_I_FA3_PV_CHAIN(256);
    else if (chunks == 3)
        FA_I_FA3_PV_CHAIN(192);
    else if (chunks == 2)
        FA_I_FA3_PV_CHAIN(128);
    else
        FA_I_FA3_PV_CHAIN(64);
#else /* the tiles of 64 and 128 issue their whole width: a branch for the
         rare dv <= 64 on the tile of 128 slowed its dense forward */
    (void)p;
    FA_I_FA3_PV_CHAIN(FA_I_D);
#endif
}
#undef FA_I_FA3_PV_CHAIN

/* The scores of one S tile (keys c0...) in place: softcap, then the mask
   (FA_I_MASK_HI: keys at or past each row's end; FA_I_MASK_LO: also keys
   before its start) as -inf. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_scores)(
    const fa_params *p, float *s, int c0, int mask, const int *lo, const int *hi)
{
    enum { BN = FA_I_FA3_BN };
    const int lane = threadIdx.x & 31, col0 = c0 + 2 * (lane & 3);
    int i;
    if (p->softcap > 0.0f)
#pragma unroll
        for (i = 0; i < BN / 2; ++i) s[i] = fa_i_score(p, s[i]);
    /* element i is key col0 + 8 (i / 4) + i % 2 of row half (i / 2) % 2: the
       compare is against a constant */
    if (mask & FA_I_MASK_LO) {
        const int end[2] = {hi[0] - col0, hi[1] - col0}, start[2] = {lo[0] - col0, lo[1] - col0};
#pragma unroll
        for (i = 0; i < BN / 2; ++i) {
            const int c = 8 * (i >> 2) + (i & 1), r = (i >> 1) & 1;
            if (c < start[r] || c >= end[r]) s[i] = -INFINITY;
        }
    } else if (mask) {
        const int end[2] = {hi[0] - col0, hi[1] - col0};
#pragma unroll
        for (i = 0; i < BN / 2; ++i)
            if (8 * (i >> 2) + (i & 1) >= end[(i >> 1) & 1]) s[i] = -INFINITY;
    }
}

/* The rows' max of the masked scores s, running max and sum; s becomes
   P = 2^(score - max) in place, alpha each row's rescale factor for O.
   Returns whether O needs that rescale: always, but with FP8 only where
   some row of the warp rose past its max by more than FA_I_FP8_MAX_SLACK
   or O changes units (o_mul != 1); else the maxes stay and alpha is 1.
   FP8's P also carries p_mul, a power of two (fa_i_fp8_v_units); the row
   sums are of P without it. */
static __device__ __forceinline__ int FA_I_KNAME_V(fa_i_fa3_exps)(float *s, float log2_scale,
                                                                 float p_mul, float o_mul,
                                                                 float *m_run, float *l_run,
                                                                 float *alpha)
{
    enum { BN = FA_I_FA3_BN };
    float mx[2], ref[2];
    int i, half, rescale = 1;
#pragma unroll
    for (half = 0; half < 2; ++half) {
        mx[half] = -INFINITY;
#pragma unroll
        for (i = 0; i < BN / 8; ++i)
            mx[half] = fmaxf(mx[half], fmaxf(s[4 * i + 2 * half], s[4 * i + 2 * half + 1]));
    }
#if FA_I_FP8
#pragma unroll
    for (half = 0; half < 2; ++half) mx[half] = fa_i_row_max(mx[half], log2_scale, m_run[half]);
    rescale = __any_sync(0xffffffffu, mx[0] > m_run[0] + FA_I_FP8_MAX_SLACK ||
                                          mx[1] > m_run[1] + FA_I_FP8_MAX_SLACK) ||
              o_mul != 1.0f;
#pragma unroll
    for (half = 0; half < 2; ++half) {
        alpha[half] = 1.0f;
        if (rescale) fa_i_row_max_move(mx[half], &m_run[half], &alpha[half]);
        /* p_mul = 2^k: k from its exponent bits, exactly */
        ref[half] = (m_run[half] == -INFINITY ? 0.0f : m_run[half]) - FA_I_FP8_P_SHIFT -
                    (float)((int)((__float_as_uint(p_mul) >> 23) & 0xff) - 127);
    }
#else
    (void)p_mul;
    (void)o_mul;
#pragma unroll
    for (half = 0; half < 2; ++half)
        ref[half] = fa_i_row_max_step(mx[half], log2_scale, &m_run[half], &alpha[half]);
#endif
#pragma unroll
    for (half = 0; half < 2; ++half) {
        float sum = 0.0f;
#pragma unroll
        for (i = 0; i < BN / 8; ++i) {
            float *e = s + 4 * i + 2 * half;
            e[0] = fa_i_dev_exp2(fmaf(e[0], log2_scale, -ref[half]));
            e[1] = fa_i_dev_exp2(fmaf(e[1], log2_scale, -ref[half]));
            sum += e[0] + e[1];
        }
#if FA_I_FP8
        sum *= fa_i_dev_rcp(p_mul); /* exact: a power of two */
#endif
        l_run[half] = l_run[half] * alpha[half] + sum;
        alpha[half] *= o_mul; /* O's factor; the sums keep their units */
    }
    return rescale;
}

/* Form 0's softmax of one S tile: its scores, then the row max and exps;
   returns whether O needs rescaling (fa_i_fa3_exps). */
static __device__ __forceinline__ int FA_I_KNAME_V(fa_i_fa3_softmax_rowmax)(
    const fa_params *p, float *s, int c0, int mask, const int *lo, const int *hi,
    float log2_scale, float p_mul, float o_mul, float *m_run, float *l_run, float *alpha)
{
    FA_I_KNAME_V(fa_i_fa3_scores)(p, s, c0, mask, lo, hi);
    return FA_I_KNAME_V(fa_i_fa3_exps)(s, log2_scale, p_mul, o_mul, m_run, l_run, alpha);
}

#if !FA_I_FP8
/* The speculative softmax of forms 1 and 2: the exps run against the
   running max, without the tile's own max. A thread whose 32 exps of a row
   sum to at most FA_I_SPEC_SUM_MAX has no P above it, and if no thread of
   the warp has more, the reference stays and O keeps its scale: P goes to
   e (fp32), or with `packed` straight into pr, and this returns 0.
   Otherwise (a row's max rose, or it had none yet) the warp redoes the exps
   from S, kept for this, against the new max and returns 1: P is then in e
   (or, packed, in s) and alpha holds the rescale factors. */
static __device__ __forceinline__ int FA_I_KNAME_V(fa_i_fa3_softmax_spec)(
    const fa_params *p, float *s, float *e, uint32_t *pr, int packed, int c0, int mask,
    const int *lo, const int *hi, float log2_scale, float *m_run, float *l_run, float *alpha)
{
    enum { BN = FA_I_FA3_BN };
    int i, half, rose = 0;
    float sum[2];
    FA_I_KNAME_V(fa_i_fa3_scores)(p, s, c0, mask, lo, hi);
#pragma unroll
    for (half = 0; half < 2; ++half) {
        sum[half] = 0.0f;
#pragma unroll
        for (i = 0; i < BN / 8; ++i) {
            const int j = 4 * i + 2 * half;
            const float e0 = fa_i_dev_exp2(fmaf(s[j], log2_scale, -m_run[half]));
            const float e1 = fa_i_dev_exp2(fmaf(s[j + 1], log2_scale, -m_run[half]));
            sum[half] += e0 + e1;
            if (packed) {
                pr[j / 2] = FA_I_PACK(e0, e1);
            } else {
                e[j] = e0;
                e[j + 1] = e1;
            }
        }
        /* also true for inf and NaN: a row with no max yet (-inf) always redoes */
        rose |= !(sum[half] <= FA_I_SPEC_SUM_MAX);
    }
    /* P's writes stay above the vote: otherwise the compiler sinks what the
       redo overwrites into the common path (DESIGN.md f37) */
    if (packed)
        fa_i_fence_u32(pr, BN / 4);
    else
        fa_i_fence_f32(e, BN / 2);
    if (__any_sync(0xffffffffu, rose)) {
        FA_I_KNAME_V(fa_i_fa3_exps)(s, log2_scale, 1.0f, 1.0f, m_run, l_run, alpha);
        if (!packed)
#pragma unroll
            for (i = 0; i < BN / 2; ++i) e[i] = s[i];
        return 1;
    }
    l_run[0] += sum[0];
    l_run[1] += sum[1];
    return 0;
}
#endif /* !FA_I_FP8 */

/* O *= alpha per row; P to 16-bit pairs in the A-fragment order of the RS
   wgmma, which is the accumulator order: k16 slice k takes S[8k .. 8k + 7].
   FP8: register q of k32 slice k takes S[16k + b + {0, 1, 4, 5}], b = 8 (q / 2)
   + 2 (q % 2): keys {2t, 2t + 1, 8 + 2t, 9 + 2t} (+16) of lane 4g + t where the
   A fragment wants 4t .. 4t + 3, so V^T holds its keys in that order
   (fa_i_fa3_transpose_v) and no bytes move between lanes. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_rescale_pack)(float *o, const float *s,
                                                                          uint32_t *pr,
                                                                          const float *alpha,
                                                                          int rescale)
{
    int i;
    if (rescale)
#pragma unroll
        for (i = 0; i < FA_I_D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
#pragma unroll
    for (i = 0; i < FA_I_FA3_PR; ++i) {
#if FA_I_FP8
        const float *q = s + 16 * (i >> 2) + 8 * ((i >> 1) & 1) + 2 * (i & 1);
        pr[i] = fa_i_pack_e4m3(q[0], q[1], q[4], q[5]);
#else
        pr[i] = FA_I_PACK(s[2 * i], s[2 * i + 1]);
#endif
    }
}

/* A consumer warpgroup's running state over one query tile's key tiles. */
#define FA_I_FA3_ROWS_STATE \
    float *o, float *s, uint32_t *pr, float *m_run, float *l_run, float *alpha
#define FA_I_FA3_ROWS_ARGS o, s, pr, m_run, l_run, alpha

/* Key tile n's scores on their own (a tile's first, or every one without
   the overlap): S = Q K(n)^T, K's stage released, form 0's softmax, O
   rescaled and P packed. s_mul: the factor of S before a softcap (the
   FP8 descales; 1 otherwise); p_mul and o_mul: FP8's factors of P and O
   (fa_i_fp8_v_units; 1 otherwise). */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_first_step)(
    const fa_params *p, const fa_i_fa3_smem *L, uint32_t sq_wg, fa_i_ring kn, int n, int mask,
    const int *lo, const int *hi, float log2_scale, float s_mul, float p_mul, float o_mul, int cw,
    FA_I_FA3_ROWS_STATE)
{
    enum {
        BN = FA_I_FA3_BN, NC = FA_I_FA3_NC, TILE = BN * FA_I_D * FA_I_FA3_ES,
        PINGPONG = FA_I_FA3_PP
    };
    int i;
    fa_i_mbar_wait(L->k_full + 8 * kn.stage, kn.phase);
    fa_i_fa3_landed(L);
    fa_i_fa3_turn_begin(PINGPONG, cw);
    FA_I_KNAME_V(fa_i_fa3_qk)(p, s, sq_wg, L->sk + kn.stage * TILE);
    fa_i_fa3_turn_end(PINGPONG, cw, NC);
    FA_I_WGMMA_WAIT(0);
    fa_i_fa3_s_landed(L, kn, s, BN / 2);
    if (p->softcap > 0.0f)
#pragma unroll
        for (i = 0; i < BN / 2; ++i) s[i] *= s_mul;
    FA_I_KNAME_V(fa_i_fa3_softmax_rowmax)(p, s, n * BN, mask, lo, hi, log2_scale, p_mul, o_mul,
                                          m_run, l_run, alpha);
    FA_I_KNAME_V(fa_i_fa3_rescale_pack)(o, s, pr, alpha, 1);
}

/* The step's head, every form alike: wait for K(n) and V(n - 1), issue S(n)
   = Q K(n)^T and O += P V(n - 1) in this warpgroup's turn. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_issue)(
    const fa_params *p, const fa_i_fa3_smem *L, uint32_t sq_wg, fa_i_ring kn, fa_i_ring vprev,
    int cw, float *o, float *s, const uint32_t *pr)
{
    enum {
        BN = FA_I_FA3_BN, NC = FA_I_FA3_NC, TILE = BN * FA_I_D * FA_I_FA3_ES,
        PINGPONG = FA_I_FA3_PP
    };
    fa_i_mbar_wait2(L->k_full + 8 * kn.stage, kn.phase, L->v_full + 8 * vprev.stage, vprev.phase);
    fa_i_fa3_landed(L);
    fa_i_fa3_turn_begin(PINGPONG, cw);
    FA_I_KNAME_V(fa_i_fa3_qk)(p, s, sq_wg, L->sk + kn.stage * TILE);
    FA_I_KNAME_V(fa_i_fa3_pv)(p, o, pr, L->sv + vprev.stage * TILE);
    fa_i_fa3_turn_end(PINGPONG, cw, NC);
}

/* Form 0: S(n) waited for alone, its softmax (row max first) while PV(n - 1)
   runs, then PV's wait, O rescaled (where the softmax asks) and P packed.
   s_mul, p_mul and o_mul as in first_step. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_step_rowmax)(
    const fa_params *p, const fa_i_fa3_smem *L, uint32_t sq_wg, fa_i_ring kn, fa_i_ring vprev,
    int n, int mask, const int *lo, const int *hi, float log2_scale, float s_mul, float p_mul,
    float o_mul, int cw, FA_I_FA3_ROWS_STATE)
{
    enum { BN = FA_I_FA3_BN };
    int i, rescale;
    FA_I_KNAME_V(fa_i_fa3_issue)(p, L, sq_wg, kn, vprev, cw, o, s, pr);
    FA_I_WGMMA_WAIT(1);
    fa_i_fa3_s_landed(L, kn, s, BN / 2);
    if (p->softcap > 0.0f)
#pragma unroll
        for (i = 0; i < BN / 2; ++i) s[i] *= s_mul;
    rescale = FA_I_KNAME_V(fa_i_fa3_softmax_rowmax)(p, s, n * BN, mask, lo, hi, log2_scale, p_mul,
                                                    o_mul, m_run, l_run, alpha);
    FA_I_WGMMA_WAIT(0);
    fa_i_fa3_pv_landed(L, vprev, o, FA_I_D / 2, pr, FA_I_FA3_PR);
    FA_I_KNAME_V(fa_i_fa3_rescale_pack)(o, s, pr, alpha, rescale);
}

#if !FA_I_FP8
/* Form 1: S(n) waited for alone, speculative exps into fp32 while PV(n - 1)
   runs, then PV's wait; O rescaled only where the exps were redone. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_step_spec)(
    const fa_params *p, const fa_i_fa3_smem *L, uint32_t sq_wg, fa_i_ring kn, fa_i_ring vprev,
    int n, int mask, const int *lo, const int *hi, float log2_scale, int cw, FA_I_FA3_ROWS_STATE,
    float *e)
{
    enum { BN = FA_I_FA3_BN };
    int redo;
    FA_I_KNAME_V(fa_i_fa3_issue)(p, L, sq_wg, kn, vprev, cw, o, s, pr);
    FA_I_WGMMA_WAIT(1);
    fa_i_fa3_s_landed(L, kn, s, BN / 2);
    redo = FA_I_KNAME_V(fa_i_fa3_softmax_spec)(p, s, e, pr, 0, n * BN, mask, lo, hi, log2_scale,
                                               m_run, l_run, alpha);
    FA_I_WGMMA_WAIT(0);
    fa_i_fa3_pv_landed(L, vprev, o, FA_I_D / 2, pr, FA_I_FA3_PR);
    FA_I_KNAME_V(fa_i_fa3_rescale_pack)(o, e, pr, alpha, redo);
}

/* Form 2: S(n) and PV(n - 1) waited for together, then the speculative exps
   packed straight into PV(n)'s operand; redone (and O rescaled) where a
   row's max rose. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_step_packed)(
    const fa_params *p, const fa_i_fa3_smem *L, uint32_t sq_wg, fa_i_ring kn, fa_i_ring vprev,
    int n, int mask, const int *lo, const int *hi, float log2_scale, int cw, FA_I_FA3_ROWS_STATE)
{
    enum { BN = FA_I_FA3_BN };
    FA_I_KNAME_V(fa_i_fa3_issue)(p, L, sq_wg, kn, vprev, cw, o, s, pr);
    FA_I_WGMMA_WAIT(0);
    fa_i_fa3_s_landed(L, kn, s, BN / 2);
    fa_i_fa3_pv_landed(L, vprev, o, FA_I_D / 2, pr, FA_I_FA3_PR);
    if (FA_I_KNAME_V(fa_i_fa3_softmax_spec)(p, s, NULL, pr, 1, n * BN, mask, lo, hi, log2_scale,
                                            m_run, l_run, alpha))
        FA_I_KNAME_V(fa_i_fa3_rescale_pack)(o, s, pr, alpha, 1);
}
#endif /* !FA_I_FP8 */

/* The producer thread: each tile's Q, then the key tiles that any of its
   rows sees, into the ring; with O staged in the ring (no O_APART), a
   stage holding a staged O is reloaded only once its TMA store has read it.
   Gather mode (maps->gather: paged, pages too small for the TMA's boxes):
   all 128 threads of the warpgroup run this, thread 0 loading Q by TMA and
   every thread copying its share of each key tile from the pages by
   cp.async (fa_i_gather_rows) and arriving on the stage's full barrier
   once its copies land (fa_i_cp_async_arrive: 128 arrivals, no thread
   waits), so the ring's stages fill as the TMA's would. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_producer)(
    const fa_params *p, const fa_i_tma_maps *maps, const fa_i_fa3_smem *L, const int lead_warp,
    const int gather)
{
    enum {
        D = FA_I_D, BM = FA_I_FA3(ROWS), BN = FA_I_FA3_BN, STAGES = FA_I_FA3(STAGES),
        CE = FA_I_FA3_CE, RB = FA_I_FA3_RB, CHUNKS = D / CE, TILE = BN * D * FA_I_FA3_ES,
        Q_BUFS = FA_I_FA3_Q_BUFS, Q_BYTES = BM * D * FA_I_FA3_ES, O_IN_RING = !FA_I_FA3_O_APART,
        L2_HINTS = FA_I_FA3(L2HINTS),
        BOXES = FA_I_FP8 ? 1 : BN / 16 < FA_I_FA3_BOXES ? BN / 16 : FA_I_FA3_BOXES
    };
    const uint64_t once = L2_HINTS ? FA_I_L2_EVICT_FIRST : FA_I_L2_EVICT_NORMAL;
    const uint64_t reused = L2_HINTS ? FA_I_L2_EVICT_LAST : FA_I_L2_EVICT_NORMAL;
    /* gather: the lead warp waits for Q's buffer, its lane 0 issues Q's
       TMA copies; otherwise this is thread 0, which does both */
    const int lead = gather ? lead_warp : 1, issue = gather ? (threadIdx.x & 31) == 0 : 1;
    int64_t k;
    int it = 0, mb, h, b, have;
    /* per stage: it holds a staged O (O_IN_RING), and the parity of its
       o_read barriers' next phase */
    uint32_t staged = 0, o_parity = 0;
    if (lead && !gather) {
        fa_i_tma_prefetch(&maps->k);
        fa_i_tma_prefetch(&maps->v);
    }
    if (lead) fa_i_tma_prefetch(&maps->o);
    have = fa_i_fa3_tile(p, maps, 0, BM, &mb, &h, &b);
    for (k = 0; have; ++k) {
        const int hk = h / (p->heads_q / p->heads_kv);
        const fa_i_ring q = fa_i_ring_at64(k, Q_BUFS);
        fa_params view;
        int first_lo, last_hi, n, c, mapb;
        const fa_i_tma_maps *m = fa_i_fa3_rows(p, maps, b, &view, &mapb);
        if (maps->seqs && lead) {
            fa_i_tma_map_acquire(&m->q);
            fa_i_tma_map_acquire(&m->k);
            fa_i_tma_map_acquire(&m->v);
        }
        fa_i_rows_key_span(&view, mb * BM, min(mb * BM + BM, view.seqlen_q), &first_lo, &last_hi);
        /* paged: the sequence's block-table row, the first key of its last
           page (0 when dense: every box from m; FP8 is dense only) */
        const int paged_keys = !FA_I_FP8 && maps->pages;
        const int32_t *seq_pages = paged_keys ? maps->pages + maps->seqs[b].pages0 : NULL;
        const int pmask = paged_keys ? (1 << maps->page_shift) - 1 : 0;
        const int last = paged_keys ? (view.seqlen_k - 1) & ~pmask : 0;
        if (lead) {
            fa_i_mbar_wait(L->q_empty + 8 * q.stage, q.phase ^ 1);
            if (issue) {
                fa_i_mbar_expect_tx(L->q_full + 8 * q.stage, Q_BYTES);
                for (c = 0; c < CHUNKS; ++c)
                    fa_i_tma_load(L->sq + q.stage * Q_BYTES + c * BM * RB, &m->q, CE * c, mb * BM,
                                  h, mapb, L->q_full + 8 * q.stage, once);
            }
        }
        /* key tiles no row of this tile sees are never loaded */
        const int n_end = (last_hi + BN - 1) / BN;
        int ent_next = gather && first_lo / BN < n_end
                           ? fa_i_fa3_gather_ent(seq_pages, first_lo / BN * BN, view.seqlen_k,
                                                 maps->page_shift)
                           : 0;
        for (n = first_lo / BN; n < n_end; ++n, ++it) {
            const fa_i_ring r = fa_i_ring_at(it, STAGES);
            const int st = r.stage, o_there = (staged >> st) & 1;
            /* where the keys are: (m, row n BN, batch mapb), or the pages'
               (not FP8's: dense only, and its producer has no registers to
               spare): the tile whole from its page, or a box of `box` keys
               from each page it spans, box rows apart in each chunk. Every
               box's entry is loaded before the waits, all together, and
               serves K and V: not a dependent load a box after the wait. */
            const int box = paged_keys ? min(1 << maps->page_shift, (int)BN) : BN;
            int page[BOXES], jj;
#pragma unroll
            for (jj = 0; jj < BOXES; ++jj)
                page[jj] = paged_keys && !gather && jj * box < BN
                               ? fa_i_fa3_page(maps, seq_pages, last, n * BN + jj * box)
                               : -1;
            /* gather: the tile's pages, loaded a tile ahead */
            const int ent = ent_next;
            if (gather && n + 1 < n_end)
                ent_next = fa_i_fa3_gather_ent(seq_pages, (n + 1) * BN, view.seqlen_k,
                                               maps->page_shift);
            fa_i_mbar_wait(L->k_empty + 8 * st, r.phase ^ 1);
            if (o_there) fa_i_mbar_wait(L->o_read + 8 * st, (o_parity >> st) & 1);
#define FA_I_FA3_GATHER_KV(dst, g, l, cols, full)                                                \
    fa_i_gather_rows(dst, (const uint16_t *)(g) + (l).head * hk, (l).seq, ent, maps->page_shift, \
                     (l).batch, n * BN, view.seqlen_k, BN, D, cols, threadIdx.x);               \
    fa_i_cp_async_arrive(full)
#define FA_I_FA3_LOAD_KV(dst, which, full)                                                      \
    _Pragma("unroll") for (jj = 0; jj < BOXES; ++jj) {                                          \
        const int row = n * BN + jj * box, paged = page[jj] >= 0;                               \
        if (jj > 0 && jj * box >= BN) break;                                                    \
        for (c = 0; c < CHUNKS; ++c)                                                            \
            fa_i_tma_load((dst) + c * BN * RB + jj * box * RB, paged ? &maps->which : &m->which, \
                          CE * c, paged ? row & pmask : row - last, hk, paged ? page[jj] : mapb, \
                          full, reused);                                                        \
    }
            if (gather) {
                FA_I_FA3_GATHER_KV(L->sk + st * TILE, p->k, p->k_layout, p->head_dim,
                                   L->k_full + 8 * st);
            } else {
                fa_i_mbar_expect_tx(L->k_full + 8 * st, TILE);
                FA_I_FA3_LOAD_KV(L->sk + st * TILE, k, L->k_full + 8 * st);
            }
            fa_i_mbar_wait(FA_I_FA3_V_IN_EMPTY(L) + 8 * st, r.phase ^ 1);
            if (o_there) {
                fa_i_mbar_wait(L->o_read + 8 * (STAGES + st), (o_parity >> st) & 1);
                o_parity ^= 1u << st;
                staged &= ~(1u << st);
            }
            if (gather) {
                FA_I_FA3_GATHER_KV(L->sv + st * TILE, p->v, p->v_layout, p->head_dim_v,
                                   L->v_full + 8 * st);
            } else {
                const uint32_t full = (FA_I_FP8 ? L->vr_full : L->v_full) + 8 * st;
                fa_i_mbar_expect_tx(full, TILE);
                FA_I_FA3_LOAD_KV(FA_I_FA3_V_IN(L) + st * TILE, v, full);
            }
#undef FA_I_FA3_LOAD_KV
#undef FA_I_FA3_GATHER_KV
        }
        if (O_IN_RING && first_lo / BN < n_end)
            staged |= 1u << ((it - 1) % STAGES);
        /* With one Q buffer the next tile's Q loads only once this tile
           frees it, and no other CTA has read it: into L2 now, so that the
           load at the tile boundary hits (DESIGN.md f11). */
        have = fa_i_fa3_tile(p, maps, k + 1, BM, &mb, &h, &b);
        if (Q_BUFS == 1 && have && !maps->seqs && lead && issue)
            for (c = 0; c < CHUNKS; ++c) fa_i_tma_prefetch_l2(&maps->q, CE * c, mb * BM, h, b);
    }
}

#if FA_I_FP8
/* FP8's V^T: the wgmma's B operand must be K-major, so warps 1-3 of the
   producer warpgroup (warp 0 of 3 here) transpose each V tile the TMA
   brought into svr ([chunks][BN keys][RB], rows of d) into sv ([BN / VR
   chunks][d][VR keys], rows of VR = FA_I_VT_ROW(BN) bytes, swizzled), key
   order within each 16 keys as P's
   registers have them (fa_i_fa3_rescale_pack): position 4t + j holds key
   2t + j % 2 + 8 (j / 2). A unit is 16 keys x 32 of d: one ldmatrix x4 with
   transpose reads keys 0-7 and 8-15 (matrices 0, 1; 2, 3 for d + 16), so a
   lane holds keys 2t, 2t + 1 (and 8 + 2t, 9 + 2t) at d 2g, 2g + 1; byte
   permutes make positions 4t .. 4t + 3 of d 2g and of d 2g + 1, and one
   stmatrix x4 writes them to rows 2g, 2g + 1 (+16) of V^T. The reads are
   8 consecutive keys, free of bank conflicts. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_transpose_v)(
    const fa_params *p, const fa_i_tma_maps *maps, const fa_i_fa3_smem *L, int warp)
{
    enum {
        D = FA_I_D, BM = FA_I_FA3(ROWS), BN = FA_I_FA3_BN, STAGES = FA_I_FA3(STAGES),
        RB = FA_I_FA3_RB, TILE = BN * D, KEY_UNITS = BN / 16, UNITS = KEY_UNITS * (D / 32),
        VR = FA_I_VT_ROW(BN), VR_UNITS = VR / 16 /* a V^T row's 16-key units */
    };
    const uint32_t lane = threadIdx.x & 31, mi = lane >> 3, row = lane & 7;
    /* this lane's row of each matrix: the ldmatrix's key and d, the
       stmatrix's row of V^T; the swizzles' row terms (a key's and a V^T
       row's low bits do not change with the unit: units start at multiples
       of 16 keys and 32 of d) */
    const uint32_t ld_key = 8 * (mi & 1) + row, ld_d = 16 * (mi >> 1);
    const uint32_t st_d = 16 * (mi >> 1) + 2 * row + (mi & 1);
    const uint32_t key_swz = RB == 128 ? ld_key & 7 : (ld_key >> 1) & 3;
    const uint32_t vt_row_swz = VR == 128 ? st_d & 7 : (st_d >> 1) & 3;
    int64_t k;
    int it = 0, mb, h, b, have = fa_i_fa3_tile(p, maps, 0, BM, &mb, &h, &b);
    for (k = 0; have; ++k) {
        int first_lo, last_hi, n;
        fa_i_rows_key_span(p, mb * BM, min(mb * BM + BM, p->seqlen_q), &first_lo, &last_hi);
        for (n = first_lo / BN; n < (last_hi + BN - 1) / BN; ++n, ++it) {
            const fa_i_ring r = fa_i_ring_at(it, STAGES);
            const uint32_t src = L->svr + r.stage * TILE + ld_key * RB;
            const uint32_t dst = L->sv + r.stage * TILE + st_d * VR;
            uint32_t u;
            fa_i_mbar_wait(L->vr_full + 8 * r.stage, r.phase);
            fa_i_mbar_wait(L->v_empty + 8 * r.stage, r.phase ^ 1);
            for (u = (uint32_t)warp; u < UNITS; u += 3) {
                /* unit u: keys 16 kg.., d 32 cd.. (its ldmatrix reads d
                   chunk dd / RB, 16-byte unit (dd % RB) / 16 of a row) */
                const uint32_t kg = u % KEY_UNITS, cd = u / KEY_UNITS;
                const uint32_t dd = 32 * cd + ld_d, unit = (dd % RB) >> 4;
                uint32_t x[4], y[4];
                fa_i_ldsm_x4_trans(x, src + (dd / RB) * BN * RB + 16 * kg * RB +
                                          ((unit ^ key_swz) << 4));
                y[0] = __byte_perm(x[0], x[1], 0x6420);
                y[1] = __byte_perm(x[0], x[1], 0x7531);
                y[2] = __byte_perm(x[2], x[3], 0x6420);
                y[3] = __byte_perm(x[2], x[3], 0x7531);
                fa_i_stsm_x4(dst + kg / VR_UNITS * D * VR + 32 * cd * VR +
                                 ((kg % VR_UNITS ^ vt_row_swz) << 4),
                             y);
            }
            fa_i_fence_proxy_async();
            __syncwarp();
            if (lane == 0) {
                fa_i_mbar_arrive(L->v_full + 8 * r.stage);
                fa_i_mbar_arrive(L->vr_empty + 8 * r.stage);
            }
        }
        have = fa_i_fa3_tile(p, maps, k + 1, BM, &mb, &h, &b);
    }
}
#endif

/* The epilogue: O / l in 16 bits into shared memory at o_at (O's own
   buffer, the ring stage of the tile's last key tile, or this warpgroup's
   own Q rows in a tile without keys), one TMA store per chunk of 64
   columns; where O has no buffer of its own, the store's read frees the
   stage or the Q buffer. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_store_o)(
    const fa_i_tma_maps *maps, const fa_i_fa3_smem *L, uint32_t o_at, uint32_t o_chunk,
    int in_ring, int q_stage, uint32_t last_stage, int m0, int h, int b, int cw, const float *o,
    const float *inv, int o_bf16)
{
/* O's 16 bits: the inputs' dtype, or with FP8 the caller's o_dtype */
#if FA_I_FP8
#define FA_I_PACK_O(lo, hi) (o_bf16 ? fa_i_pack_bf16(lo, hi) : fa_i_pack_f16(lo, hi))
#else
#define FA_I_PACK_O(lo, hi) FA_I_PACK(lo, hi)
    (void)o_bf16;
#endif
    enum {
        D = FA_I_D, CHUNKS = D / 64, NC = FA_I_FA3_NC,
        STAGES = FA_I_FA3(STAGES), O_APART = FA_I_FA3_O_APART,
        L2_HINTS = FA_I_FA3(L2HINTS)
    };
    const uint64_t once = L2_HINTS ? FA_I_L2_EVICT_FIRST : FA_I_L2_EVICT_NORMAL;
    const int t = threadIdx.x % 128, lane = t & 31, warp = t >> 5;
    int i;
#pragma unroll
    for (i = 0; i < D / 2; i += 8) { /* 16 columns: four 8 x 8 matrices */
        const int r = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
        const int col = 2 * i + 8 * (lane >> 4);
        const uint32_t addr = o_at + (col >> 6) * o_chunk + r * 128 +
                              ((((col & 63) >> 3) ^ (r & 7)) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                     ::"r"(addr), "r"(FA_I_PACK_O(o[i] * inv[0], o[i + 1] * inv[0])),
                     "r"(FA_I_PACK_O(o[i + 2] * inv[1], o[i + 3] * inv[1])),
                     "r"(FA_I_PACK_O(o[i + 4] * inv[0], o[i + 5] * inv[0])),
                     "r"(FA_I_PACK_O(o[i + 6] * inv[1], o[i + 7] * inv[1]))
                     : "memory");
    }
#undef FA_I_PACK_O
    fa_i_fence_proxy_async();
    fa_i_named_sync(1 + NC + cw, 128);
    if (t == 0) {
        int c;
        for (c = 0; c < CHUNKS; ++c)
            fa_i_tma_store(&maps->o, o_at + c * o_chunk, 64 * c, m0 + 64 * cw, h, b, once);
        fa_i_tma_store_commit();
        if (!O_APART) { /* free the ring stage or Q's rows once read */
            fa_i_tma_store_wait_read();
            if (in_ring)
                fa_i_mbar_arrive(L->o_read + 8 * (cw * STAGES + last_stage));
            else
                fa_i_mbar_arrive_n(L->q_empty + 8 * q_stage, 4);
        }
    }
}

/* A consumer warpgroup (cw of NC): its 64 rows of each tile of the CTA. */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_consumer)(
    const fa_params *p, const fa_i_tma_maps *maps, const fa_i_fa3_smem *L, int cw)
{
    enum {
        D = FA_I_D, BM = FA_I_FA3(ROWS), BN = FA_I_FA3_BN, STAGES = FA_I_FA3(STAGES),
        NC = FA_I_FA3_NC, Q_BUFS = FA_I_FA3_Q_BUFS, RB = FA_I_FA3_RB,
        O_APART = FA_I_FA3_O_APART, Q_BYTES = BM * D * FA_I_FA3_ES, TILE = BN * D * FA_I_FA3_ES,
        PINGPONG = FA_I_FA3_PP, SOFTMAX = FA_I_FA3_FORM,
        /* Without O's own buffer, a tile that saw keys stages each
           warpgroup's O in its last key tile's ring stage (warpgroup 0 in
           the K stage, 1 in the V stage) so that Q is free after the last
           S, not after the O store. */
        O_IN_RING = !O_APART
    };
    static_assert(!O_IN_RING || (NC == 2 && 64 * D * 2 <= TILE),
                  "flashattn: O staged in the ring needs 2 warpgroups and a stage that holds 64 rows");
    const int tid = threadIdx.x, t = tid % 128, lane = t & 31, warp = t >> 5;
    const float log2_scale = p->softcap > 0.0f ? 1.0f : p->scale * FA_I_LOG2E_F;
    float o[D / 2], s[BN / 2], m_run[2], l_run[2], alpha[2];
    uint32_t pr[FA_I_FA3_PR];
    int64_t k;
    int it = 0, mb, h, b, have, i;
#pragma unroll
    for (i = 0; i < BN / 2; ++i) s[i] = 0.0f;
    if (PINGPONG && cw == NC - 1) fa_i_named_arrive(1, 256); /* warpgroup 0 goes first */
    have = fa_i_fa3_tile(p, maps, 0, BM, &mb, &h, &b);
    for (k = 0; have; ++k) {
        fa_params view; /* the tile's problem (varlen: its sequence's) */
        int mapb;
        const fa_i_tma_maps *tile_maps = fa_i_fa3_rows(p, maps, b, &view, &mapb);
        float *lse_rows;
        int store_m0, store_h;
        const int m0 = mb * BM, last = min(m0 + BM, view.seqlen_q);
        const fa_i_ring q = fa_i_ring_at64(k, Q_BUFS);
        const uint32_t sq_wg = L->sq + q.stage * Q_BYTES + cw * 64 * RB;
        const uint32_t so_wg = O_APART ? L->so + cw * 64 * 128 : sq_wg;
        const int row = m0 + 64 * cw + 16 * warp + (lane >> 2); /* and row + 8 */
        const int row_in_tile = row - m0;
        int lo[2], hi[2], first_lo, last_hi, all_lo, all_hi, n, n_first, n_end, in_ring;
        float inv[2]; /* 1 / (row sum) */
        uint32_t last_stage; /* ring stage of the last key tile */
        fa_i_rows_key_span(&view, m0, last, &first_lo, &last_hi);
        fa_i_rows_common_keys(&view, m0, last, &all_lo, &all_hi);
        n_first = first_lo / BN;
        n_end = (last_hi + BN - 1) / BN;
        in_ring = O_IN_RING && n_first < n_end;
#if FA_I_FP8
        /* the descales: Q's of this warpgroup's rows (in one FA_FP8_BLOCK),
           K's and V's of key tile n at dk, dv[FA_I_KEY_BLOCK(n)] */
        const int ds_step = p->fp8_scaling == FA_FP8_SCALE_BLOCK;
        const int hk_now = h / (p->heads_q / p->heads_kv);
        /* (a warpgroup whose rows all lie past the end reads the last block's) */
        const float dq = p->q_descale[fa_i_descale_index(p->fp8_scaling, b, h, p->heads_q,
                                                         p->seqlen_q,
                                                         min(m0 + 64 * cw, p->seqlen_q - 1))];
        const float *dk = p->k_descale + fa_i_descale_index(p->fp8_scaling, b, hk_now,
                                                            p->heads_kv, p->seqlen_k, 0);
        const float *dv = p->v_descale + fa_i_descale_index(p->fp8_scaling, b, hk_now,
                                                            p->heads_kv, p->seqlen_k, 0);
#define FA_I_KEY_BLOCK(n) ((n) * BN / FA_FP8_BLOCK * ds_step)
        /* O's units (fa_i_fp8_v_units): first the largest V descale among
           the tile's key blocks, so that with power-of-two descales every
           key tile's factor of P is at most 1 and O never changes units */
        float dv_ref = 0.0f;
        if (n_first < n_end)
            for (i = FA_I_KEY_BLOCK(n_first) + lane; i <= FA_I_KEY_BLOCK(n_end - 1); i += 32)
                dv_ref = fmaxf(dv_ref, dv[i]);
#pragma unroll
        for (i = 16; i > 0; i >>= 1) dv_ref = fmaxf(dv_ref, __shfl_xor_sync(0xffffffffu, dv_ref, i));
#define FA_I_S_MUL(n) (dq * dk[FA_I_KEY_BLOCK(n)])
#define FA_I_LOG2_SCALE(n) (p->softcap > 0.0f ? 1.0f : log2_scale * FA_I_S_MUL(n))
#define FA_I_V_UNITS(n) (o_mul = fa_i_fp8_v_units(dv[FA_I_KEY_BLOCK(n)], &dv_ref, &p_mul))
#else
#define FA_I_S_MUL(n) 1.0f
#define FA_I_LOG2_SCALE(n) log2_scale
#define FA_I_V_UNITS(n) ((void)0)
#endif
        float p_mul = 1.0f, o_mul = 1.0f; /* key tile n's factors of P and O */
/* Key tile n's ring entry, and the bounds its mask needs. */
#define FA_I_RING(n) fa_i_ring_at(it + (n) - n_first, STAGES)
#define FA_I_MASKED(n) \
    (((n) * BN < all_lo ? FA_I_MASK_LO : 0) | ((n) * BN + BN > all_hi ? FA_I_MASK_HI : 0))
        last_stage = FA_I_RING(n_end - 1).stage; /* used only where the tile saw keys */
#pragma unroll
        for (i = 0; i < 2; ++i) {
            m_run[i] = -INFINITY;
            l_run[i] = 0.0f;
            fa_i_key_range(&view, row + 8 * i, &lo[i], &hi[i]);
        }
#pragma unroll
        for (i = 0; i < D / 2; ++i) o[i] = 0.0f;
        fa_i_mbar_wait(L->q_full + 8 * q.stage, q.phase);

        /* The key tiles: S, softmax and PV. */
#if FA_FA3_OVERLAP
        if (n_first < n_end) {
#if !FA_I_FP8
            float e[SOFTMAX == 1 ? BN / 2 : 1]; /* form 1's P, beside PV(n - 1)'s operand */
#endif
            FA_I_V_UNITS(n_first);
            FA_I_KNAME_V(fa_i_fa3_first_step)(p, L, sq_wg, FA_I_RING(n_first), n_first,
                                              FA_I_MASKED(n_first), lo, hi,
                                              FA_I_LOG2_SCALE(n_first), FA_I_S_MUL(n_first), p_mul,
                                              o_mul, cw, FA_I_FA3_ROWS_ARGS);
            for (n = n_first + 1; n < n_end; ++n) {
                FA_I_V_UNITS(n);
#if !FA_I_FP8
                if (SOFTMAX == 2)
                    FA_I_KNAME_V(fa_i_fa3_step_packed)(p, L, sq_wg, FA_I_RING(n), FA_I_RING(n - 1),
                                                       n, FA_I_MASKED(n), lo, hi, log2_scale, cw,
                                                       FA_I_FA3_ROWS_ARGS);
                else if (SOFTMAX == 1)
                    FA_I_KNAME_V(fa_i_fa3_step_spec)(p, L, sq_wg, FA_I_RING(n), FA_I_RING(n - 1),
                                                     n, FA_I_MASKED(n), lo, hi, log2_scale, cw,
                                                     FA_I_FA3_ROWS_ARGS, e);
                else
#endif
                    FA_I_KNAME_V(fa_i_fa3_step_rowmax)(p, L, sq_wg, FA_I_RING(n),
                                                       FA_I_RING(n - 1), n, FA_I_MASKED(n), lo,
                                                       hi, FA_I_LOG2_SCALE(n), FA_I_S_MUL(n),
                                                       p_mul, o_mul, cw, FA_I_FA3_ROWS_ARGS);
            }
            /* issued here, waited for below the next tile's coordinates */
            fa_i_mbar_wait(L->v_full + 8 * last_stage, FA_I_RING(n_end - 1).phase);
            fa_i_fa3_landed(L);
            fa_i_fa3_turn_begin(PINGPONG, cw);
            FA_I_KNAME_V(fa_i_fa3_pv)(p, o, pr, L->sv + last_stage * TILE);
            fa_i_fa3_turn_end(PINGPONG, cw, NC);
        }
#else
        for (n = n_first; n < n_end; ++n) { /* one GEMM after another */
            const fa_i_ring r = FA_I_RING(n);
            FA_I_KNAME_V(fa_i_fa3_first_step)(p, L, sq_wg, r, n, FA_I_MASKED(n), lo, hi,
                                              log2_scale, 1.0f, 1.0f, 1.0f, cw, FA_I_FA3_ROWS_ARGS);
            fa_i_mbar_wait(L->v_full + 8 * r.stage, r.phase);
            fa_i_fa3_landed(L);
            FA_I_KNAME_V(fa_i_fa3_pv)(p, o, pr, L->sv + r.stage * TILE);
            FA_I_WGMMA_WAIT(0);
            fa_i_fence_f32(o, D / 2);
            fa_i_fence_u32(pr, FA_I_FA3_PR);
            if (lane == 0) fa_i_mbar_arrive(L->v_empty + 8 * r.stage);
        }
#endif

        /* The tile's end, while the last PV runs: Q is free for a later
           tile unless O goes over it (no wgmma reads Q now); the row sums,
           LSE and the next tile's coordinates. */
        if ((O_APART || in_ring) && lane == 0) fa_i_mbar_arrive(L->q_empty + 8 * q.stage);
        /* the tile's coordinates and problem again, derived anew rather
           than held in registers over the key loop */
        fa_i_fa3_tile(p, maps, k, BM, &mb, &h, &b);
        tile_maps = fa_i_fa3_rows(p, maps, b, &view, &mapb);
        lse_rows = p->lse ? fa_i_fa3_lse_rows(p, maps, b, h) + mb * BM + row_in_tile : NULL;
        store_h = h, store_m0 = mb * BM;
#pragma unroll
        for (i = 0; i < 2; ++i) {
            float l = l_run[i];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[i] = l == 0.0f ? 0.0f : fa_i_dev_rcp(l); /* a NaN l stays NaN */
#if FA_I_FP8 /* O in units of dv_ref; P was 2^8 too large */
            if (n_first < n_end) inv[i] *= dv_ref;
#endif
            if ((lane & 3) == 0 && lse_rows && store_m0 + row_in_tile + 8 * i < view.seqlen_q)
                lse_rows[8 * i] =
                    l == 0.0f ? -INFINITY
                              : (m_run[i] + fa_i_dev_log2(l) - FA_I_FA3_P_SHIFT) * FA_I_LN2_F;
        }
        have = fa_i_fa3_tile(p, maps, k + 1, BM, &mb, &h, &b);
#if FA_FA3_OVERLAP
        /* Unconditional (a no-op without a PV): behind the branch ptxas
           can't see O complete and serializes the wgmmas (C7514). */
        FA_I_WGMMA_WAIT(0);
        fa_i_fence_f32(o, D / 2);
        if (n_first < n_end && lane == 0) fa_i_mbar_arrive(L->v_empty + 8 * last_stage);
#endif
        /* O staged in the ring: its stage must be done with for both
           warpgroups (their last S for K, their last PV for V) */
        if (in_ring)
            fa_i_mbar_wait((cw == 0 ? L->k_empty : FA_I_FA3_V_IN_EMPTY(L)) + 8 * last_stage,
                           FA_I_RING(n_end - 1).phase);
#undef FA_I_RING
#undef FA_I_MASKED
#undef FA_I_S_MUL
#undef FA_I_LOG2_SCALE
#undef FA_I_V_UNITS
#undef FA_I_KEY_BLOCK
        it += n_end > n_first ? n_end - n_first : 0;
        if (O_APART) {
            /* O's buffer is free once this thread's previous store has read it. */
            if (t == 0) fa_i_tma_store_wait_read();
            fa_i_named_sync(1 + NC + cw, 128);
        }
        if (maps->seqs && t == 0) fa_i_tma_map_acquire(&tile_maps->o);
        FA_I_KNAME_V(fa_i_fa3_store_o)(
            tile_maps, L,
            in_ring ? (cw == 0 ? L->sk : FA_I_FA3_V_IN(L)) + last_stage * TILE : so_wg,
            in_ring ? 64 * 128 : BM * 128, in_ring, q.stage, last_stage, store_m0, store_h, mapb,
            cw, o, inv, p->o_dtype == FA_DTYPE_BF16);
    }
    if (PINGPONG && cw == 0) fa_i_named_sync(1, 256); /* matches the last one's last arrival */
    if (t == 0) fa_i_tma_store_wait_read(); /* shared memory must outlive the stores */
}
#undef FA_I_WGMMA_QK
#undef FA_I_WGMMA_PV
#undef FA_I_FA3_ROWS_STATE
#undef FA_I_FA3_ROWS_ARGS
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* The kernel's body: shared memory and barriers, then producer and
   consumers. gather (a constant of each kernel below): the producer
   warpgroup gathers paged key tiles (maps.gather). */
static __device__ __forceinline__ void FA_I_KNAME_V(fa_i_fa3_body)(const fa_params *p,
                                                                  const fa_i_tma_maps *maps,
                                                                  const int gather)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    enum {
        D = FA_I_D, BM = FA_I_FA3(ROWS), BN = FA_I_FA3_BN, STAGES = FA_I_FA3(STAGES),
        TILE = BN * D * FA_I_FA3_ES, NC = BM / 64, Q_BUFS = FA_I_FA3_Q_BUFS,
        Q_BYTES = BM * D * FA_I_FA3_ES, O_IN_RING = !FA_I_FA3_O_APART
    };
    /* Barriers: q_full and q_empty per Q buffer, then k_full, v_full,
       k_empty, v_empty per stage, then (O_IN_RING) o_read per warpgroup
       and stage: the O staged there has been read by its TMA store; with
       FP8, vr_full and vr_empty per stage. Only this sm_90a body has static
       shared memory: the host reads that to tell it from the stub other
       targets compile. */
    __shared__ __align__(8) uint64_t
        bars[2 * Q_BUFS + 4 * STAGES + 2 * STAGES * O_IN_RING + 2 * STAGES * FA_I_FP8];
    extern __shared__ uint4 fa_i_smem[];
    fa_i_fa3_smem L;
    const int tid = threadIdx.x;
    int i;
    L.sq = (fa_i_smem_addr(fa_i_smem) + 1023) & ~1023u; /* swizzle atoms: 1 KB */
    L.sk = L.sq + Q_BUFS * Q_BYTES;
    L.sv = L.sk + STAGES * TILE;
    L.svr = L.sv + STAGES * TILE * FA_I_FP8; /* FP8 only */
    L.so = L.svr + STAGES * TILE; /* if O has its own buffer */
    L.q_full = fa_i_smem_addr(bars);
    L.q_empty = L.q_full + 8 * Q_BUFS;
    L.k_full = L.q_empty + 8 * Q_BUFS;
    L.v_full = L.k_full + 8 * STAGES;
    L.k_empty = L.v_full + 8 * STAGES;
    L.v_empty = L.k_empty + 8 * STAGES;
    L.o_read = L.v_empty + 8 * STAGES;
    L.vr_full = L.o_read + 8 * 2 * STAGES * O_IN_RING;
    L.vr_empty = L.vr_full + 8 * STAGES;
    L.gather = gather;
    if (tid == 0) {
        for (i = 0; i < Q_BUFS; ++i) {
            fa_i_mbar_init(L.q_full + 8 * i, 1);
            fa_i_mbar_init(L.q_empty + 8 * i, 4 * NC); /* every consumer warp */
        }
        for (i = 0; i < STAGES; ++i) { /* gather mode: the producer warpgroup's threads */
            fa_i_mbar_init(L.k_full + 8 * i, gather ? 128 : 1);
            fa_i_mbar_init(L.v_full + 8 * i, FA_I_FP8 ? 3 : gather ? 128 : 1); /* FP8: the transposing warps */
            fa_i_mbar_init(L.k_empty + 8 * i, 4 * NC);
            fa_i_mbar_init(L.v_empty + 8 * i, 4 * NC);
#if FA_I_FP8
            fa_i_mbar_init(L.vr_full + 8 * i, 1);
            fa_i_mbar_init(L.vr_empty + 8 * i, 3);
#endif
        }
        for (i = 0; i < 2 * STAGES * O_IN_RING; ++i) fa_i_mbar_init(L.o_read + 8 * i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid < 128) { /* producer warpgroup: one thread issues every copy (gather mode: all) */
        if (gather)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FA_I_SM90_GATHER_PRODUCER_REGS));
        else
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FA_I_SM90_PRODUCER_REGS_OF(NC, FA_I_FP8)));
        /* gather: the lead warp (Q's loads) as a warp-uniform value; a test
           of tid in the producer costs it its uniform registers, and it spills */
        const int lead = gather ? __shfl_sync(0xffffffffu, tid / 32, 0) == 0 : 1;
        if (gather || tid == 0) FA_I_KNAME_V(fa_i_fa3_producer)(p, maps, &L, lead, gather);
#if FA_I_FP8
        else if (tid >= 32)
            FA_I_KNAME_V(fa_i_fa3_transpose_v)(p, maps, &L,
                                               __shfl_sync(0xffffffffu, tid / 32 - 1, 0));
#endif
    } else {
        /* the warpgroup index from lane 0: ptxas then treats it (and what
           derives from it) as warp-uniform; tid / 128 alone it does not */
        const int cw = __shfl_sync(0xffffffffu, tid / 128 - 1, 0);
        if (gather)
            asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FA_I_SM90_GATHER_CONSUMER_REGS));
        else
            asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FA_I_SM90_CONSUMER_REGS_OF(NC, FA_I_FP8)));
        FA_I_KNAME_V(fa_i_fa3_consumer)(p, maps, &L, cw);
    }
#else
    (void)p;
    (void)maps;
    (void)gather;
#endif
}

static __global__ void __launch_bounds__(128 * (FA_I_FA3(ROWS) / 64 + 1), 1)
    FA_I_KNAME_V(fa_i_fwd_fa3)(const fa_params p, const __grid_constant__ fa_i_tma_maps maps)
{
    FA_I_KNAME_V(fa_i_fa3_body)(&p, &maps, 0);
}
#if !FA_I_FP8 && FA_I_V == FA_I_FA3_GATHER_V
/* Paged caches whose pages the TMA's boxes do not fit (maps.gather): a
   kernel of its own, as a producer holding both ways of loading spills. */
static __global__ void __launch_bounds__(128 * (FA_I_FA3(ROWS) / 64 + 1), 1)
    FA_I_CAT(FA_I_KNAME(fa_i_fwd_fa3), _gather)(const fa_params p,
                                                 const __grid_constant__ fa_i_tma_maps maps)
{
    FA_I_KNAME_V(fa_i_fa3_body)(&p, &maps, 1);
}
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#undef FA_I_FA3_BN
#undef FA_I_FA3_NC
#undef FA_I_FA3_PP
#undef FA_I_FA3_FORM
#endif
#undef FA_I_FA3
#undef FA_I_FA3_ES
#undef FA_I_FA3_RB
#undef FA_I_FA3_CE
#undef FA_I_FA3_PR
#undef FA_I_FA3_P_SHIFT
#undef FA_I_FA3_V_IN
#undef FA_I_FA3_V_IN_EMPTY
#endif /* >> fa3 forward */

/* >> decode ===================================================================
   The forward for few query rows per sequence (seqlen_q <= FA_I_DECODE_MAX_Q:
   decoding, speculative decoding, chunk tails). Its work is reading K and V
   once, at the memory's speed:
   - GQA packing: the seqlen_q x group query rows that share a kv head are
     one tile's rows (packed row r: token r / group, query head hk group +
     r % group), so each K/V byte is read once per kv head, not per query head;
   - split-KV: the keys a tile's rows see are cut into `splits` chunks, one
     CTA each (fa_i_decode_splits picks the count); each writes its rows' O,
     normalized over its keys, in fp32 and their LSE to the workspace, and
     a combine kernel merges them (>> combine).
   One CTA of 4 warps per (row block, split, kv head, batch), FA_DECODE_TILE_<d>:
   16 RT packed rows (RT m16 row tiles, the fewest that hold them, at most
   4 / DSPLIT), K/V tiles of KEYS keys through a STAGES-deep cp.async ring.
   Warp w owns row tile w % RT, columns part (w / RT) % DSPLIT of O, and of
   each tile's KEYS / 16 slices of 16 keys every KS-th from w / (RT DSPLIT)
   (KS = 4 / (RT DSPLIT)), or where that leaves a warp two or more slices a
   tile, every KS-th pair of slices (STEP 2, fa_i_decode_step). Per step,
   mma.sync:
     S = Q K^T (16 x 16 STEP, all of d), softcap, mask, online softmax,
     O[:, its columns] += P V
   At the end the KS warps of a (row tile, column part) merge their (m, l, O)
   through shared memory. Each kernel comes in four kinds by what its tiles
   read (fa_i_decode_kind: dense, _pages, _slices, _general). On Hopper,
   more than 32 packed rows on the tiles of d = 64, 128 and 256 run the
   wgmma kernels (_wg, _wg_pages, ...): the same CTA, ring
   and schedule, its 4 warps one warpgroup over 64 rows, each key tile's
   S = Q K^T and O += P V one wgmma chain each (fa_i_decode_wg_step): at 16
   query tokens and group 4, mma.sync's per-warp chains were latency-bound
   below the H200's memory rate (DESIGN.md, decode). */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
#define FA_I_DECODE_MAX_Q 16
#define FA_I_DECODE_WARPS 4
/* The head dims with the wgmma kernel (Hopper builds): a warpgroup's O of d
   columns beside S in its registers (d = 256: 128 a thread, at one CTA an
   SM, which its shared memory sets anyway). */
#define FA_I_DECODE_WG (FA_I_SM90 && (FA_I_D == 64 || FA_I_D == 128 || FA_I_D == 256))
/* Where it overlaps a tile's softmax with the previous tile's P V
   (fa_i_decode_wg_step): not d = 256, whose 128 registers of O a thread
   leave no room for P held across the step (it spilled). */
#define FA_I_DECODE_WG_OVERLAP (FA_I_D <= 128)
/* The head dims with the kernels over whole pages (_pages): not d = 192,
   whose dense kernel sits at 255 registers (_pages spilled; its pages take
   _general); over whole slices (_slices): d = 64 and 128, where they ran
   faster than _general (at d = 256 they spilled; DESIGN.md, paged
   caches). */
#define FA_I_DECODE_PAGES_BUILT (FA_I_D != 192)
#define FA_I_DECODE_SLICES_BUILT (FA_I_D == 64 || FA_I_D == 128)
#endif

#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_DECODE
#define FA_I_DEC(column) FA_I_COL(DECODE, column, FA_I_CAT(FA_DECODE_TILE_, FA_I_D))
/* The scores of nb 8-key column blocks (keys c0 ...) of a warp's 16 rows to
   P, in place: softcap, mask, the online softmax against (m_run, l_run),
   O's no column blocks rescaled where a row's max rose. s and o in the
   accumulator layout of mma.sync and wgmma alike (element e of block i: row
   lane / 4 + 8 (e / 2), column 8 i + 2 (lane % 4) + e % 2). */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_decode_softmax)(
    const fa_params *p, float (*s)[4], const int nb, const int c0, float *alpha, float *m_run,
    float *l_run, const int *lo, const int *hi, const int all_lo, const int all_hi,
    const float log2_scale)
{
    const int lane = threadIdx.x & 31;
    int i, e;
    if (p->softcap > 0.0f)
#pragma unroll
        for (i = 0; i < nb; ++i)
#pragma unroll
            for (e = 0; e < 4; ++e) s[i][e] = fa_i_score(p, s[i][e]);
    if (FA_I_TILE_MASKED(all_hi, all_lo, c0, c0 + 8 * nb))
#pragma unroll
        for (i = 0; i < nb; ++i)
#pragma unroll
            for (e = 0; e < 4; ++e) {
                const int col = c0 + 8 * i + 2 * (lane & 3) + (e & 1);
                if (col < lo[e >> 1] || col >= hi[e >> 1]) s[i][e] = -INFINITY;
            }
#pragma unroll
    for (e = 0; e < 2; ++e) { /* online softmax of row half e */
        float mx = -INFINITY, ref, sum = 0.0f;
#pragma unroll
        for (i = 0; i < nb; ++i) mx = fmaxf(mx, fmaxf(s[i][2 * e], s[i][2 * e + 1]));
        ref = fa_i_row_max_step(mx, log2_scale, &m_run[e], &alpha[e]);
#pragma unroll
        for (i = 0; i < nb; ++i) {
            s[i][2 * e] = fa_i_dev_exp2(fmaf(s[i][2 * e], log2_scale, -ref));
            s[i][2 * e + 1] = fa_i_dev_exp2(fmaf(s[i][2 * e + 1], log2_scale, -ref));
            sum += s[i][2 * e] + s[i][2 * e + 1];
        }
        l_run[e] = l_run[e] * alpha[e] + sum;
    }
}

/* O's no accumulator blocks (rows of halves 0 and 1) times the softmax's
   alpha, where some row of the warp moved its max. */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_decode_rescale)(float (*o)[4],
                                                                      const int no,
                                                                      const float *alpha)
{
    int i;
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
        for (i = 0; i < no; ++i) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
}

/* One warp's step over w slices of 16 keys (w = 1 or 2, a constant at each
   call), keys c_tile + 16 w j ...: S = Q K^T, then fa_i_decode_softmax,
   then O[:, its columns] += P V. Two slices a step give the warp two
   independent S chains and one softmax pass over 32 keys: where a warp owns
   a whole row tile (many packed rows) it runs every slice of each tile in
   one dependent chain, with one other warp on its scheduler to hide it. */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_decode_step)(
    const fa_params *p, const int w, const uint16_t *skt, const uint16_t *svt, const int j,
    const int c_tile, const uint32_t (*qa)[4], float (*o)[4], float *m_run, float *l_run,
    const int *lo, const int *hi, const int all_lo, const int all_hi, const float log2_scale,
    const int col0)
{
    enum { D = FA_I_D, DW = D / FA_I_DEC(DSPLIT), BF16 = FA_I_IS_BF16 };
    const int lane = threadIdx.x & 31, c0 = c_tile + 16 * w * j;
    float s[4][4], alpha[2];
    uint32_t pa[2][4];
    int i, u;
    fa_i_zero_acc(s, 2 * w);
#pragma unroll
    for (i = 0; i < D / 16; ++i) /* S = Q K^T over the step's keys */
#pragma unroll
        for (u = 0; u < w; ++u) {
            uint32_t kb[4];
            FA_I_LOAD_B_NK(kb, skt, FA_I_PITCH(D), 16 * (w * j + u), 16 * i);
            fa_i_mma(s[2 * u], qa[i], kb[0], kb[1], BF16);
            fa_i_mma(s[2 * u + 1], qa[i], kb[2], kb[3], BF16);
        }
    FA_I_KNAME(fa_i_decode_softmax)(p, s, 2 * w, c0, alpha, m_run, l_run, lo, hi, all_lo, all_hi,
                                    log2_scale);
    FA_I_KNAME(fa_i_decode_rescale)(o, DW / 8, alpha);
#pragma unroll
    for (u = 0; u < w; ++u) FA_I_ACC_AS_A(pa[u], s, u);
#pragma unroll
    for (i = 0; i < DW / 16; ++i) /* O += P V on this warp's columns */
#pragma unroll
        for (u = 0; u < w; ++u) {
            uint32_t vb[4];
            FA_I_LOAD_B_KN(vb, svt, FA_I_PITCH(D), 16 * (w * j + u), col0 + 16 * i);
            fa_i_mma(o[2 * i], pa[u], vb[0], vb[1], BF16);
            fa_i_mma(o[2 * i + 1], pa[u], vb[2], vb[3], BF16);
        }
}

#if FA_I_DECODE_WG && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* O += P V for the CTA's 64 rows by RS wgmma (P from pa, V the tile at
   svt), issued and committed. */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_decode_wg_pv)(float (*o)[4],
                                                                    uint32_t (*pa)[4],
                                                                    const uint32_t svt)
{
    enum { BN = FA_I_DEC(KEYS) };
    fa_i_wgmma_fence();
    FA_I_SM90_GEMM_RS(FA_I_CAT(FA_I_CAT(fa_i_wgmma_rs_, FA_I_DT), FA_I_CAT(_n, FA_I_D)), &o[0][0],
                      &pa[0][0], svt, BN, BN);
    fa_i_wgmma_commit();
}

/* The wgmma kernel's step over a whole key tile (keys c_tile ..., BN of
   them), the CTA's 64 rows: S = Q K^T by SS wgmma from the [d / 64][rows]
   [64] tiles at shared addresses sq and skt, then fa_i_decode_softmax on
   each warp's 16 rows and P packed into pa. With FA_I_DECODE_WG_OVERLAP the
   previous tile's P V (V at svt_prev; none where prev is 0) is issued right
   after S, so that the tensor cores take the two back to back and the
   softmax runs while P V does; this tile's P V is left to the next step
   (fa_i_decode_wg_pv and a wait after the last tile). Else this tile's P V
   (V at svt) runs and is waited for here. */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_decode_wg_step)(
    const fa_params *p, const uint32_t sq, const uint32_t skt, const uint32_t svt,
    const uint32_t svt_prev, const int prev, const int c_tile, float (*o)[4], uint32_t (*pa)[4],
    float *m_run, float *l_run, const int *lo, const int *hi, const int all_lo, const int all_hi,
    const float log2_scale)
{
    enum { D = FA_I_D, BN = FA_I_DEC(KEYS) };
    float s[BN / 8][4], alpha[2];
    int i;
    fa_i_wgmma_fence();
    FA_I_SM90_GEMM_NT(FA_I_CAT(FA_I_CAT(fa_i_wgmma_ss_, FA_I_DT), FA_I_CAT(_n, FA_I_DEC(KEYS))),
                      &s[0][0], sq, 64, skt, BN);
    fa_i_wgmma_commit();
    if (FA_I_DECODE_WG_OVERLAP && prev) {
        FA_I_KNAME(fa_i_decode_wg_pv)(o, pa, svt_prev);
        FA_I_WGMMA_WAIT(1); /* S (committed first) */
    } else {
        FA_I_WGMMA_WAIT(0);
    }
    fa_i_fence_f32(&s[0][0], BN / 2);
    FA_I_KNAME(fa_i_decode_softmax)(p, s, BN / 8, c_tile, alpha, m_run, l_run, lo, hi, all_lo,
                                    all_hi, log2_scale);
    if (FA_I_DECODE_WG_OVERLAP) {
        FA_I_WGMMA_WAIT(0);
        fa_i_fence_f32(&o[0][0], D / 2);
        fa_i_fence_u32(&pa[0][0], BN / 4);
    }
    FA_I_KNAME(fa_i_decode_rescale)(o, D / 8, alpha);
#pragma unroll
    for (i = 0; i < BN / 16; ++i) FA_I_ACC_AS_A(pa[i], s, i);
    if (!FA_I_DECODE_WG_OVERLAP) {
        FA_I_KNAME(fa_i_decode_wg_pv)(o, pa, svt);
        FA_I_WGMMA_WAIT(0);
        fa_i_fence_f32(&o[0][0], D / 2);
    }
}
#endif

/* The kernel's body. `kind` (fa_i_decode_kind, a constant of each kernel
   below) says where the key tiles' rows are. `wg` (Hopper,
   4 row tiles): the CTA's 64 rows as one warpgroup's wgmma tile
   (fa_i_decode_wg_step) over all of d (no DSPLIT), Q and the ring as
   [d / 64][rows][64] tiles with the 128-byte swizzle, 1 KB aligned. */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_decode_body)(const fa_params *params,
                                                                   const fa_i_decode_args a,
                                                                   const int kind, const int wg)
{
    const int general = kind == FA_I_DECODE_GENERAL, whole = kind == FA_I_DECODE_PAGES,
              sliced = kind == FA_I_DECODE_SLICES;
    enum {
        D = FA_I_D, BN = FA_I_DEC(KEYS), STAGES = FA_I_DEC(STAGES),
        NT = 32 * FA_I_DECODE_WARPS, LD = FA_I_PITCH(D), SLICES = BN / 16, BF16 = FA_I_IS_BF16
    };
    const int ds = wg ? 1 : FA_I_DEC(DSPLIT), dw = D / ds; /* dw: O columns per warp */
    const int max_rows = 16 * FA_I_DECODE_WARPS / ds, slot = 16 * dw + 32; /* a warp's (O, m, l) */
    extern __shared__ uint4 fa_i_smem[];
    uint16_t *sq = (uint16_t *)fa_i_smem, *sk, *sv;
#if FA_I_DECODE_WG && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (wg) sq += (0u - fa_i_smem_addr(fa_i_smem)) % 1024 / 2; /* the swizzle's 1 KB atoms */
#endif
    sk = sq + max_rows * LD;
    sv = sk + STAGES * BN * LD;
    const int kld = wg ? 64 : LD; /* the ring's pitch (wg: 64-column slabs) */
    fa_params p = *params;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rt_count = wg ? 4 : a.row_tiles, rows = 16 * rt_count; /* wg: 4 (the plan) */
    const int ks_count = FA_I_DECODE_WARPS / (rt_count * ds);
    const int rt = warp % rt_count, dpart = warp / rt_count % ds, ks = warp / (rt_count * ds);
    const int col0 = dpart * dw; /* this warp's first O column */
    /* two slices a step where each warp still gets one; not in the general
       d = 256 kernel for sm_8x, whose registers do not hold both (it
       spilled) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    const int step_fits = !(general && D == 256);
#else
    const int step_fits = 1;
#endif
    const int wide = FA_I_DEC(STEP) == 2 && step_fits && SLICES % 2 == 0 && SLICES / 2 >= ks_count;
    const int group = p.heads_q / p.heads_kv, packed = group * p.seqlen_q;
    /* blockIdx.x: row block fastest (blocks of one kv head share its K/V in L2), then split */
    unsigned cta = blockIdx.x;
    const int rb = (int)(cta % a.row_blocks);
    const int split = (int)((cta /= a.row_blocks) % a.splits);
    const int hk = (int)((cta /= a.splits) % p.heads_kv), b = (int)(cta / p.heads_kv);
    const int r0 = rb * rows, r_end = min(r0 + rows, packed);
    const int t_first = r0 / group, t_last = (r_end - 1) / group;
    /* a paged cache (fa_i_paged_run: block_table and cache_seqlens are the
       workspace's copies): this sequence's pages, its keys, queries at their end */
    const int32_t *pages =
        kind != FA_I_DECODE_DENSE && p.block_table ? p.block_table + (int64_t)b * p.max_pages : NULL;
    fa_i_tile_pages tp; /* table NULL: dense rows */
    int next_page = 0;  /* whole pages: the next tile's table entry */
    const int cols_k = general ? p.head_dim : D, cols_v = general ? p.head_dim_v : D;
    fa_i_launch_dependents(); /* the combine, early where launched so: it waits for the parts */
    const uint16_t *gk = (const uint16_t *)p.k + fa_i_dev_offset(&p.k_layout, pages ? 0 : b, hk, 0);
    const uint16_t *gv = (const uint16_t *)p.v + fa_i_dev_offset(&p.v_layout, pages ? 0 : b, hk, 0);
    const float log2_scale = p.softcap > 0.0f ? 1.0f : p.scale * FA_I_LOG2E_F;
    /* this thread's rows: packed rows my_row, my_row + 8 of its warp's row tile */
    const int my_row = r0 + 16 * rt + (lane >> 2);
    float o[D / 8][4], m_run[2], l_run[2]; /* dw / 8 blocks used */
    uint32_t qa[D / 16][4]; /* this warp's row tile of Q as A fragments */
#if FA_I_DECODE_WG && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t wg_pa[BN / 16][4]; /* wg: a key tile's P, its P V's A (fa_i_decode_wg_step) */
#endif
    int lo[2], hi[2], first_lo, last_hi, all_lo, all_hi, n_begin, n_end, n, i, j, e;
    int bad;

    if (pages) {
        /* tables_on_device: a length out of range reads no key (fa_i_pages_bad at the end) */
        p.seqlen_k = p.tables_on_device && fa_i_paged_length_bad(&p, b)
                         ? 0
                         : p.cache_seqlens[b] + p.seqlen_new;
        fa_i_bottom_right(&p);
        tp.sliced = sliced || p.page_size % 16 == 0; /* _slices: the plan's */
        tp.num_pages = p.num_pages;
    }
    tp.table = pages;
    const int walk = pages && !whole && tp.sliced; /* slices looked up a tile ahead */
    fa_i_rows_key_span(&p, t_first, t_last + 1, &first_lo, &last_hi);
    fa_i_rows_common_keys(&p, t_first, t_last + 1, &all_lo, &all_hi);
    { /* this split's share of the key tiles the rows see */
        const int first = first_lo / BN, tiles = last_hi > first_lo ? (last_hi + BN - 1) / BN - first : 0;
        const int per = (tiles + a.splits - 1) / a.splits;
        n_begin = first + min(split * per, tiles);
        n_end = first + min((split + 1) * per, tiles);
    }
#pragma unroll
    for (e = 0; e < 2; ++e) {
        const int r = my_row + 8 * e;
        m_run[e] = -INFINITY;
        l_run[e] = 0.0f;
        lo[e] = hi[e] = 0;
        if (r < r_end) fa_i_key_range(&p, r / group, &lo[e], &hi[e]);
    }
    fa_i_zero_acc(o, dw / 8);

    /* Q: the packed rows, 16-byte chunks (rows past the end as zeros) */
    for (i = tid; i < rows * (D / 8); i += NT) {
        const int r = i / (D / 8), c = 8 * (i % (D / 8)), pr = r0 + r;
        const int valid = pr < r_end && c < cols_k;
        const uint16_t *src = (const uint16_t *)p.q;
        if (valid)
            src += fa_i_dev_offset(&p.q_layout, b, hk * group + pr % group, pr / group) + c;
        fa_i_cp_async16(sq + (wg ? (c >> 6) * 64 * 64 + FA_I_SMEM_AT(r, c & 63, 64)
                                 : FA_I_SMEM_AT(r, c, LD)),
                        src, valid ? fa_i_chunk_bytes(cols_k - c) : 0);
    }
    /* Key tile t into ring stage st. A paged tile's pages are looked up a
       tile ahead of its copy (in the key loop, during the previous tile's
       products): a load just before the copy would hold it up (the copy's
       asm clobbers memory). Whole pages: the tile's rows are the dense
       copy's from one page, the table's entry for tile t + 1 loaded after.
       Whole slices: the copy's slice mode, no other (fa_i_async_rows_as). */
#define FA_I_DECODE_PAGE_OF(t) ((t) < n_end ? pages[(unsigned)((t) * BN) / (unsigned)p.page_size] : 0)
#define FA_I_DECODE_COPY_KV(st, t)                                                                 \
    do {                                                                                           \
        const int c0_ = (t) * BN;                                                                  \
        if (whole) {                                                                               \
            const int page_ = fa_i_page_or_0(&tp, next_page);                                      \
            const int row_ = (int)((unsigned)c0_ % (unsigned)p.page_size) - c0_;                   \
            next_page = FA_I_DECODE_PAGE_OF((t) + 1);                                              \
            fa_i_async_kv(sk + (st) * BN * LD, sv + (st) * BN * LD,                                \
                          gk + page_ * p.k_layout.batch + row_ * p.k_layout.seq,                   \
                          gv + page_ * p.v_layout.batch + row_ * p.v_layout.seq, &p, NULL, c0_, BN, \
                          D, cols_k, cols_v, kld, tid, NT);                                        \
        } else if (sliced) {                                                                       \
            fa_i_async_rows_as(1, sk + (st) * BN * LD, gk, p.k_layout.seq, &tp, p.page_size,       \
                               p.k_layout.batch, c0_, p.seqlen_k, BN, D, D, kld, tid, NT);         \
            fa_i_async_rows_as(1, sv + (st) * BN * LD, gv, p.v_layout.seq, &tp, p.page_size,       \
                               p.v_layout.batch, c0_, p.seqlen_k, BN, D, D, kld, tid, NT);         \
        } else                                                                                     \
            fa_i_async_kv(sk + (st) * BN * LD, sv + (st) * BN * LD, gk, gv, &p, &tp, c0_, BN, D,   \
                          cols_k, cols_v, kld, tid, NT);                                           \
    } while (0)
    /* the ring's first tiles, a commit group each */
    if (whole) next_page = FA_I_DECODE_PAGE_OF(n_begin);
    if (walk) fa_i_tile_pages_seek(&tp, p.page_size, n_begin * BN);
#pragma unroll
    for (i = 0; i < STAGES; ++i) {
        if (walk) fa_i_tile_pages_next(&tp, p.page_size, p.seqlen_k, BN);
        if (i == STAGES - 1) break;
        if (n_begin + i < n_end) FA_I_DECODE_COPY_KV(i, n_begin + i);
        fa_i_cp_async_commit();
    }
    FA_I_CP_ASYNC_WAIT(STAGES - 2); /* Q has landed (the first commit group) */
    __syncthreads();
    if (!wg)
#pragma unroll
        for (i = 0; i < D / 16; ++i) FA_I_LOAD_A(qa[i], sq, LD, 16 * rt, 16 * i);
    for (n = n_begin; n < n_end; ++n) {
        const int stage = (n - n_begin) % STAGES, c_tile = n * BN;
        const uint16_t *skt = sk + stage * BN * LD, *svt = sv + stage * BN * LD;
        /* tile n has landed and every warp is done with tile n - 1, whose
           stage tile n + STAGES - 1 then takes (wg: the copies made visible
           to the wgmma's async proxy first) */
        FA_I_CP_ASYNC_WAIT(STAGES - 2);
#if FA_I_DECODE_WG && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if (wg) fa_i_fence_proxy_async();
#endif
        __syncthreads();
#if FA_I_DECODE_WG && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        /* wg: tile n - 1's P V may run in this step, so the copy below
           (into its stage) comes after every warp's wait for it: each warp's
           share of a wgmma reads V on its own */
        if (wg) {
            FA_I_KNAME(fa_i_decode_wg_step)(
                &p, fa_i_smem_addr(sq), fa_i_smem_addr(skt), fa_i_smem_addr(svt),
                fa_i_smem_addr(sv + (n - n_begin + STAGES - 1) % STAGES * BN * LD), n > n_begin,
                c_tile, o, wg_pa, m_run, l_run, lo, hi, all_lo, all_hi, log2_scale);
            if (FA_I_DECODE_WG_OVERLAP) __syncthreads();
        }
#endif
        {
            const int next = n + STAGES - 1, ns = (next - n_begin) % STAGES;
            if (next < n_end) FA_I_DECODE_COPY_KV(ns, next);
            fa_i_cp_async_commit();
            if (walk && next + 1 < n_end)
                fa_i_tile_pages_next(&tp, p.page_size, p.seqlen_k, BN);
        }
        if (!wg && wide)
            for (j = ks; j < SLICES / 2; j += ks_count)
                FA_I_KNAME(fa_i_decode_step)(&p, 2, skt, svt, j, c_tile, qa, o, m_run, l_run, lo, hi,
                                             all_lo, all_hi, log2_scale, col0);
        else if (!wg)
            for (j = ks; j < SLICES; j += ks_count)
                FA_I_KNAME(fa_i_decode_step)(&p, 1, skt, svt, j, c_tile, qa, o, m_run, l_run, lo, hi,
                                             all_lo, all_hi, log2_scale, col0);
    }
#if FA_I_DECODE_WG && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (wg && FA_I_DECODE_WG_OVERLAP && n_end > n_begin) { /* the last tile's P V */
        FA_I_KNAME(fa_i_decode_wg_pv)(o, wg_pa,
                                      fa_i_smem_addr(sv + (n_end - 1 - n_begin) % STAGES * BN * LD));
        FA_I_WGMMA_WAIT(0);
        fa_i_fence_f32(&o[0][0], D / 2);
    }
#endif
    FA_I_CP_ASYNC_WAIT(0);
#undef FA_I_DECODE_COPY_KV
#undef FA_I_DECODE_PAGE_OF
    /* tables_on_device: the entries this CTA read, checked now (the lookups
       read a bad one as page 0; a check before the loop kept its flag in a
       register through it, which spilled at d = 192) */
    bad = pages && p.tables_on_device
              ? fa_i_pages_bad(params, b, pages, n_begin * BN, min(n_end * BN, p.seqlen_k), tid, NT)
              : 0;
#pragma unroll
    for (e = 0; e < 2; ++e) { /* the row sums over the quad's columns */
        l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 1);
        l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 2);
    }
    if (ks_count > 1) {
        /* The warps past the first of a (row tile, column part) leave their
           (O, m, l) in the ring's memory, one slot per warp; the first merges. */
        float *slots = (float *)sk, *mine = slots + warp * slot;
        const int g = lane >> 2, c2 = 2 * (lane & 3);
        __syncthreads(); /* every warp is done with the ring */
        if (ks > 0) {
#pragma unroll
            for (i = 0; i < dw / 8; ++i) {
                *(float2 *)(mine + g * dw + 8 * i + c2) = make_float2(o[i][0], o[i][1]);
                *(float2 *)(mine + (g + 8) * dw + 8 * i + c2) = make_float2(o[i][2], o[i][3]);
            }
            if ((lane & 3) == 0) {
                mine[16 * dw + g] = m_run[0], mine[16 * dw + g + 8] = m_run[1];
                mine[16 * dw + 16 + g] = l_run[0], mine[16 * dw + 24 + g] = l_run[1];
            }
        }
        __syncthreads();
        if (ks > 0) return;
        for (j = 1; j < ks_count; ++j) {
            const float *other = slots + (warp + j * rt_count * ds) * slot;
            float w_mine[2], w_other[2];
#pragma unroll
            for (e = 0; e < 2; ++e) {
                const float m2 = other[16 * dw + g + 8 * e], l2 = other[16 * dw + 16 + g + 8 * e];
                const float mx = fmaxf(m_run[e], m2), ref = mx == -INFINITY ? 0.0f : mx;
                w_mine[e] = fa_i_dev_exp2(m_run[e] - ref);
                w_other[e] = fa_i_dev_exp2(m2 - ref);
                l_run[e] = l_run[e] * w_mine[e] + l2 * w_other[e];
                m_run[e] = mx;
            }
#pragma unroll
            for (i = 0; i < dw / 8; ++i) {
                const float2 x = *(const float2 *)(other + g * dw + 8 * i + c2);
                const float2 y = *(const float2 *)(other + (g + 8) * dw + 8 * i + c2);
                o[i][0] = o[i][0] * w_mine[0] + x.x * w_other[0];
                o[i][1] = o[i][1] * w_mine[0] + x.y * w_other[0];
                o[i][2] = o[i][2] * w_mine[1] + y.x * w_other[1];
                o[i][3] = o[i][3] * w_mine[1] + y.y * w_other[1];
            }
        }
    }
    /* The rows out: O / l on this warp's columns (16-bit into o, or fp32 into
       this split's part), and the LSE from the first column part; a bad
       sequence's as NaN (the combine keeps a NaN part's NaN). */
    if (bad) l_run[0] = l_run[1] = NAN;
#pragma unroll
    for (e = 0; e < 2; ++e) {
        const int r = my_row + 8 * e, t = r / group, h = hk * group + r % group;
        const float l = l_run[e], inv = l == 0.0f ? 0.0f : 1.0f / l; /* NaN stays NaN */
        const float lse = l == 0.0f ? -INFINITY : (m_run[e] + log2f(l)) * FA_I_LN2_F;
        const int64_t lse_at = ((int64_t)b * p.heads_q + h) * p.seqlen_q + t;
        const int write_lse = (lane & 3) == 0 && dpart == 0;
        if (r >= r_end) continue;
        if (a.splits > 1) {
            float *part = a.o_part + (int64_t)split * a.part_floats +
                          (((int64_t)b * p.seqlen_q + t) * p.heads_q + h) * D + col0;
#pragma unroll
            for (i = 0; i < dw / 8; ++i)
                *(float2 *)(part + 8 * i + 2 * (lane & 3)) =
                    make_float2(o[i][2 * e] * inv, o[i][2 * e + 1] * inv);
            if (write_lse) a.lse_part[(int64_t)split * a.lse_floats + lse_at] = lse;
        } else {
            uint16_t *go = (uint16_t *)p.o + fa_i_dev_offset(&p.o_layout, b, h, t);
#pragma unroll
            for (i = 0; i < dw / 8; ++i)
                if (col0 + 8 * i < cols_v)
                    fa_i_store_pair(go, col0 + 8 * i + 2 * (lane & 3), cols_v,
                                    FA_I_PACK(o[i][2 * e] * inv, o[i][2 * e + 1] * inv));
            if (write_lse && p.lse) p.lse[lse_at] = lse;
        }
    }
}
#define FA_I_DECODE_KERNEL(suffix, body)                                                     \
    static __global__ void __launch_bounds__(32 * FA_I_DECODE_WARPS, 2)                      \
        FA_I_CAT(FA_I_KNAME(fa_i_fwd_decode), suffix)(const fa_params p, const fa_i_decode_args a) \
    {                                                                                        \
        body;                                                                                \
    }
FA_I_DECODE_KERNEL(, FA_I_KNAME(fa_i_decode_body)(&p, a, FA_I_DECODE_DENSE, 0))
#if FA_I_DECODE_PAGES_BUILT
FA_I_DECODE_KERNEL(_pages, FA_I_KNAME(fa_i_decode_body)(&p, a, FA_I_DECODE_PAGES, 0))
#endif
#if FA_I_DECODE_SLICES_BUILT
FA_I_DECODE_KERNEL(_slices, FA_I_KNAME(fa_i_decode_body)(&p, a, FA_I_DECODE_SLICES, 0))
#endif
FA_I_DECODE_KERNEL(_general, FA_I_KNAME(fa_i_decode_body)(&p, a, FA_I_DECODE_GENERAL, 0))
#if FA_I_DECODE_WG
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_I_DECODE_WG_BODY(kind) FA_I_KNAME(fa_i_decode_body)(&p, a, kind, 1)
#else /* an empty body where the a features are not compiled */
#define FA_I_DECODE_WG_BODY(kind) ((void)p, (void)a)
#endif
FA_I_DECODE_KERNEL(_wg, FA_I_DECODE_WG_BODY(FA_I_DECODE_DENSE))
#if FA_I_DECODE_PAGES_BUILT
FA_I_DECODE_KERNEL(_wg_pages, FA_I_DECODE_WG_BODY(FA_I_DECODE_PAGES))
#endif
#if FA_I_DECODE_SLICES_BUILT
FA_I_DECODE_KERNEL(_wg_slices, FA_I_DECODE_WG_BODY(FA_I_DECODE_SLICES))
#endif
FA_I_DECODE_KERNEL(_wg_general, FA_I_DECODE_WG_BODY(FA_I_DECODE_GENERAL))
#undef FA_I_DECODE_WG_BODY
#endif
#undef FA_I_DECODE_KERNEL
#undef FA_I_DEC
#endif /* >> decode */

/* >> combine ==================================================================
   Partial results merged by LSE (fa_cuda_combine, and split-KV's second
   kernel): one warp per 32 columns of a query row (per 128 where rows are
   many), the warps of a row in one CTA. Each reads every part's LSE, then
   every part's columns, before it writes o's (so o may be o_parts[0], same
   dtype and layout); the row's LSE is written after a barrier, when every
   warp of the row has read the parts' (so lse may be lse_parts[0], or with
   accumulate o's own). Then two row copies: fa_i_fill_rows (varlen's rows
   without keys) and fa_i_page_rows (a paged cache's append and gather). */
#if defined(FA_I_TOP) && !defined(FA_I_PASS) && FA_I_HOST
#define FA_I_COMBINE_THREADS 256
static __device__ __forceinline__ float fa_i_load_any(const void *base, int64_t i, fa_dtype dtype)
{
    return dtype == FA_DTYPE_F32 ? ((const float *)base)[i]
                                 : fa_i_load16(base, i, dtype == FA_DTYPE_BF16);
}

/* Warps a row takes (each lane `cols` columns of it, 1 .. FA_I_COMBINE_COLS)
   and rows a combine CTA takes: as many as its warps hold whole (d <= 256:
   at least one). */
#define FA_I_COMBINE_COLS 4
#define FA_I_COMBINE_MANY_ROWS 65536
#define FA_I_COMBINE_BATCH 8 /* parts a lane loads before it adds them */
static __host__ __device__ __forceinline__ int fa_i_combine_chunks(int head_dim, int cols)
{
    return (head_dim + 32 * cols - 1) / (32 * cols);
}
static __host__ __device__ __forceinline__ int fa_i_combine_rows(int head_dim, int cols)
{
    return FA_I_COMBINE_THREADS / 32 / fa_i_combine_chunks(head_dim, cols);
}

/* The kernel's body. cols (each lane's columns) is a constant of every
   combine kernel, part_dtype (the parts' dtype) of those that serve
   split-KV's fp32 parts (fa_i_combine_f32_*): a load of any dtype and cols
   up to FA_I_COMBINE_COLS, each chosen as it is made, took most of a
   merge's instructions. */
static __device__ __forceinline__ void fa_i_combine_body(const fa_combine_params *p,
                                                         const fa_i_combine_args *a,
                                                         const fa_dtype part_dtype, const int cols)
{
    __shared__ float weights[FA_I_COMBINE_THREADS / 32][FA_MAX_PARTS + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunks = fa_i_combine_chunks(p->head_dim, cols);
    const int per_cta = fa_i_combine_rows(p->head_dim, cols);
    const int c = (32 * (warp % chunks) + lane) * cols; /* this lane's first column */
    const int parts = p->num_parts + (p->accumulate != 0); /* part num_parts: o itself */
    const int64_t row = (int64_t)blockIdx.x * per_cta + warp / chunks;
    const int live = warp < per_cta * chunks && row < (int64_t)p->batch * p->heads * p->seqlen;
    float *w = weights[warp], mx = -INFINITY, sum = 0.0f, acc[FA_I_COMBINE_COLS];
    int64_t lse_at = 0;
    int h, n, b, i, j;
    fa_i_wait_prerequisites(); /* the parts' writer (decode's splits) is done */
    if (live) {
        if (row <= 0x7fffffff) { /* 32-bit divisions: 64-bit ones are calls */
            const uint32_t r = (uint32_t)row, hn = r / (uint32_t)p->heads;
            h = (int)(r - hn * (uint32_t)p->heads);
            n = (int)(hn % (uint32_t)p->seqlen), b = (int)(hn / (uint32_t)p->seqlen);
        } else {
            h = (int)(row % p->heads);
            n = (int)(row / p->heads % p->seqlen), b = (int)(row / ((int64_t)p->heads * p->seqlen));
        }
        lse_at = ((int64_t)b * p->heads + h) * p->seqlen + n;
        const int64_t at = fa_i_dev_offset(&p->part_layout, b, h, n) + c;
        const int64_t to = fa_i_dev_offset(&p->o_layout, b, h, n) + c;
        for (i = lane; i < parts; i += 32)
            mx = fmaxf(mx, i < p->num_parts ? a->lse[i][lse_at] : p->lse[lse_at]);
        for (i = 16; i > 0; i >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, i));
        for (i = lane; i < parts; i += 32) { /* 0 for a part that saw no key */
            const float lse = i < p->num_parts ? a->lse[i][lse_at] : p->lse[lse_at];
            w[i] = lse == -INFINITY ? 0.0f : expf(lse - mx);
        }
        __syncwarp();
#pragma unroll
        for (j = 0; j < FA_I_COMBINE_COLS; ++j) acc[j] = 0.0f;
        /* FA_I_COMBINE_BATCH parts' loads issued back to back, then added
           in part order: one part at a time waited on each load in turn */
        for (i = 0; i < parts; i += FA_I_COMBINE_BATCH) {
            float x[FA_I_COMBINE_BATCH][FA_I_COMBINE_COLS];
            int u;
#pragma unroll
            for (u = 0; u < FA_I_COMBINE_BATCH; ++u)
#pragma unroll
                for (j = 0; j < FA_I_COMBINE_COLS; ++j) {
                    const int part = i + u;
                    x[u][j] = 0.0f;
                    if (part < parts && w[part] > 0.0f && j < cols && c + j < p->head_dim)
                        x[u][j] = part < p->num_parts
                                      ? fa_i_load_any(a->o[part], at + j, part_dtype)
                                      : fa_i_load_any(p->o, to + j, p->dtype);
                }
#pragma unroll
            for (u = 0; u < FA_I_COMBINE_BATCH && i + u < parts; ++u) {
                sum += w[i + u];
                if (w[i + u] > 0.0f)
#pragma unroll
                    for (j = 0; j < FA_I_COMBINE_COLS; ++j) acc[j] += w[i + u] * x[u][j];
            }
        }
#pragma unroll
        for (j = 0; j < FA_I_COMBINE_COLS; ++j) {
            /* sum >= 1 (its largest weight is 1), 0 with no part, NaN with a NaN part */
            const float x = sum == 0.0f ? 0.0f : __fdividef(acc[j], sum);
            if (j >= cols || c + j >= p->head_dim) continue;
            if (p->dtype == FA_DTYPE_F32)
                ((float *)p->o)[to + j] = x;
            else
                fa_i_store16(p->o, to + j, x, p->dtype == FA_DTYPE_BF16);
        }
    }
    __syncthreads(); /* every warp of the CTA's rows has read the LSEs */
    if (live && c == 0 && p->lse) p->lse[lse_at] = sum == 0.0f ? -INFINITY : mx + logf(sum);
}

/* The combine kernels by the parts' dtype (any, or fp32: split-KV's) and a
   lane's columns (1 where rows are few, FA_I_COMBINE_COLS where they are
   many); fa_i_launch_combine picks one. */
#define FA_I_COMBINE_KERNEL(name, part_dtype, cols)                                          \
    static __global__ void __launch_bounds__(FA_I_COMBINE_THREADS, 1)                        \
        name(const fa_combine_params p, const fa_i_combine_args a)                           \
    {                                                                                        \
        fa_i_combine_body(&p, &a, part_dtype, cols);                                         \
    }
FA_I_COMBINE_KERNEL(fa_i_combine_1, p.part_dtype, 1)
FA_I_COMBINE_KERNEL(fa_i_combine_many, p.part_dtype, FA_I_COMBINE_COLS)
FA_I_COMBINE_KERNEL(fa_i_combine_f32_1, FA_DTYPE_F32, 1)
FA_I_COMBINE_KERNEL(fa_i_combine_f32_many, FA_DTYPE_F32, FA_I_COMBINE_COLS)
#undef FA_I_COMBINE_KERNEL

/* Rows [0, rows) of every head of a tensor at base (layout l, d elements a
   row, dtype) set to value: a ragged batch's rows without keys (O = 0,
   LSE = -inf, dQ = 0) and keys no row sees (dK = dV = 0). */
typedef struct fa_i_fill_args {
    void *base;
    fa_layout l;
    int rows, heads, d;
    fa_dtype dtype;
    float value;
} fa_i_fill_args;

/* Element t of a's rows, counted row by row, head by head. */
static __device__ __forceinline__ void fa_i_fill_at(const fa_i_fill_args *a, int64_t t)
{
    const int64_t row = t / a->d;
    const int64_t at =
        fa_i_dev_offset(&a->l, 0, (int)(row % a->heads), (int)(row / a->heads)) + t % a->d;
    if (a->dtype == FA_DTYPE_F32)
        ((float *)a->base)[at] = a->value;
    else
        fa_i_store16(a->base, at, a->value, a->dtype == FA_DTYPE_BF16);
}

static __global__ void fa_i_fill_rows(const fa_i_fill_args a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < (int64_t)a.rows * a.heads * a.d) fa_i_fill_at(&a, t);
}

/* Rows between a paged cache and dense tensors, K and V in one launch
   (grid z): the append (to_pages: rows [0, rows) of dense sequence b into
   its cache rows start[b] + ...) and the gather of a sequence's first `rows`
   cache rows into dense rows in the workspace (start NULL), or with
   `count` (device tables) its first count[b] + count_add (its keys; none
   where that is out of range: the schedule finds the sequence). table: the
   workspace's copy of the block table, entries checked on the host, or
   the caller's (tables_on_device): an append past `capacity` keys is not
   written, nor a row whose entry is not a page. A CTA
   moves FA_I_PAGE_ROWS_CTA rows of one sequence (grid y), 16 bytes a
   thread at a time, so its index arithmetic is 32-bit and per row, not
   64-bit divisions per 16 bytes. */
#define FA_I_PAGE_ROWS_CTA 4
typedef struct fa_i_page_rows_args {
    char *cache[2];
    fa_layout cache_l[2]; /* batch: the page stride */
    char *dense[2];
    fa_layout dense_l[2];
    int chunks[2]; /* 16-byte chunks of a head's row */
    const int32_t *table, *start, *count;
    int max_pages, page_size, num_pages, count_add;
    int64_t capacity; /* keys a sequence may hold: min(seqlen_k, max_pages page_size) */
    int rows, heads, elem_bytes, to_pages;
} fa_i_page_rows_args;

static __global__ void __launch_bounds__(256) fa_i_page_rows(const fa_i_page_rows_args a)
{
    const int kv = blockIdx.z, b = blockIdx.y, chunks = a.chunks[kv], per_row = a.heads * chunks;
    const int r0 = blockIdx.x * FA_I_PAGE_ROWS_CTA, start = a.start ? a.start[b] : 0;
    const int64_t rows = a.count ? (int64_t)a.count[b] + a.count_add : a.rows;
    int i;
    if (start < 0 || rows < 0 || start + rows > a.capacity) return;
    for (i = threadIdx.x; i < FA_I_PAGE_ROWS_CTA * per_row; i += blockDim.x) {
        const int r = r0 + i / per_row, hc = i % per_row, h = hc / chunks, c = hc % chunks;
        if (r >= rows) break;
        const int row = start + r;
        const int64_t page = a.table[(int64_t)b * a.max_pages + row / a.page_size];
        if ((uint64_t)page >= (uint64_t)a.num_pages) continue;
        const int64_t at = fa_i_dev_offset(&a.cache_l[kv], 0, h, row % a.page_size) +
                           page * a.cache_l[kv].batch;
        uint4 *in_cache = (uint4 *)(a.cache[kv] + at * a.elem_bytes) + c;
        uint4 *dense =
            (uint4 *)(a.dense[kv] + fa_i_dev_offset(&a.dense_l[kv], b, h, r) * a.elem_bytes) + c;
        if (a.to_pages)
            *in_cache = *dense;
        else
            *dense = *in_cache;
    }
}
#endif /* >> combine */

/* >> schedules ================================================================
   A schedule made on the device, for a ragged batch whose offsets, or a
   paged cache whose tables, are in device memory (tables_on_device): the
   FA3 forward's (varlen, paged prefill) or backward's (varlen) items,
   entries and tensor maps made by small launches before the kernel, so
   the call neither copies nor waits on the host. fa_i_sched_pages (paged)
   checks each sequence's page entries. fa_i_sched_order (one CTA) finds
   the first sequence not placed (varlen: its query offsets, or in the
   backward its key offsets, out of order or past the totals: its rows
   could overlap another's, so nothing is written from it on) and sorts
   the placed sequences by their work class, largest first (a counting
   sort; the host's schedules order them the same way): each sequence's
   first item, the item count the forward reads and, in the backward, each
   sequence's first block of the dQ accumulator. fa_i_sched_sequences (a
   CTA per sequence in turn) writes a sequence's entry, its items, its
   accumulator blocks' rows (backward) and its tensor maps: the template's
   with the sequence's first row and row count put in by tensormap.replace
   in shared memory (fa_i_sched_map), copied out with the release fence the
   kernel's acquire pairs with. It fills the rows no kernel writes
   (fa_i_sched_fill). The backward's grid and postprocess run to bounds:
   the items and accumulator rows past the schedule's are set before
   (sequence -1: the CTA returns; 0 rows). */
#if defined(FA_I_TOP) && !defined(FA_I_PASS) && FA_I_HOST && FA_I_SM90
#define FA_I_SCHED_ORDER_THREADS 1024
#define FA_I_SCHED_SEQ_THREADS 256
enum { FA_I_FILL_O, FA_I_FILL_LSE };                   /* the forward's fills */
enum { FA_I_FILL_DQ, FA_I_FILL_DK, FA_I_FILL_DV };     /* the backward's */
typedef struct fa_i_dev_sched {
    /* q, k, v, then o (forward) or dout (backward): maps of a sequence's
       rows (the template's dims but the rows), their base, and the bytes
       from a unit to the next: varlen a row (a sequence's first row: its
       offset), paged a batch for q and o (its index), a page for k and v
       (its last page: a sequence's k and v maps hold that page's rows; a
       batch where gathered) */
    CUtensorMap tmpl[4];
    const char *base[4];
    int64_t unit_bytes[4];
    const int32_t *cu_q, *cu_k, *used; /* varlen */
    /* paged (table set): sequence b's keys cache_len[b] + seqlen_new from
       row b of the table (max_pages entries of pages of page_size keys);
       gathered: the kernel reads them from batch b of dense K and V (base,
       unit_bytes) that fa_i_page_rows filled, not from the pages */
    const int32_t *table, *cache_len;
    int seqlen_new, max_pages, page_size, num_pages, gathered;
    int batch, heads_q, causal;
    int backward; /* items {sequence, first key} of key blocks, else query tiles */
    int rows;     /* of an item: the forward's query tile, the backward's key tile */
    int total_q, total_k, max_q, max_k; /* paged: max_q is every sequence's queries */
    /* the tensors whose rows are filled (fa_i_sched_fill; the LSE [Hq,
       total_q] or [B, Hq, Nq], base NULL without one): base, layout, heads,
       d, dtype */
    fa_i_fill_args fill[3];
    /* the workspace (fa_i_sched_workspace): per sequence its maps
       (map_bytes apart: the kernel's struct, whose first four members are
       the maps, in tmpl's order), entry, first item, first accumulator
       block and (paged) whether a page entry is bad; the control words
       {item count, first sequence not placed}; the items; the accumulator
       blocks' {first row, rows} */
    char *seq_maps;
    int map_bytes;
    fa_i_fa3_seq *seqs;
    int *item0, *acc0, *bad_pages, *ctl;
    int2 *items, *acc_rows;
} fa_i_dev_sched;

enum { FA_I_SEQ_NONE, FA_I_SEQ_RUNS, FA_I_SEQ_NO_QUERIES, FA_I_SEQ_NO_KEYS, FA_I_SEQ_BAD };

/* Whether sequence b's offsets stop the placing (fa_i_sched_order; varlen). */
static __device__ int fa_i_sched_misplaced(const fa_i_dev_sched *a, int b)
{
    return !a->table &&
           (a->cu_q[b] < 0 || a->cu_q[b + 1] < a->cu_q[b] || a->cu_q[b + 1] > a->total_q ||
            (a->backward &&
             (a->cu_k[b] < 0 || a->cu_k[b + 1] < a->cu_k[b] || a->cu_k[b + 1] > a->total_k)));
}

/* A paged sequence's keys, or -1 where its length is out of range. */
static __device__ int fa_i_sched_paged_keys(const fa_i_dev_sched *a, int b)
{
    const int64_t nk = (int64_t)a->cache_len[b] + a->seqlen_new;
    return a->cache_len[b] < 0 || nk > a->max_k || nk > (int64_t)a->max_pages * a->page_size
               ? -1
               : (int)nk;
}

/* Sequence b's entry (*e) and what becomes of it: its items run, its rows
   are filled (NO_QUERIES in the backward, NO_KEYS, BAD: other offsets, its
   length, seqused_k or a page entry out of range), or nothing (NONE: b at
   or past `unplaced`, the first sequence fa_i_sched_misplaced stops at). */
static __device__ int fa_i_sched_at(const fa_i_dev_sched *a, int b, int unplaced,
                                    fa_i_fa3_seq *e)
{
    e->acc0 = e->pad = 0;
    if (a->table) { /* queries [b, 0 .. max_q), keys from the pages */
        const int nk = fa_i_sched_paged_keys(a, b);
        e->q0 = e->k0 = 0, e->nq = a->max_q, e->nk = nk;
        e->lse0 = (int64_t)b * a->heads_q * a->max_q, e->pages0 = (int64_t)b * a->max_pages;
        return nk < 0 || a->bad_pages[b] ? FA_I_SEQ_BAD : nk ? FA_I_SEQ_RUNS : FA_I_SEQ_NO_KEYS;
    }
    const int q0 = a->cu_q[b], q1 = a->cu_q[b + 1], k0 = a->cu_k[b], k1 = a->cu_k[b + 1];
    const int used = a->used ? a->used[b] : k1 - k0;
    e->q0 = q0, e->k0 = k0, e->nq = q1 - q0, e->nk = used;
    e->lse0 = q0, e->pages0 = 0;
    if (b >= unplaced) return FA_I_SEQ_NONE;
    if (q1 - q0 > a->max_q || k0 < 0 || k1 < k0 || k1 > a->total_k || k1 - k0 > a->max_k ||
        used < 0 || used > k1 - k0)
        return FA_I_SEQ_BAD;
    return q1 == q0 ? FA_I_SEQ_NO_QUERIES : used ? FA_I_SEQ_RUNS : FA_I_SEQ_NO_KEYS;
}

/* A running sequence's items: its key blocks, or its query tiles of every head. */
static __device__ __forceinline__ int fa_i_sched_items(const fa_i_dev_sched *a,
                                                       const fa_i_fa3_seq *e)
{
    return a->backward ? (e->nk + a->rows - 1) / a->rows
                       : (e->nq + a->rows - 1) / a->rows * a->heads_q;
}

/* Rows [r0, r0 + rows) of batch b, every head, of f's tensor set to value,
   by the CTA. */
static __device__ void fa_i_fill_rows_cta(fa_i_fill_args f, int b, int r0, int rows, float value)
{
    int64_t i;
    f.base = (char *)f.base +
             ((int64_t)b * f.l.batch + (int64_t)r0 * f.l.seq) * (f.dtype == FA_DTYPE_F32 ? 4 : 2);
    f.rows = rows, f.value = value;
    for (i = threadIdx.x; i < (int64_t)rows * f.heads * f.d; i += blockDim.x) fa_i_fill_at(&f, i);
}

/* The rows of sequence b (entry e, fa_i_sched_at's answer st) no kernel
   writes: the forward's O = 0 and LSE = -inf without keys; the backward's
   dQ = 0 without keys, dK = dV = 0 of the keys past seqused_k (all of
   them without queries or keys); NaN in all of them where st is BAD. */
static __device__ void fa_i_sched_fill(const fa_i_dev_sched *a, int b, int st,
                                       const fa_i_fa3_seq *e)
{
    const float nan = __int_as_float(0x7fc00000), value = st == FA_I_SEQ_BAD ? nan : 0.0f;
    const int fb = a->table ? b : 0; /* the batch of the fills' rows */
    if (st == FA_I_SEQ_NONE) return;
    if (!a->backward) {
        if (st != FA_I_SEQ_NO_KEYS && st != FA_I_SEQ_BAD) return;
        fa_i_fill_rows_cta(a->fill[FA_I_FILL_O], fb, e->q0, e->nq, value);
        if (a->fill[FA_I_FILL_LSE].base)
            fa_i_fill_rows_cta(a->fill[FA_I_FILL_LSE], fb, e->q0, e->nq,
                               st == FA_I_SEQ_BAD ? nan : -INFINITY);
        return;
    }
    const int seen = st == FA_I_SEQ_RUNS ? e->nk : 0, span = a->cu_k[b + 1] - e->k0;
    if (st == FA_I_SEQ_NO_KEYS || st == FA_I_SEQ_BAD)
        fa_i_fill_rows_cta(a->fill[FA_I_FILL_DQ], 0, e->q0, e->nq, value);
    fa_i_fill_rows_cta(a->fill[FA_I_FILL_DK], 0, e->k0 + seen, span - seen, value);
    fa_i_fill_rows_cta(a->fill[FA_I_FILL_DV], 0, e->k0 + seen, span - seen, value);
}

/* Paged: whether an entry among the pages sequence b's keys use is not a
   page (a CTA per sequence in turn); sequences whose length is out of
   range are not read (fa_i_sched_at finds them). */
static __global__ void __launch_bounds__(FA_I_SCHED_SEQ_THREADS)
    fa_i_sched_pages(const __grid_constant__ fa_i_dev_sched a)
{
    int b;
    for (b = blockIdx.x; b < a.batch; b += gridDim.x) {
        const int nk = fa_i_sched_paged_keys(&a, b), pages = nk > 0 ? (nk - 1) / a.page_size + 1 : 0;
        const int32_t *row = a.table + (int64_t)b * a.max_pages;
        int i, bad = 0;
        for (i = threadIdx.x; i < pages; i += blockDim.x) bad |= row[i] < 0 || row[i] >= a.num_pages;
        bad = __syncthreads_or(bad);
        if (threadIdx.x == 0) a.bad_pages[b] = bad;
    }
}

static __global__ void __launch_bounds__(FA_I_SCHED_ORDER_THREADS)
    fa_i_sched_order(const __grid_constant__ fa_i_dev_sched a)
{
    __shared__ int next[64], unplaced, acc_next; /* per class: its next item */
    fa_i_fa3_seq e;
    int b, c;
    if (threadIdx.x < 64) next[threadIdx.x] = 0;
    if (threadIdx.x == 0) unplaced = a.batch, acc_next = 0;
    __syncthreads();
    for (b = threadIdx.x; b < a.batch; b += blockDim.x)
        if (fa_i_sched_misplaced(&a, b)) atomicMin(&unplaced, b);
    __syncthreads();
    for (b = threadIdx.x; b < a.batch; b += blockDim.x)
        if (fa_i_sched_at(&a, b, unplaced, &e) == FA_I_SEQ_RUNS)
            atomicAdd(&next[fa_i_work_class(e.nq, e.nk)], fa_i_sched_items(&a, &e));
    __syncthreads();
    if (threadIdx.x == 0) {
        int items = 0;
        for (c = 63; c >= 0; --c) {
            const int n = next[c];
            next[c] = items, items += n;
        }
        a.ctl[0] = items, a.ctl[1] = unplaced;
    }
    __syncthreads();
    for (b = threadIdx.x; b < a.batch; b += blockDim.x) {
        const int runs = fa_i_sched_at(&a, b, unplaced, &e) == FA_I_SEQ_RUNS;
        a.item0[b] = runs ? atomicAdd(&next[fa_i_work_class(e.nq, e.nk)],
                                      fa_i_sched_items(&a, &e))
                          : -1;
        if (a.backward)
            a.acc0[b] = runs ? atomicAdd(&acc_next, fa_i_varlen_acc_blocks(e.nq)) : -1;
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Map m (tmpl's order) of sequence b (entry e), by one warp through its
   128-byte staging buffer in shared memory. */
static __device__ void fa_i_sched_map(const fa_i_dev_sched *a, int m, int b,
                                      const fa_i_fa3_seq *e, CUtensorMap *staged)
{
    const int lane = threadIdx.x % 32, keys = m == 1 || m == 2;
    CUtensorMap *to = (CUtensorMap *)(a->seq_maps + (int64_t)b * a->map_bytes) + m;
    const uint32_t at = fa_i_smem_addr(staged);
    int64_t unit = keys ? e->k0 : e->q0; /* varlen: rows */
    int rows = keys ? e->nk : e->nq;
    if (a->table && (!keys || a->gathered)) unit = b;
    else if (a->table) { /* the last page's rows */
        const int last = (e->nk - 1) / a->page_size;
        unit = a->table[e->pages0 + last], rows = e->nk - last * a->page_size;
    }
    if (lane < 16) ((uint64_t *)staged)[lane] = ((const uint64_t *)&a->tmpl[m])[lane];
    __syncwarp();
    if (lane == 0) {
        asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(at),
                     "l"((uint64_t)(uintptr_t)(a->base[m] + unit * a->unit_bytes[m]))
                     : "memory");
        asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;\n" ::"r"(at),
                     "r"(rows)
                     : "memory");
    }
    __syncwarp();
    asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync"
                 ".aligned [%0], [%1], 128;\n" ::"l"((uint64_t)(uintptr_t)to),
                 "r"(at)
                 : "memory");
    __syncwarp(); /* the buffer is read before the warp's next map */
}
#endif

static __global__ void __launch_bounds__(FA_I_SCHED_SEQ_THREADS)
    fa_i_sched_sequences(const __grid_constant__ fa_i_dev_sched a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(128) CUtensorMap staged[4];
    const int unplaced = a.ctl[1], warp = threadIdx.x / 32;
    fa_i_fa3_seq e;
    int b, i;
    for (b = blockIdx.x; b < a.batch; b += gridDim.x) {
        const int st = fa_i_sched_at(&a, b, unplaced, &e);
        if (st == FA_I_SEQ_RUNS) {
            const int n = fa_i_sched_items(&a, &e), first = a.item0[b];
            const int blocks = (e.nq + a.rows - 1) / a.rows; /* forward: a head's */
            if (a.backward) e.acc0 = a.acc0[b];
            if (threadIdx.x == 0) a.seqs[b] = e;
            for (i = threadIdx.x; i < n; i += blockDim.x)
                a.items[first + i] =
                    make_int2(b, a.backward ? i * a.rows
                                            : fa_i_fa3_tile_item(i / blocks, i % blocks, blocks,
                                                                 a.causal));
            for (i = threadIdx.x; a.backward && i < fa_i_varlen_acc_blocks(e.nq);
                 i += blockDim.x)
                a.acc_rows[e.acc0 + i] = make_int2(e.q0 + 64 * i, e.nq - 64 * i);
            if (warp < 4) fa_i_sched_map(&a, warp, b, &e, &staged[warp]);
        }
        fa_i_sched_fill(&a, b, st, &e);
    }
#else
    (void)a;
#endif
}
#endif /* >> schedules */

/* >> quantize =================================================================
   fa_cuda_quantize_fp8, block scaling: one CTA per block of FA_FP8_BLOCK
   rows of a head, in one pass: each lane holds a run of e = min(d, 32)
   elements of a row (lr = d / e lanes a row, 32 / lr rows a warp at a time)
   in registers from its load to its store, while the CTA finds the block's
   amax. The CTA has the warps that hold the block at once, at most
   FA_I_QUANT_WARPS (fa_i_quant_warps: fewer below d = 128, so none idles).
   The Hadamard rotation makes the CPU's butterflies in the CPU's order
   (fa_i_quantize_row: spans below e inside a lane, then across lanes), so
   both give the same bits. */
#if defined(FA_I_TOP) && !defined(FA_I_PASS) && FA_I_HOST
#define FA_I_QUANT_WARPS 16
#define FA_I_QUANT_RUN 32  /* most elements a lane holds of a row */
#define FA_I_QUANT_ITERS 2 /* most rows a lane holds: d = 256, 4 rows a warp */

/* The CTA's warps for head dim d. */
static int fa_i_quant_warps(int d)
{
    const int e = d < FA_I_QUANT_RUN ? d : FA_I_QUANT_RUN, rows_per_warp = 32 / ((d + e - 1) / e);
    const int w = (FA_FP8_BLOCK + rows_per_warp - 1) / rows_per_warp;
    return w < FA_I_QUANT_WARPS ? w : FA_I_QUANT_WARPS;
}

/* The run of n elements at x[at ...] (16-byte vectors where aligned). */
static __device__ __forceinline__ void fa_i_quant_load(const fa_quantize_params *p, int64_t at,
                                                       int n, float *v)
{
    const int es = p->dtype == FA_DTYPE_F32 ? 4 : 2;
    const char *src = (const char *)p->x + at * es;
    int i, j;
    if (n == FA_I_QUANT_RUN && (uintptr_t)src % 16 == 0) {
#pragma unroll
        for (i = 0; i < FA_I_QUANT_RUN; i += 8) {
            if (es == 4) {
                const float4 a = ((const float4 *)src)[i / 4], c = ((const float4 *)src)[i / 4 + 1];
                v[i] = a.x, v[i + 1] = a.y, v[i + 2] = a.z, v[i + 3] = a.w;
                v[i + 4] = c.x, v[i + 5] = c.y, v[i + 6] = c.z, v[i + 7] = c.w;
            } else {
                const uint4 w = ((const uint4 *)src)[i / 8];
                const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (j = 0; j < 4; ++j) {
                    if (p->dtype == FA_DTYPE_BF16) {
                        v[i + 2 * j] = __uint_as_float(u[j] << 16);
                        v[i + 2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
                    } else {
                        v[i + 2 * j] = fa_i_load16(&u[j], 0, 0);
                        v[i + 2 * j + 1] = fa_i_load16(&u[j], 1, 0);
                    }
                }
            }
        }
        return;
    }
#pragma unroll
    for (i = 0; i < FA_I_QUANT_RUN; ++i) v[i] = i < n ? fa_i_load_any(p->x, at + i, p->dtype) : 0.0f;
}

/* Rotates the row whose run lane j of lr (lanes xor-adjacent) holds in v;
   bit i of neg: element j e + i takes the sign -1. */
static __device__ __forceinline__ void fa_i_quant_rotate(const fa_quantize_params *p, int e, int lr,
                                                         int j, uint32_t neg, float *v)
{
    int i, m;
#pragma unroll
    for (i = 0; i < FA_I_QUANT_RUN; ++i) /* x * -1 as a sign flip */
        v[i] = __int_as_float(__float_as_int(v[i]) ^ (int)(((neg >> i) & 1u) << 31));
#pragma unroll
    for (m = 1; m < FA_I_QUANT_RUN; m <<= 1) /* spans m < e inside the lane */
        if (m < e)
#pragma unroll
            for (i = 0; i < FA_I_QUANT_RUN; ++i)
                if (!(i & m)) {
                    const float a = v[i], c = v[i + m];
                    v[i] = a + c;
                    v[i + m] = a - c;
                }
#pragma unroll
    for (m = 1; m < 32; m <<= 1) /* spans m e: lanes j and j ^ m */
        if (m < lr) {
            /* other -+ v as one FMA (exact product: the bits of the add) */
            const float sign = (j & m) ? -1.0f : 1.0f;
#pragma unroll
            for (i = 0; i < FA_I_QUANT_RUN; ++i)
                v[i] = fmaf(sign, v[i], __shfl_xor_sync(0xffffffffu, v[i], m));
        }
#pragma unroll
    for (i = 0; i < FA_I_QUANT_RUN; ++i) v[i] *= 1.0f / sqrtf((float)p->head_dim);
}

#define FA_I_QUANT_NW ((int)(blockDim.x >> 5)) /* the CTA's warps (fa_i_quant_warps) */

/* The block's scale from every lane's amax: its descale written, 1 / descale
   returned. */
static __device__ __forceinline__ float fa_i_quant_scale(const fa_quantize_params *p, float amax,
                                                         float *part)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float descale;
    int i;
    for (i = 16; i > 0; i >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, i));
    if (lane == 0) part[warp] = amax;
    __syncthreads();
    for (i = 0; i < FA_I_QUANT_NW; ++i) amax = fmaxf(amax, part[i]);
    descale = fa_i_fp8_descale(amax, p->pow2_descale);
    if (threadIdx.x == 0)
        p->descale[((int64_t)blockIdx.z * p->heads + blockIdx.y) *
                       ((p->seqlen + FA_FP8_BLOCK - 1) / FA_FP8_BLOCK) +
                   blockIdx.x] = descale;
    return 1.0f / descale;
}

/* A lane's run of n codes (w: four a word) into row r of (b, h), from
   element `col`. */
static __device__ __forceinline__ void fa_i_quant_store(const fa_quantize_params *p, int b, int h,
                                                        int r, int col, int n, const uint32_t *w)
{
    uint8_t *out = (uint8_t *)p->out + fa_i_dev_offset(&p->out_layout, b, h, r) + col;
    int i;
    if (n == FA_I_QUANT_RUN && (uintptr_t)out % 16 == 0) {
        ((uint4 *)out)[0] = make_uint4(w[0], w[1], w[2], w[3]);
        ((uint4 *)out)[1] = make_uint4(w[4], w[5], w[6], w[7]);
    } else {
#pragma unroll
        for (i = 0; i < FA_I_QUANT_RUN; ++i)
            if (i < n) out[i] = (uint8_t)(w[i / 4] >> (8 * (i % 4)));
    }
}

/* A lane's rows: the it-th of its warp's (rw rows a warp, lr lanes a row),
   whether the lane holds one there, and whether the rows end first. */
#define FA_I_QUANT_ROW(it) (r0 + ((it) * FA_I_QUANT_NW + warp) * rw + lane / lr)
#define FA_I_QUANT_MINE(it) (lane < rw * lr && FA_I_QUANT_ROW(it) < r1)
/* whether the warps' rows end before their it-th (or the lanes hold fewer) */
#define FA_I_QUANT_DONE(it) ((it) >= iters || r0 + (it) * FA_I_QUANT_NW * rw >= r1)

/* Stores each row the lane holds (params: the call's), word i of its
   codes (four codes) being `word` (it: the row's index among the lane's,
   i: the word's). */
#define FA_I_QUANT_STORE_ROWS(params, word)                                                   \
    _Pragma("unroll") for (it = 0; it < FA_I_QUANT_ITERS; ++it) {                             \
        const int r = FA_I_QUANT_ROW(it);                                                     \
        uint32_t w[FA_I_QUANT_RUN / 4];                                                       \
        if (FA_I_QUANT_DONE(it)) break;                                                       \
        if (!FA_I_QUANT_MINE(it)) continue;                                                   \
        _Pragma("unroll") for (i = 0; i < FA_I_QUANT_RUN / 4; ++i) w[i] = (word);             \
        fa_i_quant_store(params, b, h, r, j * e, n, w);                                       \
    }

/* Four codes from two 16-bit pairs times inv. */
static __device__ __forceinline__ uint32_t fa_i_quant_pack_pairs(uint32_t a, uint32_t c, int bf16,
                                                                 float inv)
{
    const float2 x = fa_i_unpack2(a, bf16), y = fa_i_unpack2(c, bf16);
    return fa_i_pack_e4m3(x.x * inv, x.y * inv, y.x * inv, y.y * inv);
}

/* One block of rows (the CTA's), each lane holding `iters` rows. */
static __device__ __forceinline__ void fa_i_quantize_block(const fa_quantize_params *pp, int iters)
{
    /* the warps' amax, the signs as bits (static: see fa_i_fa3_compiled) */
    __shared__ float part[FA_I_QUANT_WARPS];
    __shared__ uint32_t neg_words[FA_MAX_HEAD_DIM / 32];
    const fa_quantize_params p = *pp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = p.head_dim;
    const int e = d < FA_I_QUANT_RUN ? d : FA_I_QUANT_RUN, lr = (d + e - 1) / e, rw = 32 / lr;
    const int j = lane % lr, n = min(e, d - j * e); /* this lane's run: elements j e .. + n */
    const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int r0 = blk * FA_FP8_BLOCK, r1 = min(r0 + FA_FP8_BLOCK, p.seqlen);
    float v[FA_I_QUANT_ITERS][FA_I_QUANT_RUN], amax = 0.0f, inv;
    uint32_t neg = 0;
    int it, i;
    if (p.hadamard) { /* each sign once per CTA, not once per row */
        const int elem = 32 * warp + lane;
        const uint32_t bits =
            __ballot_sync(0xffffffffu, elem < d && fa_i_hadamard_sign(p.hadamard_seed, elem) < 0.0f);
        if (lane == 0 && warp < FA_MAX_HEAD_DIM / 32) neg_words[warp] = bits;
        __syncthreads();
        neg = neg_words[(j * e) >> 5] >> ((j * e) & 31);
    }
#pragma unroll
    for (it = 0; it < FA_I_QUANT_ITERS; ++it) {
        const int r = FA_I_QUANT_ROW(it);
        if (FA_I_QUANT_DONE(it)) break;
        if (FA_I_QUANT_MINE(it))
            fa_i_quant_load(&p, fa_i_dev_offset(&p.x_layout, b, h, r) + j * e, n, v[it]);
        else
#pragma unroll
            for (i = 0; i < FA_I_QUANT_RUN; ++i) v[it][i] = 0.0f;
        if (p.hadamard) fa_i_quant_rotate(&p, e, lr, j, neg, v[it]);
#pragma unroll
        for (i = 0; i < FA_I_QUANT_RUN; ++i) amax = fmaxf(amax, fabsf(v[it][i]));
    }
    inv = fa_i_quant_scale(&p, amax, part);
    FA_I_QUANT_STORE_ROWS(&p, fa_i_pack_e4m3(v[it][4 * i] * inv, v[it][4 * i + 1] * inv,
                                             v[it][4 * i + 2] * inv, v[it][4 * i + 3] * inv));
}

/* The same for 16-bit rows without the rotation: a lane keeps its run as
   the 16-bit pairs it loaded, half the registers of floats (so more CTAs an
   SM keep loads in flight), and converts them twice, for the amax and for
   the codes: the same values, so the same codes. */
static __device__ __forceinline__ void fa_i_quantize_block_raw(const fa_quantize_params *pp,
                                                               int iters)
{
    __shared__ float part[FA_I_QUANT_WARPS]; /* the warps' amax (static: see fa_i_fa3_compiled) */
    const fa_quantize_params p = *pp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = p.head_dim;
    const int e = d < FA_I_QUANT_RUN ? d : FA_I_QUANT_RUN, lr = (d + e - 1) / e, rw = 32 / lr;
    const int j = lane % lr, n = min(e, d - j * e);
    const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, bf16 = p.dtype == FA_DTYPE_BF16;
    const int r0 = blk * FA_FP8_BLOCK, r1 = min(r0 + FA_FP8_BLOCK, p.seqlen);
    uint32_t u[FA_I_QUANT_ITERS][FA_I_QUANT_RUN / 2]; /* element 2i in the low half of word i */
    float amax = 0.0f, inv;
    int it, i;
#pragma unroll
    for (it = 0; it < FA_I_QUANT_ITERS; ++it) {
        const int r = FA_I_QUANT_ROW(it);
        if (FA_I_QUANT_DONE(it)) break;
#pragma unroll
        for (i = 0; i < FA_I_QUANT_RUN / 2; ++i) u[it][i] = 0u; /* +0 in both dtypes */
        if (FA_I_QUANT_MINE(it)) {
            const uint16_t *src =
                (const uint16_t *)p.x + fa_i_dev_offset(&p.x_layout, b, h, r) + j * e;
            if (n == FA_I_QUANT_RUN && (uintptr_t)src % 16 == 0) {
#pragma unroll
                for (i = 0; i < FA_I_QUANT_RUN / 8; ++i) {
                    const uint4 w = ((const uint4 *)src)[i];
                    u[it][4 * i] = w.x, u[it][4 * i + 1] = w.y;
                    u[it][4 * i + 2] = w.z, u[it][4 * i + 3] = w.w;
                }
            } else {
#pragma unroll
                for (i = 0; i < FA_I_QUANT_RUN; ++i)
                    if (i < n) u[it][i / 2] |= (uint32_t)src[i] << (16 * (i & 1));
            }
        }
#pragma unroll
        for (i = 0; i < FA_I_QUANT_RUN / 2; ++i) {
            const float2 x = fa_i_unpack2(u[it][i], bf16);
            amax = fmaxf(amax, fmaxf(fabsf(x.x), fabsf(x.y)));
        }
    }
    inv = fa_i_quant_scale(&p, amax, part);
    FA_I_QUANT_STORE_ROWS(&p, fa_i_quant_pack_pairs(u[it][2 * i], u[it][2 * i + 1], bf16, inv));
}
#undef FA_I_QUANT_ROW
#undef FA_I_QUANT_MINE
#undef FA_I_QUANT_DONE
#undef FA_I_QUANT_NW
#undef FA_I_QUANT_STORE_ROWS

/* The quantize kernels: rows of d <= 128 fit one row a lane (at least 8
   rows a warp), longer rows take two; more CTAs an SM keep more loads in
   flight, as many as the registers allow (16-bit pairs: fewer registers).
   Columns: kernel, block body, rows a lane, CTAs an SM. */
#define FA_I_QUANT_KERNELS(X)                                     \
    X(fa_i_quantize_fp8_short, fa_i_quantize_block, 1, 2)         \
    X(fa_i_quantize_fp8_long, fa_i_quantize_block, 2, 1)          \
    X(fa_i_quantize_fp8_short_raw, fa_i_quantize_block_raw, 1, 3) \
    X(fa_i_quantize_fp8_long_raw, fa_i_quantize_block_raw, 2, 2)
#define FA_I_QUANT_KERNEL(name, body, iters, ctas)                                            \
    static __global__ void __launch_bounds__(32 * FA_I_QUANT_WARPS, ctas)                     \
        name(const fa_quantize_params p)                                                      \
    {                                                                                         \
        body(&p, iters);                                                                      \
    }
FA_I_QUANT_KERNELS(FA_I_QUANT_KERNEL)
#undef FA_I_QUANT_KERNEL
#undef FA_I_QUANT_KERNELS
#endif /* >> quantize */

/* >> backward common ==========================================================
   By recomputation from LSE (FA2 paper, algorithm 2): a preprocess kernel
   computes D = rowsum(dO * O) and zeroes the fp32 dQ accumulator; the dK/dV
   kernels walk the query blocks that see their keys; dQ is added into the
   accumulator (atomic mode; a postprocess kernel converts it) or computed by
   its own kernel (deterministic mode). */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
/* 64-row blocks per head of the dQ accumulator: whole pairs, so that the
   FA2 kernel's 128-row steps stay inside a head's blocks. */
static __host__ __device__ __forceinline__ int fa_i_dq_blocks(const fa_params *p)
{
    return (p->seqlen_q + 127) / 128 * 2;
}

/* The FA2 backward's dK/dV CTA: key block *kb of kv head *hk of batch *b,
   from a grid of (key blocks, kv heads, batch). Under causal masking the
   first key blocks see the most query rows: with `reorder` they go first
   (fa_i_grouped_cta). */
#define FA_I_BWD_GROUP_CTAS 256
static __device__ __forceinline__ void fa_i_bwd_cta(const fa_params *p, int reorder, int *kb, int *hk,
                                                    int *b)
{
    if (!reorder || !p->causal) {
        *kb = blockIdx.x, *hk = blockIdx.y, *b = blockIdx.z;
        return;
    }
    fa_i_grouped_cta(FA_I_BWD_GROUP_CTAS, kb, hk, b);
}

/* The backward's step `ahead` steps after step (head sh of the group, block
   sb of blocks of bm rows): its query head h0 + sh' and first row (b0 + sb')
   bm. Steps go through a head's blocks, then the next head's; ahead <= 2, so
   this is at most two wraps, not a division. */
static __device__ __forceinline__ void fa_i_bwd_step(int sh, int sb, int ahead, int blocks, int h0,
                                                     int b0, int bm, int *h, int *r0)
{
    for (sb += ahead; sb >= blocks; sb -= blocks) ++sh;
    *h = h0 + sh;
    *r0 = (b0 + sb) * bm;
}

/* The backward's next step: block sb + 1 of head sh, or the next head's
   first block. (Macros, these two: as inline functions they moved the FA2
   dK/dV kernel's registers by 2 to 4.) */
#define FA_I_BWD_ADVANCE(sh, sb, blocks) \
    do {                                 \
        if (++(sb) == (blocks)) {        \
            (sb) = 0;                    \
            ++(sh);                      \
        }                                \
    } while (0)

/* A backward kernel's epilogue: dK (times the softmax scale) and dV of one
   key of problem P at columns col, col + 1 into gdk, gdv, unless the key is
   past the end or the columns past the head dim (FA_I_PACK: the kernel's
   dtype). */
#define FA_I_STORE_DK_DV(P, key, col, dk0, dk1, dv0, dv1)                                   \
    if ((key) < (P).seqlen_k) {                                                             \
        if ((col) < (P).head_dim)                                                           \
            fa_i_store_pair(gdk + (int64_t)(key) * (P).dk_layout.seq, (col), (P).head_dim,  \
                            FA_I_PACK((dk0) * (P).scale, (dk1) * (P).scale));               \
        if ((col) < (P).head_dim_v)                                                         \
            fa_i_store_pair(gdv + (int64_t)(key) * (P).dv_layout.seq, (col), (P).head_dim_v, \
                            FA_I_PACK((dv0), (dv1)));                                       \
    }

/* Lanes per query row in the preprocess: the power of two that covers d with
   16 bytes each (several rows per warp below d = 160). */
static __host__ __device__ __forceinline__ int fa_i_pre_lanes(int d)
{
    return d <= 32 ? 4 : d <= 64 ? 8 : d <= 128 ? 16 : 32;
}

#if FA_I_HOST /* the kernels the host launches for every head dim */
/* D = rowsum(dO * O) per query row, and the fp32 dQ accumulator's rows
   zeroed (padding rows too), fa_i_pre_lanes(acc_d) lanes per row. */
static __global__ void fa_i_bwd_preprocess(const fa_params p, fa_i_bwd_args a)
{
    const int dv = p.head_dim_v, lanes = fa_i_pre_lanes(a.acc_d), per_head = fa_i_dq_blocks(&p) * 64;
    const int lane = threadIdx.x & (lanes - 1);
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / lanes;
    const int64_t bh = row / per_head;
    const int s = (int)(row % per_head), in_acc = bh < (int64_t)p.batch * p.heads_q;
    const int has_d = in_acc && s < p.seqlen_q;
    float sum = 0.0f;
    int i;
    if (a.dq_acc && in_acc)
        for (i = 4 * lane; i < a.acc_d; i += 4 * lanes)
            *(float4 *)(a.dq_acc + row * a.acc_d + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (has_d) {
        const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
        const uint16_t *o = (const uint16_t *)p.o + fa_i_dev_offset(&p.o_layout, b, h, s);
        const uint16_t *g = (const uint16_t *)p.dout + fa_i_dev_offset(&p.dout_layout, b, h, s);
        for (i = 8 * lane; i < dv; i += 8 * lanes)
            sum += fa_i_dot8(fa_i_load8_part(o + i, dv - i), fa_i_load8_part(g + i, dv - i),
                             p.dtype == FA_DTYPE_BF16);
    }
    for (i = lanes / 2; i > 0; i >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, i);
    if (lane == 0 && has_d) a.dsum[bh * p.seqlen_q + s] = sum;
}

/* dQ = scale * accumulator in the params' dtype and layout (its first
   head_dim columns of acc_d). The accumulator is tiled in the order of the
   MMA accumulators: each 64-row block is d / 8 groups of 8 columns, 512
   floats each, and in a group, the 4 floats of columns c, c + 1 (c even)
   of rows r and r + 8 (r % 16 < 8, r counted in the block) lie at 4 t,
   t = 32 (r / 16) + 4 (r % 8) + (c % 8) / 2: the
   accumulator of lane t % 32 of an m16n8 tile. So a warp's mma.sync tile
   (FA2) or a warpgroup's wgmma registers (FA3) leave in 16-byte pieces
   without shuffles, and the FA3 kernel's shared-memory writes are
   conflict-free. Here thread x of a block takes column chunk j = x % (d /
   8) of row group m = x / (d / 8): floats 512 j + 16 m ... + 15, which are
   columns 8 j ... 8 j + 7 of rows r and r + 8, r = 16 (m / 8) + m % 8
   (pairs of (r, r + 8) from each of four neighbouring threads).
   Neighbouring x take neighbouring chunks of a row, so a warp's stores
   cover whole rows. Varlen: a block's rows are where a.acc_rows says. */
static __global__ void fa_i_bwd_postprocess(const fa_params p, fa_i_bwd_args a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int d = a.acc_d, bf16 = p.dtype == FA_DTYPE_BF16;
    const int blocks = fa_i_dq_blocks(&p), x = (int)(t % (4 * d));
    const int j = x % (d / 8), m = x / (d / 8);
    const int64_t block = t / (4 * d), bh = block / blocks;
    const float4 *src = (const float4 *)(a.dq_acc + block * 64 * d + 512 * j + 16 * m);
    const int r = 16 * (m >> 3) + (m & 7); /* in the block */
    int first = (int)(block % blocks) * 64, rows = p.seqlen_q - first, i;
    float f[16];
    if (block >= (int64_t)p.batch * p.heads_q * blocks) return;
    if (a.acc_rows) {
        const int2 e = a.acc_rows[block % blocks];
        first = e.x, rows = e.y;
    }
    for (i = 0; i < 4; ++i) {
        const float4 v = src[i];
        f[2 * i] = v.x, f[2 * i + 1] = v.y, f[8 + 2 * i] = v.z, f[8 + 2 * i + 1] = v.w;
    }
    for (i = 0; i < 2 && r + 8 * i < rows && 8 * j < p.head_dim; ++i)
        fa_i_store8((uint16_t *)p.dq +
                        fa_i_dev_offset(&p.dq_layout, (int)(bh / p.heads_q), (int)(bh % p.heads_q),
                                        first + r + 8 * i) +
                        8 * j,
                    f + 8 * i, p.scale, bf16, p.head_dim - 8 * j);
}

/* A staged gradient into the caller's tensor (fa_i_grad_out), in fp32 with
   grads_f32, else in the dtype, added to what it holds with
   accumulate_grads; 8 elements of a row per thread (d % 8 == 0 here). */
static __global__ void fa_i_bwd_grads_out(const fa_params p, fa_i_grad_out a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, chunks = a.d / 8;
    const int64_t row = t / chunks, c = 8 * (t % chunks); /* row of [batch, seq, heads] */
    const int bf16 = p.dtype == FA_DTYPE_BF16;
    float x[8];
    int i;
    if (row >= (int64_t)a.batch * a.seq * a.heads) return;
    const int h = (int)(row % a.heads), s = (int)(row / a.heads % a.seq);
    const int64_t to = fa_i_dev_offset(&a.dst_layout, (int)(row / a.heads / a.seq), h, s) + c;
    const uint4 w = *(const uint4 *)(a.src + row * a.d + c);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    for (i = 0; i < 8; ++i) x[i] = fa_i_load16(u, i, bf16);
    if (p.grads_f32) {
        float4 *dst = (float4 *)((float *)a.dst + to);
        float4 lo = make_float4(x[0], x[1], x[2], x[3]), hi = make_float4(x[4], x[5], x[6], x[7]);
        if (p.accumulate_grads) {
            const float4 l0 = dst[0], h0 = dst[1];
            lo.x += l0.x, lo.y += l0.y, lo.z += l0.z, lo.w += l0.w;
            hi.x += h0.x, hi.y += h0.y, hi.z += h0.z, hi.w += h0.w;
        }
        dst[0] = lo, dst[1] = hi;
        return;
    }
    if (p.accumulate_grads) {
        const uint4 v = *(const uint4 *)((const uint16_t *)a.dst + to);
        const uint32_t o[4] = {v.x, v.y, v.z, v.w};
        for (i = 0; i < 8; ++i) x[i] += fa_i_load16(o, i, bf16);
    }
    fa_i_store8((uint16_t *)a.dst + to, x, 1.0f, bf16, 8);
}
#endif /* FA_I_HOST */

/* Per query row r0 + r (r < bm): the base-2 LSE, D and the key range (the
   rows' LSE at lse[row_base ...], their D at dsum[row_base ...]). A row
   past the end sees no key (hi 0) and starts where the last row does, so
   that the block's last row answers FA_I_TILE_MASKED without the length. */
static __device__ __forceinline__ void fa_i_bwd_row_facts_at(
    const fa_params *p, const float *lse_all, const float *dsum_all, int64_t row_base, int r0,
    float *slse, float *sdsum, int *slo, int *shi, int bm, int tid, int nthreads)
{
    int r;
    for (r = tid; r < bm; r += nthreads) {
        int lo = 0, hi = 0;
        float lse = -INFINITY, dsum = 0.0f;
        if (r0 + r < p->seqlen_q) {
            fa_i_key_range(p, r0 + r, &lo, &hi);
            lse = lse_all[row_base + r0 + r];
            dsum = dsum_all[row_base + r0 + r];
        } else {
            fa_i_key_range(p, p->seqlen_q - 1, &lo, &hi);
            hi = 0;
        }
        /* LSE = -inf marks an empty row; +inf makes its P = 2^(s - inf) = 0. */
        slse[r] = lse == -INFINITY ? INFINITY : lse * FA_I_LOG2E_F;
        sdsum[r] = dsum;
        slo[r] = lo;
        shi[r] = hi;
    }
}

/* The same for query head h of batch b of a dense problem. */
static __device__ __forceinline__ void fa_i_bwd_row_facts(
    const fa_params *p, const fa_i_bwd_args *a, int b, int h, int r0, float *slse, float *sdsum,
    int *slo, int *shi, int bm, int tid, int nthreads)
{
    const int64_t row_base = ((int64_t)b * p->heads_q + h) * p->seqlen_q;
    fa_i_bwd_row_facts_at(p, p->lse, a->dsum, row_base, r0, slse, sdsum, slo, shi, bm, tid,
                          nthreads);
}

/* Loads one step of the backward's query side: Q, dO (async) and, per row,
   the base-2 LSE, D and the key range. */
static __device__ __forceinline__ void fa_i_bwd_rows(
    const fa_params *p, const fa_i_bwd_args *a, int b, int h, int r0, uint16_t *sq, uint16_t *sdo,
    float *slse, float *sdsum, int *slo, int *shi, int bm, int d, int ld, int tid, int nthreads)
{
    fa_i_async_tile(sq, (const uint16_t *)p->q + fa_i_dev_offset(&p->q_layout, b, h, 0),
                    p->q_layout.seq, r0, p->seqlen_q, bm, d, p->head_dim, ld, tid, nthreads);
    fa_i_async_tile(sdo, (const uint16_t *)p->dout + fa_i_dev_offset(&p->dout_layout, b, h, 0),
                    p->dout_layout.seq, r0, p->seqlen_q, bm, d, p->head_dim_v, ld, tid, nthreads);
    fa_i_bwd_row_facts(p, a, b, h, r0, slse, sdsum, slo, shi, bm, tid, nthreads);
}

/* A dK/dV kernel's first loads, one commit group: its K and V tiles (bn
   keys from c0 of kv head hk, head dim d, V's first cols_v columns read,
   pitch FA_I_BWD_KV_PITCH(d)) and,
   if it has steps, the first step's query side (bm rows from r0 of the
   group's first query head, pitch FA_I_BWD_Q_PITCH(d)). */
static __device__ __forceinline__ void fa_i_bwd_first_loads(
    const fa_params *p, const fa_i_bwd_args *a, int b, int hk, int c0, int bn, int r0, int steps,
    uint16_t *sk, uint16_t *sv, uint16_t *sq, uint16_t *sdo, float *slse, float *sdsum, int *slo,
    int *shi, int bm, int d, int cols_v, int tid, int nthreads)
{
    fa_i_async_tile(sk, (const uint16_t *)p->k + fa_i_dev_offset(&p->k_layout, b, hk, 0),
                    p->k_layout.seq, c0, p->seqlen_k, bn, d, p->head_dim, FA_I_BWD_KV_PITCH(d), tid,
                    nthreads);
    fa_i_async_tile(sv, (const uint16_t *)p->v + fa_i_dev_offset(&p->v_layout, b, hk, 0),
                    p->v_layout.seq, c0, p->seqlen_k, bn, d, cols_v, FA_I_BWD_KV_PITCH(d), tid,
                    nthreads);
    if (steps > 0)
        fa_i_bwd_rows(p, a, b, hk * (p->heads_q / p->heads_kv), r0, sq, sdo, slse,
                      sdsum, slo, shi, bm, d, FA_I_BWD_Q_PITCH(d), tid, nthreads);
    fa_i_cp_async_commit();
}

#if FA_I_SM90 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The FA3 backward's Q and dO tiles of one 64-row block (chunks of 64
   columns each), completing on bar. */
static __device__ __forceinline__ void fa_i_fa3_bwd_load_rows(const fa_i_fa3_bwd_args *args,
                                                              uint32_t sq, uint32_t sdo,
                                                              uint32_t bar, int chunks, int r0,
                                                              int h, int b)
{
    int c;
    fa_i_mbar_expect_tx(bar, 2 * chunks * 64 * 128);
    for (c = 0; c < chunks; ++c) {
        fa_i_tma_load(sq + c * 64 * 128, &args->q, 64 * c, r0, h, b, bar, FA_I_L2_EVICT_NORMAL);
        fa_i_tma_load(sdo + c * 64 * 128, &args->dout, 64 * c, r0, h, b, bar,
                      FA_I_L2_EVICT_NORMAL);
    }
}
#endif
#endif /* >> backward common */

/* >> fa2 backward =============================================================
   FA2 paper's algorithm 2 with its parallelism over key blocks. */
#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_FA2_BWD_KV
#define FA_I_BWD(column) \
    FA_I_COL(FA2_BWD, column, FA_I_CAT(FA_I_CAT(FA_FA2_BWD_TILE_, FA_I_D), FA_I_CAT(_, FA_I_BWD_BUDGET)))
#if FA_I_BWD_DQ /* the atomic mode's kernel adds dQ: name suffix _dq */
#define FA_I_BWD_KNAME(stem) FA_I_CAT(FA_I_KNAME(FA_I_CAT(stem, _dq)), FA_I_CAT(_s, FA_I_BWD_BUDGET))
#else
#define FA_I_BWD_KNAME(stem) FA_I_CAT(FA_I_KNAME(stem), FA_I_CAT(_s, FA_I_BWD_BUDGET))
#endif
/* Whether a device that runs this pass's code can pick this budget's tile
   (fa_i_fa2_bwd_kv_kernel takes the largest that fits): compute capability
   8.x allows 163 KB at most (99 on 8.6 and 8.9, which run sm_80 code), 9.0
   227 KB. Elsewhere the kernel is a stub that traps; builds that act as a
   smaller device (FA_I_TEST_SMEM_OPTIN) keep every tile. */
#if !defined(__CUDA_ARCH__) || defined(FA_I_TEST_SMEM_OPTIN)
#define FA_I_BWD_HERE 1
#elif __CUDA_ARCH__ < 900
#define FA_I_BWD_HERE (FA_I_BWD_BUDGET != 227)
#elif __CUDA_ARCH__ == 900
#define FA_I_BWD_HERE (FA_I_BWD_BUDGET == 227 || (FA_I_BWD_BUDGET == 163 && !FA_I_FA2_BWD_HAS(227)))
#else
#define FA_I_BWD_HERE 1
#endif
/* The dK/dV kernel for one (head dim FA_I_D, dtype FA_I_DT, shared-memory
   budget FA_I_BWD_BUDGET: FA_FA2_BWD_TILE_<d>_<budget>) and mode: one CTA
   of 8 warps per (BN keys, kv head, batch) keeps dK, dV in registers
   (written out at the end through the K and V tiles, in whole rows); each
   step takes BM query rows of one query head and, if FA_I_BWD_DQ (the atomic mode), adds their
   dQ = dS K into the fp32 accumulator by vector atomics. The warps tile each
   product as FlashAttention-2 does, so that a fragment read from shared
   memory feeds several MMAs: S and dP as SW x 8/SW tiles of rows by keys,
   dV and dK as KW x 8/KW tiles of keys by d, dQ as QW x 8/QW tiles of rows by
   d; P and dS cross between the layouts through shared memory. Barriers per
   step: the step's inputs are in, P and dS are written, and where Q or dO
   has a single stage, a third once it is free: its next load then hides
   behind the rest (double-buffered inputs load a step ahead). */
/* Async copy of BM rows from r0 of head h of tensor q or dout (its first
   cols columns) into smem dst. */
#define FA_I_BWD_LOAD(dst, tensor, cols, h, r0)                                                 \
    fa_i_async_tile(dst, (const uint16_t *)p.tensor + fa_i_dev_offset(&p.tensor##_layout, b, h, 0), \
                    p.tensor##_layout.seq, r0, p.seqlen_q, BM, D, cols, LDQ, tid, NT)
/* V's columns: head_dim_v, but in the atomic mode's kernels on sm_90 and
   later, where a count of V's own on its load spills (DESIGN.md, head dims);
   there the backward with head_dim_v != head_dim runs on the FA3 kernel
   (fa_i_plan_backward). Builds acting as a smaller device keep the count
   (the tests run the pre-Hopper kernels' code on Hopper). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && FA_I_BWD_DQ && !defined(FA_I_TEST_SMEM_OPTIN)
#define FA_I_BWD_COLS_V p.head_dim
#else
#define FA_I_BWD_COLS_V p.head_dim_v
#endif
/* Every element (i, j) of a warp's S or dP tiles, and its row (of the step's
   BM) and key (from the CTA's first). */
#define FA_I_EACH_S(i, j)                                      \
    _Pragma("unroll") for (i = 0; i < SM / 16 * SN / 8; ++i) \
    _Pragma("unroll") for (j = 0; j < 4; ++j)
#define FA_I_S_ROW(i, j) (s_row + 16 * ((i) / (SN / 8)) + (lane >> 2) + 8 * ((j) >> 1))
#define FA_I_S_KEY(i, j) (s_key + 8 * ((i) % (SN / 8)) + 2 * (lane & 3) + ((j) & 1))
/* A warp's S-shaped tile c into the rows x keys smem tile dst as 16-bit. */
#define FA_I_STORE_S(dst, c)                                                             \
    _Pragma("unroll") for (i = 0; i < SM / 16 * SN / 8; ++i)                            \
    {                                                                                    \
        const int row_ = FA_I_S_ROW(i, 0), key_ = FA_I_S_KEY(i, 0);                      \
        *(uint32_t *)((dst) + row_ * LDP + key_) = FA_I_PACK((c)[i][0], (c)[i][1]);       \
        *(uint32_t *)((dst) + (row_ + 8) * LDP + key_) = FA_I_PACK((c)[i][2], (c)[i][3]); \
    }
static __global__ void __launch_bounds__(256, 1)
    FA_I_BWD_KNAME(fa_i_bwd_kv_fa2)(const fa_params p, const fa_i_bwd_args a)
{
#if FA_I_BWD_HERE
    enum {
        D = FA_I_D, BN = FA_I_BWD(KEYS), BM = FA_I_BWD(ROWS), QS = FA_I_BWD(QST),
        DOS = FA_I_BWD(DOST), SW = FA_I_BWD(SW), KW = FA_I_BWD(KVW), QW = FA_I_BWD(QW),
        BF16 = FA_I_IS_BF16,
        NT = 256, LDQ = FA_I_BWD_Q_PITCH(D), LDK = FA_I_BWD_KV_PITCH(D), LDP = BN + 8,
        SM = BM / SW, SN = BN / (8 / SW), /* a warp's tile of S and dP */
        KN = BN / KW, KD = D / (8 / KW),  /* of dV and dK */
        QM = BM / QW, QD = D / (8 / QW),  /* of dQ */
        DQP = FA_I_BWD_DQ_PARTS(D), QP = QD / DQP, /* dQ's parts and their columns */
        /* causal CTAs heavy first (fa_i_bwd_cta), but on the single-stage 128 x
           128 tile (d <= 64 on sm_80 budgets, 249 registers): its remapped
           indices spill */
        REORDER = !(QS == 1 && DOS == 1 && BM * BN >= 128 * 128)
    };
    static_assert(SM % 16 == 0 && SN % 16 == 0 && KN % 16 == 0 && KD % 16 == 0 && QM % 16 == 0 &&
                      QP % 16 == 0 && SM <= 64 && KN <= 64 && QM <= 64 && (QS == 1 || QS == 2) &&
                      (DOS == 1 || DOS == 2) && BM % 64 == 0 && 64 % QM == 0 &&
                      BN * (D / 8) % NT == 0,
                  "flashattn: backward warp tiles are multiples of 16, at most 64 rows; steps "
                  "of whole 64-row accumulator blocks; the epilogue's 16-byte pieces spread "
                  "evenly over the threads");
    extern __shared__ uint4 fa_i_smem[];
    uint16_t *sk = (uint16_t *)fa_i_smem, *sv = sk + BN * LDK, *sq = sv + BN * LDK;
    uint16_t *sdo = sq + QS * BM * LDQ, *sp = sdo + DOS * BM * LDQ, *sds = sp + BM * LDP;
    float *slse = (float *)(sds + BM * LDP), *sdsum = slse + 2 * BM;
    int *slo = (int *)(sdsum + 2 * BM), *shi = slo + 2 * BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int s_row = warp % SW * SM, s_key = warp / SW * SN; /* the warp's tiles' origins */
    const int kv_key = warp % KW * KN, kv_col = warp / KW * KD;
    const int q_row = warp % QW * QM, q_col = warp / QW * QD;
    /* this thread's first dQ fragment in a step's rows of the accumulator
       (fa_i_bwd_postprocess; a warp's rows stay in one 64-row block) */
    const int dq_rows = fa_i_dq_blocks(&p) * 64;
    const int dq_lane = q_row / 64 * 64 * D + q_row % 64 / 16 * 128 + q_col / 8 * 512 + 4 * lane;
    int kb, hk, b;
    fa_i_bwd_cta(&p, REORDER, &kb, &hk, &b);
    const int c0 = kb * BN;
    const int group = p.heads_q / p.heads_kv;
    const float log2_scale = p.softcap > 0.0f ? 1.0f : p.scale * FA_I_LOG2E_F;
    float dk[KN / 16 * KD / 8][4], dv[KN / 16 * KD / 8][4];
    int first, last, blocks, steps, t, i, j;
    int sh = 0, sb = 0; /* step t's head of the group and block */

    fa_i_rows_seeing_keys(&p, c0, min(c0 + BN, p.seqlen_k), &first, &last);
    blocks = first <= last ? last / BM - first / BM + 1 : 0;
    steps = group * blocks; /* (query head, query block) pairs, in order */
    fa_i_zero_acc(dk, KN / 16 * KD / 8);
    fa_i_zero_acc(dv, KN / 16 * KD / 8);

    fa_i_bwd_first_loads(&p, &a, b, hk, c0, BN, (first / BM) * BM, steps, sk, sv, sq, sdo, slse,
                         sdsum, slo, shi, BM, D, FA_I_BWD_COLS_V, tid, NT);
    for (t = 0; t < steps; ++t) {
        const int stage = t & 1, h = hk * group + sh, r0 = (first / BM + sb) * BM;
        const uint16_t *sqt = sq + (QS == 2 ? stage : 0) * BM * LDQ;
        const uint16_t *sdot = sdo + (DOS == 2 ? stage : 0) * BM * LDQ;
        const float *lse2 = slse + stage * BM, *dsum = sdsum + stage * BM;
        const int *lo = slo + stage * BM, *hi = shi + stage * BM;
        int h_next = 0, r_next = 0;
        /* After this barrier step t is in smem and every warp is done with
           step t - 1: its P, dS, and the other stage of the inputs. */
        fa_i_cp_async_wait_0();
        __syncthreads();
        if (t + 1 < steps) {
            fa_i_bwd_step(sh, sb, 1, blocks, hk * group, first / BM, BM, &h_next, &r_next);
            fa_i_bwd_row_facts(&p, &a, b, h_next, r_next, slse + (stage ^ 1) * BM,
                               sdsum + (stage ^ 1) * BM, slo + (stage ^ 1) * BM,
                               shi + (stage ^ 1) * BM, BM, tid, NT);
            if (QS == 2) FA_I_BWD_LOAD(sq + (stage ^ 1) * BM * LDQ, q, p.head_dim, h_next, r_next);
            if (DOS == 2) FA_I_BWD_LOAD(sdo + (stage ^ 1) * BM * LDQ, dout, p.head_dim_v, h_next, r_next);
        }
        fa_i_cp_async_commit();
        { /* S = Q K^T and dP = dO V^T on this warp's tile, then P and dS to smem */
            float s[SM / 16 * SN / 8][4], dp[SM / 16 * SN / 8][4];
            const int masked = FA_I_TILE_MASKED(hi[0], lo[BM - 1], c0, c0 + BN);
            fa_i_zero_acc(s, SM / 16 * SN / 8);
            fa_i_zero_acc(dp, SM / 16 * SN / 8);
            fa_i_warp_gemm(s, SM / 16, SN / 16, D, sqt + s_row * LDQ, LDQ, 0, sk + s_key * LDK,
                           LDK, 0, 0, BF16);
            /* P before dP's product, so that the exponentials can overlap its
               MMAs. Softcap and mask are uniform branches around their own
               loops, so the common loop has neither. */
            if (p.softcap > 0.0f) FA_I_EACH_S(i, j) s[i][j] = fa_i_score(&p, s[i][j]);
            if (masked)
                FA_I_EACH_S(i, j) {
                    const int row = FA_I_S_ROW(i, j), key = c0 + FA_I_S_KEY(i, j);
                    if ((key < lo[row]) | (key >= hi[row])) s[i][j] = -INFINITY; /* no branches */
                }
            FA_I_EACH_S(i, j) s[i][j] = fa_i_dev_exp2(fmaf(s[i][j], log2_scale, -lse2[FA_I_S_ROW(i, j)]));
            FA_I_STORE_S(sp, s);
            fa_i_warp_gemm(dp, SM / 16, SN / 16, D, sdot + s_row * LDQ, LDQ, 0, sv + s_key * LDK,
                           LDK, 0, 0, BF16);
            FA_I_EACH_S(i, j) dp[i][j] = s[i][j] * (dp[i][j] - dsum[FA_I_S_ROW(i, j)]);
            if (p.softcap > 0.0f) /* d(c tanh(x / c)) = (1 - tanh^2) dx, tanh from P */
                FA_I_EACH_S(i, j) {
                    const float th = fa_i_capped_tanh(&p, s[i][j], lse2[FA_I_S_ROW(i, j)]);
                    dp[i][j] *= 1.0f - th * th;
                }
            FA_I_STORE_S(sds, dp);
        }
        __syncthreads();
        /* dV += P^T dO, dK += dS^T Q on this warp's keys and columns. A single
           stage of dO, then of Q, is free after its product: the next step's
           load goes in behind a barrier and hides behind the rest. */
        fa_i_warp_gemm(dv, KN / 16, KD / 16, BM, sp + kv_key, LDP, 1, sdot, LDQ, kv_col, 1, BF16);
        if (DOS == 1 && QS == 2) {
            __syncthreads();
            if (t + 1 < steps) FA_I_BWD_LOAD(sdo, dout, p.head_dim_v, h_next, r_next);
            fa_i_cp_async_commit();
        }
        fa_i_warp_gemm(dk, KN / 16, KD / 16, BM, sds + kv_key, LDP, 1, sqt, LDQ, kv_col, 1, BF16);
        if (QS == 1) {
            __syncthreads();
            if (t + 1 < steps) {
                FA_I_BWD_LOAD(sq, q, p.head_dim, h_next, r_next);
                if (DOS == 1) FA_I_BWD_LOAD(sdo, dout, p.head_dim_v, h_next, r_next);
            }
            fa_i_cp_async_commit();
        }
        if (FA_I_BWD_DQ) { /* dQ += dS K on this warp's rows and columns, a fragment's 4 floats
                              in one 16-byte piece of the tiled accumulator; in DQP parts of
                              QP columns */
            float *acc = a.dq_acc + ((int64_t)(b * p.heads_q + h) * dq_rows + r0) * D + dq_lane;
#pragma unroll
            for (j = 0; j < DQP; ++j) {
                float dq[QM / 16 * QP / 8][4];
                fa_i_zero_acc(dq, QM / 16 * QP / 8);
                fa_i_warp_gemm(dq, QM / 16, QP / 16, BN, sds + q_row * LDP, LDP, 0, sk, LDK,
                               q_col + j * QP, 1, BF16);
#pragma unroll
                for (i = 0; i < QM / 16 * QP / 8; ++i)
                    fa_i_red_add4(acc + 128 * (i / (QP / 8)) + 512 * (i % (QP / 8) + j * QP / 8),
                                  make_float4(dq[i][0], dq[i][1], dq[i][2], dq[i][3]));
            }
        }
        FA_I_BWD_ADVANCE(sh, sb, blocks);
    }
    fa_i_cp_async_wait_0();
    __syncthreads(); /* every warp is done with K and V: dK and dV go over them */
    {
        int x; /* the thread's index, read again below */
        uint16_t *gdk = (uint16_t *)p.dk + fa_i_dev_offset(&p.dk_layout, b, hk, 0);
        uint16_t *gdv = (uint16_t *)p.dv + fa_i_dev_offset(&p.dv_layout, b, hk, 0);
#pragma unroll
        for (i = 0; i < KN / 16 * KD / 8; ++i) {
            const int key = kv_key + 16 * (i / (KD / 8)) + (lane >> 2);
            const int col = kv_col + 8 * (i % (KD / 8)) + 2 * (lane & 3);
            *(uint32_t *)(sk + key * LDK + col) = FA_I_PACK(dk[i][0] * p.scale, dk[i][1] * p.scale);
            *(uint32_t *)(sk + (key + 8) * LDK + col) = FA_I_PACK(dk[i][2] * p.scale, dk[i][3] * p.scale);
            *(uint32_t *)(sv + key * LDK + col) = FA_I_PACK(dv[i][0], dv[i][1]);
            *(uint32_t *)(sv + (key + 8) * LDK + col) = FA_I_PACK(dv[i][2], dv[i][3]);
        }
        __syncthreads();
        /* Whole rows out in 16-byte pieces. Addressed from `tid`, this part
           kept values alive through the loop, and the 227 KB tile at d = 256
           spilled at sm_90a. */
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(x));
#pragma unroll
        for (i = 0; i < BN * (D / 8) / NT; ++i) {
            const int key = (i * NT + x) / (D / 8), col = 8 * ((i * NT + x) % (D / 8));
            if (c0 + key < p.seqlen_k && col < p.head_dim)
                fa_i_copy8_part(gdk + (int64_t)(c0 + key) * p.dk_layout.seq + col,
                                sk + key * LDK + col, p.head_dim - col);
            if (c0 + key < p.seqlen_k && col < p.head_dim_v)
                fa_i_copy8_part(gdv + (int64_t)(c0 + key) * p.dv_layout.seq + col,
                                sv + key * LDK + col, p.head_dim_v - col);
        }
    }
#else
    __trap(); /* fa_i_fa2_bwd_kv_kernel never picks this tile on this arch */
#endif
}
#undef FA_I_EACH_S
#undef FA_I_S_ROW
#undef FA_I_S_KEY
#undef FA_I_STORE_S
#undef FA_I_BWD_LOAD
#undef FA_I_BWD_COLS_V

/* ======================================================================== */
#undef FA_I_BWD
#undef FA_I_BWD_KNAME
#undef FA_I_BWD_HERE
#endif /* FA_I_PASS_FA2_BWD_KV */

/* The deterministic mode's dQ: one CTA per query block (FA_FA2_BWDQ_TILE_<d>),
   dQ = sum over the key blocks of dS K, in registers, no atomics. */
#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_FA2_BWD_Q
#define FA_I_BWDQ(column) FA_I_COL(FA2_BWDQ, column, FA_I_CAT(FA_FA2_BWDQ_TILE_, FA_I_D))
static __global__ void __launch_bounds__(32 * FA_I_BWDQ(WARPS))
    FA_I_KNAME(fa_i_bwd_q_fa2)(const fa_params p, const fa_i_bwd_args a)
{
    enum {
        D = FA_I_D, BM = FA_I_BWDQ(ROWS), BN = FA_I_BWDQ(KEYS), NT = 32 * FA_I_BWDQ(WARPS),
        LD = FA_I_PITCH(D), BF16 = FA_I_IS_BF16
    };
    extern __shared__ uint4 fa_i_smem[];
    uint16_t *sq = (uint16_t *)fa_i_smem, *sdo = sq + BM * LD, *sk = sdo + BM * LD;
    uint16_t *sv = sk + 2 * BN * LD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int m0, h, b;
    fa_i_query_cta(&p, &m0, &h, &b);
    m0 *= BM;
    const int hk = h / (p.heads_q / p.heads_kv);
    const int last = min(m0 + BM, p.seqlen_q) - 1;
    const int row0 = m0 + warp * 16 + (lane >> 2), row1 = row0 + 8;
    const int64_t row_base = ((int64_t)b * p.heads_q + h) * p.seqlen_q;
    const uint16_t *gk = (const uint16_t *)p.k + fa_i_dev_offset(&p.k_layout, b, hk, 0);
    const uint16_t *gv = (const uint16_t *)p.v + fa_i_dev_offset(&p.v_layout, b, hk, 0);
    const float log2_scale = p.softcap > 0.0f ? 1.0f : p.scale * FA_I_LOG2E_F;
    float dq[D / 8][4], lse2[2], dsum[2];
    int lo[2], hi[2], first_lo, last_hi, all_lo, all_hi, n, n_first, n_end, i, j;
    for (i = 0; i < 2; ++i) {
        const int r = i ? row1 : row0;
        const float lse = r < p.seqlen_q ? p.lse[row_base + r] : -INFINITY;
        lse2[i] = lse == -INFINITY ? INFINITY : lse * FA_I_LOG2E_F;
        dsum[i] = r < p.seqlen_q ? a.dsum[row_base + r] : 0.0f;
        fa_i_key_range(&p, r, &lo[i], &hi[i]);
    }
    fa_i_rows_key_span(&p, m0, last + 1, &first_lo, &last_hi);
    fa_i_rows_common_keys(&p, m0, last + 1, &all_lo, &all_hi);
    n_first = first_lo / BN;
    n_end = (last_hi + BN - 1) / BN;
    fa_i_zero_acc(dq, D / 8);

    fa_i_async_tile(sq, (const uint16_t *)p.q + fa_i_dev_offset(&p.q_layout, b, h, 0),
                    p.q_layout.seq, m0, p.seqlen_q, BM, D, p.head_dim, LD, tid, NT);
    fa_i_async_tile(sdo, (const uint16_t *)p.dout + fa_i_dev_offset(&p.dout_layout, b, h, 0),
                    p.dout_layout.seq, m0, p.seqlen_q, BM, D, p.head_dim_v, LD, tid, NT);
    if (n_first < n_end)
        fa_i_async_kv(sk, sv, gk, gv, &p, NULL, n_first * BN, BN, D, p.head_dim, p.head_dim_v, LD,
                      tid, NT);
    fa_i_cp_async_commit();
    for (n = n_first; n < n_end; ++n) {
        const int stage = (n - n_first) & 1, c0 = n * BN;
        const uint16_t *skt = sk + stage * BN * LD, *svt = sv + stage * BN * LD;
        float s[BN / 8][4], dp[BN / 8][4];
        fa_i_cp_async_wait_0(); /* one barrier per block, as in the forward */
        __syncthreads();
        if (n + 1 < n_end) {
            fa_i_async_kv(sk + (stage ^ 1) * BN * LD, sv + (stage ^ 1) * BN * LD, gk, gv, &p, NULL,
                          c0 + BN, BN, D, p.head_dim, p.head_dim_v, LD, tid, NT);
        }
        fa_i_cp_async_commit();
        /* S = Q K^T, dP = dO V^T */
        fa_i_zero_acc(s, BN / 8);
        fa_i_zero_acc(dp, BN / 8);
        fa_i_warp_gemm(s, 1, BN / 16, D, sq + warp * 16 * LD, LD, 0, skt, LD, 0, 0, BF16);
        fa_i_warp_gemm(dp, 1, BN / 16, D, sdo + warp * 16 * LD, LD, 0, svt, LD, 0, 0, BF16);
        /* dS = P (dP - D), with softcap and mask in their own uniform branches. */
        if (p.softcap > 0.0f)
#pragma unroll
            for (i = 0; i < BN / 8; ++i)
#pragma unroll
                for (j = 0; j < 4; ++j) s[i][j] = fa_i_score(&p, s[i][j]);
        if (FA_I_TILE_MASKED(all_hi, all_lo, c0, c0 + BN))
#pragma unroll
            for (i = 0; i < BN / 8; ++i)
#pragma unroll
                for (j = 0; j < 4; ++j) {
                    const int col = c0 + i * 8 + 2 * (lane & 3) + (j & 1), r = j >> 1;
                    if (col < lo[r] || col >= hi[r]) s[i][j] = -INFINITY;
                }
#pragma unroll
        for (i = 0; i < BN / 8; ++i)
#pragma unroll
            for (j = 0; j < 4; ++j) {
                s[i][j] = fa_i_dev_exp2(fmaf(s[i][j], log2_scale, -lse2[j >> 1]));
                dp[i][j] = s[i][j] * (dp[i][j] - dsum[j >> 1]);
            }
        if (p.softcap > 0.0f) /* d(c tanh(x / c)) = (1 - tanh^2) dx, tanh from P */
#pragma unroll
            for (i = 0; i < BN / 8; ++i)
#pragma unroll
                for (j = 0; j < 4; ++j) {
                    const float th = fa_i_capped_tanh(&p, s[i][j], lse2[j >> 1]);
                    dp[i][j] *= 1.0f - th * th;
                }
#pragma unroll
        for (i = 0; i < BN / 16; ++i) { /* dQ += dS K */
            uint32_t ads[4];
            FA_I_ACC_AS_A(ads, dp, i);
#pragma unroll
            for (j = 0; j < D / 16; ++j) {
                uint32_t bk[4];
                FA_I_LOAD_B_KN(bk, skt, LD, i * 16, j * 16);
                FA_I_MMA(dq[2 * j], ads, bk[0], bk[1]);
                FA_I_MMA(dq[2 * j + 1], ads, bk[2], bk[3]);
            }
        }
    }
    fa_i_cp_async_wait_0();
    {
        uint16_t *gdq = (uint16_t *)p.dq + fa_i_dev_offset(&p.dq_layout, b, h, 0);
#pragma unroll
        for (i = 0; i < D / 8; ++i) {
            const int col = i * 8 + 2 * (lane & 3);
            if (row0 < p.seqlen_q)
                fa_i_store_pair(gdq + row0 * p.dq_layout.seq, col, p.head_dim,
                                FA_I_PACK(dq[i][0] * p.scale, dq[i][1] * p.scale));
            if (row1 < p.seqlen_q)
                fa_i_store_pair(gdq + row1 * p.dq_layout.seq, col, p.head_dim,
                                FA_I_PACK(dq[i][2] * p.scale, dq[i][3] * p.scale));
        }
    }
}

#undef FA_I_BWDQ
#endif /* FA_I_PASS_FA2_BWD_Q */

/* >> fa3 backward =============================================================
   Hopper, one kernel per (head dim, dtype): FA_FA3_BWD_TILE_<d>, dQ by bulk
   reduce-adds (the atomic mode).

   One CTA of two warpgroups per (KEYS keys, kv head, batch): at d = 64 and
   128 warpgroup w owns keys 64 w ... 64 w + 63 of 128, their dK and dV in
   registers; at d = 256 both take the same 64 keys
   (both compute S^T and dP^T) and w owns columns 128 w ... of their dK and
   dV. The CTA walks the 64-row query blocks that see its keys (of each
   query head of the group), Q and dO double-buffered by TMA (one buffer at
   d = 256): block n + STAGES's load is issued into block n's buffer by
   whichever warpgroup is done with it last, counted in `released`. Per
   block:
     S^T = K Q^T, dP^T = V dO^T              SS wgmma, 64 keys x 64 rows
     P^T = 2^(S^T - LSE), dS^T = P^T (dP^T - D)
     dV += P^T dO, dK += dS^T Q              RS wgmma, P^T and dS^T from registers
     dS^T to shared memory, barrier
     d = 128: dQ[:, 64 w ...] = dS K[:, 64 w ...] over all 128 keys
     d = 256: the same for columns 128 w ... in two 64-column parts
     d = 64:  dQ += dS_w K_w, over the warpgroup's own 64 keys
                                             SS wgmma, both operands transposed
   (a 64 x 128 dQ block per warpgroup would not fit in its registers at d =
   128, and 32-column halves do not fit the swizzle at d = 64). Each
   warpgroup's dQ part leaves through its own 16 KB of shared memory in the
   tiled order (fa_i_bwd_postprocess): its thread 0 adds it into the fp32
   accumulator with one bulk reduce-add that runs while the next block
   computes. A thread holds accumulator rows (keys) r and r + 8, r = 16 *
   warp + lane / 4, columns 8 (i / 4) + 2 (lane % 4) + i % 2
   (FA_I_FA3_COL). Shared tiles are [d / 64][rows][64] with the 128-byte
   swizzle; dS^T is [keys][64 rows]. */
#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_FA3_BWD
#define FA_I_FA3B(column) FA_I_COL(FA3_BWD, column, FA_I_CAT(FA_FA3_BWD_TILE_, FA_I_D))
/* dQ parts of 64 columns per warpgroup and block: d = 64 splits dQ by keys */
#define FA_I_FA3_BWD_DQ_PARTS(d) ((d) == 256 ? 2 : 1)
static_assert(FA_I_D == 64 || FA_I_D == 128 || FA_I_D == 256,
              "flashattn: the FA3 backward takes d = 64, 128 or 256");
static_assert((FA_I_FA3B(KEYS) == 128 && FA_I_D <= 128) || (FA_I_FA3B(KEYS) == 64 && FA_I_D == 256),
              "flashattn: FA3 backward KEYS is 128 (d <= 128: a warpgroup per 64 keys) or 64 "
              "(d = 256: both warpgroups on all keys, d split)");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_I_WGMMA_NT FA_I_CAT(FA_I_CAT(fa_i_wgmma_ss_, FA_I_DT), _n64)
#if FA_I_FA3B(KEYS) == 64 /* each warpgroup's dK, dV columns */
#define FA_I_WGMMA_DKV FA_I_CAT(fa_i_wgmma_rs_, FA_I_CAT(FA_I_DT, _n128))
#else
#define FA_I_WGMMA_DKV FA_I_CAT(FA_I_CAT(fa_i_wgmma_rs_, FA_I_DT), FA_I_CAT(_n, FA_I_D))
#endif
#define FA_I_WGMMA_DQ FA_I_CAT(FA_I_CAT(fa_i_wgmma_sst_, FA_I_DT), _n64)

#if !FA_I_BWD_VARLEN /* helpers both instances use, made by the first */
/* Issues acc = A B^T over d: A the 64 rows at a of a [d / 64][a_rows][64]
   tile, B a [d / 64][64][64] tile (no commit). */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_fa3_bwd_nt)(float *acc, uint32_t a,
                                                                      int a_rows, uint32_t b)
{
    FA_I_SM90_GEMM_NT(FA_I_WGMMA_NT, acc, a, a_rows, b, 64);
}

/* Issues acc += A B: A (64 keys x 64 rows) from registers in 16-bit pairs, B
   the [d / 64][64 rows][64] tile of dO or Q (no commit). */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_fa3_bwd_rs)(float *acc,
                                                                      const uint32_t *a, uint32_t b)
{
    FA_I_SM90_GEMM_RS(FA_I_WGMMA_DKV, acc, a, b, 64, 64);
}

/* Issues acc = dS K_c (64 rows x 64 columns of d) over `keys` keys: dS^T at
   ds ([keys][64 rows]), K's column chunk at kc ([keys][64]) (no commit). */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_fa3_bwd_dq)(float *acc, uint32_t ds,
                                                                      uint32_t kc, int keys)
{
    enum { BN = FA_I_FA3B(KEYS) };
    const uint64_t ad = fa_i_wgmma_desc(ds, BN * 128, 1024);
    const uint64_t bd = fa_i_wgmma_desc(kc, BN * 128, 1024);
    int k;
#pragma unroll
    for (k = 0; k < keys / 16; ++k) /* 16 keys of 128 bytes per k16 step */
        FA_I_WGMMA_DQ(acc, fa_i_desc_add(ad, k * 2048), fa_i_desc_add(bd, k * 2048), k > 0);
}
#endif
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* Varlen: the schedule's index of the CTA's sequence (grid x: its key blocks). */
#define FA_I_BWD_SEQ_INDEX(args) ((args).key_blocks[blockIdx.x].x)
#if FA_I_BWD_VARLEN
/* The varlen instance (fa_i_bwd_fa3_<dt>_d<d>_varlen): the CTA's sequence's
   problem (lengths and bottom-right positions, dK and dV from its first
   key) in *v, *maps the tensor maps its rows are in (batch coordinate 0).
   Looked up where used, not held in registers over the kernel. The dense
   instance reads p and args as they are: the view as a run-time choice
   slowed the dense backward (DESIGN.md, ragged batches). */
static __device__ __forceinline__ void FA_I_KNAME(fa_i_fa3_bwd_view)(
    const fa_params *p, const fa_i_fa3_bwd_args *args, int s, fa_params *v,
    const fa_i_fa3_bwd_args **maps)
{
    const int64_t es = 2; /* 16-bit gradients */
    const fa_i_fa3_seq *e = args->seqs + s;
    *v = *p;
    v->seqlen_q = e->nq;
    v->seqlen_k = e->nk;
    fa_i_bottom_right(v);
    v->dk = (char *)v->dk + e->k0 * v->dk_layout.seq * es;
    v->dv = (char *)v->dv + e->k0 * v->dv_layout.seq * es;
    *maps = args->seq_maps + s;
}
#define FA_I_BWD_FA3_NAME FA_I_CAT(FA_I_KNAME(fa_i_bwd_fa3), _varlen)
#define FA_I_BWD_SEQ v         /* the CTA's problem */
#define FA_I_BWD_MAPS maps     /* its tensor maps */
#define FA_I_BWD_VIEW() FA_I_KNAME(fa_i_fa3_bwd_view)(&p, &args, seq, &v, &maps)
/* the row facts of (head h, first row r0) into buffer i: LSE and D [Hq, total_q] */
#define FA_I_BWD_FA3_ROW_FACTS(h, r0, i, tid, nthreads)                                     \
    fa_i_bwd_row_facts_at(&v, p.lse, args.a.dsum,                                         \
                          (int64_t)(h) * args.total_q + args.seqs[seq].q0, r0, slse[i],     \
                          sdsum[i], slo[i], shi[i], BM, tid, nthreads)
#else
#define FA_I_BWD_FA3_NAME FA_I_KNAME(fa_i_bwd_fa3)
#define FA_I_BWD_SEQ p
#define FA_I_BWD_MAPS (&args)
#define FA_I_BWD_VIEW() ((void)0)
#define FA_I_BWD_FA3_ROW_FACTS(h, r0, i, tid, nthreads) \
    fa_i_bwd_row_facts(&p, &args.a, b, h, r0, slse[i], sdsum[i], slo[i], shi[i], BM, tid, nthreads)
#endif

static __global__ void __launch_bounds__(256, 1)
    FA_I_BWD_FA3_NAME(const fa_params p, const __grid_constant__ fa_i_fa3_bwd_args args)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    enum {
        D = FA_I_D, BN = FA_I_FA3B(KEYS), BM = 64, CHUNKS = D / 64,
        STAGES = FA_I_FA3B(STAGES), /* Q and dO buffers */
        KV_BYTES = BN * D * 2, ROWS_BYTES = BM * D * 2, DS_BYTES = BN * BM * 2,
        SHARED_KEYS = BN == 64,  /* d = 256: both warpgroups on all keys, d split */
        DW = SHARED_KEYS ? D / 2 : D, /* dK and dV columns per warpgroup */
        DQ_BY_KEYS = D == 64,    /* see above */
        DQ_PARTS = FA_I_FA3_BWD_DQ_PARTS(FA_I_D),
        DQ_BYTES = BM * 64 * 4   /* one dQ part */
    };
    /* kv_full, then rows_full per buffer (Q and dO of one block). Only this
       sm_90a body has static shared memory (see fa_i_fa3_ready). */
    __shared__ __align__(8) uint64_t bars[3];
    __shared__ int released[2]; /* warpgroups done with a buffer's block */
    __shared__ float slse[2][BM], sdsum[2][BM];
    __shared__ int slo[2][BM], shi[2][BM];
    extern __shared__ uint4 fa_i_smem[];
    const uint32_t sk = (fa_i_smem_addr(fa_i_smem) + 1023) & ~1023u, sv = sk + KV_BYTES;
    const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * ROWS_BYTES;
    const uint32_t sds = sdo + STAGES * ROWS_BYTES;
    const uint32_t kv_full = fa_i_smem_addr(bars), rows_full = kv_full + 8;
    const int tid = threadIdx.x, w = tid >> 7, t = tid & 127, warp = t >> 5, lane = tid & 31;
    const uint32_t sdq = sds + 2 * DS_BYTES + w * DQ_PARTS * DQ_BYTES; /* this warpgroup's */
    /* the CTA's keys: block x of its sequence (varlen) or of batch z */
    const int c0 = FA_I_BWD_VARLEN ? args.key_blocks[blockIdx.x].y : blockIdx.x * BN;
    const int hk = blockIdx.y;
    const int b = FA_I_BWD_VARLEN ? 0 : blockIdx.z;
    const int group = p.heads_q / p.heads_kv;
    const int q_blocks = FA_I_BWD_VARLEN ? args.acc_blocks : fa_i_dq_blocks(&p);
#if FA_I_BWD_VARLEN
    /* the CTA's sequence (its index and dQ block held, its problem looked up
       where it is used) */
    const int seq = FA_I_BWD_SEQ_INDEX(args);
    fa_params v;
    const fa_i_fa3_bwd_args *maps;
#endif
    const int keys_w = SHARED_KEYS ? 0 : 64 * w, cols_w = SHARED_KEYS ? DW * w : 0;
    const int key0 = keys_w + 16 * warp + (lane >> 2); /* and key0 + 8, of the CTA's keys */
    const float log2_scale = p.softcap > 0.0f ? 1.0f : p.scale * FA_I_LOG2E_F;
    float dk[DW / 2], dv[DW / 2];
    int first, last, blocks, steps, step, i, h_at, r_at;
    int sh = 0, sb = 0; /* this step's head of the group and block */

#if FA_I_BWD_VARLEN
    if (seq < 0) return; /* past a schedule made on the device */
    const int acc0 = args.seqs[seq].acc0;
#else
    const int acc0 = 0;
#endif
    FA_I_BWD_VIEW();
    fa_i_rows_seeing_keys(&FA_I_BWD_SEQ, c0, min(c0 + BN, FA_I_BWD_SEQ.seqlen_k), &first, &last);
    blocks = first <= last ? last / BM - first / BM + 1 : 0;
    steps = group * blocks; /* (query head, query block) pairs, in order */
    /* h_at, r_at: the query head and first row of the step `ahead` after this one */
#define FA_I_STEP_AT(ahead) \
    fa_i_bwd_step(sh, sb, ahead, blocks, hk * group, first / BM, BM, &h_at, &r_at)
#define FA_I_FA3_COL(i) (8 * ((i) >> 2) + 2 * (lane & 3) + ((i) & 1))
    if (tid == 0) {
        fa_i_mbar_init(kv_full, 1);
        for (i = 0; i < 2; ++i) {
            fa_i_mbar_init(rows_full + 8 * i, 1);
            released[i] = 0;
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid == 0 && steps > 0) {
        int c;
        if (FA_I_BWD_VARLEN) { /* maps the host copied into the workspace (see the forward's) */
            fa_i_tma_map_acquire(&FA_I_BWD_MAPS->q);
            fa_i_tma_map_acquire(&FA_I_BWD_MAPS->k);
            fa_i_tma_map_acquire(&FA_I_BWD_MAPS->v);
            fa_i_tma_map_acquire(&FA_I_BWD_MAPS->dout);
        }
        fa_i_tma_prefetch(&FA_I_BWD_MAPS->q);
        fa_i_tma_prefetch(&FA_I_BWD_MAPS->dout);
        fa_i_mbar_expect_tx(kv_full, 2 * KV_BYTES);
        for (c = 0; c < CHUNKS; ++c) {
            fa_i_tma_load(sk + c * BN * 128, &FA_I_BWD_MAPS->k, 64 * c, c0, hk, b, kv_full,
                          FA_I_L2_EVICT_NORMAL);
            fa_i_tma_load(sv + c * BN * 128, &FA_I_BWD_MAPS->v, 64 * c, c0, hk, b, kv_full,
                          FA_I_L2_EVICT_NORMAL);
        }
        for (i = 0; i < STAGES && i < steps; ++i) {
            FA_I_STEP_AT(i);
            fa_i_fa3_bwd_load_rows(FA_I_BWD_MAPS, sq + i * ROWS_BYTES, sdo + i * ROWS_BYTES,
                                    rows_full + 8 * i, CHUNKS, r_at, h_at, b);
        }
    }
    /* Row facts of step n go to buffer n % 2 after the barrier of step n - 2
       (whose readers are done with it) and are read after that of n - 1. */
    for (i = 0; i < 2 && i < steps; ++i) {
        FA_I_STEP_AT(i);
        FA_I_BWD_FA3_ROW_FACTS(h_at, r_at, i, tid, 256);
    }
#pragma unroll
    for (i = 0; i < DW / 2; ++i) dk[i] = dv[i] = 0.0f;
    __syncthreads();
    if (steps > 0) fa_i_mbar_wait(kv_full, 0);
    for (step = 0; step < steps; ++step) {
        /* buf: this step's Q/dO buffer; rb: its dS^T and row facts buffer */
        const int buf = step % STAGES, rb = step & 1;
        const int h = hk * group + sh, r0 = (first / BM + sb) * BM;
        const uint32_t sqt = sq + buf * ROWS_BYTES, sdot = sdo + buf * ROWS_BYTES;
        const uint32_t sdst = sds + rb * DS_BYTES;
        const float *lse2 = slse[rb], *dsum = sdsum[rb];
        float s[32], dp[32], dq[32];
        uint32_t pr[16], dsr[16];
        int j;
        fa_i_mbar_wait(rows_full + 8 * buf, (uint32_t)((step / STAGES) & 1));
        fa_i_wgmma_fence();
        FA_I_KNAME(fa_i_fa3_bwd_nt)(s, sk + keys_w * 128, BN, sqt);
        fa_i_wgmma_commit();
        FA_I_KNAME(fa_i_fa3_bwd_nt)(dp, sv + keys_w * 128, BN, sdot);
        fa_i_wgmma_commit();
        FA_I_WGMMA_WAIT(1);
        fa_i_fence_f32(s, 32);
        /* P^T; softcap and mask in uniform branches around their own loops */
        if (p.softcap > 0.0f)
#pragma unroll
            for (i = 0; i < 32; ++i) s[i] = fa_i_score(&p, s[i]);
        if (FA_I_TILE_MASKED(shi[rb][0], slo[rb][BM - 1], c0 + keys_w, c0 + keys_w + 64))
#pragma unroll
            for (i = 0; i < 32; ++i) {
                const int r = FA_I_FA3_COL(i), key = c0 + key0 + 8 * ((i >> 1) & 1);
                if (key < slo[rb][r] || key >= shi[rb][r]) s[i] = -INFINITY;
            }
#pragma unroll
        for (i = 0; i < 32; ++i)
            s[i] = fa_i_dev_exp2(fmaf(s[i], log2_scale, -lse2[FA_I_FA3_COL(i)]));
        FA_I_WGMMA_WAIT(0);
        fa_i_fence_f32(dp, 32);
#pragma unroll
        for (i = 0; i < 32; ++i) dp[i] = s[i] * (dp[i] - dsum[FA_I_FA3_COL(i)]);
        if (p.softcap > 0.0f) /* d(c tanh(x / c)) = (1 - tanh^2) dx, tanh from P */
#pragma unroll
            for (i = 0; i < 32; ++i) {
                const float th = fa_i_capped_tanh(&p, s[i], lse2[FA_I_FA3_COL(i)]);
                dp[i] *= 1.0f - th * th;
            }
#pragma unroll
        for (i = 0; i < 16; ++i) {
            pr[i] = FA_I_PACK(s[2 * i], s[2 * i + 1]);
            dsr[i] = FA_I_PACK(dp[2 * i], dp[2 * i + 1]);
        }
        fa_i_wgmma_fence();
        FA_I_KNAME(fa_i_fa3_bwd_rs)(dv, pr, sdot + (cols_w / 64) * BM * 128);
        FA_I_KNAME(fa_i_fa3_bwd_rs)(dk, dsr, sqt + (cols_w / 64) * BM * 128);
        fa_i_wgmma_commit();
#pragma unroll
        for (i = 0; i < 16; ++i) { /* dS^T for dQ, swizzled like the TMA tiles */
            const int key = key0 + 8 * (i & 1), col = 8 * (i >> 1);
            if (SHARED_KEYS && (i >> 3) != w) continue; /* the same dS^T: half each */
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdst + key * 128 +
                                                          (((col >> 3) ^ (key & 7)) << 4) +
                                                          4 * (lane & 3)),
                         "r"(dsr[i])
                         : "memory");
        }
        fa_i_fence_proxy_async();
        if (t == 0) fa_i_tma_store_wait_read(); /* the last block's dQ has left sdq */
        /* Everyone's dS^T is in, and everyone is past this step's softmax,
           so its row facts may be overwritten. */
        __syncthreads();
#pragma unroll
        for (j = 0; j < DQ_PARTS; ++j) { /* d = 256: this warpgroup's two column chunks */
            fa_i_wgmma_fence();
            if (DQ_BY_KEYS)
                FA_I_KNAME(fa_i_fa3_bwd_dq)(dq, sdst + w * 64 * 128, sk + w * 64 * 128, 64);
            else
                FA_I_KNAME(fa_i_fa3_bwd_dq)(dq, sdst, sk + (w * DQ_PARTS + j) * BN * 128, BN);
            fa_i_wgmma_commit();
            if (j == 0 && w == 1 && step + 2 < steps) { /* global loads under the dQ wgmma */
                FA_I_STEP_AT(2);
                FA_I_BWD_VIEW();
                FA_I_BWD_FA3_ROW_FACTS(h_at, r_at, rb, t, 128);
            }
            FA_I_WGMMA_WAIT(0);
            fa_i_fence_f32(dq, 32);
            if (j == 0) {
                fa_i_fence_f32(dk, DW / 2);
                fa_i_fence_f32(dv, DW / 2);
                fa_i_fence_u32(pr, 16);
                fa_i_fence_u32(dsr, 16);
                /* Q and dO read: the second warpgroup here loads block step +
                   STAGES into this buffer. Its reset of the count comes before
                   the barrier of step + 1, and either's next increment after it. */
                if (t == 0 && step + STAGES < steps && atomicAdd(&released[buf], 1) == 1) {
                    released[buf] = 0;
                    FA_I_STEP_AT(STAGES);
                    FA_I_BWD_VIEW();
                    fa_i_fa3_bwd_load_rows(FA_I_BWD_MAPS, sqt, sdot, rows_full + 8 * buf, CHUNKS,
                                           r_at, h_at, b);
                }
            }
#pragma unroll
            for (i = 0; i < 8; ++i)
                asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                 sdq + j * DQ_BYTES + (i * 128 + t) * 16),
                             "f"(dq[4 * i]), "f"(dq[4 * i + 1]), "f"(dq[4 * i + 2]),
                             "f"(dq[4 * i + 3])
                             : "memory");
        }
        fa_i_fence_proxy_async();
        fa_i_named_sync(1 + w, 128);
        if (t == 0) { /* d = 64: its keys' share of the block, else its columns */
            fa_i_bulk_add_f32(args.a.dq_acc +
                                  (((int64_t)b * p.heads_q + h) * q_blocks + acc0 + r0 / BM) *
                                      BM * D +
                                  (DQ_BY_KEYS ? 0 : w * DQ_PARTS * BM * 64),
                              sdq, DQ_PARTS * DQ_BYTES);
            fa_i_tma_store_commit();
        }
        FA_I_BWD_ADVANCE(sh, sb, blocks);
    }
#undef FA_I_STEP_AT
    if (t == 0) fa_i_tma_store_wait_read(); /* shared memory must outlive the copy */
    FA_I_BWD_VIEW();
    {
        uint16_t *gdk =
            (uint16_t *)FA_I_BWD_SEQ.dk + fa_i_dev_offset(&FA_I_BWD_SEQ.dk_layout, b, hk, 0);
        uint16_t *gdv =
            (uint16_t *)FA_I_BWD_SEQ.dv + fa_i_dev_offset(&FA_I_BWD_SEQ.dv_layout, b, hk, 0);
#pragma unroll
        for (i = 0; i < DW / 2; i += 2) {
            const int key = c0 + key0 + 8 * ((i >> 1) & 1), col = cols_w + FA_I_FA3_COL(i);
            FA_I_STORE_DK_DV(FA_I_BWD_SEQ, key, col, dk[i], dk[i + 1], dv[i], dv[i + 1])
        }
    }
#undef FA_I_FA3_COL
#else
    (void)p;
    (void)args;
#endif
}
#undef FA_I_BWD_FA3_NAME
#undef FA_I_BWD_SEQ
#undef FA_I_BWD_MAPS
#undef FA_I_BWD_VIEW
#undef FA_I_BWD_FA3_ROW_FACTS
#undef FA_I_BWD_SEQ_INDEX
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#undef FA_I_WGMMA_NT
#undef FA_I_WGMMA_DKV
#undef FA_I_WGMMA_DQ
#endif

#undef FA_I_FA3B
#undef FA_I_FA3_BWD_DQ_PARTS
#endif /* >> fa3 backward */

/* >> instantiation ============================================================
   The kernel blocks above become kernels here: this file includes itself
   once per head dim (FA_I_PASS_HEAD_DIM: the tiles' shared memory, their
   checks, then per dtype (FA_I_PASS_DTYPE) every kernel of the head dim,
   then the table fa_i_kernels_<d> the host code looks kernels up in). Every
   #include of this file is in this section. */

/* Per dtype: each kernel block once per tile it is built for. */
#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_DTYPE
#define FA_I_MMA FA_I_CAT(fa_i_mma_, FA_I_DT)
#define FA_I_PACK FA_I_CAT(fa_i_pack_, FA_I_DT)
#define FA_I_IS_BF16 FA_I_CAT(FA_I_IS_BF16_, FA_I_DT)
#define FA_I_IS_BF16_f16 0
#define FA_I_IS_BF16_bf16 1
#define FA_I_IS_BF16_e4m3 0
#define FA_I_FP8 FA_I_CAT(FA_I_IS_FP8_, FA_I_DT)
#define FA_I_IS_FP8_f16 0
#define FA_I_IS_FP8_bf16 0
#define FA_I_IS_FP8_e4m3 1
#undef FA_I_PASS
#if FA_I_FP8 /* e4m3: the FA3 forward only */
#define FA_I_PASS FA_I_PASS_FA3_FWD
#define FA_I_V 0
#define FA_I_FA3_ROW FA_I_FA3_FP8_ROW_OF(0)
#define FA_I_FA3_Q_BUFS FA_I_FA3_Q_BUFS_R((FA_I_FA3_FP8_ROW_OF(0)), 1)
#define FA_I_FA3_O_APART FA_I_FA3_O_APART_R((FA_I_FA3_FP8_ROW_OF(0)), 1)
#include "flashattn_cuda.cuh"
#undef FA_I_V
#undef FA_I_FA3_ROW
#undef FA_I_FA3_Q_BUFS
#undef FA_I_FA3_O_APART
#if FA_I_FA3_FP8_HAS(1)
#define FA_I_V 1
#define FA_I_FA3_ROW FA_I_FA3_FP8_ROW_OF(1)
#define FA_I_FA3_Q_BUFS FA_I_FA3_Q_BUFS_R((FA_I_FA3_FP8_ROW_OF(1)), 1)
#define FA_I_FA3_O_APART FA_I_FA3_O_APART_R((FA_I_FA3_FP8_ROW_OF(1)), 1)
#include "flashattn_cuda.cuh"
#undef FA_I_V
#undef FA_I_FA3_ROW
#undef FA_I_FA3_Q_BUFS
#undef FA_I_FA3_O_APART
#endif
#undef FA_I_PASS
#else
#define FA_I_PASS FA_I_PASS_FA2_FWD
#include "flashattn_cuda.cuh"
#undef FA_I_PASS
#define FA_I_PASS FA_I_PASS_DECODE
#include "flashattn_cuda.cuh"
#undef FA_I_PASS
#if FA_I_FA3_HAS(0)
#define FA_I_PASS FA_I_PASS_FA3_FWD
#define FA_I_V 0
#define FA_I_FA3_ROW FA_I_FA3_ROW_OF(0)
#define FA_I_FA3_Q_BUFS FA_I_FA3_Q_BUFS_0
#define FA_I_FA3_O_APART FA_I_FA3_O_APART_0
#include "flashattn_cuda.cuh"
#undef FA_I_PASS
#undef FA_I_V
#undef FA_I_FA3_ROW
#undef FA_I_FA3_Q_BUFS
#undef FA_I_FA3_O_APART
#endif
#if FA_I_FA3_HAS(1)
#define FA_I_PASS FA_I_PASS_FA3_FWD
#define FA_I_V 1
#define FA_I_FA3_ROW FA_I_FA3_ROW_OF(1)
#define FA_I_FA3_Q_BUFS FA_I_FA3_Q_BUFS_1
#define FA_I_FA3_O_APART FA_I_FA3_O_APART_1
#include "flashattn_cuda.cuh"
#undef FA_I_PASS
#undef FA_I_V
#undef FA_I_FA3_ROW
#undef FA_I_FA3_Q_BUFS
#undef FA_I_FA3_O_APART
#endif
#define FA_I_PASS FA_I_PASS_FA2_BWD_KV
#define FA_I_BWD_BUDGET 163
#define FA_I_BWD_DQ 1
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#define FA_I_BWD_DQ 0
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#undef FA_I_BWD_BUDGET
#if FA_I_FA2_BWD_HAS(227)
#define FA_I_BWD_BUDGET 227
#define FA_I_BWD_DQ 1
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#define FA_I_BWD_DQ 0
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#undef FA_I_BWD_BUDGET
#endif
#if FA_I_FA2_BWD_HAS(99)
#define FA_I_BWD_BUDGET 99
#define FA_I_BWD_DQ 1
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#define FA_I_BWD_DQ 0
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#undef FA_I_BWD_BUDGET
#endif
#undef FA_I_PASS
#define FA_I_PASS FA_I_PASS_FA2_BWD_Q
#include "flashattn_cuda.cuh"
#undef FA_I_PASS
#if FA_I_HAS_FA3
#define FA_I_PASS FA_I_PASS_FA3_BWD
#define FA_I_BWD_VARLEN 0
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_VARLEN
#define FA_I_BWD_VARLEN 1 /* the ragged batch's instance */
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_VARLEN
#undef FA_I_PASS
#endif
#endif /* !FA_I_FP8 */
#define FA_I_PASS FA_I_PASS_DTYPE
#undef FA_I_MMA
#undef FA_I_PACK
#undef FA_I_IS_BF16
#undef FA_I_IS_BF16_f16
#undef FA_I_IS_BF16_bf16
#undef FA_I_IS_BF16_e4m3
#undef FA_I_FP8
#undef FA_I_IS_FP8_f16
#undef FA_I_IS_FP8_bf16
#undef FA_I_IS_FP8_e4m3
#endif /* FA_I_PASS_DTYPE */

/* Per head dim: shared memory and checks of its tiles, its kernels in each
   dtype, and their table fa_i_kernels_<d> ([0] f16, [1] bf16, [2] e4m3: the
   FP8 forward alone; zeros where the build leaves them out). */
#if defined(FA_I_PASS) && FA_I_PASS == FA_I_PASS_HEAD_DIM
#define FA_I_NO_KERNEL {0, 0, 0, 0, 0}
#define FA_I_NO_KERNELS                                                                      \
    {FA_I_NO_KERNEL,                                                                         \
     {{FA_I_NO_KERNEL, FA_I_NO_KERNEL}, {FA_I_NO_KERNEL, FA_I_NO_KERNEL},                    \
      {FA_I_NO_KERNEL, FA_I_NO_KERNEL}},                                                     \
     FA_I_NO_KERNEL, {FA_I_NO_KERNEL, FA_I_NO_KERNEL}, FA_I_NO_KERNEL, FA_I_NO_KERNEL,        \
     FA_I_NO_KERNEL, FA_I_NO_DECODE_KERNELS, FA_I_NO_DECODE_KERNELS, 0}
#define FA_I_NO_DECODE_KERNELS {FA_I_NO_KERNEL, FA_I_NO_KERNEL, FA_I_NO_KERNEL, FA_I_NO_KERNEL}
#if !FA_I_BUILD_D(FA_I_D)
#if FA_I_HOST
static const fa_i_kernels FA_I_CAT(fa_i_kernels_, FA_I_D)[3] = {FA_I_NO_KERNELS, FA_I_NO_KERNELS,
                                                                FA_I_NO_KERNELS};
#endif
#elif !FA_I_KERNELS /* split: the kernel unit of this head dim defines it */
extern const fa_i_kernels FA_I_CAT(fa_i_kernels_, FA_I_D)[3];
#else
/* FA2 forward: Q and STAGES of K and V, 16-bit rows of FA_I_PITCH. */
#define FA_I_FA2_FWD_ROW FA_I_CAT(FA_FA2_FWD_TILE_, FA_I_D)
#define FA_I_FA2_FWD_SMEM                                                                    \
    (2 * FA_I_PITCH(FA_I_D) *                                                                \
     (FA_I_COL(FA2_FWD, ROWS, FA_I_FA2_FWD_ROW) +                                            \
      2 * FA_I_COL(FA2_FWD, STAGES, FA_I_FA2_FWD_ROW) * FA_I_COL(FA2_FWD, KEYS, FA_I_FA2_FWD_ROW)))
static_assert((FA_I_COL(FA2_FWD, ROWS, FA_I_FA2_FWD_ROW) == 16 * FA_I_COL(FA2_FWD, WARPS, FA_I_FA2_FWD_ROW) ||
               FA_I_COL(FA2_FWD, ROWS, FA_I_FA2_FWD_ROW) == 32 * FA_I_COL(FA2_FWD, WARPS, FA_I_FA2_FWD_ROW)) &&
                  FA_I_COL(FA2_FWD, KEYS, FA_I_FA2_FWD_ROW) % 16 == 0,
              "flashattn: FA2 forward ROWS must be 16 or 32 times WARPS, KEYS a multiple of 16");
static_assert(FA_I_COL(FA2_FWD, STAGES, FA_I_FA2_FWD_ROW) == 1 ||
                  FA_I_COL(FA2_FWD, STAGES, FA_I_FA2_FWD_ROW) == 2,
              "flashattn: FA2 forward STAGES must be 1 or 2");
static_assert(FA_I_FA2_FWD_SMEM <= FA_I_SMEM_MAX, "flashattn: FA2 forward tile exceeds shared memory");
/* FA2 dK/dV: K, V (rows padded by 8); Q and dO (their stages); P and dS
   (rows x keys + 8); per row of 2 steps the LSE, D and key range. */
#define FA_I_FA2_BWD_ROW(budget) FA_I_CAT(FA_I_CAT(FA_FA2_BWD_TILE_, FA_I_D), FA_I_CAT(_, budget))
#define FA_I_FA2_BWD_HAS(budget) (FA_I_COL(FA2_BWD, KEYS, FA_I_FA2_BWD_ROW(budget)) > 0)
#define FA_I_FA2_BWD_SMEM(budget)                                                            \
    (2 * FA_I_BWD_KV_PITCH(FA_I_D) * 2 * FA_I_COL(FA2_BWD, KEYS, FA_I_FA2_BWD_ROW(budget)) +  \
     2 * FA_I_BWD_Q_PITCH(FA_I_D) *                                                          \
         (FA_I_COL(FA2_BWD, QST, FA_I_FA2_BWD_ROW(budget)) +                                 \
          FA_I_COL(FA2_BWD, DOST, FA_I_FA2_BWD_ROW(budget))) *                               \
         FA_I_COL(FA2_BWD, ROWS, FA_I_FA2_BWD_ROW(budget)) +                                 \
     2 * 2 * FA_I_COL(FA2_BWD, ROWS, FA_I_FA2_BWD_ROW(budget)) *                             \
         (FA_I_COL(FA2_BWD, KEYS, FA_I_FA2_BWD_ROW(budget)) + 8) +                           \
     4 * 4 * 2 * FA_I_COL(FA2_BWD, ROWS, FA_I_FA2_BWD_ROW(budget)))
static_assert(FA_I_FA2_BWD_SMEM(163) <= FA_I_SMEM_MAX,
              "flashattn: the s163 FA2 backward tile exceeds 163 KB");
static_assert(FA_I_FA2_BWD_SMEM(227) <= 227 * 1024,
              "flashattn: the s227 FA2 backward tile exceeds 227 KB");
static_assert(FA_I_FA2_BWD_SMEM(99) <= 99 * 1024,
              "flashattn: the s99 FA2 backward tile exceeds 99 KB");
/* FA2 deterministic dQ: Q, dO, and two stages of K and V. */
#define FA_I_FA2_BWDQ_ROW FA_I_CAT(FA_FA2_BWDQ_TILE_, FA_I_D)
#define FA_I_FA2_BWDQ_SMEM                                                                   \
    (2 * FA_I_PITCH(FA_I_D) *                                                                \
     (2 * FA_I_COL(FA2_BWDQ, ROWS, FA_I_FA2_BWDQ_ROW) + 4 * FA_I_COL(FA2_BWDQ, KEYS, FA_I_FA2_BWDQ_ROW)))
static_assert(FA_I_FA2_BWDQ_SMEM <= FA_I_SMEM_MAX, "flashattn: dQ tile exceeds shared memory");
/* Decode: the packed Q rows, then STAGES of K and V; the warps' merge
   slots ((m, l, O) of 16 rows each) reuse the ring. */
#define FA_I_DECODE_ROW FA_I_CAT(FA_DECODE_TILE_, FA_I_D)
#define FA_I_DECODE_MAX_ROWS (16 * FA_I_DECODE_WARPS / FA_I_COL(DECODE, DSPLIT, FA_I_DECODE_ROW))
#define FA_I_DECODE_SMEM_FOR(rows)                                                           \
    (2 * FA_I_PITCH(FA_I_D) *                                                                \
     ((rows) + 2 * FA_I_COL(DECODE, STAGES, FA_I_DECODE_ROW) *                               \
                   FA_I_COL(DECODE, KEYS, FA_I_DECODE_ROW)))
#define FA_I_DECODE_SMEM FA_I_DECODE_SMEM_FOR(FA_I_DECODE_MAX_ROWS)
static_assert(FA_I_COL(DECODE, KEYS, FA_I_DECODE_ROW) % 64 == 0 &&
                  FA_I_COL(DECODE, STAGES, FA_I_DECODE_ROW) >= 2 &&
                  (FA_I_COL(DECODE, DSPLIT, FA_I_DECODE_ROW) == 1 ||
                   FA_I_COL(DECODE, DSPLIT, FA_I_DECODE_ROW) == 2) &&
                  FA_I_D % (16 * FA_I_COL(DECODE, DSPLIT, FA_I_DECODE_ROW)) == 0 &&
                  (FA_I_COL(DECODE, STEP, FA_I_DECODE_ROW) == 1 ||
                   FA_I_COL(DECODE, STEP, FA_I_DECODE_ROW) == 2),
              "flashattn: decode KEYS must be a multiple of 64, STAGES at least 2, DSPLIT 1 "
              "or 2 (dividing d into multiples of 16), STEP 1 or 2");
static_assert(FA_I_DECODE_WARPS * (16 * FA_I_D / FA_I_COL(DECODE, DSPLIT, FA_I_DECODE_ROW) + 32) * 4 <=
                  2 * 2 * FA_I_PITCH(FA_I_D) * FA_I_COL(DECODE, STAGES, FA_I_DECODE_ROW) *
                      FA_I_COL(DECODE, KEYS, FA_I_DECODE_ROW),
              "flashattn: the decode warps' merge slots exceed the K/V ring");
static_assert(FA_I_DECODE_SMEM <= FA_I_SMEM_MAX, "flashattn: decode tile exceeds shared memory");
static_assert(FA_I_COL(DECODE, KEYS, FA_I_DECODE_ROW) <= 16 * FA_I_TILE_SLICES &&
                  32 * FA_I_DECODE_WARPS / ((FA_I_D / 8) & -(FA_I_D / 8)) <= 32,
              "flashattn: a paged decode tile's copy needs KEYS <= 16 FA_I_TILE_SLICES and "
              "at most 32 rows a pass (fa_i_async_rows)");

#if FA_I_SM90 && (FA_I_D == 64 || FA_I_D == 128 || FA_I_D == 256)
#define FA_I_HAS_FA3 1
#define FA_I_FA3_ROW_OF(v) FA_I_CAT(FA_I_CAT(FA_FA3_FWD_TILE_, FA_I_D), FA_I_CAT(_, v))
#define FA_I_FA3_HAS(v) (FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_ROW_OF(v)) > 0)
/* The variant the gathering instance (paged caches, maps.gather) is built
   on: the first of 128 rows and 128 keys, whose two consumer warpgroups
   leave its producer 56 registers (FA_I_SM90_GATHER_PRODUCER_REGS; d =
   256's 80-key tile spills there); -1: none, such pages are gathered into
   the workspace. */
#define FA_I_FA3_GATHER_TILE(v)                      \
    (FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_ROW_OF(v)) == 128 && \
     FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_ROW_OF(v)) == 128)
#define FA_I_FA3_GATHER_V (FA_I_FA3_GATHER_TILE(0) ? 0 : FA_I_FA3_GATHER_TILE(1) ? 1 : -1)
/* FA3 forward shared memory: the K/V ring with the 1 KB alignment slack,
   then Q and O tiles of 2 d rows bytes each: two Q buffers and O's own where
   QBUFS asks for two and all three fit (the next tile's Q and K/V load while
   this one computes), else one Q and O's own buffer (the next Q loads during
   the epilogue), else none for O: it is staged in the last key tile's ring
   stage (over Q in a tile that sees no keys). */
/* Of a tile row given in parentheses (prow) and its inputs' element bytes es (2, or 1: FP8, whose V
   also has the ring it arrives in before its transpose); O is 16-bit. */
#define FA_I_FA3_SMEM_KV_R(prow, es)                                                          \
    ((es == 1 ? 3 : 4) * FA_I_D * FA_I_COLP(FA3_FWD, KEYS, prow) * FA_I_COLP(FA3_FWD, STAGES, prow) + 1024)
#define FA_I_FA3_Q_BYTES_R(prow, es) ((es) * FA_I_D * FA_I_COLP(FA3_FWD, ROWS, prow))
#define FA_I_FA3_O_BYTES_R(prow) (2 * FA_I_D * FA_I_COLP(FA3_FWD, ROWS, prow))
#define FA_I_FA3_Q_BUFS_R(prow, es)                                                           \
    (FA_I_COLP(FA3_FWD, QBUFS, prow) == 2 &&                                                   \
             FA_I_FA3_SMEM_KV_R(prow, es) + 2 * FA_I_FA3_Q_BYTES_R(prow, es) +                 \
                     FA_I_FA3_O_BYTES_R(prow) <=                                              \
                 FA_I_SM90_SMEM_MAX                                                          \
         ? 2                                                                                 \
         : 1)
#define FA_I_FA3_O_APART_R(prow, es)                                                          \
    (FA_I_FA3_SMEM_KV_R(prow, es) + FA_I_FA3_Q_BUFS_R(prow, es) * FA_I_FA3_Q_BYTES_R(prow, es) + \
         FA_I_FA3_O_BYTES_R(prow) <=                                                          \
     FA_I_SM90_SMEM_MAX)
#define FA_I_FA3_SMEM_R(prow, es)                                                             \
    (FA_I_FA3_SMEM_KV_R(prow, es) + FA_I_FA3_Q_BUFS_R(prow, es) * FA_I_FA3_Q_BYTES_R(prow, es) + \
     FA_I_FA3_O_APART_R(prow, es) * FA_I_FA3_O_BYTES_R(prow))
#define FA_I_FA3_Q_BUFS_OF(v) FA_I_FA3_Q_BUFS_R((FA_I_FA3_ROW_OF(v)), 2)
#define FA_I_FA3_O_APART_OF(v) FA_I_FA3_O_APART_R((FA_I_FA3_ROW_OF(v)), 2)
#define FA_I_FA3_SMEM(v) FA_I_FA3_SMEM_R((FA_I_FA3_ROW_OF(v)), 2)
/* The FP8 forward's rows; their checks */
#define FA_I_FA3_FP8_ROW_OF(v) FA_I_CAT(FA_I_CAT(FA_FA3_FP8_TILE_, FA_I_D), FA_I_CAT(_, v))
#define FA_I_FA3_FP8_HAS(v) (FA_FA3_OVERLAP && FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_FP8_ROW_OF(v)) > 0)
#define FA_I_FA3_FP8_CHECK(v)                                                                \
    static_assert(!FA_I_FA3_FP8_HAS(v) ||                                                    \
                      FA_I_FA3_SMEM_R((FA_I_FA3_FP8_ROW_OF(v)), 1) <= FA_I_SM90_SMEM_MAX,    \
                  "flashattn: FA3 FP8 tiles exceed shared memory");                          \
    static_assert(!FA_I_FA3_FP8_HAS(v) ||                                                    \
                      FA_I_D / 2 + 5 * FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_FP8_ROW_OF(v)) / 8 + 24 <= \
                          FA_I_SM90_CONSUMER_REGS_OF(                                        \
                              FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_FP8_ROW_OF(v)) / 64, 1),      \
                  "flashattn: FA3 FP8 accumulators exceed the consumer registers")
FA_I_FA3_FP8_CHECK(0);
FA_I_FA3_FP8_CHECK(1);
#define FA_I_FA3_Q_BUFS_0 FA_I_FA3_Q_BUFS_OF(0)
#define FA_I_FA3_O_APART_0 FA_I_FA3_O_APART_OF(0)
#define FA_I_FA3_Q_BUFS_1 FA_I_FA3_Q_BUFS_OF(1)
#define FA_I_FA3_O_APART_1 FA_I_FA3_O_APART_OF(1)
#define FA_I_FA3_CHECK(v)                                                                    \
    static_assert(!FA_I_FA3_HAS(v) || FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_ROW_OF(v)) == 128 ||  \
                      FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_ROW_OF(v)) == 192,                    \
                  "flashattn: FA3 CTAs have 2 or 3 consumer warpgroups of 64 rows");         \
    static_assert(!FA_I_FA3_HAS(v) || (FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_ROW_OF(v)) % 16 == 0 && \
                                       FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_ROW_OF(v)) >= 64 &&   \
                                       FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_ROW_OF(v)) <= 192),   \
                  "flashattn: FA3 key tile must be a multiple of 16 in 64..192");            \
    static_assert(!FA_I_FA3_HAS(v) || FA_I_FA3_SMEM(v) <= FA_I_SM90_SMEM_MAX,                \
                  "flashattn: FA3 tiles exceed shared memory");                              \
    /* O (d/2), S (keys/2) and P (keys/4) per consumer thread, plus ~24 for the rest */    \
    static_assert(!FA_I_FA3_HAS(v) ||                                                        \
                      FA_I_D / 2 + 3 * FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_ROW_OF(v)) / 4 + 24 <= \
                          FA_I_SM90_CONSUMER_REGS(FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_ROW_OF(v)) / 64), \
                  "flashattn: FA3 accumulators exceed the consumer registers (fewer rows or keys)")
FA_I_FA3_CHECK(0);
FA_I_FA3_CHECK(1);
static_assert(FA_I_FA3_HAS(0), "flashattn: FA3 tile variant 0 serves every problem: ROWS > 0");
/* FA3 backward: K, V, the Q and dO buffers, two dS^T buffers (keys x 64
   rows), each warpgroup's fp32 dQ parts (64 x 64), after the 1 KB slack. */
#define FA_I_FA3_BWD_ROW FA_I_CAT(FA_FA3_BWD_TILE_, FA_I_D)
#define FA_I_FA3_BWD_SMEM                                                                    \
    (1024 + 4 * FA_I_COL(FA3_BWD, KEYS, FA_I_FA3_BWD_ROW) * FA_I_D +                         \
     4 * 64 * FA_I_D * FA_I_COL(FA3_BWD, STAGES, FA_I_FA3_BWD_ROW) +                         \
     4 * FA_I_COL(FA3_BWD, KEYS, FA_I_FA3_BWD_ROW) * 64 + 2 * (FA_I_D == 256 ? 2 : 1) * 4 * 64 * 64)
static_assert(FA_I_FA3_BWD_SMEM <= FA_I_SM90_SMEM_MAX,
              "flashattn: FA3 backward tiles exceed shared memory");
#else
#define FA_I_HAS_FA3 0
#define FA_I_FA3_HAS(v) 0
#define FA_I_FA3_FP8_HAS(v) 0
#endif

#undef FA_I_PASS
#define FA_I_PASS FA_I_PASS_DTYPE
#if FA_CUDA_DTYPE == 0 || FA_CUDA_DTYPE == 1
#define FA_I_DT f16
#include "flashattn_cuda.cuh"
#undef FA_I_DT
#endif
#if FA_CUDA_DTYPE == 0 || FA_CUDA_DTYPE == 2
#define FA_I_DT bf16
#include "flashattn_cuda.cuh"
#undef FA_I_DT
#endif
#if FA_I_FA3_FP8_HAS(0) && (FA_CUDA_DTYPE == 0 || FA_CUDA_DTYPE == 3)
#define FA_I_DT e4m3
#include "flashattn_cuda.cuh"
#undef FA_I_DT
#endif
#undef FA_I_PASS
#define FA_I_PASS FA_I_PASS_HEAD_DIM

/* The table's entries: {kernel, rows, keys, threads, shared memory}. */
#define FA_I_KERNEL_OF(stem, dt, suffix) \
    (const void *)FA_I_CAT(FA_I_CAT(stem, FA_I_CAT(FA_I_CAT(_, dt), FA_I_CAT(_d, FA_I_D))), suffix)
#define FA_I_FA2_FWD_ENTRY(dt)                                                               \
    {FA_I_KERNEL_OF(fa_i_fwd_fa2, dt, ), FA_I_COL(FA2_FWD, ROWS, FA_I_FA2_FWD_ROW),           \
     FA_I_COL(FA2_FWD, KEYS, FA_I_FA2_FWD_ROW), 32 * FA_I_COL(FA2_FWD, WARPS, FA_I_FA2_FWD_ROW), \
     FA_I_FA2_FWD_SMEM}
#define FA_I_FA2_BWD_ENTRY(dt, stem, budget)                                                 \
    {FA_I_KERNEL_OF(stem, dt, FA_I_CAT(_s, budget)),                               \
     FA_I_COL(FA2_BWD, ROWS, FA_I_FA2_BWD_ROW(budget)),                                      \
     FA_I_COL(FA2_BWD, KEYS, FA_I_FA2_BWD_ROW(budget)), 256, FA_I_FA2_BWD_SMEM(budget)}
#define FA_I_FA2_BWD_ENTRIES(dt, budget)                                                     \
    {FA_I_FA2_BWD_ENTRY(dt, fa_i_bwd_kv_fa2_dq, budget), FA_I_FA2_BWD_ENTRY(dt, fa_i_bwd_kv_fa2, budget)}
#if FA_I_FA2_BWD_HAS(227)
#define FA_I_FA2_BWD227_ENTRIES(dt) FA_I_FA2_BWD_ENTRIES(dt, 227)
#else
#define FA_I_FA2_BWD227_ENTRIES(dt) {FA_I_NO_KERNEL, FA_I_NO_KERNEL}
#endif
#if FA_I_FA2_BWD_HAS(99)
#define FA_I_FA2_BWD99_ENTRIES(dt) FA_I_FA2_BWD_ENTRIES(dt, 99)
#else
#define FA_I_FA2_BWD99_ENTRIES(dt) {FA_I_NO_KERNEL, FA_I_NO_KERNEL}
#endif
#define FA_I_FA2_BWDQ_ENTRY(dt)                                                              \
    {FA_I_KERNEL_OF(fa_i_bwd_q_fa2, dt, ), FA_I_COL(FA2_BWDQ, ROWS, FA_I_FA2_BWDQ_ROW),       \
     FA_I_COL(FA2_BWDQ, KEYS, FA_I_FA2_BWDQ_ROW),                                            \
     32 * FA_I_COL(FA2_BWDQ, WARPS, FA_I_FA2_BWDQ_ROW), FA_I_FA2_BWDQ_SMEM}
#if FA_I_HAS_FA3
#define FA_I_FA3_FWD_ENTRY(dt, v)                                                            \
    {FA_I_KERNEL_OF(fa_i_fwd_fa3, dt, FA_I_CAT(_t, v)),                            \
     FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_ROW_OF(v)), FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_ROW_OF(v)), \
     128 * (FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_ROW_OF(v)) / 64 + 1), FA_I_FA3_SMEM(v)}
#if FA_I_FA3_HAS(1)
#define FA_I_FA3_FWD_ENTRIES(dt) {FA_I_FA3_FWD_ENTRY(dt, 0), FA_I_FA3_FWD_ENTRY(dt, 1)}
#else
#define FA_I_FA3_FWD_ENTRIES(dt) {FA_I_FA3_FWD_ENTRY(dt, 0), FA_I_NO_KERNEL}
#endif
#if FA_I_FA3_GATHER_V >= 0 /* its tile: 128 rows, 128 keys (three warpgroups), v's smem */
#define FA_I_FA3_FWD_GATHER_ENTRY(dt)                                                        \
    {FA_I_KERNEL_OF(fa_i_fwd_fa3, dt, _gather), 128, 128, 384,                              \
     FA_I_FA3_GATHER_V == 1 ? FA_I_FA3_SMEM(1) : FA_I_FA3_SMEM(0)}
#else
#define FA_I_FA3_FWD_GATHER_ENTRY(dt) FA_I_NO_KERNEL
#endif
#define FA_I_FA3_BWD_ENTRY(dt, suffix)                                                      \
    {FA_I_KERNEL_OF(fa_i_bwd_fa3, dt, suffix), 64, FA_I_COL(FA3_BWD, KEYS, FA_I_FA3_BWD_ROW), 256, \
     FA_I_FA3_BWD_SMEM}
#else
#define FA_I_FA3_FWD_ENTRIES(dt) {FA_I_NO_KERNEL, FA_I_NO_KERNEL}
#define FA_I_FA3_FWD_GATHER_ENTRY(dt) FA_I_NO_KERNEL
#define FA_I_FA3_BWD_ENTRY(dt, suffix) FA_I_NO_KERNEL
#endif
#define FA_I_DECODE_ENTRY(dt, suffix)                                                        \
    {FA_I_KERNEL_OF(fa_i_fwd_decode, dt, suffix), FA_I_DECODE_MAX_ROWS,                     \
     FA_I_COL(DECODE, KEYS, FA_I_DECODE_ROW), 32 * FA_I_DECODE_WARPS, FA_I_DECODE_SMEM}
/* entry(dt, suffix) where that kind is built */
#if FA_I_DECODE_PAGES_BUILT
#define FA_I_DECODE_PAGES_ENTRY(entry, dt, suffix) entry(dt, suffix)
#else
#define FA_I_DECODE_PAGES_ENTRY(entry, dt, suffix) FA_I_NO_KERNEL
#endif
#if FA_I_DECODE_SLICES_BUILT
#define FA_I_DECODE_SLICES_ENTRY(entry, dt, suffix) entry(dt, suffix)
#else
#define FA_I_DECODE_SLICES_ENTRY(entry, dt, suffix) FA_I_NO_KERNEL
#endif
#if FA_I_DECODE_WG /* the same ring, 64 rows of Q (no DSPLIT), 1 KB aligned */
#define FA_I_DECODE_WG_SMEM (FA_I_DECODE_SMEM_FOR(64) + 1024)
#define FA_I_DECODE_WG_ENTRY(dt, suffix)                                                     \
    {FA_I_KERNEL_OF(fa_i_fwd_decode, dt, suffix), 64, FA_I_COL(DECODE, KEYS, FA_I_DECODE_ROW), \
     32 * FA_I_DECODE_WARPS, FA_I_DECODE_WG_SMEM}
static_assert(FA_I_PITCH(FA_I_D) == FA_I_D && FA_I_DECODE_WG_SMEM <= FA_I_SM90_SMEM_MAX,
              "flashattn: the wgmma decode takes whole 64-column slabs, 64 rows and the ring");
#else
#define FA_I_DECODE_WG_ENTRY(dt, suffix) FA_I_NO_KERNEL
#endif
#if FA_I_FA3_FP8_HAS(0) /* e4m3: the FA3 forward alone */
#define FA_I_FP8_FWD_ENTRY(v)                                                                \
    {FA_I_KERNEL_OF(fa_i_fwd_fa3, e4m3, FA_I_CAT(_t, v)),                                    \
     FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_FP8_ROW_OF(v)), FA_I_COL(FA3_FWD, KEYS, FA_I_FA3_FP8_ROW_OF(v)), \
     128 * (FA_I_COL(FA3_FWD, ROWS, FA_I_FA3_FP8_ROW_OF(v)) / 64 + 1),                       \
     FA_I_FA3_SMEM_R((FA_I_FA3_FP8_ROW_OF(v)), 1)}
#if FA_I_FA3_FP8_HAS(1)
#define FA_I_FP8_FWD_ENTRIES {FA_I_FP8_FWD_ENTRY(0), FA_I_FP8_FWD_ENTRY(1)}
#else
#define FA_I_FP8_FWD_ENTRIES {FA_I_FP8_FWD_ENTRY(0), FA_I_NO_KERNEL}
#endif
#define FA_I_FP8_ENTRY                                                                       \
    {FA_I_NO_KERNEL,                                                                         \
     {{FA_I_NO_KERNEL, FA_I_NO_KERNEL}, {FA_I_NO_KERNEL, FA_I_NO_KERNEL},                    \
      {FA_I_NO_KERNEL, FA_I_NO_KERNEL}},                                                     \
     FA_I_NO_KERNEL, FA_I_FP8_FWD_ENTRIES, FA_I_NO_KERNEL, FA_I_NO_KERNEL, FA_I_NO_KERNEL,   \
     FA_I_NO_DECODE_KERNELS, FA_I_NO_DECODE_KERNELS, FA_I_D}
#else
#define FA_I_FP8_ENTRY FA_I_NO_KERNELS
#endif
#define FA_I_ENTRY(dt)                                                                       \
    {FA_I_FA2_FWD_ENTRY(dt),                                                                 \
     {FA_I_FA2_BWD227_ENTRIES(dt), FA_I_FA2_BWD_ENTRIES(dt, 163), FA_I_FA2_BWD99_ENTRIES(dt)}, \
     FA_I_FA2_BWDQ_ENTRY(dt), FA_I_FA3_FWD_ENTRIES(dt), FA_I_FA3_FWD_GATHER_ENTRY(dt),        \
     FA_I_FA3_BWD_ENTRY(dt, ),                                                               \
     FA_I_FA3_BWD_ENTRY(dt, _varlen),                                                        \
     {FA_I_DECODE_ENTRY(dt, ), FA_I_DECODE_PAGES_ENTRY(FA_I_DECODE_ENTRY, dt, _pages),       \
      FA_I_DECODE_SLICES_ENTRY(FA_I_DECODE_ENTRY, dt, _slices),                              \
      FA_I_DECODE_ENTRY(dt, _general)},                                                      \
     {FA_I_DECODE_WG_ENTRY(dt, _wg), FA_I_DECODE_PAGES_ENTRY(FA_I_DECODE_WG_ENTRY, dt, _wg_pages), \
      FA_I_DECODE_SLICES_ENTRY(FA_I_DECODE_WG_ENTRY, dt, _wg_slices),                        \
      FA_I_DECODE_WG_ENTRY(dt, _wg_general)},                                                \
     FA_I_D}
#if FA_CUDA_SPLIT
extern
#else
static
#endif
    const fa_i_kernels FA_I_CAT(fa_i_kernels_, FA_I_D)[3] = {
#if FA_CUDA_DTYPE == 0 || FA_CUDA_DTYPE == 1
    FA_I_ENTRY(f16),
#else
    FA_I_NO_KERNELS,
#endif
#if FA_CUDA_DTYPE == 0 || FA_CUDA_DTYPE == 2
    FA_I_ENTRY(bf16),
#else
    FA_I_NO_KERNELS,
#endif
#if FA_CUDA_DTYPE == 0 || FA_CUDA_DTYPE == 3
    FA_I_FP8_ENTRY,
#else
    FA_I_NO_KERNELS,
#endif
};
#undef FA_I_KERNEL_OF
#undef FA_I_FA2_FWD_ENTRY
#undef FA_I_FA2_BWD_ENTRY
#undef FA_I_FA2_BWD_ENTRIES
#undef FA_I_FA2_BWD227_ENTRIES
#undef FA_I_FA2_BWD99_ENTRIES
#undef FA_I_FA2_BWDQ_ENTRY
#undef FA_I_FA3_FWD_ENTRY
#undef FA_I_FA3_FWD_ENTRIES
#undef FA_I_FA3_FWD_GATHER_ENTRY
#undef FA_I_FA3_BWD_ENTRY
#undef FA_I_ENTRY
#undef FA_I_FP8_ENTRY
#undef FA_I_FP8_FWD_ENTRY
#undef FA_I_FP8_FWD_ENTRIES
#undef FA_I_DECODE_ENTRY
#undef FA_I_DECODE_PAGES_ENTRY
#undef FA_I_DECODE_SLICES_ENTRY
#undef FA_I_DECODE_WG_ENTRY
#undef FA_I_DECODE_ROW
#undef FA_I_DECODE_MAX_ROWS
#undef FA_I_DECODE_SMEM_FOR
#undef FA_I_DECODE_SMEM
#undef FA_I_DECODE_WG_SMEM
#undef FA_I_FA2_FWD_ROW
#undef FA_I_FA2_FWD_SMEM
#undef FA_I_FA2_BWD_ROW
#undef FA_I_FA2_BWD_HAS
#undef FA_I_FA2_BWD_SMEM
#undef FA_I_FA2_BWDQ_ROW
#undef FA_I_FA2_BWDQ_SMEM
#undef FA_I_HAS_FA3
#undef FA_I_FA3_HAS
#undef FA_I_FA3_GATHER_V
#undef FA_I_FA3_GATHER_TILE
#undef FA_I_FA3_FP8_HAS
#ifdef FA_I_FA3_ROW_OF
#undef FA_I_FA3_ROW_OF
#undef FA_I_FA3_SMEM_KV_R
#undef FA_I_FA3_Q_BYTES_R
#undef FA_I_FA3_O_BYTES_R
#undef FA_I_FA3_Q_BUFS_R
#undef FA_I_FA3_O_APART_R
#undef FA_I_FA3_SMEM_R
#undef FA_I_FA3_FP8_ROW_OF
#undef FA_I_FA3_FP8_CHECK
#undef FA_I_FA3_Q_BUFS_OF
#undef FA_I_FA3_O_APART_OF
#undef FA_I_FA3_SMEM
#undef FA_I_FA3_Q_BUFS_0
#undef FA_I_FA3_O_APART_0
#undef FA_I_FA3_Q_BUFS_1
#undef FA_I_FA3_O_APART_1
#undef FA_I_FA3_CHECK
#undef FA_I_FA3_BWD_ROW
#undef FA_I_FA3_BWD_SMEM
#endif
#endif /* FA_I_BUILD_D(FA_I_D) */
#undef FA_I_NO_KERNEL
#undef FA_I_NO_KERNELS
#endif /* FA_I_PASS_HEAD_DIM */

/* The top-level include: one FA_I_PASS_HEAD_DIM include per head dim. */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
#define FA_I_PASS FA_I_PASS_HEAD_DIM
#define FA_I_D 32
#include "flashattn_cuda.cuh"
#undef FA_I_D
#define FA_I_D 64
#include "flashattn_cuda.cuh"
#undef FA_I_D
#define FA_I_D 96
#include "flashattn_cuda.cuh"
#undef FA_I_D
#define FA_I_D 128
#include "flashattn_cuda.cuh"
#undef FA_I_D
#define FA_I_D 160
#include "flashattn_cuda.cuh"
#undef FA_I_D
#define FA_I_D 192
#include "flashattn_cuda.cuh"
#undef FA_I_D
#define FA_I_D 256
#include "flashattn_cuda.cuh"
#undef FA_I_D
#undef FA_I_PASS
#endif /* >> instantiation */

/* >> host =====================================================================
   Validation, the kernel table lookup, device facts, dispatch and launch;
   ragged batches last. */
#if defined(FA_I_TOP) && !defined(FA_I_PASS) && FA_I_HOST
#ifdef __cplusplus
extern "C" {
#endif

/* A ragged batch or a paged cache (fa_i_seq_run, at the end): run
   (workspace, stream) or only planned (*need: its workspace bytes;
   *algorithm: that of its longest query sequence with keys), every sequence checked
   before anything runs. */
typedef struct fa_i_seq_call {
    fa_pass pass;
    int deterministic, run;
    void *workspace;
    size_t workspace_size;
    cudaStream_t stream;
    size_t need;
    int algorithm;
} fa_i_seq_call;
static fa_status fa_i_seq_run(const fa_params *params, fa_i_seq_call *call);
#define FA_I_BY_SEQUENCE(params) ((params) && ((params)->cu_seqlens_q || (params)->block_table))

/* What the launchers need to know of the current device. */
typedef struct fa_i_device {
    int major, minor; /* compute capability */
    int smem_optin;   /* shared memory a block may opt in to, bytes */
    int sms;          /* multiprocessors */
} fa_i_device;

/* Whether a Hopper kernel can run here: the build has it (fn) compiled for
   sm_90a (only that body has static shared memory), and the device (facts
   from fa_i_cuda_check) is compute capability 9.0 with room for its tiles. */
static int fa_i_fa3_compiled(const void *fn, size_t smem, const fa_i_device *dev)
{
    struct cudaFuncAttributes attr;
    if (!fn || dev->major != 9 || dev->minor != 0 || (size_t)dev->smem_optin < smem) return 0;
    if (cudaFuncGetAttributes(&attr, fn) != cudaSuccess) {
        cudaGetLastError(); /* a refused query is an answer here, not an error to keep */
        return 0;
    }
    return attr.sharedSizeBytes > 0;
}

/* The kernels for head dim d and dtype, or NULL when this build has none.
   Tried in turn, among those of d itself and (16-bit) of the larger head
   dims, whose tiles run d with the columns past it zero-filled and never
   stored, smallest first:
     fa3 = FA_I_FA3_FIRST   a Hopper kernel for `pass` that runs on dev, then d's, then any
     fa3 = FA_I_FA3_NONE    d's, then any (also: dev NULL)
   FA3 on a wider tile outruns FA2 on d's own, but for the backward on
   FA2's tiles of 32 and 160 (DESIGN.md, head dims). */
enum { FA_I_FA3_FIRST, FA_I_FA3_NONE };
static const fa_i_kernels *fa_i_find_kernels(int d, fa_dtype dtype, fa_pass pass, int fa3,
                                             const fa_i_device *dev)
{
#define FA_I_TABLE_OF(dim) fa_i_kernels_##dim,
#define FA_I_DIM_OF(dim) dim,
    static const fa_i_kernels *const tables[] = {FA_I_HEAD_DIMS(FA_I_TABLE_OF)}; /* f16, bf16, e4m3 */
    static const int dims[] = {FA_I_HEAD_DIMS(FA_I_DIM_OF)};
#undef FA_I_TABLE_OF
#undef FA_I_DIM_OF
    enum { HOPPER, OWN, ANY };
    static const int order[2][3] = {{HOPPER, OWN, ANY}, {OWN, ANY, ANY}};
    const int set = dtype == FA_DTYPE_BF16 ? 1 : dtype == FA_DTYPE_F16 ? 0 : 2;
    int round;
    size_t i;
    if (dtype != FA_DTYPE_F16 && dtype != FA_DTYPE_BF16 && dtype != FA_DTYPE_FP8_E4M3) return NULL;
    if (!dev) fa3 = FA_I_FA3_NONE;
    for (round = 0; round < 3; ++round)
        for (i = 0; i < sizeof dims / sizeof dims[0]; ++i) { /* dims ascend */
            const fa_i_kernels *k = tables[i] + set;
            const fa_i_kernel *hopper = pass == FA_PASS_FORWARD ? &k->fa3_fwd[0] : &k->fa3_bwd;
            const int fits = dims[i] == d || (dims[i] > d && set != 2);
            if (!fits || (!k->fa2_fwd.fn && !k->fa3_fwd[0].fn)) continue;
            if (order[fa3][round] == ANY ||
                (order[fa3][round] == OWN && dims[i] == d) ||
                (order[fa3][round] == HOPPER && fa_i_fa3_compiled(hopper->fn, hopper->smem, dev)))
                return k;
        }
    return NULL;
}

static fa_status fa_i_cuda_error(cudaError_t e, const char *what)
{
    return fa_i_fail(FA_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

/* Rows of a tensor of `dtype` are 16-byte aligned: the pointer and every stride in bytes. */
static int fa_i_aligned(const void *ptr, const fa_layout *l, fa_dtype dtype)
{
    const int64_t e = (int64_t)fa_dtype_size(dtype);
    return ((uintptr_t)ptr % 16 == 0) && l->batch * e % 16 == 0 && l->head * e % 16 == 0 &&
           l->seq * e % 16 == 0;
}

static cudaError_t fa_i_device_facts(fa_i_device *d)
{
    int dev;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&d->major, cudaDevAttrComputeCapabilityMajor, dev)) !=
            cudaSuccess ||
        (e = cudaDeviceGetAttribute(&d->minor, cudaDevAttrComputeCapabilityMinor, dev)) !=
            cudaSuccess ||
        (e = cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    dev)) != cudaSuccess)
        return e;
#ifdef FA_I_TEST_SMEM_OPTIN /* tests only: act as a device that allows this much */
    if (d->smem_optin > FA_I_TEST_SMEM_OPTIN) d->smem_optin = FA_I_TEST_SMEM_OPTIN;
#endif
    return cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, dev);
}

/* The FA2 backward's dK/dV kernel for the mode on the largest tile that
   fits the device; NULL where none does. */
static const fa_i_kernel *fa_i_fa2_bwd_kv_kernel(const fa_i_kernels *k, int deterministic,
                                                 const fa_i_device *device)
{
    int tile;
    for (tile = 0; tile < 3; ++tile) {
        const fa_i_kernel *kv = &k->fa2_bwd_kv[tile][deterministic];
        if (kv->fn && (size_t)device->smem_optin >= kv->smem) return kv;
    }
    return NULL;
}

/* The head dim a problem's tiles must hold: Q K^T's or P V's, the larger. */
static int fa_i_tile_head_dim(const fa_params *p)
{
    return p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v;
}

/* Validates for the GPU: resolved params, kernels, device and alignment;
   *device gets the current device's facts. The kernels: for a forward past
   the decode path's query counts and for the backward's atomic mode, on
   Hopper tiles first, but for a backward whose own tiles are FA2's of 32 or
   160 (with one head dim: FA2's backward takes no V head dim of its own);
   the deterministic mode (FA2) and decode, their own (fa_i_find_kernels). */
static fa_status fa_i_cuda_check(const fa_params *params, fa_pass pass, int deterministic,
                                 fa_params *p, const fa_i_kernels **kernels, fa_i_device *device)
{
    fa_status s = fa_params_resolve(params, pass, p);
    const fa_i_kernels *own; /* the smallest tiles that hold the problem */
    size_t need;
    cudaError_t e;
    *kernels = NULL;
    if (s != FA_OK) return s;
    if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16 && p->dtype != FA_DTYPE_FP8_E4M3)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "the GPU path takes f16, bf16 or fp8, not dtype %d",
                         (int)p->dtype);
    /* a V head dim of its own: both on the tiles of the larger (the
       backward: FA3's, fa_i_plan_backward) */
    if (p->head_dim_v != p->head_dim &&
        (FA_VARIANT != 2 || p->dtype == FA_DTYPE_FP8_E4M3 || p->head_dim % 8 || p->head_dim_v % 8))
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "head_dim_v %d != head_dim %d: 16-bit, both multiples of 8, FA_VARIANT 2",
                         p->head_dim_v, p->head_dim);
    own = fa_i_find_kernels(fa_i_tile_head_dim(p), p->dtype, pass, FA_I_FA3_NONE, NULL);
    if (!own)
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "head_dim %d with dtype %d: not in this build, nor (16-bit) below a "
                         "head dim that is", fa_i_tile_head_dim(p), (int)p->dtype);
    /* a head dim that ends inside a 16-byte chunk: its last chunk read and
       stored in part (rows 16-byte aligned, below), but not by FA1 nor where
       gradients are staged in rows of d (accumulate_grads, grads_f32) */
    if (p->head_dim % 8 &&
        (FA_VARIANT != 2 ||
         (pass == FA_PASS_BACKWARD && (p->accumulate_grads || p->grads_f32))))
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "head_dim %d, not a multiple of 8: FA_VARIANT 2, without "
                         "accumulate_grads and grads_f32", p->head_dim);
    if (p->heads_q > 65535 || p->batch > 65535)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "heads_q and batch must be <= 65535");
    if (!fa_i_aligned(p->q, &p->q_layout, p->dtype) || !fa_i_aligned(p->k, &p->k_layout, p->dtype) ||
        !fa_i_aligned(p->v, &p->v_layout, p->dtype) || !fa_i_aligned(p->o, &p->o_layout, p->o_dtype) ||
        (pass == FA_PASS_BACKWARD &&
         (!fa_i_aligned(p->dout, &p->dout_layout, p->dtype) ||
          !fa_i_aligned(p->dq, &p->dq_layout, fa_i_grad_dtype(p)) ||
          !fa_i_aligned(p->dk, &p->dk_layout, fa_i_grad_dtype(p)) ||
          !fa_i_aligned(p->dv, &p->dv_layout, fa_i_grad_dtype(p)))))
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "GPU rows must be 16-byte aligned: pointers 16-byte aligned and "
                         "strides multiples of 16 bytes (8 16-bit or 16 fp8 elements)");
    if ((e = fa_i_device_facts(device)) != cudaSuccess)
        return fa_i_cuda_error(e, "querying the current device");
    if (device->major < 8)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "compute capability %d.x < 8.0", device->major);
    *kernels = fa_i_find_kernels(
        fa_i_tile_head_dim(p), p->dtype, pass,
        pass == FA_PASS_FORWARD ? (p->seqlen_q > FA_I_DECODE_MAX_Q ? FA_I_FA3_FIRST : FA_I_FA3_NONE)
        : deterministic || (p->head_dim_v == p->head_dim && (own->head_dim == 32 ||
                                                              own->head_dim == 160))
            ? FA_I_FA3_NONE
            : FA_I_FA3_FIRST,
        device);
    need = (*kernels)->fa2_fwd.smem;
    if (pass == FA_PASS_BACKWARD) { /* both modes' kernels, on the tile that fits */
        const fa_i_kernels *k = *kernels;
        int mode;
        need = k->fa2_bwd_q.smem;
        for (mode = 0; mode < 2; ++mode) {
            const fa_i_kernel *kv = fa_i_fa2_bwd_kv_kernel(k, mode, device);
            const size_t smem = kv ? kv->smem : k->fa2_bwd_kv[1][mode].smem; /* the s163 tile's */
            if (smem > need) need = smem;
        }
    }
    if ((size_t)device->smem_optin < need)
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "these kernels need %zu bytes of shared memory, the device allows %d",
                         need, device->smem_optin);
    return FA_OK;
}

/* Launches kernel(*params, *extra) with the dynamic shared memory raised as
   needed. early (compute capability 9.0 and later): a programmatic
   dependent launch, scheduled while the stream's previous kernel finishes
   (once its CTAs say griddepcontrol.launch_dependents); the kernel waits in
   griddepcontrol.wait before it reads what that one wrote. */
static fa_status fa_i_launch_ex(const void *kernel, dim3 grid, int threads, size_t smem,
                                cudaStream_t stream, const void *params, void *extra, int early)
{
    void *args[2];
    cudaError_t e;
    args[0] = (void *)params;
    args[1] = extra;
    if (smem > 48 * 1024 &&
        (e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem)) != cudaSuccess)
        return fa_i_cuda_error(e, "cudaFuncSetAttribute");
    if (early) {
        cudaLaunchConfig_t config = {};
        cudaLaunchAttribute attr = {};
        config.gridDim = grid, config.blockDim = dim3(threads);
        config.dynamicSmemBytes = smem, config.stream = stream;
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        config.attrs = &attr, config.numAttrs = 1;
        if ((e = cudaLaunchKernelExC(&config, kernel, args)) != cudaSuccess)
            return fa_i_cuda_error(e, "cudaLaunchKernelExC");
    } else if ((e = cudaLaunchKernel(kernel, grid, dim3(threads), args, smem, stream)) !=
               cudaSuccess) {
        /* the plain launch where nothing is early: it reports a bad stream
           as an error, where cudaLaunchKernelExC was seen to crash on one */
        return fa_i_cuda_error(e, "cudaLaunchKernel");
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return fa_i_cuda_error(e, "kernel launch");
    return FA_OK;
}

static fa_status fa_i_launch(const void *kernel, dim3 grid, int threads, size_t smem,
                             cudaStream_t stream, const void *params, void *extra)
{
    return fa_i_launch_ex(kernel, grid, threads, smem, stream, params, extra, 0);
}

static int fa_i_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }

#if FA_I_SM90
/* A 4-D tensor map {d, seq, head, batch} of a tensor of `dtype` with boxes
   of one swizzled row (64 16-bit elements, 128-byte swizzle; fp8: min(d, 128)
   bytes, 128- or 64-byte swizzle) by box_rows; 0 if the driver refuses it. */
static int fa_i_tma_map(CUtensorMap *map, const void *ptr, const fa_layout *l, const fa_params *p,
                        fa_dtype dtype, int cols, int seqlen, int heads, int box_rows)
{
    void *encode = NULL;
    cudaDriverEntryPointQueryResult found;
    const int fp8 = dtype == FA_DTYPE_FP8_E4M3, e = fp8 ? 1 : 2;
    const int inner = fp8 ? (cols < 128 ? cols : 128) : 64;
    const cuuint64_t dims[4] = {(cuuint64_t)cols, (cuuint64_t)seqlen, (cuuint64_t)heads,
                                (cuuint64_t)p->batch};
    const cuuint64_t strides[3] = {(cuuint64_t)(l->seq * e), (cuuint64_t)(l->head * e),
                                   (cuuint64_t)(l->batch * e)}; /* bytes, dims 1..3 */
    const cuuint32_t box[4] = {(cuuint32_t)inner, (cuuint32_t)box_rows, 1, 1}, unit[4] = {1, 1, 1, 1};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !encode)
        return 0;
    return ((PFN_cuTensorMapEncodeTiled_v12000)encode)(
               map, fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                        : dtype == FA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
               4, (void *)ptr, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
               inner * e == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The FA3 tile variant for p (FA_FA3_FWD_TILE_<d>_<v>): t1 where the head
   dim has one and p is the kind of problem it serves (DESIGN.md f4, f8, f9):
   at d = 64 causal problems with Nq < 4096, at d = 128 unmasked ones over at
   least 8192 keys; t0 otherwise. */
static const fa_i_kernel *fa_i_fa3_pick(const fa_params *p, const fa_i_kernels *k)
{
    const int alt = k->head_dim == 64    ? p->causal && p->seqlen_q < 4096
                    : k->head_dim == 128 ? !p->causal && !p->window && p->seqlen_k >= 8192
                                         : 0;
    return k->fa3_fwd[1].fn && alt ? &k->fa3_fwd[1] : &k->fa3_fwd[0];
}

/* The FA3 forward's tensor maps of a dense p (0 if the driver refuses one). */
static int fa_i_fa3_maps(const fa_params *p, const fa_i_kernel *k, fa_i_tma_maps *maps)
{
    const int d = p->head_dim, dv = p->head_dim_v, hq = p->heads_q, hk = p->heads_kv;
    memset(maps, 0, sizeof *maps);
    return fa_i_tma_map(&maps->q, p->q, &p->q_layout, p, p->dtype, d, p->seqlen_q, hq, k->rows) &&
           fa_i_tma_map(&maps->k, p->k, &p->k_layout, p, p->dtype, d, p->seqlen_k, hk, k->keys) &&
           fa_i_tma_map(&maps->v, p->v, &p->v_layout, p, p->dtype, dv, p->seqlen_k, hk, k->keys) &&
           fa_i_tma_map(&maps->o, p->o, &p->o_layout, p, p->o_dtype, dv, p->seqlen_q, hq, 64);
}

/* The persistent grid for `tiles` tiles: a CTA per tile where they are no
   more than the SMs, else one CTA per SM or per pair of tiles, whichever
   is fewer (fa_i_fa3_tile). */
static int fa_i_fa3_ctas(int64_t tiles, const fa_i_device *dev)
{
    if (tiles <= dev->sms) return (int)tiles;
    return (tiles + 1) / 2 < dev->sms ? (int)((tiles + 1) / 2) : dev->sms;
}

/* Whether the Hopper forward runs p: its kernel can run here and every
   tensor gets a tensor map. Otherwise the FA2 kernel runs. *ctas: its grid. */
static int fa_i_fa3_ready(const fa_params *p, const fa_i_kernel *k, const fa_i_device *dev,
                          fa_i_tma_maps *maps, int *ctas)
{
    if (!fa_i_fa3_compiled(k->fn, k->smem, dev)) return 0;
    *ctas = fa_i_fa3_ctas((int64_t)fa_i_blocks(p->seqlen_q, k->rows) * p->heads_q * p->batch, dev);
    return fa_i_fa3_maps(p, k, maps);
}

/* The same for the Hopper backward (atomic mode) and its tensor maps. */
static int fa_i_fa3_bwd_ready(const fa_params *p, const fa_i_kernel *k,
                              const fa_i_device *dev, fa_i_fa3_bwd_args *args)
{
    memset(args, 0, sizeof *args);
    return fa_i_fa3_compiled(k->fn, k->smem, dev) &&
           fa_i_tma_map(&args->q, p->q, &p->q_layout, p, p->dtype, p->head_dim, p->seqlen_q,
                        p->heads_q, 64) &&
           fa_i_tma_map(&args->k, p->k, &p->k_layout, p, p->dtype, p->head_dim, p->seqlen_k,
                        p->heads_kv, k->keys) &&
           fa_i_tma_map(&args->v, p->v, &p->v_layout, p, p->dtype, p->head_dim_v, p->seqlen_k,
                        p->heads_kv, k->keys) &&
           fa_i_tma_map(&args->dout, p->dout, &p->dout_layout, p, p->dtype, p->head_dim_v,
                        p->seqlen_q, p->heads_q, 64);
}
#endif

static size_t fa_i_round4(size_t n) { return (n + 3) / 4 * 4; }


/* The decode kernel's key splits for base_ctas CTAs of (row block, kv
   head, batch): num_splits where the caller forces it, else 1 where the
   CTAs already fill 80% of the device, else the fewest splits whose waves
   are at least 95% as full as the fullest split count's (FlashAttention's
   heuristic, at 95% where it has 85%), with at least two key tiles per
   split. The device's CTAs: one an SM where `one_per_sm` (the keys stream
   faster from fewer, longer splits), else as many as an SM holds
   (DESIGN.md, decode). */
static int fa_i_decode_splits(const fa_params *p, const fa_i_kernel *k, int64_t base_ctas,
                              int one_per_sm, const fa_i_device *dev)
{
    const int tiles = fa_i_blocks(p->seqlen_k, k->keys);
    int per_sm = 1, most = tiles / 2 < FA_MAX_PARTS ? tiles / 2 : FA_MAX_PARTS, s;
    double eff[FA_MAX_PARTS + 1], best = 0.0;
    int64_t capacity;
    if (p->num_splits) return p->num_splits;
    if (!one_per_sm &&
        (cudaFuncSetAttribute(k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k->smem) !=
             cudaSuccess ||
         cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k->fn, k->threads, k->smem) !=
             cudaSuccess)) {
        cudaGetLastError(); /* no estimate: no split; the launch reports a real error */
        return 1;
    }
    capacity = (int64_t)(per_sm > 0 ? per_sm : 1) * dev->sms;
    if (base_ctas * 5 >= capacity * 4 || most < 2) return 1;
    for (s = 1; s <= most; ++s) {
        const int64_t ctas = base_ctas * s, waves = (ctas + capacity - 1) / capacity;
        eff[s] = (double)ctas / (double)(waves * capacity);
        if (eff[s] > best) best = eff[s];
    }
    for (s = 1; s < most && eff[s] < 0.95 * best; ++s) {
    }
    return s;
}

/* A validated forward and the kernel that runs it. */
typedef struct fa_i_forward_plan {
    fa_params p; /* resolved */
    const fa_i_kernels *k;
    int algorithm;    /* 1 FA1, 2 FA2, 3 FA3, 4 decode */
    size_t workspace; /* bytes it needs */
    fa_i_decode_args decode; /* decode only: its kernel and launch, CTAs decode_ctas */
    const fa_i_kernel *decode_k;
    int64_t decode_ctas;
    int early_combine;       /* decode: its combine a programmatic dependent launch (9.0+) */
#if FA_I_SM90
    const fa_i_kernel *fa3; /* FA3 only: the tile variant, its maps and grid */
    fa_i_tma_maps maps;
    int ctas;
#endif
} fa_i_forward_plan;

/* The decode path for p (seqlen_q <= FA_I_DECODE_MAX_Q, its kernel fits the
   device): packed rows, row blocks and splits; the library's own split count
   only where `workspace` bytes hold its parts. 0 where p takes another path. */
static fa_status fa_i_plan_decode(fa_i_forward_plan *plan, const fa_i_device *dev,
                                  size_t workspace, int *taken)
{
    const fa_params *p = &plan->p;
    const fa_i_kernel *k = &plan->k->decode[FA_I_DECODE_DENSE], *wg;
    const int packed = p->heads_q / p->heads_kv * p->seqlen_q;
    fa_i_decode_args *a = &plan->decode;
    int64_t base;
    fa_i_decode_kind kind;
    *taken = 0;
    if (FA_VARIANT != 2 || p->seqlen_q > FA_I_DECODE_MAX_Q || !k->fn ||
        (size_t)dev->smem_optin < k->smem) {
        if (p->num_splits > 1)
            return fa_i_fail(FA_ERR_UNSUPPORTED,
                             "num_splits %d: the GPU splits keys for seqlen_q <= %d only "
                             "(with the decode kernel built and fitting the device)",
                             p->num_splits, FA_I_DECODE_MAX_Q);
        return FA_OK;
    }
    memset(a, 0, sizeof *a);
    /* the kernel of the rows' kind (fa_i_decode_kind), more than 32 packed
       rows on Hopper's wgmma ones: their sm_90a code runs here where the FA3
       forward's of their unit does (the same targets; they have no static
       shared memory to tell by themselves, and an sm_90 build without the a
       features gives them empty bodies) */
    kind = p->head_dim != plan->k->head_dim || p->head_dim_v != plan->k->head_dim
               ? FA_I_DECODE_GENERAL
           : !p->block_table                 ? FA_I_DECODE_DENSE
           : p->page_size % k->keys == 0 && plan->k->decode[FA_I_DECODE_PAGES].fn
               ? FA_I_DECODE_PAGES
           : p->page_size % 16 == 0 && plan->k->decode[FA_I_DECODE_SLICES].fn
               ? FA_I_DECODE_SLICES
               : FA_I_DECODE_GENERAL;
    k = &plan->k->decode[kind];
    wg = &plan->k->decode_wg[kind];
    if (packed > 32 && wg->fn && (size_t)dev->smem_optin >= wg->smem &&
        fa_i_fa3_compiled(plan->k->fa3_fwd[0].fn, plan->k->fa3_fwd[0].smem, dev))
        k = wg;
    plan->decode_k = k;
    a->row_tiles = packed <= 16 ? 1 : packed <= 32 || k->rows < 64 ? 2 : 4; /* k->rows: 64 or 32 */
    a->row_blocks = fa_i_blocks(packed, 16 * a->row_tiles);
    base = (int64_t)p->batch * p->heads_kv * a->row_blocks;
    /* waves of one CTA an SM, but where the instructions a byte are more:
       the general kernels' page lookups (and column masks), the slice walk
       over d = 64's tiles (half d = 128's bytes for the same walk), and row
       blocks that share each K/V tile (through L2, more arithmetic a
       byte), which keep more CTAs an SM in flight */
    a->splits = fa_i_decode_splits(p, k, base,
                                   a->row_blocks == 1 &&
                                       (kind == FA_I_DECODE_DENSE || kind == FA_I_DECODE_PAGES ||
                                        (kind == FA_I_DECODE_SLICES && plan->k->head_dim > 64)),
                                   dev);
    a->part_floats = /* rows of the kernels' head dim */
        (int64_t)fa_i_round4((size_t)p->batch * p->seqlen_q * p->heads_q * plan->k->head_dim);
    a->lse_floats = (int64_t)fa_i_round4((size_t)p->batch * p->heads_q * p->seqlen_q);
    plan->workspace = a->splits > 1 ? sizeof(float) * a->splits * (a->part_floats + a->lse_floats) : 0;
    if (!p->num_splits && plan->workspace > workspace) { /* too little room: one split */
        a->splits = 1;
        plan->workspace = 0;
    }
    plan->decode_ctas = base * a->splits;
    if (plan->decode_ctas > 0x7fffffff)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "%lld decode CTAs", (long long)plan->decode_ctas);
    plan->early_combine = dev->major >= 9;
    plan->algorithm = 4;
    *taken = 1;
    return FA_OK;
}

/* Plans the forward of params for a workspace of `workspace` bytes
   (SIZE_MAX: as much as the plan wants). */
static fa_status fa_i_plan_forward(const fa_params *params, size_t workspace,
                                   fa_i_forward_plan *plan)
{
    fa_i_device dev;
    int taken;
    fa_status s = fa_i_cuda_check(params, FA_PASS_FORWARD, 0, &plan->p, &plan->k, &dev);
    if (s != FA_OK) return s;
    plan->workspace = 0;
    if (plan->p.dtype == FA_DTYPE_FP8_E4M3) { /* the FA3 kernel or nothing */
#if FA_I_SM90 && FA_VARIANT == 2
        /* t1's 192-key tiles where K and V have one descale per head or
           tensor (a tile of t0 sits in one FA_FP8_BLOCK), else t0 */
        const fa_i_kernel *wide = &plan->k->fa3_fwd[1];
        if (plan->p.num_splits > 1)
            return fa_i_fail(FA_ERR_UNSUPPORTED, "num_splits %d: fp8 takes no key splits",
                             plan->p.num_splits);
        plan->fa3 = wide->fn && plan->p.fp8_scaling != FA_FP8_SCALE_BLOCK &&
                            fa_i_fa3_compiled(wide->fn, wide->smem, &dev)
                        ? wide
                        : &plan->k->fa3_fwd[0];
        if (fa_i_fa3_ready(&plan->p, plan->fa3, &dev, &plan->maps, &plan->ctas)) {
            plan->algorithm = 3;
            return FA_OK;
        }
#endif
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "fp8 runs on the FA3 kernel only: an sm_90a build (FA_VARIANT 2) on "
                         "compute capability 9.0, d = 64, 128 or 256");
    }
    if ((s = fa_i_plan_decode(plan, &dev, workspace, &taken)) != FA_OK || taken) return s;
#if FA_VARIANT == 1
    plan->algorithm = 1;
    plan->workspace = sizeof(float) * (size_t)plan->p.batch * plan->p.heads_q * plan->p.seqlen_q *
                      (plan->p.head_dim + 2);
#else
#if FA_I_SM90
    plan->fa3 = fa_i_fa3_pick(&plan->p, plan->k);
    plan->algorithm = fa_i_fa3_ready(&plan->p, plan->fa3, &dev, &plan->maps, &plan->ctas) ? 3 : 2;
#else
    plan->algorithm = 2;
#endif
#endif
    return FA_OK;
}

/* A ragged batch's plan (call: forward or backward, not run). */
static fa_status fa_i_seq_plan(const fa_params *params, fa_pass pass, int deterministic,
                               fa_i_seq_call *call)
{
    memset(call, 0, sizeof *call);
    call->pass = pass, call->deterministic = deterministic;
    return fa_i_seq_run(params, call);
}

FA_API size_t fa_cuda_forward_workspace_size(const fa_params *params)
{
    fa_i_forward_plan plan;
    fa_i_seq_call call;
    if (FA_I_BY_SEQUENCE(params))
        return fa_i_seq_plan(params, FA_PASS_FORWARD, 0, &call) == FA_OK ? call.need : 0;
    return fa_i_plan_forward(params, (size_t)-1, &plan) == FA_OK ? plan.workspace : 0;
}

/* Launches a combine kernel over a resolved merge whose parts are args; early:
   as a programmatic dependent launch (fa_i_launch_ex) after the kernel that
   writes the parts. */
static fa_status fa_i_launch_combine(const fa_combine_params *c, fa_i_combine_args *args,
                                     cudaStream_t stream, int early)
{
    const int64_t rows = (int64_t)c->batch * c->heads * c->seqlen;
    /* a warp per 32 columns where rows are few (decode's splits: spread
       them over the SMs), a lane per 4 columns where they are many (long
       chunks: fewer warps, each its LSEs once) */
    const void *const kernels[2][2] = {
        /* [fp32 parts][many rows] */
        {(const void *)fa_i_combine_1, (const void *)fa_i_combine_many},
        {(const void *)fa_i_combine_f32_1, (const void *)fa_i_combine_f32_many}};
    const int many = rows >= FA_I_COMBINE_MANY_ROWS, f32 = c->part_dtype == FA_DTYPE_F32;
    return fa_i_launch_ex(kernels[f32][many],
                          dim3(fa_i_blocks(rows, fa_i_combine_rows(c->head_dim,
                                                                   many ? FA_I_COMBINE_COLS : 1))),
                          FA_I_COMBINE_THREADS, 0, stream, c, args, early);
}

/* fa_i_fwd_decode, then the combine of its splits (parts at workspace). */
static fa_status fa_i_run_decode(fa_i_forward_plan *plan, void *workspace, cudaStream_t stream)
{
    const fa_params *p = &plan->p;
    fa_i_decode_args *a = &plan->decode;
    const int part_d = plan->k->head_dim; /* a part's row: the first head_dim columns count */
    const fa_i_kernel *k = plan->decode_k;
    fa_status s;
    if (a->splits > 1) {
        a->o_part = (float *)workspace;
        a->lse_part = a->o_part + a->splits * a->part_floats;
    }
    s = fa_i_launch(k->fn, dim3((unsigned)plan->decode_ctas), k->threads, k->smem, stream, p, a);
    if (s == FA_OK && a->splits > 1) {
        fa_combine_params c;
        fa_i_combine_args parts;
        int i;
        memset(&c, 0, sizeof c);
        c.num_parts = a->splits;
        c.batch = p->batch, c.heads = p->heads_q, c.seqlen = p->seqlen_q, c.head_dim = p->head_dim_v;
        c.part_dtype = FA_DTYPE_F32;
        c.part_layout.head = part_d;
        c.part_layout.seq = (int64_t)p->heads_q * part_d;
        c.part_layout.batch = (int64_t)p->seqlen_q * p->heads_q * part_d;
        c.dtype = p->dtype, c.o = p->o, c.o_layout = p->o_layout, c.lse = p->lse;
        for (i = 0; i < a->splits; ++i) {
            parts.o[i] = a->o_part + i * a->part_floats;
            parts.lse[i] = a->lse_part + i * a->lse_floats;
        }
        s = fa_i_launch_combine(&c, &parts, stream, plan->early_combine);
    }
    return s;
}

FA_API fa_status fa_cuda_forward(const fa_params *params, void *workspace, size_t workspace_size,
                                 cudaStream_t stream)
{
    fa_i_forward_plan plan;
    const fa_params *p = &plan.p;
    fa_status s;
    if (FA_I_BY_SEQUENCE(params)) {
        fa_i_seq_call call;
        memset(&call, 0, sizeof call);
        call.pass = FA_PASS_FORWARD, call.run = 1, call.stream = stream;
        call.workspace = workspace, call.workspace_size = workspace ? workspace_size : 0;
        return fa_i_seq_run(params, &call);
    }
    if ((s = fa_i_plan_forward(params, workspace ? workspace_size : 0, &plan)) != FA_OK) return s;
    if (plan.workspace && (!workspace || workspace_size < plan.workspace || (uintptr_t)workspace % 16))
        return fa_i_fail(FA_ERR_WORKSPACE, "this forward needs %zu bytes of workspace, 16-byte aligned",
                         plan.workspace);
    if ((s = fa_i_check_aliasing(p, FA_PASS_FORWARD, workspace, plan.workspace)) != FA_OK) return s;
#if FA_VARIANT == 1
    {
        const size_t smem = sizeof(float) * FA_I_FA1_KEYS * (2 * p->head_dim + FA_I_FA1_THREADS);
        return fa_i_launch((const void *)fa_i_fwd_fa1, dim3(p->batch * p->heads_q),
                           FA_I_FA1_THREADS, smem, stream, p, &workspace);
    }
#else
    if (plan.algorithm == 4) return fa_i_run_decode(&plan, workspace, stream);
#if FA_I_SM90
    if (plan.algorithm == 3) /* fa_i_fwd_fa3 */
        return fa_i_launch(plan.fa3->fn, dim3(plan.ctas), plan.fa3->threads, plan.fa3->smem,
                           stream, p, &plan.maps);
#endif
    return fa_i_launch(plan.k->fa2_fwd.fn, /* fa_i_fwd_fa2 */
                       dim3(fa_i_blocks(p->seqlen_q, plan.k->fa2_fwd.rows), p->heads_q, p->batch),
                       plan.k->fa2_fwd.threads, plan.k->fa2_fwd.smem, stream, p, &workspace);
#endif
}

FA_API fa_status fa_cuda_quantize_fp8(const fa_quantize_params *params, cudaStream_t stream)
{
    fa_quantize_params p;
    fa_i_device dev;
    struct cudaFuncAttributes attr;
    const void *kernel;
    cudaError_t e;
    static_assert(FA_FP8_BLOCK <= FA_I_QUANT_ITERS * FA_I_QUANT_WARPS * 32 * FA_I_QUANT_RUN / FA_MAX_HEAD_DIM &&
                      FA_FP8_BLOCK <= FA_I_QUANT_WARPS * 32 * FA_I_QUANT_RUN / 128 &&
                      FA_MAX_HEAD_DIM / 32 <= FA_I_QUANT_WARPS,
                  "flashattn: the quantize CTA's lanes hold fewer rows than a block");
    fa_status s = fa_quantize_resolve(params, &p);
    if (s != FA_OK) return s;
    if (p.scaling != FA_FP8_SCALE_BLOCK)
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "the GPU quantizes with block scaling; per head or tensor: fa_cpu_quantize_fp8");
    if (p.heads > 65535 || p.batch > 65535)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "heads and batch must be <= 65535");
    if ((e = fa_i_device_facts(&dev)) != cudaSuccess)
        return fa_i_cuda_error(e, "querying the current device");
    if (dev.major * 10 + dev.minor < 89)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "fp8 needs compute capability 8.9, not %d.%d",
                         dev.major, dev.minor);
    /* a build without code for this device has only the stub: no static smem */
    if (!p.hadamard && p.dtype != FA_DTYPE_F32) /* fa_i_quantize_block_raw */
        kernel = p.head_dim <= 128 ? (const void *)fa_i_quantize_fp8_short_raw
                                   : (const void *)fa_i_quantize_fp8_long_raw;
    else
        kernel = p.head_dim <= 128 ? (const void *)fa_i_quantize_fp8_short
                                   : (const void *)fa_i_quantize_fp8_long;
    if ((e = cudaFuncGetAttributes(&attr, kernel)) != cudaSuccess || attr.sharedSizeBytes == 0) {
        cudaGetLastError();
        return fa_i_fail(FA_ERR_UNSUPPORTED, "this build has no fp8 quantize kernel for the device");
    }
    return fa_i_launch(kernel, dim3(fa_i_blocks(p.seqlen, FA_FP8_BLOCK), p.heads, p.batch),
                       32 * fa_i_quant_warps(p.head_dim), 0, stream, &p, NULL);
}

FA_API fa_status fa_cuda_combine(const fa_combine_params *params, cudaStream_t stream)
{
    fa_combine_params c;
    fa_i_combine_args parts;
    int i;
    fa_status s = fa_combine_resolve(params, &c);
    if (s != FA_OK) return s;
    for (i = 0; i < c.num_parts; ++i) {
        parts.o[i] = c.o_parts[i];
        parts.lse[i] = c.lse_parts[i];
    }
    return fa_i_launch_combine(&c, &parts, stream, 0);
}

FA_API int fa_cuda_forward_algorithm(const fa_params *params)
{
    fa_i_forward_plan plan;
    fa_i_seq_call call;
    if (FA_I_BY_SEQUENCE(params))
        return fa_i_seq_plan(params, FA_PASS_FORWARD, 0, &call) == FA_OK ? call.algorithm : 0;
    return fa_i_plan_forward(params, (size_t)-1, &plan) == FA_OK ? plan.algorithm : 0;
}

/* Floats of the atomic mode's dQ accumulator (fa_i_dq_blocks per head) for
   kernels of head dim acc_d. */
static size_t fa_i_dq_acc_floats(const fa_params *p, int acc_d)
{
    return (size_t)p->batch * p->heads_q * fa_i_dq_blocks(p) * 64 * acc_d;
}

/* Staged gradients (accumulate_grads or grads_f32): dQ, dK, dV of the
   kernels in the dtype, each 16-byte aligned, after the backward's own
   workspace; 0 bytes when the kernels write the caller's tensors. */
static size_t fa_i_grad_stage_bytes(const fa_params *p, size_t *dq_bytes, size_t *dk_bytes)
{
    const size_t es = fa_dtype_size(p->dtype);
    const size_t kv_rows = (size_t)p->batch * p->seqlen_k * p->heads_kv;
    *dq_bytes = ((size_t)p->batch * p->seqlen_q * p->heads_q * p->head_dim * es + 15) / 16 * 16;
    *dk_bytes = (kv_rows * p->head_dim * es + 15) / 16 * 16;
    return p->accumulate_grads || p->grads_f32
               ? *dq_bytes + *dk_bytes + (kv_rows * p->head_dim_v * es + 15) / 16 * 16
               : 0;
}

/* The backward's own workspace: D, then (atomic mode) the dQ accumulator. */
static size_t fa_i_bwd_own_bytes(const fa_params *p, int deterministic, int acc_d)
{
    return sizeof(float) * (fa_i_round4((size_t)p->batch * p->heads_q * p->seqlen_q) +
                            (deterministic ? 0 : fa_i_dq_acc_floats(p, acc_d)));
}

/* A validated backward and the kernels that run it. */
typedef struct fa_i_backward_plan {
    fa_params p; /* resolved */
    const fa_i_kernels *k;
    const fa_i_kernel *kv; /* FA2's dK/dV kernel */
    int algorithm;         /* 2 FA2, 3 FA3 */
#if FA_I_SM90
    fa_i_fa3_bwd_args fa3; /* FA3 only */
#endif
} fa_i_backward_plan;

static fa_status fa_i_plan_backward(const fa_params *params, int deterministic,
                                    fa_i_backward_plan *plan)
{
    fa_i_device dev;
    fa_status s =
        fa_i_cuda_check(params, FA_PASS_BACKWARD, deterministic, &plan->p, &plan->k, &dev);
    if (s != FA_OK) return s;
    plan->algorithm = 2;
    plan->kv = fa_i_fa2_bwd_kv_kernel(plan->k, deterministic, &dev); /* found by the check */
#if FA_I_SM90
    if (!deterministic && fa_i_fa3_bwd_ready(&plan->p, &plan->k->fa3_bwd, &dev, &plan->fa3))
        plan->algorithm = 3;
#endif
    /* The FA2 atomic mode's dK/dV kernels for sm_90 read V with Q's column
       count (FA_I_BWD_COLS_V): Hopper's atomic backward takes a V head dim
       of its own on the FA3 kernel only (test builds acting as a smaller
       device run the pre-Hopper rule) */
#ifndef FA_I_TEST_SMEM_OPTIN
    if (plan->algorithm != 3 && plan->p.head_dim_v != plan->p.head_dim && !deterministic &&
        dev.major >= 9)
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "head_dim_v %d != head_dim %d: on compute capability 9.0 and later the "
                         "atomic-mode backward runs it on the FA3 kernels only (not in this "
                         "build); the deterministic mode runs it",
                         plan->p.head_dim_v, plan->p.head_dim);
#endif
    return FA_OK;
}

FA_API size_t fa_cuda_backward_workspace_size(const fa_params *params, int deterministic)
{
    fa_i_backward_plan plan;
    size_t dq_bytes, dk_bytes;
    fa_i_seq_call call;
    if (FA_I_BY_SEQUENCE(params))
        return fa_i_seq_plan(params, FA_PASS_BACKWARD, deterministic, &call) == FA_OK ? call.need
                                                                                          : 0;
    if (fa_i_plan_backward(params, deterministic, &plan) != FA_OK) return 0;
    return fa_i_bwd_own_bytes(&plan.p, deterministic, plan.k->head_dim) +
           fa_i_grad_stage_bytes(&plan.p, &dq_bytes, &dk_bytes);
}

FA_API int fa_cuda_backward_algorithm(const fa_params *params, int deterministic)
{
    fa_i_backward_plan plan;
    fa_i_seq_call call;
    if (FA_I_BY_SEQUENCE(params))
        return fa_i_seq_plan(params, FA_PASS_BACKWARD, deterministic, &call) == FA_OK
                   ? call.algorithm
                   : 0;
    return fa_i_plan_backward(params, deterministic, &plan) == FA_OK ? plan.algorithm : 0;
}

FA_API fa_status fa_cuda_supported(const fa_params *params, fa_pass pass)
{
    fa_i_forward_plan plan;
    fa_i_backward_plan bwd;
    fa_i_seq_call call;
    if (FA_I_BY_SEQUENCE(params)) return fa_i_seq_plan(params, pass, 0, &call);
    if (pass == FA_PASS_FORWARD) return fa_i_plan_forward(params, (size_t)-1, &plan);
    return fa_i_plan_backward(params, 0, &bwd);
}

/* The staged gradients into the caller's dq, dk, dv (fa_i_bwd_grads_out). */
static fa_status fa_i_bwd_stage_out(const fa_params *caller, const fa_params *staged,
                                    cudaStream_t stream)
{
    fa_i_grad_out g[3];
    fa_status s = FA_OK;
    int i;
    g[0].src = (const uint16_t *)staged->dq, g[0].dst = caller->dq, g[0].dst_layout = caller->dq_layout;
    g[1].src = (const uint16_t *)staged->dk, g[1].dst = caller->dk, g[1].dst_layout = caller->dk_layout;
    g[2].src = (const uint16_t *)staged->dv, g[2].dst = caller->dv, g[2].dst_layout = caller->dv_layout;
    for (i = 0; i < 3; ++i) {
        g[i].batch = caller->batch;
        g[i].seq = i ? caller->seqlen_k : caller->seqlen_q;
        g[i].heads = i ? caller->heads_kv : caller->heads_q;
        g[i].d = i == 2 ? caller->head_dim_v : caller->head_dim;
    }
    for (i = 0; i < 3 && s == FA_OK; ++i)
        s = fa_i_launch((const void *)fa_i_bwd_grads_out,
                        dim3(fa_i_blocks((int64_t)g[i].batch * g[i].seq * g[i].heads * (g[i].d / 8),
                                         256)),
                        256, 0, stream, caller, &g[i]);
    return s;
}

/* The backward's preprocess over p's query rows: D, and the dQ accumulator
   zeroed where a->dq_acc is set (fa_i_pre_lanes(acc_d) threads a padded
   accumulator row). */
static fa_status fa_i_bwd_pre(const fa_params *p, fa_i_bwd_args *a, cudaStream_t stream)
{
    const int64_t threads = (int64_t)(fa_i_dq_acc_floats(p, a->acc_d) / a->acc_d) *
                            fa_i_pre_lanes(a->acc_d);
    return fa_i_launch((const void *)fa_i_bwd_preprocess, dim3(fa_i_blocks(threads, 256)), 256, 0,
                       stream, p, a);
}

/* Its postprocess: dQ from the accumulator (64 rows x d / 16 threads a block). */
static fa_status fa_i_bwd_post(const fa_params *p, fa_i_bwd_args *a, cudaStream_t stream)
{
    return fa_i_launch((const void *)fa_i_bwd_postprocess,
                       dim3(fa_i_blocks((int64_t)fa_i_dq_acc_floats(p, a->acc_d) / 16, 256)), 256,
                       0, stream, p, a);
}

FA_API fa_status fa_cuda_backward(const fa_params *params, int deterministic, void *workspace,
                                  size_t workspace_size, cudaStream_t stream)
{
    fa_i_backward_plan plan;
    const fa_params *p = &plan.p;
    const fa_i_kernels *k = NULL;
    fa_i_bwd_args a;
    fa_params caller, staged;
    int64_t rows;
    size_t need, own, dq_bytes, dk_bytes;
    fa_status s;
    if (FA_I_BY_SEQUENCE(params)) {
        fa_i_seq_call call;
        memset(&call, 0, sizeof call);
        call.pass = FA_PASS_BACKWARD, call.deterministic = deterministic, call.run = 1;
        call.workspace = workspace, call.workspace_size = workspace_size, call.stream = stream;
        return fa_i_seq_run(params, &call);
    }
    /* accumulate_grads, grads_f32: the kernels write the gradients to the
       workspace in the dtype, then fa_i_bwd_grads_out takes them out */
    if ((s = fa_i_plan_backward(params, deterministic, &plan)) != FA_OK) return s;
    caller = plan.p, k = plan.k;
    own = fa_i_bwd_own_bytes(&caller, deterministic, k->head_dim);
    need = own + fa_i_grad_stage_bytes(&caller, &dq_bytes, &dk_bytes);
    if (!workspace || workspace_size < need || (uintptr_t)workspace % 16)
        return fa_i_fail(FA_ERR_WORKSPACE, "backward needs %zu bytes, 16-byte aligned", need);
    if ((s = fa_i_check_aliasing(&caller, FA_PASS_BACKWARD, workspace, need)) != FA_OK) return s;
    staged = caller;
    if (need > own) {
        char *at = (char *)workspace + own;
        memset(&staged.dq_layout, 0, sizeof staged.dq_layout);
        memset(&staged.dk_layout, 0, sizeof staged.dk_layout);
        memset(&staged.dv_layout, 0, sizeof staged.dv_layout);
        staged.dq = at, staged.dk = at + dq_bytes, staged.dv = at + dq_bytes + dk_bytes;
        staged.accumulate_grads = staged.grads_f32 = 0;
    }
    if ((s = fa_i_plan_backward(&staged, deterministic, &plan)) != FA_OK) return s;
    k = plan.k;
    rows = (int64_t)p->batch * p->heads_q * p->seqlen_q;
    a.dsum = (float *)workspace; /* [rows], then the dQ accumulator 16-byte aligned */
    a.dq_acc = deterministic ? NULL : a.dsum + fa_i_round4((size_t)rows);
    a.acc_d = k->head_dim;
    a.acc_rows = NULL;
    s = fa_i_bwd_pre(p, &a, stream);
#if FA_I_SM90
    if (plan.algorithm == 3) { /* fa_i_bwd_fa3 */
        plan.fa3.a = a;
        if (s == FA_OK)
            s = fa_i_launch(k->fa3_bwd.fn,
                            dim3(fa_i_blocks(p->seqlen_k, k->fa3_bwd.keys), p->heads_kv, p->batch),
                            k->fa3_bwd.threads, k->fa3_bwd.smem, stream, p, &plan.fa3);
    } else
#endif
    {
        const fa_i_kernel *kv = plan.kv; /* fa_i_bwd_kv_fa2 */
        if (s == FA_OK)
            s = fa_i_launch(kv->fn, dim3(fa_i_blocks(p->seqlen_k, kv->keys), p->heads_kv, p->batch),
                            kv->threads, kv->smem, stream, p, &a);
        if (s == FA_OK && deterministic) /* fa_i_bwd_q_fa2 */
            s = fa_i_launch(k->fa2_bwd_q.fn,
                            dim3(fa_i_blocks(p->seqlen_q, k->fa2_bwd_q.rows), p->heads_q, p->batch),
                            k->fa2_bwd_q.threads, k->fa2_bwd_q.smem, stream, p, &a);
    }
    if (s == FA_OK && !deterministic) s = fa_i_bwd_post(p, &a, stream);
    if (s == FA_OK && need > own) s = fa_i_bwd_stage_out(&caller, p, stream);
    return s;
}

/* Ragged batches (varlen): cu_seqlens_q/k and seqused_k in host memory, as
   on the CPU; each sequence runs as a dense problem of batch 1, in order on
   the stream, on the dense path's kernels. Its LSE rows move between
   varlen's [Hq, total_q] and a dense [Hq, nq] block at the workspace's
   start by 2-D copies; rows that see no key and keys no row sees are filled
   (fa_i_fill_rows). Every sequence is planned, and checked, before anything
   is enqueued. */
/* A tensor whose rows a fill sets: base, layout, heads, d, dtype (the rows
   and value: the fill's). */
static void fa_i_fill_of(fa_i_fill_args *f, void *base, const fa_layout *l, int heads, int d,
                         fa_dtype dtype)
{
    memset(f, 0, sizeof *f);
    f->base = base, f->l = *l, f->heads = heads, f->d = d, f->dtype = dtype;
}

static fa_status fa_i_fill(void *base, const fa_layout *l, int rows, int heads, int d,
                           fa_dtype dtype, float value, cudaStream_t stream)
{
    fa_i_fill_args a;
    const int64_t n = (int64_t)rows * heads * d;
    if (n <= 0) return FA_OK;
    fa_i_fill_of(&a, base, l, heads, d, dtype);
    a.rows = rows, a.value = value;
    return fa_i_launch((const void *)fa_i_fill_rows, dim3(fa_i_blocks(n, 256)), 256, 0, stream, &a,
                       NULL);
}

/* heads rows of n floats from src (rows src_pitch floats apart) to dst
   (dst_pitch apart). */
static fa_status fa_i_copy_rows(float *dst, int dst_pitch, const float *src, int src_pitch, int n,
                                int heads, cudaStream_t stream)
{
    cudaError_t e;
    if (n <= 0) return FA_OK;
    e = cudaMemcpy2DAsync(dst, sizeof(float) * dst_pitch, src, sizeof(float) * src_pitch,
                          sizeof(float) * n, heads, cudaMemcpyDeviceToDevice, stream);
    return e == cudaSuccess ? FA_OK : fa_i_cuda_error(e, "cudaMemcpy2DAsync of LSE rows");
}

/* A sequence with queries but no keys: O = 0, LSE = -inf (lse_l: [Hq, total_q]). */
static fa_status fa_i_varlen_no_keys(const fa_params *p, const fa_params *seq, int q0,
                                     const fa_layout *lse_l, cudaStream_t stream)
{
    fa_status s = fa_i_fill(seq->o, &p->o_layout, seq->seqlen_q, p->heads_q, p->head_dim_v,
                            p->o_dtype, 0.0f, stream);
    if (s == FA_OK && p->lse)
        s = fa_i_fill(p->lse + q0, lse_l, seq->seqlen_q, p->heads_q, 1, FA_DTYPE_F32, -INFINITY,
                      stream);
    return s;
}

#if FA_I_SM90
/* A ragged batch in one launch of an FA3 kernel (DESIGN.md, ragged
   batches): per sequence with queries and keys its tensor maps and entry,
   and the kernel's work items in schedule order, staged on the stack and
   copied into the workspace (the maps first, 64-byte aligned) in chunks.
   Sequences go by the power of two of their work (nq nk), largest first,
   so that the lightest items run last. */
#define FA_I_VARLEN_SEQS 16    /* sequences staged per copy */
#define FA_I_VARLEN_ITEMS 512  /* work items staged per copy */
typedef struct fa_i_varlen_stage {
    union { /* the sequences' maps */
        fa_i_tma_maps fwd[FA_I_VARLEN_SEQS];
        fa_i_fa3_bwd_args bwd[FA_I_VARLEN_SEQS];
    } maps;
    fa_i_fa3_seq seqs[FA_I_VARLEN_SEQS];
    int2 items[FA_I_VARLEN_ITEMS];
    int n_seqs, n_items;       /* staged */
    int seqs_done, items_done; /* copied */
    size_t map_bytes;          /* of one sequence's maps */
    char *dev_maps;
    fa_i_fa3_seq *dev_seqs;
    int2 *dev_items;
    cudaStream_t stream;
} fa_i_varlen_stage;

/* The work class (fa_i_work_class) of sequence b of a ragged batch p. */
static int fa_i_varlen_class(const fa_params *p, int b)
{
    int nq, nk;
    fa_i_varlen_sequence(p, b, &nq, &nk);
    return fa_i_work_class(nq, nk);
}

/* The workspace a one-launch call needs: the maps (map_bytes a sequence,
   64-byte aligned), entries and items. */
static size_t fa_i_varlen_bytes(int seqs, int64_t items, size_t map_bytes)
{
    return 64 + (map_bytes + sizeof(fa_i_fa3_seq)) * seqs + sizeof(int2) * (size_t)items;
}

/* The stage for a workspace laid out as fa_i_varlen_bytes says. */
static void fa_i_varlen_layout(fa_i_varlen_stage *st, void *workspace, int seqs, size_t map_bytes,
                               cudaStream_t stream)
{
    memset(st, 0, sizeof *st);
    st->map_bytes = map_bytes, st->stream = stream;
    st->dev_maps = (char *)(((uintptr_t)workspace + 63) & ~(uintptr_t)63);
    st->dev_seqs = (fa_i_fa3_seq *)(st->dev_maps + map_bytes * seqs);
    st->dev_items = (int2 *)(st->dev_seqs + seqs);
}

/* Copies the staged sequences (maps, entries) into the workspace. A
   sequence's maps are staged before its items, its entry after them, so
   the two kinds flush apart: a flush of items between them must not move
   the sequence's slot. */
static fa_status fa_i_varlen_flush_seqs(fa_i_varlen_stage *st)
{
    cudaError_t e = cudaSuccess;
    if (st->n_seqs &&
        ((e = cudaMemcpyAsync(st->dev_maps + st->map_bytes * st->seqs_done, &st->maps,
                              st->map_bytes * st->n_seqs, cudaMemcpyHostToDevice, st->stream)) !=
             cudaSuccess ||
         (e = cudaMemcpyAsync(st->dev_seqs + st->seqs_done, st->seqs,
                              sizeof(fa_i_fa3_seq) * st->n_seqs, cudaMemcpyHostToDevice,
                              st->stream)) != cudaSuccess))
        return fa_i_cuda_error(e, "cudaMemcpyAsync of the varlen schedule");
    st->seqs_done += st->n_seqs, st->n_seqs = 0;
    return FA_OK;
}

/* Copies the staged work items into the workspace. */
static fa_status fa_i_varlen_flush_items(fa_i_varlen_stage *st)
{
    cudaError_t e = cudaSuccess;
    if (st->n_items &&
        (e = cudaMemcpyAsync(st->dev_items + st->items_done, st->items, sizeof(int2) * st->n_items,
                             cudaMemcpyHostToDevice, st->stream)) != cudaSuccess)
        return fa_i_cuda_error(e, "cudaMemcpyAsync of the varlen schedule");
    st->items_done += st->n_items, st->n_items = 0;
    return FA_OK;
}

/* Stages one work item {x, y}. */
static fa_status fa_i_varlen_item(fa_i_varlen_stage *st, int x, int y)
{
    st->items[st->n_items].x = x, st->items[st->n_items].y = y;
    return ++st->n_items == FA_I_VARLEN_ITEMS ? fa_i_varlen_flush_items(st) : FA_OK;
}

/* The schedule's index of the sequence being staged. */
static int fa_i_varlen_current(const fa_i_varlen_stage *st) { return st->seqs_done + st->n_seqs; }

/* The FA3 forward's items of the sequence being staged: its query tiles of
   every head, in the kernel's order (fa_i_fa3_tile_item). */
static fa_status fa_i_varlen_fa3_tiles(fa_i_varlen_stage *st, int heads, int blocks_m, int causal)
{
    fa_status s = FA_OK;
    int h, r;
    for (h = 0; h < heads && s == FA_OK; ++h)
        for (r = 0; r < blocks_m && s == FA_OK; ++r)
            s = fa_i_varlen_item(st, fa_i_varlen_current(st), fa_i_fa3_tile_item(h, r, blocks_m, causal));
    return s;
}

/* The entry of the sequence being staged (its maps go at the same index). */
static fa_i_fa3_seq *fa_i_varlen_entry(fa_i_varlen_stage *st)
{
    fa_i_fa3_seq *e = &st->seqs[st->n_seqs];
    memset(e, 0, sizeof *e);
    return e;
}

/* The sequence staged: its maps, items and entry are in. */
static fa_status fa_i_varlen_push(fa_i_varlen_stage *st)
{
    return ++st->n_seqs == FA_I_VARLEN_SEQS ? fa_i_varlen_flush_seqs(st) : FA_OK;
}

/* The same for sequence b of a ragged batch p. */
static fa_status fa_i_varlen_next(fa_i_varlen_stage *st, const fa_params *p, int b, int acc0)
{
    fa_i_fa3_seq *e = fa_i_varlen_entry(st);
    fa_i_varlen_sequence(p, b, &e->nq, &e->nk);
    e->q0 = p->cu_seqlens_q[b], e->k0 = p->cu_seqlens_k[b], e->acc0 = acc0, e->lse0 = e->q0;
    return fa_i_varlen_push(st);
}

/* Whether a one-launch varlen call may run: the stream is not capturing
   (the copies are from host memory), the workspace holds `need` bytes and
   overlaps no sequence's tensors. */
static fa_status fa_i_varlen_may_run(const fa_params *p, fa_i_seq_call *call, size_t need,
                                     int *may)
{
    cudaStreamCaptureStatus capture;
    int b, nq, nk;
    fa_status s;
    *may = 0;
    if (need > call->need) call->need = need;
    if (!call->run || call->workspace_size < need ||
        cudaStreamIsCapturing(call->stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone)
        return FA_OK;
    for (b = 0; b < p->batch; ++b) {
        const fa_params seq = fa_i_varlen_sequence(p, b, &nq, &nk);
        if (nq && nk && (s = fa_i_check_aliasing(&seq, call->pass, call->workspace, need)) != FA_OK)
            return s;
    }
    *may = 1;
    return FA_OK;
}

/* The longest query sequence with keys (-1: none). */
static int fa_i_varlen_longest(const fa_params *p)
{
    int b, nq, nk, best = -1, best_nq = 0;
    for (b = 0; b < p->batch; ++b) {
        fa_i_varlen_sequence(p, b, &nq, &nk);
        if (nk && nq > best_nq) best = b, best_nq = nq;
    }
    return best;
}

/* The forward: tiles {sequence, head << 16 | query block}, sequence by
   sequence, each head's blocks in the dense schedule's order. Taken where
   the longest sequence's dense plan is the FA3 kernel's; else *taken = 0
   and the caller runs sequence by sequence. */
static fa_status fa_i_varlen_fa3(const fa_params *p, fa_i_seq_call *call, int total_q, int *taken)
{
    fa_i_forward_plan plan;
    fa_i_device dev;
    fa_i_varlen_stage st;
    fa_i_tma_maps maps;
    fa_params run;
    const fa_i_kernel *k;
    int64_t tiles = 0;
    size_t need;
    int nq, nk, b, c, seqs = 0, longest = fa_i_varlen_longest(p), may, most_blocks = 0;
    fa_status s;
    fa_params seq;
    *taken = 0;
    if (longest < 0) return FA_OK;
    seq = fa_i_varlen_sequence(p, longest, &nq, &nk);
    if (nq <= FA_I_DECODE_MAX_Q || fa_i_plan_forward(&seq, (size_t)-1, &plan) != FA_OK ||
        plan.algorithm != 3 || fa_i_device_facts(&dev) != cudaSuccess)
        return FA_OK;
    k = plan.fa3;
    for (b = 0; b < p->batch; ++b) {
        fa_i_varlen_sequence(p, b, &nq, &nk);
        if (!nq || !nk) continue;
        ++seqs;
        tiles += (int64_t)fa_i_blocks(nq, k->rows) * p->heads_q;
        most_blocks = max(most_blocks, fa_i_blocks(nq, k->rows));
    }
    if (tiles > 0x7fffffff || most_blocks > 0xffff) return FA_OK; /* the items' fields */
    need = fa_i_varlen_bytes(seqs, tiles, sizeof(fa_i_tma_maps));
    if ((s = fa_i_varlen_may_run(p, call, need, &may)) != FA_OK || !may) return s;
    fa_i_varlen_layout(&st, call->workspace, seqs, sizeof(fa_i_tma_maps), call->stream);
    for (c = 62; c >= 0; --c)
        for (b = 0; b < p->batch; ++b) {
            if (fa_i_varlen_class(p, b) != c) continue;
            seq = fa_i_varlen_sequence(p, b, &nq, &nk);
            if (!fa_i_fa3_maps(&seq, k, &st.maps.fwd[st.n_seqs])) return FA_OK; /* by sequence */
            if ((s = fa_i_varlen_fa3_tiles(&st, p->heads_q, fa_i_blocks(nq, k->rows), p->causal)) !=
                    FA_OK ||
                (s = fa_i_varlen_next(&st, p, b, 0)) != FA_OK)
                return s;
        }
    if ((s = fa_i_varlen_flush_seqs(&st)) != FA_OK || (s = fa_i_varlen_flush_items(&st)) != FA_OK)
        return s;
    run = plan.p; /* the kernel's params: the longest sequence's, but the varlen LSE */
    run.lse = p->lse;
    memset(&maps, 0, sizeof maps);
    maps.seq_maps = (const fa_i_tma_maps *)st.dev_maps, maps.seqs = st.dev_seqs;
    maps.tiles = st.dev_items, maps.num_tiles = (int)tiles, maps.lse_head = total_q;
    *taken = 1;
    return fa_i_launch(k->fn, dim3(fa_i_fa3_ctas(tiles, &dev)), k->threads, k->smem, call->stream,
                       &run, &maps);
}

/* The backward (atomic mode, gradients straight to the caller's tensors):
   D by the preprocess over the packed rows as one sequence ([Hq, total_q],
   as the LSE), the dQ accumulator zeroed, then the kernel over every
   sequence's key blocks (items {sequence, first key}, grid x) and each kv
   head (grid y), then the postprocess. The accumulator holds each head's
   sequences one after another (fa_i_varlen_acc_blocks), with acc_rows (more
   items) mapping its blocks back. */
static fa_status fa_i_varlen_fa3_bwd(const fa_params *p, fa_i_seq_call *call, int total_q,
                                     int *taken)
{
    fa_i_backward_plan plan;
    fa_i_device dev;
    fa_i_varlen_stage st;
    fa_i_fa3_bwd_args args;
    fa_params run, rows;
    const fa_i_kernel *k;
    int64_t key_blocks = 0, acc_blocks = 0;
    size_t dsum_bytes, acc_bytes, need;
    int nq, nk, b, c, r, seqs = 0, acc0 = 0, longest = fa_i_varlen_longest(p), may;
    fa_status s;
    fa_params seq;
    *taken = 0;
    if (longest < 0 || call->deterministic || p->accumulate_grads || p->grads_f32) return FA_OK;
    seq = fa_i_varlen_sequence(p, longest, &nq, &nk);
    if (fa_i_plan_backward(&seq, 0, &plan) != FA_OK || plan.algorithm != 3 ||
        fa_i_device_facts(&dev) != cudaSuccess)
        return FA_OK;
    k = &plan.k->fa3_bwd_varlen;
    for (b = 0; b < p->batch; ++b) {
        fa_i_varlen_sequence(p, b, &nq, &nk);
        if (!nq || !nk) continue;
        ++seqs;
        key_blocks += fa_i_blocks(nk, k->keys);
        acc_blocks += fa_i_varlen_acc_blocks(nq);
    }
    if (key_blocks > 0x7fffffff || acc_blocks * 64 > 0x7fffffff) return FA_OK;
    dsum_bytes = fa_i_round4((size_t)p->heads_q * total_q) * sizeof(float);
    acc_bytes = (size_t)p->heads_q * acc_blocks * 64 * plan.k->head_dim * sizeof(float);
    need = dsum_bytes + acc_bytes +
           fa_i_varlen_bytes(seqs, key_blocks + acc_blocks, sizeof(fa_i_fa3_bwd_args));
    if ((s = fa_i_varlen_may_run(p, call, need, &may)) != FA_OK || !may) return s;
    memset(&args, 0, sizeof args);
    args.a.dsum = (float *)call->workspace;
    args.a.dq_acc = (float *)((char *)call->workspace + dsum_bytes);
    args.a.acc_d = plan.k->head_dim;
    fa_i_varlen_layout(&st, (char *)call->workspace + dsum_bytes + acc_bytes, seqs,
                       sizeof(fa_i_fa3_bwd_args), call->stream);
    for (c = 62; c >= 0; --c) /* the key blocks */
        for (b = 0; b < p->batch; ++b) {
            if (fa_i_varlen_class(p, b) != c) continue;
            seq = fa_i_varlen_sequence(p, b, &nq, &nk);
            if (!fa_i_fa3_bwd_ready(&seq, k, &dev, &st.maps.bwd[st.n_seqs])) return FA_OK;
            for (r = 0; r < nk; r += k->keys)
                if ((s = fa_i_varlen_item(&st, fa_i_varlen_current(&st), r)) != FA_OK) return s;
            if ((s = fa_i_varlen_next(&st, p, b, acc0)) != FA_OK) return s;
            acc0 += fa_i_varlen_acc_blocks(nq);
        }
    for (c = 62; c >= 0; --c) /* then the accumulator's blocks, in the same order */
        for (b = 0; b < p->batch; ++b) {
            if (fa_i_varlen_class(p, b) != c) continue;
            fa_i_varlen_sequence(p, b, &nq, &nk);
            for (r = 0; r < 64 * fa_i_varlen_acc_blocks(nq); r += 64)
                if ((s = fa_i_varlen_item(&st, p->cu_seqlens_q[b] + r, nq - r)) != FA_OK)
                    return s;
        }
    if ((s = fa_i_varlen_flush_seqs(&st)) != FA_OK || (s = fa_i_varlen_flush_items(&st)) != FA_OK)
        return s;
    *taken = 1;
    /* D over the packed rows: one sequence of total_q rows, no accumulator */
    rows = plan.p;
    rows.batch = 1, rows.seqlen_q = total_q;
    rows.o = p->o, rows.o_layout = p->o_layout;
    rows.dout = p->dout, rows.dout_layout = p->dout_layout;
    args.a.dq_acc = NULL;
    s = fa_i_bwd_pre(&rows, &args.a, call->stream);
    args.a.dq_acc = (float *)((char *)call->workspace + dsum_bytes);
    if (s == FA_OK && cudaMemsetAsync(args.a.dq_acc, 0, acc_bytes, call->stream) != cudaSuccess)
        s = fa_i_cuda_error(cudaGetLastError(), "cudaMemsetAsync of the dQ accumulator");
    /* the kernel's params: the longest sequence's, with the packed LSE, dK, dV */
    run = plan.p;
    run.lse = p->lse, run.dk = p->dk, run.dv = p->dv;
    args.seq_maps = (const fa_i_fa3_bwd_args *)st.dev_maps, args.seqs = st.dev_seqs;
    args.key_blocks = st.dev_items, args.acc_blocks = (int)acc_blocks, args.total_q = total_q;
    if (s == FA_OK)
        s = fa_i_launch(k->fn, dim3((unsigned)key_blocks, p->heads_kv, 1), k->threads, k->smem,
                        call->stream, &run, &args);
    /* dQ: the accumulator as one sequence of acc_blocks 64-row blocks a head */
    rows.seqlen_q = (int)(acc_blocks * 64);
    rows.dq = p->dq, rows.dq_layout = p->dq_layout;
    args.a.acc_rows = st.dev_items + key_blocks;
    if (s == FA_OK) s = fa_i_bwd_post(&rows, &args.a, call->stream);
    return s;
}
#endif

#if FA_I_SM90
/* Carves n bytes, 64-byte aligned (tensor maps, float4 rows), at *at of a
   workspace from base (NULL: only counted). */
static void *fa_i_carve(char *base, size_t *at, size_t n)
{
    void *r;
    *at = (*at + 63) & ~(size_t)63;
    r = base ? base + *at : NULL;
    *at += n;
    return r;
}

/* The workspace of a schedule made on the device (ws NULL: only counted):
   the backward's D ([Hq, total_q]) and dQ accumulator, then a's arrays
   (fa_i_dev_sched) for `items` items and `acc_blocks` accumulator
   blocks. Its bytes, with 64 for the alignment of ws. */
static size_t fa_i_sched_workspace(fa_i_dev_sched *a, void *ws, int64_t items,
                                   int64_t acc_blocks, size_t acc_floats, fa_i_bwd_args *ba)
{
    char *base = ws ? (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63) : NULL;
    size_t at = 0;
    const size_t dsum_floats = a->backward ? fa_i_round4((size_t)a->heads_q * a->total_q) : 0;
    ba->dsum = (float *)fa_i_carve(base, &at, sizeof(float) * dsum_floats);
    ba->dq_acc = (float *)fa_i_carve(base, &at, sizeof(float) * acc_floats);
    a->seq_maps = (char *)fa_i_carve(base, &at, (size_t)a->map_bytes * a->batch);
    a->seqs = (fa_i_fa3_seq *)fa_i_carve(base, &at, sizeof(fa_i_fa3_seq) * a->batch);
    a->item0 = (int *)fa_i_carve(base, &at, sizeof(int) * a->batch);
    a->acc0 = (int *)fa_i_carve(base, &at, sizeof(int) * a->batch);
    a->bad_pages = (int *)fa_i_carve(base, &at, sizeof(int) * a->batch);
    a->ctl = (int *)fa_i_carve(base, &at, sizeof(int) * 2);
    a->items = (int2 *)fa_i_carve(base, &at, sizeof(int2) * (size_t)items);
    a->acc_rows = (int2 *)fa_i_carve(base, &at, sizeof(int2) * (size_t)acc_blocks);
    return 64 + at;
}

/* The FA3 kernel's four tensors (q, k, v, o or dout) for fa_i_sched_map:
   their base and the bytes from a unit to the next (fa_i_dev_sched). */
static void fa_i_sched_tensors(fa_i_dev_sched *a, const fa_params *run, int backward)
{
    const void *t[4] = {run->q, run->k, run->v, backward ? run->dout : run->o};
    const fa_layout *l[4] = {&run->q_layout, &run->k_layout, &run->v_layout,
                             backward ? &run->dout_layout : &run->o_layout};
    int m;
    for (m = 0; m < 4; ++m) {
        const fa_dtype dt = m == 3 && !backward ? run->o_dtype : run->dtype;
        a->base[m] = (const char *)t[m];
        a->unit_bytes[m] = (a->table ? l[m]->batch : l[m]->seq) * (int64_t)fa_dtype_size(dt);
    }
}

/* Its launches before the kernel: the page check (paged), the order, the
   sequences. */
static fa_status fa_i_sched_launch(const fa_i_dev_sched *a, const fa_i_device *dev,
                                   cudaStream_t stream)
{
    const dim3 per_seq(a->batch < 4 * dev->sms ? a->batch : 4 * dev->sms);
    fa_status s = FA_OK;
    if (a->table)
        s = fa_i_launch((const void *)fa_i_sched_pages, per_seq, FA_I_SCHED_SEQ_THREADS, 0,
                        stream, a, NULL);
    if (s == FA_OK)
        s = fa_i_launch((const void *)fa_i_sched_order, dim3(1), FA_I_SCHED_ORDER_THREADS, 0,
                        stream, a, NULL);
    if (s == FA_OK)
        s = fa_i_launch((const void *)fa_i_sched_sequences, per_seq, FA_I_SCHED_SEQ_THREADS, 0,
                        stream, a, NULL);
    return s;
}

/* A ragged batch with its offsets in device memory (tables_on_device): the
   FA3 forward, or backward (atomic mode, 16-bit gradients), of the longest
   sequence the bounds allow (seqlen_q, seqlen_k), on the schedule
   fa_i_sched_order and fa_i_sched_sequences make on the device. Bounds
   on the items every sequence's last tile or key block partial: Hq
   (total_q / rows + B) query tiles, total_k / keys + B key blocks, 2
   (total_q / 128 + B) accumulator blocks a head. */
static fa_status fa_i_varlen_device(const fa_params *p, fa_i_seq_call *call)
{
    const int bwd = call->pass == FA_PASS_BACKWARD;
    fa_params whole = *p, run, longest, rows;
    const fa_i_kernels *ks;
    const fa_i_kernel *k = NULL;
    fa_i_device dev;
    fa_i_dev_sched a;
    fa_i_tma_maps maps;
    fa_i_fa3_bwd_args args;
    int64_t items, acc_blocks = 0;
    size_t acc_floats = 0;
    fa_status s;
    if (bwd ? call->deterministic || p->accumulate_grads || p->grads_f32 : p->num_splits > 1)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device with varlen: the forward with no "
                         "forced split, the atomic-mode backward without accumulate_grads or "
                         "grads_f32");
    /* the packed tensors as one sequence of the totals' rows: checked, and
       the template maps' tensors */
    whole.cu_seqlens_q = whole.cu_seqlens_k = whole.seqused_k = NULL;
    whole.tables_on_device = 0, whole.total_q = whole.total_k = 0;
    whole.batch = 1, whole.seqlen_q = p->total_q, whole.seqlen_k = p->total_k;
    if ((s = fa_i_cuda_check(&whole, call->pass, 0, &run, &ks, &dev)) != FA_OK) return s;
    longest = run, longest.seqlen_q = p->seqlen_q, longest.seqlen_k = p->seqlen_k;
    memset(&a, 0, sizeof a);
    memset(&maps, 0, sizeof maps);
    memset(&args, 0, sizeof args);
    if (bwd) {
        k = &ks->fa3_bwd_varlen;
        if (!fa_i_fa3_bwd_ready(&run, k, &dev, &args)) k = NULL;
        a.tmpl[0] = args.q, a.tmpl[1] = args.k, a.tmpl[2] = args.v, a.tmpl[3] = args.dout;
    } else {
        ks = fa_i_find_kernels(fa_i_tile_head_dim(&run), run.dtype, FA_PASS_FORWARD,
                               FA_I_FA3_FIRST, &dev);
        if (ks) k = fa_i_fa3_pick(&longest, ks);
        if (k && (!fa_i_fa3_compiled(k->fn, k->smem, &dev) || !fa_i_fa3_maps(&run, k, &maps)))
            k = NULL;
        a.tmpl[0] = maps.q, a.tmpl[1] = maps.k, a.tmpl[2] = maps.v, a.tmpl[3] = maps.o;
    }
    if (!k)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device with varlen: the FA3 kernels "
                         "only (an sm_90a build on compute capability 9.0)");
    a.backward = bwd, a.rows = bwd ? k->keys : k->rows;
    a.cu_q = p->cu_seqlens_q, a.cu_k = p->cu_seqlens_k, a.used = p->seqused_k;
    a.batch = p->batch, a.heads_q = p->heads_q, a.causal = p->causal;
    a.total_q = p->total_q, a.total_k = p->total_k, a.max_q = p->seqlen_q, a.max_k = p->seqlen_k;
    a.map_bytes = bwd ? (int)sizeof(fa_i_fa3_bwd_args) : (int)sizeof(fa_i_tma_maps);
    items = bwd ? p->total_k / k->keys + p->batch
                : (int64_t)p->heads_q * (p->total_q / k->rows + p->batch);
    if (bwd) {
        acc_blocks = 2 * ((int64_t)p->total_q / 128 + p->batch);
        acc_floats = (size_t)p->heads_q * acc_blocks * 64 * ks->head_dim;
    }
    if ((!bwd && fa_i_blocks(p->seqlen_q, k->rows) > 0xffff) || items > 0x7fffffff ||
        acc_blocks * 64 > 0x7fffffff) /* the items' fields, the accumulator's rows */
        return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device with varlen: seqlen_q %d, "
                         "total_q %d, total_k %d: past the schedule's fields", p->seqlen_q,
                         p->total_q, p->total_k);
    call->need = fa_i_sched_workspace(&a, NULL, items, acc_blocks, acc_floats, &args.a);
    call->algorithm = 3;
    if (!call->run) return FA_OK;
    if (!call->workspace || call->workspace_size < call->need)
        return fa_i_fail(FA_ERR_WORKSPACE, "varlen with tables_on_device needs %zu bytes of "
                         "workspace (fa_cuda_%s_workspace_size)", call->need,
                         bwd ? "backward" : "forward");
    if ((s = fa_i_check_aliasing(&run, call->pass, call->workspace, call->need)) != FA_OK)
        return s;
    fa_i_sched_workspace(&a, call->workspace, items, acc_blocks, acc_floats, &args.a);
    fa_i_sched_tensors(&a, &run, bwd);
    if (bwd) {
        const fa_dtype gt = fa_i_grad_dtype(&run);
        fa_i_fill_of(&a.fill[FA_I_FILL_DQ], run.dq, &run.dq_layout, p->heads_q, p->head_dim, gt);
        fa_i_fill_of(&a.fill[FA_I_FILL_DK], run.dk, &run.dk_layout, p->heads_kv, p->head_dim, gt);
        fa_i_fill_of(&a.fill[FA_I_FILL_DV], run.dv, &run.dv_layout, p->heads_kv, p->head_dim_v,
                     gt);
    } else {
        const fa_layout lse_l = {0, p->total_q, 1}; /* batch, head, seq strides */
        fa_i_fill_of(&a.fill[FA_I_FILL_O], run.o, &run.o_layout, p->heads_q, p->head_dim_v,
                     run.o_dtype);
        fa_i_fill_of(&a.fill[FA_I_FILL_LSE], p->lse, &lse_l, p->heads_q, 1, FA_DTYPE_F32);
    }
    if (bwd) { /* D over the packed rows; the accumulator, items and rows past the schedule's */
        float *acc = args.a.dq_acc;
        args.a.acc_d = ks->head_dim, args.a.dq_acc = NULL;
        s = fa_i_bwd_pre(&run, &args.a, call->stream);
        args.a.dq_acc = acc;
        if (s == FA_OK && (cudaMemsetAsync(acc, 0, sizeof(float) * acc_floats, call->stream) !=
                               cudaSuccess ||
                           cudaMemsetAsync(a.items, 0xff, sizeof(int2) * items, call->stream) !=
                               cudaSuccess ||
                           cudaMemsetAsync(a.acc_rows, 0, sizeof(int2) * acc_blocks,
                                           call->stream) != cudaSuccess))
            s = fa_i_cuda_error(cudaGetLastError(), "cudaMemsetAsync of the varlen backward's "
                                "workspace");
        if (s != FA_OK) return s;
    }
    if ((s = fa_i_sched_launch(&a, &dev, call->stream)) != FA_OK) return s;
    run.lse = p->lse; /* the kernels' params: the packed tensors', the lengths per sequence */
    if (!bwd) {
        maps.seq_maps = (const fa_i_tma_maps *)a.seq_maps, maps.seqs = a.seqs;
        maps.tiles = a.items, maps.num_tiles = (int)items, maps.tile_count = a.ctl;
        maps.lse_head = p->total_q;
        return fa_i_launch(k->fn, dim3(fa_i_fa3_ctas(items, &dev)), k->threads, k->smem,
                           call->stream, &run, &maps);
    }
    args.seq_maps = (const fa_i_fa3_bwd_args *)a.seq_maps, args.seqs = a.seqs;
    args.key_blocks = a.items, args.acc_blocks = (int)acc_blocks, args.total_q = p->total_q;
    if ((s = fa_i_launch(k->fn, dim3((unsigned)items, p->heads_kv, 1), k->threads, k->smem,
                         call->stream, &run, &args)) != FA_OK)
        return s;
    /* dQ: the accumulator as one sequence of acc_blocks 64-row blocks a head */
    rows = run, rows.seqlen_q = (int)(acc_blocks * 64);
    args.a.acc_rows = a.acc_rows;
    return fa_i_bwd_post(&rows, &args.a, call->stream);
}
#endif

/* The gradients no kernel writes for sequence b: dQ where it sees no key,
   dK and dV of the keys past seqused_k (or of all, without queries);
   nothing when accumulating. */
static fa_status fa_i_varlen_unseen_grads(const fa_params *p, int b, cudaStream_t stream)
{
    int nq, nk;
    const fa_params seq = fa_i_varlen_sequence(p, b, &nq, &nk);
    const int span_k = p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b], seen = nq && nk ? nk : 0;
    const fa_dtype gt = fa_i_grad_dtype(p);
    const int64_t ges = (int64_t)fa_dtype_size(gt);
    fa_status s = FA_OK;
    if (p->accumulate_grads) return FA_OK;
    if (!seen) s = fa_i_fill(seq.dq, &p->dq_layout, nq, p->heads_q, p->head_dim, gt, 0.0f, stream);
    if (s == FA_OK)
        s = fa_i_fill((char *)seq.dk + seen * p->dk_layout.seq * ges, &p->dk_layout, span_k - seen,
                      p->heads_kv, p->head_dim, gt, 0.0f, stream);
    if (s == FA_OK)
        s = fa_i_fill((char *)seq.dv + seen * p->dv_layout.seq * ges, &p->dv_layout, span_k - seen,
                      p->heads_kv, p->head_dim_v, gt, 0.0f, stream);
    return s;
}

static fa_status fa_i_varlen_run(const fa_params *params, fa_i_seq_call *call)
{
    const int bwd = call->pass == FA_PASS_BACKWARD;
    fa_params p;
    fa_status s = fa_params_resolve(params, call->pass, &p);
    int total_q = 0, total_k = 0, max_nq = 0, ran_nq = 0, b;
    size_t lse_bytes, inner = 0, avail = 0;
    float *lse_tmp = NULL;
    char *inner_ws = NULL;
    fa_layout lse_l;
    if (s != FA_OK) return s;
#if FA_I_SM90
    if (p.tables_on_device) return fa_i_varlen_device(&p, call);
#endif
    if ((s = fa_i_varlen_check(&p, call->pass, &total_q, &total_k)) != FA_OK) return s;
    for (b = 0; b < p.batch; ++b)
        if (p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] > max_nq)
            max_nq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    lse_bytes = bwd || p.lse ? ((size_t)p.heads_q * max_nq * sizeof(float) + 15) / 16 * 16 : 0;
    if (call->run) {
        if (lse_bytes && (!call->workspace || call->workspace_size < lse_bytes ||
                          (uintptr_t)call->workspace % 16))
            return fa_i_fail(FA_ERR_WORKSPACE, "varlen needs at least %zu bytes of workspace "
                             "(fa_cuda_*_workspace_size), 16-byte aligned", lse_bytes);
        lse_tmp = (float *)call->workspace;
        inner_ws = call->workspace ? (char *)call->workspace + lse_bytes : NULL;
        avail = call->workspace_size - (call->workspace ? lse_bytes : call->workspace_size);
    }
    for (b = 0; b < p.batch; ++b) { /* plan every sequence */
        int nq, nk, algorithm;
        size_t need;
        fa_params seq = fa_i_varlen_sequence(&p, b, &nq, &nk), checked;
        if (nq == 0 || nk == 0) continue;
        if (!bwd && !p.lse) seq.lse = NULL; /* else p.lse: a stand-in span within [Hq, total_q] */
        if (bwd) {
            fa_i_backward_plan plan;
            if ((s = fa_i_plan_backward(&seq, call->deterministic, &plan)) != FA_OK) return s;
            need = fa_cuda_backward_workspace_size(&seq, call->deterministic);
            algorithm = plan.algorithm, checked = plan.p;
        } else {
            fa_i_forward_plan plan;
            if ((s = fa_i_plan_forward(&seq, call->run ? avail : (size_t)-1, &plan)) != FA_OK)
                return s;
            need = plan.workspace, algorithm = plan.algorithm, checked = plan.p;
        }
        if (call->run && need > avail)
            return fa_i_fail(FA_ERR_WORKSPACE, "varlen sequence %d needs %zu bytes of workspace "
                             "past the LSE block's %zu", b, need, lse_bytes);
        if (call->run && (s = fa_i_check_aliasing(&checked, call->pass, call->workspace,
                                                  lse_bytes + need)) != FA_OK)
            return s;
        if (need > inner) inner = need;
        if (nq > ran_nq) call->algorithm = algorithm, ran_nq = nq; /* the longest that runs */
    }
    call->need = lse_bytes + inner;
    lse_l.batch = 0, lse_l.head = total_q, lse_l.seq = 1; /* [Hq, total_q] */
#if FA_I_SM90
    {
        int taken;
        s = bwd ? fa_i_varlen_fa3_bwd(&p, call, total_q, &taken)
                : fa_i_varlen_fa3(&p, call, total_q, &taken);
        if (s != FA_OK) return s;
        for (b = 0; taken && b < p.batch && s == FA_OK; ++b) {
            int nq, nk;
            fa_params seq = fa_i_varlen_sequence(&p, b, &nq, &nk);
            if (bwd) s = fa_i_varlen_unseen_grads(&p, b, call->stream);
            else if (nq && !nk)
                s = fa_i_varlen_no_keys(&p, &seq, p.cu_seqlens_q[b], &lse_l, call->stream);
        }
        if (taken) return s;
    }
#endif
    if (!call->run) return FA_OK;
    for (b = 0; b < p.batch && s == FA_OK; ++b) {
        int nq, nk;
        fa_params seq = fa_i_varlen_sequence(&p, b, &nq, &nk);
        const int q0 = p.cu_seqlens_q[b];
        seq.lse = lse_tmp;
        if (!bwd) {
            if (!nq) continue;
            if (!nk) {
                s = fa_i_varlen_no_keys(&p, &seq, q0, &lse_l, call->stream);
                continue;
            }
            if (!p.lse) seq.lse = NULL;
            s = fa_cuda_forward(&seq, inner_ws, avail, call->stream);
            if (s == FA_OK && p.lse)
                s = fa_i_copy_rows(p.lse + q0, total_q, lse_tmp, nq, nq, p.heads_q, call->stream);
            continue;
        }
        if (nq && nk) {
            s = fa_i_copy_rows(lse_tmp, nq, p.lse + q0, total_q, nq, p.heads_q, call->stream);
            if (s == FA_OK)
                s = fa_cuda_backward(&seq, call->deterministic, inner_ws, avail, call->stream);
        }
        if (s == FA_OK) s = fa_i_varlen_unseen_grads(&p, b, call->stream);
    }
    return s;
}

/* The keys a sequence of a paged p may hold: min(seqlen_k, max_pages page_size). */
static int64_t fa_i_paged_capacity(const fa_params *p)
{
    const int64_t pages = (int64_t)p->max_pages * p->page_size;
    return pages < p->seqlen_k ? pages : p->seqlen_k;
}

/* p's K and V as dense tensors of `rows` keys a batch at base (V from
   16-byte-rounded K bytes on; base NULL: only counted): into *g, a copy of
   p. Their bytes. */
static size_t fa_i_paged_dense_kv(const fa_params *p, int64_t rows, char *base, fa_params *g)
{
    const size_t es = fa_dtype_size(p->dtype);
    const size_t k_bytes = (es * p->batch * rows * p->heads_kv * p->head_dim + 15) / 16 * 16;
    *g = *p;
    g->k = base, g->v = base ? base + k_bytes : NULL;
    g->k_layout.head = p->head_dim, g->k_layout.seq = (int64_t)p->heads_kv * p->head_dim;
    g->k_layout.batch = rows * g->k_layout.seq;
    g->v_layout.head = p->head_dim_v, g->v_layout.seq = (int64_t)p->heads_kv * p->head_dim_v;
    g->v_layout.batch = rows * g->v_layout.seq;
    return k_bytes + (es * p->batch * rows * p->heads_kv * p->head_dim_v + 15) / 16 * 16;
}

/* A paged cache (block_table, cache_seqlens in host memory, as on the CPU):
   checked, then both arrays are copied into the workspace's start, where
   the kernels read them (tables_on_device: the kernels read the caller's
   and check them); k_new, v_new go into their pages (fa_i_page_rows);
   then the decode kernel reads the pages in place (seqlen_q <=
   FA_I_DECODE_MAX_Q, its memory-bound case); longer query chunks run on
   Hopper's FA3 forward reading the pages in place where its key tile and
   the page size fit, or else each sequence's keys are gathered into the
   workspace (a query chunk long enough that attending costs more than the
   copy): with host tables one sequence at a time, as a dense problem of
   batch 1 on the dense path's kernels; with device tables every
   sequence's at once, for one launch of the FA3 forward on the device's
   schedule. */
static fa_status fa_i_page_copy(const fa_params *p, const int32_t *table, const int32_t *start,
                                const int32_t *count, const void *dense_k,
                                const fa_layout *dense_k_l, const void *dense_v,
                                const fa_layout *dense_v_l, int batch, int rows,
                                cudaStream_t stream)
{
    fa_i_page_rows_args a;
    a.cache[0] = (char *)p->k, a.cache[1] = (char *)p->v;
    a.cache_l[0] = p->k_layout, a.cache_l[1] = p->v_layout;
    a.dense[0] = (char *)dense_k, a.dense[1] = (char *)dense_v;
    a.dense_l[0] = *dense_k_l, a.dense_l[1] = *dense_v_l;
    a.elem_bytes = (int)fa_dtype_size(p->dtype);
    a.chunks[0] = p->head_dim * a.elem_bytes / 16, a.chunks[1] = p->head_dim_v * a.elem_bytes / 16;
    a.table = table, a.start = start, a.max_pages = p->max_pages, a.page_size = p->page_size;
    a.count = count, a.count_add = p->seqlen_new;
    a.num_pages = p->num_pages;
    a.capacity = fa_i_paged_capacity(p);
    a.rows = rows, a.heads = p->heads_kv, a.to_pages = start != NULL;
    if (batch <= 0 || rows <= 0) return FA_OK;
    return fa_i_launch((const void *)fa_i_page_rows,
                       dim3((unsigned)fa_i_blocks(rows, FA_I_PAGE_ROWS_CTA), (unsigned)batch, 2), 256,
                       0, stream, &a, NULL);
}

/* Sequence b of a paged p without keys: O = 0, LSE = -inf. */
static fa_status fa_i_paged_no_keys(const fa_params *p, int b, cudaStream_t stream)
{
    fa_layout lse_l;
    fa_status s = fa_i_fill((char *)p->o + b * p->o_layout.batch * (int64_t)fa_dtype_size(p->o_dtype),
                            &p->o_layout, p->seqlen_q, p->heads_q, p->head_dim_v, p->o_dtype, 0.0f,
                            stream);
    lse_l.batch = 0, lse_l.head = p->seqlen_q, lse_l.seq = 1;
    if (s == FA_OK && p->lse)
        s = fa_i_fill(p->lse + (int64_t)b * p->heads_q * p->seqlen_q, &lse_l, p->seqlen_q,
                      p->heads_q, 1, FA_DTYPE_F32, -INFINITY, stream);
    return s;
}

#if FA_I_SM90
/* Whether FA3 kernel k's producer loads key tiles from pages of p's size
   (a power of two) by TMA: the tile from one page, or a box from each of
   at most FA_I_FA3_BOXES pages. Otherwise its warpgroup gathers them
   (maps.gather; DESIGN.md, paged caches). */
static int fa_i_paged_fa3_boxed(const fa_params *p, const fa_i_kernel *k)
{
    return p->page_size % k->keys == 0 ||
           (k->keys % p->page_size == 0 && k->keys / p->page_size <= FA_I_FA3_BOXES);
}

/* Device tables: from this many query rows a key serves (seqlen_q x the
   GQA group), one gather of every sequence's keys into the workspace, then
   the dense kernel, beats the gathering instance: the gather's cost (each
   K/V byte read and written once) shrinks against the rows' work, the
   instance's (its producer's copies, a share of every tile) does not
   (DESIGN.md, paged caches). Host tables gather a sequence at a time, a
   launch each, and keep the instance. */
#define FA_I_PAGED_GATHER_ROWS 4096

/* The FA3 forward kernel that reads p's pages in place, or NULL: 16-bit
   K/V in pages of a power of two, runnable here. The variant fa_i_fa3_pick
   gives, else t0 where only its tile takes the pages by TMA, else the
   gathering instance where its key tile spans at most 32 pages. */
static const fa_i_kernel *fa_i_paged_fa3_kernel(const fa_params *p, const fa_i_kernels *ks,
                                                const fa_i_device *dev)
{
    const fa_i_kernel *k = fa_i_fa3_pick(p, ks);
    if (p->dtype == FA_DTYPE_FP8_E4M3 || (p->page_size & (p->page_size - 1)) != 0) return NULL;
    if (!fa_i_paged_fa3_boxed(p, k))
        k = fa_i_paged_fa3_boxed(p, &ks->fa3_fwd[0]) ? &ks->fa3_fwd[0] : &ks->fa3_fwd_gather;
    /* the gathering producer holds a key tile's pages in a warp's lanes,
       and its threads' rows sit at one place in pages of 16 rows or fewer
       (fa_i_gather_rows) */
    if (k == &ks->fa3_fwd_gather &&
        (p->page_size > 16 || k->keys / p->page_size > 32 ||
         (p->tables_on_device &&
          (int64_t)p->seqlen_q * (p->heads_q / p->heads_kv) >= FA_I_PAGED_GATHER_ROWS)))
        return NULL;
    return k->fn && fa_i_fa3_compiled(k->fn, k->smem, dev) ? k : NULL;
}

/* Its workspace (after the tables): every sequence's maps and entry, every tile. */
static size_t fa_i_paged_fa3_bytes(const fa_params *p, const fa_i_kernel *k)
{
    return fa_i_varlen_bytes(p->batch,
                             (int64_t)p->batch * p->heads_q * fa_i_blocks(p->seqlen_q, k->rows),
                             sizeof(fa_i_tma_maps));
}

/* Sequence b of a paged p (nk keys) as its own FA3 maps see it: batch 1, its
   Q and O rows, and as K and V the rows of its last page up to key nk - 1
   (that page from key *last). */
static fa_params fa_i_paged_tail(const fa_params *p, int b, int nk, int *last)
{
    fa_params s = *p;
    const int64_t es = (int64_t)fa_dtype_size(p->dtype), oes = (int64_t)fa_dtype_size(p->o_dtype);
    int64_t page;
    *last = (nk - 1) / p->page_size * p->page_size;
    page = p->block_table[(int64_t)b * p->max_pages + *last / p->page_size];
    s.batch = 1, s.seqlen_k = nk - *last, s.positions = 0;
    s.q = (const char *)p->q + b * p->q_layout.batch * es;
    s.o = (char *)p->o + b * p->o_layout.batch * oes;
    s.k = (const char *)p->k + page * p->k_layout.batch * es;
    s.v = (const char *)p->v + page * p->v_layout.batch * es;
    s.block_table = NULL, s.cache_seqlens = NULL;
    s.k_new = s.v_new = NULL, s.seqlen_new = 0;
    return s;
}

/* The in-place FA3 forward's own K and V maps of a paged p: the whole
   cache {d, row in page, head, page}, boxes of the key tile or of a page
   where pages are smaller (*boxed: k with that box, which its sequences'
   last-page maps take too), the table (device memory) and the page
   shift; none where the producer's threads gather the pages (maps->gather);
   0 where the driver refuses a map. */
static int fa_i_paged_cache_maps(const fa_params *p, const fa_i_kernel *k, const int32_t *table,
                                 fa_i_tma_maps *maps, fa_i_kernel *boxed)
{
    fa_params cache = *p;
    *boxed = *k;
    boxed->keys = p->page_size < k->keys ? p->page_size : k->keys;
    cache.batch = p->num_pages;
    memset(maps, 0, sizeof *maps);
    maps->pages = table;
    while ((1 << maps->page_shift) < p->page_size) ++maps->page_shift;
    maps->gather = !fa_i_paged_fa3_boxed(p, k); /* no cache maps: the producer's threads copy */
    return maps->gather ||
           fa_i_tma_map(&maps->k, p->k, &p->k_layout, &cache, p->dtype, p->head_dim,
                        p->page_size, p->heads_kv, boxed->keys) &&
           fa_i_tma_map(&maps->v, p->v, &p->v_layout, &cache, p->dtype, p->head_dim_v,
                        p->page_size, p->heads_kv, boxed->keys);
}

/* A paged prefill chunk in one launch of the FA3 forward k, reading the
   pages in place (DESIGN.md, paged caches): the varlen schedule's staging
   (sequences by the power of two of their keys, most first; tiles one by
   one), each sequence with its own Q, O and last-page maps and an entry
   whose LSE rows are its dense ones ([B, Hq, Nq]) and pages0 its row of
   the block table (table_dev, the workspace's copy); the kernel's own k
   and v map the whole cache page by page. ws: the workspace past the
   tables, fa_i_paged_fa3_bytes long. Sequences without keys are filled
   apart. *taken = 0 under stream capture (the schedule is copied from host
   memory) or where the driver refuses a map: the caller gathers. */
static fa_status fa_i_paged_fa3(const fa_params *p, const fa_i_kernel *k, fa_i_seq_call *call,
                                const int32_t *table_dev, void *ws, int *taken)
{
    fa_i_device dev;
    fa_i_varlen_stage st;
    fa_i_tma_maps maps;
    fa_params run = *p, seq;
    const int blocks_m = fa_i_blocks(p->seqlen_q, k->rows);
    fa_i_kernel boxed;
    int b, c, seqs = 0, last;
    cudaStreamCaptureStatus capture;
    fa_status s;
    *taken = 0;
    for (b = 0; b < p->batch; ++b) seqs += p->cache_seqlens[b] + p->seqlen_new > 0;
    if (fa_i_device_facts(&dev) != cudaSuccess || blocks_m > 0xffff ||
        (int64_t)seqs * p->heads_q * blocks_m > 0x7fffffff ||
        cudaStreamIsCapturing(call->stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone)
        return FA_OK;
    if (!fa_i_paged_cache_maps(p, k, table_dev, &maps, &boxed)) return FA_OK; /* gathered */
    fa_i_varlen_layout(&st, ws, seqs, sizeof(fa_i_tma_maps), call->stream);
    for (c = 62; c >= 0; --c)
        for (b = 0; b < p->batch; ++b) {
            const int nk = p->cache_seqlens[b] + p->seqlen_new;
            fa_i_fa3_seq *e;
            if (fa_i_work_class(p->seqlen_q, nk) != c) continue;
            seq = fa_i_paged_tail(p, b, nk, &last);
            if (!fa_i_fa3_maps(&seq, &boxed, &st.maps.fwd[st.n_seqs])) return FA_OK; /* gathered */
            if ((s = fa_i_varlen_fa3_tiles(&st, p->heads_q, blocks_m, p->causal)) != FA_OK) return s;
            e = fa_i_varlen_entry(&st);
            e->nq = p->seqlen_q, e->nk = nk;
            e->lse0 = (int64_t)b * p->heads_q * p->seqlen_q;
            e->pages0 = (int64_t)b * p->max_pages;
            if ((s = fa_i_varlen_push(&st)) != FA_OK) return s;
        }
    if ((s = fa_i_varlen_flush_seqs(&st)) != FA_OK || (s = fa_i_varlen_flush_items(&st)) != FA_OK)
        return s;
    for (b = 0; b < p->batch; ++b)
        if (p->cache_seqlens[b] + p->seqlen_new == 0 &&
            (s = fa_i_paged_no_keys(p, b, call->stream)) != FA_OK)
            return s;
    *taken = 1;
    if (!seqs) return FA_OK;
    maps.seq_maps = (const fa_i_tma_maps *)st.dev_maps, maps.seqs = st.dev_seqs;
    maps.tiles = st.dev_items, maps.num_tiles = seqs * p->heads_q * blocks_m;
    maps.lse_head = p->seqlen_q;
    run.block_table = NULL, run.cache_seqlens = NULL;
    return fa_i_launch(k->fn, dim3(fa_i_fa3_ctas(maps.num_tiles, &dev)), k->threads, k->smem,
                       call->stream, &run, &maps);
}

/* A paged prefill chunk with its tables in device memory: the FA3 forward
   k on a schedule made on the device (fa_i_dev_sched): per sequence its Q
   and O maps (batch b's rows) and its K and V maps, the templates batch 0's
   rows; sequences whose length or page entries are out of range get O and
   LSE rows of NaN. In place (as fa_i_paged_fa3), K and V maps of the
   sequence's last page, the kernel's own maps the whole cache; gathered
   (pages k does not read in place), every sequence's keys first copied
   into dense [B, capacity] K and V at the workspace's start (fa_i_page_rows
   with the lengths from device memory) and its K and V maps that batch's
   rows. ws NULL: *need only. */
static fa_status fa_i_paged_device(const fa_params *p, const fa_i_kernel *k, int gathered,
                                   void *ws, cudaStream_t stream, size_t *need)
{
    fa_i_device dev;
    fa_i_dev_sched a;
    fa_i_tma_maps maps, tmpl;
    fa_i_bwd_args none;
    fa_params run = *p, seq, kv = *p; /* kv: the K and V the kernel reads */
    const fa_layout lse_l = {(int64_t)p->heads_q * p->seqlen_q, p->seqlen_q, 1};
    const int blocks_m = fa_i_blocks(p->seqlen_q, k->rows);
    const int64_t items = (int64_t)p->batch * p->heads_q * blocks_m, cap = fa_i_paged_capacity(p);
    const size_t gather = gathered ? fa_i_paged_dense_kv(p, cap, (char *)ws, &kv) : 0;
    fa_i_kernel boxed = *k;
    cudaError_t e;
    fa_status s;
    if ((e = fa_i_device_facts(&dev)) != cudaSuccess)
        return fa_i_cuda_error(e, "querying the current device");
    if (blocks_m > 0xffff || items > 0x7fffffff) /* the items' fields */
        return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device: seqlen_q %d, batch %d: past the "
                         "schedule's fields", p->seqlen_q, p->batch);
    if (gathered && !ws) kv.k = p->k, kv.v = p->v; /* an address for the maps' check */
    seq = kv, seq.batch = 1, seq.seqlen_k = gathered ? (int)cap : p->page_size;
    memset(&maps, 0, sizeof maps);
    if ((!gathered && !fa_i_paged_cache_maps(p, k, p->block_table, &maps, &boxed)) ||
        !fa_i_fa3_maps(&seq, &boxed, &tmpl))
        return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device: the driver refused a tensor map "
                         "of the cache");
    if (gathered) maps.k = tmpl.k, maps.v = tmpl.v; /* prefetched only: tiles use a sequence's */
    memset(&a, 0, sizeof a);
    a.tmpl[0] = tmpl.q, a.tmpl[1] = tmpl.k, a.tmpl[2] = tmpl.v, a.tmpl[3] = tmpl.o;
    a.table = p->block_table, a.cache_len = p->cache_seqlens, a.seqlen_new = p->seqlen_new;
    a.max_pages = p->max_pages, a.page_size = p->page_size, a.num_pages = p->num_pages;
    a.gathered = gathered;
    a.batch = p->batch, a.heads_q = p->heads_q, a.causal = p->causal, a.rows = k->rows;
    a.max_q = p->seqlen_q, a.max_k = p->seqlen_k, a.map_bytes = (int)sizeof(fa_i_tma_maps);
    *need = gather + fa_i_sched_workspace(&a, NULL, items, 0, 0, &none);
    if (!ws) return FA_OK;
    fa_i_sched_workspace(&a, (char *)ws + gather, items, 0, 0, &none);
    fa_i_sched_tensors(&a, &kv, 0);
    fa_i_fill_of(&a.fill[FA_I_FILL_O], p->o, &p->o_layout, p->heads_q, p->head_dim_v, p->o_dtype);
    fa_i_fill_of(&a.fill[FA_I_FILL_LSE], p->lse, &lse_l, p->heads_q, 1, FA_DTYPE_F32);
    if (gathered &&
        (s = fa_i_page_copy(p, p->block_table, NULL, p->cache_seqlens, kv.k, &kv.k_layout, kv.v,
                            &kv.v_layout, p->batch, (int)cap, stream)) != FA_OK)
        return s;
    if ((s = fa_i_sched_launch(&a, &dev, stream)) != FA_OK) return s;
    maps.seq_maps = (const fa_i_tma_maps *)a.seq_maps, maps.seqs = a.seqs;
    maps.tiles = a.items, maps.num_tiles = (int)items, maps.tile_count = a.ctl;
    maps.lse_head = p->seqlen_q;
    run.block_table = NULL, run.cache_seqlens = NULL;
    return fa_i_launch(k->fn, dim3(fa_i_fa3_ctas(items, &dev)), k->threads, k->smem, stream, &run,
                       &maps);
}
#endif

static fa_status fa_i_paged_run(const fa_params *params, fa_i_seq_call *call)
{
    fa_i_forward_plan plan;
    fa_params *p = &plan.p;
    fa_i_device dev;
    size_t table_bytes, avail;
    const int32_t *table_dev, *seqlens_dev;
    char *rest;
    int64_t es;
    int taken = 0, b;
    const fa_i_kernel *fa3 = NULL; /* the FA3 forward of a prefill chunk */
#if FA_I_SM90
    int gathered = 0; /* device tables and pages fa3 does not read in place */
#endif
    fa_status s = fa_i_cuda_check(params, call->pass, call->deterministic, p, &plan.k, &dev);
    cudaError_t e;
    if (s != FA_OK) return s;
    es = (int64_t)fa_dtype_size(p->dtype);
    if (FA_VARIANT != 2) return fa_i_fail(FA_ERR_UNSUPPORTED, "paged K/V needs FA_VARIANT 2");
    if (!p->tables_on_device && (s = fa_i_paged_check(p)) != FA_OK) return s;
    if (p->seqlen_new > 0 && (!fa_i_aligned(p->k_new, &p->k_new_layout, p->dtype) ||
                              !fa_i_aligned(p->v_new, &p->v_new_layout, p->dtype)))
        return fa_i_fail(FA_ERR_UNSUPPORTED, "k_new, v_new rows must be 16-byte aligned");
    /* host tables: copied to the workspace's start */
    table_bytes = p->tables_on_device
                      ? 0
                      : (sizeof(int32_t) * ((size_t)p->batch * p->max_pages + p->batch) + 15) / 16 * 16;
    avail = !call->run ? (size_t)-1
            : call->workspace_size > table_bytes ? call->workspace_size - table_bytes : 0;
    plan.workspace = 0;
    if ((s = fa_i_plan_decode(&plan, &dev, avail, &taken)) != FA_OK) return s;
    if (!taken && p->tables_on_device) { /* the other paths plan from the tables' contents */
#if FA_I_SM90
        fa3 = fa_i_paged_fa3_kernel(p, plan.k, &dev);
        if (!fa3 && p->dtype != FA_DTYPE_FP8_E4M3) {
            fa3 = fa_i_fa3_pick(p, plan.k);
            gathered = 1;
            if (!fa_i_fa3_compiled(fa3->fn, fa3->smem, &dev)) fa3 = NULL;
        }
        if (fa3 &&
            (s = fa_i_paged_device(p, fa3, gathered, NULL, call->stream, &plan.workspace)) != FA_OK)
            return s;
#endif
        if (!fa3)
            return fa_i_fail(FA_ERR_UNSUPPORTED, "tables_on_device: seqlen_q %d; the decode "
                             "kernel (seqlen_q <= %d) or Hopper's FA3 forward (16-bit K/V)",
                             p->seqlen_q, FA_I_DECODE_MAX_Q);
        plan.algorithm = 3;
    } else if (!taken) { /* a dense K and V of the longest sequence, or the in-place schedule */
        fa_params one = *p, gathered_kv;
        one.batch = 1;
        plan.workspace = fa_i_paged_dense_kv(&one, p->seqlen_k, NULL, &gathered_kv);
#if FA_I_SM90
        fa3 = fa_i_paged_fa3_kernel(p, plan.k, &dev);
        if (fa3 && fa_i_paged_fa3_bytes(p, fa3) > plan.workspace)
            plan.workspace = fa_i_paged_fa3_bytes(p, fa3);
        plan.algorithm = fa3 || fa_i_fa3_compiled(fa_i_fa3_pick(p, plan.k)->fn,
                                                  fa_i_fa3_pick(p, plan.k)->smem, &dev) ? 3 : 2;
#else
        plan.algorithm = 2;
#endif
    }
    call->need = table_bytes + plan.workspace;
    call->algorithm = plan.algorithm;
    if (!call->run) return FA_OK;
    if (call->need &&
        (!call->workspace || call->workspace_size < call->need || (uintptr_t)call->workspace % 16))
        return fa_i_fail(FA_ERR_WORKSPACE, "this paged forward needs %zu bytes of workspace, "
                         "16-byte aligned", call->need);
    if ((s = fa_i_check_aliasing(p, FA_PASS_FORWARD, call->workspace, call->need)) != FA_OK) return s;
    rest = (char *)call->workspace + table_bytes;
    if (p->tables_on_device) {
        table_dev = p->block_table, seqlens_dev = p->cache_seqlens;
    } else {
        int32_t *tables = (int32_t *)call->workspace;
        table_dev = tables, seqlens_dev = tables + (size_t)p->batch * p->max_pages;
        if ((e = cudaMemcpyAsync(tables, p->block_table, sizeof(int32_t) * p->batch * p->max_pages,
                                 cudaMemcpyHostToDevice, call->stream)) != cudaSuccess ||
            (e = cudaMemcpyAsync(tables + (size_t)p->batch * p->max_pages, p->cache_seqlens,
                                 sizeof(int32_t) * p->batch, cudaMemcpyHostToDevice,
                                 call->stream)) != cudaSuccess)
            return fa_i_cuda_error(e, "cudaMemcpyAsync of the block table");
    }
    if (p->seqlen_new > 0 &&
        (s = fa_i_page_copy(p, table_dev, seqlens_dev, NULL, p->k_new, &p->k_new_layout, p->v_new,
                            &p->v_new_layout, p->batch, p->seqlen_new, call->stream)) != FA_OK)
        return s;
    if (taken) { /* the kernel reads the tables through p */
        p->block_table = table_dev, p->cache_seqlens = seqlens_dev;
        return fa_i_run_decode(&plan, rest, call->stream);
    }
#if FA_I_SM90
    if (fa3 && p->tables_on_device)
        return fa_i_paged_device(p, fa3, gathered, rest, call->stream, &plan.workspace);
    if (fa3 && ((s = fa_i_paged_fa3(p, fa3, call, table_dev, rest, &taken)) != FA_OK || taken))
        return s;
#endif
    for (b = 0; b < p->batch && s == FA_OK; ++b) {
        const int nk = p->cache_seqlens[b] + p->seqlen_new;
        fa_params seq = *p;
        seq.batch = 1, seq.seqlen_k = nk, seq.positions = 0;
        seq.q = (const char *)p->q + b * p->q_layout.batch * es;
        seq.o = (char *)p->o + b * p->o_layout.batch * (int64_t)fa_dtype_size(p->o_dtype);
        seq.lse = p->lse ? p->lse + (int64_t)b * p->heads_q * p->seqlen_q : NULL;
        if (nk == 0) {
            s = fa_i_paged_no_keys(p, b, call->stream);
            continue;
        }
        fa_i_paged_dense_kv(&seq, nk, rest, &seq);
        seq.block_table = NULL, seq.cache_seqlens = NULL;
        seq.k_new = seq.v_new = NULL, seq.seqlen_new = 0;
        if ((s = fa_i_page_copy(p, table_dev + (size_t)b * p->max_pages, NULL, NULL, seq.k,
                                &seq.k_layout, seq.v, &seq.v_layout, 1, nk, call->stream)) != FA_OK)
            return s;
        s = fa_cuda_forward(&seq, NULL, 0, call->stream);
    }
    return s;
}

static fa_status fa_i_seq_run(const fa_params *params, fa_i_seq_call *call)
{
    /* the workspace holds rows of d elements (gathered pages, LSE and
       schedule staging): 16-byte rows only */
    if (params->head_dim % 8 || params->head_dim_v % 8)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "head_dim %d / head_dim_v %d with varlen or paged "
                         "K/V: multiples of 8", params->head_dim, params->head_dim_v);
    return params->block_table ? fa_i_paged_run(params, call) : fa_i_varlen_run(params, call);
}

#ifdef __cplusplus
}
#endif
#endif /* >> host */
#if defined(FA_I_TOP) && !defined(FA_I_PASS)
#if FA_CUDA_SPLIT
#pragma nv_diagnostic pop
#endif
#undef FA_I_TOP
#endif

