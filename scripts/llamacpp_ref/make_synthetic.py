#!/usr/bin/env python3
"""The default model's weights under another architecture, written with gguf-py as
llama.cpp's converter writes that architecture: the files llama.cpp ran for
testdata/golden/synthetic-<arch>.json (make_golden.py on each). The tests build the same
files in Rust (crates/blink/tests/support/synthetic.rs); keep the two in step.

Per architecture (tensors reused where the new one has the same shape):
  granite  keys renamed, and its four multipliers: embeddings 1.5, block outputs 1.25,
           attention scores 0.1, logits 1/0.5.
  smollm3  keys renamed; every fourth layer has no rope (llama.cpp's fixed step).
  olmo2    no pre-norms: attn_norm becomes post_attention_norm, ffn_norm post_ffw_norm;
           Q and K norms over the whole projection (attn_norm's weights, and the first
           kv-width values of ffn_norm's); output.weight is a copy of token_embd.
  gemma2   post_attention_norm and post_ffw_norm copies of the pre-norms; a sliding
           window of 16 (pattern 2), attention scores capped at 2 (low enough to
           matter with these weights), logits at 30.
  phi3     Q, K and V fused into attn_qkv, gate and up into ffn_up (gate first); rope
           factors short and long with an attention factor, trained context 2048 of an
           original 1024.

  qwen3moe, mixtral (`llama` with experts)
           the first 12 layers, each FFN eight experts with top-2 routing: expert e of
           layer l is layer (l + e) % 30's FFN, stacked in *_exps tensors; the router
           (ffn_gate_inp, F32) row e is token (1000 + 37e + l)'s embedding times 8.
           qwen3moe also has per-head Q/K norms (attn_norm's first head_dim values).

usage: make_synthetic.py ARCH DEFAULT.gguf OUT.gguf
"""
import sys

import numpy as np

sys.path.insert(0, "/opt/llama.cpp/source/gguf-py")  # the build's own gguf-py
import gguf  # noqa: E402

WINDOW = 16


def rope_factors(n, long):
    # Smooth, positive, distinct: short near 1, long growing with the dimension.
    return np.array([1.0 + 0.02 * i if long else 1.0 + 0.001 * (i % 5) for i in range(n)], dtype=np.float32)


MOE_LAYERS = 12
N_EXPERT = 8


def main():
    arch, src_path, out_path = sys.argv[1:4]
    src = gguf.GGUFReader(src_path)
    moe = arch in ("qwen3moe", "mixtral")
    file_arch = "llama" if arch == "mixtral" else arch
    w = gguf.GGUFWriter(out_path, file_arch)
    arch = file_arch
    for k, f in src.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        nk = k.replace("llama.", f"{arch}.", 1) if k.startswith("llama.") else k
        if arch == "phi3" and nk == "phi3.context_length":
            continue
        if moe and nk == f"{arch}.block_count":
            w.add_uint32(nk, MOE_LAYERS)
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(nk, f.contents(), t, sub_type=f.types[-1])
        else:
            w.add_key_value(nk, f.contents(), t)
    if arch == "granite":
        w.add_float32("granite.embedding_scale", 1.5)
        w.add_float32("granite.residual_scale", 1.25)
        w.add_float32("granite.attention.scale", 0.1)
        w.add_float32("granite.logit_scale", 0.5)
    if arch == "gemma2":
        w.add_uint32("gemma2.attention.sliding_window", WINDOW)
        w.add_float32("gemma2.attn_logit_softcapping", 2.0)
        w.add_float32("gemma2.final_logit_softcapping", 30.0)
    if moe:
        w.add_uint32(f"{arch}.expert_count", N_EXPERT)
        w.add_uint32(f"{arch}.expert_used_count", 2)
        if arch == "qwen3moe":
            w.add_uint32("qwen3moe.expert_feed_forward_length", int(src.fields["llama.feed_forward_length"].contents()))
    if arch == "phi3":
        w.add_uint32("phi3.context_length", 2048)
        w.add_uint32("phi3.rope.scaling.original_context_length", 1024)
        w.add_float32("phi3.rope.scaling.attn_factor", 1.1902380714238083)

    tensors = {t.name: t for t in src.tensors}

    def add(name, t=None, data=None, ty=None):
        t = t if t is not None else tensors[name]
        d = np.array(t.data if data is None else data, copy=True)
        ty = t.tensor_type if ty is None else ty
        quantized = ty not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor(name, d, raw_shape=d.shape if quantized else None, raw_dtype=ty)

    n_layers = int(src.fields["llama.block_count"].contents())
    kv_width = int(src.fields["llama.attention.head_count_kv"].contents()) * \
        (int(src.fields["llama.embedding_length"].contents()) // int(src.fields["llama.attention.head_count"].contents()))
    head_dim = int(src.fields["llama.embedding_length"].contents()) // int(src.fields["llama.attention.head_count"].contents())
    for t in src.tensors:
        name = t.name
        if not name.startswith("blk."):
            add(name)
            continue
        i, rest = int(name.split(".")[1]), ".".join(name.split(".")[2:])
        blk = f"blk.{i}."
        if moe:
            if i >= MOE_LAYERS:
                continue
            if rest in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
                kind = rest.split(".")[0]
                if kind == "ffn_gate":
                    embd = tensors["token_embd.weight"]
                    rows = [gguf.quants.dequantize(np.array(embd.data[1000 + 37 * e + i]), embd.tensor_type) * np.float32(8.0) for e in range(N_EXPERT)]
                    add(blk + "ffn_gate_inp.weight", t, data=np.stack(rows).astype(np.float32), ty=gguf.GGMLQuantizationType.F32)
                stack = np.stack([np.array(tensors[f"blk.{(i + e) % n_layers}.{rest}"].data) for e in range(N_EXPERT)])
                add(blk + kind + "_exps.weight", t, data=stack)
                continue
            if arch == "qwen3moe" and rest == "attn_norm.weight":
                add(name)
                add(blk + "attn_q_norm.weight", t, data=np.array(t.data)[:head_dim])
                add(blk + "attn_k_norm.weight", t, data=np.array(t.data)[:head_dim])
                continue
        if arch == "olmo2" and rest == "attn_norm.weight":
            add(blk + "post_attention_norm.weight", t)
            add(blk + "attn_q_norm.weight", t)
        elif arch == "olmo2" and rest == "ffn_norm.weight":
            add(blk + "post_ffw_norm.weight", t)
            add(blk + "attn_k_norm.weight", t, data=np.array(t.data)[:kv_width])
        elif arch == "gemma2" and rest in ("attn_norm.weight", "ffn_norm.weight"):
            add(name)
            add(blk + ("post_attention_norm.weight" if rest == "attn_norm.weight" else "post_ffw_norm.weight"), t)
        elif arch == "phi3" and rest in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight", "ffn_up.weight"):
            if rest == "attn_q.weight":
                parts = [np.array(tensors[blk + p].data) for p in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
                add(blk + "attn_qkv.weight", t, data=np.concatenate(parts, axis=0))
            elif rest == "ffn_up.weight":
                parts = [np.array(tensors[blk + p].data) for p in ("ffn_gate.weight", "ffn_up.weight")]
                add(blk + "ffn_up.weight", t, data=np.concatenate(parts, axis=0))
        else:
            add(name)
    if arch == "olmo2":
        add("output.weight", tensors["token_embd.weight"])
    if arch == "phi3":
        for name, long in (("rope_factors_long.weight", True), ("rope_factors_short.weight", False)):
            f = rope_factors(head_dim // 2, long)
            w.add_tensor(name, f)
    assert n_layers > 0
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
