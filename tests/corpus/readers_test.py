#!/usr/bin/env python3
"""scripts/corpus (v3): the SWORD module reader gives one document per book with footnotes and
outline tables dropped; the e-mail reader gives subject and body without headers or quoted lines
(an HTML-only message stripped); a Gutenberg book loses its licence trailer; parts are dealt so
that their sizes stay equal and every text lands in exactly one part, in its order."""
import os
import struct
import sys
import tempfile
import unittest
import zlib

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts", "corpus"))
from build_corpus import DOC_SEPARATOR, balanced_parts  # noqa: E402
from sources import gutenberg_books, mail_bodies, sword_module  # noqa: E402

MODULE = "usr/share/sword/modules/comments/zcom/test"
BLOCKS = [
    '<chapter n="1" osisID="Ps.1" sID="Ps.1"/><title type="x-s">Psalm 1 OVERVIEW</title>'
    '<div sID="g1" type="x-p"/>Blessed is the man.<note placement="foot">a footnote</note> '
    'He shall be like a tree.<div eID="g1" type="x-p"/><chapter eID="Ps.1"/>',
    '<chapter n="2" osisID="Ps.2" sID="Ps.2"/><table><row><cell>Outline</cell></row></table>'
    '<div sID="g2" type="x-p"/>Why do the heathen rage?<div eID="g2" type="x-p"/>'
    '<chapter n="1" osisID="Prov.1" sID="Prov.1"/>The proverbs of Solomon &amp; others.',
]


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def write_module(root, blocks):
    folder = os.path.join(root, MODULE)
    os.makedirs(folder)
    index, data = b"", b""
    for text in blocks:
        packed = zlib.compress(text.encode())
        index += struct.pack("<III", len(data), len(packed), len(text.encode()))
        data += packed
    write(os.path.join(folder, "ot.czs"), index)
    write(os.path.join(folder, "ot.czz"), data)
    write(os.path.join(folder, "nt.czs"), b"")  # an empty testament, as tdavid ships


class SwordModuleTest(unittest.TestCase):
    def test_one_document_per_book_without_notes_or_tables(self):
        with tempfile.TemporaryDirectory() as tmp:
            other, module_root = os.path.join(tmp, "other"), os.path.join(tmp, "pkg")
            os.makedirs(other)
            write_module(module_root, BLOCKS)
            docs = list(sword_module(MODULE)([other, module_root]))  # found in the second root
        self.assertEqual([d for d, _ in docs], ["test/Ps", "test/Prov"])
        psalms = docs[0][1]
        self.assertIn("Psalm 1 OVERVIEW\n\n", psalms)
        self.assertIn("Blessed is the man.", psalms)
        self.assertIn("Why do the heathen rage?", psalms)  # chapter 2 in the same document
        self.assertNotIn("footnote", psalms)
        self.assertNotIn("Outline", psalms)
        self.assertNotIn("<", psalms)
        self.assertEqual(docs[1][1].strip(), "The proverbs of Solomon & others.")


class MailBodiesTest(unittest.TestCase):
    def test_subject_and_body_without_headers_or_quotes(self):
        plain = ("From: a@example.org\nSubject: Re: build fails\nContent-Type: text/plain\n\n"
                 "On Monday you wrote:\n> the old message\n>> older still\nIt builds now.\n")
        html = ("From: b@example.org\nSubject: News\nContent-Type: text/html\n\n"
                "<html><body><p>First paragraph.</p><p>Second one.</p></body></html>\n")
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "mail"))
            write(os.path.join(tmp, "mail", "1.txt"), plain.encode())
            write(os.path.join(tmp, "mail", "2.txt"), html.encode())
            docs = dict(mail_bodies("mail/*.txt")([tmp]))
        self.assertEqual(docs["mail/1.txt"], "Re: build fails\n\nOn Monday you wrote:\nIt builds now.\n")
        self.assertNotIn("From:", docs["mail/2.txt"])
        self.assertIn("First paragraph.", docs["mail/2.txt"])
        self.assertNotIn("<p>", docs["mail/2.txt"])


class GutenbergBooksTest(unittest.TestCase):
    def test_the_licence_trailer_is_cut_and_excluded_books_skipped(self):
        book = ("[The Ball and The Cross by G.K. Chesterton 1909]\n\nThe flying ship sang.\n\n"
                "End of Project Gutenberg's The Ball and The Cross\n\n*** END OF THE SMALL PRINT\n")
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "package", "gutenberg"))
            write(os.path.join(tmp, "package", "gutenberg", "chesterton-ball.txt"), book.encode())
            write(os.path.join(tmp, "package", "gutenberg", "austen-emma.txt"), b"Emma.\n")
            docs = dict(gutenberg_books("package/gutenberg/*.txt", r"/austen-")([tmp]))
        self.assertEqual(list(docs), ["package/gutenberg/chesterton-ball.txt"])
        self.assertEqual(docs["package/gutenberg/chesterton-ball.txt"],
                         "[The Ball and The Cross by G.K. Chesterton 1909]\n\nThe flying ship sang.\n\n")


class BalancedPartsTest(unittest.TestCase):
    def test_parts_of_equal_size_each_text_once_in_order(self):
        texts = ["x" * (1000 if k % 7 else 50_000) + str(k) for k in range(400)]
        parts = balanced_parts(texts, 5)
        sizes = [sum(len(t) + len(DOC_SEPARATOR) for t in p) for p in parts]
        self.assertLessEqual(max(sizes) - min(sizes), 50_010)  # within one largest text
        self.assertEqual(sorted(t for p in parts for t in p), sorted(texts))
        for p in parts:  # each part keeps the (hash) order it was dealt in
            self.assertEqual(p, sorted(p, key=texts.index))


if __name__ == "__main__":
    unittest.main()
