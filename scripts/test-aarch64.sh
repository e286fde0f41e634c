#!/usr/bin/env bash
# Run the blink-kernels tests for aarch64 on an x86 machine: cross-compile with the GNU
# aarch64 toolchain and run the test binaries under qemu user-mode emulation. `-cpu max`
# enables the dot-product extension, so the NEON kernels run against the scalar reference.
#
# Needs: `rustup target add aarch64-unknown-linux-gnu`, `aarch64-linux-gnu-gcc` and
# `qemu-aarch64` (Debian/Ubuntu: gcc-aarch64-linux-gnu qemu-user). Extra arguments go to
# `cargo test` (e.g. a test-name filter after `--`).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in aarch64-linux-gnu-gcc qemu-aarch64; do
    if ! command -v "$tool" >/dev/null; then
        echo "test-aarch64.sh: $tool is required" >&2
        exit 1
    fi
done

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu"
# A separate target directory, so the host build is never invalidated.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/aarch64}"

cargo test --release --target aarch64-unknown-linux-gnu -p blink-kernels "$@"
