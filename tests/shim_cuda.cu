/* The GPU library as one shared object for the Python test driver. The
   fa_test_gpu_* wrappers take fa_params with *host* pointers: they copy every
   tensor to the device (outputs too, so poison survives unless overwritten),
   run the library and copy every output back, whatever the status. The
   library entry points themselves (fa_cuda_*) are exported as well, for the
   benchmark, which passes device pointers. */
#define FLASHATTN_IMPLEMENTATION
#define FLASHATTN_CUDA_IMPLEMENTATION
#include "../flashattn_cuda.cuh"

#include <string.h>

extern "C" {

typedef struct mirror {
    void *host;
    void *dev;
    size_t bytes;
} mirror;

/* Elements from a tensor's first to its last element, inclusive. */
static size_t span(const fa_layout *l, int batch, int seq, int heads, int d)
{
    return (size_t)((batch - 1) * l->batch + (heads - 1) * l->head + (seq - 1) * l->seq + d);
}

static int up(mirror *m, void *host, size_t bytes)
{
    m->host = host;
    m->bytes = bytes;
    m->dev = NULL;
    if (!host) return 0;
    if (cudaMalloc(&m->dev, bytes) != cudaSuccess) return -1;
    return cudaMemcpy(m->dev, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}

static void down(mirror *m)
{
    if (m->dev) {
        if (m->host) cudaMemcpy(m->host, m->dev, m->bytes, cudaMemcpyDeviceToHost);
        cudaFree(m->dev);
    }
}

/* The per-sequence arrays (TABLE .. USED) are mirrored only with tables_on_device. */
enum { Q, K, V, O, LSE, DOUT, DQ, DK, DV, QD, KD, VD, KN, VN, TABLE, LENS, CU_Q, CU_K, USED, TENSORS };

/* Floats of an FP8 descale array of fp8_scaling's shape. */
static size_t descales(const fa_params *p, int heads, int seq)
{
    if (p->fp8_scaling == FA_FP8_SCALE_TENSOR) return 1;
    if (p->fp8_scaling == FA_FP8_SCALE_HEAD) return (size_t)p->batch * heads;
    return (size_t)p->batch * heads * ((seq + FA_FP8_BLOCK - 1) / FA_FP8_BLOCK);
}

/* Mirrors every tensor of p on the device; d holds the params with device
   pointers. Returns FA_OK or FA_ERR_CUDA. */
static fa_status mirror_all(const fa_params *p, mirror m[TENSORS], fa_params *d)
{
    const size_t es = fa_dtype_size(p->dtype), o_es = fa_dtype_size(p->o_dtype);
    const size_t g_es = p->grads_f32 ? sizeof(float) : es;
    const int fp8 = p->dtype == FA_DTYPE_FP8_E4M3, varlen = p->cu_seqlens_q != NULL;
    /* varlen: packed [total, H, d] tensors, LSE [Hq, total_q] (the totals
       given, else the host offsets' ends) */
    const int batch = varlen ? 1 : p->batch;
    const int end_q = !varlen ? 0 : p->total_q ? p->total_q : p->cu_seqlens_q[p->batch];
    const int end_k = !varlen ? 0 : p->total_k ? p->total_k : p->cu_seqlens_k[p->batch];
    const int rows_q = !varlen ? p->seqlen_q : end_q > 0 ? end_q : 1;
    const int rows_k = !varlen ? p->seqlen_k : end_k > 0 ? end_k : 1;
    /* paged: K and V are caches of pages (block_table, cache_seqlens stay in
       host memory, but for tables_on_device) */
    const int paged = p->block_table != NULL, batch_kv = paged ? p->num_pages : batch;
    const int rows_kv = paged ? p->page_size : rows_k;
    int bad = 0;
    memset(m, 0, sizeof(mirror) * TENSORS);
    *d = *p;
#define FA_TEST_UP(idx, field, batch, rows, heads, dim, size)                                \
    bad |= up(&m[idx], (void *)p->field,                                                     \
              size * span(&p->field##_layout, batch, rows, p->heads, p->dim));               \
    d->field = m[idx].dev;
    FA_TEST_UP(Q, q, batch, rows_q, heads_q, head_dim, es)
    FA_TEST_UP(K, k, batch_kv, rows_kv, heads_kv, head_dim, es)
    FA_TEST_UP(V, v, batch_kv, rows_kv, heads_kv, head_dim_v, es)
    FA_TEST_UP(O, o, batch, rows_q, heads_q, head_dim_v, o_es)
    FA_TEST_UP(DOUT, dout, batch, rows_q, heads_q, head_dim_v, es)
    FA_TEST_UP(DQ, dq, batch, rows_q, heads_q, head_dim, g_es)
    FA_TEST_UP(DK, dk, batch, rows_k, heads_kv, head_dim, g_es)
    FA_TEST_UP(DV, dv, batch, rows_k, heads_kv, head_dim_v, g_es)
    if (paged && p->seqlen_new > 0) {
        FA_TEST_UP(KN, k_new, batch, p->seqlen_new, heads_kv, head_dim, es)
        FA_TEST_UP(VN, v_new, batch, p->seqlen_new, heads_kv, head_dim_v, es)
    }
#undef FA_TEST_UP
    if (paged && p->tables_on_device) {
        bad |= up(&m[TABLE], (void *)p->block_table, sizeof(int32_t) * p->batch * p->max_pages);
        bad |= up(&m[LENS], (void *)p->cache_seqlens, sizeof(int32_t) * p->batch);
        d->block_table = (const int32_t *)m[TABLE].dev;
        d->cache_seqlens = (const int32_t *)m[LENS].dev;
    }
    if (varlen && p->tables_on_device) {
        bad |= up(&m[CU_Q], (void *)p->cu_seqlens_q, sizeof(int32_t) * (p->batch + 1));
        bad |= up(&m[CU_K], (void *)p->cu_seqlens_k, sizeof(int32_t) * (p->batch + 1));
        bad |= up(&m[USED], (void *)p->seqused_k, sizeof(int32_t) * p->batch);
        d->cu_seqlens_q = (const int32_t *)m[CU_Q].dev;
        d->cu_seqlens_k = (const int32_t *)m[CU_K].dev;
        d->seqused_k = (const int32_t *)m[USED].dev;
    }
    if (fp8) {
        bad |= up(&m[QD], (void *)p->q_descale, sizeof(float) * descales(p, p->heads_q, p->seqlen_q));
        bad |= up(&m[KD], (void *)p->k_descale, sizeof(float) * descales(p, p->heads_kv, p->seqlen_k));
        bad |= up(&m[VD], (void *)p->v_descale, sizeof(float) * descales(p, p->heads_kv, p->seqlen_k));
        d->q_descale = (const float *)m[QD].dev;
        d->k_descale = (const float *)m[KD].dev;
        d->v_descale = (const float *)m[VD].dev;
    }
    bad |= up(&m[LSE], p->lse, sizeof(float) * batch * p->heads_q * rows_q);
    d->lse = (float *)m[LSE].dev;
    return bad ? FA_ERR_CUDA : FA_OK;
}

static fa_status finish(fa_status s, mirror m[TENSORS], void *workspace)
{
    const cudaError_t e = cudaDeviceSynchronize();
    int i;
    for (i = 0; i < TENSORS; ++i) down(&m[i]);
    cudaFree(workspace);
    return s == FA_OK && e != cudaSuccess ? FA_ERR_CUDA : s;
}

/* Forward with a workspace of ws_size bytes, or of the size the library
   asks for when ws_size is (size_t)-1. */
static fa_status run_forward(const fa_params *hp, size_t ws_size)
{
    mirror m[TENSORS];
    fa_params p, d;
    void *ws = NULL;
    /* Params the GPU path refuses go to the library as they are, host
       pointers and all: it must refuse them without touching memory. */
    fa_status s = fa_cuda_supported(hp, FA_PASS_FORWARD);
    if (s != FA_OK) return fa_cuda_forward(hp, NULL, 0, 0);
    fa_params_resolve(hp, FA_PASS_FORWARD, &p);
    if ((s = mirror_all(&p, m, &d)) != FA_OK) return finish(s, m, NULL);
    if (ws_size == (size_t)-1) ws_size = fa_cuda_forward_workspace_size(&d);
    if (ws_size && cudaMalloc(&ws, ws_size) != cudaSuccess) return finish(FA_ERR_CUDA, m, NULL);
    return finish(fa_cuda_forward(&d, ws, ws_size, 0), m, ws);
}

fa_status fa_test_gpu_forward(const fa_params *hp) { return run_forward(hp, (size_t)-1); }

/* Forward with a workspace of the given size (to test the size check). */
fa_status fa_test_gpu_forward_workspace(const fa_params *hp, size_t ws_size)
{
    return run_forward(hp, ws_size);
}

size_t fa_test_gpu_forward_workspace_size(const fa_params *hp)
{
    return fa_cuda_forward_workspace_size(hp);
}

/* Backward with a workspace of ws_size bytes, or of the size the library
   asks for when ws_size is (size_t)-1. */
static fa_status run_backward(const fa_params *hp, int deterministic, size_t ws_size)
{
    mirror m[TENSORS];
    fa_params p, d;
    void *ws = NULL;
    /* fa_cuda_supported answers for the atomic mode only */
    fa_status s = deterministic ? (fa_cuda_backward_algorithm(hp, 1) ? FA_OK : FA_ERR_UNSUPPORTED)
                                : fa_cuda_supported(hp, FA_PASS_BACKWARD);
    if (s != FA_OK) return fa_cuda_backward(hp, deterministic, NULL, 0, 0); /* its refusal */
    fa_params_resolve(hp, FA_PASS_BACKWARD, &p);
    if ((s = mirror_all(&p, m, &d)) != FA_OK) return finish(s, m, NULL);
    if (ws_size == (size_t)-1) ws_size = fa_cuda_backward_workspace_size(&d, deterministic);
    if (ws_size && cudaMalloc(&ws, ws_size) != cudaSuccess) return finish(FA_ERR_CUDA, m, NULL);
    return finish(fa_cuda_backward(&d, deterministic, ws, ws_size, 0), m, ws);
}

fa_status fa_test_gpu_backward(const fa_params *hp, int deterministic)
{
    return run_backward(hp, deterministic, (size_t)-1);
}

/* Backward with dq's device copy as its workspace (to test the overlap check). */
fa_status fa_test_gpu_backward_workspace_on_dq(const fa_params *hp)
{
    mirror m[TENSORS];
    fa_params p, d;
    fa_status s = fa_params_resolve(hp, FA_PASS_BACKWARD, &p);
    if (s != FA_OK) return s;
    if ((s = mirror_all(&p, m, &d)) != FA_OK) return finish(s, m, NULL);
    return finish(fa_cuda_backward(&d, 0, d.dq, fa_cuda_backward_workspace_size(&d, 0), 0), m,
                  NULL);
}

/* Backward with a workspace of the given size (to test the size check). */
fa_status fa_test_gpu_backward_workspace(const fa_params *hp, size_t ws_size)
{
    return run_backward(hp, 0, ws_size);
}

size_t fa_test_gpu_backward_workspace_size(const fa_params *hp, int deterministic)
{
    return fa_cuda_backward_workspace_size(hp, deterministic);
}

/* 64-bit offsets: hp is a small problem (batch 1, contiguous BSHD) whose keys
   are placed at the end of `big_nk` keys, so that K, V, dK and dV each span
   more than 2^31 elements on the device; the other keys are zero and masked
   by hp's window. Runs forward and backward; copies back o, lse, dq and the
   last hp->seqlen_k rows of dk and dv. *untouched_zero says whether the
   first 4096 rows of dK and dV stayed zero. */
fa_status fa_test_gpu_far_keys(const fa_params *hp, int big_nk, int *untouched_zero)
{
    fa_params p, d;
    mirror m[TENSORS];
    const size_t row = (size_t)hp->heads_kv * hp->head_dim, es = 2;
    const size_t big = (size_t)big_nk * row * es, small = (size_t)hp->seqlen_k * row * es;
    const size_t tail = big - small;
    void *big_k = NULL, *big_v = NULL, *big_dk = NULL, *big_dv = NULL, *ws = NULL;
    uint16_t probe[4096];
    fa_status s = fa_params_resolve(hp, FA_PASS_BACKWARD, &p);
    size_t i;
    *untouched_zero = 0;
    if (s != FA_OK) return s;
    if ((s = mirror_all(&p, m, &d)) != FA_OK) return finish(s, m, NULL);
    if (cudaMalloc(&big_k, big) || cudaMalloc(&big_v, big) || cudaMalloc(&big_dk, big) ||
        cudaMalloc(&big_dv, big) || cudaMemset(big_k, 0, big) || cudaMemset(big_v, 0, big) ||
        cudaMemset(big_dk, 0, big) || cudaMemset(big_dv, 0, big) ||
        cudaMemcpy((char *)big_k + tail, hp->k, small, cudaMemcpyHostToDevice) ||
        cudaMemcpy((char *)big_v + tail, hp->v, small, cudaMemcpyHostToDevice)) {
        s = FA_ERR_CUDA;
        goto done;
    }
    d.seqlen_k = big_nk;
    d.k = big_k, d.v = big_v, d.dk = big_dk, d.dv = big_dv;
    memset(&d.k_layout, 0, sizeof(fa_layout));
    memset(&d.v_layout, 0, sizeof(fa_layout));
    memset(&d.dk_layout, 0, sizeof(fa_layout));
    memset(&d.dv_layout, 0, sizeof(fa_layout));
    s = fa_cuda_forward(&d, NULL, 0, 0);
    if (s == FA_OK) {
        const size_t n = fa_cuda_backward_workspace_size(&d, 0);
        if (cudaMalloc(&ws, n) != cudaSuccess) s = FA_ERR_CUDA;
        else s = fa_cuda_backward(&d, 0, ws, n, 0);
    }
    if (s == FA_OK && cudaDeviceSynchronize() != cudaSuccess) s = FA_ERR_CUDA;
    if (s == FA_OK) {
        *untouched_zero = 1;
        for (i = 0; i < 2; ++i) {
            size_t j;
            cudaMemcpy(probe, i ? big_dv : big_dk, sizeof probe, cudaMemcpyDeviceToHost);
            for (j = 0; j < 4096; ++j) *untouched_zero &= probe[j] == 0;
        }
        cudaMemcpy(hp->dk, (char *)big_dk + tail, small, cudaMemcpyDeviceToHost);
        cudaMemcpy(hp->dv, (char *)big_dv + tail, small, cudaMemcpyDeviceToHost);
    }
done:
    cudaFree(big_k), cudaFree(big_v), cudaFree(big_dk), cudaFree(big_dv);
    { /* the small K, V, dK and dV mirrors stood in for the big buffers: drop them */
        const int unused[4] = {K, V, DK, DV};
        for (i = 0; i < 4; ++i) cudaFree(m[unused[i]].dev), m[unused[i]].dev = NULL;
    }
    return finish(s, m, ws);
}

/* fa_cuda_combine on host tensors: every part, o (in place where o is part
   0) and lse mirrored on the device, then o and lse copied back. */
fa_status fa_test_gpu_combine(const fa_combine_params *hp)
{
    fa_combine_params p, d;
    const void *o_dev[FA_MAX_PARTS];
    const float *lse_dev[FA_MAX_PARTS];
    mirror parts[FA_MAX_PARTS], lses[FA_MAX_PARTS], o, lse;
    size_t part_bytes, o_bytes, lse_bytes;
    int i, bad = 0, in_place;
    fa_status s = fa_combine_resolve(hp, &p);
    if (s != FA_OK) return fa_cuda_combine(hp, 0); /* refused: it must not touch memory */
    in_place = p.o == p.o_parts[0];
    part_bytes = fa_dtype_size(p.part_dtype) * span(&p.part_layout, p.batch, p.seqlen, p.heads, p.head_dim);
    o_bytes = fa_dtype_size(p.dtype) * span(&p.o_layout, p.batch, p.seqlen, p.heads, p.head_dim);
    lse_bytes = sizeof(float) * p.batch * p.heads * p.seqlen;
    memset(parts, 0, sizeof parts), memset(lses, 0, sizeof lses), memset(&o, 0, sizeof o);
    memset(&lse, 0, sizeof lse);
    for (i = 0; i < p.num_parts; ++i) {
        bad |= up(&parts[i], (void *)p.o_parts[i], part_bytes);
        bad |= up(&lses[i], (void *)p.lse_parts[i], lse_bytes);
        o_dev[i] = parts[i].dev, lse_dev[i] = (const float *)lses[i].dev;
    }
    if (!in_place) bad |= up(&o, p.o, o_bytes);
    bad |= up(&lse, p.lse, lse_bytes);
    d = p;
    d.o_parts = o_dev, d.lse_parts = lse_dev;
    d.o = in_place ? parts[0].dev : o.dev;
    d.lse = (float *)lse.dev;
    s = bad ? FA_ERR_CUDA : fa_cuda_combine(&d, 0);
    if (s == FA_OK && cudaDeviceSynchronize() != cudaSuccess) s = FA_ERR_CUDA;
    down(&o), down(&lse);
    for (i = 0; i < p.num_parts; ++i) {
        if (i == 0 && in_place) down(&parts[0]);
        else cudaFree(parts[i].dev);
        cudaFree(lses[i].dev);
    }
    return s;
}

/* A CUDA graph of library calls on a stream of its own. */
typedef struct captured {
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} captured;

/* d's forward (and with backward its backward), captured into g's graph,
   instantiated. ws holds the larger of the two workspaces. Returns the
   library's status (a capture the runtime refuses: FA_ERR_CUDA). */
static fa_status capture(const fa_params *d, int backward, int deterministic, void *ws,
                         size_t fwd_bytes, size_t bwd_bytes, captured *g)
{
    fa_status s = FA_OK;
    memset(g, 0, sizeof *g);
    if (cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeGlobal) != cudaSuccess)
        return FA_ERR_CUDA;
    s = fa_cuda_forward(d, ws, fwd_bytes, g->stream);
    if (s == FA_OK && backward) s = fa_cuda_backward(d, deterministic, ws, bwd_bytes, g->stream);
    if (cudaStreamEndCapture(g->stream, &g->graph) != cudaSuccess && s == FA_OK) s = FA_ERR_CUDA;
    if (s == FA_OK && cudaGraphInstantiate(&g->exec, g->graph, 0) != cudaSuccess) s = FA_ERR_CUDA;
    return s;
}

/* g's stream synchronized, g released; s, or FA_ERR_CUDA where the stream failed. */
static fa_status release(captured *g, fa_status s)
{
    if (g->stream && cudaStreamSynchronize(g->stream) != cudaSuccess && s == FA_OK) s = FA_ERR_CUDA;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    if (g->stream) cudaStreamDestroy(g->stream);
    cudaGetLastError();
    return s;
}

/* Forward then backward captured into a CUDA graph, the graph launched
   twice: outputs copied back as the other wrappers do. */
fa_status fa_test_gpu_graph(const fa_params *hp, int deterministic)
{
    mirror m[TENSORS];
    fa_params p, d;
    void *ws = NULL;
    size_t fwd_bytes, bwd_bytes;
    captured g;
    fa_status s = fa_params_resolve(hp, FA_PASS_BACKWARD, &p);
    int i;
    memset(&g, 0, sizeof g);
    if (s != FA_OK) return s;
    if ((s = mirror_all(&p, m, &d)) != FA_OK) return finish(s, m, NULL);
    fwd_bytes = fa_cuda_forward_workspace_size(&d);
    bwd_bytes = fa_cuda_backward_workspace_size(&d, deterministic);
    if (cudaMalloc(&ws, fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes) != cudaSuccess) s = FA_ERR_CUDA;
    if (s == FA_OK) s = capture(&d, 1, deterministic, ws, fwd_bytes, bwd_bytes, &g);
    for (i = 0; i < 2 && s == FA_OK; ++i)
        if (cudaGraphLaunch(g.exec, g.stream) != cudaSuccess) s = FA_ERR_CUDA;
    return finish(release(&g, s), m, ws);
}

/* A forward with tables_on_device (paged or varlen) captured into a CUDA
   graph and launched twice: first over hp's arrays, its O and LSE copied
   into first_o and first_lse (hp's o and lse shapes), then, with the
   arrays second[] gives (block_table, cache_seqlens, cu_seqlens_q,
   cu_seqlens_k, seqused_k; NULL: as they were) written over the device
   copies between the launches, over those, its results in hp's o and lse
   as the other wrappers return them. */
fa_status fa_test_gpu_tables_graph(const fa_params *hp, const int32_t *const *second,
                                   void *first_o, float *first_lse)
{
    mirror m[TENSORS];
    fa_params p, d;
    void *ws = NULL;
    size_t bytes;
    captured g;
    fa_status s = fa_params_resolve(hp, FA_PASS_FORWARD, &p);
    int i;
    memset(&g, 0, sizeof g);
    if (s == FA_OK && !p.tables_on_device) s = FA_ERR_INVALID_ARGUMENT;
    if (s != FA_OK) return s;
    if ((s = mirror_all(&p, m, &d)) != FA_OK) return finish(s, m, NULL);
    bytes = fa_cuda_forward_workspace_size(&d);
    if (bytes && cudaMalloc(&ws, bytes) != cudaSuccess) s = FA_ERR_CUDA;
    if (s == FA_OK) s = capture(&d, 0, 0, ws, bytes, 0, &g);
    if (s == FA_OK && (cudaGraphLaunch(g.exec, g.stream) != cudaSuccess ||
                       cudaStreamSynchronize(g.stream) != cudaSuccess ||
                       cudaMemcpy(first_o, m[O].dev, m[O].bytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
                       (m[LSE].dev && cudaMemcpy(first_lse, m[LSE].dev, m[LSE].bytes,
                                                 cudaMemcpyDeviceToHost) != cudaSuccess)))
        s = FA_ERR_CUDA;
    for (i = TABLE; i <= USED; ++i) {
        if (s == FA_OK && second[i - TABLE] && m[i].dev &&
            cudaMemcpy(m[i].dev, second[i - TABLE], m[i].bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            s = FA_ERR_CUDA;
        m[i].host = NULL; /* hp's arrays stay as they were */
    }
    if (s == FA_OK && cudaGraphLaunch(g.exec, g.stream) != cudaSuccess) s = FA_ERR_CUDA;
    return finish(release(&g, s), m, ws);
}

static __global__ void fa_test_trap(void) { __trap(); }

/* Run in a process of its own (it ruins the context): a valid forward after
   a kernel fault left a sticky error (*sticky), and one on a destroyed
   stream (*bad_stream), each as the library reports it. */
void fa_test_gpu_faults(const fa_params *hp, int *sticky, int *bad_stream)
{
    mirror m[TENSORS];
    fa_params p, d;
    cudaStream_t stream;
    *sticky = *bad_stream = 1;
    if (fa_params_resolve(hp, FA_PASS_FORWARD, &p) != FA_OK || mirror_all(&p, m, &d) != FA_OK)
        return;
    if (cudaStreamCreate(&stream) == cudaSuccess && cudaStreamDestroy(stream) == cudaSuccess)
        *bad_stream = fa_cuda_forward(&d, NULL, 0, stream);
    fa_test_trap<<<1, 1>>>();
    cudaDeviceSynchronize();
    *sticky = fa_cuda_forward(&d, NULL, 0, 0);
}

/* Compute capability of the current device as 10 * major + minor, or 0. */
int fa_test_gpu_cc(void)
{
    int dev, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return 0;
    return 10 * major + minor;
}

int fa_test_gpu_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
/* fa_cuda_quantize_fp8 with host pointers: x, out and descale mirrored
   (out and descale copied back whatever the status). */
fa_status fa_test_gpu_quantize(const fa_quantize_params *hp)
{
    mirror m[3];
    fa_quantize_params p, d;
    fa_status s = fa_quantize_resolve(hp, &p);
    const size_t blocks = (size_t)(p.seqlen + FA_FP8_BLOCK - 1) / FA_FP8_BLOCK;
    int bad = 0, i;
    if (s != FA_OK || p.scaling != FA_FP8_SCALE_BLOCK) return fa_cuda_quantize_fp8(hp, 0);
    d = p;
    bad |= up(&m[0], (void *)p.x,
              fa_dtype_size(p.dtype) * span(&p.x_layout, p.batch, p.seqlen, p.heads, p.head_dim));
    bad |= up(&m[1], p.out, span(&p.out_layout, p.batch, p.seqlen, p.heads, p.head_dim));
    bad |= up(&m[2], p.descale, sizeof(float) * p.batch * p.heads * blocks);
    d.x = m[0].dev, d.out = m[1].dev, d.descale = (float *)m[2].dev;
    s = bad ? FA_ERR_CUDA : fa_cuda_quantize_fp8(&d, 0);
    if (cudaDeviceSynchronize() != cudaSuccess && s == FA_OK) s = FA_ERR_CUDA;
    m[0].host = NULL; /* x is not copied back */
    cudaFree(m[0].dev);
    m[0].dev = NULL;
    for (i = 0; i < 3; ++i) down(&m[i]);
    return s;
}
}
