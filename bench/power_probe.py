"""Clock and power of each implementation under a sustained load (a probe,
not the benchmark): each runs back to back for SECONDS while nvidia-smi
samples the SM clock and the board power every 50 ms, twice over all of
them; prints TFLOP/s, the mean clock and power past the first half second,
and the first 0.8 s of samples (how fast the clock settles after a switch).
Builds as in ab_gpu.py, then PyTorch's flash and cuDNN backends.
Usage: python3 bench/power_probe.py d n causal fwd|bwd NAME=path/to/shim.so ..."""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402
import bench_gpu as bg  # noqa: E402
import fa  # noqa: E402

SECONDS = 2.5


def main():
    d, n, causal, what = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3])), sys.argv[4]
    b, h = max(1, 16384 // n), 2048 // d
    q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
    fns = {}
    for spec in sys.argv[5:]:
        name, path = spec.split("=")
        impl = bg.Ours(q, k, v, o, lse, dout, dq, dk, dv, causal, fa.load_gpu(os.path.abspath(path)))
        fns[name] = impl.forward if what == "fwd" else impl.backward
    for peer, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        got = bg.peer(backend, q, k, v, dout, causal)
        if got:
            fns[peer] = got[0] if what == "fwd" else got[1]
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    phases = []
    flops = 4.0 * b * h * n * n * d / (2 if causal else 1) * (2.5 if what == "bwd" else 1)
    for _ in range(2):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0, runs = time.time(), 0
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            while time.time() - t0 < SECONDS:
                for _ in range(5):
                    fn()
                runs += 5
                torch.cuda.synchronize()
            stop.record()
            torch.cuda.synchronize()
            phases.append((name, t0, time.time(), flops * runs / start.elapsed_time(stop) / 1e9))
    time.sleep(0.2)
    smi.terminate()
    samples = []
    for line in smi.stdout.read().splitlines():
        ts, clk, pw = [x.strip() for x in line.split(",")]
        t = time.mktime(time.strptime(ts.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + ts.split(".")[1])
        samples.append((t, float(clk), float(pw)))
    print(f"d{d} N{n} causal{int(causal)} {what}")
    for name, t0, t1, tf in phases:
        sel = [s for s in samples if t0 + 0.5 <= s[0] <= t1]  # skip the first half second
        clk = sum(s[1] for s in sel) / max(1, len(sel))
        pw = sum(s[2] for s in sel) / max(1, len(sel))
        print(f"  {name:10s} {tf:6.0f} TFLOP/s  clock {clk:6.0f} MHz  power {pw:5.0f} W  ({len(sel)} samples)")
        trace = [f"{s[0] - t0:.2f}:{s[1]:.0f}/{s[2]:.0f}" for s in samples if t0 - 0.1 <= s[0] <= t0 + 0.8]
        print("    first 0.8 s (s:MHz/W):", " ".join(trace))


if __name__ == "__main__":
    main()
