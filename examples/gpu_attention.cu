/* Build: nvcc -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a -o gpu_attention examples/gpu_attention.cu */
/* The GPU demo: bf16 attention over B=4, H=16, N=4096, d=128, causal and
   not. It checks sampled rows of O against the plain CPU reference, then
   times forward and backward with CUDA events and prints TFLOP/s (forward
   4 B H N^2 d FLOPs, halved when causal; backward 2.5 times that). */
#define FLASHATTN_IMPLEMENTATION
#define FLASHATTN_CUDA_IMPLEMENTATION
#include "../flashattn_cuda.cuh"
#define FLASHATTN_REF_IMPLEMENTATION
#include "../flashattn_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BATCH = 4, HEADS = 16, SEQ = 4096, DIM = 128, SAMPLES = 8, REPEATS = 20 };

#define CHECK_CUDA(call)                                                                  \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)
#define CHECK_FA(call)                                                                     \
    do {                                                                                   \
        fa_status s_ = (call);                                                             \
        if (s_ != FA_OK) {                                                                 \
            fprintf(stderr, "%s: %s (%s)\n", #call, fa_status_string(s_), fa_last_error_detail()); \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

static uint64_t rng_state;
static float uniform(void) /* xorshift64*, in [-1, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}

/* Largest |O - reference| / max |reference| over SAMPLES query rows of two
   batches, all heads; see cpu_attention.c for why one row is a problem of its
   own with seqlen_q = 1. */
static double check_rows(const fa_params *host, const uint16_t *o)
{
    const size_t row = (size_t)HEADS * DIM;
    static uint16_t ref[HEADS * DIM];
    double worst = 0.0;
    int s, b;
    size_t i;
    for (s = 0; s < SAMPLES; ++s)
        for (b = 0; b < BATCH; b += BATCH - 1) {
            const int r = s == 0 ? SEQ - 1 : (int)((uniform() + 1.0f) * 0.5f * SEQ) % SEQ;
            const size_t at = ((size_t)b * SEQ + r) * row;
            fa_params one = *host;
            one.batch = 1;
            one.seqlen_q = 1;
            one.seqlen_k = host->causal ? r + 1 : SEQ;
            one.q = (const uint16_t *)host->q + at;
            one.k = (const uint16_t *)host->k + (size_t)b * SEQ * row;
            one.v = (const uint16_t *)host->v + (size_t)b * SEQ * row;
            one.o = ref;
            one.lse = NULL;
            double err = 0.0, size = 0.0;
            if (fa_ref_forward(&one) != FA_OK) return INFINITY;
            for (i = 0; i < row; ++i) {
                const double e = fabs((double)fa_bf16_to_f32(o[at + i]) - fa_bf16_to_f32(ref[i]));
                if (!(e <= err)) err = e; /* NaN counts as the worst */
                size = fmax(size, fabs((double)fa_bf16_to_f32(ref[i])));
            }
            if (!(err / size <= worst)) worst = err / size;
        }
    return worst;
}

int main(void)
{
    const size_t n = (size_t)BATCH * SEQ * HEADS * DIM, bytes = n * 2;
    const size_t rows = (size_t)BATCH * HEADS * SEQ;
    uint16_t *host[5], *o_host = (uint16_t *)malloc(bytes);
    void *dev[9], *workspace;
    size_t workspace_size, i;
    fa_params p = {0}, hp;
    cudaEvent_t start, stop;
    int t, causal, failed = 0;
    rng_state = (uint64_t)time(NULL) | 1;
    for (t = 0; t < 5; ++t) {
        host[t] = (uint16_t *)malloc(bytes);
        if (!host[t] || !o_host) return fprintf(stderr, "out of memory\n"), 1;
        for (i = 0; i < n; ++i) host[t][i] = fa_f32_to_bf16(uniform());
    }
    for (t = 0; t < 9; ++t) CHECK_CUDA(cudaMalloc(&dev[t], t == 4 ? rows * sizeof(float) : bytes));
    for (t = 0; t < 3; ++t) CHECK_CUDA(cudaMemcpy(dev[t], host[t], bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dev[5], host[3], bytes, cudaMemcpyHostToDevice)); /* dO */
    p.dtype = FA_DTYPE_BF16;
    p.batch = BATCH, p.heads_q = HEADS, p.seqlen_q = SEQ, p.seqlen_k = SEQ, p.head_dim = DIM;
    p.q = dev[0], p.k = dev[1], p.v = dev[2], p.o = dev[3], p.lse = (float *)dev[4];
    p.dout = dev[5], p.dq = dev[6], p.dk = dev[7], p.dv = dev[8];
    workspace_size = fa_cuda_backward_workspace_size(&p, 0);
    CHECK_CUDA(cudaMalloc(&workspace, workspace_size));
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));

    /* FA3 on Hopper (sm_90a build), else FA2 */
    printf("flashattn GPU demo: B=%d H=%d N=%d d=%d bf16, forward kernel FA%d, backward FA%d\n",
           BATCH, HEADS, SEQ, DIM, fa_cuda_forward_algorithm(&p),
           fa_cuda_backward_algorithm(&p, 0));
    for (causal = 0; causal <= 1; ++causal) {
        const double flops = 4.0 * BATCH * HEADS * (double)SEQ * SEQ * DIM / (causal ? 2 : 1);
        float fwd_ms, bwd_ms;
        double err;
        p.causal = causal;
        CHECK_CUDA(cudaMemset(dev[3], 0xff, bytes)); /* NaN poison: unwritten rows would show */
        CHECK_FA(fa_cuda_forward(&p, NULL, 0, 0));
        CHECK_CUDA(cudaMemcpy(o_host, dev[3], bytes, cudaMemcpyDeviceToHost));
        hp = p;
        hp.q = host[0], hp.k = host[1], hp.v = host[2];
        err = check_rows(&hp, o_host);
        failed |= !(err < 1e-2);

        CHECK_CUDA(cudaEventRecord(start, 0));
        for (t = 0; t < REPEATS; ++t) CHECK_FA(fa_cuda_forward(&p, NULL, 0, 0));
        CHECK_CUDA(cudaEventRecord(stop, 0));
        CHECK_CUDA(cudaEventSynchronize(stop));
        CHECK_CUDA(cudaEventElapsedTime(&fwd_ms, start, stop));
        CHECK_CUDA(cudaEventRecord(start, 0));
        for (t = 0; t < REPEATS; ++t)
            CHECK_FA(fa_cuda_backward(&p, 0, workspace, workspace_size, 0));
        CHECK_CUDA(cudaEventRecord(stop, 0));
        CHECK_CUDA(cudaEventSynchronize(stop));
        CHECK_CUDA(cudaEventElapsedTime(&bwd_ms, start, stop));
        fwd_ms /= REPEATS, bwd_ms /= REPEATS;
        printf("  %-10s forward %7.3f ms %6.1f TFLOP/s | backward %7.3f ms %6.1f TFLOP/s | "
               "rel err %.1e %s\n",
               causal ? "causal" : "non-causal", fwd_ms, flops / fwd_ms * 1e-9, bwd_ms,
               2.5 * flops / bwd_ms * 1e-9, err, err < 1e-2 ? "ok" : "MISMATCH");
    }
    for (t = 0; t < 9; ++t) cudaFree(dev[t]);
    cudaFree(workspace);
    for (t = 0; t < 5; ++t) free(host[t]);
    free(o_host);
    return failed;
}
