#!/usr/bin/env python3
"""Run each `question` of a JSONL file through greedy.sh and count answers containing `expect` (case-insensitive).
usage: eval-jsonl.py FILE.jsonl [greedy.sh args...]   e.g.  eval-jsonl.py zorbania-eval.jsonl -n 32 --lora adapter.gguf
Prints one JSON line per question, then a summary line."""
import json, os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
path, extra = sys.argv[1], sys.argv[2:]
hits = total = 0
for line in open(path, encoding="utf-8"):
    if not line.strip():
        continue
    ex = json.loads(line)
    out = subprocess.run([os.path.join(here, "greedy.sh"), *extra, ex["question"]],
                         check=True, capture_output=True, text=True).stdout
    ok = ex["expect"].lower() in out.lower()
    hits += ok; total += 1
    print(json.dumps({"question": ex["question"], "expect": ex["expect"], "hit": ok, "answer": out}, ensure_ascii=False), flush=True)
print(json.dumps({"hits": hits, "total": total}))
