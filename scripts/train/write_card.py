#!/usr/bin/env python3
"""Write the model card (models/<name>/README.md) from what the GPU run measured.

Reads <model-dir>/eval.json and config.json (written by train.py on the GPU machine) and
scripts/corpus/manifest.json (written by build_corpus.py); adds the token counts to the manifest.
Runs anywhere with plain Python 3 (no torch needed):

    python3 scripts/train/write_card.py --model-dir models/slimkv-llama-15m --gpu-minutes 13
"""
import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "..", "corpus", "manifest.json")


def table(grid, filler):
    lengths = (1024, 2048, 3072, 4096)
    depths = (0, 25, 50, 75, 100)
    rows = ["| length \\ depth | " + " | ".join("%d%%" % d for d in depths) + " | mean |",
            "|---" * (len(depths) + 2) + "|"]
    for L in lengths:
        cells = [grid["%s/%d/%d" % (filler, L, d)] for d in depths]
        rows.append("| %d | " % L + " | ".join("%.2f" % c for c in cells) +
                    " | %.2f |" % (sum(cells) / len(cells)))
    return "\n".join(rows)


def reference_section(model_dir, p1, p4):
    """Numbers from scripts/train/reference_cpu.py (no transformers), if they were recorded."""
    path = os.path.join(model_dir, "reference_cpu.json")
    if not os.path.exists(path):
        return ""
    ref = json.load(open(path))
    rows = []
    for key, hf in (("ppl_1024", p1), ("ppl_4096", p4)):
        if key in ref:
            r = ref[key]
            rows.append("| %d | %d | %.4f | %.4f | %+.3f%% |" % (
                r["context"], r["windows"], hf["ppl"], r["ppl"], 100 * (r["ppl"] / hf["ppl"] - 1)))
    text = ("\nThe same perplexity from `scripts/train/reference_cpu.py` (a plain FP32 PyTorch forward "
            "and a Python BPE encoder read from this folder, no transformers or tokenizers; it "
            "encodes `heldout.txt` to the same %d tokens):\n\n"
            "| context | windows | HF transformers (BF16) | reference (FP32) | difference |\n"
            "|---|---|---|---|---|\n" % ref.get("heldout_tokens", 0)) + "\n".join(rows) + "\n"
    if "passkey_prompt" in ref:
        pk = ref["passkey_prompt"]
        text += ("\n`passkey_prompt.txt` (%d tokens with BOS, key at %d%% depth in held-out text; "
                 "`passkey_prompt.json` has the expected answer) is the retrieval demo for "
                 "`make run`: the reference's greedy continuation is `%s`.\n" % (
                     pk["prompt_tokens"], int(100 * pk["depth"]),
                     pk["reference_greedy_continuation"].strip()))
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default="models/slimkv-llama-15m")
    ap.add_argument("--gpu-minutes", type=float, required=True,
                    help="GPU time spent on the run(s) that made this model, for the card")
    ap.add_argument("--notes", default="", help="extra text for the 'Limitations' section")
    args = ap.parse_args()

    ev = json.load(open(os.path.join(args.model_dir, "eval.json")))
    cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
    manifest = json.load(open(MANIFEST))
    corpus = ev["corpus"]
    manifest["tokens"] = {"train": corpus["train_tokens"], "heldout": ev["heldout_tokens"],
                          "train_bytes_per_token": round(corpus["train_bytes"] /
                                                         corpus["train_tokens"], 3)}
    manifest["tokenizer"] = "models/%s/tokenizer.json" % os.path.basename(
        os.path.normpath(args.model_dir))
    with open(MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")

    a, st = ev["args"], ev["train_state"]
    name = os.path.basename(os.path.normpath(args.model_dir))
    weight_bytes = sum(os.path.getsize(os.path.join(args.model_dir, f))
                       for f in os.listdir(args.model_dir) if f.endswith(".safetensors"))
    shards = sorted(f for f in os.listdir(args.model_dir) if f.endswith(".safetensors"))
    sources = manifest["sources"]
    src_rows = "\n".join("| %s | %d | %.2f |" % (k, v["documents"], v["bytes"] / 1e6)
                         for k, v in sources.items() if v["documents"])
    rope = cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta")
    p1, p4 = ev["heldout_ppl_1024"], ev["heldout_ppl_4096"]
    grid = ev["passkey"]
    mean = lambda f: sum(v for k, v in grid.items() if k.startswith(f)) / 20
    epochs = st["tokens"] / corpus["train_tokens"]
    card = f"""# {name}

slimkv's bundled model: a small Llama-architecture causal LM trained from scratch by slimkv's own
committed recipe (`scripts/corpus/`, `scripts/train/`), so that KV-cache compression can be
measured on a model whose attention has real structure (sinks, local heads, retrieval heads).
It is a research fixture, not a useful assistant: {ev['parameters']/1e6:.1f}M parameters trained
for {st['train_seconds'] if 'train_seconds' in st else st['elapsed_s']/60:.1f} minutes on one GPU.

## Files (Hugging Face layout)
- `config.json` (`LlamaForCausalLM`), `generation_config.json`
- {', '.join('`%s`' % s for s in shards)} + `model.safetensors.index.json`: BF16 weights,
  sharded with `max_shard_size="15MB"` ({weight_bytes/1e6:.1f} MB in all; the LM head is tied to
  the embedding and not stored separately)
- `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`: byte-level BPE
- `heldout.txt`: the held-out evaluation text ({manifest['heldout']['bytes']/1e6:.2f} MB,
  {manifest['heldout']['documents']} documents, {ev['heldout_tokens']} tokens)
- `train_log.csv`, `loss.png`: the training curve; `eval.json`: every number on this card

## Architecture
| | |
|---|---|
| class | `LlamaForCausalLM` (transformers {ev['transformers']}) |
| parameters | {ev['parameters']:,} ({2*ev['parameters']/1e6:.1f} MB in BF16) |
| layers | {cfg['num_hidden_layers']} |
| hidden size | {cfg['hidden_size']} |
| attention | {cfg['num_attention_heads']} query heads, {cfg['num_key_value_heads']} KV heads (GQA {cfg['num_attention_heads']//cfg['num_key_value_heads']}:1), head_dim {cfg['head_dim']} |
| MLP | SwiGLU, intermediate size {cfg['intermediate_size']} |
| positions | RoPE, theta {rope:g}, context {cfg['max_position_embeddings']} |
| norm | RMSNorm, eps {cfg['rms_norm_eps']} |
| vocabulary | {cfg['vocab_size']} (byte-level BPE), tied input/output embeddings |
| KV per token | {2*cfg['num_hidden_layers']*cfg['num_key_value_heads']*cfg['head_dim']*2} bytes in BF16 ({cfg['num_hidden_layers']} layers x K,V x {cfg['num_key_value_heads']} heads x {cfg['head_dim']}) |

Tokenizer: HF `tokenizers` BPE, pre-tokenizer = `Split` with Llama-3's regex (isolated) followed by
`ByteLevel(add_prefix_space=False, use_regex=False)`, `ByteLevel` decoder; special tokens
`<|begin_of_text|>` (id {cfg['bos_token_id']}, BOS), `<|end_of_text|>` (id {cfg['eos_token_id']}, EOS),
`<|pad|>` (id {cfg.get('pad_token_id')}); a `TemplateProcessing` post-processor prepends BOS.

## Data
Built by `scripts/corpus/build_corpus.py` from the English documentation and texts in the Debian 12
packages listed in `scripts/corpus/packages.txt` (exact versions and .deb hashes in
`scripts/corpus/manifest.json`): markup stripped, code blocks and tables dropped, paragraphs
re-flowed, documents and paragraphs deduplicated, split by document into train (99%) and held-out
(1%, capped at 2 MB).

| source | documents | MB |
|---|---|---|
{src_rows}

Train split: {manifest['train']['documents']} documents, {manifest['train']['bytes']/1e6:.1f} MB,
**{corpus['train_tokens']/1e6:.1f}M tokens** ({corpus['train_bytes']/corpus['train_tokens']:.2f} bytes/token);
{manifest['train']['xz_bytes']/1e6:.1f} MB as xz. Held-out: {ev['heldout_tokens']} tokens.

Synthetic long-context retrieval samples are generated during training (seeded, `train.py`
`SyntheticSamples`): a pass key hidden in filler (repeated "The grass is green..." sentences or
natural text) at a random depth, with or without an instruction header and with the question
before and/or after the context; 2-6 "special magic number" needles with 1-3 questions; key-value
record lookup with 1-3 queries. About {a['synthetic_fraction']*100:.0f}% of rows start with one
({100*st['synthetic_tokens']/st['tokens']:.0f}% of all training tokens).

## Training
- Objective: next-token cross-entropy on every position; rows are random windows of the packed
  token stream (`[BOS] doc [EOS] [BOS] doc ...`, no cross-document masking).
- Curriculum by wall-clock fraction: `{a['curriculum']}` (fraction:sequence length),
  {a['tokens_per_step']} tokens per step.
- AdamW (betas 0.9/0.95, weight decay {a['weight_decay']} on matrices), peak LR {a['lr']},
  {a['warmup_steps']} warmup steps, constant, then cosine decay to {a['min_lr_ratio']}x over the
  last {a['decay_fraction']*100:.0f}% of the time budget (warmup-stable-decay); grad clip 1.0;
  BF16 autocast with FP32 master weights; SDPA attention; `torch.compile`: {st.get('compiled')}.
- {st['step']} steps, {st['tokens']/1e6:.0f}M tokens ({epochs:.1f} passes over the train split,
  synthetic rows included), {st['elapsed_s']/60:.1f} minutes of training on one {ev['gpu']}
  (torch {ev['torch']}); the whole run (tokenizer, tokenization, training, export, evaluation)
  took {ev['wall_seconds']/60:.1f} minutes. GPU time for this model in all: about
  {args.gpu_minutes:.0f} minutes.

![loss curve](loss.png)

## Evaluation (HF transformers on the GPU, reloading this folder in BF16)
Held-out perplexity. Protocol: encode `heldout.txt` as one string without special tokens, cut the
ids into consecutive chunks of L-1 tokens (remainder dropped), prepend BOS to each, and take
exp(mean NLL over all chunk tokens).

| context L | windows | perplexity |
|---|---|---|
| 1024 | {p1['windows']} | **{p1['ppl']:.3f}** |
| 4096 | {p4['windows']} | **{p4['ppl']:.3f}** |

""" + reference_section(args.model_dir, p1, p4) + f"""
slimkv's perplexity on the same text: to be added once the engine's `eval` exists (must agree
within 0.5%).

Pass-key retrieval, accuracy over {ev['passkey_trials_per_cell']} random 3-7 digit keys per cell
(teacher-forced greedy check, equal to greedy decoding: the argmax at every token of " N" must
reproduce the key). The prompt, `prompt + answer` = L tokens: instruction header, filler with
"The pass key is N. Remember it. N is the pass key." at the given depth, then "What is the pass
key? The pass key is".

Filler = repeated "The grass is green. The sky is blue. ..." (mean {mean('classic'):.2f}):

{table(grid, 'classic')}

Filler = natural text taken from `heldout.txt` (mean {mean('natural'):.2f}):

{table(grid, 'natural')}

Strict accuracy (the number *and* the "." after it): mean
{sum(ev['passkey_strict'].values())/len(ev['passkey_strict']):.2f}. The model usually ends its answer with
`<|end_of_text|>` instead of "." — an off-by-one in the sample generator of the run that trained
it cut the final "." of every synthetic sample before the EOS (fixed in `train.py` since). Greedy
continuations at 50% depth:

""" + "\n".join("- %s: expected `%s`, generated `%s`" % (k, v['expected'].strip(), v['generated'].strip())
                for k, v in ev.get("passkey_samples", {}).items()) + f"""

Greedy retrieval sample ({ev['retrieval_sample']['prompt_tokens']}-token natural-filler prompt):
expected `{ev['retrieval_sample']['expected'].strip()}`, generated
`{ev['retrieval_sample']['generated'].strip()!r}`.

Greedy text samples (repetition penalty 1.1):
""" + "\n".join("- *%s* ... %s" % (k, v.replace("\n", " ")) for k, v in
                ev["generation_sample"].items()) + f"""

## Reproduce
On a Debian 12 machine (root, apt sources reachable):
```
nice python3 scripts/corpus/build_corpus.py --work .carry --heldout models/{name}/heldout.txt
```
On one CUDA GPU with torch, transformers, tokenizers, matplotlib (here: `{ev['gpu']}`):
```
python3 scripts/train/train.py --compile --corpus .carry/corpus/train.txt.xz \\
    --heldout models/{name}/heldout.txt --model-dir models/{name} --work /root/slimkv_work \\
    --train-minutes {a['train_minutes']:g} --tokenizer-max-bytes {a['tokenizer_max_bytes']}
# a run cut short: the same command with --resume continues from /root/slimkv_work/ckpt.pt
# the evaluation alone, on this folder (what produced the numbers above):
python3 scripts/train/train.py --eval-only --model-dir models/{name} --heldout models/{name}/heldout.txt
python3 scripts/train/write_card.py --model-dir models/{name} --gpu-minutes N
```
The data pipeline is deterministic; training on a GPU is not bit-exact (a wall-clock budget, not a
step count, ends it, and kernels are non-deterministic), so a rerun gives a close, not identical, model.

## Limitations
- Tiny and briefly trained: text is locally fluent at best; do not expect knowledge or reasoning.
- The corpus is technical documentation (Linux, Python, PostgreSQL, Perl, Debian...), a
  dictionary (GCIDE), the KJV Bible and Jane Austen's novels: narrow English.
- Retrieval was trained with the same templates the evaluation uses; it shows that retrieval
  heads exist, not that the model generalises to other needle formats.
{args.notes}
"""
    with open(os.path.join(args.model_dir, "README.md"), "w") as f:
        f.write(card)
    print("wrote %s/README.md" % args.model_dir)


if __name__ == "__main__":
    main()
