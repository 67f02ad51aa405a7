"""Sessions: logits as NumPy arrays equal to the CLI's, prefill against stepwise decode, and the KV cache
read per (layer, KV head)."""
import json
import os
import struct

import numpy as np
import pytest

import slimkv
from conftest import CONFIG, MODEL, THREADS


def test_logits_equal_the_cli(engine, cli, heldout_ids, tmp_path):
    ids = heldout_ids[:70]
    tokens = ",".join(map(str, ids))
    for mode in ("prefill", "incremental"):
        cli("logits", "--model", MODEL, "--tokens", tokens, "--out", str(tmp_path / f"{mode}.npy"), "--mode", mode,
            "--threads", str(THREADS))
    session = engine.session()
    logits = session.prefill(ids, all_logits=True)
    assert logits.dtype == np.float32 and logits.shape == (70, engine.vocab_size)
    np.testing.assert_array_equal(logits, np.load(tmp_path / "prefill.npy"))
    stepwise = engine.session()
    rows = np.stack([stepwise.decode(i) for i in ids])
    np.testing.assert_array_equal(rows, np.load(tmp_path / "incremental.npy"))


def test_prefill_rows_equal_stepwise_decode(engine, heldout_ids):
    ids = heldout_ids[:100]  # one sealed block and an open one
    whole = engine.session()
    all_rows = whole.prefill(ids, all_logits=True)
    assert all_rows.shape == (100, engine.vocab_size) and whole.num_tokens == 100
    last = engine.session().prefill(ids)
    assert last.shape == (engine.vocab_size,)
    # The lm_head GEMM of one row and of 100 round differently: FP32 rounding apart.
    np.testing.assert_allclose(last, all_rows[-1], rtol=0, atol=1e-4)
    stepwise = engine.session()
    first = stepwise.prefill(ids[:1])
    rows = [first] + [stepwise.decode(i) for i in ids[1:]]
    assert all(row.shape == (engine.vocab_size,) and row.dtype == np.float32 for row in rows)
    np.testing.assert_allclose(np.stack(rows), all_rows, rtol=0, atol=2e-4)
    # The array owns the engine's buffer: it stays valid and writable after the session is gone.
    del whole
    all_rows[0, 0] = 1.0
    assert all_rows.flags.writeable and all_rows.flags.c_contiguous


def test_dense_blocks_hold_the_kv_exactly_and_hack_within_its_error(engine, heldout_ids):
    ids = heldout_ids[:150]  # two sealed blocks of 64 and 22 open tokens
    dense = engine.session()
    dense.prefill(ids)
    layout = dense.kv.layout
    assert (layout.num_layers, layout.num_kv_heads) == (CONFIG["num_hidden_layers"], CONFIG["num_key_value_heads"])
    assert layout.block_tokens == 64
    head = dense.kv[0, 1]
    assert [(b.first_token, b.last_token) for b in head.blocks] == [(0, 64), (64, 128)]
    assert head.open_tokens == 22 and head.blocks[0].tier == "fast" and head.blocks[0].codec.startswith("dense")
    k0, v0 = head.blocks[0].decode()
    assert k0.shape == (64, head.k_dim) and v0.shape == (64, head.v_dim) and k0.dtype == np.float32
    # Dense seals exactly what the model appended: a sequence's open block (its K/V in FP32, as the model
    # computed them) equals the block it becomes once one more token fills it.
    short = engine.session()
    short.prefill(ids[:63])
    k_open, v_open = short.kv[0, 1].open()
    assert k_open.shape == (63, head.k_dim) and short.kv[0, 1].blocks == []
    short.decode(ids[63])
    [sealed] = short.kv[0, 1].blocks
    k_sealed, v_sealed = sealed.decode()
    np.testing.assert_array_equal(k_sealed[:63], k_open)
    np.testing.assert_array_equal(v_sealed[:63], v_open)
    assert short.kv[0, 1].open_tokens == 0
    # And a longer prefill computes the same K/V, within FP32 rounding (GEMMs of other sizes).
    np.testing.assert_allclose(k0[:63], k_open, rtol=0, atol=1e-5)

    # Layer 0's K/V depend on the tokens alone: hack's blocks decode to them within 4-bit error (no rotation: the
    # same basis as dense's).
    hack_engine = slimkv.Engine(MODEL, kv="hack:bits=4,rot=none", threads=THREADS)
    hack = hack_engine.session()
    hack.prefill(ids)
    hk, hv = hack.kv[0, 1].blocks[0].decode()
    assert not hack.kv.layout.rotated
    for exact, approx in ((k0, hk), (v0, hv)):
        error = np.linalg.norm(approx - exact) / np.linalg.norm(exact)
        assert 0 < error < 0.15, error
    assert hack.kv[0, 1].blocks[0].bytes < head.blocks[0].bytes / 4
    assert hack.kv.memory()["sealed_bytes"] < dense.kv.memory()["sealed_bytes"] / 4


def read_tensor(name):
    """A tensor of the model's safetensors files as float32 (NumPy only: the format's 8-byte header length,
    JSON header, raw little-endian data)."""
    with open(os.path.join(MODEL, "model.safetensors.index.json")) as index:
        path = os.path.join(MODEL, json.load(index)["weight_map"][name])
    with open(path, "rb") as file:
        header = json.loads(file.read(struct.unpack("<Q", file.read(8))[0]))
        entry = header[name]
        begin, end = entry["data_offsets"]
        file.seek(begin, os.SEEK_CUR)
        raw = file.read(end - begin)
    if entry["dtype"] == "BF16":  # the upper half of a float32
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(raw, dtype={"F32": "<f4", "F16": "<f2"}[entry["dtype"]]).astype(np.float32)
    return values.reshape(entry["shape"])


def reference_layer0_kv(ids):
    """Layer 0's K (after RoPE) and V per KV head, as transformers' Llama computes them: K, V [kv_heads,
    tokens, head_dim], in float64 from the checkpoint's weights."""
    hidden = read_tensor("model.embed_tokens.weight")[ids].astype(np.float64)
    norm = read_tensor("model.layers.0.input_layernorm.weight")
    h = hidden / np.sqrt((hidden ** 2).mean(axis=-1, keepdims=True) + CONFIG["rms_norm_eps"]) * norm
    kv_heads, head_dim = CONFIG["num_key_value_heads"], CONFIG["head_dim"]
    k = (h @ read_tensor("model.layers.0.self_attn.k_proj.weight").T).reshape(len(ids), kv_heads, head_dim)
    v = (h @ read_tensor("model.layers.0.self_attn.v_proj.weight").T).reshape(len(ids), kv_heads, head_dim)
    inv_freq = 1.0 / CONFIG["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(len(ids))[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1))[:, None], np.sin(np.concatenate([angles] * 2, -1))[:, None]
    rotated_half = np.concatenate([-k[..., head_dim // 2:], k[..., :head_dim // 2]], -1)
    return (k * cos + rotated_half * sin).transpose(1, 0, 2), v.transpose(1, 0, 2)


def test_dense_blocks_equal_the_kv_transformers_computes(engine, heldout_ids):
    # Against the model's arithmetic written in NumPy (not slimkv's): layer 0's K/V depend on the tokens alone.
    ids = heldout_ids[:150]
    session = engine.session()
    session.prefill(ids)
    want_k, want_v = reference_layer0_kv(ids)
    for head in range(CONFIG["num_key_value_heads"]):
        kv = session.kv[0, head]
        pieces = [block.decode() for block in kv.blocks] + [kv.open()]
        got_k, got_v = (np.concatenate([piece[i] for piece in pieces]) for i in (0, 1))
        assert got_k.shape == want_k[head].shape == (150, CONFIG["head_dim"])
        for got, want in ((got_k, want_k[head]), (got_v, want_v[head])):
            # FP32 against FP64: the relative error of a float32 GEMM over hidden_size terms.
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_memory_and_selection(engine, heldout_ids):
    session = engine.session()
    session.prefill(heldout_ids[:150])
    memory = session.kv.memory()
    assert memory["sealed_tokens"] == 128 and memory["sealed_blocks"] > 0
    assert memory["fast_bytes"] == memory["sealed_bytes"] + memory["open_bytes"] + memory["selector_bytes"]
    assert memory["tier"]["hits"] == 0 and not memory["sealed_in_slow_tier"]
    session.decode(heldout_ids[150])
    assert session.kv[3, 0].last_selection() is None  # dense attends to every token

    pq = slimkv.Engine(MODEL, kv="pq:topk=0.1", threads=THREADS).session()
    pq.prefill(heldout_ids[:400])
    pq.decode(heldout_ids[400])
    chosen = pq.kv[3, 0].last_selection()
    assert chosen is not None and 0 < len(chosen) < 401
    assert len(set(chosen.tolist())) == len(chosen) and chosen.min() >= 0 and chosen.max() <= 400
    assert pq.kv.memory()["selector_bytes"] > 0


def test_kv_spec_parses_and_canonicalizes():
    spec = slimkv.KvSpec("pq:topk=0.2+hack:bits=2")
    assert spec.spec == "pq:topk=0.2+hack:bits=2"
    assert [name for name, _ in spec.stages] == ["pq", "hack"] and spec.stages[1][1] == {"bits": "2"}
    assert spec.tier == "fast" and "bits=2" in spec.canonical and "topk=0.2" in spec.canonical
    assert slimkv.KvSpec(spec.canonical) == spec and str(spec) == spec.canonical
    assert slimkv.KvSpec("dense@offload").tier == "offload"
