// compute-sanitizer initcheck and CUDA graphs: a kernel node writes an
// array, a memcpy node after it copies the array; does initcheck's check of
// the copy's source see the kernel's writes? No flashattn code: a plain
// kernel, run in a graph (argument 2 "graph") or on the stream.
// Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o probe bench/log/initcheck_graph_probe.cu
// Run:   compute-sanitizer --tool initcheck ./probe CTAS SPIN [graph]
// Found (H100, compute-sanitizer of CUDA 13, 2026-12-06), reports (one per
// 32-byte sector of the copy's source, "Host API memory access error ...
// Uninitialized access ... on access by cudaMemcpy source"):
//   5 CTAs, no spin, graph:          0
//   5 CTAs, 20M-clock spin, graph:   every sector (160)
//   2000 CTAs, no spin, graph:       46,052 and 50,416 of the 64,000 (two runs)
//   any of them on the stream:       0
// So the copy is checked before the kernel's writes are accounted for when
// the kernel takes long enough (a race: the count varies from run to run);
// the values copied are right. The library's
// kernels (FA1, FA2, FA3, decode) in a captured graph meet the same, and
// `--check-api-memory-access no` (the kernels' own reads still checked)
// removes the reports: bench/device_run.sh runs the graph tests so.
#include <cstdio>
#include <cstdlib>
__global__ void store(float *a, int n, long long spin)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
    if (i < n) a[i] = (float)i;
}
int main(int argc, char **argv)
{
    const int ctas = argc > 1 ? atoi(argv[1]) : 5, n = 256 * ctas, graph = argc > 3;
    const long long spin = argc > 2 ? atoll(argv[2]) : 0;
    float *a, *b, x;
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t e;
    cudaMalloc(&a, 4L * n);
    cudaMalloc(&b, 4L * n);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (graph) cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    store<<<ctas, 256, 0, s>>>(a, n, spin);
    cudaMemcpyAsync(b, a, 4L * n, cudaMemcpyDeviceToDevice, s);
    if (graph) {
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&e, g, 0);
        cudaGraphLaunch(e, s);
    }
    cudaStreamSynchronize(s);
    cudaMemcpy(&x, b + n - 1, 4, cudaMemcpyDeviceToHost);
    printf("%d CTAs, spin %lld, graph %d: b[n - 1] = %g (%s)\n", ctas, spin, graph, x,
           cudaGetErrorString(cudaGetLastError()));
    return 0;
}
