import sys, numpy as np
sys.path.insert(0, "/opt/llama.cpp/source/gguf-py")
import gguf
src = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter(sys.argv[2], "granite")
for k, f in src.fields.items():
    if k.startswith("GGUF.") or k == "general.architecture":
        continue
    nk = k.replace("llama.", "granite.", 1) if k.startswith("llama.") else k
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        w.add_key_value(nk, f.contents(), t, sub_type=f.types[-1])
    else:
        w.add_key_value(nk, f.contents(), t)
w.add_float32("granite.embedding_scale", 1.5)
w.add_float32("granite.residual_scale", 1.25)
w.add_float32("granite.attention.scale", 0.1)
w.add_float32("granite.logit_scale", 0.5)
for t in src.tensors:
    d = np.array(t.data, copy=True)
    w.add_tensor(t.name, d, raw_shape=d.shape if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else None, raw_dtype=t.tensor_type)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
