#!/usr/bin/env python3
"""engine.generate(prompts) of the Python module: the prompts batched by the scheduler (one call) beside
the same prompts generated one after another (a call each), per KV spec, with the speed-up and whether
every output is the same both ways (docs/python.md).

    PYTHONPATH=build/release/python python3 bench/python_generate_batch.py \\
        [--model models/slimkv-llama-15m] [--kv dense hack:bits=2] [--prompts 8] [--max-tokens 64] \\
        [--device cpu] [--threads 0] [--repeat 3]

Prompts are pieces of the model's held-out text of different lengths; every request generates exactly
--max-tokens tokens (ignore_eos), greedy, so both ways do the same work. Each way is timed --repeat times
after a warm-up, alternating, and its best time is reported.
"""
import argparse
import os
import time

import slimkv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def heldout_prompts(model, count):
    """`count` prompts of about 20 to 400 tokens: word ranges of heldout.txt (the model's evaluation text)."""
    with open(os.path.join(model, "heldout.txt")) as text:
        words = text.read()[:400000].split(" ")
    return [" ".join(words[i * 700:i * 700 + 16 + i * 173 % 300]) for i in range(count)]


def seconds(run):
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "slimkv-llama-15m"))
    parser.add_argument("--kv", nargs="+", default=["dense", "hack:bits=2"], help="KV specs")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.prompts < 1 or args.max_tokens < 1 or args.repeat < 1:
        parser.error("--prompts, --max-tokens and --repeat must be >= 1")
    prompts = heldout_prompts(args.model, args.prompts)
    keywords = dict(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    print(f"# {args.prompts} prompts, {args.max_tokens} tokens each, device {args.device}, threads {args.threads}, "
          f"best of {args.repeat}")
    print(f"{'kv spec':<16} {'prompt tok':>10} {'generated':>9} {'one by one s':>12} {'tok/s':>8} "
          f"{'batched s':>10} {'tok/s':>8} {'speed-up':>8}  same outputs")
    for spec in args.kv:
        engine = slimkv.Engine(args.model, kv=spec, device=args.device, threads=args.threads)
        prompt_tokens = sum(len(engine.tokenizer.encode(p)) for p in prompts)
        one_by_one = [engine.generate(p, **keywords)[0] for p in prompts]  # warm-up, and the reference
        batched = engine.generate(prompts, **keywords)
        same = [a.token_ids for a in one_by_one] == [b.token_ids for b in batched]
        times = {"one": [], "batched": []}
        for _ in range(args.repeat):  # alternating, so that a busy machine slows both alike
            times["one"].append(seconds(lambda: [engine.generate(p, **keywords) for p in prompts]))
            times["batched"].append(seconds(lambda: engine.generate(prompts, **keywords)))
        one, both = min(times["one"]), min(times["batched"])
        generated = sum(len(o.token_ids) for o in batched)
        print(f"{spec:<16} {prompt_tokens:>10} {generated:>9} {one:>12.3f} {generated / one:>8.1f} "
              f"{both:>10.3f} {generated / both:>8.1f} {one / both:>7.2f}x  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
