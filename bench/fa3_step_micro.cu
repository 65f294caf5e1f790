/* mkdir -p build && nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -DFA_HEAD_DIM=64 -DFA_CUDA_DTYPE=2 -o build/fa3_step_micro bench/fa3_step_micro.cu

   The key step of the d = 64 FA3 forward's short tile without its memory
   pipeline (a profiling aid for bench/NOTES.md, never a test): K, V and Q
   sit in shared memory from the start, nothing is loaded or stored, and
   each consumer warpgroup runs the step's instructions ITERS times:
   S = Q K^T (4 SS wgmma m64n128k16), O += P V (8 RS wgmma m64n64k16) and
   the softmax of the 64 x 128 S tile (the speculative exps against the
   running max and row sums, or with -DMICRO_SPEC=0 the row max first; O's
   rescale, P packed); PV and the softmax by the kernel's own functions. Prints, per
   configuration, the clock cycles one iteration takes in each warpgroup (132 CTAs, one per
   SM, %clock64 around the loop). Roles per warpgroup:
     step     S(n) issued with PV(n - 1), wait for S, softmax, wait for PV,
              rescale and pack (the kernel's overlap loop);
     softmax  the softmax, rescale and pack alone;
     gemms    the two GEMMs and their wait alone.
   "ping-pong" adds the kernel's turn barriers between the step warpgroups,
   "sync/k" a barrier of both step warpgroups every k iterations. With
   -DMICRO_MBAR_WAITS=1 each step first waits twice on an mbarrier long
   complete, one wait after the other; with -DMICRO_MBAR_WAITS=2 both at
   once (fa_i_mbar_wait2), as the kernel's step waits for its K and V. */
#define FLASHATTN_IMPLEMENTATION
#define FLASHATTN_CUDA_IMPLEMENTATION
#include "../flashattn_cuda.cuh"

#include <stdio.h>

enum { ITERS = 512, IDLE = 0, STEP = 1, SOFTMAX = 2, GEMMS = 3, SMEM = 56 * 1024 + 1024 };

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* S = Q K^T as the kernel's fa_i_sm90_qk_bf16_1_d64 issues it, but with
   first_overwrites 0 S keeps accumulating, so that ptxas can't find it dead
   where nothing reads it (it then issues a dummy wgmma in its place); then
   the kernel's own O += P V. */
static __device__ __forceinline__ void micro_gemms(float *s, float *o, const uint32_t *pr,
                                                   uint32_t sq, uint32_t sk, uint32_t sv,
                                                   int first_overwrites)
{
    const uint64_t ad = fa_i_wgmma_desc(sq, 16, 1024), bd = fa_i_wgmma_desc(sk, 16, 1024);
    int i;
    fa_i_wgmma_fence();
#pragma unroll
    for (i = 0; i < 4; ++i)
        fa_i_wgmma_ss_bf16_n128(s, fa_i_desc_add(ad, i * 32), fa_i_desc_add(bd, i * 32),
                                i > 0 || !first_overwrites);
    fa_i_wgmma_commit();
    fa_i_sm90_pv_bf16_1_d64(o, pr, sv);
}
#endif

/* The kernel's own softmax and rescale of its short d = 64 tile (variant
   _1: 128 rows, 128 keys), unmasked. With spec (the kernel's common step
   since f37, and the default of the two-warpgroup kernel here) the
   speculative exps of S into e, which never redo after the first iteration
   (the running max does not rise); without, the softmax with the row max,
   S into P in place (-DMICRO_SPEC=0, and always with three warpgroups,
   whose 168 registers don't hold e). */
#ifndef MICRO_SPEC
#define MICRO_SPEC 1
#endif
#ifndef MICRO_MBAR_WAITS
#define MICRO_MBAR_WAITS 0
#endif
#define MICRO_SOFTMAX(s, e)                                                                      \
    (spec ? (redo = fa_i_sm90_softmax_spec_bf16_1_d64(&prm, s, e, pr, 0, 0, 0, no_range, no_range, \
                                                      log2_scale, m_run, l_run, alpha))          \
          : (fa_i_sm90_softmax_bf16_1_d64(&prm, s, 0, 0, no_range, no_range, log2_scale, m_run,  \
                                          l_run, alpha),                                         \
             0))
#define MICRO_RESCALE_PACK(s, e) fa_i_sm90_rescale_pack_bf16_1_d64(o, spec ? e : s, pr, alpha, !spec || redo)

/* roles: warpgroup w's role in bits 4w .. 4w + 3. pingpong 1: turns over
   the first `steppers` warpgroups, all of them in the STEP role; k > 1: the
   steppers meet at a barrier atop every (k - 1)-th iteration (lockstep). */
static __device__ __forceinline__ void step_micro(unsigned long long *cycles, int roles, int steppers,
                                                  int pingpong, float *sink, int spec)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint4 smem[];
    const uint32_t base = (fa_i_smem_addr(smem) + 1023) & ~1023u;
    /* from lane 0, so that ptxas treats it (and the role) as warp-uniform */
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0), role = (roles >> (4 * wg)) & 15;
    /* Q of each warpgroup (8 KB), then K and V (16 KB each), 128-byte swizzle
       layout; the values only need to be finite */
    const uint32_t sq = base + wg * 8192, sk = base + 3 * 8192, sv = sk + 16384;
    float s[64], e[64], o[32], m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f}, alpha[2];
    const int no_range[2] = {0, 0}; /* key ranges: read only by a masked tile */
    const float log2_scale = 0.18f;
    fa_params prm; /* the softmax reads only its softcap: 0 */
    uint32_t pr[32];
    unsigned long long start;
    int i, it, redo = 1, next_turn, until_sync = 1;
    for (i = threadIdx.x; i < (SMEM - 1024) / 16; i += blockDim.x) {
        const uint32_t bits = 0x3c003c00u ^ (i * 2654435761u & 0x007f007fu);
        asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(base + 16 * i), "r"(bits)
                     : "memory");
    }
#if MICRO_MBAR_WAITS
    __shared__ __align__(8) uint64_t bar_mem;
    const uint32_t bar = fa_i_smem_addr(&bar_mem);
    if (threadIdx.x == 0) {
        fa_i_mbar_init(bar, 1);
        fa_i_mbar_arrive(bar);
    }
#endif
    __syncthreads();
    memset(&prm, 0, sizeof prm);
    for (i = 0; i < 64; ++i) e[i] = s[i] = (float)((threadIdx.x * 7 + i * 13) % 17) * 0.25f;
    for (i = 0; i < 32; ++i) {
        o[i] = 1.0f;
        pr[i] = 0x3c003c00u;
    }
    alpha[0] = alpha[1] = 1.0f;
    if (role == IDLE) return;
    if (pingpong == 1 && wg == steppers - 1) fa_i_named_arrive(1, 256);
    /* found once: a modulo in the loop costs a MUFU.RCP an iteration */
    next_turn = 1 + (wg + 1) % steppers;
    start = clock64();
    /* one loop per role, each straight-line like the kernel's */
    if (role == STEP)
        for (it = 0; it < ITERS; ++it) {
            if (pingpong == 1) fa_i_named_sync(1 + wg, 256);
            if (pingpong > 1 && --until_sync == 0) { /* a countdown: no division in the loop */
                fa_i_named_sync(5, 128 * steppers);
                until_sync = pingpong - 1;
            }
#if MICRO_MBAR_WAITS == 1 /* two full-barrier waits, on a barrier long complete */
            fa_i_mbar_wait(bar, 0);
            fa_i_mbar_wait(bar, 0);
#elif MICRO_MBAR_WAITS == 2 /* the same as the kernel's step waits for its K and V */
            fa_i_mbar_wait2(bar, 0, bar, 0);
#endif
            micro_gemms(s, o, pr, sq, sk, sv, 1);
            if (pingpong == 1) fa_i_named_arrive(next_turn, 256);
            FA_I_WGMMA_WAIT(1);
            fa_i_fence_f32(s, 64);
            MICRO_SOFTMAX(s, e);
            FA_I_WGMMA_WAIT(0);
            fa_i_fence_f32(o, 32);
            fa_i_fence_u32(pr, 32);
            MICRO_RESCALE_PACK(s, e);
        }
    else if (role == GEMMS)
        for (it = 0; it < ITERS; ++it) {
            micro_gemms(s, o, pr, sq, sk, sv, 0);
            FA_I_WGMMA_WAIT(0);
            fa_i_fence_f32(s, 64);
            fa_i_fence_f32(o, 32);
        }
    else
        /* each iteration's P is the next one's S (in place, or from e back
           to s in two half iterations): nothing for ptxas to hoist */
        for (it = 0; it < ITERS; it += 2) {
            MICRO_SOFTMAX(s, e);
            MICRO_RESCALE_PACK(s, e);
            MICRO_SOFTMAX(spec ? e : s, s);
            MICRO_RESCALE_PACK(s, s);
        }
    if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 3 + wg] = clock64() - start;
    if (pingpong == 1 && wg == 0) fa_i_named_sync(1, 256); /* the last warpgroup's last arrival */
    {
        float acc = l_run[0] + l_run[1];
        for (i = 0; i < 32; ++i) acc += o[i] + (float)pr[i] + s[i] + s[i + 32] + (spec ? e[i] + e[i + 32] : 0.0f);
        if (acc == 12345.0f) *sink = acc; /* keeps the results live */
    }
#else
    (void)cycles;
    (void)roles;
    (void)steppers;
    (void)pingpong;
    (void)sink;
    (void)spec;
#endif
}

/* Two or three warpgroups: the register budgets of the kernel's two tiles
   (up to 255 and 168 here, 232 and 160 there). */
static __global__ void __launch_bounds__(256, 1)
    step_micro_2(unsigned long long *cycles, int roles, int steppers, int pingpong, float *sink)
{
    step_micro(cycles, roles, steppers, pingpong, sink, MICRO_SPEC);
}
static __global__ void __launch_bounds__(384, 1)
    step_micro_3(unsigned long long *cycles, int roles, int steppers, int pingpong, float *sink)
{
    step_micro(cycles, roles, steppers, pingpong, sink, 0);
}

int main(void)
{
    static const char *role_name[] = {"idle", "step", "softmax", "gemms"};
    /* {role of warpgroup 0, 1, 2, pingpong as in step_micro: 0 free, 1 turns, k > 1 sync/(k - 1)} */
    static const int configs[][4] = {
        {STEP, IDLE, IDLE, 0},    {STEP, STEP, IDLE, 0},     {STEP, STEP, IDLE, 1},
        {STEP, STEP, IDLE, 2},    {STEP, STEP, IDLE, 5},     {STEP, STEP, IDLE, 9},
        {STEP, STEP, STEP, 0},    {STEP, STEP, STEP, 1},     {SOFTMAX, IDLE, IDLE, 0},
        {GEMMS, IDLE, IDLE, 0},   {SOFTMAX, GEMMS, IDLE, 0}, {SOFTMAX, SOFTMAX, IDLE, 0},
        {GEMMS, GEMMS, IDLE, 0}};
    unsigned long long *cycles, host[132 * 3];
    float *sink;
    int c, w;
    if (cudaMalloc(&cycles, sizeof host) != cudaSuccess || cudaMalloc(&sink, sizeof(float)) != cudaSuccess ||
        cudaFuncSetAttribute(step_micro_2, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM) != cudaSuccess ||
        cudaFuncSetAttribute(step_micro_3, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM) != cudaSuccess) {
        printf("fa3_step_micro: no usable GPU\n");
        return 1;
    }
    for (c = 0; c < (int)(sizeof configs / sizeof configs[0]); ++c) {
        const int *k = configs[c];
        const int roles = k[0] | k[1] << 4 | k[2] << 8, steppers = (k[0] == STEP) + (k[1] == STEP) + (k[2] == STEP);
        int run;
        for (run = 0; run < 2; ++run) { /* the first run warms up */
            cudaMemset(cycles, 0, sizeof host);
            if (k[2] == IDLE)
                step_micro_2<<<132, 256, SMEM>>>(cycles, roles, steppers, k[3], sink);
            else
                step_micro_3<<<132, 384, SMEM>>>(cycles, roles, steppers, k[3], sink);
            if (cudaDeviceSynchronize() != cudaSuccess) {
                printf("fa3_step_micro: the kernel failed\n");
                return 1;
            }
        }
        cudaMemcpy(host, cycles, sizeof host, cudaMemcpyDeviceToHost);
        char how[16] = "";
        if (k[3] == 1) snprintf(how, sizeof how, "ping-pong");
        if (k[3] > 1) snprintf(how, sizeof how, "sync/%d", k[3] - 1);
        printf("%-7s %-7s %-7s %-9s:", role_name[k[0]], role_name[k[1]], role_name[k[2]], how);
        for (w = 0; w < 3; ++w)
            if (k[w] != IDLE) {
                double sum = 0.0;
                int b;
                for (b = 0; b < 132; ++b) sum += (double)host[b * 3 + w];
                printf("  wg%d %5.0f", w, sum / 132 / ITERS);
            }
        printf("  cycles an iteration\n");
    }
    return 0;
}
