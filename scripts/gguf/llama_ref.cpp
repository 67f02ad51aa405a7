// llama.cpp's answers on a GGUF file, for slimkv's goldens (scripts/gguf/make_fixtures.py). Built
// against libllama by scripts/gguf/build_llama_tools.sh; not part of slimkv.
//   llama_ref MODEL.gguf OUT.f32 TOKEN...   logits of every position of one prefill of TOKENs:
//                                              [n_tokens, n_vocab] little-endian float32
//   llama_ref --tokenize MODEL.gguf < TEXT  the ids of TEXT as a JSON list (no BOS/EOS added,
//                                              special tokens in the text matched)
//   llama_ref --quantize IN.gguf OUT.gguf TYPE   llama_model_quantize (what llama-quantize runs) to
//                                              Q8_0, Q4_0 or Q4_K_M
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "llama.h"

static llama_model* load(const char* path, bool vocab_only) {
  llama_model_params params = llama_model_default_params();
  params.vocab_only = vocab_only;
  llama_model* model = llama_model_load_from_file(path, params);
  if (!model) {
    std::fprintf(stderr, "llama_ref: cannot load %s\n", path);
    std::exit(1);
  }
  return model;
}

int main(int argc, char** argv) {
  llama_backend_init();
  if (!std::getenv("LLAMA_LOGITS_VERBOSE")) llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  if (argc == 5 && std::string(argv[1]) == "--quantize") {
    llama_model_quantize_params params = llama_model_quantize_default_params();
    const std::string type = argv[4];
    params.ftype = type == "Q8_0" ? LLAMA_FTYPE_MOSTLY_Q8_0 : type == "Q4_0" ? LLAMA_FTYPE_MOSTLY_Q4_0
                 : type == "Q4_K_M" ? LLAMA_FTYPE_MOSTLY_Q4_K_M : LLAMA_FTYPE_GUESSED;
    if (params.ftype == LLAMA_FTYPE_GUESSED) {
      std::fprintf(stderr, "llama_ref: unknown type %s (Q8_0, Q4_0, Q4_K_M)\n", argv[4]);
      return 2;
    }
    params.nthread = 2;
    return llama_model_quantize(argv[2], argv[3], &params) == 0 ? 0 : 1;
  }
  if (argc == 3 && std::string(argv[1]) == "--tokenize") {
    llama_model* model = load(argv[2], true);
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const std::string text(std::istreambuf_iterator<char>(std::cin), {});
    std::vector<llama_token> ids(text.size() + 8);
    const int n = llama_tokenize(vocab, text.data(), int(text.size()), ids.data(), int(ids.size()), false, true);
    if (n < 0) return 1;
    std::printf("[");
    for (int i = 0; i < n; ++i) std::printf(i ? ", %d" : "%d", ids[size_t(i)]);
    std::printf("]\n");
    llama_model_free(model);
    return 0;
  }
  if (argc < 4) {
    std::fprintf(stderr, "usage: llama_ref MODEL.gguf OUT.f32 TOKEN... | --tokenize MODEL.gguf < TEXT | --quantize IN OUT TYPE\n");
    return 2;
  }
  llama_model* model = load(argv[1], false);
  std::vector<llama_token> tokens;
  for (int i = 3; i < argc; ++i) tokens.push_back(std::atoi(argv[i]));
  llama_context_params params = llama_context_default_params();
  params.n_ctx = 512;
  params.n_batch = params.n_ubatch = 512;
  params.n_threads = params.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, params);
  llama_batch batch = llama_batch_init(int(tokens.size()), 0, 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = int(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = int(tokens.size());
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_ref: llama_decode failed\n");
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::FILE* out = std::fopen(argv[2], "wb");
  for (size_t i = 0; i < tokens.size(); ++i) std::fwrite(llama_get_logits_ith(ctx, int(i)), 4, size_t(n_vocab), out);
  std::fclose(out);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
