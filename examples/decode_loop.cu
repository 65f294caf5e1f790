/* Build: nvcc -O3 -DFA_HEAD_DIM=128 -DFA_CUDA_DTYPE=2 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a -o decode_loop examples/decode_loop.cu */
/* An autoregressive loop over a paged KV cache, as an inference server runs
   attention. Usage: decode_loop [prompt [steps [page_size]]], default 4096
   256 64.

   B = 8 sequences (Hq = 32, Hkv = 8, d = 128, bf16) with prompts of
   different lengths share one pool of pages, handed out in a shuffled order
   as sequences grow (so no sequence's pages are contiguous). Each prompt is
   prefilled on its own in chunks of 512 tokens: one call appends the
   chunk's K and V to the sequence's pages and attends its queries causally
   to everything cached. Then `steps` decode steps run the whole batch: one
   call per step appends each sequence's new token and attends it to the
   sequence's cache, the block table and lengths in device memory
   (tables_on_device: the pages for every step handed out first, the
   lengths advanced by a one-thread-a-sequence kernel after each call, so a
   step never waits on the host). The last step's output is checked against a dense
   recomputation (each sequence's keys gathered into one contiguous tensor).
   The inputs stand in for a model's projections: uniform values from a hash
   of each element's index. */
#define FLASHATTN_IMPLEMENTATION
#define FLASHATTN_CUDA_IMPLEMENTATION
#include "../flashattn_cuda.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 8, HQ = 32, HKV = 8, D = 128, CHUNK = 512 };

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

/* n bf16 values uniform in [-1, 1) from a hash (splitmix64) of index and id. */
static __global__ void fill(uint16_t *x, int64_t n, uint64_t id)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t z = ((uint64_t)i << 3 | id) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = (uint16_t)(__float_as_uint((float)(z >> 56) / 128.0f - 1.0f) >> 16);
}

/* Each sequence's cached length one token longer (after a decode step's append). */
static __global__ void advance(int32_t *lens, int batch)
{
    if ((int)threadIdx.x < batch) ++lens[threadIdx.x];
}

static uint16_t *new_tensor(int64_t n, uint64_t id)
{
    uint16_t *x = NULL;
    if (cudaMalloc(&x, n * sizeof(uint16_t)) != cudaSuccess) return NULL;
    fill<<<(unsigned)((n + 255) / 256), 256>>>(x, n, id);
    return x;
}

static float bf16_to_float(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The pool of pages and the block table: a sequence takes the next free
   page (of a shuffled list) whenever its next `more` tokens need one. */
typedef struct cache {
    int32_t *table, *free_pages, *lens;
    int max_pages, page_size, num_pages, next_free;
} cache;

static int grow(cache *c, int b, int more)
{
    int32_t *row = c->table + (size_t)b * c->max_pages;
    int have = (c->lens[b] + c->page_size - 1) / c->page_size;
    const int want = (c->lens[b] + more + c->page_size - 1) / c->page_size;
    for (; have < want; ++have) {
        if (c->next_free == c->num_pages || have == c->max_pages) return -1;
        row[have] = c->free_pages[c->next_free++];
    }
    return 0;
}

/* The workspace the next call needs, grown when it needs more. */
static int fit_workspace(const fa_params *p, void **ws, size_t *ws_size)
{
    const size_t need = fa_cuda_forward_workspace_size(p);
    if (need <= *ws_size) return 0;
    cudaFree(*ws);
    *ws_size = need;
    return cudaMalloc(ws, need) == cudaSuccess ? 0 : -1;
}

int main(int argc, char **argv)
{
    const int prompt = argc > 1 ? atoi(argv[1]) : 4096, steps = argc > 2 ? atoi(argv[2]) : 256;
    const int page_size = argc > 3 ? atoi(argv[3]) : 64;
    int prompts[B], b, s, i;
    int64_t read_bytes = 0, prompt_tokens = 0;
    cache c;
    size_t ws_size = 0;
    void *ws = NULL;
    uint16_t *k_cache, *v_cache, *pq, *pk, *pv, *dq, *dk, *dv, *o, *o_dense, *dense_k, *dense_v;
    int32_t *table_dev, *lens_dev;
    cudaEvent_t t0, t1, t2;
    float prefill_ms, decode_ms;
    double worst = 0.0;
    if (prompt < 1 || steps < 1 || page_size < 1) {
        fprintf(stderr, "usage: decode_loop [prompt >= 1 [steps >= 1 [page_size >= 1]]]\n");
        return 2;
    }

    memset(&c, 0, sizeof c);
    c.page_size = page_size;
    c.max_pages = (prompt + steps + page_size - 1) / page_size;
    c.num_pages = B * c.max_pages;
    c.table = (int32_t *)calloc((size_t)B * c.max_pages, sizeof(int32_t));
    c.free_pages = (int32_t *)malloc(sizeof(int32_t) * c.num_pages);
    c.lens = (int32_t *)calloc(B, sizeof(int32_t));
    if (!c.table || !c.free_pages || !c.lens) return 1;
    srand(1);
    for (i = 0; i < c.num_pages; ++i) c.free_pages[i] = i;
    for (i = c.num_pages - 1; i > 0; --i) { /* Fisher-Yates */
        const int j = rand() % (i + 1), t = c.free_pages[i];
        c.free_pages[i] = c.free_pages[j], c.free_pages[j] = t;
    }
    for (b = 0; b < B; ++b) { /* ragged: from prompt down to about half of it */
        prompts[b] = prompt - (int)((int64_t)prompt * b / (2 * B));
        prompt_tokens += prompts[b];
    }

    /* pages, prompts [B, prompt, H, D], decode tokens [steps, B, H, D], outputs */
    CHECK_CUDA(cudaMalloc(&k_cache, sizeof(uint16_t) * c.num_pages * page_size * HKV * D));
    CHECK_CUDA(cudaMalloc(&v_cache, sizeof(uint16_t) * c.num_pages * page_size * HKV * D));
    pq = new_tensor((int64_t)B * prompt * HQ * D, 1);
    pk = new_tensor((int64_t)B * prompt * HKV * D, 2);
    pv = new_tensor((int64_t)B * prompt * HKV * D, 3);
    dq = new_tensor((int64_t)steps * B * HQ * D, 4);
    dk = new_tensor((int64_t)steps * B * HKV * D, 5);
    dv = new_tensor((int64_t)steps * B * HKV * D, 6);
    o = new_tensor((int64_t)(CHUNK > B ? CHUNK : B) * HQ * D, 7);
    o_dense = new_tensor((int64_t)HQ * D, 7);
    dense_k = new_tensor((int64_t)(prompt + steps) * HKV * D, 7);
    dense_v = new_tensor((int64_t)(prompt + steps) * HKV * D, 7);
    if (!pq || !pk || !pv || !dq || !dk || !dv || !o || !o_dense || !dense_k || !dense_v) return 1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    CHECK_CUDA(cudaEventCreate(&t2));

    fa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = FA_DTYPE_BF16;
    p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = D;
    p.seqlen_k = c.max_pages * page_size; /* the most keys a sequence can hold */
    p.causal = 1;
    p.k = k_cache, p.v = v_cache;
    p.max_pages = c.max_pages, p.page_size = page_size, p.num_pages = c.num_pages;

    /* Prefill: each prompt on its own, a chunk per call (appended, then attended) */
    CHECK_CUDA(cudaEventRecord(t0, 0));
    for (b = 0; b < B; ++b)
        for (i = 0; i < prompts[b]; i += CHUNK) {
            const int n = prompts[b] - i < CHUNK ? prompts[b] - i : CHUNK;
            const int64_t row = (int64_t)b * prompt + i;
            if (grow(&c, b, n)) return fprintf(stderr, "out of pages\n"), 1;
            p.batch = 1, p.seqlen_q = n, p.seqlen_new = n;
            p.q = pq + row * HQ * D, p.o = o;
            p.k_new = pk + row * HKV * D, p.v_new = pv + row * HKV * D;
            p.block_table = c.table + (size_t)b * c.max_pages, p.cache_seqlens = &c.lens[b];
            if (fit_workspace(&p, &ws, &ws_size)) return 1;
            CHECK_FA(fa_cuda_forward(&p, ws, ws_size, 0));
            c.lens[b] += n; /* the call has read the table and lengths (copied to ws) */
        }

    /* Decode: every sequence's next token, one call a step, the tables in
       device memory (their pages for all the steps handed out first) */
    for (b = 0; b < B; ++b) {
        if (grow(&c, b, steps)) return fprintf(stderr, "out of pages\n"), 1;
        read_bytes += (int64_t)steps * (2 * c.lens[b] + steps + 1) / 2 * HKV * D * 2 * sizeof(uint16_t);
    }
    CHECK_CUDA(cudaMalloc(&table_dev, sizeof(int32_t) * B * c.max_pages));
    CHECK_CUDA(cudaMalloc(&lens_dev, sizeof(int32_t) * B));
    CHECK_CUDA(cudaMemcpy(table_dev, c.table, sizeof(int32_t) * B * c.max_pages, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(lens_dev, c.lens, sizeof(int32_t) * B, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaEventRecord(t1, 0));
    p.batch = B, p.seqlen_q = 1, p.seqlen_new = 1;
    p.block_table = table_dev, p.cache_seqlens = lens_dev, p.tables_on_device = 1;
    for (s = 0; s < steps; ++s) {
        p.q = dq + (int64_t)s * B * HQ * D, p.o = o;
        p.k_new = dk + (int64_t)s * B * HKV * D, p.v_new = dv + (int64_t)s * B * HKV * D;
        if (fit_workspace(&p, &ws, &ws_size)) return 1;
        CHECK_FA(fa_cuda_forward(&p, ws, ws_size, 0));
        advance<<<1, B>>>(lens_dev, B);
    }
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventRecord(t2, 0));
    CHECK_CUDA(cudaEventSynchronize(t2));
    CHECK_CUDA(cudaEventElapsedTime(&prefill_ms, t0, t1));
    CHECK_CUDA(cudaEventElapsedTime(&decode_ms, t1, t2));

    /* Check: the last step's output against each sequence's keys made dense */
    for (b = 0; b < B; ++b) {
        const size_t row = sizeof(uint16_t) * HKV * D;
        uint16_t got[HQ * D], want[HQ * D];
        double diff = 0.0, ref = 0.0;
        fa_params d;
        CHECK_CUDA(cudaMemcpy(dense_k, pk + (int64_t)b * prompt * HKV * D, row * prompts[b],
                              cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaMemcpy(dense_v, pv + (int64_t)b * prompt * HKV * D, row * prompts[b],
                              cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaMemcpy2D(dense_k + (int64_t)prompts[b] * HKV * D, row,
                                dk + (int64_t)b * HKV * D, row * B, row, steps,
                                cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaMemcpy2D(dense_v + (int64_t)prompts[b] * HKV * D, row,
                                dv + (int64_t)b * HKV * D, row * B, row, steps,
                                cudaMemcpyDeviceToDevice));
        memset(&d, 0, sizeof d);
        d.dtype = FA_DTYPE_BF16;
        d.batch = 1, d.heads_q = HQ, d.heads_kv = HKV, d.head_dim = D;
        d.seqlen_q = 1, d.seqlen_k = prompts[b] + steps, d.causal = 1;
        d.q = dq + ((int64_t)(steps - 1) * B + b) * HQ * D;
        d.k = dense_k, d.v = dense_v, d.o = o_dense;
        CHECK_FA(fa_cuda_forward(&d, NULL, 0, 0)); /* unsplit: no workspace */
        CHECK_CUDA(cudaMemcpy(want, o_dense, sizeof want, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(got, o + (int64_t)b * HQ * D, sizeof got, cudaMemcpyDeviceToHost));
        for (i = 0; i < HQ * D; ++i) {
            diff = fmax(diff, fabs(bf16_to_float(got[i]) - bf16_to_float(want[i])));
            ref = fmax(ref, fabs(bf16_to_float(want[i])));
        }
        worst = fmax(worst, diff / ref);
    }

    printf("paged cache: %d sequences, prompts %d .. %d tokens, pages of %d keys\n", B,
           prompts[B - 1], prompts[0], page_size);
    printf("prefill: %.1f ms, %.0f tokens/s (chunks of %d)\n", prefill_ms,
           (double)prompt_tokens / (prefill_ms * 1e-3), CHUNK);
    printf("decode:  %d steps in %.1f ms, %.0f tokens/s, %.1f us a step, K+V read at %.0f GB/s\n",
           steps, decode_ms, (double)steps * B / (decode_ms * 1e-3), 1e3 * decode_ms / steps,
           (double)read_bytes / (decode_ms * 1e-3) / 1e9);
    printf("last step vs dense recomputation: max |diff| / max |o| = %.2e: %s\n", worst,
           worst < 2e-2 ? "ok" : "MISMATCH");
    return worst < 2e-2 ? 0 : 1;
}
