"""The module on device "cuda": generation equals `slimkv generate --device cuda`, batched prompts equal
each alone, and a session's logits and KV (a host copy of the GPU's) equal the CPU engine's within FP16.
Skipped where no GPU is usable (the error says why); SLIMKV_REQUIRE_CUDA=1 makes that a failure (the GPU
machine's run)."""
import os

import numpy as np
import pytest

import slimkv
from conftest import MODEL, THREADS
from test_generate import PROMPT, SAMPLINGS, cli_generate, heldout_prompts


def cuda_engine(kv="dense"):
    try:
        return slimkv.Engine(MODEL, kv=kv, device="cuda", threads=THREADS)
    except slimkv.Error as unavailable:
        if os.environ.get("SLIMKV_REQUIRE_CUDA") == "1" or "cuda" not in str(unavailable).lower():
            raise
        pytest.skip(f"device cuda is not usable here: {unavailable}")


@pytest.fixture(scope="module")
def gpu():
    return cuda_engine()


def relative_l2(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_generate_equals_the_cli_on_cuda(gpu, cli, sampling):
    [out] = gpu.generate(PROMPT, max_tokens=24, **sampling)
    assert out.text == cli_generate(cli, sampling, "--device", "cuda")
    assert gpu.device == "cuda"


def test_many_prompts_on_cuda_each_equal_its_output_alone(gpu):
    prompts = heldout_prompts(8)
    together = gpu.generate(prompts, max_tokens=20, ignore_eos=True)
    for prompt, out in zip(prompts, together):
        assert "".join(gpu.stream(prompt, max_tokens=20, ignore_eos=True)) == out.text
        assert gpu.generate(prompt, max_tokens=20, ignore_eos=True)[0].token_ids == out.token_ids


def test_a_cuda_session_equals_the_cpu_one_within_fp16(gpu, engine, heldout_ids):
    ids = heldout_ids[:150]  # two sealed blocks of 64 and 22 open tokens
    session, reference = gpu.session(), engine.session()
    logits = session.prefill(ids, all_logits=True)
    cpu_logits = reference.prefill(ids, all_logits=True)
    assert logits.shape == cpu_logits.shape and logits.dtype == np.float32
    assert relative_l2(logits, cpu_logits) < 1e-2
    kv, cpu_kv = session.kv, reference.kv
    assert kv.layout.codec.startswith("dense:dtype=f16"), kv.layout.codec
    for layer in (0, kv.layout.num_layers - 1):
        for head in range(kv.layout.num_kv_heads):
            got, want = kv[layer, head], cpu_kv[layer, head]
            assert [(b.first_token, b.last_token) for b in got.blocks] == [(0, 64), (64, 128)]
            assert got.open_tokens == want.open_tokens == 22
            for block, cpu_block in zip(got.blocks, want.blocks):
                for x, y in zip(block.decode(), cpu_block.decode()):
                    np.testing.assert_array_equal(x.astype(np.float16).astype(np.float32), x)  # FP16 values
                    assert relative_l2(x, y) < 2e-2, (layer, head, block.index)
            for x, y in zip(got.open(), want.open()):
                assert relative_l2(x, y) < 2e-2
    # A host copy: the session's next token changes the GPU, not what was read; a new read has it.
    head = kv[0, 0]
    session.decode(heldout_ids[150])
    assert head.open_tokens == 22 and session.kv[0, 0].open_tokens == 23
    assert head.last_selection() is None  # no selector: every token
    with pytest.raises(slimkv.Error):
        kv.memory()  # a device-cpu report


def test_zack_on_cuda_says_its_kv_cannot_be_read():
    try:
        engine = slimkv.Engine(MODEL, kv="zack:r=0", device="cuda", threads=THREADS)
    except slimkv.Error as refused:
        pytest.skip(f"zack:r=0 does not load here: {refused}")
    session = engine.session()
    session.prefill([5, 6, 7])
    with pytest.raises(slimkv.Error, match="zack"):
        session.kv.layout
