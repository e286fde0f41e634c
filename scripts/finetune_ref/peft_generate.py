#!/usr/bin/env python3
"""Greedy generation with PyTorch + PEFT from a PEFT adapter directory on the GGUF model.

Checks that an adapter Blink trained (`blink finetune --out DIR`) loads in PEFT and gives the
same greedy text as `blink run --temp 0 --lora DIR`. Base weights are the GGUF's, dequantized
to float32 by transformers' GGUF loader (as testdata/golden/lora); Blink runs the Q4_1
kernels with 8-bit activations, so tokens may differ where the top-2 margin is small: the
output gives each step's margin (logit(best) - logit(second)) to judge that.

Prints one JSON line per prompt:
  {"prompt", "prompt_ids", "ids", "text", "margins", "runner_up_ids", "adapter", "model"}
`ids`/`text` are the generated tokens only, up to and including an end-of-generation token
if one came (it is left out of `text`).

  python peft_generate.py --adapter DIR [-p PROMPT ...] [--prompts-file F] [-n 16]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DEFAULT_MODEL, chat_ids, load_model  # noqa: E402


def check_adapter_loaded(model, adapter_dir):
    """Every tensor of the file is a LoRA weight of the model, with its shape and values, and
    every LoRA weight of the model came from the file (PEFT itself only warns); returns how
    many tensors the file holds."""
    import torch
    from safetensors.torch import load_file

    file = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    live = {k.replace(".default.weight", ".weight"): v for k, v in model.state_dict().items() if "lora_" in k}
    missing = sorted(set(live) - set(file))
    extra = sorted(set(file) - set(live))
    if missing or extra:
        raise SystemExit(f"adapter mismatch: {len(missing)} model LoRA tensors not in the file (e.g. {missing[:2]}), "
                         f"{len(extra)} file tensors not in the model (e.g. {extra[:2]})")
    for k, v in file.items():
        if tuple(v.shape) != tuple(live[k].shape) or not torch.equal(v.to(live[k].dtype), live[k]):
            raise SystemExit(f"adapter tensor {k}: not loaded as stored")
    print(f"peft_generate: adapter {adapter_dir}: {len(file)} tensors loaded", file=sys.stderr)
    return len(file)


def stop_ids(tok):
    """The ids that end a generation: <|im_end|>, <|endoftext|> and the tokenizer's EOS."""
    stop = set()
    for t in ("<|im_end|>", "<|endoftext|>"):
        i = tok.convert_tokens_to_ids(t)
        if i is not None and i != tok.unk_token_id:
            stop.add(i)
    if tok.eos_token_id is not None:
        stop.add(tok.eos_token_id)
    return stop


def greedy(model, tok, ids, max_new_tokens, stop, ignore_eos=False):
    """Greedy generation after the prompt `ids`: {"ids", "text", "margins", "runner_up_ids"}.
    `ids` includes an end-of-generation token if one came (`text` leaves it out); `margins[i]`
    is logit(best) - logit(second) at step i, from the raw logits."""
    import torch

    with torch.no_grad():
        g = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=None if ignore_eos else sorted(stop),
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else min(stop),
            output_logits=True,
            return_dict_in_generate=True,
        )
    out = [int(i) for i in g.sequences[0, len(ids):]]
    margins, runner_up = [], []
    for step, logits in enumerate(g.logits):  # raw logits, before any processor
        top2 = torch.topk(logits[0].float(), 2)
        if int(top2.indices[0]) != out[step]:
            raise SystemExit(f"step {step}: argmax {int(top2.indices[0])} is not the token generated, {out[step]}")
        margins.append(round(float(top2.values[0] - top2.values[1]), 4))
        runner_up.append(int(top2.indices[1]))
    text_ids = [i for i in out if i not in stop] if not ignore_eos else out
    return {"ids": out, "text": tok.decode(text_ids), "margins": margins, "runner_up_ids": runner_up}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", help="PEFT adapter directory (adapter_config.json + adapter_model.safetensors); omit for the base model")
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL, help="GGUF file (default: %(default)s)")
    ap.add_argument("-p", "--prompt", action="append", default=[], help="a user prompt (repeatable)")
    ap.add_argument("--prompts-file", help="one prompt a line, or a JSONL with a 'question' or 'prompt' field")
    ap.add_argument("--system", help="a system message (default: none, so the template's default system turn)")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=16)
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at an end-of-generation token")
    ap.add_argument("--raw", action="store_true", help="use prompts as raw text, without the chat template")
    ap.add_argument("--attn", default="eager", help="attn_implementation (default: eager, as the golden data)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    prompts = list(args.prompt)
    if args.prompts_file:
        with open(args.prompts_file) as f:
            for line in f:
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if line.lstrip().startswith("{"):
                    o = json.loads(line)
                    prompts.append(o.get("question") or o.get("prompt"))
                else:
                    prompts.append(line)
    if not prompts:
        prompts = ["What is the capital of France?"]

    model, tok, _ = load_model(args.model, attn=args.attn, threads=args.threads)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
        check_adapter_loaded(model, args.adapter)
    model.eval()

    stop = stop_ids(tok)
    for prompt in prompts:
        if args.raw:
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
        else:
            msgs = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": prompt}]
            ids = chat_ids(tok, msgs, add_generation_prompt=True)
        out = greedy(model, tok, ids, args.max_new_tokens, stop, ignore_eos=args.ignore_eos)
        print(json.dumps({"prompt": prompt, "prompt_ids": ids, **out, "adapter": args.adapter, "model": args.model},
                         ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
