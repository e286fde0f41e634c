#!/usr/bin/env python3
"""Training-speed reference: LoRA fine-tuning with PyTorch + PEFT, float32, on the CPU.

The setting mirrors `blink finetune`'s defaults on the default model:
- Model: the GGUF (default SmolLM2-135M-Instruct Q4_1) loaded by transformers' GGUF loader,
  every tensor dequantized to float32 (as testdata/golden/lora); base weights frozen.
- Adapter: LoRA r=8, lora_alpha=16, dropout 0, on q,k,v,o,gate,up,down in every layer.
- Optimizer: torch.optim.AdamW, lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight_decay 0,
  with global-norm gradient clipping at 1.0 (Blink's --clip 1); constant rate.
- Data: rows of --data (default testdata/finetune/zorbania-train.jsonl) rendered with the
  GGUF's chat template, with Blink's assistant-only loss mask (labels -100 on everything but
  each assistant reply and its <|im_end|>), in a seeded shuffled order.
- Batches: --batch (4) sequences of --seq (128) tokens, 512 tokens a step. --pack concat
  (default) joins the examples' tokens into one stream and cuts it into 128-token rows: every
  token is a real one and attention runs across example boundaries inside a row (the usual
  Hugging Face packing). --pack pad puts one example in each row, right-padded to 128 with
  an attention mask: the step still computes 512 positions, most of them padding.
- Timing: --warmup (3) steps untimed, then --steps (10) timed steps, each forward + backward
  + clip + AdamW step. trained_tokens_per_s = batch*seq*steps / their total time;
  trained_tokens_per_s_best_step = batch*seq / the fastest step (less sensitive to other
  processes on a shared machine; step_s lists every step, loadavg_* the load around it).

Prints one JSON line (last line of stdout). peak_rss_bytes is getrusage(RUSAGE_SELF)
ru_maxrss*1024 for the whole process, so it includes the GGUF loader's transient peak;
train_peak_rss_bytes is the peak resident set during the timed steps alone (VmHWM after
resetting it through /proc/self/clear_refs; null where that is not allowed).

  python peft_bench.py [--steps 10] [--warmup 3] [--threads 2] [--pack concat|pad] [--attn sdpa|eager]
"""

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DEFAULT_MODEL, example_with_mask, load_model, peak_rss_bytes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.normpath(os.path.join(HERE, "..", "..", "testdata", "finetune", "zorbania-train.jsonl"))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def vm_kib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def batches(examples, batch, seq, pack, pad_id, seed):
    """An endless stream of (input_ids, attention_mask, labels) lists, batch rows x seq."""
    epoch = 0

    def order():
        nonlocal epoch
        idx = list(range(len(examples)))
        random.Random(seed * 1000003 + epoch).shuffle(idx)
        epoch += 1
        return idx

    if pack == "concat":
        ids, labels = [], []
        while True:
            rows = []
            while len(rows) < batch:
                while len(ids) < seq:
                    for i in order():
                        t, m = examples[i]
                        ids += t
                        labels += [tok if tgt else -100 for tok, tgt in zip(t, m)]
                rows.append((ids[:seq], [1] * seq, labels[:seq]))
                ids, labels = ids[seq:], labels[seq:]
            yield rows
    else:
        queue = []
        while True:
            rows = []
            while len(rows) < batch:
                if not queue:
                    queue = order()
                t, m = examples[queue.pop(0)]
                if len(t) > seq:
                    t, m = t[:seq], m[:seq]
                n = seq - len(t)
                rows.append((t + [pad_id] * n, [1] * len(t) + [0] * n,
                             [tok if tgt else -100 for tok, tgt in zip(t, m)] + [-100] * n))
            yield rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=4, help="sequences a step")
    ap.add_argument("--seq", type=int, default=128, help="tokens a sequence")
    ap.add_argument("--pack", choices=["concat", "pad"], default="concat")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa (transformers' default) or eager")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=None, help="default 2 x rank")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--clip", type=float, default=1.0, help="global-norm clip (0: off)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--save", help="write the trained adapter (PEFT format) to this directory")
    args = ap.parse_args()

    load_avg_start = loadavg()
    t0 = time.perf_counter()
    import torch
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(args.seed)
    model, tok, load_s = load_model(args.model, attn=args.attn, threads=args.threads)
    rss_after_load = vm_kib("VmRSS")
    peak_after_load = peak_rss_bytes()

    cfg = LoraConfig(r=args.rank, lora_alpha=args.alpha if args.alpha is not None else 2 * args.rank,
                     lora_dropout=0.0, target_modules=TARGETS, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    examples = []
    with open(args.data) as f:
        for line in f:
            if line.strip():
                examples.append(example_with_mask(tok, json.loads(line)["messages"]))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    stream = batches(examples, args.batch, args.seq, args.pack, pad_id, args.seed)

    def step(rows):
        ids = torch.tensor([r[0] for r in rows])
        mask = torch.tensor([r[1] for r in rows])
        labels = torch.tensor([r[2] for r in rows])
        a = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        b = time.perf_counter()
        out.loss.backward()
        c = time.perf_counter()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        d = time.perf_counter()
        targets = int((labels[:, 1:] != -100).sum())
        return float(out.loss.detach()), targets, b - a, c - b, d - c

    for _ in range(args.warmup):
        step(next(stream))

    hwm_reset = reset_hwm()
    fwd = bwd = optt = 0.0
    losses, step_s, targets = [], [], 0
    t_start = time.perf_counter()
    for _ in range(args.steps):
        loss, n_t, f_s, b_s, o_s = step(next(stream))
        losses.append(round(loss, 5))
        step_s.append(f_s + b_s + o_s)
        fwd, bwd, optt, targets = fwd + f_s, bwd + b_s, optt + o_s, targets + n_t
    total = time.perf_counter() - t_start
    tokens = args.batch * args.seq * args.steps

    if args.save:
        model.save_pretrained(args.save)

    s = max(args.steps, 1)
    print(json.dumps({
        "tool": "pytorch+peft",
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "batch": args.batch,
        "seq": args.seq,
        "pack": args.pack,
        "attn": args.attn,
        "threads": args.threads,
        "tokens_per_step": args.batch * args.seq,
        "trained_tokens": tokens,
        "trained_tokens_per_s": round(tokens / total, 2),
        "target_tokens_per_step": round(targets / s, 1),
        "step_s_mean": round(total / s, 4),
        "step_s_min": round(min(step_s), 4) if step_s else None,
        "step_s_median": round(sorted(step_s)[len(step_s) // 2], 4) if step_s else None,
        "trained_tokens_per_s_best_step": round(args.batch * args.seq / min(step_s), 2) if step_s else None,
        "step_s": [round(x, 3) for x in step_s],
        "fwd_s_mean": round(fwd / s, 4),
        "bwd_s_mean": round(bwd / s, 4),
        "opt_s_mean": round(optt / s, 4),
        "losses": losses,
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_rss_after_load_bytes": peak_after_load,
        "rss_after_load_bytes": rss_after_load * 1024 if rss_after_load else None,
        "train_peak_rss_bytes": vm_kib("VmHWM") * 1024 if hwm_reset and vm_kib("VmHWM") else None,
        "trainable_params": n_trainable,
        "load_s": round(load_s, 2),
        "wall_s": round(time.perf_counter() - t0, 2),
        "loadavg_start": load_avg_start,
        "loadavg_end": loadavg(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                     "python": sys.version.split()[0]},
        "model": os.path.basename(args.model),
        "data": os.path.basename(args.data),
    }), flush=True)


if __name__ == "__main__":
    main()
