#!/usr/bin/env python3
"""A plain reference for the bundled model without transformers or tokenizers: a byte-level BPE
encoder read from tokenizer.json, and the Llama forward pass in PyTorch FP32 read from the
sharded safetensors. It checks, on a CPU, what slimkv's C++ engine must reproduce:

  ppl      held-out perplexity with the card's protocol (first --windows windows)
  passkey  writes and checks a long-context retrieval prompt for `make run`

Needs python3 with torch, numpy and the `regex` module (Debian: python3-torch python3-regex).

    python3 scripts/train/reference_cpu.py ppl --windows 1000 --context 1024 --record
    python3 scripts/train/reference_cpu.py ppl --windows 1000 --context 4096 --record
    python3 scripts/train/reference_cpu.py passkey --tokens 2000 --depth 0.4 --record \
        --out models/slimkv-llama-15m/passkey_prompt.txt
"""
import argparse
import json
import math
import os
import random
import struct

import numpy as np
import torch
import torch.nn.functional as F

from bpe import BpeTokenizer


# ----------------------------------------------------------------------------------------------
# Weights and the forward pass
# ----------------------------------------------------------------------------------------------

def load_safetensors(model_dir):
    index = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        data = open(os.path.join(model_dir, shard), "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            assert info["dtype"] == "BF16", "%s: expected BF16, found %s" % (name, info["dtype"])
            a, b = info["data_offsets"]
            raw = np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.uint16).astype(np.uint32)
            tensors[name] = torch.from_numpy((raw << 16).view(np.float32).copy()).reshape(
                info["shape"])
    return tensors


class Llama:
    def __init__(self, model_dir):
        self.cfg = json.load(open(os.path.join(model_dir, "config.json")))
        self.w = load_safetensors(model_dir)
        c = self.cfg
        theta = c.get("rope_theta") or c["rope_parameters"]["rope_theta"]
        d = c["head_dim"]
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))

    def rms_norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"]) * w

    def rope(self, x, pos):
        """HF Llama convention: rotate halves (dims i and i + d/2 form a pair)."""
        ang = pos[:, None].double() * self.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1).float()
        sin = torch.cat([ang.sin(), ang.sin()], -1).float()
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    @torch.no_grad()
    def logits(self, ids, observe=None):
        """observe(layer, k, probs), when given, sees each layer's post-RoPE keys as the KV cache
        holds them, (KV heads, T, D), and its attention probabilities, (heads, T, T)."""
        c, w = self.cfg, self.w
        T, H, KV, D = len(ids), c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        pos = torch.arange(T)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]                  # (T, hidden)
        for l in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % l
            h = self.rms_norm(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, H, D).transpose(0, 1)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, KV, D).transpose(0, 1)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, KV, D).transpose(0, 1)
            q, k = self.rope(q, pos), self.rope(k, pos)
            cached_k = k
            k = k.repeat_interleave(H // KV, 0)                                 # (H, T, D)
            v = v.repeat_interleave(H // KV, 0)
            scores = (q @ k.transpose(1, 2)) / math.sqrt(D)                     # (H, T, T)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            probs = torch.softmax(scores, -1)
            if observe:
                observe(l, cached_k, probs)
            o = probs @ v                                                       # (H, T, D)
            x = x + o.transpose(0, 1).reshape(T, H * D) @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms_norm(x, w[p + "post_attention_layernorm.weight"])
            gate = F.silu(h @ w[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        x = self.rms_norm(x, w["model.norm.weight"])
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])          # tied
        return x @ head.T                                                       # (T, vocab)


# ----------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------

def cmd_ppl(args, tok, model):
    ids = tok.encode(open(args.heldout).read())
    bos = tok.specials["<|begin_of_text|>"]
    L = args.context
    n = min(args.windows, len(ids) // (L - 1))
    total = 0.0
    for k in range(n):
        window = [bos] + ids[k * (L - 1):(k + 1) * (L - 1)]
        logits = model.logits(window)
        total += F.cross_entropy(logits[:-1], torch.tensor(window[1:]), reduction="sum").item()
    nll = total / (n * (L - 1))
    result = {"heldout_tokens": len(ids), "context": L, "windows": n, "nll": nll,
              "ppl": math.exp(nll)}
    print(json.dumps(result))
    record(args, "ppl_%d" % L, result, heldout_tokens=len(ids))


def cmd_passkey(args, tok, model):
    """A pass-key prompt of about --tokens tokens with held-out text as filler."""
    rng = random.Random(args.seed)
    key = str(rng.randint(10000, 99999))
    header = ("There is an important pass key hidden inside a lot of irrelevant text. "
              "Find it and memorize it. I will quiz you about the pass key.\n\n")
    needle = " The pass key is %s. Remember it. %s is the pass key. " % (key, key)
    question = "\n\nWhat is the pass key? The pass key is"
    text = open(args.heldout).read()
    start = rng.randrange(0, len(text) // 2)
    filler_chars = int(args.tokens * 3.6)
    filler = text[start:start + filler_chars]
    cut = filler.find(". ", int(len(filler) * args.depth)) + 1
    prompt = header + filler[:cut] + needle + filler[cut:] + question
    ids = [tok.specials["<|begin_of_text|>"]] + tok.encode(prompt)
    generated = []
    for _ in range(6):
        generated.append(int(model.logits(ids + generated)[-1].argmax()))
    answer = tok.decode(generated)
    print(json.dumps({"prompt_tokens": len(ids), "key": key, "generated": answer,
                      "correct": answer.strip().startswith(key)}))
    if args.out:
        info = {"prompt_file": os.path.basename(args.out), "prompt_tokens": len(ids),
                "bos": "prepended", "expected_answer": " " + key,
                "reference_greedy_continuation": answer, "depth": args.depth}
        with open(args.out, "w") as f:
            f.write(prompt)
        with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
            json.dump(info, f, indent=1)
        record(args, "passkey_prompt", info)


def record(args, key, value, **extra):
    """With --record, merge a result into <model-dir>/reference_cpu.json (read by write_card.py)."""
    if not args.record:
        return
    path = os.path.join(args.model_dir, "reference_cpu.json")
    data = json.load(open(path)) if os.path.exists(path) else {}
    data[key] = value
    data.update(extra)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["ppl", "passkey"])
    ap.add_argument("--model-dir", default="models/slimkv-llama-15m")
    ap.add_argument("--heldout", default="models/slimkv-llama-15m/heldout.txt")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--depth", type=float, default=0.4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="")
    ap.add_argument("--record", action="store_true",
                    help="merge the result into <model-dir>/reference_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    tok = BpeTokenizer(os.path.join(args.model_dir, "tokenizer.json"))
    model = Llama(args.model_dir)
    {"ppl": cmd_ppl, "passkey": cmd_passkey}[args.command](args, tok, model)


if __name__ == "__main__":
    main()
