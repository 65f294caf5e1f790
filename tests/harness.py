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


def _selection(selectors):
    """{selector: the set of test names it picks}: a name prefix, or @FILE
    (the names FILE lists, one a line)."""
    picked = {}
    for sel in selectors:
        if sel.startswith("@"):
            with open(sel[1:]) as f:
                names = set(f.read().split())
            picked[sel] = {name for name, *_ in TESTS if name in names}
        else:
            picked[sel] = {name for name, *_ in TESTS if name.startswith(sel)}
    return picked


def run(selectors=()):
    """Runs the tests that some selector picks (_selection); every test
    without selectors. Fails where a selector picks no test (a typo would
    otherwise pass as 0 failed)."""
    passed = failed = skipped = 0
    picked = _selection(selectors)
    unused = {sel for sel in selectors if not picked[sel]}
    for name, fn, args, kwargs in TESTS:
        hits = {sel for sel in selectors if name in picked[sel]}
        if selectors and not hits:
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
    for sel in sorted(unused):
        print(f"no test is named in {sel[1:]}" if sel.startswith("@") else
              f"no test name starts with {sel!r}", flush=True)
    return failed == 0 and not unused


def seed():
    value = int(os.environ.get("FA_TEST_SEED", str(int(time.time() * 1000) % 2**31)))
    print(f"random seed {value} (set FA_TEST_SEED={value} to repeat)", flush=True)
    return value


def main(modules):
    """Runs the tests the arguments pick (run's selectors; all without any);
    with --list SELECTOR..., prints the names they pick instead."""
    listing = len(sys.argv) > 1 and sys.argv[1] == "--list"
    selectors = sys.argv[2 if listing else 1:]
    for module in modules:
        __import__(module)
    if listing:
        picked = set().union(*_selection(selectors).values())
        print("\n".join(name for name, *_ in TESTS if not selectors or name in picked))
        sys.exit(0)
    sys.exit(0 if run(selectors) else 1)
