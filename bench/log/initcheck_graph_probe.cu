// initcheck probe (NOTES.md, fourteenth session): does compute-sanitizer's
// initcheck see what the forward kernel wrote when the kernel runs in a CUDA
// graph? Forward (B 1, H 4, Nq 300, Nk 500, d 128, bf16, causal), then a
// device copy of its LSE (or, with a third argument, of O).
// Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -DFA_HEAD_DIM=128 \
//   -DFA_CUDA_DTYPE=2 [-DFA_SM90=0] -o probe bench/log/initcheck_graph_probe.cu
// Run:   compute-sanitizer --tool initcheck ./probe [graph [forward|fill|local [o]]]
// 2026-12-06, H100: forward in a graph 150 reports (FA3 and FA2 builds, LSE
// or O); outside a graph, the library's fill kernel or a local kernel in
// the graph: 0. The values copied are right in every mode.
#define FLASHATTN_IMPLEMENTATION
#define FLASHATTN_CUDA_IMPLEMENTATION
#include "../../flashattn_cuda.cuh"
#include <cstdio>
#include <cstring>
__global__ void fill(unsigned short *x, long n) { long i = blockIdx.x * (long)blockDim.x + threadIdx.x; if (i < n) x[i] = 0x3c00 + (unsigned short)(i % 97); }
__global__ void setf(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = 2.5f; }
int main(int argc, char **argv) {
    const int graph = argc > 1; cudaStream_t st; cudaGraph_t g; cudaGraphExec_t e;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    const int H = 4, nq = 300, nk = 500, d = 128;
    void *q, *k, *v, *o, *ws; float *lse, *lse2; size_t wsb;
    cudaMalloc(&q, 2L * nq * H * d); cudaMalloc(&k, 2L * nk * H * d); cudaMalloc(&v, 2L * nk * H * d);
    cudaMalloc(&o, 2L * nq * H * d); cudaMalloc(&lse, 4L * nq * H); cudaMalloc(&lse2, 4L * nq * H);
    fill<<<(nq * H * d + 255) / 256, 256>>>((unsigned short *)q, (long)nq * H * d);
    fill<<<(nk * H * d + 255) / 256, 256>>>((unsigned short *)k, (long)nk * H * d);
    fill<<<(nk * H * d + 255) / 256, 256>>>((unsigned short *)v, (long)nk * H * d);
    fa_params p; memset(&p, 0, sizeof p);
    p.batch = 1; p.heads_q = p.heads_kv = H; p.seqlen_q = nq; p.seqlen_k = nk; p.head_dim = d;
    p.dtype = FA_DTYPE_BF16; p.causal = 1; p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
    wsb = fa_cuda_forward_workspace_size(&p); cudaMalloc(&ws, wsb ? wsb : 16);
    cudaDeviceSynchronize();
    if (graph) cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
    /* mode: forward (default), fill (the library's fill kernel writes the
       LSE, through fa_i_launch), local (a kernel of this file, <<<>>>) */
    const char *mode = argc > 2 ? argv[2] : "forward";
    fa_status s = FA_OK;
    if (!strcmp(mode, "forward")) s = fa_cuda_forward(&p, ws, wsb, st);
    if (!strcmp(mode, "fill")) { fa_layout l; l.batch = 0; l.head = nq; l.seq = 1; s = fa_i_fill(lse, &l, nq, H, 1, FA_DTYPE_F32, 1.5f, st); }
    if (!strcmp(mode, "local")) setf<<<(nq * H + 255) / 256, 256, 0, st>>>(lse, nq * H);
    if (argc > 3) /* O's first 4 nq H bytes instead of the LSE */
        cudaMemcpyAsync(lse2, o, 4L * nq * H, cudaMemcpyDeviceToDevice, st);
    else
        cudaMemcpyAsync(lse2, lse, 4L * nq * H, cudaMemcpyDeviceToDevice, st);
    if (graph) { cudaStreamEndCapture(st, &g); cudaGraphInstantiate(&e, g, 0); cudaGraphLaunch(e, st); }
    cudaStreamSynchronize(st);
    float x; cudaMemcpy(&x, lse2 + 7, 4, cudaMemcpyDeviceToHost);
    printf("status %d (%s), lse[7] = %g, %s\n", (int)s, fa_last_error_detail(), x, cudaGetErrorString(cudaGetLastError()));
    return 0;
}
