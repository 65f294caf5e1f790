"""Our forward against cuDNN's as the work grows at one N (a probe, not the
benchmark): for each batch and head count, the outputs checked against
cuDNN's, then both timed in alternating rounds as in ab_gpu.py. If the ratio
moves with the size, the two differ in a per-launch cost; if it holds, in
the cost of each tile. Below ~1000 query tiles both are bound by the host.
Usage: python3 bench/batch_probe.py d n causal "B,H;B,H;..." [path/to/shim.so]
(bf16; default build: build/libflashattn_cuda_test.so)"""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402
import bench_gpu as bg  # noqa: E402
import fa  # noqa: E402

ROUNDS, REPS, WARM_S = 7, 15, 0.2


def main():
    d, n, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
    sizes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[4].split(";")]
    lib = fa.load_gpu(os.path.abspath(sys.argv[5])) if len(sys.argv) > 5 else fa.GPU
    for b, h in sizes:
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
        o, dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(4))
        lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
        ours = bg.Ours(q, k, v, o, lse, dout, dq, dk, dv, causal, lib)
        ours.forward()
        cudnn, _, ref = bg.peer(SDPBackend.CUDNN_ATTENTION, q, k, v, dout, causal)
        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 2e-2, f"B={b} H={h}: error {err:.3g} against cuDNN"
        times = bg.alternating_ms({"ours": ours.forward, "cudnn": cudnn}, ROUNDS, REPS, WARM_S)
        t_ours, t_cudnn = (statistics.median(times[x]) * 1e3 for x in ("ours", "cudnn"))
        print(f"B={b} H={h} ({b * h * -(-n // 128)} tiles of 128 rows): ours {t_ours:.1f} us,"
              f" cudnn {t_cudnn:.1f} us, ours / cudnn (speed) {t_cudnn / t_ours:.3f}", flush=True)


if __name__ == "__main__":
    main()
