"""slimkv.codecs: a codec on NumPy arrays, against NumPy's own attention."""
import numpy as np
import pytest

import slimkv
from slimkv import codecs

RNG_SEED = 1234


def reference_attention(q, k, v, scale):
    scores = scale * q @ k.T
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


@pytest.fixture
def block_kv():
    rng = np.random.default_rng(RNG_SEED)
    return rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((64, 96)).astype(np.float32), \
        rng.standard_normal((3, 128)).astype(np.float32)


def test_dense_is_exact(block_kv):
    k, v, q = block_kv
    block = codecs.encode_block(k, v, "dense")
    assert (block.block_tokens, block.k_dim, block.v_dim) == (64, 128, 96) and block.codec.startswith("dense")
    assert block.nbytes == len(block.data) == 4 * 64 * (128 + 96)
    dk, dv = block.decode()
    np.testing.assert_array_equal(dk, k)
    np.testing.assert_array_equal(dv, v)
    out = codecs.attention(q, block)
    assert out.shape == (3, 96) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference_attention(q, k, v, 1 / np.sqrt(128)), rtol=0, atol=2e-5)
    np.testing.assert_allclose(codecs.attention(q[0], block, scale=0.5), reference_attention(q[:1], k, v, 0.5)[0],
                               rtol=0, atol=2e-5)


def test_quant_attends_to_its_decoded_block(block_kv):
    k, v, q = block_kv
    block = codecs.encode_block(k, v, "quant:bits=4")
    dk, dv = block.decode()
    assert 0 < np.linalg.norm(dk - k) / np.linalg.norm(k) < 0.15
    np.testing.assert_allclose(codecs.attention(q, block), reference_attention(q, dk, dv, 1 / np.sqrt(128)),
                               rtol=0, atol=1e-4)


def test_hack_error_grows_as_bits_shrink(block_kv):
    k, v, q = block_kv
    exact = reference_attention(q, k, v, 1 / np.sqrt(128))
    errors = {}
    for bits in (2, 4, 8):
        codec = codecs.Codec(f"hack:bits={bits}")
        block = codec.encode(k, v, seed=3)
        assert block.codec == str(codec) and block.nbytes < 4 * 64 * (128 + 96)
        out = codecs.attention(q, block)
        errors[bits] = np.linalg.norm(out - exact) / np.linalg.norm(exact)
    assert errors[8] < errors[4] < errors[2] < 1.0, errors
    assert errors[8] < 0.02, errors


def test_codec_errors(block_kv):
    k, v, q = block_kv
    with pytest.raises(slimkv.Error, match="selectors, zack and tiers"):
        codecs.encode_block(k, v, "pq:topk=0.1")
    with pytest.raises(slimkv.Error, match="bitz"):
        codecs.Codec("hack:bitz=2")
    with pytest.raises(ValueError, match=r"k must be \[64, dims\].*got shape \(63, 128\)"):
        codecs.encode_block(k[:63], v, "dense")
    with pytest.raises(ValueError, match=r"v must be \[64, dims\]"):
        codecs.encode_block(k, v[0], "dense")
    block = codecs.encode_block(k, v, "dense")
    with pytest.raises(ValueError, match="q must be .* k_dim 128"):
        codecs.attention(q[:, :64], block)
    with pytest.raises(TypeError):
        codecs.attention(q, "not a block")
