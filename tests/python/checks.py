"""What the client test scripts share: running their checks and reporting each one."""

import sys
import traceback


def run_checks(checks, arg, label):
    """Run every check on `arg`, print PASS or FAIL (with the traceback) for each and a
    summary line, and exit non-zero if any failed."""
    passed = failed = 0
    for fn in checks:
        try:
            fn(arg)
            passed += 1
            print(f"PASS {fn.__name__}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {fn.__name__}", flush=True)
            traceback.print_exc(file=sys.stdout)
    print(f"{label}: {passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)
