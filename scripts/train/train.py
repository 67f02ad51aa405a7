#!/usr/bin/env python3
"""Train slimkv's bundled model: a byte-level BPE tokenizer and a small LlamaForCausalLM.

Runs on one CUDA GPU (PyTorch 2.x, transformers, tokenizers, safetensors, matplotlib). The corpus
arrives in parts (scripts/corpus/build_corpus.py writes them, xz-compressed; one GPU call carries
one, see scripts/train/README.md), so training starts before the corpus is complete:
  1. tokenizer  byte-level BPE (Llama-3 style pre-tokenizer regex, then ByteLevel without its own
                regex), trained on the first part (a sample of every training source).
  2. ingest     a thread turns each part that appears in <data-dir>/parts into a uint16 token
                shard in <data-dir>/shards: [BOS] doc [EOS] [BOS] doc [EOS] ...
  3. train      LlamaForCausalLM (HF's class, so the checkpoint is exactly HF's), bf16 autocast,
                SDPA attention, AdamW, warmup-stable-decay learning rate, length curriculum up
                to --context. Each row is a random window of the shard that has supplied the
                fewest passes so far, so parts that arrive late catch up with early ones and no
                shard supplies more than --max-passes times its tokens; training waits for parts
                when every present shard is at the limit. A share of rows begins with a synthetic
                retrieval sample (synthetic.py) whose filler is cut from the shards; the share is
                larger at the full context, and half the samples fill their whole row, so that
                retrieval across the full context gets thousands of rows. The schedule
                runs on max(wall-clock fraction, token fraction of max-passes x expected corpus
                tokens). Checkpoints to <data-dir>/ckpt.pt (resumable with --resume).
  4. export     save_pretrained in BF16, sharded safetensors (max_shard_size 15MB) + index,
                generation_config.json, tokenizer.json, tokenizer_config.json.
  5. evaluate   with HF transformers, reloading the exported folder: perplexity at 1K/4K/8K on the
                held-out split of training sources, the held-out sources and each reserved text;
                pass key (depth x length, question after and before, filler from held-out sources)
                and key-value retrieval; results to <model-dir>/eval.json.

Perplexity protocol (what slimkv's own `eval` must reproduce): encode the text as one string
without special tokens; cut the ids into consecutive chunks of (L - 1) tokens (the remainder is
dropped); each window is [BOS] + chunk; PPL = exp(total NLL of predicting every chunk token / count).

Usage (GPU machine; gpu_feed.sh starts it): python3 scripts/train/train.py --data-dir /root/model2 \
    --manifest scripts/corpus/manifest.json --model-dir /root/model2/model --train-minutes 16
"""
import argparse
import csv
import glob
import json
import lzma
import math
import os
import random
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

from synthetic import SyntheticSamples

DOC_SEPARATOR = "\n\n\n"
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
# Llama-3's pre-tokenizer regex: contractions, letter runs with one leading non-letter, numbers in
# groups of at most three digits, punctuation runs, newlines, and whitespace.
PRETOKENIZER_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                      r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
EVAL_LENGTHS = (1024, 4096, 8192)


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/root/model2",
                    help="parts/ (arriving .txt.xz), shards/, eval/, ckpt.pt, logs")
    ap.add_argument("--manifest", default="scripts/corpus/manifest.json",
                    help="the corpus manifest: how many parts and bytes to expect")
    ap.add_argument("--model-dir", default="/root/model2/model", help="export folder")
    ap.add_argument("--resume", action="store_true", help="continue from <data-dir>/ckpt.pt")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--hidden-size", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate-size", type=int, default=768)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--tokens-per-step", type=int, default=196608)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=150)
    ap.add_argument("--decay-fraction", type=float, default=0.25,
                    help="last fraction of the schedule over which the LR decays (WSD)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--synthetic-fraction", type=float, default=0.25,
                    help="share of rows that start with a synthetic retrieval sample")
    ap.add_argument("--synthetic-fraction-full", type=float, default=0.4,
                    help="that share at the full --context (scripts/train/README.md: the 8K "
                         "pass key and kvret need more long retrieval rows)")
    ap.add_argument("--curriculum", default="0.35:1024,0.55:2048,0.75:4096,1.0:8192",
                    help="schedule fraction:sequence length pairs")
    ap.add_argument("--train-minutes", type=float, default=16.0, help="wall-clock training budget")
    ap.add_argument("--max-passes", type=float, default=3.0,
                    help="no shard supplies more than this many times its tokens")
    ap.add_argument("--checkpoint-minutes", type=float, default=3.0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--workers", type=int, default=6, help="synthetic-sample processes")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--tokenizer-max-bytes", type=int, default=40_000_000,
                    help="train the tokenizer on at most this many bytes of the first part")
    ap.add_argument("--passkey-trials", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny run to check the environment")
    ap.add_argument("--skip-train", action="store_true", help="export/evaluate <data-dir>/ckpt.pt")
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
# 2. Parts -> token shards
# ----------------------------------------------------------------------------------------------

def read_part(path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [d for d in f.read().split(DOC_SEPARATOR) if d.strip()]


def tokenize_docs(tok, docs):
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    out = []
    for k in range(0, len(docs), 2000):
        for enc in tok.encode_batch(docs[k:k + 2000], add_special_tokens=False):
            out.append(np.array([bos] + enc.ids + [eos], dtype=np.uint16))
    return np.concatenate(out)


def ingest_new_parts(tok, data_dir):
    """Tokenize every part without a shard yet; returns how many were added."""
    shard_dir = os.path.join(data_dir, "shards")
    os.makedirs(shard_dir, exist_ok=True)
    added = 0
    for part in sorted(glob.glob(os.path.join(data_dir, "parts", "*.txt.xz"))):
        name = os.path.basename(part)[:-len(".txt.xz")]
        shard = os.path.join(shard_dir, name + ".npy")
        if os.path.exists(shard):
            continue
        t0 = time.time()
        docs = read_part(part)
        ids = tokenize_docs(tok, docs)
        np.save(shard + ".tmp.npy", ids)
        os.replace(shard + ".tmp.npy", shard)  # readers only ever see complete shards
        nbytes = sum(len(d.encode()) for d in docs)
        with open(os.path.join(shard_dir, name + ".json"), "w") as f:
            json.dump({"documents": len(docs), "bytes": nbytes, "tokens": int(len(ids))}, f)
        log("shard %s: %d docs, %d tokens (%.2f bytes/token) in %.1f s" % (
            name, len(docs), len(ids), nbytes / len(ids), time.time() - t0))
        added += 1
    return added


class Ingest(threading.Thread):
    """Background tokenization of arriving parts while the model trains."""

    def __init__(self, tok, data_dir):
        super().__init__(daemon=True)
        self.tok, self.data_dir, self.stop = tok, data_dir, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                ingest_new_parts(self.tok, self.data_dir)
            except Exception as e:  # a bad part must be visible, not kill training
                log("ingest error: %s: %s" % (type(e).__name__, e))
            self.stop.wait(5.0)


def shard_stats(data_dir):
    out = {}
    for path in sorted(glob.glob(os.path.join(data_dir, "shards", "*.json"))):
        out[os.path.basename(path)[:-5]] = json.load(open(path))
    return out


# ----------------------------------------------------------------------------------------------
# 3a. Rows: natural windows chosen here (pass accounting), synthetic samples from workers
# ----------------------------------------------------------------------------------------------

class Shards:
    """The token shards present so far and how many tokens each has supplied."""

    def __init__(self, data_dir, supplied=None):
        self.data_dir, self.arrays, self.supplied = data_dir, {}, dict(supplied or {})

    def refresh(self):
        for path in sorted(glob.glob(os.path.join(self.data_dir, "shards", "*.npy"))):
            name = os.path.basename(path)[:-4]
            if name not in self.arrays and not name.endswith(".tmp"):
                self.arrays[name] = np.load(path, mmap_mode="r")
                self.supplied.setdefault(name, 0)

    def passes(self, name):
        return self.supplied[name] / len(self.arrays[name])

    def tokens(self):
        return sum(len(a) for a in self.arrays.values())

    def pick(self, rng, max_passes):
        """The shard with the fewest passes (None: every shard is at the limit)."""
        if not self.arrays:
            return None
        name = min(self.arrays, key=lambda n: (self.passes(n), rng.random()))
        return name if self.passes(name) < max_passes else None

    def window(self, name, length, rng):
        a = self.arrays[name]
        start = rng.randrange(0, max(1, len(a) - length))
        self.supplied[name] += length
        return np.resize(np.asarray(a[start:start + length], dtype=np.int64), length)


def random_filler(data_dir, rng, bos, eos):
    """n tokens of natural text cut from a random shard (any source), BOS/EOS removed."""
    state = {"arrays": {}, "checked": 0.0}

    def filler(n):
        if time.time() - state["checked"] > 30:
            for path in glob.glob(os.path.join(data_dir, "shards", "*.npy")):
                if path not in state["arrays"] and not path.endswith(".tmp.npy"):
                    state["arrays"][path] = np.load(path, mmap_mode="r")
            state["checked"] = time.time()
        a = state["arrays"][rng.choice(sorted(state["arrays"]))]
        start = rng.randrange(0, max(1, len(a) - 2 * n))
        ids = [int(t) for t in a[start:start + 2 * n] if t != bos and t != eos]
        return ids[:n]
    return filler


FULL_ROW_SHARE = 0.5  # of synthetic samples as long as their row: retrieval across all of it


def synthetic_fraction_at(args, seq_len):
    return args.synthetic_fraction_full if seq_len >= args.context else args.synthetic_fraction


class SyntheticRows(torch.utils.data.IterableDataset):
    """Endless lists of synthetic samples (token lists): FULL_ROW_SHARE of them L tokens long,
    the others of lengths uniform in [lo, L]."""

    def __init__(self, tokenizer_path, data_dir, seq_len, count, seed):
        self.tokenizer_path, self.data_dir = tokenizer_path, data_dir
        self.seq_len, self.count, self.seed = seq_len, count, seed

    def __iter__(self):
        from tokenizers import Tokenizer
        info = torch.utils.data.get_worker_info()
        rng = random.Random(self.seed * 1000 + (info.id if info else 0))
        tok = Tokenizer.from_file(self.tokenizer_path)
        bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
        synth = SyntheticSamples(lambda s: tok.encode(s, add_special_tokens=False).ids, bos, eos,
                                 random_filler(self.data_dir, rng, bos, eos), rng)
        L = self.seq_len + 1
        lo = min(512, self.seq_len // 2)
        while True:
            yield [synth.sample(L if rng.random() < FULL_ROW_SHARE else rng.randint(lo, L))
                   for _ in range(self.count)]


def synthetic_loader(args, seq_len, rows, seed):
    count = max(1, int(round(rows * synthetic_fraction_at(args, seq_len) * 1.5)))
    ds = SyntheticRows(os.path.join(args.data_dir, "tokenizer.json"), args.data_dir, seq_len,
                       count, seed)
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.workers,
                                            collate_fn=lambda x: x, prefetch_factor=4))


def make_batch(shards, synth_iter, rows, seq_len, args, rng):
    """rows x (seq_len + 1) tokens; None when every present shard has supplied max passes."""
    L = seq_len + 1
    batch = np.empty((rows, L), dtype=np.int64)
    pending, synthetic_tokens = [], 0
    fraction = synthetic_fraction_at(args, seq_len)
    for r in range(rows):
        name = shards.pick(rng, args.max_passes)
        if name is None:
            return None, 0
        if rng.random() < fraction:
            if not pending:
                pending = list(next(synth_iter))
            ids = pending.pop()[:L]
            batch[r, :len(ids)] = ids
            synthetic_tokens += len(ids)
            if len(ids) < L:
                batch[r, len(ids):] = shards.window(name, L - len(ids), rng)
        else:
            batch[r] = shards.window(name, L, rng)
    return torch.from_numpy(batch), synthetic_tokens


# ----------------------------------------------------------------------------------------------
# 3b. Model, schedule, training loop
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


def expected_tokens(args, shards_info):
    """Tokens of the whole corpus: the manifest's train bytes over the bytes/token measured on
    the shards tokenized so far."""
    manifest = json.load(open(args.manifest))
    total_bytes = sum(p["bytes"] for p in manifest["parts"])
    b = sum(s["bytes"] for s in shards_info.values())
    t = sum(s["tokens"] for s in shards_info.values())
    return int(total_bytes * t / b), len(manifest["parts"])


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
    ckpt_path = os.path.join(args.data_dir, "ckpt.pt")
    log_path = os.path.join(args.data_dir, "train_log.csv")
    state = {"step": 0, "elapsed_s": 0.0, "tokens": 0, "synthetic_tokens": 0, "supplied": {},
             "waited_s": 0.0}
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

    step_fn = torch.compile(model) if args.compile else model
    compiled_ok = True
    val_text = open(os.path.join(args.data_dir, "eval", "heldout-split.txt")).read()
    val = heldout_windows(tok, val_text, 1024, limit=32)[0]
    shards = Shards(args.data_dir, state["supplied"])
    budget_s = args.train_minutes * 60.0
    new_log = not os.path.exists(log_path)
    log_file = open(log_path, "a", newline="")
    writer = csv.writer(log_file)
    if new_log:
        writer.writerow(["step", "tokens", "synthetic_tokens", "train_seconds", "seq_len", "lr",
                         "train_loss", "heldout_loss_1k", "tokens_per_s", "shards",
                         "min_passes", "max_passes"])
    rng = random.Random(args.seed + state["step"])
    last_ckpt = time.time()
    loader_seq, synth_iter = None, None
    loss_acc, loss_n, t_window, tok_window = 0.0, 0, time.time(), 0
    look_for_parts = True
    model.train()
    while state["elapsed_s"] < budget_s:
        t0 = time.time()
        if look_for_parts or state["step"] % 20 == 0:
            look_for_parts = False
            shards.refresh()
            total_tokens, n_parts = expected_tokens(args, shard_stats(args.data_dir))
            max_tokens = args.max_passes * total_tokens
        frac = min(1.0, max(state["elapsed_s"] / budget_s, state["tokens"] / max_tokens))
        if frac >= 1.0:
            break
        seq_len = seq_len_at(args, frac)
        rows = max(1, args.tokens_per_step // seq_len)
        if seq_len != loader_seq:
            synth_iter = synthetic_loader(args, seq_len, rows, args.seed + state["step"])
            loader_seq = seq_len
            log("sequence length %d from step %d" % (seq_len, state["step"]))
        batch, synthetic_tokens = make_batch(shards, synth_iter, rows, seq_len, args, rng)
        if batch is None:
            if len(shards.arrays) >= n_parts:
                log("every shard has supplied %.1f passes: training ends" % args.max_passes)
                break
            time.sleep(2.0)  # parts still arriving: wait (not counted as training time)
            state["waited_s"] += time.time() - t0
            look_for_parts = True
            continue
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
        state["supplied"] = dict(shards.supplied)
        loss_acc += loss.item()
        loss_n += 1
        tok_window += x.numel()
        state["elapsed_s"] += time.time() - t0
        if state["step"] % args.eval_every == 0:
            model.eval()
            hl = mean_nll(model, val, 16, device)
            model.train()
            tps = tok_window / (time.time() - t_window)
            passes = [shards.passes(n) for n in shards.arrays]
            writer.writerow([state["step"], state["tokens"], state["synthetic_tokens"],
                             round(state["elapsed_s"], 1), seq_len, "%.3g" % lr,
                             "%.4f" % (loss_acc / loss_n), "%.4f" % hl, int(tps),
                             len(shards.arrays), "%.2f" % min(passes), "%.2f" % max(passes)])
            log_file.flush()
            log("step %d tok %.1fM seq %d lr %.2e train %.4f heldout %.4f (%.0f tok/s) "
                "shards %d/%d passes %.2f-%.2f" % (
                    state["step"], state["tokens"] / 1e6, seq_len, lr, loss_acc / loss_n, hl, tps,
                    len(shards.arrays), n_parts, min(passes), max(passes)))
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

def eval_texts(data_dir):
    """name -> text: the held-out split, the held-out sources, each reserved text."""
    out = {}
    for path in sorted(glob.glob(os.path.join(data_dir, "eval", "*.txt"))):
        out[os.path.basename(path)[:-4]] = open(path, encoding="utf-8").read()
    return out


@torch.no_grad()
def teacher_forced(model, prompt, answer, device):
    """(number correct, number and '.' correct): greedy decoding reproduces the answer."""
    x = torch.tensor([prompt + answer], device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=x).logits[0]
    pred = logits[len(prompt) - 1:len(prompt) - 1 + len(answer)].argmax(-1).tolist()
    return int(pred[:-1] == answer[:-1]), int(pred == answer)


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
    texts = eval_texts(args.data_dir)
    results["perplexity"] = {}
    for name, text in texts.items():
        for L in EVAL_LENGTHS:
            windows, n_ids = heldout_windows(tok, text, L)
            if len(windows) == 0:
                continue
            nll = mean_nll(model, windows, max(1, 32768 // L), device)
            results["perplexity"]["%s/%d" % (name, L)] = {
                "ppl": math.exp(nll), "nll": nll, "windows": len(windows), "tokens": n_ids}
            log("ppl %s at %d: %.3f (%d windows)" % (name, L, math.exp(nll), len(windows)))
    # Retrieval filler: text of sources the model never saw.
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    unseen = np.array(tok.encode(texts["heldout-sources"], add_special_tokens=False).ids)
    rng = random.Random(args.seed + 99)

    def filler(n):
        start = rng.randrange(0, max(1, len(unseen) - n))
        return [int(t) for t in unseen[start:start + n]]
    synth = SyntheticSamples(lambda s: tok.encode(s, add_special_tokens=False).ids, bos, eos,
                             filler, rng)
    lengths = [L for L in (1024, 2048, 4096, 8192) if L <= args.context]
    grid, strict = {}, {}
    for placement in ("after", "before"):
        for filler_kind in ("natural", "classic"):
            if placement == "before" and filler_kind == "classic":
                continue
            for L in lengths:
                for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
                    ok = ok_strict = 0
                    for _ in range(args.passkey_trials):
                        prompt, answer = synth.passkey(L, depth=depth, placement=placement,
                                                       classic=filler_kind == "classic", phrase=0,
                                                       key=synth.number())
                        a, b = teacher_forced(model, prompt, answer, device)
                        ok, ok_strict = ok + a, ok_strict + b
                    cell = "%s/%s/%d/%d" % (placement, filler_kind, L, int(depth * 100))
                    grid[cell] = ok / args.passkey_trials
                    strict[cell] = ok_strict / args.passkey_trials
                log("passkey %s %s %d: %s" % (placement, filler_kind, L, [
                    grid["%s/%s/%d/%d" % (placement, filler_kind, L, d)]
                    for d in (0, 25, 50, 75, 100)]))
    results["passkey"], results["passkey_strict"] = grid, strict
    results["passkey_trials_per_cell"] = args.passkey_trials
    kv = {}
    for L in lengths:
        ok = 0
        for _ in range(args.passkey_trials * 2):
            # the last look-up's answer: prompt up to its " is", answer " VALUE."
            text = tok.decode(synth.records(L), skip_special_tokens=True)
            cut = text.rfind(" is ") + len(" is")
            prompt = [bos] + tok.encode(text[:cut], add_special_tokens=False).ids
            ok += teacher_forced(model, prompt, tok.encode(text[cut:],
                                                           add_special_tokens=False).ids, device)[1]
        kv[str(L)] = ok / (args.passkey_trials * 2)
    results["records_lookup"] = kv
    log("records lookup (strict): %s" % kv)
    results["generation_sample"] = {}
    for p in ("The history of the kingdom", "To configure the network interface,",
              "def parse_args():\n"):
        ids = [bos] + tok.encode(p, add_special_tokens=False).ids
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
        args.tokenizer_max_bytes = min(args.tokenizer_max_bytes, 5_000_000)
        args.eval_every, args.passkey_trials = 10, 1
        args.tokens_per_step, args.warmup_steps = 65536, 10
    t_start = time.time()
    os.makedirs(args.data_dir, exist_ok=True)
    os.makedirs(args.model_dir, exist_ok=True)
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    from tokenizers import Tokenizer
    if args.eval_only:
        tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
        path = os.path.join(args.model_dir, "eval.json")
        old = json.load(open(path)) if os.path.exists(path) else {}
        old.update(evaluate(args, tok, device))
        old["eval_only_rerun"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                  "seconds": time.time() - t_start}
        with open(path, "w") as f:
            json.dump(old, f, indent=1)
        log("eval-only done in %.1f s" % (time.time() - t_start))
        return
    tok_path = os.path.join(args.data_dir, "tokenizer.json")
    if os.path.exists(tok_path):
        tok = Tokenizer.from_file(tok_path)
    else:
        first = sorted(glob.glob(os.path.join(args.data_dir, "parts", "*.txt.xz")))[0]
        log("training the tokenizer on %s" % first)
        tok = train_tokenizer(read_part(first), args.vocab_size, args.tokenizer_max_bytes)
        tok.save(tok_path)
    ingest_new_parts(tok, args.data_dir)  # at least the first part before the first step
    ingest = Ingest(tok, args.data_dir)
    ingest.start()
    config = build_config(args, tok)
    model, n_params, state = train(args, tok, config, device)
    ingest.stop.set()
    export(args, model, tok, config)
    del model
    torch.cuda.empty_cache()
    results = evaluate(args, tok, device)
    shards = shard_stats(args.data_dir)
    results.update({
        "parameters": n_params, "train_state": state,
        "corpus": {"shards": shards, "tokens": sum(s["tokens"] for s in shards.values()),
                   "bytes": sum(s["bytes"] for s in shards.values())},
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "tokenizers": __import__("tokenizers").__version__,
        "args": vars(args), "wall_seconds": time.time() - t_start,
    })
    log_src = os.path.join(args.data_dir, "train_log.csv")
    if os.path.exists(log_src):
        import shutil
        shutil.copy(log_src, os.path.join(args.model_dir, "train_log.csv"))
        plot_loss(log_src, os.path.join(args.model_dir, "loss.png"))
    with open(os.path.join(args.model_dir, "eval.json"), "w") as f:
        json.dump(results, f, indent=1)
    log("done in %.1f s" % (time.time() - t_start))


if __name__ == "__main__":
    main()
