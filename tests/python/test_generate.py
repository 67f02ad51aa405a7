"""Generation, streaming, the tokenizer and the chat template against the CLI and the engine's rules."""
import os

import numpy as np
import pytest

import slimkv
from conftest import MODEL, THREADS

PROMPT = "Once upon a time, in a small village,"


SAMPLINGS = [
    {},  # generation_config.json: greedy
    {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 7},
]


def cli_generate(cli, sampling, *options):
    """`slimkv generate` of PROMPT, 24 tokens, with generate()'s sampling keywords as its flags."""
    args = ["generate", "--model", MODEL, "--prompt", PROMPT, "--max-tokens", "24", *options]
    names = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed"}
    for key, value in sampling.items():
        args += [names[key], str(value)]
    text = cli(*args)
    assert text.endswith("\n")  # the CLI ends its output with a newline of its own
    return text[:-1]


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_generate_equals_the_cli(engine, cli, sampling):
    expected = cli_generate(cli, sampling, "--threads", str(THREADS))
    [out] = engine.generate(PROMPT, max_tokens=24, **sampling)
    assert out.text == expected
    assert out.prompt_token_ids == engine.tokenizer.encode(PROMPT)
    assert out.finish_reason in ("stop", "length")
    assert len(out.token_ids) <= 24
    assert (len(out.token_ids) == 24) == (out.finish_reason == "length")
    assert engine.tokenizer.decode(out.token_ids, skip_special_tokens=True) == out.text


def test_generate_many_prompts_and_stop_strings(engine):
    outs = engine.generate([PROMPT, "The pass key is"], max_tokens=12)
    assert [o.prompt for o in outs] == [PROMPT, "The pass key is"]
    alone = engine.generate("The pass key is", max_tokens=12)[0]
    assert outs[1].text == alone.text and outs[1].token_ids == alone.token_ids
    # A stop string taken from the greedy text ends it there, the stop string left out.
    full = outs[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert len(stop) == 3
    [stopped] = engine.generate(PROMPT, max_tokens=12, stop=[stop])
    assert stopped.finish_reason == "stop"
    assert stopped.text == full[:full.index(stop)]
    [also] = engine.generate(PROMPT, max_tokens=12, stop=stop)  # one str, as vLLM takes it
    assert also.text == stopped.text


def heldout_prompts(count):
    """Prompts of different lengths (about 10 to 400 tokens): pieces of the model's held-out text."""
    with open(os.path.join(MODEL, "heldout.txt")) as text:
        words = text.read()[:200000].split(" ")
    return [" ".join(words[i * 500:i * 500 + 8 + i * 173 % 300]) for i in range(count)]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 11}])
def test_many_prompts_run_together_and_each_equals_its_output_alone(engine, sampling):
    # generate() batches its prompts through the scheduler; the engine's one-request loop (stream(), as
    # `slimkv generate` runs) and generate() of one prompt at a time are the references.
    prompts = heldout_prompts(8)
    together = engine.generate(prompts, max_tokens=20, ignore_eos=True, **sampling)
    assert [o.prompt for o in together] == prompts
    for prompt, out in zip(prompts, together):
        [alone] = engine.generate(prompt, max_tokens=20, ignore_eos=True, **sampling)
        assert out.token_ids == alone.token_ids and out.text == alone.text
        assert out.prompt_token_ids == engine.tokenizer.encode(prompt)
        assert out.finish_reason == alone.finish_reason == "length" and len(out.token_ids) == 20
        assert "".join(engine.stream(prompt, max_tokens=20, ignore_eos=True, **sampling)) == out.text
    assert engine.generate([], max_tokens=4) == []


def test_generate_runs_beside_open_sessions_on_what_they_leave_free(engine, heldout_ids):
    # max_sequences=3 and one open session: the prompts run two at a time on the other two sequences;
    # the session's sequence is left as it was (its next decode equals a fresh session's).
    small = slimkv.Engine(MODEL, threads=THREADS, max_sequences=3)
    session = small.session()
    session.prefill(heldout_ids[:150])
    prompts = heldout_prompts(5)
    outs = small.generate(prompts, max_tokens=12, ignore_eos=True)
    expected = engine.generate(prompts, max_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    assert session.num_tokens == 150
    fresh = engine.session()
    fresh.prefill(heldout_ids[:150])
    np.testing.assert_array_equal(session.decode(heldout_ids[150]), fresh.decode(heldout_ids[150]))
    # Every sequence held by a session: generate() says so.
    one = slimkv.Engine(MODEL, threads=1, max_sequences=1)
    held = one.session()
    held.prefill([5])
    with pytest.raises(slimkv.Error, match=r"max_sequences \(1\)"):
        one.generate("Hello", max_tokens=2)
    del held
    assert one.generate("Hello", max_tokens=2)[0].token_ids


def test_stream_yields_the_generated_text(engine):
    [whole] = engine.generate(PROMPT, max_tokens=20, temperature=0.8, seed=3)
    stream = engine.stream(PROMPT, max_tokens=20, temperature=0.8, seed=3)
    assert stream.finish_reason is None
    pieces = list(stream)
    assert len(pieces) > 1 and all(pieces)
    assert "".join(pieces) == whole.text
    assert stream.finish_reason == whole.finish_reason
    # Dropping a stream early cancels it and frees the engine for the next call.
    early = engine.stream(PROMPT, max_tokens=20)
    next(early)
    del early
    assert engine.generate(PROMPT, max_tokens=20, temperature=0.8, seed=3)[0].text == whole.text


@pytest.mark.parametrize("text", ["Hello, world! The pass key is 71432.", "  spaces\tand\nlines  ", "ünïcødé ✓"])
def test_tokenizer_equals_the_cli(engine, cli, text):
    expected = [int(i) for i in cli("tokenize", "--model", MODEL, "--text", text).strip().split(",") if i]
    assert engine.tokenizer.encode(text) == expected
    plain = [int(i) for i in cli("tokenize", "--model", MODEL, "--text", text, "--no-special-tokens").strip().split(",") if i]
    assert engine.tokenizer.encode(text, add_special_tokens=False) == plain
    assert engine.tokenizer.decode(plain) == text


def test_chat_template_renders_messages_in_order(tmp_path):
    # The bundled model has no template: a copy of it with one (as tests/engine/engine_chat_template_test.cc).
    for name in os.listdir(MODEL):
        os.symlink(os.path.join(MODEL, name), tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}{% if note %}[{{ note }}]{% endif %}")
    engine = slimkv.Engine(str(tmp_path), threads=1)
    assert engine.has_chat_template
    messages = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"}]
    assert engine.apply_chat_template(messages) == "<|begin_of_text|><|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    assert engine.apply_chat_template(messages, add_generation_prompt=False, note="x").endswith("<|user|>Hi\n[x]")
