#!/usr/bin/env python3
"""Keep the documents of an evaluation text that share no line with the training text.

Why: the held-out split of the training sources is 1% of their documents, but a document left out of
training can still be in it nearly word for word — a templated source file (glibc's vectorised math
stubs differ in one function name), the same licence header with other years, the next piece of a long
document cut at paragraphs. Paragraph deduplication does not see those (one changed word changes the
paragraph's key); lines do. Measured on the bundled model's corpus: 84 of the split's 237 documents had
at least half of their long lines in the training parts (the model's perplexity on them 2.5, first 1,023
tokens of each) against 16.1 on the 62 documents with none: the split measured memory, not generalisation.

A line counts when it has at least --min-line-chars characters once stripped (shorter ones, "}" or
"return 0;", say nothing about the document); a document is kept when none of its lines occurs as a line
of the training text. Documents are separated by three newlines, as build_corpus.py writes them.

    python3 scripts/corpus/decontaminate.py --eval .corpus/corpus/eval/heldout-split.txt \\
        --train .corpus/corpus/train-*.txt.xz --out heldout-split-clean.txt
"""
import argparse
import json
import lzma
import sys

DOC_SEPARATOR = "\n\n\n"
MIN_LINE_CHARS = 40


def long_lines(text, min_chars=MIN_LINE_CHARS):
    return {line.strip() for line in text.split("\n") if len(line.strip()) >= min_chars}


def lines_seen(wanted, training_lines):
    """The lines of `wanted` that occur among `training_lines` (an iterable of raw lines)."""
    seen = set()
    for line in training_lines:
        line = line.strip()
        if line in wanted:
            seen.add(line)
    return seen


def clean_documents(documents, training_lines, min_chars=MIN_LINE_CHARS):
    """(kept documents, per-document fraction of long lines found in training), in input order."""
    per_doc = [long_lines(d, min_chars) for d in documents]
    seen = lines_seen(set().union(*per_doc) if per_doc else set(), training_lines)
    fractions = [len(lines & seen) / len(lines) if lines else 0.0 for lines in per_doc]
    return [d for d, f in zip(documents, fractions) if f == 0.0], fractions


def read_lines(paths):
    for path in paths:
        opener = lzma.open if path.endswith(".xz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            yield from f


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", required=True, help="the evaluation text (documents separated by three newlines)")
    ap.add_argument("--train", nargs="+", required=True, help="the training parts (.txt or .txt.xz)")
    ap.add_argument("--out", required=True, help="where the kept documents go")
    ap.add_argument("--min-line-chars", type=int, default=MIN_LINE_CHARS)
    args = ap.parse_args()
    if args.min_line_chars < 1:
        sys.exit("decontaminate: --min-line-chars must be at least 1")
    documents = [d for d in open(args.eval, encoding="utf-8").read().split(DOC_SEPARATOR) if d.strip()]
    kept, fractions = clean_documents(documents, read_lines(args.train), args.min_line_chars)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(DOC_SEPARATOR.join(d.strip("\n") for d in kept) + "\n")
    print(json.dumps({"documents": len(documents), "kept": len(kept),
                      "with_half_their_lines_in_training": sum(f > 0.5 for f in fractions),
                      "mean_fraction_in_training": round(sum(fractions) / max(1, len(fractions)), 4)}))


if __name__ == "__main__":
    main()
