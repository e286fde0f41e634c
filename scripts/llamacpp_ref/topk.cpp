// Greedy decode with llama.cpp's library, printing per step the chosen token and the top-K
// log-probabilities (to see near-ties).  Build: see README.md.
// usage: llama-topk MODEL PROMPT_FILE N [K] [LORA_FILE]
// env LORA_SCALE=S: adapter scale (default 1); UBATCH=N: micro-batch size (default llama.cpp's, 512);
// SWA_FULL=1: keep every position in sliding-window layers (llama.cpp's --swa-full).
//   PROMPT_FILE is used byte for byte (no newline stripped); tokenized with special tokens parsed.
// Output: one JSON object per step on stdout: {"step":i,"id":..,"piece":..,"top":[[id,logprob,piece],..]}
#include "llama.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string piece(const llama_vocab * v, llama_token t) {
    char buf[256];
    int n = llama_token_to_piece(v, t, buf, sizeof buf, 0, true);
    return n < 0 ? std::string() : std::string(buf, n);
}
static std::string js(const std::string & s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { o += '\\'; o += c; }
        else if (c == '\n') o += "\\n";
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o += c;
    }
    return o + "\"";
}
static void quiet(ggml_log_level lvl, const char * text, void *) { if (lvl >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr); }

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODEL PROMPT_FILE N [K] [LORA]\n", argv[0]); return 2; }
    const int n_gen = atoi(argv[3]);
    const int K = argc > 4 ? atoi(argv[4]) : 5;
    const char * lora = argc > 5 ? argv[5] : nullptr;
    std::ifstream f(argv[2], std::ios::binary); std::stringstream ss; ss << f.rdbuf(); std::string prompt = ss.str();

    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.progress_callback = [](float, void *) { return true; };
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_threads = 2; cp.n_threads_batch = 2;
    if (getenv("UBATCH")) cp.n_ubatch = atoi(getenv("UBATCH"));
    if (getenv("SWA_FULL")) cp.swa_full = atoi(getenv("SWA_FULL")) != 0;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (lora) {
        llama_adapter_lora * a = llama_adapter_lora_init(model, lora);
        if (!a) { fprintf(stderr, "lora load failed\n"); return 1; }
        float scale = getenv("LORA_SCALE") ? (float) atof(getenv("LORA_SCALE")) : 1.0f;
        llama_set_adapters_lora(ctx, &a, 1, &scale);
    }
    std::vector<llama_token> toks(prompt.size() + 16);
    int n = llama_tokenize(vocab, prompt.data(), prompt.size(), toks.data(), toks.size(), true, true);
    toks.resize(n);
    llama_batch b = llama_batch_get_one(toks.data(), n);
    const int nv = llama_vocab_n_tokens(vocab);
    llama_token cur;
    for (int step = 0; step < n_gen; step++) {
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        const float * lg = llama_get_logits_ith(ctx, -1);
        float mx = *std::max_element(lg, lg + nv);
        double z = 0; for (int i = 0; i < nv; i++) z += std::exp((double)lg[i] - mx);
        const double lz = mx + std::log(z);
        std::vector<int> idx(nv); for (int i = 0; i < nv; i++) idx[i] = i;
        std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int a, int c) { return lg[a] > lg[c]; });
        cur = idx[0];
        printf("{\"step\":%d,\"id\":%d,\"piece\":%s,\"top\":[", step, cur, js(piece(vocab, cur)).c_str());
        for (int k = 0; k < K; k++)
            printf("%s[%d,%.4f,%s]", k ? "," : "", idx[k], lg[idx[k]] - lz, js(piece(vocab, idx[k])).c_str());
        printf("]}\n"); fflush(stdout);
        if (llama_vocab_is_eog(vocab, cur)) break;
        b = llama_batch_get_one(&cur, 1);
    }
    llama_free(ctx); llama_model_free(model); llama_backend_free();
    return 0;
}
