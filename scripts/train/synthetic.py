"""Synthetic long-context retrieval samples for training and for the card's evaluation.

Three tasks, all in token space (pieces encoded with the model's tokenizer, filler cut from the
tokenized corpus so that it comes from every source):
  pass key     one key hidden at a random depth; the question after the text, before it, or both
  needles      2-6 named keys; 1-3 of them asked for
  records      key-value lookup (the `kvret` shape: one record per line, then a question)
Keys come in several formats (numbers of 3-10 digits, hex, codes with dashes, word-number pairs,
UUID-like strings) and needles and questions in several phrasings, so that retrieval is learned as
copying whatever follows the asked-for phrase, not as one template. Every answer ends with the
text's own punctuation ("."), which the model must emit before anything else: the first bundled
model lost that "." to an EOS and learned to answer with EOS.
"""
import uuid

CLASSIC_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again. ")
PASSKEY_HEADER = ("There is an important pass key hidden inside a lot of irrelevant text. "
                  "Find it and memorize it. I will quiz you about the pass key.\n\n")
RECORDS_HEADER = "Here is a list of records. Each line gives a key and its value.\n"
WORDS = ("apple river stone cloud garden window mountain candle mirror forest harbor lantern "
         "meadow violin castle dragon falcon pepper silver copper marble canyon island ribbon "
         "rocket saddle tunnel valley wagon walnut anchor basket beacon bridge cactus cannon "
         "carpet cedar cherry comet coral cotton desert diamond engine feather fiddle garnet "
         "glacier hammer helmet hornet jacket jungle kettle ladder lemon magnet maple meteor "
         "monkey needle orchid oyster panther parrot pebble pencil pigeon pillow planet pocket "
         "puzzle quartz rabbit raven saffron salmon shadow spider spiral summit thunder tiger "
         "timber tulip turtle velvet walrus willow winter zebra ember orbit prairie thistle "
         "harvest compass blanket lagoon scarlet emerald cobalt amber").split()
# (name of the thing, needle sentence, question, answer lead-in); {k} is the key
PASSKEY_PHRASES = [
    ("pass key", " The pass key is {k}. Remember it. {k} is the pass key. ",
     "What is the pass key?", "The pass key is"),
    ("secret code", " The secret code is {k}. Keep it in mind. ",
     "What is the secret code?", "The secret code is"),
    ("password", " Remember this password: {k}. ",
     "What was the password?", "The password is"),
    ("access token", " Note: the access token for the server is {k}. ",
     "Which access token was given for the server?", "The access token is"),
    ("magic number", " The magic number is {k}. ",
     "What is the magic number?", "The magic number is"),
]


class SyntheticSamples:
    """Seeded generator; `filler_tokens(n)` gives n tokens of natural text (no BOS/EOS)."""

    def __init__(self, encode, bos, eos, filler_tokens, rng):
        self.encode_raw, self.bos, self.eos = encode, bos, eos
        self.filler_tokens, self.rng = filler_tokens, rng
        self.cache = {}
        self.classic = self.enc(CLASSIC_FILLER) * 4000

    def enc(self, text):
        ids = self.cache.get(text)
        if ids is None:
            ids = self.encode_raw(text)
            if len(self.cache) < 4096:
                self.cache[text] = ids
        return list(ids)

    # -- keys ----------------------------------------------------------------------------------

    def number(self, lo=2, hi=6):
        """Uniform in [10^e, 10^7) with e in lo..hi: the shape slimkv's eval draws."""
        return str(self.rng.randint(10 ** self.rng.randint(lo, hi), 10 ** 7 - 1))

    def key(self):
        r, rng = self.rng.random(), self.rng
        if r < 0.4:
            return self.number()
        if r < 0.5:
            return str(rng.randint(10 ** 7, 10 ** 10 - 1))
        if r < 0.62:
            return "%x" % rng.getrandbits(4 * rng.randint(6, 12))
        if r < 0.74:
            letters = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
            return "-".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 5)))
                            for _ in range(rng.randint(2, 3)))
        if r < 0.88:
            return "%s-%s-%d" % (rng.choice(WORDS), rng.choice(WORDS), rng.randint(2, 999))
        return str(uuid.UUID(int=rng.getrandbits(128)))

    # -- pieces ---------------------------------------------------------------------------------

    def filler(self, n, classic):
        return self.classic[:n] if classic else self.filler_tokens(n)

    def embed(self, fill, needles, depths=None):
        """Insert needle token lists into the filler at the given (or random) depths."""
        if depths is None:
            depths = [self.rng.random() for _ in needles]
        cuts = sorted(int(round(d * len(fill))) for d in depths)
        out, prev = [], 0
        for cut, needle in zip(cuts, needles):
            out += fill[prev:cut] + needle
            prev = cut
        return out + fill[prev:]

    def placement(self):
        r = self.rng.random()
        return "after" if r < 0.5 else ("before" if r < 0.75 else "both")

    # -- tasks ----------------------------------------------------------------------------------

    def passkey(self, length, depth=None, classic=None, placement=None, phrase=None, key=None):
        """(prompt, answer) of `length` tokens in all, BOS included; the answer is " KEY.".
        With phrase=0, placement after/before and a number key this is exactly the prompt of
        slimkv's `eval --task passkey`."""
        rng = self.rng
        key = key or self.key()
        classic = rng.random() < 0.15 if classic is None else classic
        placement = placement or self.placement()
        name, needle, question, lead = PASSKEY_PHRASES[rng.randrange(len(PASSKEY_PHRASES))
                                                       if phrase is None else phrase]
        head = []
        if placement in ("before", "both"):
            head = self.enc("Question: %s Read the text below, then answer.\n\n" % question)
        if name == "pass key" and (phrase == 0 or rng.random() < 0.7):
            head += self.enc(PASSKEY_HEADER)
        tail = self.enc("\n\n%s %s" % (question, lead) if placement != "before"
                        else "\n\n%s" % lead)
        needle_ids = self.enc(needle.format(k=key))
        answer = self.enc(" %s." % key)
        n_fill = max(16, length - 1 - len(head) - len(needle_ids) - len(tail) - len(answer))
        body = self.embed(self.filler(n_fill, classic), [needle_ids],
                          None if depth is None else [depth])
        return [self.bos] + head + body + tail, answer

    def needles(self, length):
        """Several named keys, 1-3 questions, each answered."""
        rng = self.rng
        n = rng.randint(2, 6)
        names = rng.sample(WORDS, n)
        keys = [self.key() for _ in names]
        needles = [self.enc(" The special magic number for %s is %s. " % (w, k))
                   for w, k in zip(names, keys)]
        asked = rng.sample(range(n), rng.randint(1, min(3, n)))
        qa = ["What is the special magic number for %s? The special magic number for %s is %s."
              % (names[i], names[i], keys[i]) for i in asked]
        head = self.enc("Some special magic numbers are hidden in the text below. "
                        "Remember them.\n\n") if rng.random() < 0.5 else []
        if rng.random() < 0.3:
            head = self.enc("Question: %s?\n\n" % qa[0].split("?")[0]) + head
        tail = self.enc("".join("\n\n" + q for q in qa))
        n_fill = max(16, length - 1 - len(head) - sum(map(len, needles)) - len(tail))
        return [self.bos] + head + self.embed(self.filler(n_fill, rng.random() < 0.15),
                                              needles) + tail

    def records(self, length):
        """Key-value lookup: lines of `key = value` (or `key: value`, or JSON-like), then 1-3
        look-ups; the question may also come before the records."""
        rng = self.rng
        line_format = rng.choice(["%s = %s\n", "%s = %s\n", "%s: %s\n", '  "%s": "%s",\n'])
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        placement = self.placement()
        lines, pairs = [], []
        budget = length - 1 - 3 * 48 - 24
        used = len(self.enc(RECORDS_HEADER))
        seen = set()
        while True:
            if rng.random() < 0.7:
                k = "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 8)))
            else:
                k = self.key()
            if k in seen:
                continue
            seen.add(k)
            v = self.number() if rng.random() < 0.6 else self.key()
            line = self.enc(line_format % (k, v))
            if used + len(line) > budget:
                break
            lines.append(line)
            pairs.append((k, v))
            used += len(line)
        asked = rng.sample(pairs, min(len(pairs), rng.randint(1, 3))) if pairs else []
        before = []
        if placement != "after" and asked:
            before = self.enc("Look up %s.\n" % asked[0][0])
        tail = []
        for k, v in asked:
            if placement == "before" and (k, v) == asked[0]:
                tail += self.enc("\nThe value of %s is %s." % (k, v))
            else:
                tail += self.enc("\nLook up %s. The value of %s is %s." % (k, k, v))
        return ([self.bos] + before + self.enc(RECORDS_HEADER) + [t for l in lines for t in l]
                + tail)

    def sample(self, length):
        """One sample of at most `length` tokens: BOS, task (its last answer ending in "."),
        EOS. The task gets length - 1 tokens so that the EOS never displaces its last token.
        Records get the largest share after the pass key: key-value lookup at 8K was the weakest
        skill of the first run (0.35, pass key 0.9)."""
        r = self.rng.random()
        if r < 0.4:
            prompt, answer = self.passkey(length - 1)
            ids = prompt + answer
        elif r < 0.65:
            ids = self.needles(length - 1)
        else:
            ids = self.records(length - 1)
        return ids[:length - 1] + [self.eos]
