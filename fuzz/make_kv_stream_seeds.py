#!/usr/bin/env python3
"""Writes the seeds of fuzz/kv_stream_fuzz.cc (fuzz/corpus/kv_stream_fuzz/): whole KV streams as a prefill
worker sends them (docs/kv_stream_protocol.md), built from the transfer seed
fuzz/corpus/kv_transfer_fuzz/sealed_and_open (real hack:bits=2,pi=32 blocks): its layer 0 (one sealed
block a head and 8 open tokens) copied to both layers, so that every layer holds the 40 prompt tokens
the FINISH frame names. `plain`: HELLO, KV_HEAD, KV_LAYER 0-1, FINISH. `early_blocks`: the sealed blocks
first as KV_BLOCKS (a prompt streamed chunk by chunk), then the layers' open tokens. Python 3 only.
Usage: fuzz/make_kv_stream_seeds.py [SOURCE_DIR]"""
import json
import os
import struct
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def frame(kind, payload):
    header = b"SKVS" + bytes([kind, 0, 0, 0]) + struct.pack("<I", len(payload))
    return header + struct.pack("<I", crc32c(payload, crc32c(header))) + payload


def align64(n):
    return (n + 63) // 64 * 64


def main():
    seed = open(os.path.join(ROOT, "fuzz/corpus/kv_transfer_fuzz/sealed_and_open"), "rb").read()
    num_layers, heads, k_dim, v_dim, max_tokens, block_tokens = struct.unpack_from("<IIIIII", seed, 24)
    block_bytes, spec_bytes, model_bytes = struct.unpack_from("<QII", seed, 48)
    metadata_offset, _, sealed_offset, _, open_offset = struct.unpack_from("<QQQQQ", seed, 64)
    layer0_tokens = struct.unpack_from("<I", seed, metadata_offset)[0]
    strings = metadata_offset + 4 * num_layers
    spec = seed[strings:strings + spec_bytes]
    model = seed[strings + spec_bytes:strings + spec_bytes + model_bytes]
    tokens, stride = layer0_tokens, align64(block_bytes)
    blocks, open_tokens = tokens // block_tokens, tokens % block_tokens
    sealed_layer = seed[sealed_offset:sealed_offset + heads * blocks * stride]          # layer 0: head by head
    open_layer = seed[open_offset:open_offset + heads * (align64(4 * open_tokens * k_dim) + align64(4 * open_tokens * v_dim))]

    metadata = struct.pack(f"<{num_layers}I", *([tokens] * num_layers)) + spec + model
    metadata += bytes(align64(len(metadata)) - len(metadata))
    sealed_off = 128 + len(metadata)
    open_off = sealed_off + num_layers * len(sealed_layer)
    trailer_off = open_off + num_layers * len(open_layer)
    total = trailer_off + 16
    header = bytearray(128)
    header[0:8] = b"SLIMKVXF"
    struct.pack_into("<IIQIIIIIIQII", header, 8, 1, 128, total, num_layers, heads, k_dim, v_dim, max_tokens,
                     block_tokens, block_bytes, spec_bytes, model_bytes)
    struct.pack_into("<QQQQQQQI", header, 64, 128, len(metadata), sealed_off, open_off - sealed_off, open_off,
                     trailer_off - open_off, trailer_off, 0)
    struct.pack_into("<I", header, 124, crc32c(bytes(header[:124])))
    head = bytes(header) + metadata
    body = head + sealed_layer * num_layers + open_layer * num_layers
    trailer = struct.pack("<I", crc32c(body)) + b"\0\0\0\0" + b"SLIMKVND"
    assert len(body) + 16 == total

    identity = {"model_id": model.decode(), "kv_spec": spec.decode(), "transfer_format_version": 1,
                "block_tokens": block_tokens, "sealed_block_bytes": block_bytes, "num_layers": num_layers,
                "num_kv_heads": heads, "k_dim": k_dim, "v_dim": v_dim}
    hello = frame(1, json.dumps({"stream_version": 2, "request_id": "fuzz", "attempt": 0, "identity": identity}).encode())
    finish = frame(6, trailer + json.dumps({"prompt_token_ids": list(range(1, tokens + 1)), "resume_token_ids": [],
                                            "next_token": 3, "endpoint": "/v1/completions",
                                            "request": {"prompt": "x"}}).encode())
    plain = hello + frame(4, head)
    early = hello
    for layer in range(num_layers):
        early += frame(9, struct.pack("<II", layer, 0) + sealed_layer)
    for layer in range(num_layers):
        plain += frame(5, struct.pack("<II", layer, 0) + sealed_layer + open_layer)
    early += frame(4, head)
    for layer in range(num_layers):
        early += frame(5, struct.pack("<II", layer, blocks) + open_layer)
    out = os.path.join(ROOT, "fuzz/corpus/kv_stream_fuzz")
    os.makedirs(out, exist_ok=True)
    for name, data in (("plain", plain + finish), ("early_blocks", early + finish)):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
