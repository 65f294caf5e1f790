/* The machine's fp32 FMA peak, for bench_cpu.py's "% of peak" column:
   THREADS threads each run independent chains of 8-wide fused multiply-adds
   (GCC/Clang vector extensions; -march=native makes them AVX2/AVX-512 FMAs).
   Prints GFLOP/s. Usage: fma_peak THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef float v8 __attribute__((vector_size(32)));
#define CHAINS 12
#define STEPS 50000000L

static void *chains(void *out)
{
    v8 acc[CHAINS], a = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, b = a * 0.999999f;
    float sum = 0.0f;
    long step;
    int i, j;
    for (i = 0; i < CHAINS; ++i) acc[i] = a * (float)i;
    for (step = 0; step < STEPS; ++step)
        for (i = 0; i < CHAINS; ++i) acc[i] = acc[i] * b + a;
    for (i = 0; i < CHAINS; ++i)
        for (j = 0; j < 8; ++j) sum += acc[i][j];
    *(float *)out = sum; /* keeps the chains live */
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1, t;
    pthread_t ids[256];
    float sink[256];
    struct timespec t0, t1;
    double seconds;
    if (threads < 1 || threads > 256) return 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (t = 0; t < threads; ++t) pthread_create(&ids[t], NULL, chains, &sink[t]);
    for (t = 0; t < threads; ++t) pthread_join(ids[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%.1f\n", 2.0 * 8 * CHAINS * STEPS * threads / seconds / 1e9);
    return sink[0] == 12345.0f; /* never: the sums are read */
}
