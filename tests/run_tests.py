"""Test driver: `make test` runs this. Optional arguments: prefixes of the
test names to run, or @FILE (the names FILE lists, one a line); a test runs
when any argument picks it, and an argument that picks none is a failure.
`--list PREFIX...` prints the names instead. Ends with the line `N passed,
N failed, N skipped`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

if __name__ == "__main__":
    seed = harness.seed()
    import test_cpu  # noqa: E402

    test_cpu.RNG_SEED[0] = seed
    harness.main(["test_build", "test_cpu", "test_gpu", "test_fp8", "test_varlen", "test_paged",
                 "test_context"])
