/* flashattn_cuda.cuh - v0.1.0 - FlashAttention GPU kernels (sm_80 and newer).
   MIT licence, see flashattn.h.

   DO THIS in exactly one .cu file (it also provides flashattn.h's
   implementation unless you define FLASHATTN_IMPLEMENTATION elsewhere):
       #define FLASHATTN_IMPLEMENTATION
       #define FLASHATTN_CUDA_IMPLEMENTATION
       #include "flashattn_cuda.cuh"
   and build with nvcc -gencode=arch=compute_80,code=sm_80 (and/or
   -gencode=arch=compute_90a,code=sm_90a). Pointers in fa_params are device
   pointers; every call is asynchronous on the given stream.

   KERNELS (template-free: this file includes itself once per head dim and
   dtype, with FA_I_PASS set, to stamp out the kernels)
     forward   FA2: one CTA per (query block, head, batch), warps split the
               query rows (16 or 32 each); K/V tiles by cp.async, double-buffered
               or (FA_KV_STAGES 1, d = 256) single-buffered in FA2's order;
               QK^T and PV on tensor cores (mma.sync m16n8k16, ldmatrix);
               online softmax in base 2 with deferred normalization.
               FA1 (FA_VARIANT 1): the teaching variant, K/V blocks outer,
               O/m/l kept in a global fp32 workspace between them.
     backward  preprocess D = rowsum(dO * O); one CTA of 8 warps per (key
               block, kv head, batch) keeps dK, dV in registers and adds dQ
               into an fp32 workspace with atomics (4-wide vector reductions
               on sm_90); its warps tile each of the five products as FA2
               does, P and dS passing through shared memory between the
               layouts; postprocess converts dQ.
               Deterministic mode: the same kernel stamped without dQ, plus
               a dQ kernel parallel over query blocks (no atomics).
     forward   FA3 (Hopper, built for sm_90a, head dims 64 128 256; runtime
               dispatch picks it on compute capability 9.0): persistent CTAs,
               one per SM, each taking pairs of query tiles. A producer
               warpgroup loads Q once per tile (double-buffered at d = 64,
               so the next tile's loads overlap this one; elsewhere the next
               Q is prefetched into L2) and K/V tiles by TMA into a ring of
               shared-memory stages (full/empty mbarriers); two
               consumer warpgroups (three at d = 64) of 64 query rows each
               run S = QK^T (SS wgmma) and O += PV (RS wgmma, P from
               registers), each key tile's QK^T issued with the previous
               tile's PV so that its softmax can run under that PV (held
               there by a pin at d = 256; at d = 64 and 128 ptxas runs it
               after the PV, measured as fast or faster), and take turns on
               the tensor cores (ping-pong on named barriers; not on the d =
               64 short causal tile and at d = 128, measured faster
               without). O leaves through shared memory by TMA store.
     backward  FA3 (Hopper, sm_90a, head dims 64 128 256, atomic mode): one
               CTA of two warpgroups per 128 keys; each warpgroup keeps dK,
               dV of its 64 keys in registers (at d = 256: 64 keys per CTA,
               both warpgroups on all of them, each with half of d) and
               walks the query blocks (64 rows, Q and dO double-buffered by
               TMA, single-buffered at d = 256): S^T, dP^T by SS
               wgmma, dV and dK by RS wgmma (P^T, dS^T from registers), dQ
               by SS wgmma from dS^T in shared memory, added into the fp32
               accumulator by one bulk reduce-add per warpgroup and block
               (cp.reduce.async.bulk, which runs on while the next block
               computes).

   COMPILE-TIME OPTIONS
     FA_VARIANT      2 (default) or 1: forward algorithm
     FA_HEAD_DIM     0 (default: 32 64 96 128 160 192 256) or one of them
     FA_CUDA_DTYPE   0 (default: f16 and bf16), 1 f16 only, 2 bf16 only
     FA_BLOCK_M, FA_BLOCK_N, FA_NUM_WARPS   forward tile for every head dim
                     (default: the table below); FA_BLOCK_M = 16 or 32 * FA_NUM_WARPS
     FA_KV_STAGES    FA2 forward K/V buffers for every head dim: 2 (double
                     buffering) or 1 (the FA2 paper's order); default: the table
     FA_SM90         1 (default) builds the Hopper forward and backward (needs
                     CUDA >= 12.5 and -gencode=arch=compute_90a,code=sm_90a to
                     run), 0 not
     FA_SM90_OVERLAP  1 (default): QK^T of tile j+1 overlaps the softmax of j
     FA_SM90_PINGPONG 1 (default): consumer warpgroups alternate their GEMMs
                     (the last two are ablation switches, as in the FA3 paper;
                     the d = 64 causal tile for Nq < 4096 and d = 128's
                     128-key tile never ping-pong)
     FA_SM90_SPEC    1 (default): on FA3 tiles of at most 128 keys a key
                     tile's exps start from the running max and are redone
                     only where it rose past 2^8; 0: the row max first, as in
                     the FA3 paper
     FA_FWD_SPEC     1 (default): the same in the FA2 forward at d = 256; 0 not
     FA_SM90_ROWS_<d>, FA_SM90_KEYS_<d>, FA_SM90_STAGES_<d>   Hopper tile for
                     d = 64, 128, 256: query rows (128 or 192), keys, K/V
                     pipeline stages (default: the table below); with 192
                     rows at d = 64 a 128-row tile is built too and runs
                     causal problems with Nq < 4096; with the default d = 128
                     tile a 176-key one is built too and runs unmasked
                     problems with Nk >= 8192

   LIMITS: dtype f16 or bf16; rows 16-byte aligned (pointers 16-byte aligned,
   strides multiples of 8 elements); heads_q and batch <= 65535; the FA2
   kernels' shared memory (forward 50 - 125 KB, backward 125 - 155 KB by
   head dim) within the device's opt-in limit, else FA_ERR_UNSUPPORTED: at
   99 KB (compute capability 8.6, 8.9) the forward runs at d = 32, 64, 96,
   128, 256 and the backward at d = 32, 64, 96, 128 (on a 64 x 64 tile of
   50 - 88 KB, chosen at run time). The Hopper
   path also needs tensor maps for every tensor (cuTensorMapEncodeTiled);
   where one can't be made the call runs the FA2 kernel instead.
*/
#if !defined(FA_I_PASS)
#ifndef FLASHATTN_CUDA_H
#define FLASHATTN_CUDA_H

#include <cuda_runtime.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FA_OK when this build and the current device run p; otherwise the status
   the call would return, with fa_last_error_detail() saying why. */
FA_API fa_status fa_cuda_supported(const fa_params *p, fa_pass pass);

/* The forward algorithm fa_cuda_forward runs for p on the current device:
   1 FA1, 2 FA2 (mma.sync), 3 FA3 (Hopper sm_90a); 0 when p is unsupported. */
FA_API int fa_cuda_forward_algorithm(const fa_params *p);

/* The backward algorithm fa_cuda_backward runs for p: 2 FA2 (mma.sync), 3
   FA3 (Hopper sm_90a, d = 64, 128, 256, not deterministic); 0 when p is unsupported. */
FA_API int fa_cuda_backward_algorithm(const fa_params *p, int deterministic);

/* Bytes of workspace the forward needs (0 for FA2; O, m, l for FA1). */
FA_API size_t fa_cuda_forward_workspace_size(const fa_params *p);
FA_API fa_status fa_cuda_forward(const fa_params *p, void *workspace, size_t workspace_size,
                                 cudaStream_t stream);

/* Backward: reads q, k, v, o, lse, dout; writes dq, dk, dv. deterministic
   nonzero gives bitwise-identical gradients run after run. */
FA_API size_t fa_cuda_backward_workspace_size(const fa_params *p, int deterministic);
FA_API fa_status fa_cuda_backward(const fa_params *p, int deterministic, void *workspace,
                                  size_t workspace_size, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_CUDA_H */

/* ======================================================================== */
#ifdef FLASHATTN_CUDA_IMPLEMENTATION
#ifndef FLASHATTN_CUDA_IMPLEMENTATION_DONE
#define FLASHATTN_CUDA_IMPLEMENTATION_DONE

#ifdef FLASHATTN_IMPLEMENTATION
#include "flashattn.h" /* the CPU implementation and validation, once */
#endif

#include <stdint.h>

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
#if FA_CUDA_DTYPE < 0 || FA_CUDA_DTYPE > 2
#error "flashattn: FA_CUDA_DTYPE must be 0 (both), 1 (f16) or 2 (bf16)"
#endif
#if defined(FA_KV_STAGES) && FA_KV_STAGES != 1 && FA_KV_STAGES != 2
#error "flashattn: FA_KV_STAGES must be 1 or 2"
#endif
#if defined(FA_BLOCK_M) || defined(FA_BLOCK_N) || defined(FA_NUM_WARPS)
#if !defined(FA_BLOCK_M) || !defined(FA_BLOCK_N) || !defined(FA_NUM_WARPS)
#error "flashattn: define FA_BLOCK_M, FA_BLOCK_N and FA_NUM_WARPS together"
#endif
#if (FA_BLOCK_M != 16 * FA_NUM_WARPS && FA_BLOCK_M != 32 * FA_NUM_WARPS) || FA_BLOCK_N % 16 != 0
#error "flashattn: FA_BLOCK_M must be 16 or 32 times FA_NUM_WARPS, FA_BLOCK_N a multiple of 16"
#endif
#endif

#ifndef FA_SM90
#define FA_SM90 1
#endif
#ifndef FA_SM90_OVERLAP
#define FA_SM90_OVERLAP 1
#endif
#ifndef FA_SM90_PINGPONG
#define FA_SM90_PINGPONG 1
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

#define FA_I_BUILD_D(d) (FA_HEAD_DIM == 0 || FA_HEAD_DIM == (d))
#define FA_I_CAT2(a, b) a##b
#define FA_I_CAT(a, b) FA_I_CAT2(a, b)

/* Tile table: forward (query rows per CTA, keys per tile, warps; each warp
   owns rows / warps = 16 or 32 rows); backward dK/dV kernel, both modes
   (BWD: keys per CTA, query rows per step, stages of Q and of dO (2: the
   next step's rows load during this one), and for its 8 warps the warps
   over the rows of S and dP, over the keys of dK and dV, over the rows of
   dQ, the rest of the 8 splitting the other side); backward dQ kernel of
   the deterministic mode (query rows, keys per tile, warps). Chosen so that
   the registers hold the accumulators without spills and the shared memory
   (16-bit rows of pitch FA_I_PITCH: swizzled or padded, conflict-free
   ldmatrix) fits in 163 KB (sm_80). The backward's tiles are
   FlashAttention-2's, 64 x 128 up to d = 128 and 64 x 64 above, but for 128
   x 128 at d = 32, 64 (measured faster, bench/NOTES.md v10). */
#define FA_I_FWD_32 128, 128, 4
#define FA_I_FWD_64 128, 128, 4
#define FA_I_FWD_96 128, 64, 4
#define FA_I_FWD_128 128, 64, 4
#define FA_I_FWD_160 64, 64, 4
#define FA_I_FWD_192 64, 64, 4
#define FA_I_FWD_256 64, 64, 4
/* K/V stages of the forward: 2 double-buffers K and V (one barrier per key
   block); 1 keeps one buffer of each, loading V during QK^T and the next K
   during PV (two barriers per block), the FA2 order that fits a 64-key
   tile at d = 256 with two CTAs per SM. */
#define FA_I_FWD_STAGES_32 2
#define FA_I_FWD_STAGES_64 2
#define FA_I_FWD_STAGES_96 2
#define FA_I_FWD_STAGES_128 2
#define FA_I_FWD_STAGES_160 2
#define FA_I_FWD_STAGES_192 2
#define FA_I_FWD_STAGES_256 1
#define FA_I_BWD_32 128, 128, 2, 2, 2, 4, 4
#define FA_I_BWD_64 128, 128, 1, 1, 2, 4, 4
#define FA_I_BWD_96 128, 64, 2, 1, 2, 4, 4
#define FA_I_BWD_128 128, 64, 2, 1, 2, 4, 2
#define FA_I_BWD_160 64, 64, 2, 1, 4, 4, 4
#define FA_I_BWD_192 64, 64, 2, 1, 4, 4, 4
#define FA_I_BWD_256 64, 64, 1, 1, 4, 2, 2
/* The dK/dV tile where the device allows 227 KB of shared memory per block
   (compute capability 9.0, 10.0; same fields; 0 keys: none): second
   stages of Q and dO where they fit no sm_80 budget (180 KB at d = 64, 214
   KB at d = 256). Measured faster on the H200 at d = 64 (+5%) and 256 (+6
   to +7% for the Q stage, +5 to +7% more for the dO stage), not at d = 128
   (bench/NOTES.md v13, v14). */
#define FA_I_BWD227_32 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWD227_64 128, 128, 2, 2, 2, 4, 4
#define FA_I_BWD227_96 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWD227_128 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWD227_160 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWD227_192 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWD227_256 64, 64, 2, 2, 4, 2, 2
/* The dK/dV tile where the device allows less shared memory per block than
   the one above needs, as the 99 KB of compute capability 8.6 and 8.9 (same
   fields; 0 keys: none). Only up to d = 128 (one Q stage there): above,
   the forward (d = 160, 192) or the deterministic mode's dQ kernel (d =
   256) doesn't fit 99 KB either. */
#define FA_I_BWD99_32 64, 64, 2, 2, 2, 4, 4
#define FA_I_BWD99_64 64, 64, 2, 2, 2, 4, 4
#define FA_I_BWD99_96 64, 64, 2, 1, 2, 4, 4
#define FA_I_BWD99_128 64, 64, 1, 1, 2, 4, 2
#define FA_I_BWD99_160 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWD99_192 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWD99_256 0, 0, 0, 0, 0, 0, 0
#define FA_I_BWDQ_32 64, 64, 4
#define FA_I_BWDQ_64 64, 64, 4
#define FA_I_BWDQ_96 64, 64, 4
#define FA_I_BWDQ_128 64, 64, 4
#define FA_I_BWDQ_160 64, 32, 4
#define FA_I_BWDQ_192 64, 32, 4
#define FA_I_BWDQ_256 64, 32, 4
/* Hopper forward (FA3): query rows per CTA (64 per consumer warpgroup: 128 or
   192), keys per tile, K/V pipeline stages. Shared memory Q + 2 * stages * K/V
   tile (+1 KB to align the 128-byte swizzle atoms) must fit 227 KB: d = 256
   takes 80 keys, 224 KB. Registers per consumer thread: O d/2 + S keys/2 + P
   keys/4 floats, under what setmaxnreg gives (232 with 2 consumer
   warpgroups, 160 with 3). d = 64 has 3: its exp2 work equals its GEMM work,
   and a third warpgroup gives the softmax more warps to hide behind. */
#ifndef FA_SM90_KEYS_64
#define FA_SM90_KEYS_64 128
#endif
#ifndef FA_SM90_STAGES_64
#define FA_SM90_STAGES_64 2
#endif
#ifndef FA_SM90_KEYS_128
#define FA_SM90_KEYS_128 128
#endif
#ifndef FA_SM90_STAGES_128
#define FA_SM90_STAGES_128 2
#endif
#ifndef FA_SM90_KEYS_256
#define FA_SM90_KEYS_256 80
#endif
#ifndef FA_SM90_STAGES_256
#define FA_SM90_STAGES_256 2
#endif
#ifndef FA_SM90_ROWS_64
#define FA_SM90_ROWS_64 192
#endif
#ifndef FA_SM90_ROWS_128
#define FA_SM90_ROWS_128 128
#endif
#ifndef FA_SM90_ROWS_256
#define FA_SM90_ROWS_256 128
#endif
#define FA_I_SM90_64 FA_SM90_ROWS_64, FA_SM90_KEYS_64, FA_SM90_STAGES_64
#define FA_I_SM90_128 FA_SM90_ROWS_128, FA_SM90_KEYS_128, FA_SM90_STAGES_128
#define FA_I_SM90_256 FA_SM90_ROWS_256, FA_SM90_KEYS_256, FA_SM90_STAGES_256
/* Q buffers of the FA3 forward (2 only where a second Q and O's own buffer
   fit, FA_I_SM90_SMEM). Measured on the H200 with 2 (bench/NOTES.md, f5):
   d = 64 +2 to +5% except causal N <= 2k (equal); d = 128 (225 KB) up to 3%
   slower, so it keeps 1. */
#define FA_I_SM90_QBUFS_64 2
#define FA_I_SM90_QBUFS_128 1
#define FA_I_SM90_QBUFS_256 1
/* L2 eviction hints on the FA3 forward's TMA copies: K and V (read by every
   query tile of a head) evict-last, Q and O (touched once) evict-first. On
   the H200 +1 to +2.6% at d = 256 N = 1k - 2k, -0.3 to -1.8% at d = 64,
   +-0.7% at d = 128 (bench/NOTES.md f14), so d = 256 only. */
#define FA_I_SM90_L2_HINTS_64 0
#define FA_I_SM90_L2_HINTS_128 0
#define FA_I_SM90_L2_HINTS_256 1
/* Whether the FA3 forward pins tile n's softmax above the wait for PV(n-1)
   (fa_i_pin). Without it ptxas runs the common path's softmax after that
   wait. On the H200 the pin gave d = 256 +2 to +7.5% at N >= 2k (+0.2 to
   +1.8% shorter), d = 64 -1 to -3%, d = 128 -1.8 to +0.5% (bench/NOTES.md
   f21), so d = 256 only, and there only without FA_SM90_SPEC (its form 2
   waits for PV first). */
#define FA_I_SM90_PIN_SOFTMAX_64 0
#define FA_I_SM90_PIN_SOFTMAX_128 0
#define FA_I_SM90_PIN_SOFTMAX_256 1
/* Speculative exps in the FA3 forward's key loop (FA_SM90_SPEC): a tile's
   exps run against the running max, without the tile's own max (no row
   max, no O rescale in the common case); where some thread's exps of a row
   sum to more than FA_I_SM90_SPEC_SUM_MAX (so a P may exceed it: the max
   rose) the warp redoes them against the new max. Per head dim: 1 keeps P
   in fp32 registers beside PV(n - 1) (64 more registers: d = 64 only), 2
   waits for PV(n - 1) and packs P straight into its operand registers.
   Tiles of at most 128 keys (the 176-key d = 128 tile spilled); form 1
   needs two warpgroups, so d = 64's 192-row tile takes form 2. On the H200
   (bench/NOTES.md f37, f38): d = 64 form 1 +3.8 to +7.1% at causal 1k - 2k
   (form 2 -1.3 to +0.1%), the 192-row tile form 2 +6.4 to +9.5%, d = 128
   form 2 -0.3 to +4.2%, d = 256 form 2 +3.4 to +4.7% over the pinned
   softmax (FA_I_SM90_PIN_SOFTMAX_256, which now serves FA_SM90_SPEC=0). */
#ifndef FA_SM90_SPEC
#define FA_SM90_SPEC 1
#endif
#define FA_I_SM90_SPEC_SUM_MAX 256.0f
#ifndef FA_FWD_SPEC
#define FA_FWD_SPEC 1
#endif
/* The FA2 forward's speculative exps only at d = 256 (+2.8 to +4.4% at N =
   1k - 4k on the H200, bench/NOTES.md v18): at 64 and 128 the kept scores
   spilled (254 - 255 registers already). */
#define FA_I_FWD_SPEC (FA_FWD_SPEC && FA_I_D == 256)
#define FA_I_SM90_SPEC_64 1
#define FA_I_SM90_SPEC_128 2
#define FA_I_SM90_SPEC_256 2
#define FA_I_SM90_SMEM_MAX (227 * 1024)
/* The FA3 backward (d = 64, 128, 256): keys per CTA (64 per warpgroup, or
   at d = 256 64 shared by both, which split d), Q/dO buffers and fp32 dQ
   parts of 64 x 64 per warpgroup. */
#define FA_I_SM90_BWD_KEYS(d) ((d) == 256 ? 64 : 128)
#define FA_I_SM90_BWD_STAGES(d) ((d) == 256 ? 1 : 2)
#define FA_I_SM90_BWD_DQ_PARTS(d) ((d) == 256 ? 2 : 1)
/* Registers per thread after setmaxnreg, for nc consumer warpgroups. setmaxnreg
   only moves registers within the CTA's launch allocation, 128 (nc + 1)
   threads x 65536 / (128 (nc + 1)) rounded down to 8: asking for more makes
   the consumers' setmaxnreg.inc wait forever. The producer's tile loop spills
   at 24. nc = 2: 40 / 232 of 168; nc = 3: 32 / 160 of 128. */
#define FA_I_SM90_PRODUCER_REGS(nc) ((nc) == 2 ? 40 : 32)
#define FA_I_SM90_CONSUMER_REGS(nc) ((nc) == 2 ? 232 : 160)
#define FA_I_SM90_LAUNCH_REGS(nc) (65536 / (128 * ((nc) + 1)) / 8 * 8)
static_assert(FA_I_SM90_PRODUCER_REGS(2) + 2 * FA_I_SM90_CONSUMER_REGS(2) <= 3 * FA_I_SM90_LAUNCH_REGS(2) &&
                  FA_I_SM90_PRODUCER_REGS(3) + 3 * FA_I_SM90_CONSUMER_REGS(3) <= 4 * FA_I_SM90_LAUNCH_REGS(3),
              "flashattn: setmaxnreg can't hand out more registers than the CTA launched with");
#define FA_I_FIRST(a, b, c) a
#define FA_I_SECOND(a, b, c) b
#define FA_I_THIRD(a, b, c) c
#define FA_I_APPLY(f, args) f args
/* Fields of a backward dK/dV tile (FA_I_BWD_<d>). */
#define FA_I_B_KEYS(a, b, c, d, e, f, g) a
#define FA_I_B_ROWS(a, b, c, d, e, f, g) b
#define FA_I_B_Q_STAGES(a, b, c, d, e, f, g) c
#define FA_I_B_DO_STAGES(a, b, c, d, e, f, g) d
#define FA_I_B_S_ROW_WARPS(a, b, c, d, e, f, g) e
#define FA_I_B_KV_KEY_WARPS(a, b, c, d, e, f, g) f
#define FA_I_B_DQ_ROW_WARPS(a, b, c, d, e, f, g) g

#define FA_I_LOG2E_F 1.4426950408889634f
#define FA_I_LN2_F 0.6931471805599453f
/* Bytes of the largest dynamic shared memory any kernel here may ask for. */
#define FA_I_SMEM_MAX (163 * 1024)

/* One FA3 forward kernel: its tile (query rows, keys) and shared memory. */
typedef struct fa_i_sm90_kernel {
    const void *fwd;
    int rows, keys;
    size_t smem;
} fa_i_sm90_kernel;

/* One backward dK/dV kernel: keys per CTA, threads and shared memory. */
typedef struct fa_i_bwd_kernel {
    const void *fn;
    int keys, threads;
    size_t smem;
} fa_i_bwd_kernel;

/* One compiled (dtype, head dim): kernels with their launch shapes. */
typedef struct fa_i_kernels {
    const void *fwd;
    int fwd_rows, fwd_threads;
    size_t fwd_smem;
    /* dK/dV per tile, most shared memory first (FA_I_BWD227_<d>, FA_I_BWD_<d>,
       FA_I_BWD99_<d>; NULL fn: none) and per mode ([0] adds dQ by atomics,
       [1] leaves dQ to bwd_q) */
    fa_i_bwd_kernel bwd_kv[3][2];
    const void *bwd_q;
    int bwd_q_rows, bwd_q_threads;
    size_t bwd_q_smem;
    fa_i_sm90_kernel sm90[2]; /* Hopper forward tiles ([1] optional), NULL fwd: none */
    fa_i_bwd_kernel sm90_bwd; /* Hopper backward (atomic mode), NULL fn: none */
} fa_i_kernels;

#if FA_I_SM90
/* The Hopper forward's tensor maps; each box is 64 elements (128 bytes, one
   swizzle row) of the head dim by a tile's rows. */
typedef struct fa_i_tma_maps {
    CUtensorMap q, k, v, o;
} fa_i_tma_maps;
#endif

/* Arguments every backward kernel shares, beside the params. */
typedef struct fa_i_bwd_args {
    float *dsum;   /* [B, Hq, Nq] D = rowsum(dO * O) */
    float *dq_acc; /* fp32 dQ (atomic mode), else NULL: [B, Hq, 64-row blocks][64 d], tiled as
                      fa_i_bwd_postprocess says */
} fa_i_bwd_args;

#if FA_I_SM90
/* The FA3 backward's arguments: tensor maps (boxes of 64 elements of d by 64
   query rows or FA_I_SM90_BWD_KEYS(d) keys) and the shared ones. */
typedef struct fa_i_sm90_bwd_args {
    CUtensorMap q, k, v, dout;
    fa_i_bwd_args a;
} fa_i_sm90_bwd_args;
#endif

/* ---- device helpers --------------------------------------------------------- */

static __device__ __forceinline__ uint32_t fa_i_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; src_bytes 0 fills zeros (rows past the end). */
static __device__ __forceinline__ void fa_i_cp_async16(void *smem, const void *gmem, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_i_smem_addr(smem)),
                 "l"(gmem), "r"(src_bytes));
}
static __device__ __forceinline__ void fa_i_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}
static __device__ __forceinline__ void fa_i_cp_async_wait_0(void)
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
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

static __device__ __forceinline__ float fa_i_dev_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* The MUFU's log2 and reciprocal, for the row sums at an FA3 forward tile's
   end (0 or at least 1, never denormal). log2f and 1 / l compile to a
   20-instruction polynomial and a division with a slow-path call, on the
   path from the last PV's issue to the epilogue: ~500 cycles of each tile
   boundary at d = 64 (bench/NOTES.md f53). */
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

/* Of a grid of (blocks, heads, batch) CTAs whose blocks differ in work
   (causal masking): this CTA's rank among its head's blocks (0 starts
   first), head and batch. Blocks start roughly in launch order (x
   fastest), which would interleave heavy and light blocks and leave heavy
   ones in the last wave; so the grid goes block-major within groups of
   heads that span ~2 waves (group_ctas; the group's inputs stay in L2), and
   the caller maps rank 0 to its heaviest block: each group runs heavy
   first and the grid ends on light blocks (bench/NOTES.md v14, v15). */
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
   piece of shared memory: with the 16-byte padding, every other row's
   sectors were split and the copies read 1.5 times their bytes from L2
   (bench/NOTES.md v13). */
#define FA_I_PITCH(d) ((d) % 64 == 0 ? (d) : (d) + 8)
/* The dK/dV kernels' pitch for Q and dO: FA_I_PITCH, but for padded rows at
   d = 128, where the swizzle's extra address registers (at 253 of them)
   measured 2.4 - 2.9% slower (+2 to +4% at d = 64, 256; bench/NOTES.md
   v13). Their K and V rows stay padded (FA_I_BWD_KV_PITCH): swizzled too,
   they spilled. */
#define FA_I_BWD_Q_PITCH(d) ((d) == 128 ? (d) + 8 : FA_I_PITCH(d))
#define FA_I_BWD_KV_PITCH(d) ((d) + 8)
/* The atomic mode's dQ product per step in parts over the columns: at d = 256
   a warp's whole dQ tile (64 floats) next to dK and dV (128) left no room
   for a second dO stage without spills; in halves, 32 at a time (measured on
   the H200, bench/NOTES.md v14). At d = 128 halves (16 of 32 floats at a
   time) measured +1.7 to +3.2% on 10 of 11 rows and -0.5% on one (v16).
   Compiled for sm_8x, ptxas still spilled 8 bytes with halves at d = 256;
   quarters, 16 at a time, leave none there. sm_8x keeps d = 128 whole: not
   measured there. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FA_I_BWD_DQ_PARTS(d) ((d) == 256 ? 4 : 1)
#else
#define FA_I_BWD_DQ_PARTS(d) ((d) == 256 || (d) == 128 ? 2 : 1)
#endif
/* Element offset of (row, col) in a tile of pitch ld (FA_I_PITCH, or any
   pitch that is not a multiple of 64 for a plain padded tile). */
#define FA_I_SMEM_AT(row, col, ld) \
    ((row) * (ld) + ((ld) % 64 == 0 ? ((((col) >> 3) ^ ((row) & 7)) << 3) | ((col) & 7) : (col)))

/* Copies rows [row0, row0 + tile_rows) of a [rows][d] 16-bit matrix (row
   stride in elements) into a smem tile of pitch ld (FA_I_SMEM_AT); rows at
   or past `rows` are zero-filled. tpr threads share a row: the largest power
   of two that divides its 16-byte chunks (so a whole row, 32 threads, at d =
   256; a warp's copy then reads whole rows, measured faster than 128-byte
   pieces of 4 rows, bench/NOTES.md v12), each thread taking chunks 16 * tpr
   bytes apart. The passes are unrolled: one 64-bit address per row a thread
   copies, immediate offsets for its other chunks; a pass's rows r + k step
   (r < step, both powers of two) keep r's low bits, so the swizzle of a
   pass is the thread's first one XORed with a constant. tid is made opaque
   first: otherwise the compiler hoists the addresses out of the caller's key
   loop and holds them in registers, which spills the 64-key tiles. */
static __device__ __forceinline__ void fa_i_async_tile(uint16_t *smem, const uint16_t *g,
                                                       int64_t stride, int row0, int rows,
                                                       int tile_rows, int d, int ld, int tid,
                                                       int nthreads)
{
    const int chunks = d / 8, tpr = chunks & -chunks, step = nthreads / tpr;
    const int swizzled = ld % 64 == 0;
    int r, x0, pass, c;
    const uint16_t *src;
    asm volatile("" : "+r"(tid));
    r = tid / tpr;
    x0 = swizzled ? (tid % tpr) ^ (r & 7) : tid % tpr; /* this thread's first chunk in smem */
    smem += r * ld;
    src = g + (int64_t)(row0 + r) * stride + (tid % tpr) * 8;
#pragma unroll
    for (pass = 0; pass < (tile_rows + step - 1) / step; ++pass, r += step, src += step * stride)
        if (tile_rows % step == 0 || r < tile_rows) {
            const int valid = row0 + r < rows, x = swizzled ? x0 ^ (pass * step & 7) : x0;
            const uint16_t *from = valid ? src : g; /* a row past the end reads nothing */
#pragma unroll
            for (c = 0; c < chunks / tpr; ++c)
                fa_i_cp_async16(smem + pass * step * ld + (x + c * tpr) * 8, from + c * tpr * 8,
                                valid ? 16 : 0);
        }
}

/* Copies key and value rows [c0, c0 + bn) (of the head at gk, gv) into the
   smem tiles sk, sv. */
static __device__ __forceinline__ void fa_i_async_kv(uint16_t *sk, uint16_t *sv, const uint16_t *gk,
                                                     const uint16_t *gv, const fa_params *p, int c0,
                                                     int bn, int d, int ld, int tid, int nthreads)
{
    fa_i_async_tile(sk, gk, p->k_layout.seq, c0, p->seqlen_k, bn, d, ld, tid, nthreads);
    fa_i_async_tile(sv, gv, p->v_layout.seq, c0, p->seqlen_k, bn, d, ld, tid, nthreads);
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

/* ---- kernels independent of head dim ---------------------------------------- */

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

/* Stores scale * f[0..7] as 8 16-bit elements (16 bytes) at dst. */
static __device__ __forceinline__ void fa_i_store8(void *dst, const float *f, float scale, int bf16)
{
    uint32_t r[4];
    int i;
#pragma unroll
    for (i = 0; i < 4; ++i)
        r[i] = bf16 ? fa_i_pack_bf16(f[2 * i] * scale, f[2 * i + 1] * scale)
                    : fa_i_pack_f16(f[2 * i] * scale, f[2 * i + 1] * scale);
    *(uint4 *)dst = make_uint4(r[0], r[1], r[2], r[3]);
}

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

/* Whether a key tile [c0, c1) needs the mask for a block of query rows:
   unless every row sees all its keys. Key ranges grow with the row, so the
   first row's end and the last row's start say. */
#define FA_I_TILE_MASKED(first_hi, last_lo, c0, c1) ((first_hi) < (c1) || (last_lo) > (c0))

/* A backward kernel's epilogue: dK (times the softmax scale) and dV of one
   key at columns col, col + 1 into gdk, gdv, unless the key is past the end. */
#define FA_I_STORE_DK_DV(key, col, dk0, dk1, dv0, dv1)                                           \
    if ((key) < p.seqlen_k) {                                                                     \
        *(uint32_t *)(gdk + (int64_t)(key) * p.dk_layout.seq + (col)) =                           \
            FA_I_PACK((dk0) * p.scale, (dk1) * p.scale);                                          \
        *(uint32_t *)(gdv + (int64_t)(key) * p.dv_layout.seq + (col)) = FA_I_PACK((dv0), (dv1)); \
    }

/* Lanes per query row in the preprocess: the power of two that covers d with
   16 bytes each (several rows per warp below d = 160). */
static __host__ __device__ __forceinline__ int fa_i_pre_lanes(int d)
{
    return d <= 32 ? 4 : d <= 64 ? 8 : d <= 128 ? 16 : 32;
}

/* D = rowsum(dO * O) per query row, and the fp32 dQ accumulator's rows
   zeroed (padding rows too), fa_i_pre_lanes(d) lanes per row. */
static __global__ void fa_i_bwd_preprocess(const fa_params p, fa_i_bwd_args a)
{
    const int d = p.head_dim, lanes = fa_i_pre_lanes(d), per_head = fa_i_dq_blocks(&p) * 64;
    const int lane = threadIdx.x & (lanes - 1);
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / lanes;
    const int64_t bh = row / per_head;
    const int s = (int)(row % per_head), in_acc = bh < (int64_t)p.batch * p.heads_q;
    const int has_d = in_acc && s < p.seqlen_q;
    float sum = 0.0f;
    int i;
    if (a.dq_acc && in_acc)
        for (i = 4 * lane; i < d; i += 4 * lanes)
            *(float4 *)(a.dq_acc + row * d + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (has_d) {
        const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
        const uint16_t *o = (const uint16_t *)p.o + fa_i_dev_offset(&p.o_layout, b, h, s);
        const uint16_t *g = (const uint16_t *)p.dout + fa_i_dev_offset(&p.dout_layout, b, h, s);
        for (i = 8 * lane; i < d; i += 8 * lanes)
            sum += fa_i_dot8(*(const uint4 *)(o + i), *(const uint4 *)(g + i),
                             p.dtype == FA_DTYPE_BF16);
    }
    for (i = lanes / 2; i > 0; i >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, i);
    if (lane == 0 && has_d) a.dsum[bh * p.seqlen_q + s] = sum;
}

/* dQ = scale * accumulator in the params' dtype and layout. The accumulator
   is tiled in the order of the MMA accumulators: each 64-row block is d / 8
   groups of 8 columns, 512 floats each, and in a group, the 4 floats of
   columns c, c + 1 (c even) of rows r and r + 8 (r % 16 < 8, r counted in
   the block) lie at 4 t, t = 32 (r / 16) + 4 (r % 8) + (c % 8) / 2: the
   accumulator of lane t % 32 of an m16n8 tile. So a warp's mma.sync tile
   (FA2) or a warpgroup's wgmma registers (FA3) leave in 16-byte pieces
   without shuffles, and the FA3 kernel's shared-memory writes are
   conflict-free. Here thread x of a block takes column chunk j = x % (d /
   8) of row group m = x / (d / 8): floats 512 j + 16 m ... + 15, which are
   columns 8 j ... 8 j + 7 of rows r and r + 8, r = 16 (m / 8) + m % 8
   (pairs of (r, r + 8) from each of four neighbouring threads).
   Neighbouring x take neighbouring chunks of a row, so a warp's stores
   cover whole rows. */
static __global__ void fa_i_bwd_postprocess(const fa_params p, fa_i_bwd_args a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int d = p.head_dim, bf16 = p.dtype == FA_DTYPE_BF16;
    const int blocks = fa_i_dq_blocks(&p), x = (int)(t % (4 * d));
    const int j = x % (d / 8), m = x / (d / 8);
    const int64_t block = t / (4 * d), bh = block / blocks;
    const float4 *src = (const float4 *)(a.dq_acc + block * 64 * d + 512 * j + 16 * m);
    const int r = (int)(block % blocks) * 64 + 16 * (m >> 3) + (m & 7);
    float f[16];
    int i;
    if (block >= (int64_t)p.batch * p.heads_q * blocks) return;
    for (i = 0; i < 4; ++i) {
        const float4 v = src[i];
        f[2 * i] = v.x, f[2 * i + 1] = v.y, f[8 + 2 * i] = v.z, f[8 + 2 * i + 1] = v.w;
    }
    for (i = 0; i < 2 && r + 8 * i < p.seqlen_q; ++i)
        fa_i_store8((uint16_t *)p.dq +
                        fa_i_dev_offset(&p.dq_layout, (int)(bh / p.heads_q), (int)(bh % p.heads_q),
                                        r + 8 * i) +
                        8 * j,
                    f + 8 * i, p.scale, bf16);
}

#if FA_VARIANT == 1
/* FlashAttention 1 forward, the teaching variant: one CTA per (batch, head);
   the outer loop streams K/V blocks through shared memory once; for each,
   every query row reads its normalized O, m and l from the global workspace
   `state`, merges the block, and writes them back. fp32 CUDA-core math. */
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
            if (m_tile == -INFINITY) continue;
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
                st[d + 1] > 0.0f ? (st[d] + log2f(st[d + 1])) * FA_I_LN2_F : -INFINITY;
    }
}
#endif

#if FA_I_SM90 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* ---- Hopper (sm_90a) helpers: mbarriers, TMA, wgmma ----------------------------
   Addresses are shared-memory (32-bit) addresses unless named otherwise. */

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
   suspend-time hint (10 ms) lets the thread sleep until then: with the
   default limit the FA3 producer's waits for a free stage spun, ~7% of the
   forward's issued instructions (ncu, d = 64 causal N = 1k). */
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

/* Waits for two barriers. A check costs ~75 cycles even on a barrier long
   complete; here both issue before either result is needed, without the
   suspend-time hint (whose predicated sleep after a check makes the next
   check wait for its result). Only where one is not yet complete, the
   waits that suspend (bench/NOTES.md, f44). */
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
/* Keeps the computation of x above the wgmma wait that follows. ptxas sinks
   independent arithmetic below a wgmma.wait_group (the softmax of tile n went
   below the wait for PV(n - 1) in every FA3 forward kernel's SASS, so that it
   never ran under that PV); a volatile shared-memory store of x stays above
   the wait, and with it everything x needs. */
static __device__ __forceinline__ void fa_i_pin(float *slot, float x)
{
    *(volatile float *)slot = x;
}
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

/* The FA3 backward's Q and dO tiles of one 64-row block (chunks of 64
   columns each), completing on bar. */
static __device__ __forceinline__ void fa_i_sm90_bwd_load_rows(const fa_i_sm90_bwd_args *args,
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

/* Ping-pong: consumer warpgroup cw of nc owns named barrier 1 + cw; it waits
   there before issuing its GEMMs and then lets the next one (cyclically) go.
   The last warpgroup arrives once before anyone's first turn (warpgroup 0
   goes first) and warpgroup 0 waits once after its last, so every arrival
   is matched. */
static __device__ __forceinline__ void fa_i_sm90_turn_begin(int pingpong, int cw)
{
    if (pingpong) fa_i_named_sync(1 + cw, 256);
}
static __device__ __forceinline__ void fa_i_sm90_turn_end(int pingpong, int cw, int nc)
{
    if (pingpong) fa_i_named_arrive(1 + (cw + 1) % nc, 256);
}

/* The persistent schedule: the k-th tile of this CTA, or 0 when it has no
   more. CTAs take pairs of tiles in turn (pair u: tiles 2u and 2u + 1);
   within a head the query blocks run M-1, 0, M-2, 1, ... under causal
   masking, so every pair holds one heavy and one light block and static
   turns stay balanced. Query blocks vary fastest: CTAs running together
   share a head's K and V in L2. */
static __device__ __forceinline__ int fa_i_sm90_tile(const fa_params *p, int64_t k, int blocks_m,
                                                     int *mb, int *h, int *b)
{
    const int64_t t = 2 * (blockIdx.x + (k >> 1) * gridDim.x) + (k & 1);
    int r;
    if (t >= (int64_t)blocks_m * p->heads_q * p->batch) return 0;
    if (t <= 0xFFFFFFFF) { /* 32-bit divisions: a fraction of the 64-bit ones' cost */
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
    *mb = !p->causal ? r : (r & 1) ? r >> 1 : blocks_m - 1 - (r >> 1);
    return 1;
}

/* Which key bounds an FA3 forward key tile must apply (its softmax's mask). */
enum { FA_I_MASK_HI = 1, FA_I_MASK_LO = 2 };

/* Shared-memory matrix descriptor with the 128-byte swizzle: start, leading
   and stride byte offsets (see the PTX ISA's wgmma section). */
static __device__ __forceinline__ uint64_t fa_i_wgmma_desc(uint32_t addr, uint32_t lead,
                                                           uint32_t stride)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lead & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((stride & 0x3FFFF) >> 4) << 32 | (uint64_t)1 << 62;
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
   forward's S = Q K^T and the backward's S^T and dP^T. */
#define FA_I_SM90_GEMM_NT(WGMMA, acc, a, a_rows, b, b_rows)                                   \
    do {                                                                                      \
        const uint64_t ad_ = fa_i_wgmma_desc(a, 16, 1024), bd_ = fa_i_wgmma_desc(b, 16, 1024); \
        int k_;                                                                               \
        _Pragma("unroll") for (k_ = 0; k_ < FA_I_D / 16; ++k_) /* chunk k / 4, 32 B a step */ \
            WGMMA(acc, fa_i_desc_add(ad_, (k_ >> 2) * (a_rows) * 128 + (k_ & 3) * 32),        \
                  fa_i_desc_add(bd_, (k_ >> 2) * (b_rows) * 128 + (k_ & 3) * 32), k_ > 0);    \
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
#define FA_I_DEFINE_WGMMA_SS(KIND, TRANS, N, NACC, DT, IA, IB, IS)                            \
    static __device__ __forceinline__ void fa_i_wgmma_##KIND##_##DT##_n##N(                   \
        float *d, uint64_t a, uint64_t b, int accumulate)                                     \
    {                                                                                         \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IS ", 0;\n"                           \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #DT "." #DT " {"         \
                     FA_I_REGS##NACC "}, " IA ", " IB ", p, 1, 1, " TRANS ";\n}\n"              \
                     : FA_I_ACC##NACC(d)                                                      \
                     : "l"(a), "l"(b), "r"(accumulate));                                      \
    }
#define FA_I_DEFINE_WGMMA_RS(N, NACC, DT, IA, IB, IS)                                         \
    static __device__ __forceinline__ void fa_i_wgmma_rs_##DT##_n##N(float *d, const uint32_t *a, \
                                                                     uint64_t b)              \
    {                                                                                         \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IS ", 0;\n"                           \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #DT "." #DT " {"         \
                     FA_I_REGS##NACC "}, " IA ", " IB ", p, 1, 1, 1;\n}\n"                      \
                     : FA_I_ACC##NACC(d)                                                      \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));           \
    }
/* S tiles of 64 to 192 keys (any the tile table may pick), O tiles of d; the
   backward's 64 x 64 dQ blocks. */
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
    FA_I_DEFINE_WGMMA_RS(256, 128, DT, "{%128,%129,%130,%131}", "%132", "%133")
FA_I_DEFINE_WGMMA_SET(f16)
FA_I_DEFINE_WGMMA_SET(bf16)
#undef FA_I_DEFINE_WGMMA_SET
#undef FA_I_DEFINE_WGMMA_SS
#undef FA_I_DEFINE_WGMMA_RS
#endif /* FA_I_SM90 && __CUDA_ARCH_FEAT_SM90_ALL */

/* ---- kernels per (head dim, dtype): this file, included again ------------------
   Every head dim gets a table fa_i_kernels_<D>, empty where the build leaves
   it out. */

#define FA_I_PASS 1
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

/* ---- host side ------------------------------------------------------------------ */

#ifdef __cplusplus
extern "C" {
#endif

/* The kernels for (head dim, dtype), or NULL when this build has none. */
static const fa_i_kernels *fa_i_find_kernels(int d, fa_dtype dtype)
{
#define FA_I_TABLE_OF(dim) fa_i_kernels_##dim,
#define FA_I_DIM_OF(dim) dim,
    static const fa_i_kernels *const tables[] = {FA_I_HEAD_DIMS(FA_I_TABLE_OF)}; /* [0] f16, [1] bf16 */
    static const int dims[] = {FA_I_HEAD_DIMS(FA_I_DIM_OF)};
#undef FA_I_TABLE_OF
#undef FA_I_DIM_OF
    size_t i;
    if (dtype != FA_DTYPE_F16 && dtype != FA_DTYPE_BF16) return NULL;
    for (i = 0; i < sizeof dims / sizeof dims[0]; ++i)
        if (dims[i] == d) {
            const fa_i_kernels *sets = tables[i] + (dtype == FA_DTYPE_BF16);
            return sets->fwd ? sets : NULL;
        }
    return NULL;
}

static fa_status fa_i_cuda_error(cudaError_t e, const char *what)
{
    return fa_i_fail(FA_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

static int fa_i_aligned(const void *ptr, const fa_layout *l)
{
    return ((uintptr_t)ptr % 16 == 0) && l->batch % 8 == 0 && l->head % 8 == 0 && l->seq % 8 == 0;
}

/* What the launchers need to know of the current device. */
typedef struct fa_i_device {
    int major, minor; /* compute capability */
    int smem_optin;   /* shared memory a block may opt in to, bytes */
    int sms;          /* multiprocessors */
} fa_i_device;

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

/* The backward's dK/dV kernel for the mode on the largest tile that fits
   the device; NULL where none does. */
static const fa_i_bwd_kernel *fa_i_bwd_kv_kernel(const fa_i_kernels *k, int deterministic,
                                                 const fa_i_device *device)
{
    int tile;
    for (tile = 0; tile < 3; ++tile) {
        const fa_i_bwd_kernel *kv = &k->bwd_kv[tile][deterministic];
        if (kv->fn && (size_t)device->smem_optin >= kv->smem) return kv;
    }
    return NULL;
}

/* Validates for the GPU: resolved params, kernels, device and alignment;
   *device gets the current device's facts. */
static fa_status fa_i_cuda_check(const fa_params *params, fa_pass pass, fa_params *p,
                                 const fa_i_kernels **kernels, fa_i_device *device)
{
    fa_status s = fa_params_resolve(params, pass, p);
    size_t need;
    cudaError_t e;
    if (s != FA_OK) return s;
    if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "the GPU path takes f16 or bf16, not dtype %d",
                         (int)p->dtype);
    *kernels = fa_i_find_kernels(p->head_dim, p->dtype);
    if (!*kernels)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "head_dim %d with dtype %d is not in this build",
                         p->head_dim, (int)p->dtype);
    if (p->heads_q > 65535 || p->batch > 65535)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "heads_q and batch must be <= 65535");
    if (!fa_i_aligned(p->q, &p->q_layout) || !fa_i_aligned(p->k, &p->k_layout) ||
        !fa_i_aligned(p->v, &p->v_layout) || !fa_i_aligned(p->o, &p->o_layout) ||
        (pass == FA_PASS_BACKWARD &&
         (!fa_i_aligned(p->dout, &p->dout_layout) || !fa_i_aligned(p->dq, &p->dq_layout) ||
          !fa_i_aligned(p->dk, &p->dk_layout) || !fa_i_aligned(p->dv, &p->dv_layout))))
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "GPU rows must be 16-byte aligned: pointers 16-byte aligned and "
                         "strides multiples of 8 elements");
    if ((e = fa_i_device_facts(device)) != cudaSuccess)
        return fa_i_cuda_error(e, "querying the current device");
    if (device->major < 8)
        return fa_i_fail(FA_ERR_UNSUPPORTED, "compute capability %d.x < 8.0", device->major);
    need = (*kernels)->fwd_smem;
    if (pass == FA_PASS_BACKWARD) { /* both modes' kernels, on the tile that fits */
        const fa_i_kernels *k = *kernels;
        int mode;
        need = k->bwd_q_smem;
        for (mode = 0; mode < 2; ++mode) {
            const fa_i_bwd_kernel *kv = fa_i_bwd_kv_kernel(k, mode, device);
            const size_t smem = kv ? kv->smem : k->bwd_kv[1][mode].smem; /* the sm_80 tile's */
            if (smem > need) need = smem;
        }
    }
    if ((size_t)device->smem_optin < need)
        return fa_i_fail(FA_ERR_UNSUPPORTED,
                         "these kernels need %zu bytes of shared memory, the device allows %d",
                         need, device->smem_optin);
    return FA_OK;
}

/* Launches kernel(p, extra) with the dynamic shared memory raised as needed. */
static fa_status fa_i_launch(const void *kernel, dim3 grid, int threads, size_t smem,
                             cudaStream_t stream, const fa_params *p, void *extra)
{
    void *args[2];
    cudaError_t e;
    args[0] = (void *)p;
    args[1] = extra;
    if (smem > 48 * 1024 &&
        (e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem)) != cudaSuccess)
        return fa_i_cuda_error(e, "cudaFuncSetAttribute");
    if ((e = cudaLaunchKernel(kernel, grid, dim3(threads), args, smem, stream)) != cudaSuccess)
        return fa_i_cuda_error(e, "cudaLaunchKernel");
    if ((e = cudaGetLastError()) != cudaSuccess) return fa_i_cuda_error(e, "kernel launch");
    return FA_OK;
}

static int fa_i_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }

#if FA_I_SM90
/* A 4-D tensor map {d, seq, head, batch} of a 16-bit tensor with boxes of 64
   x box_rows elements and the 128-byte swizzle; 0 if the driver refuses it. */
static int fa_i_tma_map(CUtensorMap *map, const void *ptr, const fa_layout *l, const fa_params *p,
                        int seqlen, int heads, int box_rows)
{
    void *encode = NULL;
    cudaDriverEntryPointQueryResult found;
    const cuuint64_t dims[4] = {(cuuint64_t)p->head_dim, (cuuint64_t)seqlen, (cuuint64_t)heads,
                                (cuuint64_t)p->batch};
    const cuuint64_t strides[3] = {(cuuint64_t)l->seq * 2, (cuuint64_t)l->head * 2,
                                   (cuuint64_t)l->batch * 2}; /* bytes, dims 1..3 */
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, unit[4] = {1, 1, 1, 1};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !encode)
        return 0;
    return ((PFN_cuTensorMapEncodeTiled_v12000)encode)(
               map, p->dtype == FA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
               4, (void *)ptr, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The FA3 tile for p: variant 1 where the head dim has one and p is the
   kind of problem it was measured faster on (bench/NOTES.md): at d = 64
   causal problems with Nq < 4096, where the 192-row default's extra rows cost
   more in diagonal waste than they gain (f4, f8); at d = 128 full attention
   (no mask) over at least 8192 keys, where 176-key tiles' fewer tile
   boundaries pay (f9). */
static const fa_i_sm90_kernel *fa_i_sm90_pick(const fa_params *p, const fa_i_kernels *k)
{
    const int alt = p->head_dim == 64    ? p->causal && p->seqlen_q < 4096
                    : p->head_dim == 128 ? !p->causal && !p->window && p->seqlen_k >= 8192
                                         : 0;
    return k->sm90[1].fwd && alt ? &k->sm90[1] : &k->sm90[0];
}

/* Whether a Hopper kernel can run here: the build has it (fn) compiled for
   sm_90a (only that body has static shared memory), and the device (facts
   from fa_i_cuda_check) is compute capability 9.0 with room for its tiles. */
static int fa_i_sm90_compiled(const void *fn, size_t smem, const fa_i_device *dev)
{
    struct cudaFuncAttributes attr;
    if (!fn || dev->major != 9 || dev->minor != 0 || (size_t)dev->smem_optin < smem) return 0;
    if (cudaFuncGetAttributes(&attr, fn) != cudaSuccess) {
        cudaGetLastError(); /* a refused query is an answer here, not an error to keep */
        return 0;
    }
    return attr.sharedSizeBytes > 0;
}

/* Whether the Hopper forward runs p: its kernel can run here and every
   tensor gets a tensor map. Otherwise the FA2 kernel runs. *ctas: the
   persistent grid, one CTA per SM or per pair of tiles, whichever is fewer. */
static int fa_i_sm90_ready(const fa_params *p, const fa_i_sm90_kernel *k, const fa_i_device *dev,
                           fa_i_tma_maps *maps, int *ctas)
{
    int64_t pairs;
    if (!fa_i_sm90_compiled(k->fwd, k->smem, dev)) return 0;
    pairs = ((int64_t)fa_i_blocks(p->seqlen_q, k->rows) * p->heads_q * p->batch + 1) / 2;
    *ctas = pairs < dev->sms ? (int)pairs : dev->sms;
    return fa_i_tma_map(&maps->q, p->q, &p->q_layout, p, p->seqlen_q, p->heads_q, k->rows) &&
           fa_i_tma_map(&maps->k, p->k, &p->k_layout, p, p->seqlen_k, p->heads_kv, k->keys) &&
           fa_i_tma_map(&maps->v, p->v, &p->v_layout, p, p->seqlen_k, p->heads_kv, k->keys) &&
           fa_i_tma_map(&maps->o, p->o, &p->o_layout, p, p->seqlen_q, p->heads_q, 64);
}

/* The same for the Hopper backward (atomic mode) and its tensor maps. */
static int fa_i_sm90_bwd_ready(const fa_params *p, const fa_i_bwd_kernel *k,
                               const fa_i_device *dev, fa_i_sm90_bwd_args *args)
{
    return fa_i_sm90_compiled(k->fn, k->smem, dev) &&
           fa_i_tma_map(&args->q, p->q, &p->q_layout, p, p->seqlen_q, p->heads_q, 64) &&
           fa_i_tma_map(&args->k, p->k, &p->k_layout, p, p->seqlen_k, p->heads_kv, k->keys) &&
           fa_i_tma_map(&args->v, p->v, &p->v_layout, p, p->seqlen_k, p->heads_kv, k->keys) &&
           fa_i_tma_map(&args->dout, p->dout, &p->dout_layout, p, p->seqlen_q, p->heads_q, 64);
}
#endif

static size_t fa_i_round4(size_t n) { return (n + 3) / 4 * 4; }

FA_API fa_status fa_cuda_supported(const fa_params *params, fa_pass pass)
{
    fa_params p;
    const fa_i_kernels *k = NULL;
    fa_i_device dev;
    return fa_i_cuda_check(params, pass, &p, &k, &dev);
}

/* A validated forward and the kernel that runs it. */
typedef struct fa_i_forward_plan {
    fa_params p; /* resolved */
    const fa_i_kernels *k;
    int algorithm; /* 1 FA1, 2 FA2, 3 FA3 */
#if FA_I_SM90
    const fa_i_sm90_kernel *fa3; /* FA3 only: the tile variant, its maps and grid */
    fa_i_tma_maps maps;
    int ctas;
#endif
} fa_i_forward_plan;

static fa_status fa_i_plan_forward(const fa_params *params, fa_i_forward_plan *plan)
{
    fa_i_device dev;
    fa_status s = fa_i_cuda_check(params, FA_PASS_FORWARD, &plan->p, &plan->k, &dev);
    if (s != FA_OK) return s;
#if FA_VARIANT == 1
    plan->algorithm = 1;
#elif FA_I_SM90
    plan->fa3 = fa_i_sm90_pick(&plan->p, plan->k);
    plan->algorithm = fa_i_sm90_ready(&plan->p, plan->fa3, &dev, &plan->maps, &plan->ctas) ? 3 : 2;
#else
    plan->algorithm = 2;
#endif
    return FA_OK;
}

FA_API size_t fa_cuda_forward_workspace_size(const fa_params *params)
{
    fa_params p;
    if (fa_params_resolve(params, FA_PASS_FORWARD, &p) != FA_OK) return 0;
#if FA_VARIANT == 1
    return sizeof(float) * (size_t)p.batch * p.heads_q * p.seqlen_q * (p.head_dim + 2);
#else
    return 0;
#endif
}

FA_API fa_status fa_cuda_forward(const fa_params *params, void *workspace, size_t workspace_size,
                                 cudaStream_t stream)
{
    fa_i_forward_plan plan;
    const fa_params *p = &plan.p;
    fa_status s = fa_i_plan_forward(params, &plan);
    if (s != FA_OK) return s;
#if FA_VARIANT == 1
    {
        const size_t need = fa_cuda_forward_workspace_size(p);
        const size_t smem = sizeof(float) * FA_I_FA1_KEYS * (2 * p->head_dim + FA_I_FA1_THREADS);
        if (!workspace || workspace_size < need || (uintptr_t)workspace % 16)
            return fa_i_fail(FA_ERR_WORKSPACE, "FA1 needs %zu bytes, 16-byte aligned", need);
        return fa_i_launch((const void *)fa_i_fwd_fa1, dim3(p->batch * p->heads_q),
                           FA_I_FA1_THREADS, smem, stream, p, &workspace);
    }
#else
    (void)workspace_size;
#if FA_I_SM90
    if (plan.algorithm == 3)
        return fa_i_launch(plan.fa3->fwd, dim3(plan.ctas), 128 * (plan.fa3->rows / 64 + 1),
                           plan.fa3->smem, stream, p, &plan.maps);
#endif
    return fa_i_launch(plan.k->fwd,
                       dim3(fa_i_blocks(p->seqlen_q, plan.k->fwd_rows), p->heads_q, p->batch),
                       plan.k->fwd_threads, plan.k->fwd_smem, stream, p, &workspace);
#endif
}

FA_API int fa_cuda_forward_algorithm(const fa_params *params)
{
    fa_i_forward_plan plan;
    return fa_i_plan_forward(params, &plan) == FA_OK ? plan.algorithm : 0;
}

/* Floats of the atomic mode's dQ accumulator (fa_i_dq_blocks per head). */
static size_t fa_i_dq_acc_floats(const fa_params *p)
{
    return (size_t)p->batch * p->heads_q * fa_i_dq_blocks(p) * 64 * p->head_dim;
}

FA_API size_t fa_cuda_backward_workspace_size(const fa_params *params, int deterministic)
{
    fa_params p;
    if (fa_params_resolve(params, FA_PASS_BACKWARD, &p) != FA_OK) return 0;
    return sizeof(float) * (fa_i_round4((size_t)p.batch * p.heads_q * p.seqlen_q) +
                            (deterministic ? 0 : fa_i_dq_acc_floats(&p)));
}

/* A validated backward and the kernels that run it. */
typedef struct fa_i_backward_plan {
    fa_params p; /* resolved */
    const fa_i_kernels *k;
    const fa_i_bwd_kernel *kv; /* FA2's dK/dV kernel */
    int algorithm;             /* 2 FA2, 3 FA3 */
#if FA_I_SM90
    fa_i_sm90_bwd_args fa3; /* FA3 only */
#endif
} fa_i_backward_plan;

static fa_status fa_i_plan_backward(const fa_params *params, int deterministic,
                                    fa_i_backward_plan *plan)
{
    fa_i_device dev;
    fa_status s = fa_i_cuda_check(params, FA_PASS_BACKWARD, &plan->p, &plan->k, &dev);
    if (s != FA_OK) return s;
    plan->algorithm = 2;
    plan->kv = fa_i_bwd_kv_kernel(plan->k, deterministic, &dev); /* found by the check */
#if FA_I_SM90
    if (!deterministic && fa_i_sm90_bwd_ready(&plan->p, &plan->k->sm90_bwd, &dev, &plan->fa3))
        plan->algorithm = 3;
#else
    (void)deterministic;
#endif
    return FA_OK;
}

FA_API int fa_cuda_backward_algorithm(const fa_params *params, int deterministic)
{
    fa_i_backward_plan plan;
    return fa_i_plan_backward(params, deterministic, &plan) == FA_OK ? plan.algorithm : 0;
}

FA_API fa_status fa_cuda_backward(const fa_params *params, int deterministic, void *workspace,
                                  size_t workspace_size, cudaStream_t stream)
{
    fa_i_backward_plan plan;
    const fa_params *p = &plan.p;
    const fa_i_kernels *k;
    fa_i_bwd_args a;
    int64_t rows;
    size_t need;
    fa_status s = fa_i_plan_backward(params, deterministic, &plan);
    if (s != FA_OK) return s;
    k = plan.k;
    rows = (int64_t)p->batch * p->heads_q * p->seqlen_q;
    need = fa_cuda_backward_workspace_size(p, deterministic);
    if (!workspace || workspace_size < need || (uintptr_t)workspace % 16)
        return fa_i_fail(FA_ERR_WORKSPACE, "backward needs %zu bytes, 16-byte aligned", need);
    a.dsum = (float *)workspace; /* [rows], then the dQ accumulator 16-byte aligned */
    a.dq_acc = deterministic ? NULL : a.dsum + fa_i_round4((size_t)rows);
    /* fa_i_pre_lanes(d) threads per (padded) dQ accumulator row */
    s = fa_i_launch((const void *)fa_i_bwd_preprocess,
                    dim3(fa_i_blocks((int64_t)(fa_i_dq_acc_floats(p) / p->head_dim) *
                                         fa_i_pre_lanes(p->head_dim),
                                     256)),
                    256, 0, stream, p, &a);
#if FA_I_SM90
    if (plan.algorithm == 3) {
        plan.fa3.a = a;
        if (s == FA_OK)
            s = fa_i_launch(k->sm90_bwd.fn,
                            dim3(fa_i_blocks(p->seqlen_k, k->sm90_bwd.keys), p->heads_kv, p->batch),
                            k->sm90_bwd.threads, k->sm90_bwd.smem, stream, p, &plan.fa3);
    } else
#endif
    {
        const fa_i_bwd_kernel *kv = plan.kv;
        if (s == FA_OK)
            s = fa_i_launch(kv->fn, dim3(fa_i_blocks(p->seqlen_k, kv->keys), p->heads_kv, p->batch),
                            kv->threads, kv->smem, stream, p, &a);
        if (s == FA_OK && deterministic)
            s = fa_i_launch(k->bwd_q,
                            dim3(fa_i_blocks(p->seqlen_q, k->bwd_q_rows), p->heads_q, p->batch),
                            k->bwd_q_threads, k->bwd_q_smem, stream, p, &a);
    }
    if (s == FA_OK && !deterministic) /* 64 rows x d / 16 threads per block */
        s = fa_i_launch((const void *)fa_i_bwd_postprocess,
                        dim3(fa_i_blocks((int64_t)fa_i_dq_acc_floats(p) / 16, 256)), 256, 0, stream,
                        p, &a);
    return s;
}

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_CUDA_IMPLEMENTATION_DONE */
#endif /* FLASHATTN_CUDA_IMPLEMENTATION */

/* ======================================================================== */
#elif FA_I_PASS == 1
/* One head dim: a kernel set per dtype, then their table fa_i_kernels_<D>. */
#define FA_I_NO_BWD_KERNELS {{0, 0, 0, 0}, {0, 0, 0, 0}}
#define FA_I_NO_KERNELS                                                                        \
    {0, 0, 0, 0, {FA_I_NO_BWD_KERNELS, FA_I_NO_BWD_KERNELS, FA_I_NO_BWD_KERNELS}, 0, 0, 0, 0, \
     {{0, 0, 0, 0}, {0, 0, 0, 0}}, {0, 0, 0, 0}}
#if !FA_I_BUILD_D(FA_I_D)
static const fa_i_kernels FA_I_CAT(fa_i_kernels_, FA_I_D)[2] = {FA_I_NO_KERNELS, FA_I_NO_KERNELS};
#else
#define FA_I_NAME(kind, dt) \
    FA_I_CAT(FA_I_CAT(FA_I_CAT(fa_i_, kind), FA_I_CAT(_, dt)), FA_I_CAT(_d, FA_I_D))
#ifdef FA_BLOCK_M
#define FA_I_FWD_CFG (FA_BLOCK_M, FA_BLOCK_N, FA_NUM_WARPS)
#else
#define FA_I_FWD_CFG (FA_I_CAT(FA_I_FWD_, FA_I_D))
#endif
#ifdef FA_KV_STAGES
#define FA_I_FWD_STAGES FA_KV_STAGES
#else
#define FA_I_FWD_STAGES FA_I_CAT(FA_I_FWD_STAGES_, FA_I_D)
#endif
#define FA_I_BWD_CFG (FA_I_CAT(FA_I_BWD_, FA_I_D))
#define FA_I_BWD227_CFG (FA_I_CAT(FA_I_BWD227_, FA_I_D))
#define FA_I_BWD99_CFG (FA_I_CAT(FA_I_BWD99_, FA_I_D))
#define FA_I_BWDQ_CFG (FA_I_CAT(FA_I_BWDQ_, FA_I_D))
#define FA_I_CFG(which, field) FA_I_APPLY(field, which)
/* Shared memory of each kernel in bytes (16-bit rows of FA_I_PITCH; the
   dK/dV kernels' K and V rows padded by 8 elements). */
#define FA_I_FWD_SMEM                                   \
    (2 * FA_I_PITCH(FA_I_D) *                           \
     (FA_I_CFG(FA_I_FWD_CFG, FA_I_FIRST) +              \
      2 * FA_I_FWD_STAGES * FA_I_CFG(FA_I_FWD_CFG, FA_I_SECOND)))
/* K, V; Q and dO (1 or 2 stages each); P and dS (rows x keys); per row of 2
   stages the LSE, D and key range. */
#define FA_I_BWD_SMEM_OF(cfg)                                                                   \
    (2 * FA_I_BWD_KV_PITCH(FA_I_D) * 2 * FA_I_CFG(cfg, FA_I_B_KEYS) +                           \
     2 * FA_I_BWD_Q_PITCH(FA_I_D) *                                                              \
         (FA_I_CFG(cfg, FA_I_B_Q_STAGES) + FA_I_CFG(cfg, FA_I_B_DO_STAGES)) *                    \
         FA_I_CFG(cfg, FA_I_B_ROWS) +                                                            \
     2 * 2 * FA_I_CFG(cfg, FA_I_B_ROWS) * (FA_I_CFG(cfg, FA_I_B_KEYS) + 8) +                     \
     4 * 4 * 2 * FA_I_CFG(cfg, FA_I_B_ROWS))
#define FA_I_BWDQ_SMEM \
    (2 * FA_I_PITCH(FA_I_D) *      \
     (2 * FA_I_CFG(FA_I_BWDQ_CFG, FA_I_FIRST) + 4 * FA_I_CFG(FA_I_BWDQ_CFG, FA_I_SECOND)))
#if FA_I_SM90 && (FA_I_D == 64 || FA_I_D == 128 || FA_I_D == 256)
#define FA_I_HAS_SM90 1
/* Tile variant 0 serves every problem; variant 1, where a head dim has one
   (and its tile table is the default), the problems fa_i_sm90_pick gives it:
   d = 64 short causal ones on 128 rows without ping-pong (a tile boundary
   every ~4 key tiles; measured faster, bench/NOTES.md f8), d = 128 long
   unmasked ones on 176 keys. */
#define FA_I_SM90_CFG_0 (FA_I_CAT(FA_I_SM90_, FA_I_D))
#if FA_I_D == 64 && FA_SM90_ROWS_64 == 192
#define FA_I_SM90_CFG_1 (128, FA_SM90_KEYS_64, FA_SM90_STAGES_64)
#define FA_I_SM90_PINGPONG_1 0
#elif FA_I_D == 128 && FA_SM90_ROWS_128 == 128 && FA_SM90_KEYS_128 == 128 && FA_SM90_STAGES_128 == 2
#define FA_I_SM90_CFG_1 (128, 176, 2)
#define FA_I_SM90_PINGPONG_1 0
#endif
/* Variant 0 ping-pongs but on d = 128's 128 x 128 tile, measured 0 to +4.5%
   faster without once the warpgroup index was warp-uniform (bench/NOTES.md
   f19); the 176-key tile without it +0.8% in three runs (f25). */
#define FA_I_SM90_PINGPONG_0 (!(FA_I_D == 128 && FA_SM90_ROWS_128 == 128 && FA_SM90_KEYS_128 == 128))
/* Shared memory: the K/V ring with the 1 KB alignment slack, then Q and O
   tiles of 2 d rows bytes each: two Q buffers and O's own where the table
   asks for two and all three fit (the next tile's Q and K/V load while this
   one computes), else one Q and O's own buffer (the next Q loads during the
   epilogue), else none for O: it is staged in the last key tile's ring
   stage (O_IN_RING in the kernel; over Q in a tile that sees no keys). */
#define FA_I_SM90_SMEM_KV(cfg) (4 * FA_I_D * FA_I_CFG(cfg, FA_I_SECOND) * FA_I_CFG(cfg, FA_I_THIRD) + 1024)
#define FA_I_SM90_Q_BYTES(cfg) (2 * FA_I_D * FA_I_CFG(cfg, FA_I_FIRST))
#define FA_I_SM90_Q_BUFS_OF(cfg)                                                                \
    (FA_I_CAT(FA_I_SM90_QBUFS_, FA_I_D) == 2 &&                                                  \
             FA_I_SM90_SMEM_KV(cfg) + 3 * FA_I_SM90_Q_BYTES(cfg) <= FA_I_SM90_SMEM_MAX         \
         ? 2                                                                                    \
         : 1)
#define FA_I_SM90_O_APART_OF(cfg) \
    (FA_I_SM90_SMEM_KV(cfg) + (FA_I_SM90_Q_BUFS_OF(cfg) + 1) * FA_I_SM90_Q_BYTES(cfg) <= FA_I_SM90_SMEM_MAX)
#define FA_I_SM90_SMEM(cfg)                                                                     \
    (FA_I_SM90_SMEM_KV(cfg) +                                                                   \
     (FA_I_SM90_Q_BUFS_OF(cfg) + FA_I_SM90_O_APART_OF(cfg)) * FA_I_SM90_Q_BYTES(cfg))
#define FA_I_SM90_CHECK(cfg)                                                                   \
    static_assert(FA_I_CFG(cfg, FA_I_FIRST) == 128 || FA_I_CFG(cfg, FA_I_FIRST) == 192,        \
                  "flashattn: FA3 CTAs have 2 or 3 consumer warpgroups of 64 rows");          \
    static_assert(FA_I_CFG(cfg, FA_I_SECOND) % 16 == 0 && FA_I_CFG(cfg, FA_I_SECOND) >= 64 &&  \
                      FA_I_CFG(cfg, FA_I_SECOND) <= 192,                                      \
                  "flashattn: FA3 key tile must be a multiple of 16 in 64..192");             \
    static_assert(FA_I_SM90_SMEM(cfg) <= FA_I_SM90_SMEM_MAX,                                  \
                  "flashattn: FA3 tiles exceed shared memory");                               \
    /* O (d/2), S (keys/2) and P (keys/4) per consumer thread, plus ~24 for the rest */     \
    static_assert(FA_I_D / 2 + 3 * FA_I_CFG(cfg, FA_I_SECOND) / 4 + 24 <=                     \
                      FA_I_SM90_CONSUMER_REGS(FA_I_CFG(cfg, FA_I_FIRST) / 64),                \
                  "flashattn: FA3 accumulators exceed the consumer registers (fewer rows or keys)")
FA_I_SM90_CHECK(FA_I_SM90_CFG_0);
#define FA_I_SM90_ENTRY(dt, v, cfg)                                                            \
    {(const void *)FA_I_NAME(fwd_sm90, FA_I_CAT(dt, v)), FA_I_CFG(cfg, FA_I_FIRST),           \
     FA_I_CFG(cfg, FA_I_SECOND), FA_I_SM90_SMEM(cfg)}
#ifdef FA_I_SM90_CFG_1
FA_I_SM90_CHECK(FA_I_SM90_CFG_1);
#define FA_I_SM90_ENTRIES(dt) \
    {FA_I_SM90_ENTRY(dt, _0, FA_I_SM90_CFG_0), FA_I_SM90_ENTRY(dt, _1, FA_I_SM90_CFG_1)}
#else
#define FA_I_SM90_ENTRIES(dt) {FA_I_SM90_ENTRY(dt, _0, FA_I_SM90_CFG_0), {0, 0, 0, 0}}
#endif
#else
#define FA_I_HAS_SM90 0
#define FA_I_SM90_ENTRIES(dt) {{0, 0, 0, 0}, {0, 0, 0, 0}}
#endif
#if FA_I_SM90 && (FA_I_D == 64 || FA_I_D == 128 || FA_I_D == 256)
#define FA_I_HAS_SM90_BWD 1
/* K, V, the Q and dO buffers, two dS^T buffers (keys x 64 rows), each
   warpgroup's fp32 dQ parts (64 x 64), after the 1 KB alignment slack. */
#define FA_I_SM90_BWD_SMEM                                                                    \
    (1024 + 4 * FA_I_SM90_BWD_KEYS(FA_I_D) * FA_I_D + 4 * 64 * FA_I_D * FA_I_SM90_BWD_STAGES(FA_I_D) + \
     4 * FA_I_SM90_BWD_KEYS(FA_I_D) * 64 + 2 * FA_I_SM90_BWD_DQ_PARTS(FA_I_D) * 4 * 64 * 64)
static_assert(FA_I_SM90_BWD_SMEM <= FA_I_SM90_SMEM_MAX, "flashattn: FA3 backward tiles exceed shared memory");
#define FA_I_SM90_BWD_ENTRY(dt) \
    {(const void *)FA_I_NAME(bwd_sm90, dt), FA_I_SM90_BWD_KEYS(FA_I_D), 256, FA_I_SM90_BWD_SMEM}
#else
#define FA_I_HAS_SM90_BWD 0
#define FA_I_SM90_BWD_ENTRY(dt) {0, 0, 0, 0}
#endif
static_assert(FA_I_FWD_SMEM <= FA_I_SMEM_MAX, "flashattn: forward tile exceeds shared memory");
static_assert(FA_I_BWD_SMEM_OF(FA_I_BWD_CFG) <= FA_I_SMEM_MAX,
              "flashattn: backward tile exceeds shared memory");
static_assert(FA_I_BWD_SMEM_OF(FA_I_BWD227_CFG) <= 227 * 1024,
              "flashattn: the 227 KB backward tile exceeds 227 KB");
static_assert(FA_I_BWD_SMEM_OF(FA_I_BWD99_CFG) <= 99 * 1024,
              "flashattn: the 99 KB backward tile exceeds 99 KB");
static_assert(FA_I_BWDQ_SMEM <= FA_I_SMEM_MAX, "flashattn: dQ tile exceeds shared memory");

#undef FA_I_PASS
#define FA_I_PASS 2
#if FA_CUDA_DTYPE != 2
#define FA_I_DT f16
#include "flashattn_cuda.cuh"
#undef FA_I_DT
#endif
#if FA_CUDA_DTYPE != 1
#define FA_I_DT bf16
#include "flashattn_cuda.cuh"
#undef FA_I_DT
#endif
#undef FA_I_PASS
#define FA_I_PASS 1

/* The backward's dK/dV kernels (with dQ, without) share their tile. */
#define FA_I_BWD_ENTRY(kernel, dt, cfg) \
    {(const void *)FA_I_NAME(kernel, dt), FA_I_CFG(cfg, FA_I_B_KEYS), 256, FA_I_BWD_SMEM_OF(cfg)}
#define FA_I_BWD_ENTRIES(dt, suffix, cfg)                          \
    {FA_I_BWD_ENTRY(FA_I_CAT(bwd_kvq, suffix), dt, cfg),          \
     FA_I_BWD_ENTRY(FA_I_CAT(bwd_kv, suffix), dt, cfg)}
#if FA_I_CFG(FA_I_BWD227_CFG, FA_I_B_KEYS)
#define FA_I_BWD227_ENTRIES(dt) FA_I_BWD_ENTRIES(dt, 227, FA_I_BWD227_CFG)
#else
#define FA_I_BWD227_ENTRIES(dt) FA_I_NO_BWD_KERNELS
#endif
#if FA_I_CFG(FA_I_BWD99_CFG, FA_I_B_KEYS)
#define FA_I_BWD99_ENTRIES(dt) FA_I_BWD_ENTRIES(dt, 99, FA_I_BWD99_CFG)
#else
#define FA_I_BWD99_ENTRIES(dt) FA_I_NO_BWD_KERNELS
#endif
#define FA_I_ENTRY(dt)                                                                        \
    {(const void *)FA_I_NAME(fwd, dt), FA_I_CFG(FA_I_FWD_CFG, FA_I_FIRST),                   \
     32 * FA_I_CFG(FA_I_FWD_CFG, FA_I_THIRD), FA_I_FWD_SMEM,                                  \
     {FA_I_BWD227_ENTRIES(dt), FA_I_BWD_ENTRIES(dt, , FA_I_BWD_CFG), FA_I_BWD99_ENTRIES(dt)},   \
     (const void *)FA_I_NAME(bwd_q, dt), FA_I_CFG(FA_I_BWDQ_CFG, FA_I_FIRST),                 \
     32 * FA_I_CFG(FA_I_BWDQ_CFG, FA_I_THIRD), FA_I_BWDQ_SMEM, FA_I_SM90_ENTRIES(dt),          \
     FA_I_SM90_BWD_ENTRY(dt)}
static const fa_i_kernels FA_I_CAT(fa_i_kernels_, FA_I_D)[2] = {
#if FA_CUDA_DTYPE != 2
    FA_I_ENTRY(f16),
#else
    FA_I_NO_KERNELS,
#endif
#if FA_CUDA_DTYPE != 1
    FA_I_ENTRY(bf16),
#else
    FA_I_NO_KERNELS,
#endif
};
#undef FA_I_ENTRY
#undef FA_I_BWD_ENTRY
#undef FA_I_BWD_ENTRIES
#undef FA_I_BWD227_ENTRIES
#undef FA_I_BWD99_ENTRIES
#undef FA_I_SM90_ENTRIES
#undef FA_I_HAS_SM90
#undef FA_I_SM90_BWD_ENTRY
#undef FA_I_HAS_SM90_BWD
#ifdef FA_I_SM90_BWD_SMEM
#undef FA_I_SM90_BWD_SMEM
#endif
#ifdef FA_I_SM90_CFG_0
#undef FA_I_SM90_CFG_0
#undef FA_I_SM90_ENTRY
#undef FA_I_SM90_CHECK
#undef FA_I_SM90_SMEM
#undef FA_I_SM90_SMEM_KV
#undef FA_I_SM90_Q_BYTES
#undef FA_I_SM90_Q_BUFS_OF
#undef FA_I_SM90_O_APART_OF
#undef FA_I_SM90_PINGPONG_0
#endif
#ifdef FA_I_SM90_CFG_1
#undef FA_I_SM90_CFG_1
#undef FA_I_SM90_PINGPONG_1
#endif
#undef FA_I_FWD_SMEM
#undef FA_I_BWD_SMEM_OF
#undef FA_I_BWDQ_SMEM
#undef FA_I_FWD_CFG
#undef FA_I_FWD_STAGES
#undef FA_I_BWD_CFG
#undef FA_I_BWD227_CFG
#undef FA_I_BWD99_CFG
#undef FA_I_BWDQ_CFG
#undef FA_I_CFG
#undef FA_I_NAME
#endif /* FA_I_BUILD_D(FA_I_D) */
#undef FA_I_NO_KERNELS
#undef FA_I_NO_BWD_KERNELS

/* ======================================================================== */
#elif FA_I_PASS == 2
/* Kernels for one (head dim FA_I_D, dtype FA_I_DT). Register tiles follow the
   mma.sync m16n8k16 fragments: lane = 4 * g + t; an accumulator tile holds
   rows g and g + 8, columns 2t and 2t + 1 of each 8-wide column block. */
#define FA_I_MMA FA_I_CAT(fa_i_mma_, FA_I_DT)
#define FA_I_PACK FA_I_CAT(fa_i_pack_, FA_I_DT)

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
   each A fragment 2 nt. */
static __device__ __forceinline__ void FA_I_NAME(warp_gemm, FA_I_DT)(float (*c)[4], int mt, int nt,
                                                                    int kdim, const uint16_t *a,
                                                                    int lda, int a_km,
                                                                    const uint16_t *b, int ldb,
                                                                    int b_col, int b_kn)
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
                FA_I_MMA(c[m * 2 * nt + 2 * n], fa[m], fb[0], fb[1]);
                FA_I_MMA(c[m * 2 * nt + 2 * n + 1], fa[m], fb[2], fb[3]);
            }
        }
    }
}

/* ---- forward (FA2) ----------------------------------------------------------
   Each warp owns MT m16 row tiles (16 * MT query rows): every K and V
   fragment read from shared memory feeds MT MMAs, which halves the smem
   traffic per MMA at MT = 2 (the limit of the first version, at MT = 1). */
static __global__ void __launch_bounds__(32 * FA_I_CFG(FA_I_FWD_CFG, FA_I_THIRD))
    FA_I_NAME(fwd, FA_I_DT)(const fa_params p, void *unused)
{
    enum {
        D = FA_I_D, BM = FA_I_CFG(FA_I_FWD_CFG, FA_I_FIRST), BN = FA_I_CFG(FA_I_FWD_CFG, FA_I_SECOND),
        NW = FA_I_CFG(FA_I_FWD_CFG, FA_I_THIRD), NT = 32 * NW, MT = BM / (16 * NW), LD = FA_I_PITCH(D),
        STAGES = FA_I_FWD_STAGES
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
        fa_i_async_tile(sq, gq, p.q_layout.seq, m0, p.seqlen_q, BM, D, LD, tid, NT);
    if (n_first < n_end && STAGES == 2)
        fa_i_async_kv(sk, sv, gk, gv, &p, n_first * BN, BN, D, LD, tid, NT);
    if (n_first < n_end && STAGES == 1)
        fa_i_async_tile(sk, gk, p.k_layout.seq, n_first * BN, p.seqlen_k, BN, D, LD, tid, NT);
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
            fa_i_async_kv(sk + (stage ^ 1) * BN * LD, sv + (stage ^ 1) * BN * LD, gk, gv, &p,
                          c0 + BN, BN, D, LD, tid, NT);
        if (STAGES == 1)
            fa_i_async_tile(sv, gv, p.v_layout.seq, c0, p.seqlen_k, BN, D, LD, tid, NT);
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
        /* Speculative exps (FA_FWD_SPEC, as the FA3 forward's f37): against the
           running max, without this block's row max; kept where every
           thread's part sum of a row is at most FA_I_SM90_SPEC_SUM_MAX, else
           the warp redoes them with the row max below. */
        {
            int rose = 0;
#pragma unroll
            for (t = 0; t < 2 * MT && FA_I_FWD_SPEC; ++t) {
                float sum = 0.0f;
                FA_I_FWD_ROW_EXPS(t, m_run[t], sum);
                alpha[t] = sum; /* this block's part sum, until the vote */
                rose |= !(sum <= FA_I_SM90_SPEC_SUM_MAX);
            }
            if (!FA_I_FWD_SPEC || __any_sync(0xffffffffu, rose)) {
#pragma unroll
                for (t = 0; t < 2 * MT; ++t) { /* online softmax, row by row */
                    float (*row)[4] = s[t >> 1];
                    const int e = 2 * (t & 1);
                    float mx = -INFINITY, ref, sum = 0.0f;
#pragma unroll
                    for (i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(row[i][e], row[i][e + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    mx = fmaxf(m_run[t], mx * log2_scale); /* running max in base-2 units */
                    ref = mx == -INFINITY ? 0.0f : mx;     /* a row with nothing visible yet stays 0 */
                    alpha[t] = fa_i_dev_exp2(m_run[t] - ref);
                    m_run[t] = mx;
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
                fa_i_async_tile(sk, gk, p.k_layout.seq, c0 + BN, p.seqlen_k, BN, D, LD, tid, NT);
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
         leaves as whole rows in 16-byte pieces */
        uint16_t *go = (uint16_t *)p.o + fa_i_dev_offset(&p.o_layout, b, h, 0);
        float *lse = p.lse ? p.lse + ((int64_t)b * p.heads_q + h) * p.seqlen_q : NULL;
#pragma unroll
        for (t = 0; t < 2 * MT; ++t) {
            const int r = wrow + 8 * t + (lane >> 2), e = 2 * (t & 1);
            float l = l_run[t], inv;
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
            for (i = 0; i < D / 8; ++i)
                *(uint32_t *)(sq + FA_I_SMEM_AT(r, i * 8 + 2 * (lane & 3), LD)) =
                    FA_I_PACK(o[t >> 1][i][e] * inv, o[t >> 1][i][e + 1] * inv);
            if ((lane & 3) == 0 && lse && m0 + r < p.seqlen_q)
                lse[m0 + r] = l > 0.0f ? (m_run[t] + log2f(l)) * FA_I_LN2_F : -INFINITY;
        }
        __syncwarp();
#pragma unroll
        for (i = 0; i < 16 * MT * (D / 8) / 32; ++i) { /* a warp's pass: 512 bytes */
            const int r = wrow + (32 * i + lane) / (D / 8), c = 8 * ((32 * i + lane) % (D / 8));
            if (m0 + r < p.seqlen_q)
                *(uint4 *)(go + (int64_t)(m0 + r) * p.o_layout.seq + c) =
                    *(const uint4 *)(sq + FA_I_SMEM_AT(r, c, LD));
        }
    }
}

#if FA_I_HAS_SM90 /* the FA3 forward per tile variant: pass 3 */
#undef FA_I_PASS
#define FA_I_PASS 3
#define FA_I_SV _0
#define FA_I_SV_PINGPONG FA_I_SM90_PINGPONG_0
#define FA_I_SM90_CFG FA_I_SM90_CFG_0
#include "flashattn_cuda.cuh"
#undef FA_I_SV
#undef FA_I_SV_PINGPONG
#undef FA_I_SM90_CFG
#ifdef FA_I_SM90_CFG_1
#define FA_I_SV _1
#define FA_I_SV_PINGPONG FA_I_SM90_PINGPONG_1
#define FA_I_SM90_CFG FA_I_SM90_CFG_1
#include "flashattn_cuda.cuh"
#undef FA_I_SV
#undef FA_I_SV_PINGPONG
#undef FA_I_SM90_CFG
#endif
#undef FA_I_PASS
#define FA_I_PASS 2
#endif

/* ---- backward: dK, dV (and dQ by atomics) per key block ------------------------ */

/* Per query row r0 + r (r < bm): the base-2 LSE, D and the key range. */
static __device__ __forceinline__ void FA_I_NAME(bwd_row_facts, FA_I_DT)(
    const fa_params *p, const fa_i_bwd_args *a, int b, int h, int r0, float *slse, float *sdsum,
    int *slo, int *shi, int bm, int tid, int nthreads)
{
    const int64_t row_base = ((int64_t)b * p->heads_q + h) * p->seqlen_q;
    int r;
    for (r = tid; r < bm; r += nthreads) {
        int lo = 0, hi = 0;
        float lse = -INFINITY, dsum = 0.0f;
        if (r0 + r < p->seqlen_q) {
            fa_i_key_range(p, r0 + r, &lo, &hi);
            lse = p->lse[row_base + r0 + r];
            dsum = a->dsum[row_base + r0 + r];
        }
        /* LSE = -inf marks an empty row; +inf makes its P = 2^(s - inf) = 0. */
        slse[r] = lse == -INFINITY ? INFINITY : lse * FA_I_LOG2E_F;
        sdsum[r] = dsum;
        slo[r] = lo;
        shi[r] = hi;
    }
}

/* Loads one step of the backward's query side: Q, dO (async) and, per row,
   the base-2 LSE, D and the key range. */
static __device__ __forceinline__ void FA_I_NAME(bwd_rows, FA_I_DT)(
    const fa_params *p, const fa_i_bwd_args *a, int b, int h, int r0, uint16_t *sq, uint16_t *sdo,
    float *slse, float *sdsum, int *slo, int *shi, int bm, int d, int ld, int tid, int nthreads)
{
    fa_i_async_tile(sq, (const uint16_t *)p->q + fa_i_dev_offset(&p->q_layout, b, h, 0),
                    p->q_layout.seq, r0, p->seqlen_q, bm, d, ld, tid, nthreads);
    fa_i_async_tile(sdo, (const uint16_t *)p->dout + fa_i_dev_offset(&p->dout_layout, b, h, 0),
                    p->dout_layout.seq, r0, p->seqlen_q, bm, d, ld, tid, nthreads);
    FA_I_NAME(bwd_row_facts, FA_I_DT)(p, a, b, h, r0, slse, sdsum, slo, shi, bm, tid, nthreads);
}

/* A dK/dV kernel's first loads, one commit group: its K and V tiles (bn
   keys from c0 of kv head hk, pitch FA_I_BWD_KV_PITCH(d)) and, if it has
   steps, the first step's query side (bm rows from r0 of the group's first
   query head, pitch FA_I_BWD_Q_PITCH(d)). */
static __device__ __forceinline__ void FA_I_NAME(bwd_first_loads, FA_I_DT)(
    const fa_params *p, const fa_i_bwd_args *a, int b, int hk, int c0, int bn, int r0, int steps,
    uint16_t *sk, uint16_t *sv, uint16_t *sq, uint16_t *sdo, float *slse, float *sdsum, int *slo,
    int *shi, int bm, int tid, int nthreads)
{
    fa_i_async_kv(sk, sv, (const uint16_t *)p->k + fa_i_dev_offset(&p->k_layout, b, hk, 0),
                  (const uint16_t *)p->v + fa_i_dev_offset(&p->v_layout, b, hk, 0), p, c0, bn,
                  FA_I_D, FA_I_BWD_KV_PITCH(FA_I_D), tid, nthreads);
    if (steps > 0)
        FA_I_NAME(bwd_rows, FA_I_DT)(p, a, b, hk * (p->heads_q / p->heads_kv), r0, sq, sdo, slse,
                                     sdsum, slo, shi, bm, FA_I_D, FA_I_BWD_Q_PITCH(FA_I_D), tid, nthreads);
    fa_i_cp_async_commit();
}

/* The backward's dK/dV kernels (pass 7: pass 6 in both modes) on the
   table's tile, and again, names suffixed 227 or 99, on the 227 KB and the
   99 KB tiles where there are. */
#undef FA_I_PASS
#define FA_I_PASS 7
#define FA_I_BWD_KERNEL_CFG FA_I_BWD_CFG
#define FA_I_BWD_SUFFIX
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_KERNEL_CFG
#undef FA_I_BWD_SUFFIX
#if FA_I_CFG(FA_I_BWD227_CFG, FA_I_B_KEYS)
#define FA_I_BWD_KERNEL_CFG FA_I_BWD227_CFG
#define FA_I_BWD_SUFFIX 227
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_KERNEL_CFG
#undef FA_I_BWD_SUFFIX
#endif
#if FA_I_CFG(FA_I_BWD99_CFG, FA_I_B_KEYS)
#define FA_I_BWD_KERNEL_CFG FA_I_BWD99_CFG
#define FA_I_BWD_SUFFIX 99
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_KERNEL_CFG
#undef FA_I_BWD_SUFFIX
#endif
#if FA_I_HAS_SM90_BWD /* the FA3 backward: pass 5 */
#undef FA_I_PASS
#define FA_I_PASS 5
#include "flashattn_cuda.cuh"
#endif
#undef FA_I_PASS
#define FA_I_PASS 2

/* ---- backward, deterministic dQ: one CTA per query block, no atomics ---------- */
static __global__ void __launch_bounds__(32 * FA_I_CFG(FA_I_BWDQ_CFG, FA_I_THIRD))
    FA_I_NAME(bwd_q, FA_I_DT)(const fa_params p, const fa_i_bwd_args a)
{
    enum {
        D = FA_I_D, BM = FA_I_CFG(FA_I_BWDQ_CFG, FA_I_FIRST), BN = FA_I_CFG(FA_I_BWDQ_CFG, FA_I_SECOND),
        NT = 32 * FA_I_CFG(FA_I_BWDQ_CFG, FA_I_THIRD), LD = FA_I_PITCH(D)
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
                    p.q_layout.seq, m0, p.seqlen_q, BM, D, LD, tid, NT);
    fa_i_async_tile(sdo, (const uint16_t *)p.dout + fa_i_dev_offset(&p.dout_layout, b, h, 0),
                    p.dout_layout.seq, m0, p.seqlen_q, BM, D, LD, tid, NT);
    if (n_first < n_end) fa_i_async_kv(sk, sv, gk, gv, &p, n_first * BN, BN, D, LD, tid, NT);
    fa_i_cp_async_commit();
    for (n = n_first; n < n_end; ++n) {
        const int stage = (n - n_first) & 1, c0 = n * BN;
        const uint16_t *skt = sk + stage * BN * LD, *svt = sv + stage * BN * LD;
        float s[BN / 8][4], dp[BN / 8][4];
        fa_i_cp_async_wait_0(); /* one barrier per block, as in the forward */
        __syncthreads();
        if (n + 1 < n_end) {
            fa_i_async_kv(sk + (stage ^ 1) * BN * LD, sv + (stage ^ 1) * BN * LD, gk, gv, &p,
                          c0 + BN, BN, D, LD, tid, NT);
        }
        fa_i_cp_async_commit();
        /* S = Q K^T, dP = dO V^T */
        fa_i_zero_acc(s, BN / 8);
        fa_i_zero_acc(dp, BN / 8);
        FA_I_NAME(warp_gemm, FA_I_DT)(s, 1, BN / 16, D, sq + warp * 16 * LD, LD, 0, skt, LD, 0, 0);
        FA_I_NAME(warp_gemm, FA_I_DT)(dp, 1, BN / 16, D, sdo + warp * 16 * LD, LD, 0, svt, LD, 0, 0);
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
                *(uint32_t *)(gdq + row0 * p.dq_layout.seq + col) =
                    FA_I_PACK(dq[i][0] * p.scale, dq[i][1] * p.scale);
            if (row1 < p.seqlen_q)
                *(uint32_t *)(gdq + row1 * p.dq_layout.seq + col) =
                    FA_I_PACK(dq[i][2] * p.scale, dq[i][3] * p.scale);
        }
    }
}

#undef FA_I_LOAD_A
#undef FA_I_LOAD_B_NK
#undef FA_I_LOAD_B_KN
#undef FA_I_LOAD_A_KM
#undef FA_I_ACC_AS_A
#undef FA_I_MMA
#undef FA_I_PACK

/* ======================================================================== */
#elif FA_I_PASS == 3
/* The FA3 forward for one (head dim FA_I_D, dtype FA_I_DT, tile FA_I_SM90_CFG),
   its names suffixed with the tile variant FA_I_SV. Included from pass 2,
   whose FA_I_PACK it uses. */
#define FA_I_SNAME(kind) FA_I_NAME(kind, FA_I_CAT(FA_I_DT, FA_I_SV))
/* ---- forward (FA3, Hopper) ---------------------------------------------------
   Warpgroup 0 produces: it loads Q once and K/V tiles into a ring of STAGES
   shared-memory stages by TMA (k_full/v_full say a stage arrived; each
   consumer warp arrives on k_empty/v_empty when its wgmma no longer reads
   it). The others (2, or 3 at d = 64) consume, 64 query rows each. A
   thread holds rows r and r + 8 (r = 16 * warp + lane / 4) of the S and O
   accumulators, at columns 8 c + 2 (lane % 4) + {0, 1}: element i of a row-pair array is
   column 8 (i / 4) + 2 (lane % 4) + i % 2 of row r + 8 ((i / 2) % 2).
   Shared tiles are [d / 64][rows][64] with the 128-byte swizzle. */
enum {
    FA_I_SNAME(sm90_bm) = FA_I_CFG(FA_I_SM90_CFG, FA_I_FIRST),
    FA_I_SNAME(sm90_bn) = FA_I_CFG(FA_I_SM90_CFG, FA_I_SECOND),
    FA_I_SNAME(sm90_stages) = FA_I_CFG(FA_I_SM90_CFG, FA_I_THIRD),
    FA_I_SNAME(sm90_q_bufs) = FA_I_SM90_Q_BUFS_OF(FA_I_SM90_CFG),
    FA_I_SNAME(sm90_o_apart) = FA_I_SM90_O_APART_OF(FA_I_SM90_CFG)
};
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_I_SM90_BN FA_I_CFG(FA_I_SM90_CFG, FA_I_SECOND)
#define FA_I_WGMMA_QK FA_I_CAT(FA_I_CAT(fa_i_wgmma_ss_, FA_I_DT), FA_I_CAT(_n, FA_I_SM90_BN))
#define FA_I_WGMMA_PV FA_I_CAT(FA_I_CAT(fa_i_wgmma_rs_, FA_I_DT), FA_I_CAT(_n, FA_I_D))

/* Issues S = Q K^T for this warpgroup's 64 rows (one commit group). */
static __device__ __forceinline__ void FA_I_SNAME(sm90_qk)(float *s, uint32_t sq,
                                                                   uint32_t sk)
{
    enum { BM = FA_I_SNAME(sm90_bm), BN = FA_I_SM90_BN };
    fa_i_wgmma_fence();
    FA_I_SM90_GEMM_NT(FA_I_WGMMA_QK, s, sq, BM, sk, BN);
    fa_i_wgmma_commit();
}

/* Issues O += P V with P (16-bit pairs) in registers (one commit group). */
static __device__ __forceinline__ void FA_I_SNAME(sm90_pv)(float *o, const uint32_t *pr,
                                                                   uint32_t sv)
{
    enum { BN = FA_I_SM90_BN };
    fa_i_wgmma_fence();
    FA_I_SM90_GEMM_RS(FA_I_WGMMA_PV, o, pr, sv, BN, BN);
    fa_i_wgmma_commit();
}

/* The scores of one S tile (keys c0...) in place: softcap, then the mask
   (FA_I_MASK_HI: keys at or past each row's end; FA_I_MASK_LO: also keys
   before its start) as -inf. */
static __device__ __forceinline__ void FA_I_SNAME(sm90_scores)(
    const fa_params *p, float *s, int c0, int mask, const int *lo, const int *hi)
{
    enum { BN = FA_I_SM90_BN };
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
   P = 2^(score - max) in place, alpha each row's rescale factor for O. */
static __device__ __forceinline__ void FA_I_SNAME(sm90_exps)(float *s, float log2_scale,
                                                             float *m_run, float *l_run,
                                                             float *alpha)
{
    enum { BN = FA_I_SM90_BN };
    int i, half;
#pragma unroll
    for (half = 0; half < 2; ++half) {
        float mx = -INFINITY, ref, sum = 0.0f;
#pragma unroll
        for (i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * half], s[4 * i + 2 * half + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(m_run[half], mx * log2_scale);
        ref = mx == -INFINITY ? 0.0f : mx; /* a row with nothing visible yet stays 0 */
        alpha[half] = fa_i_dev_exp2(m_run[half] - ref);
        m_run[half] = mx;
#pragma unroll
        for (i = 0; i < BN / 8; ++i) {
            float *e = s + 4 * i + 2 * half;
            e[0] = fa_i_dev_exp2(fmaf(e[0], log2_scale, -ref));
            e[1] = fa_i_dev_exp2(fmaf(e[1], log2_scale, -ref));
            sum += e[0] + e[1];
        }
        l_run[half] = l_run[half] * alpha[half] + sum;
    }
}

/* Online softmax of one S tile: its scores, then the row max and the exps. */
static __device__ __forceinline__ void FA_I_SNAME(sm90_softmax)(
    const fa_params *p, float *s, int c0, int mask, const int *lo, const int *hi,
    float log2_scale, float *m_run, float *l_run, float *alpha)
{
    FA_I_SNAME(sm90_scores)(p, s, c0, mask, lo, hi);
    FA_I_SNAME(sm90_exps)(s, log2_scale, m_run, l_run, alpha);
}

/* The softmax with speculative exps (FA_SM90_SPEC): the exps run against the
   running max, without the tile's own max. A thread whose 32 exps of a row
   sum to at most FA_I_SM90_SPEC_SUM_MAX has no P above it, and if no thread
   of the warp has more, the reference stays and O keeps its scale: P goes
   to e (fp32), or with `packed` straight into pr, and this returns 0.
   Otherwise (a row's max rose, or it had none yet) the warp redoes the exps
   from S, kept for this, against the new max and returns 1: P is then in e
   (or, packed, in s) and alpha holds the rescale factors. */
static __device__ __forceinline__ int FA_I_SNAME(sm90_softmax_spec)(
    const fa_params *p, float *s, float *e, uint32_t *pr, int packed, int c0, int mask,
    const int *lo, const int *hi, float log2_scale, float *m_run, float *l_run, float *alpha)
{
    enum { BN = FA_I_SM90_BN };
    int i, half, rose = 0;
    float sum[2];
    FA_I_SNAME(sm90_scores)(p, s, c0, mask, lo, hi);
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
        rose |= !(sum[half] <= FA_I_SM90_SPEC_SUM_MAX);
    }
    /* P's writes stay above the vote, as measured (f37): without this the
       compiler sinks what the redo overwrites into the common path */
    if (packed)
        fa_i_fence_u32(pr, BN / 4);
    else
        fa_i_fence_f32(e, BN / 2);
    if (__any_sync(0xffffffffu, rose)) {
        FA_I_SNAME(sm90_exps)(s, log2_scale, m_run, l_run, alpha);
        if (!packed)
#pragma unroll
            for (i = 0; i < BN / 2; ++i) e[i] = s[i];
        return 1;
    }
    l_run[0] += sum[0];
    l_run[1] += sum[1];
    return 0;
}

/* O *= alpha per row; P to 16-bit pairs in the A-fragment order of the RS
   wgmma, which is the accumulator order: k16 slice k takes S[8k .. 8k + 7]. */
static __device__ __forceinline__ void FA_I_SNAME(sm90_rescale_pack)(float *o, const float *s,
                                                                             uint32_t *pr,
                                                                             const float *alpha,
                                                                             int rescale)
{
    enum { BN = FA_I_SM90_BN };
    int i;
    if (rescale)
#pragma unroll
        for (i = 0; i < FA_I_D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
#pragma unroll
    for (i = 0; i < BN / 4; ++i) pr[i] = FA_I_PACK(s[2 * i], s[2 * i + 1]);
}

#undef FA_I_WGMMA_QK
#undef FA_I_WGMMA_PV
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

static __global__ void __launch_bounds__(128 * (FA_I_CFG(FA_I_SM90_CFG, FA_I_FIRST) / 64 + 1), 1)
    FA_I_SNAME(fwd_sm90)(const fa_params p, const __grid_constant__ fa_i_tma_maps maps)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    enum {
        D = FA_I_D, BM = FA_I_SNAME(sm90_bm), BN = FA_I_SM90_BN,
        STAGES = FA_I_SNAME(sm90_stages), CHUNKS = D / 64, TILE = BN * D * 2,
        NC = BM / 64, /* consumer warpgroups */
        /* Q buffers (tile k uses k % Q_BUFS) and whether O has its own
           buffer: FA_I_SM90_SMEM. */
        Q_BUFS = FA_I_SNAME(sm90_q_bufs), O_APART = FA_I_SNAME(sm90_o_apart), Q_BYTES = BM * D * 2,
        PINGPONG = FA_SM90_PINGPONG && FA_I_SV_PINGPONG,
        L2_HINTS = FA_I_CAT(FA_I_SM90_L2_HINTS_, FA_I_D),
        PIN_SOFTMAX = FA_I_CAT(FA_I_SM90_PIN_SOFTMAX_, FA_I_D),
        SPEC = !FA_SM90_SPEC || BN > 128 ? 0 : NC == 2 ? FA_I_CAT(FA_I_SM90_SPEC_, FA_I_D) : 2,
        /* Without O's own buffer, a tile that saw keys stages each
           warpgroup's O in its last key tile's ring stage (warpgroup 0 in
           the K stage, 1 in the V stage) so that Q is free after the last
           S, not after the O store. */
        O_IN_RING = !O_APART
    };
    static_assert(!O_IN_RING || (NC == 2 && 64 * D * 2 <= TILE),
                  "flashattn: O staged in the ring needs 2 warpgroups and a stage that holds 64 rows");
    const uint64_t once = L2_HINTS ? FA_I_L2_EVICT_FIRST : FA_I_L2_EVICT_NORMAL;
    const uint64_t reused = L2_HINTS ? FA_I_L2_EVICT_LAST : FA_I_L2_EVICT_NORMAL;
    /* Barriers: q_full and q_empty per Q buffer, then k_full, v_full,
       k_empty, v_empty per stage, then (O_IN_RING) o_read per warpgroup
       and stage: the O staged there has been read by its TMA store. Only
       this sm_90a body has static shared memory: the host reads that to
       tell it from the stub other targets compile. */
    __shared__ __align__(8) uint64_t bars[2 * Q_BUFS + 4 * STAGES + 2 * STAGES * O_IN_RING];
    extern __shared__ uint4 fa_i_smem[];
    const uint32_t sq = (fa_i_smem_addr(fa_i_smem) + 1023) & ~1023u; /* swizzle atoms: 1 KB */
    const uint32_t sk = sq + Q_BUFS * Q_BYTES, sv = sk + STAGES * TILE;
    const uint32_t so = sv + STAGES * TILE; /* if O_APART */
    const uint32_t q_full = fa_i_smem_addr(bars), q_empty = q_full + 8 * Q_BUFS;
    const uint32_t k_full = q_empty + 8 * Q_BUFS;
    const uint32_t v_full = k_full + 8 * STAGES, k_empty = v_full + 8 * STAGES;
    const uint32_t v_empty = k_empty + 8 * STAGES, o_read = v_empty + 8 * STAGES;
    const int tid = threadIdx.x, blocks_m = (p.seqlen_q + BM - 1) / BM;
    int i;
    if (tid == 0) {
        for (i = 0; i < Q_BUFS; ++i) {
            fa_i_mbar_init(q_full + 8 * i, 1);
            fa_i_mbar_init(q_empty + 8 * i, 4 * NC); /* every consumer warp */
        }
        for (i = 0; i < STAGES; ++i) {
            fa_i_mbar_init(k_full + 8 * i, 1);
            fa_i_mbar_init(v_full + 8 * i, 1);
            fa_i_mbar_init(k_empty + 8 * i, 4 * NC);
            fa_i_mbar_init(v_empty + 8 * i, 4 * NC);
        }
        for (i = 0; i < 2 * STAGES * O_IN_RING; ++i) fa_i_mbar_init(o_read + 8 * i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (tid < 128) { /* producer warpgroup: one thread issues every copy */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FA_I_SM90_PRODUCER_REGS(NC)));
        if (tid == 0) {
            int64_t k;
            int it = 0, mb, h, b, have;
            /* per stage: it holds a staged O (O_IN_RING), and the parity of
               its o_read barriers' next phase */
            uint32_t staged = 0, o_parity = 0;
            fa_i_tma_prefetch(&maps.k);
            fa_i_tma_prefetch(&maps.v);
            fa_i_tma_prefetch(&maps.o);
            have = fa_i_sm90_tile(&p, 0, blocks_m, &mb, &h, &b);
            for (k = 0; have; ++k) {
                const int hk = h / (p.heads_q / p.heads_kv), qb = (int)(k % Q_BUFS);
                int first_lo, last_hi, n, c;
                fa_i_rows_key_span(&p, mb * BM, min(mb * BM + BM, p.seqlen_q), &first_lo,
                                   &last_hi);
                /* a fresh barrier passes the wait for parity 1 */
                fa_i_mbar_wait(q_empty + 8 * qb, (uint32_t)((k / Q_BUFS) & 1) ^ 1);
                fa_i_mbar_expect_tx(q_full + 8 * qb, Q_BYTES);
                for (c = 0; c < CHUNKS; ++c)
                    fa_i_tma_load(sq + qb * Q_BYTES + c * BM * 128, &maps.q, 64 * c, mb * BM, h, b,
                                  q_full + 8 * qb, once);
                /* key tiles no row of this tile sees are never loaded */
                for (n = first_lo / BN; n < (last_hi + BN - 1) / BN; ++n, ++it) {
                    const int st = it % STAGES, o_there = (staged >> st) & 1;
                    const uint32_t free_parity = ((it / STAGES) & 1) ^ 1;
                    fa_i_mbar_wait(k_empty + 8 * st, free_parity);
                    if (o_there) fa_i_mbar_wait(o_read + 8 * st, (o_parity >> st) & 1);
                    fa_i_mbar_expect_tx(k_full + 8 * st, TILE);
                    for (c = 0; c < CHUNKS; ++c)
                        fa_i_tma_load(sk + st * TILE + c * BN * 128, &maps.k, 64 * c, n * BN, hk,
                                      b, k_full + 8 * st, reused);
                    fa_i_mbar_wait(v_empty + 8 * st, free_parity);
                    if (o_there) {
                        fa_i_mbar_wait(o_read + 8 * (STAGES + st), (o_parity >> st) & 1);
                        o_parity ^= 1u << st;
                        staged &= ~(1u << st);
                    }
                    fa_i_mbar_expect_tx(v_full + 8 * st, TILE);
                    for (c = 0; c < CHUNKS; ++c)
                        fa_i_tma_load(sv + st * TILE + c * BN * 128, &maps.v, 64 * c, n * BN, hk,
                                      b, v_full + 8 * st, reused);
                }
                if (O_IN_RING && first_lo / BN < (last_hi + BN - 1) / BN)
                    staged |= 1u << ((it - 1) % STAGES);
                /* With one Q buffer the next tile's Q loads only once this
                   tile frees it, and no other CTA has read it: into L2 now,
                   so that the load at the tile boundary hits (+1 to +3% on
                   most N = 1k - 2k rows at d = 128 and 256; bench/NOTES.md
                   f11). */
                have = fa_i_sm90_tile(&p, k + 1, blocks_m, &mb, &h, &b);
                if (Q_BUFS == 1 && have)
                    for (c = 0; c < CHUNKS; ++c) fa_i_tma_prefetch_l2(&maps.q, 64 * c, mb * BM, h, b);
            }
        }
    } else { /* consumer warpgroups */
        /* the warpgroup index from lane 0: ptxas then treats it (and what
           derives from it) as warp-uniform; tid / 128 alone it does not */
        const int cw = __shfl_sync(0xffffffffu, tid / 128 - 1, 0);
        const int t = tid % 128, lane = t & 31, warp = t >> 5;
        const float log2_scale = p.softcap > 0.0f ? 1.0f : p.scale * FA_I_LOG2E_F;
        float o[D / 2], s[BN / 2], m_run[2], l_run[2], alpha[2];
        uint32_t pr[BN / 4];
        int64_t k;
        int it = 0, mb, h, b, have;
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FA_I_SM90_CONSUMER_REGS(NC)));
#pragma unroll
        for (i = 0; i < BN / 2; ++i) s[i] = 0.0f;
        if (PINGPONG && cw == NC - 1) fa_i_named_arrive(1, 256); /* warpgroup 0 goes first */
        have = fa_i_sm90_tile(&p, 0, blocks_m, &mb, &h, &b);
        for (k = 0; have; ++k) {
            const int m0 = mb * BM, last = min(m0 + BM, p.seqlen_q), qb = (int)(k % Q_BUFS);
            const int h_now = h, b_now = b;
            const uint32_t sq_wg = sq + qb * Q_BYTES + cw * 64 * 128;
            const uint32_t so_wg = O_APART ? so + cw * 64 * 128 : sq_wg;
            const int row = m0 + 64 * cw + 16 * warp + (lane >> 2); /* and row + 8 */
            int lo[2], hi[2], first_lo, last_hi, all_lo, all_hi, n, n_first, n_end, in_ring;
            float inv[2]; /* 1 / (row sum) */
            uint32_t last_stage; /* ring stage of the last key tile */
            fa_i_rows_key_span(&p, m0, last, &first_lo, &last_hi);
            fa_i_rows_common_keys(&p, m0, last, &all_lo, &all_hi);
            n_first = first_lo / BN;
            n_end = (last_hi + BN - 1) / BN;
            in_ring = O_IN_RING && n_first < n_end;
#define FA_I_STAGE(n) ((it + (n) - n_first) % STAGES)
#define FA_I_PARITY(n) (((it + (n) - n_first) / STAGES) & 1)
#define FA_I_MASKED(n) \
    (((n) * BN < all_lo ? FA_I_MASK_LO : 0) | ((n) * BN + BN > all_hi ? FA_I_MASK_HI : 0))
            last_stage = FA_I_STAGE(n_end - 1); /* used only where the tile saw keys */
#pragma unroll
            for (i = 0; i < 2; ++i) {
                m_run[i] = -INFINITY;
                l_run[i] = 0.0f;
                fa_i_key_range(&p, row + 8 * i, &lo[i], &hi[i]);
            }
#pragma unroll
            for (i = 0; i < D / 2; ++i) o[i] = 0.0f;
            fa_i_mbar_wait(q_full + 8 * qb, (uint32_t)((k / Q_BUFS) & 1));
/* Tile n's scores on their own: S = Q K(n)^T, K's stage released, the
   softmax, O rescaled and P packed (the first tile with the overlap, every
   tile without it). */
#define FA_I_SM90_SCORES(n)                                                              \
    do {                                                                                 \
        fa_i_mbar_wait(k_full + 8 * FA_I_STAGE(n), FA_I_PARITY(n));                      \
        fa_i_sm90_turn_begin(PINGPONG, cw);                                              \
        FA_I_SNAME(sm90_qk)(s, sq_wg, sk + FA_I_STAGE(n) * TILE);                        \
        fa_i_sm90_turn_end(PINGPONG, cw, NC);                                            \
        FA_I_WGMMA_WAIT(0);                                                              \
        fa_i_fence_f32(s, BN / 2);                                                       \
        if (lane == 0) fa_i_mbar_arrive(k_empty + 8 * FA_I_STAGE(n));                    \
        FA_I_SNAME(sm90_softmax)(&p, s, (n) * BN, FA_I_MASKED(n), lo, hi, log2_scale,    \
                                 m_run, l_run, alpha);                                   \
        FA_I_SNAME(sm90_rescale_pack)(o, s, pr, alpha, 1);                               \
    } while (0)
#if FA_SM90_OVERLAP
            /* Tile n's S is issued together with tile n-1's PV: the softmax
               of n runs while PV(n-1) is on the tensor cores where
               PIN_SOFTMAX holds it above PV(n-1)'s wait; elsewhere ptxas
               moves its common path below that wait, and only the other
               warpgroup's GEMMs run under it. */
            if (n_first < n_end) {
                /* a slot per consumer warp for fa_i_pin (warps 4 .. 4 NC + 3: tid / 32 - 4) */
                __shared__ float pins[4 * NC];
                float e[SPEC == 1 ? BN / 2 : 1]; /* P of SPEC 1 */
                int redo = 1;
                FA_I_SM90_SCORES(n_first);
                for (n = n_first + 1; n < n_end; ++n) {
                    fa_i_mbar_wait2(k_full + 8 * FA_I_STAGE(n), FA_I_PARITY(n),
                                    v_full + 8 * FA_I_STAGE(n - 1), FA_I_PARITY(n - 1));
                    fa_i_sm90_turn_begin(PINGPONG, cw);
                    FA_I_SNAME(sm90_qk)(s, sq_wg, sk + FA_I_STAGE(n) * TILE);
                    FA_I_SNAME(sm90_pv)(o, pr, sv + FA_I_STAGE(n - 1) * TILE);
                    fa_i_sm90_turn_end(PINGPONG, cw, NC);
                    /* SPEC 2 waits for PV(n - 1) too: its P goes straight into pr */
                    FA_I_WGMMA_WAIT(SPEC == 2 ? 0 : 1);
                    fa_i_fence_f32(s, BN / 2);
                    if (lane == 0) fa_i_mbar_arrive(k_empty + 8 * FA_I_STAGE(n));
                    if (SPEC == 2) {
                        fa_i_fence_f32(o, D / 2);
                        fa_i_fence_u32(pr, BN / 4);
                        if (lane == 0) fa_i_mbar_arrive(v_empty + 8 * FA_I_STAGE(n - 1));
                        if (FA_I_SNAME(sm90_softmax_spec)(&p, s, e, pr, 1, n * BN, FA_I_MASKED(n),
                                                          lo, hi, log2_scale, m_run, l_run, alpha))
                            FA_I_SNAME(sm90_rescale_pack)(o, s, pr, alpha, 1);
                        continue;
                    }
                    if (SPEC) {
                        redo = FA_I_SNAME(sm90_softmax_spec)(&p, s, e, pr, 0, n * BN,
                                                             FA_I_MASKED(n), lo, hi, log2_scale,
                                                             m_run, l_run, alpha);
                    } else {
                        FA_I_SNAME(sm90_softmax)(&p, s, n * BN, FA_I_MASKED(n), lo, hi,
                                                 log2_scale, m_run, l_run, alpha);
                    }
                    /* the row sums need every exp of the softmax */
                    if (PIN_SOFTMAX && lane == 0) fa_i_pin(pins + tid / 32 - 4, l_run[0] + l_run[1]);
                    FA_I_WGMMA_WAIT(0);
                    fa_i_fence_f32(o, D / 2);
                    fa_i_fence_u32(pr, BN / 4);
                    if (lane == 0) fa_i_mbar_arrive(v_empty + 8 * FA_I_STAGE(n - 1));
                    FA_I_SNAME(sm90_rescale_pack)(o, SPEC ? e : s, pr, alpha, !SPEC || redo);
                }
                /* issued here, waited for below the next tile's coordinates */
                fa_i_mbar_wait(v_full + 8 * last_stage, FA_I_PARITY(n_end - 1));
                fa_i_sm90_turn_begin(PINGPONG, cw);
                FA_I_SNAME(sm90_pv)(o, pr, sv + last_stage * TILE);
                fa_i_sm90_turn_end(PINGPONG, cw, NC);
            }
#else
            /* No overlap: S, softmax, then PV, one tile after another. */
            for (n = n_first; n < n_end; ++n) {
                FA_I_SM90_SCORES(n);
                fa_i_mbar_wait(v_full + 8 * FA_I_STAGE(n), FA_I_PARITY(n));
                FA_I_SNAME(sm90_pv)(o, pr, sv + FA_I_STAGE(n) * TILE);
                FA_I_WGMMA_WAIT(0);
                fa_i_fence_f32(o, D / 2);
                fa_i_fence_u32(pr, BN / 4);
                if (lane == 0) fa_i_mbar_arrive(v_empty + 8 * FA_I_STAGE(n));
            }
#endif
            /* While the last PV runs: Q is free for a later tile unless O
               goes over it (no wgmma reads Q now); the row sums, LSE and
               the next tile's coordinates. */
            if ((O_APART || in_ring) && lane == 0) fa_i_mbar_arrive(q_empty + 8 * qb);
#pragma unroll
            for (i = 0; i < 2; ++i) {
                float l = l_run[i];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                inv[i] = l > 0.0f ? fa_i_dev_rcp(l) : 0.0f;
                if ((lane & 3) == 0 && p.lse && row + 8 * i < p.seqlen_q)
                    p.lse[((int64_t)b_now * p.heads_q + h_now) * p.seqlen_q + row + 8 * i] =
                        l > 0.0f ? (m_run[i] + fa_i_dev_log2(l)) * FA_I_LN2_F : -INFINITY;
            }
            have = fa_i_sm90_tile(&p, k + 1, blocks_m, &mb, &h, &b);
#if FA_SM90_OVERLAP
            /* Unconditional (a no-op without a PV): behind the branch ptxas
               can't see O complete and serializes the wgmmas (C7514). */
            FA_I_WGMMA_WAIT(0);
            fa_i_fence_f32(o, D / 2);
            if (n_first < n_end && lane == 0) fa_i_mbar_arrive(v_empty + 8 * last_stage);
#endif
            /* O staged in the ring: its stage must be done with for both
               warpgroups (their last S for K, their last PV for V) */
            if (in_ring)
                fa_i_mbar_wait((cw == 0 ? k_empty : v_empty) + 8 * last_stage,
                               FA_I_PARITY(n_end - 1));
#undef FA_I_SM90_SCORES
#undef FA_I_STAGE
#undef FA_I_PARITY
#undef FA_I_MASKED
            it += n_end > n_first ? n_end - n_first : 0;
            if (O_APART) {
                /* O's buffer is free once this thread's previous store has
                   read it. */
                if (t == 0) fa_i_tma_store_wait_read();
                fa_i_named_sync(1 + NC + cw, 128);
            }

            /* Epilogue: O / l in 16 bits into shared memory (its own buffer,
               the ring, or over this warpgroup's own Q rows in a tile without
               keys), one TMA store per chunk of 64 columns. */
            {
                const uint32_t o_at = in_ring ? (cw == 0 ? sk : sv) + last_stage * TILE : so_wg;
                const uint32_t o_chunk = in_ring ? 64 * 128 : BM * 128;
#pragma unroll
                for (i = 0; i < D / 2; i += 8) { /* 16 columns: four 8 x 8 matrices */
                    const int r = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
                    const int col = 2 * i + 8 * (lane >> 4);
                    const uint32_t addr = o_at + (col >> 6) * o_chunk + r * 128 +
                                          ((((col & 63) >> 3) ^ (r & 7)) << 4);
                    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                                 ::"r"(addr), "r"(FA_I_PACK(o[i] * inv[0], o[i + 1] * inv[0])),
                                 "r"(FA_I_PACK(o[i + 2] * inv[1], o[i + 3] * inv[1])),
                                 "r"(FA_I_PACK(o[i + 4] * inv[0], o[i + 5] * inv[0])),
                                 "r"(FA_I_PACK(o[i + 6] * inv[1], o[i + 7] * inv[1]))
                                 : "memory");
                }
                fa_i_fence_proxy_async();
                fa_i_named_sync(1 + NC + cw, 128);
                if (t == 0) {
                    int c;
                    for (c = 0; c < CHUNKS; ++c)
                        fa_i_tma_store(&maps.o, o_at + c * o_chunk, 64 * c, m0 + 64 * cw, h_now,
                                       b_now, once);
                    fa_i_tma_store_commit();
                    if (!O_APART) { /* free the ring stage or Q's rows once read */
                        fa_i_tma_store_wait_read();
                        if (in_ring)
                            fa_i_mbar_arrive(o_read + 8 * (cw * STAGES + last_stage));
                        else
                            fa_i_mbar_arrive_n(q_empty + 8 * qb, 4);
                    }
                }
            }
        }
        if (PINGPONG && cw == 0) fa_i_named_sync(1, 256); /* matches the last one's last arrival */
        if (t == 0) fa_i_tma_store_wait_read(); /* shared memory must outlive the stores */
    }
#else
    (void)p;
    (void)maps;
#endif
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#undef FA_I_SM90_BN
#endif
#undef FA_I_SNAME

/* ======================================================================== */
#elif FA_I_PASS == 5
/* The FA3 backward for one (head dim FA_I_D, dtype FA_I_DT), dQ by bulk
   reduce-adds (the atomic mode). Included from pass 2, whose helpers it uses.

   One CTA of two warpgroups per (FA_I_SM90_BWD_KEYS(d) keys, kv head,
   batch): at d = 64 and 128 warpgroup w owns keys 64 w ... 64 w + 63 of
   128, their dK and dV in registers; at d = 256 both take the same 64 keys
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
   (FA_I_SM90_COL). Shared tiles are [d / 64][rows][64] with the 128-byte
   swizzle; dS^T is [keys][64 rows]. */
static_assert(FA_I_D == 64 || FA_I_D == 128 || FA_I_D == 256,
              "flashattn: the FA3 backward takes d = 64, 128 or 256");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_I_WGMMA_NT FA_I_CAT(FA_I_CAT(fa_i_wgmma_ss_, FA_I_DT), _n64)
#if FA_I_D == 256 /* each warpgroup's dK, dV columns */
#define FA_I_WGMMA_DKV FA_I_CAT(fa_i_wgmma_rs_, FA_I_CAT(FA_I_DT, _n128))
#else
#define FA_I_WGMMA_DKV FA_I_CAT(FA_I_CAT(fa_i_wgmma_rs_, FA_I_DT), FA_I_CAT(_n, FA_I_D))
#endif
#define FA_I_WGMMA_DQ FA_I_CAT(FA_I_CAT(fa_i_wgmma_sst_, FA_I_DT), _n64)

/* Issues acc = A B^T over d: A the 64 rows at a of a [d / 64][a_rows][64]
   tile, B a [d / 64][64][64] tile (no commit). */
static __device__ __forceinline__ void FA_I_NAME(sm90_bwd_nt, FA_I_DT)(float *acc, uint32_t a,
                                                                      int a_rows, uint32_t b)
{
    FA_I_SM90_GEMM_NT(FA_I_WGMMA_NT, acc, a, a_rows, b, 64);
}

/* Issues acc += A B: A (64 keys x 64 rows) from registers in 16-bit pairs, B
   the [d / 64][64 rows][64] tile of dO or Q (no commit). */
static __device__ __forceinline__ void FA_I_NAME(sm90_bwd_rs, FA_I_DT)(float *acc,
                                                                      const uint32_t *a, uint32_t b)
{
    FA_I_SM90_GEMM_RS(FA_I_WGMMA_DKV, acc, a, b, 64, 64);
}

/* Issues acc = dS K_c (64 rows x 64 columns of d) over `keys` keys: dS^T at
   ds ([keys][64 rows]), K's column chunk at kc ([keys][64]) (no commit). */
static __device__ __forceinline__ void FA_I_NAME(sm90_bwd_dq, FA_I_DT)(float *acc, uint32_t ds,
                                                                      uint32_t kc, int keys)
{
    enum { BN = FA_I_SM90_BWD_KEYS(FA_I_D) };
    const uint64_t ad = fa_i_wgmma_desc(ds, BN * 128, 1024);
    const uint64_t bd = fa_i_wgmma_desc(kc, BN * 128, 1024);
    int k;
#pragma unroll
    for (k = 0; k < keys / 16; ++k) /* 16 keys of 128 bytes per k16 step */
        FA_I_WGMMA_DQ(acc, fa_i_desc_add(ad, k * 2048), fa_i_desc_add(bd, k * 2048), k > 0);
}
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

static __global__ void __launch_bounds__(256, 1)
    FA_I_NAME(bwd_sm90, FA_I_DT)(const fa_params p, const __grid_constant__ fa_i_sm90_bwd_args args)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    enum {
        D = FA_I_D, BN = FA_I_SM90_BWD_KEYS(FA_I_D), BM = 64, CHUNKS = D / 64,
        STAGES = FA_I_SM90_BWD_STAGES(FA_I_D), /* Q and dO buffers */
        KV_BYTES = BN * D * 2, ROWS_BYTES = BM * D * 2, DS_BYTES = BN * BM * 2,
        SHARED_KEYS = BN == 64,  /* d = 256: both warpgroups on all keys, d split */
        DW = SHARED_KEYS ? D / 2 : D, /* dK and dV columns per warpgroup */
        DQ_BY_KEYS = D == 64,    /* see above */
        DQ_PARTS = FA_I_SM90_BWD_DQ_PARTS(FA_I_D),
        DQ_BYTES = BM * 64 * 4   /* one dQ part */
    };
    /* kv_full, then rows_full per buffer (Q and dO of one block). Only this
       sm_90a body has static shared memory (see fa_i_sm90_ready). */
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
    const int c0 = blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z;
    const int group = p.heads_q / p.heads_kv, q_blocks = fa_i_dq_blocks(&p);
    const int keys_w = SHARED_KEYS ? 0 : 64 * w, cols_w = SHARED_KEYS ? DW * w : 0;
    const int key0 = keys_w + 16 * warp + (lane >> 2); /* and key0 + 8, of the CTA's keys */
    const float log2_scale = p.softcap > 0.0f ? 1.0f : p.scale * FA_I_LOG2E_F;
    float dk[DW / 2], dv[DW / 2];
    int first, last, blocks, steps, step, i, h_at, r_at;
    int sh = 0, sb = 0; /* this step's head of the group and block */

    fa_i_rows_seeing_keys(&p, c0, min(c0 + BN, p.seqlen_k), &first, &last);
    blocks = first <= last ? last / BM - first / BM + 1 : 0;
    steps = group * blocks; /* (query head, query block) pairs, in order */
    /* h_at, r_at: the query head and first row of the step `ahead` after this one */
#define FA_I_STEP_AT(ahead) \
    fa_i_bwd_step(sh, sb, ahead, blocks, hk * group, first / BM, BM, &h_at, &r_at)
#define FA_I_SM90_COL(i) (8 * ((i) >> 2) + 2 * (lane & 3) + ((i) & 1))
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
        fa_i_tma_prefetch(&args.q);
        fa_i_tma_prefetch(&args.dout);
        fa_i_mbar_expect_tx(kv_full, 2 * KV_BYTES);
        for (c = 0; c < CHUNKS; ++c) {
            fa_i_tma_load(sk + c * BN * 128, &args.k, 64 * c, c0, hk, b, kv_full,
                          FA_I_L2_EVICT_NORMAL);
            fa_i_tma_load(sv + c * BN * 128, &args.v, 64 * c, c0, hk, b, kv_full,
                          FA_I_L2_EVICT_NORMAL);
        }
        for (i = 0; i < STAGES && i < steps; ++i) {
            FA_I_STEP_AT(i);
            fa_i_sm90_bwd_load_rows(&args, sq + i * ROWS_BYTES, sdo + i * ROWS_BYTES,
                                    rows_full + 8 * i, CHUNKS, r_at, h_at, b);
        }
    }
    /* Row facts of step n go to buffer n % 2 after the barrier of step n - 2
       (whose readers are done with it) and are read after that of n - 1. */
    for (i = 0; i < 2 && i < steps; ++i) {
        FA_I_STEP_AT(i);
        FA_I_NAME(bwd_row_facts, FA_I_DT)(&p, &args.a, b, h_at, r_at, slse[i], sdsum[i], slo[i],
                                          shi[i], BM, tid, 256);
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
        FA_I_NAME(sm90_bwd_nt, FA_I_DT)(s, sk + keys_w * 128, BN, sqt);
        fa_i_wgmma_commit();
        FA_I_NAME(sm90_bwd_nt, FA_I_DT)(dp, sv + keys_w * 128, BN, sdot);
        fa_i_wgmma_commit();
        FA_I_WGMMA_WAIT(1);
        fa_i_fence_f32(s, 32);
        /* P^T; softcap and mask in uniform branches around their own loops */
        if (p.softcap > 0.0f)
#pragma unroll
            for (i = 0; i < 32; ++i) s[i] = fa_i_score(&p, s[i]);
        if (FA_I_TILE_MASKED(shi[rb][0], slo[rb][min(BM, p.seqlen_q - r0) - 1], c0 + keys_w,
                             c0 + keys_w + 64))
#pragma unroll
            for (i = 0; i < 32; ++i) {
                const int r = FA_I_SM90_COL(i), key = c0 + key0 + 8 * ((i >> 1) & 1);
                if (key < slo[rb][r] || key >= shi[rb][r]) s[i] = -INFINITY;
            }
#pragma unroll
        for (i = 0; i < 32; ++i)
            s[i] = fa_i_dev_exp2(fmaf(s[i], log2_scale, -lse2[FA_I_SM90_COL(i)]));
        FA_I_WGMMA_WAIT(0);
        fa_i_fence_f32(dp, 32);
#pragma unroll
        for (i = 0; i < 32; ++i) dp[i] = s[i] * (dp[i] - dsum[FA_I_SM90_COL(i)]);
        if (p.softcap > 0.0f) /* d(c tanh(x / c)) = (1 - tanh^2) dx, tanh from P */
#pragma unroll
            for (i = 0; i < 32; ++i) {
                const float th = fa_i_capped_tanh(&p, s[i], lse2[FA_I_SM90_COL(i)]);
                dp[i] *= 1.0f - th * th;
            }
#pragma unroll
        for (i = 0; i < 16; ++i) {
            pr[i] = FA_I_PACK(s[2 * i], s[2 * i + 1]);
            dsr[i] = FA_I_PACK(dp[2 * i], dp[2 * i + 1]);
        }
        fa_i_wgmma_fence();
        FA_I_NAME(sm90_bwd_rs, FA_I_DT)(dv, pr, sdot + (cols_w / 64) * BM * 128);
        FA_I_NAME(sm90_bwd_rs, FA_I_DT)(dk, dsr, sqt + (cols_w / 64) * BM * 128);
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
                FA_I_NAME(sm90_bwd_dq, FA_I_DT)(dq, sdst + w * 64 * 128, sk + w * 64 * 128, 64);
            else
                FA_I_NAME(sm90_bwd_dq, FA_I_DT)(dq, sdst, sk + (w * DQ_PARTS + j) * BN * 128, BN);
            fa_i_wgmma_commit();
            if (j == 0 && w == 1 && step + 2 < steps) { /* global loads under the dQ wgmma */
                FA_I_STEP_AT(2);
                FA_I_NAME(bwd_row_facts, FA_I_DT)(&p, &args.a, b, h_at, r_at, slse[rb], sdsum[rb],
                                                  slo[rb], shi[rb], BM, t, 128);
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
                    fa_i_sm90_bwd_load_rows(&args, sqt, sdot, rows_full + 8 * buf, CHUNKS, r_at,
                                            h_at, b);
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
                                  (((int64_t)b * p.heads_q + h) * q_blocks + r0 / BM) * BM * D +
                                  (DQ_BY_KEYS ? 0 : w * DQ_PARTS * BM * 64),
                              sdq, DQ_PARTS * DQ_BYTES);
            fa_i_tma_store_commit();
        }
        FA_I_BWD_ADVANCE(sh, sb, blocks);
    }
#undef FA_I_STEP_AT
    if (t == 0) fa_i_tma_store_wait_read(); /* shared memory must outlive the copy */
    {
        uint16_t *gdk = (uint16_t *)p.dk + fa_i_dev_offset(&p.dk_layout, b, hk, 0);
        uint16_t *gdv = (uint16_t *)p.dv + fa_i_dev_offset(&p.dv_layout, b, hk, 0);
#pragma unroll
        for (i = 0; i < DW / 2; i += 2) {
            const int key = c0 + key0 + 8 * ((i >> 1) & 1), col = cols_w + FA_I_SM90_COL(i);
            FA_I_STORE_DK_DV(key, col, dk[i], dk[i + 1], dv[i], dv[i + 1])
        }
    }
#undef FA_I_SM90_COL
#else
    (void)p;
    (void)args;
#endif
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#undef FA_I_WGMMA_NT
#undef FA_I_WGMMA_DKV
#undef FA_I_WGMMA_DQ
#endif

/* ======================================================================== */
#elif FA_I_PASS == 6
/* The backward's dK/dV kernel FA_I_BWD_KERNEL for one (head dim FA_I_D,
   dtype FA_I_DT, tile FA_I_BWD_KERNEL_CFG): one CTA of 8 warps per (BN keys, kv
   head, batch) keeps dK, dV in registers (written out at the end through
   the K and V tiles, in whole rows); each step takes BM query rows of
   one query head and, if FA_I_BWD_DQ (the atomic mode), adds their
   dQ = dS K into the fp32 accumulator by vector atomics. The warps tile each
   product as FlashAttention-2 does, so that a fragment read from shared
   memory feeds several MMAs: S and dP as SW x 8/SW tiles of rows by keys,
   dV and dK as KW x 8/KW tiles of keys by d, dQ as QW x 8/QW tiles of rows by
   d; P and dS cross between the layouts through shared memory. Barriers per
   step: the step's inputs are in, P and dS are written, and where Q or dO
   has a single stage, a third once it is free: its next load then hides
   behind the rest (double-buffered inputs load a step ahead). */
/* Async copy of BM rows from r0 of head h of tensor q or dout into smem dst. */
#define FA_I_BWD_LOAD(dst, tensor, h, r0)                                                       \
    fa_i_async_tile(dst, (const uint16_t *)p.tensor + fa_i_dev_offset(&p.tensor##_layout, b, h, 0), \
                    p.tensor##_layout.seq, r0, p.seqlen_q, BM, D, LDQ, tid, NT)
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
    FA_I_NAME(FA_I_BWD_KERNEL, FA_I_DT)(const fa_params p, const fa_i_bwd_args a)
{
#define FA_I_BWD_TILE(field) FA_I_CFG(FA_I_BWD_KERNEL_CFG, FA_I_CAT(FA_I_B_, field))
    enum {
        D = FA_I_D, BN = FA_I_BWD_TILE(KEYS), BM = FA_I_BWD_TILE(ROWS), QS = FA_I_BWD_TILE(Q_STAGES),
        DOS = FA_I_BWD_TILE(DO_STAGES),
        SW = FA_I_BWD_TILE(S_ROW_WARPS), KW = FA_I_BWD_TILE(KV_KEY_WARPS), QW = FA_I_BWD_TILE(DQ_ROW_WARPS),
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
#undef FA_I_BWD_TILE
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

    FA_I_NAME(bwd_first_loads, FA_I_DT)(&p, &a, b, hk, c0, BN, (first / BM) * BM, steps, sk, sv, sq,
                                        sdo, slse, sdsum, slo, shi, BM, tid, NT);
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
            FA_I_NAME(bwd_row_facts, FA_I_DT)(&p, &a, b, h_next, r_next, slse + (stage ^ 1) * BM,
                                              sdsum + (stage ^ 1) * BM, slo + (stage ^ 1) * BM,
                                              shi + (stage ^ 1) * BM, BM, tid, NT);
            if (QS == 2) FA_I_BWD_LOAD(sq + (stage ^ 1) * BM * LDQ, q, h_next, r_next);
            if (DOS == 2) FA_I_BWD_LOAD(sdo + (stage ^ 1) * BM * LDQ, dout, h_next, r_next);
        }
        fa_i_cp_async_commit();
        { /* S = Q K^T and dP = dO V^T on this warp's tile, then P and dS to smem */
            float s[SM / 16 * SN / 8][4], dp[SM / 16 * SN / 8][4];
            const int masked = FA_I_TILE_MASKED(hi[0], lo[min(BM, p.seqlen_q - r0) - 1], c0, c0 + BN);
            fa_i_zero_acc(s, SM / 16 * SN / 8);
            fa_i_zero_acc(dp, SM / 16 * SN / 8);
            FA_I_NAME(warp_gemm, FA_I_DT)(s, SM / 16, SN / 16, D, sqt + s_row * LDQ, LDQ, 0,
                                          sk + s_key * LDK, LDK, 0, 0);
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
            FA_I_NAME(warp_gemm, FA_I_DT)(dp, SM / 16, SN / 16, D, sdot + s_row * LDQ, LDQ, 0,
                                          sv + s_key * LDK, LDK, 0, 0);
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
        FA_I_NAME(warp_gemm, FA_I_DT)(dv, KN / 16, KD / 16, BM, sp + kv_key, LDP, 1, sdot, LDQ, kv_col, 1);
        if (DOS == 1 && QS == 2) {
            __syncthreads();
            if (t + 1 < steps) FA_I_BWD_LOAD(sdo, dout, h_next, r_next);
            fa_i_cp_async_commit();
        }
        FA_I_NAME(warp_gemm, FA_I_DT)(dk, KN / 16, KD / 16, BM, sds + kv_key, LDP, 1, sqt, LDQ, kv_col, 1);
        if (QS == 1) {
            __syncthreads();
            if (t + 1 < steps) {
                FA_I_BWD_LOAD(sq, q, h_next, r_next);
                if (DOS == 1) FA_I_BWD_LOAD(sdo, dout, h_next, r_next);
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
                FA_I_NAME(warp_gemm, FA_I_DT)(dq, QM / 16, QP / 16, BN, sds + q_row * LDP, LDP, 0,
                                              sk, LDK, q_col + j * QP, 1);
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
            if (c0 + key < p.seqlen_k) {
                *(uint4 *)(gdk + (int64_t)(c0 + key) * p.dk_layout.seq + col) =
                    *(const uint4 *)(sk + key * LDK + col);
                *(uint4 *)(gdv + (int64_t)(c0 + key) * p.dv_layout.seq + col) =
                    *(const uint4 *)(sv + key * LDK + col);
            }
        }
    }
}
#undef FA_I_EACH_S
#undef FA_I_S_ROW
#undef FA_I_S_KEY
#undef FA_I_STORE_S
#undef FA_I_BWD_LOAD

/* ======================================================================== */
#elif FA_I_PASS == 7
/* Pass 6 in both modes on the tile FA_I_BWD_KERNEL_CFG, kernel names
   suffixed FA_I_BWD_SUFFIX: bwd_kvq adds dQ by atomics, bwd_kv leaves dQ to
   the deterministic mode's dQ kernel. */
#undef FA_I_PASS
#define FA_I_PASS 6
#define FA_I_BWD_DQ 1
#define FA_I_BWD_KERNEL FA_I_CAT(bwd_kvq, FA_I_BWD_SUFFIX)
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#undef FA_I_BWD_KERNEL
#define FA_I_BWD_DQ 0
#define FA_I_BWD_KERNEL FA_I_CAT(bwd_kv, FA_I_BWD_SUFFIX)
#include "flashattn_cuda.cuh"
#undef FA_I_BWD_DQ
#undef FA_I_BWD_KERNEL
#undef FA_I_PASS
#define FA_I_PASS 7
#endif
