#!/usr/bin/env python3
"""Greedy generation with PyTorch + PEFT (float32, CPU) from a PEFT adapter directory on the
GGUF model, for crates/blink/tests/cli_finetune_interop.rs.

    python peft_greedy.py JOB.json

JOB.json: {"model": GGUF, "adapter": DIR or null, "prompts": [TEXT, ...], "max_tokens": N,
           "threads": 2}

The model, the chat template, the adapter check and the decoding are those of
scripts/finetune_ref (common.py, peft_generate.py): the GGUF dequantized to float32 by
transformers, each prompt rendered with the GGUF's chat template and its default system turn
(as `blink run` renders it), and PeftModel.from_pretrained checked tensor by tensor (every
tensor of the file is one of the model's LoRA weights, with its shape and values, and the other
way round).

Prints one JSON line about the run (versions, tensors loaded), then one per prompt:
  {"prompt", "prompt_ids", "ids", "text", "margins", "runner_up_ids", "prefixes"}
where prefixes[i] is the text of the first i generated tokens (a character cut in two by a
token boundary left out), so that another engine's text can be compared token by token.
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "finetune_ref"))
from common import chat_ids, load_model  # noqa: E402
from peft_generate import check_adapter_loaded, greedy, stop_ids  # noqa: E402


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)

    import peft
    import torch
    import transformers

    model, tok, load_s = load_model(job["model"], threads=job.get("threads", 2))
    tensors = 0
    if job.get("adapter"):
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, job["adapter"])
        tensors = check_adapter_loaded(model, job["adapter"])
    model.eval()
    print(json.dumps({
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "adapter": job.get("adapter"),
        "adapter_tensors": tensors,
        "load_s": round(load_s, 2),
    }), flush=True)

    stop = stop_ids(tok)
    for prompt in job["prompts"]:
        ids = chat_ids(tok, [{"role": "user", "content": prompt}], add_generation_prompt=True)
        out = greedy(model, tok, ids, job["max_tokens"], stop)
        text_ids = [i for i in out["ids"] if i not in stop]
        prefixes = [tok.decode(text_ids[:i]).rstrip("\ufffd") for i in range(len(text_ids) + 1)]
        print(json.dumps({"prompt": prompt, "prompt_ids": ids, **out, "prefixes": prefixes}, ensure_ascii=False),
              flush=True)


if __name__ == "__main__":
    main()
