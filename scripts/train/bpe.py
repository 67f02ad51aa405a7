"""Byte-level BPE encoder read from a Hugging Face tokenizer.json, in plain Python (needs only the
`regex` module): the reference that slimkv's C++ tokenizer and the corpus builder's token counts
rely on, independent of the `tokenizers` library."""
import json

import regex


# ----------------------------------------------------------------------------------------------
# Tokenizer: Split(regex) -> ByteLevel (GPT-2 byte-to-unicode table) -> BPE by merge rank
# ----------------------------------------------------------------------------------------------

def byte_to_unicode():
    """GPT-2's reversible map from the 256 bytes to printable unicode characters."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
            list(range(ord("\xae"), ord("\xff") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class BpeTokenizer:
    def __init__(self, path):
        spec = json.load(open(path))
        self.vocab = spec["model"]["vocab"]
        self.inverse = {i: t for t, i in self.vocab.items()}
        merges = spec["model"]["merges"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
        self.rank = {pair: r for r, pair in enumerate(merges)}
        self.pattern = regex.compile(spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"])
        self.byte_chars = byte_to_unicode()
        self.char_bytes = {c: b for b, c in self.byte_chars.items()}
        self.specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
        self.cache = {}

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.rank.get((parts[i], parts[i + 1]), 1 << 30), i)
                      for i in range(len(parts) - 1)]
            best, i = min(ranked)
            if best == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.vocab[p] for p in parts]

    def encode(self, text):
        """Ids without special tokens (the post-processor's BOS is added by callers)."""
        ids = []
        for piece in self.pattern.findall(text):
            word = "".join(self.byte_chars[b] for b in piece.encode("utf-8"))
            if word not in self.cache:
                self.cache[word] = self.bpe(word)
            ids += self.cache[word]
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            tok = self.inverse[i]
            if tok in self.specials:
                out += tok.encode()
            else:
                out += bytes(self.char_bytes[c] for c in tok)
        return out.decode("utf-8", errors="replace")
