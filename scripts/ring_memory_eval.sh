#!/usr/bin/env bash
# A ring under memory limits (issue 23, acceptance 2), on one machine: each process of
# the ring in a cgroup v1 memory cgroup of its own (page cache counted), against one
# process under the same limit. Needs root and cgroup v1's memory controller.
#
#   scripts/ring_memory_eval.sh [BLINK] [MODEL]
#
# The model is the default one's layers repeated 4 times (tall_model), about 2x the
# per-process limit of the first part. Prints tok/s and each cgroup's peak usage.
set -euo pipefail
B=${1:-target/release/blink}
M=${2:-$HOME/.cache/blink/models/SmolLM2-135M-Instruct.Q4_1.gguf}
W=$(mktemp -d /tmp/blink-ring-mem.XXXX)
CG=/sys/fs/cgroup/memory
cargo run --release -q -p blink-gguf --example tall_model -- "$M" "$W/tall.gguf" 4
T="$W/tall.gguf"
head -c 32 /dev/urandom | base64 > "$W/ring.token"
MB=$((1024 * 1024))

cg() { # cg NAME LIMIT_BYTES: a fresh cgroup
  rmdir "$CG/$1" 2>/dev/null || true
  mkdir "$CG/$1"
  echo "$2" > "$CG/$1/memory.limit_in_bytes"
}
in_cg() { # in_cg NAME CMD...: run CMD inside cgroup NAME
  local name=$1; shift
  sh -c 'echo $$ > '"$CG/$name"'/cgroup.procs; exec "$@"' sh "$@"
}
peak() { echo "$1 peak $(( $(cat "$CG/$1/memory.max_usage_in_bytes") / MB )) MiB of $(( $(cat "$CG/$1/memory.limit_in_bytes") / MB )) MiB, failcnt $(cat "$CG/$1/memory.failcnt")"; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

ring() { # ring LIMIT_BYTES WINDOWS ROUNDS MEMORY_FIELD: tg16 on a ring of head + 2 nodes
  local limit=$1 windows=$2 rounds=$3 mem=$4
  pkill -f "blink node --listen 127.0.0.1:95" 2>/dev/null || true
  sleep 0.3
  for i in 1 2; do
    cg "blink-ring-$i" "$limit"
    (in_cg "blink-ring-$i" "$B" node --listen "127.0.0.1:950$i" --token-file "$W/ring.token" -m "$T" -t 1 > "$W/node$i.log" 2>&1 &)
  done
  sleep 2
  cat > "$W/ring.toml" <<TOML
token_file = "ring.token"
windows = $windows
rounds = $rounds
[[device]]
head = true
$mem
[[device]]
addr = "127.0.0.1:9501"
$mem
[[device]]
addr = "127.0.0.1:9502"
$mem
TOML
  cg blink-ring-0 "$limit"
  drop_caches
  in_cg blink-ring-0 "$B" bench --cluster "$W/ring.toml" -m "$T" -t 1 -p 0 -n 16 -r 2 2>&1 | tail -1
  for i in 0 1 2; do peak "blink-ring-$i"; done
  grep -h assigned "$W"/node*.log
  # What the nodes really read from the disk, over the warm-up and the two runs' tokens.
  local read=0 pid
  for i in 1 2; do
    pid=$(pgrep -f "blink node --listen 127.0.0.1:950$i" | head -1)
    read=$((read + $(awk '/^read_bytes/ {print $2}' "/proc/$pid/io")))
  done
  echo "the nodes read $((read / MB)) MiB from the disk: $((read / MB / 48)) MiB a token of the 48 decoded"
  pkill -f "blink node --listen 127.0.0.1:95" || true
}

one() { # one LIMIT_BYTES: tg on one process under the limit (weights in the map)
  cg blink-one "$1"
  drop_caches
  in_cg blink-one "$B" bench -m "$T" -t 1 -p 0 -n 4 -r 1 --no-repack 2>&1 | grep tg || echo "(failed)"
  peak blink-one
}

echo "model: $(( $(stat -c %s "$T") / MB )) MiB"
if [ -z "${ONLY2:-}" ]; then
echo "== 1. each process limited to 150 MiB, the ring's windows resident"
ring $((150 * MB)) "[30, 45, 45]" 1 ""
echo "== 1. one process limited to 150 MiB (no repacking: the weights are the file's pages)"
one $((150 * MB))
echo "== 1. one process, no limit, no repacking (the kernels' row-major cost alone)"
one $((16 * 1024 * MB))
fi
# Three limits totalling 0.75x the model.
L2=$(( $(stat -c %s "$T") * 3 / 4 / 3 ))
echo "== 2. limits totalling 0.75x the model (3 x $((L2 / MB)) MiB), 8 rounds, nodes streaming"
ring "$L2" "${WINDOWS2:-[1, 7, 7]}" "${ROUNDS2:-8}" "memory = $((L2 * ${MEMPCT2:-80} / 100))"
# The time to read what the nodes stream each token, at the rate the disk reads the
# file after a cache drop: two readers at once (the two nodes read together), 4 MiB
# requests, each half of the file.
drop_caches
half=$(( $(stat -c %s "$T") / (8 * MB) + 1 ))
t0=$(date +%s.%N)
dd if="$T" of=/dev/null bs=4M count=$half status=none & dd if="$T" of=/dev/null bs=4M skip=$half status=none; wait
t1=$(date +%s.%N)
rate=$(python3 -c "print($(stat -c %s "$T") / ($t1 - $t0) / 2**20)")
streamed=$(grep -ho "[0-9.]* MiB a pass" "$W"/node*.log | awk '{s += $1} END {print s}')
python3 -c "r=$rate; s=$streamed; print(f'disk reads {r:.0f} MiB/s; the nodes stream {s:.1f} MiB a token: {1000*s/r:.0f} ms of reading a token')"
echo "== 2. one process limited to the total ($((3 * L2 / MB)) MiB), no repacking"
one $((3 * L2))
for c in blink-ring-0 blink-ring-1 blink-ring-2 blink-one; do rmdir "$CG/$c" 2>/dev/null || true; done
rm -rf "$W"
