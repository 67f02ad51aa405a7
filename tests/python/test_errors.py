"""Every error path raises the right exception carrying the engine's message, naming the bad value."""
import pytest

import slimkv
from conftest import CONFIG, CONTEXT, MODEL, THREADS


def test_error_is_a_runtime_error():
    assert issubclass(slimkv.Error, RuntimeError)


@pytest.mark.parametrize("call, exception, text", [
    (lambda: slimkv.Engine("/nonexistent/model"), slimkv.Error, "/nonexistent/model"),
    (lambda: slimkv.Engine(MODEL, kv="hack:bitz=2"), slimkv.Error, "bitz"),
    (lambda: slimkv.Engine(MODEL, device="tpu"), slimkv.Error, "tpu"),
    (lambda: slimkv.Engine(MODEL, threads=-1), ValueError, "threads"),
    (lambda: slimkv.Engine(MODEL, threads="two"), TypeError, ""),
    (lambda: slimkv.KvSpec("hack:bits=2,,"), slimkv.Error, "hack:bits=2,,"),
    (lambda: slimkv.KvSpec("nosuchcodec"), slimkv.Error, "nosuchcodec"),
    (lambda: slimkv.KvSpec(3), TypeError, ""),
])
def test_bad_engines_and_specs(call, exception, text):
    with pytest.raises(exception) as raised:
        call()
    assert text in str(raised.value)


@pytest.mark.parametrize("keywords, exception, text", [
    ({"max_tokens": 0}, ValueError, "max_tokens"),
    ({"temperature": -1.0}, ValueError, "temperature"),
    ({"top_p": 0.0}, ValueError, "top_p"),
    ({"top_p": 1.5}, ValueError, "top_p"),
    ({"top_k": -2}, ValueError, "top_k"),
    ({"stop": [""]}, slimkv.Error, "stop"),
    ({"stop": 5}, TypeError, ""),
    ({"max_tokens": "many"}, TypeError, ""),
])
def test_bad_generation_keywords(engine, keywords, exception, text):
    with pytest.raises(exception) as raised:
        engine.generate("Hello", **keywords)
    assert text in str(raised.value)
    with pytest.raises(exception):
        engine.stream("Hello", **keywords)


def test_bad_prompts(engine):
    with pytest.raises(slimkv.Error, match=f"prompt: {CONTEXT + 1} tokens; the model's context holds {CONTEXT}"):
        engine.generate(" a" * CONTEXT)  # BOS + CONTEXT tokens
    # Among several prompts the bad one is named as Python indexes it, and none runs.
    with pytest.raises(slimkv.Error, match=rf"prompts\[1\]: prompt: {CONTEXT + 1} tokens; the model's context"):
        engine.generate(["Hello", " a" * CONTEXT])
    with pytest.raises(TypeError):
        engine.generate([1, 2, 3])


def test_bad_session_calls(engine):
    session = engine.session()
    with pytest.raises(slimkv.Error, match="no tokens to run"):
        session.prefill([])
    with pytest.raises(slimkv.Error, match=r"token id 999999 at index 1 is outside the vocabulary \[0, "):
        session.prefill([5, 999999])
    with pytest.raises(slimkv.Error, match="token id -3 at index 0"):
        session.decode(-3)
    with pytest.raises(TypeError):
        session.prefill("some text")
    with pytest.raises(slimkv.Error, match=f"more than the model's context of {CONTEXT}"):
        session.prefill([5] * (CONTEXT + 1))
    assert session.num_tokens == 0  # a refused call runs nothing
    session.prefill([5, 6, 7])
    layers, kv_heads = CONFIG["num_hidden_layers"], CONFIG["num_key_value_heads"]
    with pytest.raises(slimkv.Error, match=f"layer {layers} is out of range: the model has {layers} layers"):
        session.kv[layers, 0]
    with pytest.raises(slimkv.Error, match=f"KV head {kv_heads} is out of range: the model has {kv_heads} KV heads"):
        session.kv.head(0, kv_heads)


def test_a_full_engine_gives_sessions_that_say_so():
    engine = slimkv.Engine(MODEL, threads=1, max_sequences=1)
    first = engine.session()
    second = engine.session()
    with pytest.raises(slimkv.Error, match="max_sequences|sequences"):
        second.prefill([5])
    with pytest.raises(slimkv.Error, match="max_sequences"):
        second.kv.layout
    first.prefill([5])
    del first, second
    assert engine.session().prefill([5]).shape == (engine.vocab_size,)


def test_chat_template_errors(engine):
    assert not engine.has_chat_template
    with pytest.raises(slimkv.Error, match="chat template"):
        engine.apply_chat_template([{"role": "user", "content": "Hi"}])
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\]: object is not a JSON value"):
        engine.apply_chat_template([{"role": "user", "content": object()}])
    with pytest.raises(TypeError, match="dict keys must be str"):
        engine.apply_chat_template([{1: "user"}])


def test_evaluate_errors():
    with pytest.raises(slimkv.Error, match="nosuchtask"):
        slimkv.evaluate(MODEL, "dense", "nosuchtask", progress=False, threads=THREADS)
    with pytest.raises(slimkv.Error, match="hack:bitz=2"):
        slimkv.evaluate(MODEL, ["dense", "hack:bitz=2"], "ppl", progress=False, threads=THREADS)
    # samples in any form is read by the CLI's parser: the CLI's messages (`--samples` there).
    for samples, message in [({"ppl": -1}, "samples: 'ppl=-1' is not N or task=N with N a non-negative integer"),
                             (-2, "samples: '-2' is not N or task=N"),
                             ("2,ppl=many", "samples: 'ppl=many' is not N or task=N"),
                             ("", "samples: '' is not N or task=N"),
                             ({"ppl,memory": 1}, "samples: 'ppl,memory' is not a task name")]:
        with pytest.raises(ValueError, match=message):
            slimkv.evaluate(MODEL, "dense", "ppl", samples=samples, progress=False)
    with pytest.raises(slimkv.Error, match="names task 'passkey', which is not among --tasks"):
        slimkv.evaluate(MODEL, "dense", "ppl", samples="1,passkey=2", progress=False, threads=THREADS)
    with pytest.raises(ValueError, match="context must be >= 0"):
        slimkv.evaluate(MODEL, "dense", "ppl", context=-5, progress=False)
    with pytest.raises(ValueError, match="plots=True writes PNG files into out"):
        slimkv.evaluate(MODEL, "dense", "ppl", plots=True, progress=False)
    with pytest.raises(TypeError):
        slimkv.evaluate(MODEL, "dense", "ppl", samples=2.5)
