#!/usr/bin/env python3
"""Golden files that hold slimkv to Hugging Face's own implementations.

Runs on the GPU machine (which has torch, transformers and tokenizers; see ../shared/GPU.md):

    python3 scripts/golden/make_golden.py --train-text DIR --out OUTDIR
    python3 scripts/golden/make_golden.py --models qwen3_bf16_tied,gemma3_sliding --out OUTDIR  (models only)

Writes under OUTDIR (mirroring tests/data/):
  tokenizers/<name>/tokenizer.json   byte-level BPE tokenizers trained by HF tokenizers on DIR's text
  tokenizers/<name>/golden.json      [{text, ids, ids_no_special, decoded, decoded_skip}] from HF
  models/<name>/                     tiny random Llama/Qwen2/Mistral/Qwen3/Qwen3-MoE/Gemma 3 checkpoints
                                     saved by transformers (MoE experts one tensor per expert, as the Hub
                                     stores them),
                                     config.json (as transformers writes it) and config.v4.json (the
                                     4.x layout of the same config), golden_tokens.txt (ids),
                                     golden_logits.npy (float32 [n_tokens, vocab], eager attention in
                                     FP32 from the stored weights), golden_greedy.json (greedy tokens)
  versions.json                      the versions of the reference tools
Everything is seeded; the weights are scaled up from transformers' tiny default init so that attention
is far from uniform (a wrong RoPE or mask then changes the logits visibly).
"""
import argparse
import json
import os
import random
import shutil
import sys
import traceback

import numpy as np

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

EDGE_TEXTS = [
    "",
    "Hello world",
    " Hello  world  ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've DON'T can't WON'T 'S 'Ll we'D",
    "1234567890 12 345 6789 3.14159 1,000,000 0x1F 007",
    "   \n\n\t\t  leading and trailing   \n",
    "line one\r\nline two\r\n\r\nline three\n",
    "def f(x):\n    return x**2  # square\n\tif x != 0: print(f'{x}')\n",
    "日本語のテキストと中文文本，还有한국어.",
    "Café naïve résumé — “quotes” ‘single’ …",
    "e\u0301 versus \u00e9 (combining vs precomposed) A\u030a \u00c5 \u212b",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🙂",
    "Ελληνικά και Русский текст и العربية والعبرية עברית",
    "<|begin_of_text|>special in text<|end_of_text|> and <|im_start|>user<|im_end|> <|endoftext|>",
    "half <|begin_of_text <|im_end|><|im_end|>adjacent<think>plain added</think>",
    "tabs\tand\u00a0nbsp\u2003em-space\u200bzero-width\ufeffbom",
    "supercalifragilisticexpialidocious " * 4,
    "$$$ %%% ^^^ &&& *** ((( ))) {{{ }}} [[[ ]]] ||| \\\\ /// ... !!! ???",
    "   ",
    "\n",
    "a\n\nb\n\n\nc \n d\t\n",
    "MixedCASE camelCaseWords snake_case_words kebab-case-words ALLCAPS",
    "Numbers in words: abc123def 4ever 2nd 3rd 100km/h 12345678901234567890",
    "Ünïcödé ÀÉÎÕÜ ß ẞ ﬁ ﬂ ligatures Ⅻ ① ² ½",
    "mathematical 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 🜁 astral plane 𠀀",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
    "of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "<s> </s> <unk> [CLS] ▁already▁metaspace ▁",
]


def random_text(seed, length):
    """A seeded mix of every character class the pre-tokenizers treat differently."""
    rng = random.Random(seed)
    pools = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  ",
             "\n", "\r\n", "\t", ".,;:!?'\"()[]{}-_/\\", "'s'll'RE", "éüñçøåß", "日本語中文", "한국어",
             "Ωλπ", "Жыз", "🙂👍🏽🚀", "\u00a0\u2003", "<|im_end|>", "<|begin_of_text|>"]
    out = []
    while sum(map(len, out)) < length:
        pool = rng.choice(pools)
        out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))) if len(pool) > 3 and
                   not pool.startswith("<") else pool)
    return "".join(out)


def training_files(train_dir):
    files = sorted(os.path.join(train_dir, f) for f in os.listdir(train_dir))
    if not files:
        sys.exit(f"no training text in {train_dir}")
    return files


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------

def make_tokenizers(train_dir):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers

    files = training_files(train_dir)
    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    made = {}

    def gpt2_bytelevel():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.train(files, trainers.BpeTrainer(vocab_size=1200, min_frequency=2, initial_alphabet=byte_alphabet,
                                             special_tokens=["<|endoftext|>"], show_progress=False))
        return tok

    def llama3_style():
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
        tok.train(files, trainers.BpeTrainer(vocab_size=2000, min_frequency=2, initial_alphabet=byte_alphabet,
                                             special_tokens=specials, show_progress=False))
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        return tok

    def qwen2_style():
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok.train(files, trainers.BpeTrainer(vocab_size=1500, min_frequency=2, initial_alphabet=byte_alphabet,
                                             special_tokens=specials, show_progress=False))
        tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                        AddedToken("</think>", special=False, normalized=False)])
        return tok

    def spm_byte_fallback():
        """SentencePiece-style BPE as Llama-2/Mistral tokenizer.json files write it: ▁ for spaces,
        byte fallback tokens <0x00>..<0xFF> in the vocabulary (not added tokens)."""
        byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
        tok.train(files, trainers.BpeTrainer(vocab_size=1500, min_frequency=2,
                                             special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                             show_progress=False))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
        spec = json.loads(tok.to_str())
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in byte_tokens]
        return Tokenizer.from_str(json.dumps(spec))

    for name, build in [("gpt2_bytelevel", gpt2_bytelevel), ("llama3_style", llama3_style),
                        ("qwen2_style", qwen2_style), ("spm_byte_fallback", spm_byte_fallback)]:
        try:
            made[name] = build()
        except Exception:
            print(f"WARNING: tokenizer {name} not made:\n{traceback.format_exc()}", flush=True)
    return made


def legacy_merges(tokenizer_json):
    """The same tokenizer with merges written as "a b" strings, as tokenizers < 0.20 saved them."""
    spec = json.loads(tokenizer_json)
    merges = spec["model"]["merges"]
    if merges and isinstance(merges[0], list) and all(" " not in a and " " not in b for a, b in merges):
        spec["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    return json.dumps(spec, ensure_ascii=False, indent=2)


def write_tokenizer_goldens(made, train_dir, out_dir):
    from tokenizers import Tokenizer

    texts = list(EDGE_TEXTS) + [random_text(seed, 600) for seed in range(6)]
    with open(training_files(train_dir)[0], encoding="utf-8", errors="replace") as f:
        texts.append(f.read()[:20000])  # a long natural text
    for name, tok in made.items():
        text_json = tok.to_str(pretty=True)
        if name == "gpt2_bytelevel":
            text_json = legacy_merges(text_json)
        tok = Tokenizer.from_str(text_json)  # goldens come from exactly the file we ship
        folder = os.path.join(out_dir, "tokenizers", name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text_json)
        rows = []
        for text in texts:
            ids = tok.encode(text, add_special_tokens=True).ids
            rows.append({"text": text, "ids": ids,
                         "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                         "decoded": tok.decode(ids, skip_special_tokens=False),
                         "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        with open(os.path.join(folder, "golden.json"), "w", encoding="utf-8") as f:
            json.dump(rows, f, ensure_ascii=False, indent=1)
        print(f"tokenizer {name}: vocab {tok.get_vocab_size()}, {len(rows)} golden texts", flush=True)


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

MODEL_SPECS = {
    # GQA 4:2, llama3 RoPE scaling, BF16 weights, untied embeddings, sharded safetensors.
    "llama_gqa_bf16": dict(
        cls="LlamaForCausalLM", dtype="bfloat16", shard="150KB",
        config=dict(model_type="llama", vocab_size=512, hidden_size=128, intermediate_size=320,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=500000.0,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=64),
                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=[2, 3])),
    # MQA (1 KV head), q/k/v biases, tied embeddings, FP32 weights.
    "qwen2_bias_tied": dict(
        cls="Qwen2ForCausalLM", dtype="float32", shard=None,
        config=dict(model_type="qwen2", vocab_size=384, hidden_size=96, intermediate_size=256,
                    num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=1,
                    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True, use_sliding_window=False, bos_token_id=None,
                    eos_token_id=0)),
    # Explicit head_dim (64, not hidden/heads = 32), GQA 4:1... of 8:2, F16 weights, default RoPE.
    "mistral_f16": dict(
        cls="MistralForCausalLM", dtype="float16", shard=None,
        config=dict(model_type="mistral", vocab_size=448, hidden_size=128, intermediate_size=288,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                    sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    # Qwen3: per-head q/k RMSNorm before RoPE, head_dim 48 with hidden 96 and 4 heads (q_dim 192 != hidden),
    # GQA 4:2, tied embeddings, BF16 weights.
    "qwen3_bf16_tied": dict(
        cls="Qwen3ForCausalLM", dtype="bfloat16", shard=None,
        config=dict(model_type="qwen3", vocab_size=352, hidden_size=96, intermediate_size=224,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True, use_sliding_window=False, bos_token_id=None,
                    eos_token_id=1)),
    # Qwen3-MoE: 8 experts, top-2, norm_topk_prob, a dense layer among sparse ones (mlp_only_layers),
    # untied embeddings, FP32.
    "qwen3_moe": dict(
        cls="Qwen3MoeForCausalLM", dtype="float32", shard=None,
        config=dict(model_type="qwen3_moe", vocab_size=320, hidden_size=64, intermediate_size=160,
                    moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[2], num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=False, use_sliding_window=False, bos_token_id=None,
                    eos_token_id=1)),
    # Qwen3-MoE variant: decoder_sparse_step 2 (layers 1 and 3 sparse), top-3 of 4 without renormalising.
    "qwen3_moe_step2": dict(
        cls="Qwen3MoeForCausalLM", dtype="float16", shard=None,
        config=dict(model_type="qwen3_moe", vocab_size=256, hidden_size=64, intermediate_size=128,
                    moe_intermediate_size=40, num_experts=4, num_experts_per_tok=3, norm_topk_prob=False,
                    decoder_sparse_step=2, mlp_only_layers=[], num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                    tie_word_embeddings=True, use_sliding_window=False, bos_token_id=None,
                    eos_token_id=1)),
    # Gemma 3 text: sliding layers (window 40, shorter than the 150 golden tokens and than a 64-token KV
    # block) interleaved with global ones, their own RoPE bases, linear RoPE scaling on global layers,
    # query_pre_attn_scalar 24 != head_dim, GQA 4:2, tied embeddings, FP32 (√hidden is then FP32 in both).
    "gemma3_sliding": dict(
        cls="Gemma3ForCausalLM", dtype="float32", shard=None, greedy_prompt=60,
        config=dict(model_type="gemma3_text", vocab_size=384, hidden_size=96, intermediate_size=192,
                    num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    query_pre_attn_scalar=24, sliding_window=40,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                 "sliding_attention", "full_attention"],
                    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    rope_local_base_freq=10000.0, rope_scaling=dict(rope_type="linear", factor=8.0),
                    hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                    attn_logit_softcapping=None, tie_word_embeddings=True, bos_token_id=2,
                    eos_token_id=1, pad_token_id=0)),
}

N_TOKENS = 150  # crosses two 64-token KV blocks, so sealed blocks and the open block are both exercised


def v4_layout(config):
    """The transformers 4.x spelling of a config transformers 5.x wrote (rope_theta/rope_scaling,
    torch_dtype)."""
    config = dict(config)
    rope = config.pop("rope_parameters", None)
    if rope is not None and "full_attention" in rope:  # Gemma 3: one entry per layer type
        config["rope_local_base_freq"] = rope.get("sliding_attention", {}).get("rope_theta", 10000.0)
        rope = rope["full_attention"]
    if rope is not None:
        rope = dict(rope)
        config["rope_theta"] = rope.pop("rope_theta", 10000.0)
        config["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    if "dtype" in config:
        config["torch_dtype"] = config.pop("dtype")
    if "num_local_experts" in config and config.get("model_type") == "qwen3_moe":  # 4.x: "num_experts"
        config["num_experts"] = config.pop("num_local_experts")
    config["transformers_version"] = "4.46.0" if "gemma3" not in config.get("model_type", "") else "4.50.0"
    return config


def config_class(transformers, cls):
    name = cls.replace("ForCausalLM", "Config")
    return getattr(transformers, "Gemma3TextConfig" if name == "Gemma3Config" else name)


def experts_per_tensor(folder, config):
    """Rewrites fused expert tensors (transformers 5.x keeps experts as one [E, ...] parameter and may save
    it so) into one tensor per expert, as Qwen3-MoE checkpoints on the Hub are stored."""
    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    inter = config.moe_intermediate_size
    out, changed = {}, False
    for key, value in tensors.items():
        if key.endswith("mlp.experts.gate_up_proj"):  # [E, 2 * inter, hidden]: gate rows, then up rows
            prefix = key[: -len("gate_up_proj")]
            if value.shape[1] != 2 * inter:
                value = value.transpose(1, 2)
            for e in range(value.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = value[e, :inter].contiguous()
                out[f"{prefix}{e}.up_proj.weight"] = value[e, inter:].contiguous()
            changed = True
        elif key.endswith("mlp.experts.down_proj"):  # [E, hidden, inter]
            prefix = key[: -len("down_proj")]
            if value.shape[2] != inter:
                value = value.transpose(1, 2)
            for e in range(value.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = value[e].contiguous()
            changed = True
        else:
            out[key] = value
    if changed:
        save_file(out, path, metadata={"format": "pt"})
    print(f"  experts: {'rewritten one tensor per expert' if changed else 'saved per expert already'}; "
          f"keys e.g. {sorted(k for k in out if 'experts' in k)[:3]}", flush=True)


def make_models(out_dir, names):
    import torch
    import transformers

    torch.manual_seed(1234)
    for name, spec in MODEL_SPECS.items():
        try:
            make_model(out_dir, name, spec, torch, transformers, write=not names or name in names)
        except Exception:
            print(f"ERROR: model {name} not made:\n{traceback.format_exc()}", flush=True)


def make_model(out_dir, name, spec, torch, transformers, write):
    config_cls = config_class(transformers, spec["cls"])
    # The 4.x spelling, as most Hub configs have it: transformers 5.x reads it and writes its own.
    config = config_cls.from_dict(dict(spec["config"]))
    config.architectures = [spec["cls"]]
    model = getattr(transformers, spec["cls"])(config).eval()
    with torch.no_grad():  # larger weights than the 0.02 default init: peaky attention, varied norms
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (1.0 / p.shape[-1] ** 0.5) * 1.5)
    if not write:  # made only to draw the same random numbers as a full run, so every model is reproducible
        return
    dtype = getattr(torch, spec["dtype"])
    model = model.to(dtype)
    folder = os.path.join(out_dir, "models", name)
    os.makedirs(folder, exist_ok=True)
    kwargs = {"safe_serialization": True}
    if spec["shard"]:
        kwargs["max_shard_size"] = spec["shard"]
    model.save_pretrained(folder, **kwargs)
    if "Moe" in spec["cls"]:
        experts_per_tensor(folder, config)
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)
    with open(os.path.join(folder, "config.v4.json"), "w") as f:
        json.dump(v4_layout(saved), f, indent=2)

    # Reference logits: reload exactly what was saved, compute in FP32 with eager attention.
    ref = getattr(transformers, spec["cls"]).from_pretrained(folder, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    saved_state = {k: v.float() for k, v in model.state_dict().items()}
    for k, v in ref.state_dict().items():  # the reloaded model is the one saved (experts included)
        if k in saved_state and not torch.equal(saved_state[k], v):
            raise RuntimeError(f"{name}: {k} differs after reloading")
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, config.vocab_size, size=N_TOKENS).tolist()
    with torch.no_grad():
        logits = ref(torch.tensor([tokens])).logits[0].float().numpy()
        prompt_len = spec.get("greedy_prompt", 12)
        greedy = list(tokens[:prompt_len])
        for _ in range(24):
            nxt = ref(torch.tensor([greedy])).logits[0, -1]
            greedy.append(int(torch.argmax(nxt)))
    np.save(os.path.join(folder, "golden_logits.npy"), logits.astype(np.float32))
    with open(os.path.join(folder, "golden_tokens.txt"), "w") as f:
        f.write(",".join(map(str, tokens)) + "\n")
    with open(os.path.join(folder, "golden_greedy.json"), "w") as f:
        json.dump({"prompt": greedy[:prompt_len], "generated": greedy[prompt_len:]}, f)
    print(f"model {name}: files {sorted(os.listdir(folder))}, max|logit| {np.abs(logits).max():.3f}",
          flush=True)
    print(json.dumps(saved, indent=1), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-text", help="folder of text files to train tokenizers on (omit with --models)")
    parser.add_argument("--models", help="comma-separated names of MODEL_SPECS to make, and nothing else")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)

    import tokenizers
    import torch
    import transformers
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
                   "tokenizers": tokenizers.__version__, "numpy": np.__version__}, f, indent=1)
    if args.models:
        make_models(args.out, set(args.models.split(",")))
        return
    if not args.train_text:
        parser.error("--train-text is required unless --models is given")
    write_tokenizer_goldens(make_tokenizers(args.train_text), args.train_text, args.out)
    make_models(args.out, None)


if __name__ == "__main__":
    main()
