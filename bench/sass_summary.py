"""Sums an ncu per-SASS-line export by opcode, by stall reason and by how
often each line ran per warp (a profiling aid, never a benchmark).

Usage:
  ncu --section SourceCounters --section WarpStateStats -k regex:NAME -o REP \
      python3 bench/profile_gpu.py ...
  ncu -i REP.ncu-rep -k regex:NAME --page source --csv --print-source sass > lines.csv
  python3 bench/sass_summary.py lines.csv WARPS [TOP]
WARPS: the launch's warps (CTAs x warps per CTA), so that counts read per warp;
a line run once per key tile then shows as the number of key tiles. TOP: also
list the TOP lines with the most stall samples, in address order."""
import collections
import csv
import sys


def number(cell):
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path, warps = sys.argv[1], int(sys.argv[2])
    rows = list(csv.reader(open(path, errors="replace")))
    head = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    cols = rows[head]
    source, executed = cols.index("Source"), cols.index("Instructions Executed")
    stalls = cols.index("Warp Stall Sampling (All Samples)")
    by_op, by_runs, stall_by_op = collections.Counter(), collections.Counter(), collections.Counter()
    # ncu may print the listing more than once: the first block only
    end = next((i for i in range(head + 1, len(rows)) if rows[i] == cols), len(rows))
    lines = [r for r in rows[head + 1:end] if len(r) > max(source, executed, stalls)]
    for r in lines:
        words = r[source].split()
        if not words:
            continue
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
        n = number(r[executed])
        by_op[op] += n
        stall_by_op[op] += number(r[stalls])
        if n:
            by_runs[round(n / warps, 1)] += n
    total, samples = sum(by_op.values()), max(sum(stall_by_op.values()), 1.0)
    print(f"{path}: {total:.0f} warp instructions, {total / warps:.0f} per warp; "
          f"{samples:.0f} stall samples")
    print("opcode     per warp   share of stall samples")
    for op, n in by_op.most_common(30):
        print(f"  {op:10s} {n / warps:9.1f}   {100 * stall_by_op[op] / samples:5.1f}%")
    reasons = [(c, i) for i, c in enumerate(cols) if c.startswith("stall_") and "(" not in c]
    if reasons:
        sums = {c: sum(number(r[i]) for r in lines if len(r) > i) for c, i in reasons}
        print("stall reasons: share of the samples (sum " + f"{sum(sums.values()):.0f})")
        for c, n in sorted(sums.items(), key=lambda x: -x[1])[:12]:
            print(f"  {c[6:]:18s} {100 * n / samples:5.1f}%")
    print("runs per warp: instructions per warp from lines run that often")
    for runs, n in sorted(by_runs.items()):
        print(f"  x{runs:7.1f}: {n / warps:9.1f}")
    if len(sys.argv) > 3:
        top = sorted(range(len(lines)), key=lambda i: -number(lines[i][stalls]))[:int(sys.argv[3])]
        print(f"the {len(top)} lines with the most stall samples (line, share, per warp, SASS)")
        for i in sorted(top):
            r = lines[i]
            print(f"  {i:5d} {100 * number(r[stalls]) / samples:5.2f}% {number(r[executed]) / warps:9.1f}"
                  f"  {r[source].strip()[:90]}")


if __name__ == "__main__":
    main()
