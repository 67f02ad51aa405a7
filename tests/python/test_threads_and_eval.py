"""Python threads run the model at once (the GIL released), and evaluate() equals `slimkv eval`."""
import json
import threading
import time

import numpy as np
import pytest

import slimkv
from conftest import MODEL, THREADS


def test_threads_on_separate_engines_and_sessions(engine, heldout_ids):
    prompts = ["The pass key is", "Once upon a time"]
    expected = [engine.generate(p, max_tokens=16)[0].text for p in prompts]
    expected_logits = [engine.session().prefill(heldout_ids[i * 40:(i + 1) * 40]) for i in range(3)]
    other = slimkv.Engine(MODEL, threads=1)
    results, errors = {}, []

    def run(name, work):
        try:
            results[name] = work()
        except Exception as failure:  # reported below: an exception in a thread would pass silently
            errors.append(failure)

    work = {
        "engine0": lambda: engine.generate(prompts[0], max_tokens=16)[0].text,
        "engine1": lambda: other.generate(prompts[1], max_tokens=16)[0].text,
    }
    # Sessions of one engine on three threads: the engine runs one call at a time, each on its own sequence.
    for i in range(3):
        work[f"session{i}"] = lambda i=i: engine.session().prefill(heldout_ids[i * 40:(i + 1) * 40])
    threads = [threading.Thread(target=run, args=item) for item in work.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert [results["engine0"], results["engine1"]] == expected
    for i in range(3):
        np.testing.assert_array_equal(results[f"session{i}"], expected_logits[i])


def test_the_gil_is_released_while_the_model_runs(heldout_ids):
    # While another thread runs a long prefill, this thread keeps running Python: the longest pause
    # between its loop turns stays far below the call's duration (held GIL: the whole call).
    engine = slimkv.Engine(MODEL, threads=1)
    session = engine.session()
    done = threading.Event()

    def prefill():
        started = time.monotonic()
        session.prefill(heldout_ids[:2000])
        durations.append(time.monotonic() - started)
        done.set()

    durations, turns = [], []
    thread = threading.Thread(target=prefill)
    thread.start()
    while not done.is_set():
        turns.append(time.monotonic())
        time.sleep(0.001)
    thread.join()
    longest_pause = max(np.diff(turns)) if len(turns) > 1 else durations[0]
    assert durations[0] > 0.2, "the prefill is too short to tell"
    assert longest_pause < durations[0] / 4, (longest_pause, durations[0])


def test_sessions_of_separate_engines_run_at_once(heldout_ids):
    # A short prefill on one engine finishes while a long one on another engine is still running: neither
    # the GIL nor a lock of the module serializes them (sessions of one engine do wait for each other:
    # an engine runs one call at a time).
    long_engine, short_engine = slimkv.Engine(MODEL, threads=1), slimkv.Engine(MODEL, threads=1)
    started, finished = threading.Event(), {}

    def long_prefill():
        session = long_engine.session()
        started.set()
        session.prefill(heldout_ids[:1500])
        finished["long"] = time.monotonic()

    thread = threading.Thread(target=long_prefill)
    thread.start()
    started.wait()
    time.sleep(0.05)  # the long prefill is inside the engine now
    short_engine.session().prefill(heldout_ids[:20])
    finished["short"] = time.monotonic()
    thread.join()
    assert finished["short"] < finished["long"], "the short prefill waited for the long one"


def test_evaluate_equals_the_cli(cli, tmp_path):
    specs = ["dense", "hack:bits=2"]
    # samples in the CLI's mixed form: 2 for every task, 1 for ppl.
    args = dict(context=128, samples="2,ppl=1", threads=THREADS, progress=False)
    table = slimkv.evaluate(MODEL, specs, "ppl,memory", dataframe=False, out=str(tmp_path / "python"), **args)
    assert table and all(set(row) >= {"spec", "task", "metric", "value"} for row in table)
    assert {row["spec"] for row in table} == set(specs) and {row["task"] for row in table} == {"ppl", "memory"}
    cli("eval", "--model", MODEL, "--kv", ",".join(specs), "--tasks", "ppl,memory", "--context", "128",
        "--samples", "2,ppl=1", "--threads", str(THREADS), "--no-plots", "--out", str(tmp_path / "cli"))
    results = {}
    for name in ("python", "cli"):
        with open(tmp_path / name / "results.json") as results_file:
            results[name] = json.load(results_file)
    assert [{k: v for k, v in row.items() if v is not None} for row in table] == results["cli"]["results"]
    assert results["python"]["settings"]["samples"] == results["cli"]["settings"]["samples"] == {"ppl": 1, "memory": 2}
    frame = slimkv.evaluate(MODEL, specs, "ppl", **args)
    try:
        import pandas
    except ImportError:
        assert frame == [row for row in table if row["task"] == "ppl"]
    else:
        assert isinstance(frame, pandas.DataFrame)
        assert frame["value"].tolist() == [row["value"] for row in table if row["task"] == "ppl"]


@pytest.mark.parametrize("samples, expected", [
    (3, {"ppl": 3, "memory": 3}),
    ({"ppl": 2}, {"ppl": 2, "memory": 1}),
    ("ppl=2", {"ppl": 2, "memory": 1}),
    ("3,memory=1", {"ppl": 3, "memory": 1}),
    ({}, {"ppl": 4, "memory": 1}),
])
def test_evaluate_takes_samples_as_the_cli_does(tmp_path, samples, expected):
    # What results.json records per task (each task's default where none is given: ppl 4, memory 1;
    # docs/eval.md).
    slimkv.evaluate(MODEL, "dense", ["ppl", "memory"], context=64, samples=samples, threads=THREADS, progress=False,
                    dataframe=False, out=str(tmp_path))
    with open(tmp_path / "results.json") as results:
        assert json.load(results)["settings"]["samples"] == expected


def test_evaluate_draws_its_progress_on_python_stderr(capsys):
    # Through sys.stderr (what a notebook shows), not C's stderr: pytest's capture sees it.
    slimkv.evaluate(MODEL, "dense", "ppl", context=128, samples=1, threads=THREADS, dataframe=False)
    captured = capsys.readouterr()
    assert "eval: ppl" in captured.err and "done in" in captured.err, captured.err
    assert captured.out == ""
