"""Shared helpers for the PyTorch + PEFT reference scripts (see README.md here).

The model is loaded as the golden data (testdata/golden/lora/README.md) was made:
transformers' GGUF loader dequantizes every tensor of the GGUF to float32, the tokenizer
comes from the same GGUF, and all math is float32 on the CPU.
"""

import os
import time

# Everything is local: never ask the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

DEFAULT_MODEL = os.path.join(
    os.environ.get("BLINK_CACHE_DIR")
    or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "blink"),
    "models",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
)


def load_model(gguf_path, attn="eager", threads=2):
    """(model, tokenizer, load seconds) for a GGUF file, float32, on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    gguf_path = os.path.abspath(gguf_path)
    d, name = os.path.split(gguf_path)
    t = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32, attn_implementation=attn
    )
    return model, tok, time.perf_counter() - t


def chat_ids(tok, messages, add_generation_prompt):
    """Token ids of `messages` rendered with the GGUF's chat template (no special tokens
    added on top: this tokenizer adds no BOS)."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok(text, add_special_tokens=False)["input_ids"]


def example_with_mask(tok, messages):
    """(ids, targets) of one chat example, with Blink's assistant-only loss mask
    (crates/blink-train/src/data/tokenize.rs, golden grads.json): for each assistant turn i,
    the targets are the tokens after the generation-prompt rendering of messages[:i], up to
    and including the first end-of-turn token; everything else is not a target.
    A message with "weight": 0 is not learned from."""
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    if eot is None or eot == tok.unk_token_id:
        eot = tok.eos_token_id
    clean = [{"role": m["role"], "content": m["content"]} for m in messages]
    full = chat_ids(tok, clean, add_generation_prompt=False)
    targets = [False] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        prefix = chat_ids(tok, clean[:i], add_generation_prompt=True)
        upto = chat_ids(tok, clean[: i + 1], add_generation_prompt=False)
        if upto[: len(prefix)] != prefix:
            raise ValueError("the generation prompt's tokens are not a prefix of the reply's rendering")
        e = upto.index(eot, len(prefix))
        if full[: e + 1] != upto[: e + 1]:
            raise ValueError("a turn's tokens do not begin the whole conversation's")
        for j in range(len(prefix), e + 1):
            targets[j] = True
    return full, targets


def peak_rss_bytes():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
