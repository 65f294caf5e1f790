/* flashattn_ref.h - v0.2.0 - the plain three-step attention algorithm, CPU.
   MIT licence, see the end of flashattn.h.

   S = scale * Q K^T (softcap, masks), P = softmax(S), O = P V, with S and P
   materialized per (batch, head) and every sum in double precision. It
   shares only the parameter validation and the storage conversions with
   flashattn.h, so it checks the tiled paths independently. Memory is
   O(Nq * Nk) doubles per call: meant for tests, not production.

   DO THIS in exactly one file, after FLASHATTN_IMPLEMENTATION is available
   (in the same file or another):
       #define FLASHATTN_REF_IMPLEMENTATION
       #include "flashattn_ref.h"
*/
#ifndef FLASHATTN_REF_H
#define FLASHATTN_REF_H

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Same contract as fa_cpu_forward / fa_cpu_backward, dense problems only
   (varlen, paged K/V: FA_ERR_UNSUPPORTED). The backward recomputes P by its
   own softmax (not from lse) and takes D = rowsum(dO * O) from the o it is
   given, as the backward's contract defines it: with 16-bit storage that o
   is rounded, and D follows it. So on one chunk pair of a sharded sequence
   its gradients are those of the chunk's own softmax, not of the whole
   sequence's (tests of a ring compare whole sequences). */
FA_API fa_status fa_ref_forward(const fa_params *p);
FA_API fa_status fa_ref_backward(const fa_params *p);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_REF_H */

#ifdef FLASHATTN_REF_IMPLEMENTATION
#ifndef FLASHATTN_REF_IMPLEMENTATION_DONE
#define FLASHATTN_REF_IMPLEMENTATION_DONE

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

static double fa_ref_get(const void *base, fa_dtype dtype, int64_t i)
{
    if (dtype == FA_DTYPE_F32) return ((const float *)base)[i];
    if (dtype == FA_DTYPE_F16) return fa_f16_to_f32(((const uint16_t *)base)[i]);
    if (dtype == FA_DTYPE_FP8_E4M3) return fa_e4m3_to_f32(((const uint8_t *)base)[i]);
    return fa_bf16_to_f32(((const uint16_t *)base)[i]);
}

static void fa_ref_put(void *base, fa_dtype dtype, int64_t i, double x)
{
    if (dtype == FA_DTYPE_F32) ((float *)base)[i] = (float)x;
    else if (dtype == FA_DTYPE_F16) ((uint16_t *)base)[i] = fa_f32_to_f16((float)x);
    else ((uint16_t *)base)[i] = fa_f32_to_bf16((float)x);
}

/* A gradient element: written, or added to the tensor's (accumulate_grads),
   in fp32 with grads_f32. */
static void fa_ref_put_grad(const fa_params *p, void *base, int64_t i, double x)
{
    const fa_dtype dt = p->grads_f32 ? FA_DTYPE_F32 : p->dtype;
    fa_ref_put(base, dt, i, p->accumulate_grads ? fa_ref_get(base, dt, i) + x : x);
}

static int64_t fa_ref_at(const fa_layout *l, int b, int h, int s)
{
    return (int64_t)b * l->batch + (int64_t)h * l->head + (int64_t)s * l->seq;
}

/* Element i of row `row` of (b, h) of a forward input, times its FP8
   descale (descales: the tensor's, of `heads` heads and seqlen rows). */
static double fa_ref_input(const fa_params *p, const void *base, const fa_layout *l,
                           const float *descales, int heads, int seqlen, int b, int h, int row,
                           int i)
{
    const double x = fa_ref_get(base, p->dtype, fa_ref_at(l, b, h, row) + i);
    if (p->dtype != FA_DTYPE_FP8_E4M3) return x;
    return x * descales[fa_i_descale_index(p->fp8_scaling, b, h, heads, seqlen, row)];
}

/* The positions as the caller gave them: the mask below applies its own
   rule rather than the one fa_params_resolve writes into them. */
static void fa_ref_own_positions(fa_params *p, const fa_params *given)
{
    p->q_position = given->q_position;
    p->k_position = given->k_position;
}

static int fa_ref_masked(const fa_params *p, int r, int c)
{
    /* query r's position minus key 0's: bottom-right, or the given positions */
    const int64_t diag = p->positions ? (int64_t)r + p->q_position - p->k_position
                                      : (int64_t)r + p->seqlen_k - p->seqlen_q;
    if (p->causal && c > diag) return 1;
    if (p->window && p->window_right >= 0 && c > diag + p->window_right) return 1;
    if (p->window && p->window_left >= 0 && c < diag - p->window_left) return 1;
    return 0;
}

/* P (softmax of the masked, capped scores) of one (b, h) into prob[Nq][Nk];
   tanh_out (optional) gets tanh(x / cap) for the softcap derivative; lse
   (optional) gets log(sum exp S) per row. Non-finite scores, as a plain
   softmax treats them: a NaN or +inf among a row's allowed scores makes
   P = NaN and LSE = NaN; -inf scores get weight 0, and a row whose allowed
   scores are all -inf (or that has none) gets P = 0, LSE = -inf. */
static void fa_ref_probs(const fa_params *p, int b, int h, double *prob, double *tanh_out,
                         double *lse)
{
    const int hk = h / (p->heads_q / p->heads_kv), d = p->head_dim;
    int r, c, i;
    for (r = 0; r < p->seqlen_q; ++r) {
        double *row = prob + (size_t)r * p->seqlen_k, max = -INFINITY, sum = 0.0;
        int nan = 0;
        for (c = 0; c < p->seqlen_k; ++c) {
            double x = 0.0;
            for (i = 0; i < d; ++i)
                x += fa_ref_input(p, p->q, &p->q_layout, p->q_descale, p->heads_q, p->seqlen_q,
                                  b, h, r, i) *
                     fa_ref_input(p, p->k, &p->k_layout, p->k_descale, p->heads_kv, p->seqlen_k,
                                  b, hk, c, i);
            x *= p->scale;
            if (p->softcap > 0.0f) {
                const double t = tanh(x / p->softcap);
                if (tanh_out) tanh_out[(size_t)r * p->seqlen_k + c] = t;
                x = p->softcap * t;
            }
            row[c] = fa_ref_masked(p, r, c) ? -INFINITY : x;
            nan |= x != x && !fa_ref_masked(p, r, c);
            if (row[c] > max) max = row[c];
        }
        if (nan || max == INFINITY) {
            for (c = 0; c < p->seqlen_k; ++c) row[c] = NAN;
            if (lse) lse[r] = NAN;
            continue;
        }
        for (c = 0; c < p->seqlen_k; ++c) {
            row[c] = max == -INFINITY ? 0.0 : exp(row[c] - max);
            sum += row[c];
        }
        for (c = 0; c < p->seqlen_k; ++c) row[c] = sum > 0.0 ? row[c] / sum : 0.0;
        if (lse) lse[r] = sum > 0.0 ? max + log(sum) : -INFINITY;
    }
}

FA_API fa_status fa_ref_forward(const fa_params *params)
{
    fa_params p;
    fa_status s = fa_params_resolve(params, FA_PASS_FORWARD, &p);
    double *prob, *lse;
    int b, h, r, c, i;
    if (s != FA_OK) return s;
    if (p.cu_seqlens_q || p.block_table) return FA_ERR_UNSUPPORTED; /* dense problems only */
    fa_ref_own_positions(&p, params);
    prob = (double *)malloc(sizeof(double) * (size_t)p.seqlen_q * p.seqlen_k);
    lse = (double *)malloc(sizeof(double) * (size_t)p.seqlen_q);
    if (!prob || !lse) {
        free(prob);
        free(lse);
        return FA_ERR_OUT_OF_MEMORY;
    }
    for (b = 0; b < p.batch; ++b)
        for (h = 0; h < p.heads_q; ++h) {
            const int hk = h / (p.heads_q / p.heads_kv);
            fa_ref_probs(&p, b, h, prob, NULL, lse);
            for (r = 0; r < p.seqlen_q; ++r) {
                for (i = 0; i < p.head_dim_v; ++i) {
                    double acc = 0.0;
                    for (c = 0; c < p.seqlen_k; ++c)
                        acc += prob[(size_t)r * p.seqlen_k + c] *
                               fa_ref_input(&p, p.v, &p.v_layout, p.v_descale, p.heads_kv,
                                            p.seqlen_k, b, hk, c, i);
                    fa_ref_put(p.o, p.o_dtype, fa_ref_at(&p.o_layout, b, h, r) + i, acc);
                }
                if (p.lse) p.lse[((size_t)b * p.heads_q + h) * p.seqlen_q + r] = (float)lse[r];
            }
        }
    free(prob);
    free(lse);
    return FA_OK;
}

FA_API fa_status fa_ref_backward(const fa_params *params)
{
    fa_params p;
    fa_status s = fa_params_resolve(params, FA_PASS_BACKWARD, &p);
    const size_t nqk = params ? (size_t)params->seqlen_q * params->seqlen_k : 0;
    double *prob, *dprob, *th, *dk, *dv, *dq;
    int b, h, hk, r, c, i;
    if (s != FA_OK) return s;
    if (p.cu_seqlens_q || p.block_table) return FA_ERR_UNSUPPORTED; /* dense problems only */
    fa_ref_own_positions(&p, params);
    prob = (double *)malloc(sizeof(double) * nqk);
    dprob = (double *)malloc(sizeof(double) * nqk);
    th = (double *)malloc(sizeof(double) * nqk);
    dk = (double *)malloc(sizeof(double) * (size_t)p.seqlen_k * p.head_dim);
    dv = (double *)malloc(sizeof(double) * (size_t)p.seqlen_k * p.head_dim_v);
    dq = (double *)malloc(sizeof(double) * (size_t)p.head_dim);
    if (!prob || !dprob || !th || !dk || !dv || !dq) {
        s = FA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (b = 0; b < p.batch; ++b)
        for (hk = 0; hk < p.heads_kv; ++hk) {
            const int group = p.heads_q / p.heads_kv;
            memset(dk, 0, sizeof(double) * (size_t)p.seqlen_k * p.head_dim);
            memset(dv, 0, sizeof(double) * (size_t)p.seqlen_k * p.head_dim_v);
            for (h = hk * group; h < (hk + 1) * group; ++h) {
                fa_ref_probs(&p, b, h, prob, th, NULL);
                for (r = 0; r < p.seqlen_q; ++r) {
                    double *pr = prob + (size_t)r * p.seqlen_k, *dpr = dprob + (size_t)r * p.seqlen_k;
                    const int64_t qo = fa_ref_at(&p.q_layout, b, h, r);
                    const int64_t go = fa_ref_at(&p.dout_layout, b, h, r);
                    const int64_t oo = fa_ref_at(&p.o_layout, b, h, r);
                    double dsum = 0.0; /* D = rowsum(dO * O) */
                    for (i = 0; i < p.head_dim_v; ++i)
                        dsum += fa_ref_get(p.dout, p.dtype, go + i) * fa_ref_get(p.o, p.dtype, oo + i);
                    for (c = 0; c < p.seqlen_k; ++c) { /* dP = dO V^T, dV += P^T dO */
                        const int64_t vo = fa_ref_at(&p.v_layout, b, hk, c);
                        double acc = 0.0;
                        for (i = 0; i < p.head_dim_v; ++i) {
                            const double g = fa_ref_get(p.dout, p.dtype, go + i);
                            acc += g * fa_ref_get(p.v, p.dtype, vo + i);
                            dv[(size_t)c * p.head_dim_v + i] += pr[c] * g;
                        }
                        dpr[c] = acc;
                    }
                    memset(dq, 0, sizeof(double) * (size_t)p.head_dim);
                    for (c = 0; c < p.seqlen_k; ++c) { /* dS = P (dP - D), chain to x = scale q.k */
                        const int64_t ko = fa_ref_at(&p.k_layout, b, hk, c);
                        double ds = pr[c] * (dpr[c] - dsum);
                        if (p.softcap > 0.0f) {
                            const double t = th[(size_t)r * p.seqlen_k + c];
                            ds *= 1.0 - t * t;
                        }
                        ds *= p.scale;
                        for (i = 0; i < p.head_dim; ++i) {
                            dq[i] += ds * fa_ref_get(p.k, p.dtype, ko + i);
                            dk[(size_t)c * p.head_dim + i] += ds * fa_ref_get(p.q, p.dtype, qo + i);
                        }
                    }
                    for (i = 0; i < p.head_dim; ++i)
                        fa_ref_put_grad(&p, p.dq, fa_ref_at(&p.dq_layout, b, h, r) + i, dq[i]);
                }
            }
            for (c = 0; c < p.seqlen_k; ++c) {
                for (i = 0; i < p.head_dim; ++i)
                    fa_ref_put_grad(&p, p.dk, fa_ref_at(&p.dk_layout, b, hk, c) + i,
                                    dk[(size_t)c * p.head_dim + i]);
                for (i = 0; i < p.head_dim_v; ++i)
                    fa_ref_put_grad(&p, p.dv, fa_ref_at(&p.dv_layout, b, hk, c) + i,
                                    dv[(size_t)c * p.head_dim_v + i]);
            }
        }
done:
    free(prob);
    free(dprob);
    free(th);
    free(dk);
    free(dv);
    free(dq);
    return s;
}

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_REF_IMPLEMENTATION_DONE */
#endif /* FLASHATTN_REF_IMPLEMENTATION */
