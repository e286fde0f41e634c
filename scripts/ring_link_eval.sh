#!/usr/bin/env bash
# The planner against slow links (issue 23, acceptance 3), on one machine: a head and two
# nodes, every hop slowed by the link shim, the links measured with `blink profile --peer`
# (over the ring's own protocol), the ring planned from those figures, and its predicted
# time per token set against `bench --cluster`'s measured one. Then, at 10 ms a hop, the
# aggregate decode of 8 sequences with 1 and 4 steps in flight.
#
#   scripts/ring_link_eval.sh [BLINK] [MODEL]       (LATENCIES="2 10 25" by default)
set -euo pipefail
B=${1:-target/release/blink}
M=${2:-$HOME/.cache/blink/models/SmolLM2-135M-Instruct.Q4_1.gguf}
W=$(mktemp -d /tmp/blink-ring-link.XXXX)
head -c 32 /dev/urandom | base64 > "$W/ring.token"
nodes_down() { pkill -f "blink node --listen 127.0.0.1:970" 2>/dev/null || true; sleep 0.3; }
trap 'nodes_down; rm -rf "$W"' EXIT

for ms in ${LATENCIES:-2 10 25}; do
  nodes_down
  for i in 1 2; do
    ("$B" node --listen "127.0.0.1:970$i" --token-file "$W/ring.token" -m "$M" -t 1 --shim-latency-ms "$ms" > "$W/node$i.log" 2>&1 &)
  done
  sleep 1
  # This machine's profile, with the link to a node as the ring's hops see it.
  "$B" profile -m "$M" -t 1 --peer 127.0.0.1:9701 --token-file "$W/ring.token" --shim-latency-ms "$ms" > "$W/this.json"
  read -r lat mbps < <(python3 -c "import json,sys; l=json.load(open('$W/this.json'))['peers'][0]; print(l['latency_s']*1e3, l['bytes_per_s']*8/1e6)")
  # Budgets that need all three devices (the head's own tensors take 30 MB of its 50),
  # planned for the context `bench` gives its sequences (64 tokens for 32 generated).
  entry() { printf '[[device]]\n%s\nmemory = "%s"\nprofile = "this.json"\nlatency_ms = %s\nmbps = %s\n' "$1" "$2" "$lat" "$mbps"; }
  {
    echo 'token_file = "ring.token"'
    entry 'head = true' 50MB
    entry 'addr = "127.0.0.1:9701"' 25MB
    entry 'addr = "127.0.0.1:9702"' 25MB
  } > "$W/ring.toml"
  plan=$("$B" plan "$W/ring.toml" -m "$M" -c 64 --json)
  predicted=$(python3 -c "import json; p=json.loads('''$plan'''); print(p['predicted_s_per_token']*1e3)")
  windows=$(python3 -c "import json; p=json.loads('''$plan'''); print(p['windows'], p['rounds'])")
  tps=$("$B" bench --cluster "$W/ring.toml" -m "$M" -t 1 -p 0 -n 32 -r 3 --shim-latency-ms "$ms" 2>/dev/null | awk -F'|' '/tg32/ {print $5}' | awk '{print $1}')
  python3 -c "ms=$ms; lat=$lat; pred=$predicted; tps=$tps; meas=1e3/tps; print(f'{ms:>4} ms a hop (measured {lat:.2f} ms, {$mbps:.0f} Mbit/s): windows/rounds $windows, predicted {pred:.1f} ms a token, measured {meas:.1f} ms ({(pred-meas)/meas:+.0%})')"
  if [ "$ms" = 10 ]; then
    "$B" bench --cluster "$W/ring.toml" -m "$M" -t 1 -p 0 -n 32 -r 3 --batch 8 --in-flight 1,4 --shim-latency-ms "$ms" 2>/dev/null | grep -E "in-flight|tg32"
  fi
done
