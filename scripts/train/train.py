#!/usr/bin/env python3
"""Train slimkv's bundled model: a byte-level BPE tokenizer and a small LlamaForCausalLM.

Runs on one CUDA GPU (PyTorch 2.x, transformers, tokenizers, safetensors, matplotlib). Steps:
  1. tokenizer  byte-level BPE (Llama-3 style pre-tokenizer regex, then ByteLevel without its own
                regex), trained on the train split; BOS added by a TemplateProcessing post-processor.
  2. tokenize   the train split into one uint16 token stream: [BOS] doc [EOS] [BOS] doc [EOS] ...
  3. train      LlamaForCausalLM (HF's class, so the checkpoint is exactly HF's), bf16 autocast,
                SDPA attention, AdamW, warmup-stable-decay learning rate over a wall-clock budget,
                length curriculum 1K -> 2K -> 4K. Rows are random windows of the token stream; a
                share of rows begins with a synthetic long-context retrieval sample (pass key in
                filler, several needles, key-value lookup, question before and after the context),
                generated here from a seeded RNG. Checkpoints to --work every few minutes
                (resumable with --resume); loss logged to CSV.
  4. export     save_pretrained in BF16, sharded safetensors (max_shard_size 15MB) + index,
                generation_config.json, tokenizer.json, tokenizer_config.json.
  5. evaluate   with HF transformers, reloading the exported folder: held-out perplexity at 1K and
                4K context, pass-key accuracy by length x depth, a greedy retrieval sample, and
                the loss-curve PNG. Results go to <model-dir>/eval.json.

Perplexity protocol (what slimkv's own `eval` must reproduce): encode heldout.txt as one string
without special tokens; cut the ids into consecutive chunks of (L - 1) tokens (the remainder is
dropped); each window is [BOS] + chunk; PPL = exp(total NLL of predicting every chunk token / count).

Usage (GPU machine): python3 scripts/train/train.py --corpus .carry/corpus/train.txt.xz \
    --model-dir models/slimkv-llama-14m --work /root/slimkv_work --train-minutes 16
"""
import argparse
import csv
import json
import lzma
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

DOC_SEPARATOR = "\n\n\n"
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
# Llama-3's pre-tokenizer regex: contractions, letter runs with one leading non-letter, numbers in
# groups of at most three digits, punctuation runs, newlines, and whitespace.
PRETOKENIZER_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                      r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".carry/corpus/train.txt.xz")
    ap.add_argument("--heldout", default="models/slimkv-llama-14m/heldout.txt")
    ap.add_argument("--model-dir", default="models/slimkv-llama-14m", help="export folder")
    ap.add_argument("--work", default="/root/slimkv_work", help="checkpoints, token cache")
    ap.add_argument("--resume", action="store_true", help="continue from <work>/ckpt.pt")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--hidden-size", type=int, default=384)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate-size", type=int, default=896)
    ap.add_argument("--rope-theta", type=float, default=100000.0)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--tokens-per-step", type=int, default=196608)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=150)
    ap.add_argument("--decay-fraction", type=float, default=0.25,
                    help="last fraction of the time budget over which the LR decays (WSD)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--synthetic-fraction", type=float, default=0.3,
                    help="share of rows that start with a synthetic retrieval sample")
    ap.add_argument("--curriculum", default="0.45:1024,0.7:2048,1.0:4096",
                    help="time fraction:sequence length pairs")
    ap.add_argument("--train-minutes", type=float, default=16.0, help="wall-clock training budget")
    ap.add_argument("--checkpoint-minutes", type=float, default=4.0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--tokenizer-max-bytes", type=int, default=0,
                    help="train the tokenizer on at most this many bytes of documents (0: all)")
    ap.add_argument("--passkey-trials", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="tiny run to check the environment")
    ap.add_argument("--skip-train", action="store_true", help="export/evaluate <work>/ckpt.pt")
    ap.add_argument("--eval-only", action="store_true",
                    help="only evaluate the exported --model-dir; update its eval.json")
    return ap.parse_args()


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ----------------------------------------------------------------------------------------------
# 1. Tokenizer
# ----------------------------------------------------------------------------------------------

def train_tokenizer(docs, vocab_size, max_bytes):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZER_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if max_bytes:
        rng = random.Random(0)
        picked, total = [], 0
        for d in rng.sample(docs, len(docs)):
            if total > max_bytes:
                break
            picked.append(d)
            total += len(d)
        docs = picked
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=BOS + " $A", pair=BOS + " $A " + BOS + " $B:1", special_tokens=[(BOS, bos_id)])
    return tok


def save_tokenizer(tok, model_dir, context):
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(model_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, f, indent=1)


# ----------------------------------------------------------------------------------------------
# 2. Token stream
# ----------------------------------------------------------------------------------------------

def tokenize_stream(tok, docs):
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    out = []
    for k in range(0, len(docs), 2000):
        for enc in tok.encode_batch(docs[k:k + 2000], add_special_tokens=False):
            out.append(np.array([bos] + enc.ids + [eos], dtype=np.uint16))
    return np.concatenate(out)


# ----------------------------------------------------------------------------------------------
# 3a. Synthetic long-context retrieval samples (token space; pieces encoded with the tokenizer)
# ----------------------------------------------------------------------------------------------

CLASSIC_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again. ")
PASSKEY_HEADER = ("There is an important pass key hidden inside a lot of irrelevant text. "
                  "Find it and memorize it. I will quiz you about the pass key.\n\n")
NOUNS = ("apple river stone cloud garden window mountain candle mirror forest harbor lantern "
         "meadow violin castle dragon falcon pepper silver copper marble canyon island ribbon "
         "rocket saddle tunnel valley wagon walnut anchor basket beacon bridge cactus cannon "
         "carpet cedar cherry comet coral cotton desert diamond engine feather fiddle garnet "
         "glacier hammer helmet hornet jacket jungle kettle ladder lemon magnet maple meteor "
         "monkey needle orchid oyster panther parrot pebble pencil pigeon pillow planet pocket "
         "puzzle quartz rabbit raven saffron salmon shadow spider spiral summit thunder tiger "
         "timber tulip turtle velvet walrus willow winter zebra ember falcon orbit prairie "
         "thistle harvest compass blanket lagoon scarlet emerald cobalt amber").split()


class SyntheticSamples:
    """Seeded generator of retrieval samples, each a list of token ids starting with BOS."""

    def __init__(self, tok, stream, rng):
        self.tok, self.stream, self.rng = tok, stream, rng
        self.bos, self.eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
        self.cache = {}
        self.classic = self.enc(CLASSIC_FILLER) * 2000

    def enc(self, text):
        ids = self.cache.get(text)
        if ids is None:
            ids = self.tok.encode(text, add_special_tokens=False).ids
            if len(self.cache) < 4096:
                self.cache[text] = ids
        return list(ids)

    def number(self):
        return str(self.rng.randint(10 ** (self.rng.randint(2, 6)), 10 ** 7 - 1))

    def filler(self, n, classic):
        if classic:
            return self.classic[:n]
        start = self.rng.randrange(0, len(self.stream) - n - 1)
        return [int(t) for t in self.stream[start:start + n] if t != self.bos and t != self.eos]

    def embed(self, filler_tokens, needles):
        """Insert needle token lists into the filler at random depths (sorted)."""
        cuts = sorted(self.rng.randint(0, len(filler_tokens)) for _ in needles)
        out, prev = [], 0
        for cut, needle in zip(cuts, needles):
            out += filler_tokens[prev:cut] + needle
            prev = cut
        return out + filler_tokens[prev:]

    def passkey(self, length, depth=None, classic=None, header=None, question_first=None):
        """The pass-key task: (prompt, answer) of `length` tokens in all, BOS included. Also used,
        with fixed depth and filler, by the evaluation."""
        rng = self.rng
        key = self.number()
        classic = rng.random() < 0.5 if classic is None else classic
        header = rng.random() < 0.7 if header is None else header
        question_first = rng.random() < 0.2 if question_first is None else question_first
        needle = self.enc(" The pass key is %s. Remember it. %s is the pass key. " % (key, key))
        head = self.enc(PASSKEY_HEADER) if header else []
        if question_first:
            head = self.enc("Question: What is the pass key? Read the text below, then answer."
                            "\n\n") + head
        question = self.enc("\n\nWhat is the pass key? The pass key is")
        answer = self.enc(" %s." % key)
        n_fill = max(16, length - 1 - len(head) - len(needle) - len(question) - len(answer))
        fill = self.filler(n_fill, classic)
        if depth is None:
            body = self.embed(fill, [needle])
        else:
            cut = int(round(depth * len(fill)))
            body = fill[:cut] + needle + fill[cut:]
        prompt = [self.bos] + head + body + question
        return prompt, answer

    def multi_needle(self, length):
        """Several needles, 1-3 questions: `length` tokens or fewer, BOS included."""
        rng = self.rng
        n = rng.randint(2, 6)
        words = rng.sample(NOUNS, n)
        values = [self.number() for _ in words]
        needles = [self.enc(" The special magic number for %s is %s. " % (w, v))
                   for w, v in zip(words, values)]
        asked = rng.sample(range(n), rng.randint(1, min(3, n)))
        tail = []
        for i in asked:
            tail += self.enc("\n\nWhat is the special magic number for %s? The special magic "
                             "number for %s is %s." % (words[i], words[i], values[i]))
        head = self.enc("Some special magic numbers are hidden in the text below. "
                        "Remember them.\n\n") if rng.random() < 0.5 else []
        n_fill = max(16, length - 1 - len(head) - sum(map(len, needles)) - len(tail))
        body = self.embed(self.filler(n_fill, rng.random() < 0.3), needles)
        return [self.bos] + head + body + tail

    def key_value(self, length):
        rng = self.rng
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        head = self.enc("Here is a list of records. Each line gives a key and its value.\n")
        lines, pairs, used = [], [], len(head)
        tail_reserve = 3 * 40  # up to three questions of about 35 tokens
        while True:
            key = "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 8)))
            value = self.number() if rng.random() < 0.6 else rng.choice(NOUNS)
            line = self.enc("%s = %s\n" % (key, value))
            if used + len(line) > length - 1 - tail_reserve:
                break
            lines.append(line)
            pairs.append((key, value))
            used += len(line)
        tail = []
        for key, value in rng.sample(pairs, min(len(pairs), rng.randint(1, 3))):
            q = self.enc("\nLook up %s. The value of %s is %s." % (key, key, value))
            if used + len(q) > length - 1:
                break
            tail += q
            used += len(q)
        return [self.bos] + head + [t for l in lines for t in l] + tail

    def sample(self, length):
        """One sample of at most `length` tokens: BOS, task, EOS."""
        # The task gets length - 1 tokens so that the EOS never displaces its last token. (The
        # bundled model was trained before this was fixed: its samples lost the final "." of the
        # last answer, so it ends an answer with EOS instead of "."; see the model card.)
        r = self.rng.random()
        if r < 0.45:
            prompt, answer = self.passkey(length - 1)
            ids = prompt + answer
        elif r < 0.75:
            ids = self.multi_needle(length - 1)
        else:
            ids = self.key_value(length - 1)
        return ids[:length - 1] + [self.eos]


# ----------------------------------------------------------------------------------------------
# 3b. Batches: random windows of the stream, some rows starting with a synthetic sample
# ----------------------------------------------------------------------------------------------

class Batches(torch.utils.data.IterableDataset):
    def __init__(self, tokenizer_path, stream_path, seq_len, rows, synthetic_fraction, seed):
        self.tokenizer_path, self.stream_path = tokenizer_path, stream_path
        self.seq_len, self.rows = seq_len, rows
        self.synthetic_fraction, self.seed = synthetic_fraction, seed

    def __iter__(self):
        from tokenizers import Tokenizer
        info = torch.utils.data.get_worker_info()
        wid = info.id if info else 0
        rng = random.Random(self.seed * 1000 + wid)
        np_rng = np.random.default_rng(self.seed * 1000 + wid)
        tok = Tokenizer.from_file(self.tokenizer_path)
        stream = np.load(self.stream_path, mmap_mode="r")
        synth = SyntheticSamples(tok, stream, rng)
        L = self.seq_len + 1
        lo = min(512, self.seq_len // 2) if self.seq_len <= 1024 else 1024
        while True:
            starts = np_rng.integers(0, len(stream) - L, size=self.rows)
            batch = np.stack([stream[s:s + L] for s in starts]).astype(np.int64)
            synthetic_tokens = 0
            for r in range(self.rows):
                if rng.random() < self.synthetic_fraction:
                    ids = synth.sample(rng.randint(lo, L))
                    batch[r, :len(ids)] = ids
                    synthetic_tokens += len(ids)
            yield torch.from_numpy(batch), synthetic_tokens


def make_loader(args, seq_len, seed):
    rows = max(1, args.tokens_per_step // seq_len)
    ds = Batches(os.path.join(args.work, "tokenizer.json"), os.path.join(args.work, "stream.npy"),
                 seq_len, rows, args.synthetic_fraction, seed)
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.workers,
                                            pin_memory=True, prefetch_factor=4,
                                            persistent_workers=False))


# ----------------------------------------------------------------------------------------------
# 3c. Model, schedule, training loop
# ----------------------------------------------------------------------------------------------

def build_config(args, tok):
    import inspect
    from transformers import LlamaConfig
    kw = dict(vocab_size=tok.get_vocab_size(), hidden_size=args.hidden_size,
              intermediate_size=args.intermediate_size, num_hidden_layers=args.layers,
              num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
              head_dim=args.head_dim, max_position_embeddings=args.context,
              rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=True,
              attention_bias=False, mlp_bias=False, initializer_range=0.02,
              bos_token_id=tok.token_to_id(BOS), eos_token_id=tok.token_to_id(EOS),
              pad_token_id=tok.token_to_id(PAD))
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": args.rope_theta}
    else:
        kw["rope_theta"] = args.rope_theta
    config = LlamaConfig(**kw)
    config._attn_implementation = "sdpa"
    return config


def curriculum(args):
    out = []
    for part in args.curriculum.split(","):
        frac, seq = part.split(":")
        out.append((float(frac), min(int(seq), args.context)))
    return out


def seq_len_at(args, frac):
    for until, seq in curriculum(args):
        if frac < until:
            return seq
    return curriculum(args)[-1][1]


def lr_at(args, step, frac):
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    start = 1.0 - args.decay_fraction
    if frac <= start:
        return args.lr
    t = min(1.0, (frac - start) / args.decay_fraction)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def heldout_windows(tok, text, seq_len, limit=None):
    ids = tok.encode(text, add_special_tokens=False).ids
    bos = tok.token_to_id(BOS)
    n = len(ids) // (seq_len - 1)
    if limit:
        n = min(n, limit)
    rows = [[bos] + ids[k * (seq_len - 1):(k + 1) * (seq_len - 1)] for k in range(n)]
    return torch.tensor(rows, dtype=torch.long), len(ids)


@torch.no_grad()
def mean_nll(model, windows, batch_rows, device):
    """Mean NLL (nats) of predicting every token after the leading BOS in each window."""
    total, count = 0.0, 0
    for k in range(0, len(windows), batch_rows):
        x = windows[k:k + batch_rows].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                               x[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += x[:, 1:].numel()
    return total / max(count, 1)


def train(args, tok, config, device):
    from transformers import LlamaForCausalLM
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log("model parameters: %d (%.2f MB in bf16)" % (n_params, 2 * n_params / 1e6))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    ckpt_path = os.path.join(args.work, "ckpt.pt")
    log_path = os.path.join(args.work, "train_log.csv")
    state = {"step": 0, "elapsed_s": 0.0, "tokens": 0, "synthetic_tokens": 0}
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        log("resumed at step %d, %.1f s trained" % (state["step"], state["elapsed_s"]))
    elif os.path.exists(log_path):
        os.remove(log_path)
    if args.skip_train:
        return model, n_params, state

    step_fn = model
    if args.compile:
        step_fn = torch.compile(model)
    compiled_ok = True

    heldout_text = open(args.heldout).read()
    val = heldout_windows(tok, heldout_text, 1024, limit=32)[0]
    budget_s = args.train_minutes * 60.0
    new_log = not os.path.exists(log_path)
    log_file = open(log_path, "a", newline="")
    writer = csv.writer(log_file)
    if new_log:
        writer.writerow(["step", "tokens", "synthetic_tokens", "train_seconds", "seq_len", "lr",
                         "train_loss", "heldout_loss_1k", "tokens_per_s"])
    last_ckpt = time.time()
    loader, loader_seq = None, None
    loss_acc, loss_n, t_window, tok_window = 0.0, 0, time.time(), 0
    model.train()
    while state["elapsed_s"] < budget_s:
        t0 = time.time()
        frac = state["elapsed_s"] / budget_s
        seq_len = seq_len_at(args, frac)
        if seq_len != loader_seq:
            loader = make_loader(args, seq_len, args.seed + state["step"])
            loader_seq = seq_len
            log("sequence length %d from step %d" % (seq_len, state["step"]))
        batch, synthetic_tokens = next(loader)
        batch = batch.to(device, non_blocking=True)
        lr = lr_at(args, state["step"], frac)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch[:, :-1], batch[:, 1:]
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = step_fn(input_ids=x).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
            loss.backward()
        except Exception as e:  # a compile failure must not cost the run: fall back to eager
            if step_fn is model:
                raise
            log("torch.compile failed (%s: %s); continuing eager" % (type(e).__name__, e))
            opt.zero_grad(set_to_none=True)
            step_fn, compiled_ok = model, False
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens"] += x.numel()
        state["synthetic_tokens"] += synthetic_tokens
        loss_acc += loss.item()
        loss_n += 1
        tok_window += x.numel()
        state["elapsed_s"] += time.time() - t0
        if state["step"] % args.eval_every == 0 or state["elapsed_s"] >= budget_s:
            model.eval()
            hl = mean_nll(model, val, 16, device)
            model.train()
            tps = tok_window / (time.time() - t_window)
            row = [state["step"], state["tokens"], state["synthetic_tokens"],
                   round(state["elapsed_s"], 1), seq_len, "%.3g" % lr,
                   "%.4f" % (loss_acc / loss_n), "%.4f" % hl, int(tps)]
            writer.writerow(row)
            log_file.flush()
            log("step %d tok %.1fM seq %d lr %.2e train %.4f heldout %.4f (%.0f tok/s)" % (
                state["step"], state["tokens"] / 1e6, seq_len, lr, loss_acc / loss_n, hl, tps))
            loss_acc, loss_n, t_window, tok_window = 0.0, 0, time.time(), 0
        if time.time() - last_ckpt > args.checkpoint_minutes * 60:
            save_checkpoint(ckpt_path, model, opt, state)
            last_ckpt = time.time()
    save_checkpoint(ckpt_path, model, opt, state)
    log_file.close()
    state["compiled"] = bool(args.compile and compiled_ok)
    return model, n_params, state


def save_checkpoint(path, model, opt, state):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)
    os.replace(tmp, path)
    log("checkpoint saved at step %d" % state["step"])


# ----------------------------------------------------------------------------------------------
# 4. Export
# ----------------------------------------------------------------------------------------------

def export(args, model, tok, config):
    from transformers import GenerationConfig
    os.makedirs(args.model_dir, exist_ok=True)
    for f in os.listdir(args.model_dir):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".json")):
            os.remove(os.path.join(args.model_dir, f))
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(args.model_dir, max_shard_size="15MB")
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id, do_sample=False,
                     max_length=args.context).save_pretrained(args.model_dir)
    save_tokenizer(tok, args.model_dir, args.context)
    # Engines that read config.json directly want rope_theta at top level (transformers >= 5 keeps
    # it inside rope_parameters); adding it is harmless to transformers' loader.
    path = os.path.join(args.model_dir, "config.json")
    cfg = json.load(open(path))
    if "rope_theta" not in cfg:
        cfg["rope_theta"] = args.rope_theta
        json.dump(cfg, open(path, "w"), indent=2, sort_keys=True)
    log("exported to %s: %s" % (args.model_dir, sorted(os.listdir(args.model_dir))))


# ----------------------------------------------------------------------------------------------
# 5. Evaluation with HF transformers, reloading the exported folder
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(args, tok, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16).to(device)
    model.eval()
    results = {}
    try:
        hf_tok = AutoTokenizer.from_pretrained(args.model_dir)
        ids = hf_tok("The pass key is 12345.")["input_ids"]
        results["hf_tokenizer_check"] = {"class": type(hf_tok).__name__, "ids": ids,
                                         "bos_first": ids[0] == tok.token_to_id(BOS)}
    except Exception as e:
        results["hf_tokenizer_check"] = {"error": "%s: %s" % (type(e).__name__, e)}
    text = open(args.heldout).read()
    for L in (1024, 4096):
        windows, n_ids = heldout_windows(tok, text, L)
        nll = mean_nll(model, windows, max(1, 32768 // L), device)
        results["heldout_ppl_%d" % L] = {"ppl": math.exp(nll), "nll": nll, "windows": len(windows),
                                         "predicted_tokens": len(windows) * (L - 1),
                                         "heldout_tokens": n_ids}
        log("held-out ppl at %d: %.3f (%d windows)" % (L, math.exp(nll), len(windows)))
    # Natural filler for the pass-key test comes from the held-out text, so it is unseen text.
    filler_stream = np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint16)
    rng = random.Random(args.seed + 99)
    synth = SyntheticSamples(tok, filler_stream, rng)
    grid, strict, samples = {}, {}, {}
    for filler in ("classic", "natural"):
        for L in (1024, 2048, 3072, 4096):
            for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
                correct = correct_strict = 0
                for trial in range(args.passkey_trials):
                    prompt, answer = synth.passkey(L, depth=depth, classic=(filler == "classic"),
                                                   header=True, question_first=False)
                    x = torch.tensor([prompt + answer], device=device)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        logits = model(input_ids=x).logits[0]
                    pred = logits[len(prompt) - 1:len(prompt) - 1 + len(answer)].argmax(-1).tolist()
                    # The answer is " N." : correct when greedy decoding reproduces the number;
                    # strict also needs the final period.
                    correct += int(pred[:-1] == answer[:-1])
                    correct_strict += int(pred == answer)
                    if trial == 0 and depth == 0.5:
                        out = model.generate(torch.tensor([prompt], device=device),
                                             max_new_tokens=8, do_sample=False)
                        samples["%s/%d" % (filler, L)] = {
                            "expected": tok.decode(answer),
                            "generated": tok.decode(out[0, len(prompt):].tolist(),
                                                    skip_special_tokens=False)}
                cell = "%s/%d/%d" % (filler, L, int(depth * 100))
                grid[cell] = correct / args.passkey_trials
                strict[cell] = correct_strict / args.passkey_trials
            log("passkey %s %d: %s" % (filler, L, [grid["%s/%d/%d" % (filler, L, d)]
                                                    for d in (0, 25, 50, 75, 100)]))
    results["passkey"] = grid
    results["passkey_strict"] = strict
    results["passkey_samples"] = samples
    results["passkey_trials_per_cell"] = args.passkey_trials
    # A greedy sample that shows retrieval (the prompt `make run` can use).
    prompt, answer = synth.passkey(2048, depth=0.4, classic=False, header=True,
                                   question_first=False)
    out = model.generate(torch.tensor([prompt], device=device), max_new_tokens=12,
                         do_sample=False)
    results["retrieval_sample"] = {"expected": tok.decode(answer),
                                   "generated": tok.decode(out[0, len(prompt):].tolist()),
                                   "prompt_tokens": len(prompt)}
    results["generation_sample"] = {}
    for p in ("The history of the kingdom", "To configure the network interface,"):
        ids = [tok.token_to_id(BOS)] + tok.encode(p, add_special_tokens=False).ids
        out = model.generate(torch.tensor([ids], device=device), max_new_tokens=48,
                             do_sample=False, repetition_penalty=1.1)
        results["generation_sample"][p] = tok.decode(out[0, len(ids):].tolist())
    return results


def plot_loss(log_path, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = list(csv.DictReader(open(log_path)))
    tokens = [int(r["tokens"]) / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(tokens, [float(r["train_loss"]) for r in rows], label="train (mixed, incl. synthetic)")
    ax.plot(tokens, [float(r["heldout_loss_1k"]) for r in rows], label="held-out, 1K windows")
    for k in range(1, len(rows)):
        if rows[k]["seq_len"] != rows[k - 1]["seq_len"]:
            ax.axvline(tokens[k], color="grey", lw=0.8, ls=":")
            ax.text(tokens[k], ax.get_ylim()[1], " seq %s" % rows[k]["seq_len"], va="top",
                    fontsize=8)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def main():
    args = parse_args()
    if args.smoke:
        args.train_minutes = min(args.train_minutes, 0.5)
        args.tokenizer_max_bytes = args.tokenizer_max_bytes or 5_000_000
        args.eval_every, args.passkey_trials = 10, 2
        args.tokens_per_step = 65536
    t_start = time.time()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.model_dir, exist_ok=True)
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    from tokenizers import Tokenizer
    if args.eval_only:
        tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
        path = os.path.join(args.model_dir, "eval.json")
        old = json.load(open(path)) if os.path.exists(path) else {}
        results = evaluate(args, tok, device)
        old.update(results)
        old["eval_only_rerun"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                  "transformers": __import__("transformers").__version__,
                                  "seconds": time.time() - t_start}
        with open(path, "w") as f:
            json.dump(old, f, indent=1)
        log("eval-only done in %.1f s" % (time.time() - t_start))
        return
    tok_path, stream_path = os.path.join(args.work, "tokenizer.json"), os.path.join(args.work,
                                                                                     "stream.npy")
    if args.resume and os.path.exists(stream_path):
        tok = Tokenizer.from_file(tok_path)
    else:
        log("reading corpus %s" % args.corpus)
        with lzma.open(args.corpus, "rt") as f:
            docs = [d for d in f.read().split(DOC_SEPARATOR) if d.strip()]
        if args.smoke:
            docs = docs[:400]
        log("%d documents; training tokenizer" % len(docs))
        tok = train_tokenizer(docs, args.vocab_size, args.tokenizer_max_bytes)
        tok.save(tok_path)
        log("tokenizer: %d tokens; tokenizing" % tok.get_vocab_size())
        stream = tokenize_stream(tok, docs)
        np.save(stream_path, stream)
        corpus_stats = {"train_documents": len(docs), "train_bytes": sum(len(d.encode()) for d in docs),
                        "train_tokens": int(len(stream))}
        json.dump(corpus_stats, open(os.path.join(args.work, "corpus_stats.json"), "w"))
        log("train stream: %d tokens (%.2f bytes/token)" % (
            len(stream), corpus_stats["train_bytes"] / len(stream)))
        del docs
    stream = np.load(stream_path, mmap_mode="r")
    config = build_config(args, tok)
    model, n_params, state = train(args, tok, config, device)
    export(args, model, tok, config)
    del model
    torch.cuda.empty_cache()
    results = evaluate(args, tok, device)
    results.update({
        "parameters": n_params, "train_state": state,
        "corpus": json.load(open(os.path.join(args.work, "corpus_stats.json"))),
        "heldout_tokens": results["heldout_ppl_1024"]["heldout_tokens"],
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "tokenizers": __import__("tokenizers").__version__,
        "args": vars(args), "wall_seconds": time.time() - t_start,
    })
    log_src = os.path.join(args.work, "train_log.csv")
    if os.path.exists(log_src):
        import shutil
        shutil.copy(log_src, os.path.join(args.model_dir, "train_log.csv"))
        plot_loss(log_src, os.path.join(args.model_dir, "loss.png"))
    with open(os.path.join(args.model_dir, "eval.json"), "w") as f:
        json.dump(results, f, indent=1)
    log("done in %.1f s" % (time.time() - t_start))


if __name__ == "__main__":
    main()
