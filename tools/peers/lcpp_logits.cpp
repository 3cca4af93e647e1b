// llama.cpp's own forward on a GGUF: the independent reference of the tests that compare logits,
// greedy tokens and tokenization with llama.cpp (tests/lcpp.py). Built by tools/peers.sh.
// Usage: lcpp_logits MODEL.gguf THREADS N_GREEDY id0 id1 ...   (token ids of the prompt)
// Prints the prompt's last-position logits as "LOGITS v0 v1 ..." and then N_GREEDY greedy ids as "GREEDY a b c".
// With MODE=tokenize: lcpp_logits MODEL.gguf tokenize TEXT  -> "IDS a b c" (llama.cpp's tokenizer, add_special true, parse_special false)
// With MODE=tokenize-file: lcpp_logits MODEL.gguf tokenize-file FILE  -> one "IDS ..." line per record of FILE:
//   records end in a NUL byte, each a flag byte ('1': parse_special true, '0': false) then the text
//   (add_special false, so only the text's own tokens; many texts for one model load)
// The tokenize modes load the vocabulary only (vocab_only): a file of tokenizer keys and
// general.architecture, with no hyperparameters or tensors, is enough for them.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage\n"); return 2; }
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    const std::string mode = argv[2];
    mp.vocab_only = mode == "tokenize" || mode == "tokenize-file";
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    if (mode == "tokenize-file") {
        FILE * f = fopen(argv[3], "rb");
        if (!f) { fprintf(stderr, "cannot open %s\n", argv[3]); return 1; }
        std::string all;
        char buf[65536];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, got);
        fclose(f);
        size_t at = 0;
        while (at < all.size()) {
            size_t end = all.find('\0', at);
            if (end == std::string::npos || end == at) { fprintf(stderr, "bad record at %zu\n", at); return 1; }
            const bool special = all[at] == '1';
            std::string text = all.substr(at + 1, end - at - 1);
            std::vector<llama_token> ids(text.size() + 16);
            int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), false, special);
            if (n < 0) { ids.resize(-n); n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), false, special); }
            printf("IDS");
            for (int i = 0; i < n; i++) printf(" %d", ids[i]);
            printf("\n");
            at = end + 1;
        }
        return 0;
    }
    if (mode == "tokenize") {
        std::string text = argv[3];
        std::vector<llama_token> ids(text.size() + 16);
        int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), true, false);
        if (n < 0) { ids.resize(-n); n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), true, false); }
        printf("IDS");
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
        return 0;
    }
    int threads = atoi(argv[2]), n_greedy = atoi(argv[3]);
    std::vector<llama_token> prompt;
    for (int i = 4; i < argc; i++) prompt.push_back(atoi(argv[i]));
    auto cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (prompt.size() + n_greedy + 16);
    cp.n_batch = cp.n_ctx; cp.n_ubatch = cp.n_ctx;
    cp.n_threads = threads; cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    if (llama_decode(ctx, llama_batch_get_one(prompt.data(), (int) prompt.size()))) { fprintf(stderr, "decode failed\n"); return 1; }
    float * lg = llama_get_logits_ith(ctx, -1);
    printf("LOGITS");
    for (int i = 0; i < n_vocab; i++) printf(" %.7g", lg[i]);
    printf("\nGREEDY");
    for (int s = 0; s < n_greedy; s++) {
        lg = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (int i = 1; i < n_vocab; i++) if (lg[i] > lg[best]) best = i;
        printf(" %d", best);
        if (llama_decode(ctx, llama_batch_get_one(&best, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    printf("\n");
    llama_free(ctx); llama_model_free(model);
    return 0;
}
