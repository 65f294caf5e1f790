/* The CPU library as one shared object for the Python test driver: the
   implementation of flashattn.h and flashattn_ref.h, plus the layouts of
   fa_params and fa_combine_params so the driver can check its ctypes
   mirrors field by field. */
#define FLASHATTN_IMPLEMENTATION
#include "../flashattn.h"
#define FLASHATTN_REF_IMPLEMENTATION
#include "../flashattn_ref.h"

#include <string.h>

#define FA_TEST_PARAMS_FIELDS(X)                                                         \
    X(batch) X(dtype) X(heads_q) X(heads_kv) X(seqlen_q) X(seqlen_k) X(head_dim) X(scale) \
    X(causal) X(window) X(window_left) X(window_right) X(softcap) X(q) X(k) X(v) X(o)     \
    X(lse) X(q_layout) X(k_layout) X(v_layout) X(o_layout) X(dout) X(dq) X(dk) X(dv)      \
    X(dout_layout) X(dq_layout) X(dk_layout) X(dv_layout) X(num_splits)

size_t fa_test_params_size(void) { return sizeof(fa_params); }

/* offsetof(fa_params, name), or (size_t)-1 for an unknown name. */
size_t fa_test_params_offset(const char *name)
{
#define FA_TEST_FIELD(f) \
    if (strcmp(name, #f) == 0) return offsetof(fa_params, f);
    FA_TEST_PARAMS_FIELDS(FA_TEST_FIELD)
#undef FA_TEST_FIELD
    return (size_t)-1;
}

#define FA_TEST_COMBINE_FIELDS(X)                                                       \
    X(num_parts) X(batch) X(heads) X(seqlen) X(head_dim) X(part_dtype) X(o_parts)       \
    X(lse_parts) X(part_layout) X(dtype) X(o) X(o_layout) X(lse)

size_t fa_test_combine_params_size(void) { return sizeof(fa_combine_params); }

size_t fa_test_combine_params_offset(const char *name)
{
#define FA_TEST_FIELD(f) \
    if (strcmp(name, #f) == 0) return offsetof(fa_combine_params, f);
    FA_TEST_COMBINE_FIELDS(FA_TEST_FIELD)
#undef FA_TEST_FIELD
    return (size_t)-1;
}

/* The query rows that may see keys [c0, c1), for the mask test. */
void fa_test_rows_seeing_keys(const fa_params *p, int c0, int c1, int *first, int *last)
{
    fa_i_rows_seeing_keys(p, c0, c1, first, last);
}

/* The CPU path's exp2 over one row (vector lanes, then the scalar tail), for
   the test that measures its error in ulps. */
float fa_test_exp_row(float *row, int n, float max) { return fa_i_exp_row(row, n, max); }
