/* Build: gcc -std=c99 -O3 -march=native -o cpu_attention examples/cpu_attention.c -lm -pthread */
/* The main CPU demo: attention over B=1, H=8, N=4096, d=64 in fp32 with the
   FA2 loop order on every core, non-causal and causal. It checks sampled
   rows against the plain reference and prints the time and GFLOP/s.

   A single query row r is itself a problem with seqlen_q = 1; under the
   causal mask it sees keys 0..r, which is seqlen_k = r + 1 with the
   bottom-right alignment, so the reference checks it cheaply. */
#define _POSIX_C_SOURCE 200809L
#define FLASHATTN_IMPLEMENTATION
#include "../flashattn.h"
#define FLASHATTN_REF_IMPLEMENTATION
#include "../flashattn_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { BATCH = 1, HEADS = 8, SEQ = 4096, DIM = 64, SAMPLES = 16 };

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng_state;
static float uniform(void) /* xorshift64*, in [-1, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}

/* Largest |O - reference| / max |reference| over SAMPLES query rows (all heads). */
static double check_rows(const fa_params *p, const float *o)
{
    const size_t row = (size_t)HEADS * DIM;
    float ref[HEADS * DIM];
    double worst = 0.0;
    int s;
    size_t i;
    for (s = 0; s < SAMPLES; ++s) {
        const int r = s == 0 ? SEQ - 1 : (int)((uniform() + 1.0f) * 0.5f * SEQ) % SEQ;
        fa_params one = *p;
        one.seqlen_q = 1;
        one.seqlen_k = p->causal ? r + 1 : SEQ;
        one.q = (const float *)p->q + r * row;
        one.o = ref;
        one.lse = NULL;
        double err = 0.0, size = 0.0;
        if (fa_ref_forward(&one) != FA_OK) return INFINITY;
        for (i = 0; i < row; ++i) {
            const double e = fabs((double)o[r * row + i] - ref[i]);
            if (!(e <= err)) err = e; /* NaN counts as the worst */
            size = fmax(size, fabs((double)ref[i]));
        }
        if (!(err / size <= worst)) worst = err / size;
    }
    return worst;
}

int main(void)
{
    const size_t n = (size_t)BATCH * SEQ * HEADS * DIM;
    float *q = (float *)malloc(n * sizeof(float)), *k = (float *)malloc(n * sizeof(float));
    float *v = (float *)malloc(n * sizeof(float)), *o = (float *)malloc(n * sizeof(float));
    fa_cpu_options opt = {0};
    fa_params p = {0};
    int causal, failed = 0;
    size_t i;
    if (!q || !k || !v || !o) return fprintf(stderr, "out of memory\n"), 1;
    rng_state = (uint64_t)time(NULL) | 1;
    for (i = 0; i < n; ++i) q[i] = uniform(), k[i] = uniform(), v[i] = uniform();
    opt.num_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    p.dtype = FA_DTYPE_F32;
    p.batch = BATCH, p.heads_q = HEADS, p.seqlen_q = SEQ, p.seqlen_k = SEQ, p.head_dim = DIM;
    p.q = q, p.k = k, p.v = v, p.o = o;

    printf("flashattn %d.%d.%d CPU demo: B=%d H=%d N=%d d=%d fp32, %d threads\n",
           FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH, BATCH, HEADS, SEQ, DIM,
           opt.num_threads);
    for (causal = 0; causal <= 1; ++causal) {
        const double flops = 4.0 * BATCH * HEADS * (double)SEQ * SEQ * DIM / (causal ? 2 : 1);
        double start, seconds, err;
        fa_status s;
        p.causal = causal;
        for (i = 0; i < n; ++i) o[i] = NAN; /* unwritten outputs would show */
        start = now_seconds();
        s = fa_cpu_forward(&p, &opt);
        seconds = now_seconds() - start;
        if (s != FA_OK) {
            fprintf(stderr, "fa_cpu_forward: %s (%s)\n", fa_status_string(s), fa_last_error_detail());
            return 1;
        }
        err = check_rows(&p, o);
        failed |= !(err < 1e-5);
        printf("  %-10s %8.1f ms  %6.1f GFLOP/s  rel err over %d rows %.1e  %s\n",
               causal ? "causal" : "non-causal", seconds * 1e3, flops / seconds * 1e-9, SAMPLES,
               err, err < 1e-5 ? "ok" : "MISMATCH");
    }
    free(q), free(k), free(v), free(o);
    return failed;
}
