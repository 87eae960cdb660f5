// A forward-cost probe for llama.cpp-family engines, linked against one engine's own libllama
// (mainline llama.cpp, or ik_llama.cpp with -DRAGSPEC_IK): what `ragspec bench-engine` measures
// for these anchors, the same way it measures ragspec.
//
//   anchor_probe MODEL.gguf THREADS CONTEXT MAX_TOKENS [REPACK]
//
// Loads the model with the engine's default model and context parameters (flash attention and
// micro-batch as its tools default them), except: n_ctx fits CONTEXT + MAX_TOKENS, n_batch is
// CONTEXT (the prefill is one llama_decode call), THREADS for one and many tokens, and REPACK=1
// asks ik_llama.cpp for its run-time repacking (what its `-rtr 1` sets). Then answers commands
// on stdin, one per line, with one line on stdout:
//   prefill      clear the cache, decode CONTEXT fixed pseudo-random tokens -> seconds
//   step K       decode K new tokens after the CONTEXT cached ones, logits for every one of the
//                K positions (what a speculative verify needs) and their argmax read back, then
//                drop them from the cache again -> seconds
//   rss          resident memory of this process -> MB
//   info         the engine's system info line
//   quit
// Seconds are measured here, around llama_decode and the read-back only (no pipe in between).
// Anything else it has to say goes to stderr.

#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

volatile long sink = 0;

double rss_mb() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
    }
    return 0.0;
}

void drop_from(llama_context * ctx, int pos) {
#ifdef RAGSPEC_IK
    llama_kv_cache_seq_rm(ctx, 0, pos, -1);
#else
    llama_memory_seq_rm(llama_get_memory(ctx), 0, pos, -1);
#endif
}

// Decode `ids` at positions start.. with logits for every row; the argmax of each row is read
// (a verify compares them with the draft). Returns the seconds it took, or -1 on failure.
double decode(llama_context * ctx, llama_batch & batch, const std::vector<llama_token> & ids,
              int start, bool all_logits, int vocab) {
    batch.n_tokens = static_cast<int32_t>(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        batch.token[i] = ids[i];
        batch.pos[i] = start + static_cast<int>(i);
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all_logits || i + 1 == ids.size();
    }
    const double t0 = now();
    if (llama_decode(ctx, batch) != 0) return -1.0;
    long checksum = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (!batch.logits[i]) continue;
        const float * row = llama_get_logits_ith(ctx, static_cast<int32_t>(i));
        int best = 0;
        for (int v = 1; v < vocab; ++v) best = row[v] > row[best] ? v : best;
        checksum += best;
    }
    const double seconds = now() - t0;
    sink += checksum;  // the read-back is not optimised away
    return seconds;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s MODEL.gguf THREADS CONTEXT MAX_TOKENS [REPACK]\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    const int threads = std::atoi(argv[2]), context = std::atoi(argv[3]);
    const int max_tokens = std::atoi(argv[4]);
    const bool repack = argc > 5 && std::atoi(argv[5]) != 0;
    if (threads < 1 || context < 1 || max_tokens < 1) {
        std::fprintf(stderr, "THREADS, CONTEXT and MAX_TOKENS must be positive\n");
        return 2;
    }
    llama_backend_init();
    const double rss_before = rss_mb();
    const double t_load = now();
    llama_model_params mparams = llama_model_default_params();
#ifdef RAGSPEC_IK
    mparams.repack_tensors = repack;
#else
    if (repack) std::fprintf(stderr, "REPACK applies to ik_llama.cpp only; ignored\n");
#endif
    llama_model * model = llama_model_load_from_file(path, mparams);
    if (model == nullptr) {
        std::fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = static_cast<uint32_t>(context + max_tokens + 8);
    cparams.n_batch = static_cast<uint32_t>(context > max_tokens ? context : max_tokens);
    cparams.n_threads = threads;
    cparams.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        std::fprintf(stderr, "cannot create a context for %s\n", path);
        return 1;
    }
    const double load_seconds = now() - t_load;
    const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_batch batch = llama_batch_init(static_cast<int32_t>(cparams.n_batch), 0, 1);

    unsigned state = 12345u;  // a fixed LCG: the same "prompt" and inputs on every engine
    auto next_token = [&]() {
        state = state * 1664525u + 1013904223u;
        return static_cast<llama_token>(3 + (state >> 8) % static_cast<unsigned>(vocab - 3));
    };
    std::vector<llama_token> prompt(context);
    for (auto & t : prompt) t = next_token();
    std::vector<std::vector<llama_token>> inputs(max_tokens + 1);
    for (int k = 1; k <= max_tokens; ++k) {
        for (int i = 0; i < k; ++i) inputs[k].push_back(next_token());
    }
    std::printf("ready %.6f %.3f\n", load_seconds, rss_before);
    std::fflush(stdout);

    bool filled = false;
    std::string command;
    while (std::cin >> command) {
        if (command == "prefill") {
            drop_from(ctx, 0);
            const double s = decode(ctx, batch, prompt, 0, false, vocab);
            filled = s >= 0;
            std::printf("%.9f\n", s);
        } else if (command == "step") {
            int k = 0;
            std::cin >> k;
            if (!filled || k < 1 || k > max_tokens) {
                std::printf("-1\n");
            } else {
                const double s = decode(ctx, batch, inputs[k], context, true, vocab);
                drop_from(ctx, context);
                std::printf("%.9f\n", s);
            }
        } else if (command == "rss") {
            std::printf("%.3f\n", rss_mb());
        } else if (command == "info") {
            std::printf("%s\n", llama_print_system_info());
        } else if (command == "quit") {
            break;
        } else {
            std::printf("-1\n");
        }
        std::fflush(stdout);
    }
    llama_batch_free(batch);
    llama_free(ctx);
#ifdef RAGSPEC_IK
    llama_free_model(model);
#else
    llama_model_free(model);
#endif
    llama_backend_free();
    return 0;
}
