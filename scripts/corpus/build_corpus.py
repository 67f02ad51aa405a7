#!/usr/bin/env python3
"""Build slimkv's English training corpus from Debian 12 documentation packages.

What it does, in order (deterministic: same packages in, same bytes out):
  1. `apt-get download` every package in packages.txt (no install, no dependencies) into
     <work>/debs and unpack it with `dpkg-deb -x` into <work>/root. The KJV Bible is stored in a
     compressed format only its reader understands, so `bible-kjv` is installed (apt-get install)
     and its text dumped with the `bible` command.
  2. Extract one text per document (an HTML page, a reST/POD/Texinfo/AsciiDoc file, a Bible book,
     a novel chapter, a run of dictionary entries or fortunes), strip the markup roughly, drop code
     blocks and tables, re-flow hard-wrapped paragraphs, normalise whitespace.
  3. Deduplicate: whole documents by a hash of their normalised text, and paragraphs by a hash of
     their lower-cased alphanumerics (near-duplicates: the same paragraph in several manuals or in
     several versions of the Debian constitution is kept once, first in sorted order).
  4. Split by document into train and held-out by a hash of the document id (1%), write
     <work>/corpus/train.txt.xz, models/<name>/heldout.txt and scripts/corpus/manifest.json.

Documents are separated by three newlines ("\\n\\n\\n"), paragraphs by two, so both outputs stay
plain text. Usage (as root, on Debian 12):

    nice python3 scripts/corpus/build_corpus.py --work .carry --heldout models/slimkv-llama-14m/heldout.txt
"""
import argparse
import glob
import gzip
import hashlib
import html
import html.parser
import json
import lzma
import os
import re
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
DOC_SEPARATOR = "\n\n\n"
HELDOUT_PER_MILLE = 10          # 1% of documents, chosen by hash of the document id
HELDOUT_MAX_BYTES = 2_000_000   # the committed held-out file stays small
MIN_DOC_CHARS = 300
MAX_DOC_CHARS = 100_000         # longer documents are cut at paragraph boundaries


# ----------------------------------------------------------------------------------------------
# Reading files
# ----------------------------------------------------------------------------------------------

def read_text(path):
    """File contents as str; .gz/.dz (dictzip is gzip) decompressed; bad UTF-8 replaced."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith((".gz", ".dz")):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------
# Paragraph clean-up shared by all formats
# ----------------------------------------------------------------------------------------------

BULLET = re.compile(r"^\s*([-*+\u2022]|\d+[.)]|[a-z][.)]|#\.)\s+")
TABLE_RULE = re.compile(r"^\s*[+|]?[-=+|: ]{6,}[+|]?\s*$")


def looks_like_code_or_table(line):
    s = line.strip()
    if not s:
        return False
    if TABLE_RULE.match(s) or s.count("|") >= 3 or s.count("\t") >= 2:
        return True
    letters = sum(c.isalpha() for c in s)
    symbols = sum(c in "{}[]();=<>$#&*\\/_|^~@%" for c in s)
    return len(s) >= 8 and (letters < 0.5 * len(s) or symbols > 0.12 * len(s))


def clean_paragraph(lines):
    """Join a hard-wrapped paragraph into one line (bullets keep their own line)."""
    lines = [l for l in lines if not looks_like_code_or_table(l)]
    out = []
    for l in lines:
        s = " ".join(l.split())
        if not s:
            continue
        if out and not BULLET.match(l):
            out[-1] += " " + s
        else:
            out.append(s)
    text = "\n".join(out).strip()
    if not text:
        return ""
    non_space = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in non_space)
    non_ascii = sum(ord(c) > 127 for c in non_space)
    if letters < 0.6 * len(non_space) or non_ascii > 0.05 * len(non_space):
        return ""  # code, numbers, or not English
    return text


def reflow(text):
    """Text -> cleaned paragraphs (list of str), split at blank lines."""
    paragraphs, current = [], []
    for line in text.replace("\r", "").split("\n"):
        if line.strip():
            current.append(line)
        elif current:
            paragraphs.append(clean_paragraph(current))
            current = []
    if current:
        paragraphs.append(clean_paragraph(current))
    return [p for p in paragraphs if p]


# ----------------------------------------------------------------------------------------------
# Markup strippers: each returns plain text with blank lines between paragraphs
# ----------------------------------------------------------------------------------------------

def indent_of(line):
    return len(line) - len(line.lstrip())


def skip_indented_block(lines, i, base):
    """Index of the first non-blank line at indent <= base, from i."""
    while i < len(lines) and (not lines[i].strip() or indent_of(lines[i]) > base):
        i += 1
    return i


RST_KEPT_DIRECTIVES = {"note", "warning", "tip", "important", "attention", "caution", "hint",
                       "danger", "admonition", "topic", "sidebar", "seealso", "versionadded",
                       "versionchanged", "deprecated", "impl-detail", "only", "rubric"}
RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+_.:])\1{2,}\s*$")
RST_ROLE_WITH_TARGET = re.compile(r":[\w:.-]+:`([^`<]*?)\s*<[^`>]*>`")
RST_ROLE = re.compile(r":[\w:.-]+:`~?!?([^`]*)`")
RST_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?")


def strip_rst_inline(text):
    text = RST_ROLE_WITH_TARGET.sub(r"\1", text)
    text = RST_ROLE.sub(r"\1", text)
    text = RST_LINK.sub(r"\1", text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`]+)`_{0,2}", r"\1", text)
    text = re.sub(r"\[#?\w*\]_", "", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?!\w)", r"\1", text)
    text = re.sub(r"\|(\w[\w -]*)\|", r"\1", text)
    return text


def strip_rst(text):
    """reStructuredText: drop comments, most directives, literal blocks, section underlines."""
    lines = text.replace("\t", "        ").split("\n")
    out, i = [], 0
    while i < len(lines):
        line, s = lines[i], lines[i].strip()
        if s.startswith(".. ") or s == "..":
            m = re.match(r"\.\.\s+([\w:-]+)::\s*(.*)", s)
            base = indent_of(line)
            end = skip_indented_block(lines, i + 1, base)
            if m and m.group(1) in RST_KEPT_DIRECTIVES:
                body = [l for l in lines[i + 1:end] if not re.match(r"^\s*:[\w-]+:", l)]
                out.append(m.group(2))
                out.append(strip_rst("\n".join(l[base + 3:] if len(l) > base + 3 else l.strip()
                                               for l in body)))
            out.append("")
            i = end
            continue
        if RST_UNDERLINE.match(line):
            out.append("")
            i += 1
            continue
        if s.endswith("::"):
            head = line.rstrip()[:-1].rstrip()
            out.append(head if head.strip() and head.strip() != ":" else "")
            out.append("")
            i = skip_indented_block(lines, i + 1, indent_of(line))
            continue
        if re.match(r"^\s*:[\w -]+:", line):  # field lists (:Author:, :Copyright:)
            i += 1
            continue
        out.append(line)
        i += 1
    return strip_rst_inline("\n".join(out))


def strip_pod(text):
    """Perl POD: keep headings and prose, drop verbatim (indented) paragraphs and commands."""
    out = []
    in_pod = True
    for para in re.split(r"\n\s*\n", text):
        if para.startswith("=cut"):
            in_pod = False
            continue
        if para.startswith("=pod") or para.startswith("=head"):
            in_pod = True
        if not in_pod or para[:1].isspace():
            continue
        if para.startswith("="):
            m = re.match(r"=(head\d|item)\s+(.*)", para, re.S)
            if not m:
                continue
            para = m.group(2)
        for _ in range(4):  # nested formatting codes, innermost first
            para = re.sub(r"[A-Z]<<+\s+(.*?)\s+>>+", r"\1", para, flags=re.S)
            para = re.sub(r"E<(lt|gt|quot|amp|verbar|sol)>",
                          lambda m: {"lt": "<", "gt": ">", "quot": '"', "amp": "&",
                                     "verbar": "|", "sol": "/"}[m.group(1)], para)
            para = re.sub(r"[XZ]<[^<>]*>", "", para)
            para = re.sub(r"L<([^<>|]*)\|[^<>]*>", r"\1", para)
            para = re.sub(r"[BICFSLE]<([^<>]*)>", r"\1", para)
        out.append(para.strip())
    return "\n\n".join(out)


def strip_info(text):
    """Texinfo .info: drop node headers, menus and the tag table."""
    text = text.split("\x1fTag Table:")[0]
    out = []
    in_menu = False
    for line in text.split("\n"):
        if line.startswith("\x1f") or line.startswith("File: ") or line.startswith("This is "):
            out.append("")
            continue
        if line.startswith("* Menu:"):
            in_menu = True
            continue
        if in_menu:
            if not line.strip() or line.startswith("*") or line.startswith(" "):
                continue
            in_menu = False
        if RST_UNDERLINE.match(line):
            out.append("")
            continue
        if re.match(r"^\s{5,}\S", line) and looks_like_code_or_table(line):
            continue
        out.append(line)
    return re.sub(r"\*[Nn]ote ([^:]+)::", r"\1", "\n".join(out))


def strip_asciidoc(text):
    """AsciiDoc (git manuals): drop delimited listing blocks, attributes and macros."""
    lines = text.split("\n")
    out, in_block, delim = [], False, None
    for k, line in enumerate(lines):
        s = line.rstrip()
        if re.fullmatch(r"(-{4,}|\.{4,}|={4,}|\+{4,}|_{4,}|\*{4,}|/{4,})", s):
            prev = lines[k - 1].rstrip() if k else ""
            if not in_block and prev and abs(len(prev) - len(s)) <= 2 and s[0] in "-=~^+":
                out.append("")  # a section underline
                continue
            if in_block and s == delim:
                in_block = False
            elif not in_block:
                in_block, delim = True, s
            continue
        if in_block:
            continue
        if re.match(r"^(:\w[\w-]*:|\[\w*.*\]$|include::|ifdef::|endif::|ifndef::)", s):
            continue
        if s.startswith("\t") or s.startswith("        "):
            continue  # indented literal paragraph
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"linkgit:([\w-]+)\[\d\]", r"\1", text)
    text = re.sub(r"link:[^\[\s]+\[([^\]]*)\]", r"\1", text)
    text = re.sub(r"<<[^,>]*,([^>]*)>>", r"\1", text)
    text = re.sub(r"[`'](\S[^`'\n]*?)[`']", r"\1", text)
    text = re.sub(r"\{litdd\}", "--", text)
    return text


class HtmlText(html.parser.HTMLParser):
    """Visible prose of an HTML page: paragraph breaks at block tags; code, tables, navigation,
    scripts and index terms dropped."""
    BLOCK = {"p", "div", "br", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr",
             "blockquote", "section", "ul", "ol", "dl", "title", "td", "th", "hr", "table"}
    SKIP_TAGS = {"script", "style", "head", "pre", "table", "nav", "footer", "header",
                 "svg", "math", "form", "button", "select", "textarea"}
    SKIP_CLASSES = {"navheader", "navfooter", "sphinxsidebar", "related", "footer", "toc",
                    "headerlink", "indexterm", "breadcrumb", "docnav", "navigation",
                    "programlisting", "screen", "synopsis", "highlight", "doctest", "index",
                    "legalnotice", "copyright", "titlepage", "sidebar", "menu-bar",
                    "nav-chapters", "nav-wrapper", "highlight-default", "highlight-python3",
                    "highlight-c", "highlight-shell", "highlight-console", "highlight-pycon"}
    VOID = {"br", "img", "hr", "meta", "link", "input", "area", "base", "col", "embed",
            "source", "track", "wbr", "param"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.stack, self.skip_depth = [], [], None

    def handle_starttag(self, tag, attrs):
        if tag in self.BLOCK:
            self.parts.append("\n\n")
        if tag in self.VOID:
            return
        self.stack.append(tag)
        if self.skip_depth is None:
            cls = dict(attrs).get("class") or ""
            if tag in self.SKIP_TAGS or set(cls.split()) & self.SKIP_CLASSES:
                self.skip_depth = len(self.stack)

    def handle_endtag(self, tag):
        if tag in self.VOID or tag not in self.stack:
            return
        while self.stack:  # tolerate unclosed children
            top = self.stack.pop()
            if self.skip_depth is not None and len(self.stack) < self.skip_depth:
                self.skip_depth = None
            if top == tag:
                break
        if tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if self.skip_depth is None:
            self.parts.append(data.replace("\n", " "))


def strip_html(text):
    parser = HtmlText()
    parser.feed(text)
    parser.close()
    return "".join(parser.parts)


# ----------------------------------------------------------------------------------------------
# Sources: each yields (document id, list of paragraphs)
# ----------------------------------------------------------------------------------------------

def files(root, pattern, exclude=None):
    paths = sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    return [p for p in paths if os.path.isfile(p) and not (exclude and re.search(exclude, p))]


def docs_from_files(root, pattern, stripper, exclude=None):
    for path in files(root, pattern, exclude):
        yield os.path.relpath(path, root), reflow(stripper(read_text(path)))


def linux_docs(root):
    base = "usr/share/doc/linux-doc-6.1/Documentation/"
    excl = r"/(translations|devicetree|ABI|output|sphinx|netlink/specs)/|/Kconfig|/Makefile"
    yield from docs_from_files(root, base + "**/*.rst.gz", strip_rst, excl)
    yield from docs_from_files(root, base + "**/*.rst", strip_rst, excl)
    yield from docs_from_files(root, base + "**/*.txt.gz", strip_rst, excl)
    yield from docs_from_files(root, base + "**/*.txt", strip_rst, excl)


def python_docs(root):
    yield from docs_from_files(root, "usr/share/doc/python3.11/html/_sources/**/*.rst.txt",
                               strip_rst, r"/whatsnew/changelog|/license")


def html_docs(pattern, exclude=None):
    def source(root):
        yield from docs_from_files(root, pattern, strip_html, exclude)
    return source


def perl_docs(root):
    yield from docs_from_files(root, "usr/share/perl/5.*/pod/*.pod", strip_pod,
                               r"/perl\d+delta\.pod|/perlmodlib|/perltoc|/perlartistic|/perlgpl")


def info_docs(pattern, exclude=None):
    def source(root):
        yield from docs_from_files(root, pattern, strip_info, exclude)
    return source


def plain_docs(pattern, exclude=None):
    def source(root):
        yield from docs_from_files(root, pattern, lambda t: t, exclude)
    return source


def rst_docs(pattern, exclude=None):
    def source(root):
        yield from docs_from_files(root, pattern, strip_rst, exclude)
    return source


def git_docs(root):
    yield from docs_from_files(root, "usr/share/doc/git-doc/**/*.txt", strip_asciidoc,
                               r"/RelNotes/|/RelNotes|/config/|/includes/|cmds-|-options\.txt")


def bible_kjv(root):
    """KJV text dumped by the bible-kjv reader: one document per book, one paragraph per chapter."""
    text = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "100000"}, check=True).stdout
    book, chapter, books = None, [], {}
    order = []
    for line in text.split("\n"):
        m = re.match(r"^(\S.*?) (\d+)$", line)
        if m:
            if chapter:
                books[book].append(" ".join(chapter))
            book, chapter = m.group(1), []
            if book not in books:
                books[book] = []
                order.append(book)
            continue
        s = re.sub(r"^\s*\d+\s+", "", line).strip()
        if s:
            chapter.append(s)
    if chapter:
        books[book].append(" ".join(chapter))
    for name in order:
        yield "bible-kjv/" + name, [name] + books[name]


def austen_novels(root):
    """Jane Austen's six novels, stored as R character vectors (one line per element) in an R
    lazy-load database: records of [4-byte length][zlib stream] holding XDR serialisations."""
    data = open(os.path.join(root, "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"),
                "rb").read()
    pos, novel = 0, 0
    while pos < len(data):
        inflater = zlib.decompressobj()
        blob = inflater.decompress(data[pos + 4:])
        pos = len(data) - len(inflater.unused_data)
        lines = parse_r_character_vector(blob)
        title = lines[0].strip() if lines else "novel%d" % novel
        chapter_lines, chapter_no = [], 0
        for line in lines + ["CHAPTER END"]:
            if re.match(r"^\s*(CHAPTER|Chapter)\s+\w+", line):
                paras = reflow("\n".join(chapter_lines))
                if sum(map(len, paras)) > MIN_DOC_CHARS:
                    yield "austen/%s/%03d" % (title, chapter_no), paras
                chapter_no += 1
                chapter_lines = [line.strip().title()]
                continue
            chapter_lines.append(line)
        novel += 1


def parse_r_character_vector(blob):
    """Elements of an R character vector serialised in XDR format (R 'X\\n' version 2 or 3)."""
    assert blob[:2] == b"X\n", "not an XDR R serialisation"
    version = struct.unpack(">i", blob[2:6])[0]
    pos = 14
    if version == 3:
        pos += 4 + struct.unpack(">i", blob[pos:pos + 4])[0]
    flags, length = struct.unpack(">ii", blob[pos:pos + 8])
    assert flags & 0xFF == 16, "expected a character vector (STRSXP)"
    pos += 8
    out = []
    for _ in range(length):
        _, n = struct.unpack(">ii", blob[pos:pos + 8])
        pos += 8
        if n < 0:
            out.append("")
            continue
        out.append(blob[pos:pos + n].decode("utf-8", errors="replace"))
        pos += n
    return out


def dictd_entries(root, name, entries_per_doc, cleanup):
    """A dictd database as documents of `entries_per_doc` consecutive entries."""
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def decode(s):
        v = 0
        for c in s:
            v = v * 64 + b64.index(c)
        return v

    body = gzip.decompress(open(os.path.join(root, "usr/share/dictd/%s.dict.dz" % name),
                                "rb").read())
    index = open(os.path.join(root, "usr/share/dictd/%s.index" % name),
                 encoding="utf-8", errors="replace").read().split("\n")
    spans = []
    for row in index:
        cols = row.split("\t")
        if len(cols) >= 3 and not cols[0].startswith("00-database"):
            spans.append((decode(cols[1]), decode(cols[2])))
    spans = sorted(set(spans))
    for k in range(0, len(spans), entries_per_doc):
        paras = []
        for off, size in spans[k:k + entries_per_doc]:
            entry = cleanup(body[off:off + size].decode("utf-8", errors="replace"))
            paras.extend(reflow(entry))
        yield "%s/%06d" % (name, k // entries_per_doc), paras


def gcide_cleanup(entry):
    entry = re.sub(r"\\[^\\\n]*\\", "", entry)  # pronunciation \Ab*di"cate\
    entry = re.sub(r"\[(1913 Webster|PJC|WordNet[^\]]*|Webster 1913 Suppl\.|Century Dict\.)\]",
                   "", entry)
    return entry


def gcide(root):
    yield from dictd_entries(root, "gcide", 200, gcide_cleanup)


def foldoc(root):
    yield from dictd_entries(root, "foldoc", 40, lambda e: re.sub(r"[{}]", "", e))


def fortunes(root):
    for path in files(root, "usr/share/games/fortunes/*", r"\.(dat|u8)$|/(ascii-art|art)$"):
        items = [reflow(t) for t in read_text(path).split("\n%\n")]
        for k in range(0, len(items), 60):
            paras = [p for item in items[k:k + 60] for p in item]
            yield "%s/%04d" % (os.path.relpath(path, root), k // 60), paras


def jargon(root):
    text = read_text(os.path.join(root, "usr/share/doc/jargon-text/jargon.txt.gz"))
    entries = re.split(r"\n(?=:[^:\n]+:)", text)
    for k in range(0, len(entries), 40):
        yield "jargon/%04d" % (k // 40), reflow("\n\n".join(entries[k:k + 40]))


SOURCES = [  # (name, extractor); order matters for deduplication: the first copy is kept
    ("austen", austen_novels),
    ("bible-kjv", bible_kjv),
    ("linux-doc", linux_docs),
    ("python-doc", python_docs),
    ("debian-handbook", html_docs("usr/share/doc/debian-handbook/html/en-US/*.html")),
    ("debian-reference", html_docs("usr/share/debian-reference/*.en.html")),
    ("debian-faq", html_docs("usr/share/doc/debian/FAQ/*.html")),
    ("debian-kernel-handbook", html_docs("usr/share/doc/debian-kernel-handbook/**/*.html")),
    ("aptitude-doc", html_docs("usr/share/doc/aptitude/html/en/*.html")),
    ("postgresql-doc", html_docs("usr/share/doc/postgresql-doc-15/html/*.html",
                                 r"/release-\d|/(bookindex|errcodes-appendix|sql-keywords)")),
    ("doc-debian", plain_docs("usr/share/doc/debian/*.txt*")),
    ("maint-guide", plain_docs("usr/share/doc/maint-guide/maint-guide.en.txt.gz")),
    ("rust-doc", html_docs("usr/share/doc/rust-doc/html/**/*.html",
                           r"/(core|std|alloc|proc_macro|test|unstable-book|src|implementors)/|"
                           r"/(first|second)-edition/|/2018-edition/|print\.html|/error-index")),
    ("django-doc", html_docs("usr/share/doc/python-django-doc/html/**/*.html",
                             r"/releases/|/internals/deprecation|/_modules/|genindex|py-modindex")),
    ("sphinx-doc", rst_docs("usr/share/doc/sphinx-doc/rst/**/*.txt", r"/changes")),
    ("cmake-doc", rst_docs("usr/share/doc/cmake-data/html/_sources/**/*.txt", r"/release/")),
    ("apache2-doc", html_docs("usr/share/doc/apache2-doc/manual/en/**/*.html")),
    ("sqlite3-doc", html_docs("usr/share/doc/sqlite3/**/*.html", r"/releaselog/|/search\.d/")),
    ("gettext-doc", html_docs("usr/share/doc/gettext/*.html")),
    ("perl-doc", perl_docs),
    ("git-doc", git_docs),
    ("info-manuals", info_docs("usr/share/info/**/*.info*.gz", r"/python3")),
    ("gnu-standards", plain_docs("usr/share/doc/gnu-standards/*.text.gz")),
    ("jargon", jargon),
    ("fortunes", fortunes),
    ("foldoc", foldoc),
    ("gcide", gcide),
]


# ----------------------------------------------------------------------------------------------
# Fetching packages, deduplicating, splitting, writing
# ----------------------------------------------------------------------------------------------

def fetch_packages(work):
    names = [l.split("#")[0].strip() for l in open(os.path.join(HERE, "packages.txt"))]
    names = [n for n in names if n]
    debs, root = os.path.join(work, "debs"), os.path.join(work, "root")
    os.makedirs(debs, exist_ok=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "bible-kjv"], check=True)
    subprocess.run(["apt-get", "download", "-qq"] + names, cwd=debs, check=True)
    versions = {}
    for deb in sorted(glob.glob(os.path.join(debs, "*.deb"))):
        name = subprocess.run(["dpkg-deb", "-f", deb, "Package"], capture_output=True,
                              text=True, check=True).stdout.strip()
        if name not in names:
            continue
        version = subprocess.run(["dpkg-deb", "-f", deb, "Version"], capture_output=True,
                                 text=True, check=True).stdout.strip()
        sha = hashlib.sha256(open(deb, "rb").read()).hexdigest()
        versions[name] = {"version": version, "sha256": sha}
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
    missing = sorted(set(names) - set(versions))
    if missing:
        sys.exit("build_corpus: packages not downloaded: %s (check apt sources)" % missing)
    bible = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "bible-kjv"],
                           capture_output=True, text=True).stdout
    versions["bible-kjv (reader, installed)"] = {"version": bible}
    return root, versions


def split_long(paras):
    """Cut a paragraph list into pieces of at most MAX_DOC_CHARS characters."""
    pieces, current, size = [], [], 0
    for p in paras:
        if current and size + len(p) > MAX_DOC_CHARS:
            pieces.append(current)
            current, size = [], 0
        current.append(p)
        size += len(p) + 2
    if current:
        pieces.append(current)
    return pieces


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=".carry", help="staging folder (git-ignored)")
    ap.add_argument("--heldout", default="models/slimkv-llama-14m/heldout.txt")
    ap.add_argument("--manifest", default=os.path.join(HERE, "manifest.json"))
    ap.add_argument("--skip-fetch", action="store_true", help="reuse <work>/root as unpacked")
    args = ap.parse_args()

    if args.skip_fetch:
        root = os.path.join(args.work, "root")
        versions = json.load(open(args.manifest)).get("packages", {}) if os.path.exists(
            args.manifest) else {}
    else:
        root, versions = fetch_packages(args.work)

    seen_paragraphs, seen_docs = set(), set()
    train, heldout = [], []
    stats = {}
    for source, extract in SOURCES:
        st = stats.setdefault(source, {"documents": 0, "bytes": 0, "dropped_duplicate_docs": 0,
                                       "dropped_duplicate_paragraphs": 0,
                                       "heldout_documents": 0, "heldout_bytes": 0})
        for doc_id, paras in extract(root):
            kept = []
            for p in paras:
                key = re.sub(r"[^a-z0-9]+", "", p.lower())
                if len(key) >= 40:
                    h = hashlib.blake2b(key.encode(), digest_size=12).digest()
                    if h in seen_paragraphs:
                        st["dropped_duplicate_paragraphs"] += 1
                        continue
                    seen_paragraphs.add(h)
                kept.append(p)
            for k, piece in enumerate(split_long(kept)):
                text = "\n\n".join(piece).strip()
                if len(text) < MIN_DOC_CHARS or sum(c.isalpha() for c in text) < 0.6 * len(text):
                    continue
                h = hashlib.blake2b(re.sub(r"\s+", " ", text.lower()).encode(),
                                    digest_size=12).digest()
                if h in seen_docs:
                    st["dropped_duplicate_docs"] += 1
                    continue
                seen_docs.add(h)
                full_id = "%s:%s#%d" % (source, doc_id, k)
                bucket = int(hashlib.sha256(full_id.encode()).hexdigest(), 16) % 1000
                size = len(text.encode())
                st["documents"] += 1
                st["bytes"] += size
                if bucket < HELDOUT_PER_MILLE:
                    heldout.append((bucket, full_id, text, source))
                else:
                    train.append(text)
        print("%-24s %7d docs %11d bytes" % (source, st["documents"], st["bytes"]), flush=True)

    # The committed held-out file is capped; documents over the cap go back to train.
    heldout.sort()
    kept_heldout, total = [], 0
    for bucket, full_id, text, source in heldout:
        size = len(text.encode()) + len(DOC_SEPARATOR)
        if total + size <= HELDOUT_MAX_BYTES:
            kept_heldout.append(text)
            total += size
            stats[source]["heldout_documents"] += 1
            stats[source]["heldout_bytes"] += len(text.encode())
        else:
            train.append(text)

    corpus_dir = os.path.join(args.work, "corpus")
    os.makedirs(corpus_dir, exist_ok=True)
    train_text = DOC_SEPARATOR.join(train) + "\n"
    heldout_text = DOC_SEPARATOR.join(kept_heldout) + "\n"
    train_xz = os.path.join(corpus_dir, "train.txt.xz")
    with lzma.open(train_xz, "wb", preset=9) as f:
        f.write(train_text.encode())
    os.makedirs(os.path.dirname(args.heldout), exist_ok=True)
    with open(args.heldout, "w") as f:
        f.write(heldout_text)

    old = json.load(open(args.manifest)) if os.path.exists(args.manifest) else {}
    manifest = {
        "description": "slimkv training corpus built by scripts/corpus/build_corpus.py",
        "document_separator": "three newlines",
        "train": {"documents": len(train), "bytes": len(train_text.encode()),
                  "xz_bytes": os.path.getsize(train_xz),
                  "sha256": hashlib.sha256(train_text.encode()).hexdigest()},
        "heldout": {"documents": len(kept_heldout), "bytes": len(heldout_text.encode()),
                    "path": args.heldout,
                    "sha256": hashlib.sha256(heldout_text.encode()).hexdigest()},
        "sources": stats,
        "packages": versions,
    }
    for key in ("tokens", "tokenizer"):  # filled in by scripts/train/train.py's results
        if key in old:
            manifest[key] = old[key]
    with open(args.manifest, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
    print(json.dumps({k: manifest[k] for k in ("train", "heldout")}, indent=1))


if __name__ == "__main__":
    main()
