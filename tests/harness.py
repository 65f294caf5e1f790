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
    passed = failed = skipped = 0
    for name, fn, args, kwargs in TESTS:
        if pattern and not name.startswith(pattern):
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
        print(f"no test name starts with {pattern!r}", flush=True)
        return False
    return failed == 0


def seed():
    value = int(os.environ.get("FA_TEST_SEED", str(int(time.time() * 1000) % 2**31)))
    print(f"random seed {value} (set FA_TEST_SEED={value} to repeat)", flush=True)
    return value


def main(modules):
    pattern = sys.argv[1] if len(sys.argv) > 1 else None
    for module in modules:
        __import__(module)
    sys.exit(0 if run(pattern) else 1)
