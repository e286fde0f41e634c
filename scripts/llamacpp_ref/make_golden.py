#!/usr/bin/env python3
"""Reference outputs of llama.cpp for a model other than the default, in the golden format
of testdata/golden/README.md: tokenize, greedy (with top-2 margins and the exact text owed)
and perplexity cases. Needs the build of README.md (llama-tokenize, llama-topk,
llama-perplexity in /opt/llama.cpp/build/bin, or the build in $LLAMA_BIN).

usage: make_golden.py MODEL.gguf OUT.json [--ppl-text FILE] [--ctx 512] [--cases-from GOLDEN.json]

--cases-from takes the tokenize texts, greedy prompts and chat cases (their rendered
prompts) of an existing golden file instead of the lists below, so a file made elsewhere
(the shared set's default model) can be made again by another build of llama.cpp.
"""
import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import tempfile

BIN = os.environ.get("LLAMA_BIN", "/opt/llama.cpp/build/bin")
TOKENIZE = ["The capital of France is", "Hello, world! 123", "  multiple   spaces\tand\nnewlines",
            "naïve café — 東京 🚀", "<start_of_turn>user\nHi<end_of_turn>\n", "1234567890 3.14159",
            "Don't stop: it's 9:45pm!", ""]
GREEDY = ["The capital of France is", "Once upon a time, there was a little", "def fibonacci(n):",
          "The three primary colors are", "Water boils at a temperature of",
          "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"]
N_PREDICT = 32
NEAR_TIE = 0.01


def run(args, **kw):
    # Pieces may be parts of a UTF-8 sequence: kept as surrogates until they are joined.
    return subprocess.run(args, check=True, capture_output=True, **kw).stdout.decode("utf-8", "surrogateescape")


def text_of(pieces):
    """The pieces' bytes joined, then read as UTF-8 (invalid sequences replaced), as a
    terminal shows a program's output."""
    return "".join(pieces).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def tokenize(model, text):
    # Special tokens parsed, BOS as the model's metadata asks (llama-tokenize's defaults).
    out = run([f"{BIN}/llama-tokenize", "-m", model, "-p", text, "--ids", "--log-disable"])
    return json.loads(out.strip().splitlines()[-1])


def end_ids(model):
    """The ids generation stops at: EOS and the end-of-turn tokens the vocabulary has."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(BIN.rstrip("/")), "..", "source", "gguf-py"))
    import gguf
    r = gguf.GGUFReader(model)
    ids = {int(r.fields["tokenizer.ggml.eos_token_id"].contents())}
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    ids |= {i for i, t in enumerate(tokens) if t in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>")}
    return ids


def greedy(model, prompt, n_predict=N_PREDICT):
    with tempfile.NamedTemporaryFile("w", delete=False) as f:
        f.write(prompt)
    try:
        lines = run([f"{BIN}/llama-topk", model, f.name, str(n_predict), "2"]).splitlines()
    finally:
        os.unlink(f.name)
    steps = [json.loads(l) for l in lines if l.startswith("{")]
    # Generation stops at an end token: its id is kept, its text left out.
    ends = end_ids(model)
    stop = next((i for i, s in enumerate(steps) if s["id"] in ends), None)
    if stop is not None:
        steps = steps[:stop + 1]
        steps[stop]["piece"] = ""
    ids = [s["id"] for s in steps]
    margins = [round(s["top"][0][1] - s["top"][1][1], 4) for s in steps]
    owed = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(steps))
    return ids, margins, owed, [s["piece"] for s in steps]


def perplexity(model, text_file, ctx):
    out = subprocess.run([f"{BIN}/llama-perplexity", "-m", model, "-f", text_file, "-c", str(ctx), "-t", "2"],
                         capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    return {"ctx": ctx, "ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)), "chunks": int(chunks.group(1))}


def chat(model, case):
    """A chat case of the shared format, greedy on its rendered prompt (an end token is
    counted in `completion_tokens`, as llama-server counts it, its text left out)."""
    ids, margins, owed, pieces = greedy(model, case["rendered_prompt"], case["max_tokens"])
    stopped = ids[-1] in end_ids(model)
    return {**{k: case[k] for k in ("messages", "max_tokens", "temperature", "rendered_prompt")},
            "prompt_tokens": len(tokenize(model, case["rendered_prompt"])),
            "completion_tokens": len(ids), "text": text_of(pieces),
            "finish_reason": "stop" if stopped else "length", "exact_tokens_owed": owed,
            "exact_text_owed": text_of(pieces[:owed]), "top2_logprob_margin": margins}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--ppl-text")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--long-prompt-chars", type=int, default=0,
                    help="also a greedy case whose prompt is the first N characters of the perplexity text")
    ap.add_argument("--cases-from", help="an existing golden file whose cases to run again")
    ap.add_argument("--reference", default="llama.cpp 0c1e57098 (vendored in llama-cpp-python 0.3.36), CPU build, 2 threads",
                    help="the file's reference line (name the build)")
    a = ap.parse_args()
    texts, prompts, chats = list(TOKENIZE), list(GREEDY), []
    if a.cases_from:
        old = json.load(open(a.cases_from, encoding="utf-8"))
        texts = [c["text"] for c in old["tokenize"]]
        prompts = [c["prompt"] for c in old["greedy"]]
        chats = old.get("chat", [])
    elif a.long_prompt_chars and a.ppl_text:
        prompts.append(open(a.ppl_text, encoding="utf-8").read()[:a.long_prompt_chars])
    sha = hashlib.sha256(open(a.model, "rb").read()).hexdigest()
    doc = {"reference": a.reference,
           "model_sha256": sha, "tokenize": [], "greedy": [], "perplexity": []}
    for text in texts:
        doc["tokenize"].append({"text": text, "ids": tokenize(a.model, text) if text else []})
    for prompt in prompts:
        ids, margins, owed, pieces = greedy(a.model, prompt)
        doc["greedy"].append({"prompt": prompt, "prompt_ids": tokenize(a.model, prompt), "n_predict": N_PREDICT,
                              "ids": ids, "text": text_of(pieces), "top2_logprob_margin": margins,
                              "exact_tokens_owed": owed, "exact_text_owed": text_of(pieces[:owed])})
    if a.ppl_text:
        case = perplexity(a.model, a.ppl_text, a.ctx)
        doc["perplexity"].append({"name": os.path.basename(a.ppl_text), **case})
    if chats:
        doc["chat"] = [chat(a.model, c) for c in chats]
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
