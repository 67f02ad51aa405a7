#!/usr/bin/env python3
"""End-to-end decode with Hugging Face transformers on the same GPU, the baseline for
bench_decode_e2e_cuda: a random FP16 model of Llama-3-8B's shape (made on the GPU, nothing downloaded),
each sequence prefilled with --prompt random tokens, then greedy decoding. Decode time is
generate(prompt + steps new tokens) minus generate(prompt + 1 new token), over the steps − 1 extra
tokens, so the prefill is not counted; SDPA attention, dynamic KV cache (transformers' defaults).

  python3 bench/cuda/decode_e2e_transformers.py --batches 1,16 --prompt 1024 --steps 64
"""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def llama3_8b():
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                       rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def generate_seconds(model, prompt, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(llama3_8b()).eval()
    print(f"transformers: random Llama-3-8B shape, FP16, attention {model.config._attn_implementation}")
    print(f"{'batch':>5} {'prompt':>7} {'step ms':>9} {'decode t/s':>11}")
    with torch.inference_mode():
        for batch in [int(b) for b in args.batches.split(",")]:
            prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt), device="cuda")
            generate_seconds(model, prompt, 2)  # warm-up
            one = generate_seconds(model, prompt, 1)
            many = generate_seconds(model, prompt, args.steps)
            step_ms = (many - one) / (args.steps - 1) * 1e3
            print(f"{batch:5d} {args.prompt:7d} {step_ms:9.3f} {batch / step_ms * 1e3:11.1f}")


if __name__ == "__main__":
    main()
