#!/usr/bin/env python3
"""scripts/corpus/decontaminate.py: an evaluation document that shares a long line with the training text
is dropped, whatever the indentation or the part's compression; short lines and near misses are not."""
import lzma
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts", "corpus"))
from decontaminate import clean_documents  # noqa: E402

HEADER = "   This file is part of the GNU C Library, a free software library."
TRAINING = ["/* Multiple versions of vectorized atanf, vector length is 8.", HEADER, "   }", "return 0;"]


class DecontaminateTest(unittest.TestCase):
    def test_documents_sharing_a_long_line_are_dropped(self):
        documents = [
            "/* Multiple versions of vectorized atanhf, vector length is 8.\n" + HEADER.strip() + "\nint x;",
            "A document of its own, with a line long enough to count for something.\n   }\nreturn 0;",
            "/* Multiple versions of vectorized atanf, vector length is 8.\nanother long line that is not anywhere in the training text",
        ]
        kept, fractions = clean_documents(documents, TRAINING)
        self.assertEqual(kept, [documents[1]])  # "}" and "return 0;" are too short to count
        self.assertEqual(fractions, [0.5, 0.0, 0.5])

    def test_the_script_reads_compressed_parts_and_keeps_order(self):
        with tempfile.TemporaryDirectory() as tmp:
            part = os.path.join(tmp, "train-00.txt.xz")
            with lzma.open(part, "wt") as f:
                f.write("\n".join(TRAINING) + "\n")
            evaluation, out = os.path.join(tmp, "eval.txt"), os.path.join(tmp, "clean.txt")
            docs = ["first clean document, long enough to be a line that counts",
                    "   " + HEADER.strip() + "   \nmore text",
                    "third clean document, also long enough to be a line that counts"]
            open(evaluation, "w").write("\n\n\n".join(docs) + "\n")
            report = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "corpus", "decontaminate.py"),
                                     "--eval", evaluation, "--train", part, "--out", out],
                                    check=True, capture_output=True, text=True).stdout
            self.assertIn('"kept": 2', report)
            self.assertEqual(open(out).read(), docs[0] + "\n\n\n" + docs[2] + "\n")

    def test_bad_options_are_refused_naming_them(self):
        script = os.path.join(ROOT, "scripts", "corpus", "decontaminate.py")
        with tempfile.TemporaryDirectory() as tmp:
            evaluation = os.path.join(tmp, "eval.txt")
            open(evaluation, "w").write("a document\n")
            done = subprocess.run([sys.executable, script, "--eval", evaluation, "--train", evaluation,
                                   "--out", os.path.join(tmp, "o.txt"), "--min-line-chars", "0"],
                                  capture_output=True, text=True)
            self.assertNotEqual(done.returncode, 0)
            self.assertIn("--min-line-chars must be at least 1", done.stderr)
            done = subprocess.run([sys.executable, script, "--eval", evaluation, "--out", os.path.join(tmp, "o.txt")],
                                  capture_output=True, text=True)
            self.assertNotEqual(done.returncode, 0)
            self.assertIn("--train", done.stderr)


if __name__ == "__main__":
    unittest.main()
