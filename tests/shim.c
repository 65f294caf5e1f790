/* The CPU library as one shared object for the Python test driver: the
   implementation of flashattn.h and flashattn_ref.h, plus the layouts of
   fa_params, fa_combine_params and fa_quantize_params so the driver can
   check its ctypes mirrors field by field. */
#define FLASHATTN_IMPLEMENTATION
#include "../flashattn.h"
#define FLASHATTN_REF_IMPLEMENTATION
#include "../flashattn_ref.h"

#include <string.h>

#define FA_TEST_PARAMS_FIELDS(X)                                                         \
    X(batch) X(dtype) X(heads_q) X(heads_kv) X(seqlen_q) X(seqlen_k) X(head_dim)       \
    X(head_dim_v) X(scale) X(causal) X(window) X(window_left) X(window_right) X(softcap)  \
    X(q) X(k) X(v) X(o)                                                                  \
    X(lse) X(q_layout) X(k_layout) X(v_layout) X(o_layout) X(dout) X(dq) X(dk) X(dv)      \
    X(dout_layout) X(dq_layout) X(dk_layout) X(dv_layout) X(num_splits) X(o_dtype)      \
    X(fp8_scaling) X(q_descale) X(k_descale) X(v_descale) X(cu_seqlens_q) X(cu_seqlens_k)  \
    X(seqused_k) X(total_q) X(total_k) X(block_table) X(max_pages) X(page_size)           \
    X(num_pages) X(cache_seqlens) X(tables_on_device) X(k_new) X(v_new) X(k_new_layout)  \
    X(v_new_layout) X(seqlen_new) X(positions)                                           \
    X(q_position) X(k_position) X(accumulate_grads) X(grads_f32)
#define FA_TEST_COMBINE_FIELDS(X)                                                       \
    X(num_parts) X(batch) X(heads) X(seqlen) X(head_dim) X(part_dtype) X(o_parts)       \
    X(lse_parts) X(part_layout) X(dtype) X(o) X(o_layout) X(lse) X(accumulate)
#define FA_TEST_QUANTIZE_FIELDS(X)                                                      \
    X(batch) X(heads) X(seqlen) X(head_dim) X(dtype) X(x) X(x_layout) X(out) X(out_layout) \
    X(descale) X(scaling) X(hadamard) X(hadamard_seed) X(pow2_descale)

/* fa_test_<stem>_size() = sizeof(type); fa_test_<stem>_offset(name) =
   offsetof(type, name), or (size_t)-1 for an unknown name. */
#define FA_TEST_LAYOUT_OF(stem, type, FIELDS)                                           \
    size_t fa_test_##stem##_size(void) { return sizeof(type); }                         \
    size_t fa_test_##stem##_offset(const char *name)                                    \
    {                                                                                   \
        FIELDS(FA_TEST_FIELD_##stem)                                                    \
        return (size_t)-1;                                                              \
    }
#define FA_TEST_FIELD_params(f) if (strcmp(name, #f) == 0) return offsetof(fa_params, f);
#define FA_TEST_FIELD_combine_params(f) \
    if (strcmp(name, #f) == 0) return offsetof(fa_combine_params, f);
#define FA_TEST_FIELD_quantize_params(f) \
    if (strcmp(name, #f) == 0) return offsetof(fa_quantize_params, f);
FA_TEST_LAYOUT_OF(params, fa_params, FA_TEST_PARAMS_FIELDS)
FA_TEST_LAYOUT_OF(combine_params, fa_combine_params, FA_TEST_COMBINE_FIELDS)
FA_TEST_LAYOUT_OF(quantize_params, fa_quantize_params, FA_TEST_QUANTIZE_FIELDS)

/* Row r of (b, h) of the quantizer's input as it is before rounding to
   e4m3 (Hadamard-rotated where p asks), into row (head_dim floats). */
int fa_test_quantize_row(const fa_quantize_params *p, int b, int h, int r, float *row)
{
    fa_quantize_params q;
    if (fa_quantize_resolve(p, &q) != FA_OK) return -1;
    fa_i_quantize_row(&q, b, h, r, row);
    return 0;
}

/* The query rows that may see keys [c0, c1), for the mask test (p's sizes
   and mask; its positions as resolved). */
void fa_test_rows_seeing_keys(const fa_params *p, int c0, int c1, int *first, int *last)
{
    fa_params r = *p;
    if (!r.positions) fa_i_bottom_right(&r);
    fa_i_rows_seeing_keys(&r, c0, c1, first, last);
}

/* Whether this build's products run on the AVX-512 microkernels. */
int fa_test_cpu_avx512(void) { return FA_CPU_AVX512; }

/* The CPU path's exp2 over one row (vector lanes, then the scalar tail), for
   the test that measures its error in ulps. */
float fa_test_exp_row(float *row, int n, float max) { return fa_i_exp_row(row, n, max); }
