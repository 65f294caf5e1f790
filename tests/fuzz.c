/* Bounded fuzz of the CPU path, run by `make test` as built (build/fuzz) and
   with -fsanitize=address,undefined (build/fuzz_asan):
     fuzz SECONDS SEED
   Random valid problems (sizes, head dims 1..80, dtypes f32/f16/bf16 and
   fp8 forwards with random descales, masks, softcap, GQA, strided layouts,
   thread counts, loop orders, splits), forward and backward, against
   flashattn_ref.h; and random bad inputs, each checked for its status and
   untouched outputs. Prints the seed and the counts; exits 1 at the first
   failure, naming the problem. */
#define FLASHATTN_IMPLEMENTATION
#include "../flashattn.h"
#define FLASHATTN_REF_IMPLEMENTATION
#include "../flashattn_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t fz_state;

static uint32_t fz_next(void) /* xorshift64* */
{
    fz_state ^= fz_state >> 12;
    fz_state ^= fz_state << 25;
    fz_state ^= fz_state >> 27;
    return (uint32_t)((fz_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static int fz_int(int lo, int hi) { return lo + (int)(fz_next() % (uint32_t)(hi - lo + 1)); }
static float fz_normal(void) /* sum of uniforms: enough spread for attention inputs */
{
    float x = 0.0f;
    int i;
    for (i = 0; i < 4; ++i) x += (float)fz_next() / 4294967296.0f;
    return (x - 2.0f) * 1.7f;
}

/* One tensor [B, N, H, d] in a random layout: contiguous BSHD, BHSD, or
   rows padded by a few elements. */
typedef struct fz_tensor {
    void *data;
    size_t bytes;
    fa_layout layout;
} fz_tensor;

static fz_tensor fz_alloc(int b, int n, int h, int d, fa_dtype dtype, int kind)
{
    fz_tensor t;
    const int64_t pitch = d + (kind == 2 ? fz_int(1, 9) : 0);
    memset(&t, 0, sizeof t);
    if (kind == 1) { /* BHSD */
        t.layout.seq = pitch, t.layout.head = (int64_t)n * pitch, t.layout.batch = (int64_t)h * n * pitch;
    } else {
        t.layout.head = pitch, t.layout.seq = (int64_t)h * pitch, t.layout.batch = (int64_t)n * h * pitch;
    }
    t.bytes = (size_t)(b * t.layout.batch) * fa_dtype_size(dtype);
    t.data = malloc(t.bytes);
    return t;
}

static void fz_fill(fz_tensor *t, fa_dtype dtype)
{
    size_t i, n = t->bytes / fa_dtype_size(dtype);
    for (i = 0; i < n; ++i) {
        const float x = fz_normal();
        if (dtype == FA_DTYPE_F32) ((float *)t->data)[i] = x;
        else if (dtype == FA_DTYPE_F16) ((uint16_t *)t->data)[i] = fa_f32_to_f16(x);
        else if (dtype == FA_DTYPE_BF16) ((uint16_t *)t->data)[i] = fa_f32_to_bf16(x);
        else ((uint8_t *)t->data)[i] = fa_f32_to_e4m3(x * 30.0f);
    }
}

/* One element of head 0 of a q or k tensor set to NaN, +inf or -inf. */
static void fz_poison(fz_tensor *t, fa_dtype dtype, int b, int n, int d)
{
    const float values[3] = {NAN, INFINITY, -INFINITY};
    const float x = values[fz_int(0, 2)];
    const int64_t at = fz_int(0, b - 1) * t->layout.batch + fz_int(0, n - 1) * t->layout.seq +
                       fz_int(0, d - 1);
    if (dtype == FA_DTYPE_F32) ((float *)t->data)[at] = x;
    else if (dtype == FA_DTYPE_F16) ((uint16_t *)t->data)[at] = fa_f32_to_f16(x);
    else ((uint16_t *)t->data)[at] = fa_f32_to_bf16(x);
}

static float fz_get(const fz_tensor *t, fa_dtype dtype, int b, int h, int s, int i)
{
    const int64_t at = b * t->layout.batch + h * t->layout.head + s * t->layout.seq + i;
    if (dtype == FA_DTYPE_F32) return ((const float *)t->data)[at];
    if (dtype == FA_DTYPE_F16) return fa_f16_to_f32(((const uint16_t *)t->data)[at]);
    return fa_bf16_to_f32(((const uint16_t *)t->data)[at]);
}

/* Largest |ours - ref| over the bound ulp |ref| + tol max(max|ref|, 1) (> 1
   fails): the inputs are O(1), so a gradient the reference makes ~0 (one
   key: dS = 0) is judged against that scale, not its own. Non-finite
   entries (the non-finite policy's NaN rows) must match exactly. */
static double fz_compare(const fz_tensor *ours, const fz_tensor *ref, fa_dtype dtype, int b, int n,
                         int h, int d, double tol)
{
    const double ulp = dtype == FA_DTYPE_F32 ? 1e-6 : dtype == FA_DTYPE_F16 ? 1.0 / 1024 : 1.0 / 128;
    double mx = 0.0, worst = 0.0;
    int bb, hh, s, i;
    for (bb = 0; bb < b; ++bb)
        for (hh = 0; hh < h; ++hh)
            for (s = 0; s < n; ++s)
                for (i = 0; i < d; ++i) {
                    const double r = fz_get(ref, dtype, bb, hh, s, i);
                    if (isfinite(r)) mx = fmax(mx, fabs(r));
                }
    for (bb = 0; bb < b; ++bb)
        for (hh = 0; hh < h; ++hh)
            for (s = 0; s < n; ++s)
                for (i = 0; i < d; ++i) {
                    const double r = fz_get(ref, dtype, bb, hh, s, i);
                    const double x = fz_get(ours, dtype, bb, hh, s, i);
                    double e;
                    if (!isfinite(r) || !isfinite(x)) {
                        if (!(isnan(r) ? isnan(x) : x == r)) return INFINITY;
                        continue;
                    }
                    e = fabs(x - r) / (ulp * fabs(r) + tol * fmax(mx, 1.0));
                    if (!(e <= worst)) worst = e;
                }
    return worst;
}

typedef struct fz_problem {
    fa_params p;
    fz_tensor q, k, v, o, dout, dq, dk, dv, ref_o, ref_dq, ref_dk, ref_dv;
    float *lse, *ref_lse, *descale[3];
    fa_cpu_options opt;
    int backward;
} fz_problem;

static void fz_make(fz_problem *z)
{
    fa_params *p = &z->p;
    int kind = fz_int(0, 2), i;
    memset(z, 0, sizeof *z);
    p->batch = fz_int(1, 2);
    p->heads_kv = fz_int(1, 3);
    p->heads_q = p->heads_kv * fz_int(1, 3);
    p->seqlen_q = fz_int(1, 70);
    p->seqlen_k = fz_int(1, 90);
    p->head_dim = fz_int(1, 80);
    p->head_dim_v = fz_int(0, 2) == 0 ? fz_int(1, 80) : 0; /* 0: head_dim */
    p->dtype = (fa_dtype)fz_int(0, 3);
    z->backward = p->dtype != FA_DTYPE_FP8_E4M3 && fz_int(0, 1);
    p->scale = fz_int(0, 1) ? 0.0f : 0.05f * (float)fz_int(1, 10);
    p->causal = fz_int(0, 3) == 0;
    if (fz_int(0, 3) == 0) {
        p->window = 1;
        p->window_left = fz_int(-1, 40);
        p->window_right = fz_int(-1, 10);
    }
    if (fz_int(0, 3) == 0) p->softcap = (float)fz_int(5, 30);
    if (fz_int(0, 4) == 0) { /* a chunk pair of a longer sequence */
        p->positions = 1;
        p->q_position = fz_int(0, 200);
        p->k_position = fz_int(0, 200);
    }
    p->num_splits = fz_int(0, 2) == 0 ? fz_int(1, 4) : 0;
    if (p->dtype == FA_DTYPE_FP8_E4M3) {
        p->o_dtype = fz_int(0, 1) ? FA_DTYPE_BF16 : FA_DTYPE_F16;
        p->fp8_scaling = (fa_fp8_scaling)fz_int(0, 2);
        for (i = 0; i < 3; ++i) {
            const int heads = i == 0 ? p->heads_q : p->heads_kv;
            const int n = i == 0 ? p->seqlen_q : p->seqlen_k, blocks = (n + FA_FP8_BLOCK - 1) / FA_FP8_BLOCK;
            int j, count = p->fp8_scaling == FA_FP8_SCALE_BLOCK ? p->batch * heads * blocks
                           : p->fp8_scaling == FA_FP8_SCALE_HEAD ? p->batch * heads : 1;
            z->descale[i] = (float *)malloc(sizeof(float) * (size_t)count);
            for (j = 0; j < count; ++j) z->descale[i][j] = 0.01f * (float)fz_int(1, 8);
        }
        p->q_descale = z->descale[0], p->k_descale = z->descale[1], p->v_descale = z->descale[2];
    }
#define FZ_ALLOC(t, n, h, d, dt) t = fz_alloc(p->batch, p->n, p->h, d, dt, kind)
    {
        const int d = p->head_dim, dv = p->head_dim_v ? p->head_dim_v : d;
        const fa_dtype od = p->dtype == FA_DTYPE_FP8_E4M3 ? p->o_dtype : p->dtype;
        FZ_ALLOC(z->q, seqlen_q, heads_q, d, p->dtype);
        FZ_ALLOC(z->k, seqlen_k, heads_kv, d, p->dtype);
        FZ_ALLOC(z->v, seqlen_k, heads_kv, dv, p->dtype);
        FZ_ALLOC(z->o, seqlen_q, heads_q, dv, od);
        FZ_ALLOC(z->ref_o, seqlen_q, heads_q, dv, od);
        fz_fill(&z->q, p->dtype), fz_fill(&z->k, p->dtype), fz_fill(&z->v, p->dtype);
        if (p->dtype != FA_DTYPE_FP8_E4M3 && fz_int(0, 7) == 0) { /* the non-finite policy */
            const int in_q = fz_int(0, 1);
            fz_poison(in_q ? &z->q : &z->k, p->dtype, p->batch, in_q ? p->seqlen_q : p->seqlen_k, d);
            z->backward = 0; /* the reference sums 0 * NaN where ours skips masked tiles */
        }
        if (z->backward) {
            FZ_ALLOC(z->dout, seqlen_q, heads_q, dv, p->dtype);
            FZ_ALLOC(z->dq, seqlen_q, heads_q, d, p->dtype);
            FZ_ALLOC(z->dk, seqlen_k, heads_kv, d, p->dtype);
            FZ_ALLOC(z->dv, seqlen_k, heads_kv, dv, p->dtype);
            FZ_ALLOC(z->ref_dq, seqlen_q, heads_q, d, p->dtype);
            FZ_ALLOC(z->ref_dk, seqlen_k, heads_kv, d, p->dtype);
            FZ_ALLOC(z->ref_dv, seqlen_k, heads_kv, dv, p->dtype);
            fz_fill(&z->dout, p->dtype);
        }
    }
#undef FZ_ALLOC
    z->lse = (float *)malloc(sizeof(float) * (size_t)p->batch * p->heads_q * p->seqlen_q);
    z->ref_lse = (float *)malloc(sizeof(float) * (size_t)p->batch * p->heads_q * p->seqlen_q);
    p->q = z->q.data, p->k = z->k.data, p->v = z->v.data;
    p->q_layout = z->q.layout, p->k_layout = z->k.layout, p->v_layout = z->v.layout;
    p->o_layout = z->o.layout, p->dout_layout = z->dout.layout;
    p->dq_layout = z->dq.layout, p->dk_layout = z->dk.layout, p->dv_layout = z->dv.layout;
    z->opt.num_threads = fz_int(1, 3);
    z->opt.order = z->backward || fz_int(0, 1) ? FA_CPU_ORDER_FA2 : FA_CPU_ORDER_FA1;
    z->opt.pack_bytes = fz_int(0, 2) == 0 ? -1 : fz_int(0, 1) * fz_int(1, 1 << 20); /* none, default, a cap */
}

static void fz_free(fz_problem *z)
{
    fz_tensor *all[] = {&z->q, &z->k, &z->v, &z->o, &z->dout, &z->dq, &z->dk, &z->dv,
                        &z->ref_o, &z->ref_dq, &z->ref_dk, &z->ref_dv};
    size_t i;
    for (i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]->data);
    for (i = 0; i < 3; ++i) free(z->descale[i]);
    free(z->lse);
    free(z->ref_lse);
}

static void fz_describe(const fz_problem *z, const char *what, double err)
{
    const fa_params *p = &z->p;
    printf("FAIL %s (%.3g): B %d Hq %d Hkv %d Nq %d Nk %d d %d dtype %d o_dtype %d scaling %d "
           "head_dim_v %d scale %g causal %d window %d (%d, %d) positions %d (%d, %d) softcap %g "
           "splits %d threads %d order %d pack_bytes %lld backward %d; %s\n",
           what, err, p->batch, p->heads_q, p->heads_kv, p->seqlen_q, p->seqlen_k, p->head_dim,
           (int)p->dtype, (int)p->o_dtype, (int)p->fp8_scaling, p->head_dim_v, p->scale, p->causal,
           p->window, p->window_left, p->window_right, p->positions, p->q_position, p->k_position,
           p->softcap, p->num_splits, z->opt.num_threads,
           (int)z->opt.order, (long long)z->opt.pack_bytes, z->backward, fa_last_error_detail());
}

/* One valid problem against the reference; 0 when it agrees. */
static int fz_valid(fz_problem *z)
{
    fa_params ours = z->p, ref = z->p;
    const int nq = ours.seqlen_q, nk = ours.seqlen_k, hq = ours.heads_q, d = ours.head_dim;
    const int dv = ours.head_dim_v ? ours.head_dim_v : d;
    const int hk = ours.heads_kv, b = ours.batch;
    const fa_dtype od = ours.dtype == FA_DTYPE_FP8_E4M3 ? ours.o_dtype : ours.dtype;
    fa_status s;
    double err, tol;
    int64_t i;
    ours.o = z->o.data, ours.lse = z->lse;
    ref.o = z->ref_o.data, ref.lse = z->ref_lse, ref.o_layout = z->ref_o.layout;
    if ((s = fa_cpu_forward(&ours, &z->opt)) != FA_OK || (s = fa_ref_forward(&ref)) != FA_OK) {
        fz_describe(z, fa_status_string(s), 0.0);
        return 1;
    }
    if ((err = fz_compare(&z->o, &z->ref_o, od, b, nq, hq, dv, 1e-4)) > 1.0) {
        fz_describe(z, "forward o", err);
        return 1;
    }
    for (i = 0; i < (int64_t)b * hq * nq; ++i)
        if (!(isnan(z->ref_lse[i])   ? isnan(z->lse[i])
              : isinf(z->ref_lse[i]) ? z->lse[i] == z->ref_lse[i]
                                   : fabs(z->lse[i] - z->ref_lse[i]) <= 1e-4 * (1 + fabs(z->ref_lse[i])))) {
            fz_describe(z, "forward lse", fabs(z->lse[i] - z->ref_lse[i]));
            return 1;
        }
    if (!z->backward) return 0;
    /* both backwards from the reference's O and LSE */
    ours.o = ref.o, ours.lse = ref.lse, ours.dout = ref.dout = z->dout.data;
    ours.dq = z->dq.data, ours.dk = z->dk.data, ours.dv = z->dv.data;
    ref.dq = z->ref_dq.data, ref.dk = z->ref_dk.data, ref.dv = z->ref_dv.data;
    ref.dq_layout = z->ref_dq.layout, ref.dk_layout = z->ref_dk.layout;
    ref.dv_layout = z->ref_dv.layout;
    ours.o_layout = ref.o_layout = z->ref_o.layout;
    if ((s = fa_cpu_backward(&ours, &z->opt)) != FA_OK || (s = fa_ref_backward(&ref)) != FA_OK) {
        fz_describe(z, fa_status_string(s), 0.0);
        return 1;
    }
    /* both take D = rowsum(dO O) from the same stored O; 16-bit: P and dS
       enter ours in fp32 from the stored LSE, outputs round once (2^-8), a
       few max|gradient| in all (2^-6) */
    tol = ours.dtype == FA_DTYPE_F32 ? 1e-3 : 1.0 / 64;
    if ((err = fz_compare(&z->dq, &z->ref_dq, ours.dtype, b, nq, hq, d, tol)) > 1.0 ||
        (err = fz_compare(&z->dk, &z->ref_dk, ours.dtype, b, nk, hk, d, tol)) > 1.0 ||
        (err = fz_compare(&z->dv, &z->ref_dv, ours.dtype, b, nk, hk, dv, tol)) > 1.0) {
        fz_describe(z, "backward gradients", err);
        return 1;
    }
    return 0;
}

/* One bad variant of a valid problem: its status, and o, lse, dq (filled
   with a pattern first) untouched. 0 when it holds. */
static int fz_bad(fz_problem *z)
{
    fa_params p = z->p;
    const int which = fz_int(0, 13);
    const fa_status want[] = {FA_ERR_NULL_POINTER, FA_ERR_NULL_POINTER, FA_ERR_INVALID_SIZE,
                              FA_ERR_INVALID_SIZE, FA_ERR_INVALID_HEADS, FA_ERR_INVALID_ARGUMENT,
                              FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_ARGUMENT,
                              FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_LAYOUT, FA_ERR_INVALID_LAYOUT,
                              FA_ERR_INVALID_SIZE, FA_ERR_UNSUPPORTED, FA_ERR_INVALID_LAYOUT};
    const int backward = z->backward;
    fa_status s;
    memset(z->o.data, 0xA5, z->o.bytes);
    memset(z->lse, 0xA5, sizeof(float) * (size_t)p.batch * p.heads_q * p.seqlen_q);
    p.o = z->o.data, p.lse = z->lse;
    if (backward) {
        memset(z->dq.data, 0xA5, z->dq.bytes);
        p.dout = z->dout.data, p.dq = z->dq.data, p.dk = z->dk.data, p.dv = z->dv.data;
    }
    switch (which) {
    case 0: p.q = NULL; break;
    case 1: p.v = NULL; break;
    case 2: p.seqlen_k = -fz_int(0, 5); break;
    case 3: p.head_dim = 0; break;
    case 4: p.heads_q = p.heads_kv * 2 + 1, p.heads_kv = p.heads_kv * 2; break;
    case 5: p.dtype = (fa_dtype)9; break;
    case 6: p.scale = -1.0f; break;
    case 7: p.softcap = INFINITY; break;
    case 8: p.num_splits = FA_MAX_PARTS + 1; break;
    case 9: p.k_layout.seq = p.head_dim > 1 ? p.head_dim - 1 : 0, p.k_layout.head = 0; break;
    case 10: p.o = (void *)p.v, p.o_layout = p.v_layout; break;
    case 11: p.seqlen_q = FA_MAX_SEQLEN + fz_int(1, 1000); break;
    case 12: p.head_dim = FA_MAX_HEAD_DIM + fz_int(1, 100); break;
    default: { /* o starts inside q's span (a tiny q may span fewer than 4 elements) */
        const int64_t q_span = (int64_t)(p.batch - 1) * p.q_layout.batch +
                               (int64_t)(p.heads_q - 1) * p.q_layout.head +
                               (int64_t)(p.seqlen_q - 1) * p.q_layout.seq + p.head_dim;
        p.o = (char *)p.q + fa_dtype_size(p.dtype) * fz_int(0, q_span < 4 ? (int)q_span - 1 : 3);
        break;
    }
    }
    if (which == 9 && p.seqlen_k == 1 && p.heads_kv == 1) return 0; /* nothing can overlap */
    if (which == 10 && backward) p.dq = (void *)p.dout, p.dq_layout = p.dout_layout; /* o: an input */
    if (which == 13 && backward) p.dk = p.dv, p.dk_layout = p.dv_layout;
    s = backward ? fa_cpu_backward(&p, &z->opt) : fa_cpu_forward(&p, &z->opt);
    if (s != want[which]) {
        printf("FAIL bad input %d: got %s, expected %s\n", which, fa_status_string(s),
               fa_status_string(want[which]));
        fz_describe(z, "bad input", 0.0);
        return 1;
    }
    {
        const unsigned char *o = (const unsigned char *)z->o.data;
        size_t i;
        for (i = 0; i < z->o.bytes; ++i)
            if (o[i] != 0xA5) {
                fz_describe(z, "bad input wrote o", (double)which);
                return 1;
            }
        if (backward)
            for (i = 0; i < z->dq.bytes; ++i)
                if (((const unsigned char *)z->dq.data)[i] != 0xA5) {
                    fz_describe(z, "bad input wrote dq", (double)which);
                    return 1;
                }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    const uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : (uint64_t)time(NULL);
    const clock_t start = clock();
    long valid = 0, bad = 0;
    fz_state = seed * 2654435761u + 1;
    printf("fuzz seed %llu (fuzz SECONDS SEED repeats it)\n", (unsigned long long)seed);
    while ((double)(clock() - start) / CLOCKS_PER_SEC < seconds) {
        fz_problem z;
        int failed;
        fz_make(&z);
        failed = fz_valid(&z) || fz_bad(&z);
        fz_free(&z);
        if (failed) return 1;
        ++valid, ++bad;
    }
    printf("%ld valid problems, %ld bad inputs: 0 failures\n", valid, bad);
    return 0;
}
