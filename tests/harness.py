"""A very small test runner: register functions, run them, count results."""
import os
import sys
import time
import traceback

TESTS = []


class Skip(Exception):
    """Raised by a test that cannot run here; the message says why."""


def test(fn):
    """Registers fn as a test under its own name."""
    TESTS.append((fn.__name__, fn, (), {}))
    return fn


def case(name, fn, *args, **kwargs):
    """Registers fn(*args, **kwargs) as a test called name."""
    TESTS.append((name, fn, args, kwargs))


def run(pattern=None):
    """Runs the tests whose names start with pattern, or (pattern @FILE) the
    ones FILE names, a name a line."""
    passed = failed = skipped = 0
    names = None
    if pattern and pattern.startswith("@"):
        with open(pattern[1:]) as f:
            names = set(f.read().split())
    for name, fn, args, kwargs in TESTS:
        if names is not None and name not in names or \
                names is None and pattern and not name.startswith(pattern):
            continue
        start = time.time()
        try:
            detail = fn(*args, **kwargs)
        except Skip as why:
            skipped += 1
            print(f"SKIP {name}: {why}", flush=True)
            continue
        except Exception:  # noqa: BLE001 - any failure is a test failure
            failed += 1
            print(f"FAIL {name}\n" + traceback.format_exc(), flush=True)
            continue
        passed += 1
        extra = f" {detail}" if detail else ""
        print(f"PASS {name} ({time.time() - start:.2f}s){extra}", flush=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped", flush=True)
    if passed + failed + skipped == 0:
        print(f"no test name starts with {pattern!r}" if names is None else
              f"no test is named in {pattern[1:]}", flush=True)
        return False
    return failed == 0


def seed():
    value = int(os.environ.get("FA_TEST_SEED", str(int(time.time() * 1000) % 2**31)))
    print(f"random seed {value} (set FA_TEST_SEED={value} to repeat)", flush=True)
    return value


def main(modules):
    """Runs the tests whose names start with argv[1] (all without it; @FILE:
    those FILE names); with --list PREFIX, prints those names instead."""
    listing = len(sys.argv) > 1 and sys.argv[1] == "--list"
    pattern = sys.argv[2 if listing else 1] if len(sys.argv) > (2 if listing else 1) else None
    for module in modules:
        __import__(module)
    if listing:
        print("\n".join(name for name, *_ in TESTS if not pattern or name.startswith(pattern)))
        sys.exit(0)
    sys.exit(0 if run(pattern) else 1)
