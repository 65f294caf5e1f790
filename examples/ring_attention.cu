/* Build: nvcc -O3 -DFA_HEAD_DIM=128 -DFA_CUDA_DTYPE=2 -gencode=arch=compute_90a,code=sm_90a -o ring_attention examples/ring_attention.cu -lnccl */
/* Ring attention (context parallelism) over every visible GPU, one host
   thread driving them through NCCL (ncclCommInitAll, grouped send/recv).
   Usage: ring_attention [N [causal [check]]], default 32768 1 1.

   The sequence of N tokens is cut into 2R chunks of c = N / 2R and rank r
   holds chunks r and 2R - 1 - r (zigzag: under a causal mask every rank then
   does the same work). Forward, R steps: rank r attends its two query chunks
   to the two key chunks in hand (fa_params.positions gives each pair its
   place in the sequence, so the causal mask is the whole sequence's and
   pairs entirely in the future are skipped), merges each pair's output into
   an fp32 running output by LSE (fa_cuda_combine with accumulate), while its
   communication stream passes the K/V chunks on to rank r + 1 and receives
   the next from rank r - 1. Backward, R steps with the merged O and LSE:
   dQ adds into a local fp32 buffer (accumulate_grads, grads_f32); each
   step's dK, dV go to a zeroed block buffer, are added to the running dK,
   dV that arrived with the chunk, and travel on with it, so after R steps
   every chunk's gradients are back at its owner. Checked against one GPU
   running the whole sequence; timed with communication overlapped and with
   it serialized on the compute stream. B = 1, Hq = 32, Hkv = 8, d = 128,
   bf16. */
#define FLASHATTN_IMPLEMENTATION
#define FLASHATTN_CUDA_IMPLEMENTATION
#include "../flashattn_cuda.cuh"

#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { B = 1, HQ = 32, HKV = 8, D = 128, MAX_RANKS = 8, REPEATS = 3 };

#define CHECK_CUDA(call)                                                                  \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)
#define CHECK_FA(call)                                                                      \
    do {                                                                                    \
        fa_status s_ = (call);                                                              \
        if (s_ != FA_OK) {                                                                  \
            fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, fa_status_string(s_), \
                    fa_last_error_detail());                                                \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)
#define CHECK_NCCL(call)                                                                  \
    do {                                                                                  \
        ncclResult_t r_ = (call);                                                         \
        if (r_ != ncclSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ncclGetErrorString(r_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

/* ---- small kernels: inputs from a hash of their global index, conversions */

/* x[b, row, h, i] of a [B, rows, H, D] tensor holding global rows start0 +
   row (row < c) and start1 + row - c, uniform in [-1, 1) from its global
   index and the tensor's id: every rank makes its chunks of the same data. */
static __global__ void fill(uint16_t *x, int rows, int heads, int c, int start0, int start1,
                            int n, uint64_t id)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t per_row = (int64_t)heads * D, total = (int64_t)B * rows * per_row;
    if (i >= total) return;
    const int row = (int)(i / per_row % rows), b = (int)(i / per_row / rows);
    const int global = row < c ? start0 + row : start1 + row - c;
    uint64_t z = (((uint64_t)b * n + global) * per_row + i % per_row) << 3 | id;
    z += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float f = (float)(z >> 56) / 128.0f - 1.0f; /* 8 significant bits: exact in bf16 */
    x[i] = (uint16_t)(__float_as_uint(f) >> 16);
}

static __global__ void to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const uint32_t u = __float_as_uint(src[i]);
        dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

static __global__ void add_f32(float *dst, const float *a, const float *b, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = a[i] + b[i];
}

static __global__ void set_f32(float *dst, float x, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = x;
}

static unsigned blocks(int64_t n) { return (unsigned)((n + 255) / 256); }

/* ---- the ranks ----------------------------------------------------------- */

typedef struct rank {
    int dev;
    cudaStream_t compute, comm; /* comm == compute: communication serialized */
    ncclComm_t nccl;
    uint16_t *q, *o, *dout;     /* [B, 2c, HQ, D]: its chunks r and 2R - 1 - r */
    uint16_t *kv[3][2];         /* [buffer][k, v] [B, 2c, HKV, D]: 0 its own, 1 and 2 the
                                   ring's (kv_buffer) */
    float *o_acc, *dq;          /* [B, 2c, HQ, D] fp32 */
    float *lse[2];              /* per chunk [B, HQ, c]: the running, then final, LSE */
    uint16_t *o_part;           /* one pair's output [B, c, HQ, D] and LSE */
    float *lse_part;
    float *dkv_step[2];         /* [dk, dv] of this step's pairs [B, 2c, HKV, D] fp32 */
    float *dkv[2][2];           /* [buffer][dk, dv]: the running sums travelling the ring */
    void *ws;
    size_t ws_bytes;
    cudaEvent_t computed, arrived[2]; /* arrived: of K/V, of the running dK, dV */
} rank;

static int R, N, C, CAUSAL; /* ranks, tokens, chunk length, mask */

static int chunk_start(int r, int i) { return (i == 0 ? r : 2 * R - 1 - r) * C; }

static int64_t q_elems(void) { return (int64_t)B * 2 * C * HQ * D; }
static int64_t kv_elems(void) { return (int64_t)B * 2 * C * HKV * D; }

/* Chunk i's rows of a [B, 2c, heads, D] local tensor and its layout. */
static fa_layout local_layout(int heads)
{
    fa_layout l;
    l.batch = (int64_t)2 * C * heads * D, l.head = D, l.seq = (int64_t)heads * D;
    return l;
}

/* Query chunk qi of rank r against key chunk ki of rank j, views of the
   local tensors (no copies), or 0 when the pair is entirely masked. */
static int pair_params(fa_params *p, int r, int qi, int j, int ki)
{
    const int qs = chunk_start(r, qi), ks = chunk_start(j, ki);
    if (CAUSAL && ks > qs + C - 1) return 0; /* every key after every query */
    memset(p, 0, sizeof *p);
    p->dtype = FA_DTYPE_BF16;
    p->batch = B, p->heads_q = HQ, p->heads_kv = HKV, p->head_dim = D;
    p->seqlen_q = p->seqlen_k = C, p->causal = CAUSAL;
    p->positions = 1, p->q_position = qs, p->k_position = ks;
    p->q_layout = p->o_layout = p->dout_layout = p->dq_layout = local_layout(HQ);
    p->k_layout = p->v_layout = p->dk_layout = p->dv_layout = local_layout(HKV);
    return 1;
}

static int alloc(rank *k)
{
    int i, t;
    CHECK_CUDA(cudaSetDevice(k->dev));
    CHECK_CUDA(cudaMalloc(&k->q, q_elems() * 2));
    CHECK_CUDA(cudaMalloc(&k->o, q_elems() * 2));
    CHECK_CUDA(cudaMalloc(&k->dout, q_elems() * 2));
    CHECK_CUDA(cudaMalloc(&k->o_acc, q_elems() * 4));
    CHECK_CUDA(cudaMalloc(&k->dq, q_elems() * 4));
    CHECK_CUDA(cudaMalloc(&k->o_part, q_elems()));  /* half the rows, 2 bytes each */
    CHECK_CUDA(cudaMalloc(&k->lse_part, (size_t)B * HQ * C * 4));
    for (i = 0; i < 2; ++i) {
        CHECK_CUDA(cudaMalloc(&k->lse[i], (size_t)B * HQ * C * 4));
        CHECK_CUDA(cudaMalloc(&k->dkv_step[i], kv_elems() * 4));
        for (t = 0; t < 2; ++t) CHECK_CUDA(cudaMalloc(&k->dkv[i][t], kv_elems() * 4));
    }
    for (i = 0; i < 3; ++i)
        for (t = 0; t < 2; ++t) CHECK_CUDA(cudaMalloc(&k->kv[i][t], kv_elems() * 2));
    CHECK_CUDA(cudaStreamCreateWithFlags(&k->compute, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&k->comm, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&k->computed, cudaEventDisableTiming));
    for (i = 0; i < 2; ++i)
        CHECK_CUDA(cudaEventCreateWithFlags(&k->arrived[i], cudaEventDisableTiming));
    { /* one workspace for every call: the backward's (staged fp32 gradients) is the larger */
        fa_params p;
        pair_params(&p, 0, 0, 0, 0); /* a pair's shapes, any of its buffers */
        p.q = k->q, p.k = k->kv[0][0], p.v = k->kv[0][1], p.o = k->o, p.lse = k->lse[0];
        p.dout = k->dout, p.dq = k->dq, p.dk = k->dkv_step[0], p.dv = k->dkv_step[1];
        p.accumulate_grads = p.grads_f32 = 1;
        k->ws_bytes = fa_cuda_backward_workspace_size(&p, 0);
        if (fa_cuda_forward_workspace_size(&p) > k->ws_bytes)
            k->ws_bytes = fa_cuda_forward_workspace_size(&p);
        CHECK_CUDA(cudaMalloc(&k->ws, k->ws_bytes));
    }
    return 0;
}

/* Rank r's inputs: Q, K, V, dO of its two chunks. */
static int fill_inputs(rank *k, int r)
{
    const int s0 = chunk_start(r, 0), s1 = chunk_start(r, 1);
    CHECK_CUDA(cudaSetDevice(k->dev));
    fill<<<blocks(q_elems()), 256, 0, k->compute>>>(k->q, 2 * C, HQ, C, s0, s1, N, 1);
    fill<<<blocks(kv_elems()), 256, 0, k->compute>>>(k->kv[0][0], 2 * C, HKV, C, s0, s1, N, 2);
    fill<<<blocks(kv_elems()), 256, 0, k->compute>>>(k->kv[0][1], 2 * C, HKV, C, s0, s1, N, 3);
    fill<<<blocks(q_elems()), 256, 0, k->compute>>>(k->dout, 2 * C, HQ, C, s0, s1, N, 4);
    CHECK_CUDA(cudaGetLastError());
    return 0;
}

enum { KV = 0, DKV = 1 }; /* what pass_on passes: inputs, or gradients */

/* Every rank sends `count` elements of send[r] to rank r + 1 and receives
   into recv[r] from rank r - 1 on its comm stream, once its compute stream
   has done what it holds now (the data sent is final, the buffer received
   into read); arrived[what] marks the end. */
static int pass_on(rank *ranks, void *const *send, void *const *recv, size_t count,
                   ncclDataType_t type, int what)
{
    int r;
    for (r = 0; r < R; ++r) {
        CHECK_CUDA(cudaSetDevice(ranks[r].dev));
        CHECK_CUDA(cudaEventRecord(ranks[r].computed, ranks[r].compute));
        CHECK_CUDA(cudaStreamWaitEvent(ranks[r].comm, ranks[r].computed, 0));
    }
    CHECK_NCCL(ncclGroupStart());
    for (r = 0; r < R; ++r) {
        CHECK_NCCL(ncclSend(send[r], count, type, (r + 1) % R, ranks[r].nccl, ranks[r].comm));
        CHECK_NCCL(ncclRecv(recv[r], count, type, (r + R - 1) % R, ranks[r].nccl, ranks[r].comm));
    }
    CHECK_NCCL(ncclGroupEnd());
    for (r = 0; r < R; ++r) {
        CHECK_CUDA(cudaSetDevice(ranks[r].dev));
        CHECK_CUDA(cudaEventRecord(ranks[r].arrived[what], ranks[r].comm));
    }
    return 0;
}

/* The compute streams wait for pass_on's last delivery of `what`. */
static int wait_arrival(rank *ranks, int what)
{
    int r;
    for (r = 0; r < R; ++r) {
        CHECK_CUDA(cudaSetDevice(ranks[r].dev));
        CHECK_CUDA(cudaStreamWaitEvent(ranks[r].compute, ranks[r].arrived[what], 0));
    }
    return 0;
}

/* The buffer of K and V chunks in hand at a step: its own first, then the
   two ring buffers in turn (the one received into at step s - 1), so that a
   rank's own chunks are still there for the backward. */
static int kv_buffer(int step) { return step == 0 ? 0 : 1 + ((step - 1) & 1); }

/* The K and V chunks in hand at `step` on to the next rank, the previous
   rank's into the next step's buffer. */
static int pass_kv(rank *ranks, int step)
{
    void *send[MAX_RANKS], *recv[MAX_RANKS];
    int r, t;
    for (t = 0; t < 2; ++t) {
        for (r = 0; r < R; ++r) {
            send[r] = ranks[r].kv[kv_buffer(step)][t];
            recv[r] = ranks[r].kv[kv_buffer(step + 1)][t];
        }
        if (pass_on(ranks, send, recv, (size_t)kv_elems(), ncclBfloat16, KV)) return 1;
    }
    return 0;
}

static int forward(rank *ranks)
{
    int step, r, qi, ki;
    for (r = 0; r < R; ++r) { /* LSE -inf: no key seen yet, so o_acc is not read */
        CHECK_CUDA(cudaSetDevice(ranks[r].dev));
        for (qi = 0; qi < 2; ++qi)
            set_f32<<<blocks((int64_t)B * HQ * C), 256, 0, ranks[r].compute>>>(
                ranks[r].lse[qi], -INFINITY, (int64_t)B * HQ * C);
    }
    for (step = 0; step < R; ++step) {
        const int in_hand = kv_buffer(step);
        if (step > 0 && wait_arrival(ranks, KV)) return 1;
        if (step + 1 < R && pass_kv(ranks, step)) return 1; /* the next chunks, meanwhile */
        for (r = 0; r < R; ++r) {
            rank *k = &ranks[r];
            const int j = (r - step + R) % R; /* whose chunks are in hand */
            CHECK_CUDA(cudaSetDevice(k->dev));
            for (qi = 0; qi < 2; ++qi)
                for (ki = 0; ki < 2; ++ki) {
                    fa_params p;
                    fa_combine_params m;
                    const void *part[1];
                    const float *part_lse[1];
                    if (!pair_params(&p, r, qi, j, ki)) continue;
                    p.q = k->q + (int64_t)qi * C * HQ * D;
                    p.k = k->kv[in_hand][0] + (int64_t)ki * C * HKV * D;
                    p.v = k->kv[in_hand][1] + (int64_t)ki * C * HKV * D;
                    p.o = k->o_part, p.lse = k->lse_part;
                    memset(&p.o_layout, 0, sizeof p.o_layout); /* contiguous [B, c, HQ, D] */
                    CHECK_FA(fa_cuda_forward(&p, k->ws, k->ws_bytes, k->compute));
                    memset(&m, 0, sizeof m);
                    part[0] = k->o_part, part_lse[0] = k->lse_part;
                    m.num_parts = 1, m.batch = B, m.heads = HQ, m.seqlen = C, m.head_dim = D;
                    m.part_dtype = FA_DTYPE_BF16, m.o_parts = part, m.lse_parts = part_lse;
                    m.dtype = FA_DTYPE_F32, m.o = k->o_acc + (int64_t)qi * C * HQ * D;
                    m.o_layout = local_layout(HQ), m.lse = k->lse[qi], m.accumulate = 1;
                    CHECK_FA(fa_cuda_combine(&m, k->compute));
                }
        }
    }
    for (r = 0; r < R; ++r) { /* O in bf16, as the backward (and a model) takes it */
        CHECK_CUDA(cudaSetDevice(ranks[r].dev));
        to_bf16<<<blocks(q_elems()), 256, 0, ranks[r].compute>>>(ranks[r].o, ranks[r].o_acc,
                                                                  q_elems());
    }
    return 0;
}

/* After it, rank r's own chunks' dK, dV are in dkv[*own][0], dkv[*own][1]. */
static int backward(rank *ranks, int *own)
{
    void *send[MAX_RANKS], *recv[MAX_RANKS];
    int step, r, qi, ki, t, acc = 0; /* dkv[acc]: the running sums of the chunks in hand */
    for (r = 0; r < R; ++r) {
        CHECK_CUDA(cudaSetDevice(ranks[r].dev));
        CHECK_CUDA(cudaMemsetAsync(ranks[r].dq, 0, q_elems() * 4, ranks[r].compute));
    }
    for (step = 0; step < R; ++step) {
        const int in_hand = kv_buffer(step);
        if (step > 0 && wait_arrival(ranks, KV)) return 1;
        if (step + 1 < R && pass_kv(ranks, step)) return 1;
        for (r = 0; r < R; ++r) {
            rank *k = &ranks[r];
            const int j = (r - step + R) % R;
            CHECK_CUDA(cudaSetDevice(k->dev));
            for (t = 0; t < 2; ++t) /* step 0: straight into the running sums */
                CHECK_CUDA(cudaMemsetAsync(step ? k->dkv_step[t] : k->dkv[acc][t], 0,
                                           kv_elems() * 4, k->compute));
            for (qi = 0; qi < 2; ++qi)
                for (ki = 0; ki < 2; ++ki) {
                    fa_params p;
                    if (!pair_params(&p, r, qi, j, ki)) continue;
                    p.q = k->q + (int64_t)qi * C * HQ * D;
                    p.o = k->o + (int64_t)qi * C * HQ * D;
                    p.dout = k->dout + (int64_t)qi * C * HQ * D;
                    p.lse = k->lse[qi]; /* the whole sequence's, from the merge */
                    p.k = k->kv[in_hand][0] + (int64_t)ki * C * HKV * D;
                    p.v = k->kv[in_hand][1] + (int64_t)ki * C * HKV * D;
                    p.dq = k->dq + (int64_t)qi * C * HQ * D;
                    p.dk = (step ? k->dkv_step[0] : k->dkv[acc][0]) + (int64_t)ki * C * HKV * D;
                    p.dv = (step ? k->dkv_step[1] : k->dkv[acc][1]) + (int64_t)ki * C * HKV * D;
                    p.accumulate_grads = p.grads_f32 = 1;
                    CHECK_FA(fa_cuda_backward(&p, 0, k->ws, k->ws_bytes, k->compute));
                }
        }
        if (step > 0) { /* the running sums arrived with the chunks: add this step's */
            if (wait_arrival(ranks, DKV)) return 1;
            for (r = 0; r < R; ++r) {
                rank *k = &ranks[r];
                CHECK_CUDA(cudaSetDevice(k->dev));
                for (t = 0; t < 2; ++t)
                    add_f32<<<blocks(kv_elems()), 256, 0, k->compute>>>(
                        k->dkv[acc][t], k->dkv[acc][t], k->dkv_step[t], kv_elems());
            }
        }
        if (R == 1) break; /* nothing to pass: the chunks are home */
        for (t = 0; t < 2; ++t) { /* on with the chunks; after the last step, home */
            for (r = 0; r < R; ++r) send[r] = ranks[r].dkv[acc][t], recv[r] = ranks[r].dkv[!acc][t];
            if (pass_on(ranks, send, recv, (size_t)kv_elems(), ncclFloat32, DKV)) return 1;
        }
        acc = !acc;
    }
    if (R > 1 && wait_arrival(ranks, DKV)) return 1;
    *own = acc;
    return 0;
}

/* ---- the whole sequence on one GPU, the check, the timing ----------------- */

typedef struct whole {
    uint16_t *q, *k, *v, *dout, *o, *dq, *dk, *dv;
    float *lse;
    void *ws;
    size_t ws_bytes;
    fa_params p;
} whole;

static int whole_run(whole *w, int backward_too)
{
    CHECK_FA(fa_cuda_forward(&w->p, w->ws, w->ws_bytes, 0));
    if (backward_too) CHECK_FA(fa_cuda_backward(&w->p, 0, w->ws, w->ws_bytes, 0));
    return 0;
}

static int whole_setup(whole *w)
{
    const int64_t nq = (int64_t)B * N * HQ * D, nk = (int64_t)B * N * HKV * D;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&w->q, nq * 2));
    CHECK_CUDA(cudaMalloc(&w->o, nq * 2));
    CHECK_CUDA(cudaMalloc(&w->dout, nq * 2));
    CHECK_CUDA(cudaMalloc(&w->dq, nq * 2));
    CHECK_CUDA(cudaMalloc(&w->k, nk * 2));
    CHECK_CUDA(cudaMalloc(&w->v, nk * 2));
    CHECK_CUDA(cudaMalloc(&w->dk, nk * 2));
    CHECK_CUDA(cudaMalloc(&w->dv, nk * 2));
    CHECK_CUDA(cudaMalloc(&w->lse, (size_t)B * HQ * N * 4));
    fill<<<blocks(nq), 256>>>(w->q, N, HQ, N, 0, 0, N, 1);
    fill<<<blocks(nk), 256>>>(w->k, N, HKV, N, 0, 0, N, 2);
    fill<<<blocks(nk), 256>>>(w->v, N, HKV, N, 0, 0, N, 3);
    fill<<<blocks(nq), 256>>>(w->dout, N, HQ, N, 0, 0, N, 4);
    CHECK_CUDA(cudaGetLastError());
    memset(&w->p, 0, sizeof w->p);
    w->p.dtype = FA_DTYPE_BF16, w->p.batch = B, w->p.heads_q = HQ, w->p.heads_kv = HKV;
    w->p.seqlen_q = w->p.seqlen_k = N, w->p.head_dim = D, w->p.causal = CAUSAL;
    w->p.q = w->q, w->p.k = w->k, w->p.v = w->v, w->p.o = w->o, w->p.lse = w->lse;
    w->p.dout = w->dout, w->p.dq = w->dq, w->p.dk = w->dk, w->p.dv = w->dv;
    w->ws_bytes = fa_cuda_backward_workspace_size(&w->p, 0);
    if (fa_cuda_forward_workspace_size(&w->p) > w->ws_bytes)
        w->ws_bytes = fa_cuda_forward_workspace_size(&w->p);
    CHECK_CUDA(cudaMalloc(&w->ws, w->ws_bytes ? w->ws_bytes : 16));
    return 0;
}

/* Sums of (ring - whole)^2 and whole^2 over one chunk: n elements of the
   ring's (fp32 when f32, else bf16, on its device) and of the whole run's
   (bf16, device 0). B = 1, so a chunk's rows are contiguous in both. */
static int compare(const void *ring, int f32, const uint16_t *ref, int64_t n, double *err,
                   double *size)
{
    float *a = (float *)malloc(n * 4);
    uint16_t *a16 = (uint16_t *)malloc(n * 2), *b = (uint16_t *)malloc(n * 2);
    int64_t i;
    if (!a || !a16 || !b) return fprintf(stderr, "out of host memory\n"), 1;
    CHECK_CUDA(cudaMemcpy(f32 ? (void *)a : (void *)a16, ring, n * (f32 ? 4 : 2),
                          cudaMemcpyDefault));
    CHECK_CUDA(cudaMemcpy(b, ref, n * 2, cudaMemcpyDefault));
    for (i = 0; i < n; ++i) {
        const double x = f32 ? a[i] : fa_bf16_to_f32(a16[i]), y = fa_bf16_to_f32(b[i]);
        *err += (x - y) * (x - y), *size += y * y;
    }
    free(a), free(a16), free(b);
    return 0;
}

/* The ring's O, dQ, dK, dV against the whole run's: relative L2 errors. */
static int check(rank *ranks, int own, const whole *w, double rel[4])
{
    double err[4] = {0, 0, 0, 0}, size[4] = {0, 0, 0, 0};
    const int64_t nq = (int64_t)C * HQ * D, nk = (int64_t)C * HKV * D;
    int r, i, t;
    for (r = 0; r < R; ++r)
        for (i = 0; i < 2; ++i) {
            const int64_t g = chunk_start(r, i);
            if (compare(ranks[r].o + i * nq, 0, w->o + g * HQ * D, nq, &err[0], &size[0]) ||
                compare(ranks[r].dq + i * nq, 1, w->dq + g * HQ * D, nq, &err[1], &size[1]))
                return 1;
            for (t = 0; t < 2; ++t)
                if (compare(ranks[r].dkv[own][t] + i * nk, 1, (t ? w->dv : w->dk) + g * HKV * D,
                            nk, &err[2 + t], &size[2 + t]))
                    return 1;
        }
    for (t = 0; t < 4; ++t) rel[t] = sqrt(err[t] / size[t]);
    return 0;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int sync_all(rank *ranks)
{
    int r;
    for (r = 0; r < R; ++r) {
        CHECK_CUDA(cudaSetDevice(ranks[r].dev));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    return 0;
}

int main(int argc, char **argv)
{
    static rank ranks[MAX_RANKS];
    ncclComm_t comms[MAX_RANKS];
    int devs[MAX_RANKS], r, i, overlap, own = 0, failed = 0, checking;
    whole w;
    double flops, t0, t1, t2, single_fwd, single_bwd;
    N = argc > 1 ? atoi(argv[1]) : 32768;
    CAUSAL = argc > 2 ? atoi(argv[2]) : 1;
    checking = argc > 3 ? atoi(argv[3]) : 1;
    CHECK_CUDA(cudaGetDeviceCount(&R));
    if (R > MAX_RANKS) R = MAX_RANKS;
    if (N <= 0 || N % (2 * R))
        return fprintf(stderr, "N = %d must be a positive multiple of 2 x %d ranks\n", N, R), 1;
    C = N / (2 * R);
    flops = 4.0 * B * HQ * (double)N * N * D / (CAUSAL ? 2 : 1);
    for (r = 0; r < R; ++r) devs[r] = r;
    CHECK_NCCL(ncclCommInitAll(comms, R, devs));
    for (r = 0; r < R; ++r) {
        ranks[r].dev = r, ranks[r].nccl = comms[r];
        if (alloc(&ranks[r]) || fill_inputs(&ranks[r], r)) return 1;
    }
    printf("ring attention: %d ranks, N %d (zigzag chunks of %d), %s, B %d, Hq %d, Hkv %d, "
           "d %d, bf16\n",
           R, N, C, CAUSAL ? "causal" : "non-causal", B, HQ, HKV, D);

    /* one GPU, the whole sequence: the baseline and the check's reference */
    if (whole_setup(&w) || whole_run(&w, 1)) return 1;
    CHECK_CUDA(cudaDeviceSynchronize());
    t0 = now();
    for (i = 0; i < REPEATS; ++i)
        if (whole_run(&w, 0)) return 1;
    CHECK_CUDA(cudaDeviceSynchronize());
    t1 = now();
    for (i = 0; i < REPEATS; ++i)
        CHECK_FA(fa_cuda_backward(&w.p, 0, w.ws, w.ws_bytes, 0));
    CHECK_CUDA(cudaDeviceSynchronize());
    t2 = now();
    single_fwd = (t1 - t0) / REPEATS, single_bwd = (t2 - t1) / REPEATS;
    printf("  1 GPU, whole sequence: forward %8.2f ms %6.1f TFLOP/s | backward %8.2f ms %6.1f "
           "TFLOP/s\n",
           1e3 * single_fwd, flops / single_fwd * 1e-12, 1e3 * single_bwd,
           2.5 * flops / single_bwd * 1e-12);
    if (whole_run(&w, 1)) return 1; /* O, LSE and gradients of the last inputs, for the check */

    for (overlap = 1; overlap >= 0; --overlap) {
        cudaStream_t comm[MAX_RANKS];
        for (r = 0; r < R; ++r) { /* serialized: communication on the compute stream */
            comm[r] = ranks[r].comm;
            if (!overlap) ranks[r].comm = ranks[r].compute;
        }
        if (forward(ranks) || backward(ranks, &own) || sync_all(ranks)) return 1; /* warm-up */
        t0 = now();
        for (i = 0; i < REPEATS; ++i)
            if (forward(ranks)) return 1;
        if (sync_all(ranks)) return 1;
        t1 = now();
        for (i = 0; i < REPEATS; ++i)
            if (backward(ranks, &own)) return 1;
        if (sync_all(ranks)) return 1;
        t2 = now();
        {
            const double fwd = (t1 - t0) / REPEATS, bwd = (t2 - t1) / REPEATS;
            printf("  %d GPUs, ring, communication %-10s: forward %8.2f ms %6.1f TFLOP/s "
                   "(%.0f%% of %dx one GPU) | backward %8.2f ms %6.1f TFLOP/s (%.0f%%)\n",
                   R, overlap ? "overlapped" : "serialized", 1e3 * fwd, flops / fwd * 1e-12,
                   100.0 * single_fwd / (R * fwd), R, 1e3 * bwd, 2.5 * flops / bwd * 1e-12,
                   100.0 * single_bwd / (R * bwd));
        }
        for (r = 0; r < R; ++r) ranks[r].comm = comm[r];
    }
    if (checking) {
        double rel[4];
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaDeviceSynchronize());
        if (check(ranks, own, &w, rel)) return 1;
        /* bf16 storage rounds by up to 2^-9; the ring also rounds each pair's O
           and gradients before it merges them: within 1% (relative L2) */
        failed = !(rel[0] < 1e-2 && rel[1] < 1e-2 && rel[2] < 1e-2 && rel[3] < 1e-2);
        printf("  ring against one GPU (relative L2): O %.1e, dQ %.1e, dK %.1e, dV %.1e: %s\n",
               rel[0], rel[1], rel[2], rel[3], failed ? "MISMATCH" : "ok");
    }
    for (r = 0; r < R; ++r) ncclCommDestroy(comms[r]);
    return failed;
}
