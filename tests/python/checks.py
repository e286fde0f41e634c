"""What the client test scripts share: running their checks and reporting each one."""

import sys
import traceback


def require_openai():
    """The official `openai` package; a missing one fails the script (exit 2) with how to
    install it, never skips it."""
    try:
        import openai
    except ImportError:
        print("FAIL: the Python package 'openai' is not installed; run "
              "`python3 -m pip install -r requirements-test.txt` (scripts/test.sh does)", file=sys.stderr)
        sys.exit(2)
    return openai


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
