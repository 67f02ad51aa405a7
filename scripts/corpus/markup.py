"""Markup -> plain text for the corpus builder, keeping code.

Every stripper returns text in which paragraphs are separated by blank lines and verbatim regions
(code listings, examples, shell sessions) are wrapped in VERBATIM_START ... VERBATIM_END, so that
`blocks()` keeps them exactly (indentation, line breaks) while it re-flows hard-wrapped prose.
Tables, navigation, menus and index entries are dropped: as text they are noise, not language.
"""
import html.parser
import re

VERBATIM_START, VERBATIM_END = "\x02", "\x03"
MAX_NON_ASCII = 0.2   # a block with more non-ASCII characters than this is not English text


def verbatim(text):
    return "\n\n" + VERBATIM_START + text + VERBATIM_END + "\n\n"


# ----------------------------------------------------------------------------------------------
# Text -> blocks (what every stripper's output goes through)
# ----------------------------------------------------------------------------------------------

BULLET = re.compile(r"^\s*([-*+\u2022]|\d+[.)]|[a-z][.)]|#\.)\s+")
TABLE_RULE = re.compile(r"^\s*[+|]?[-=+|: ]{6,}[+|]?\s*$")


def looks_like_code(line):
    s = line.strip()
    if len(s) < 4:
        return False
    letters = sum(c.isalpha() for c in s)
    symbols = sum(c in "{}[]();=<>$#&*\\/_|^~@%" for c in s)
    return letters < 0.5 * len(s) or symbols > 0.12 * len(s) or s.endswith((";", "{", "}"))


def dedent(lines):
    lines = [l.rstrip() for l in lines]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    margin = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
    return "\n".join(l[margin:] for l in lines)


def english_enough(text):
    chars = [c for c in text if not c.isspace()]
    return bool(chars) and sum(ord(c) > 127 for c in chars) <= MAX_NON_ASCII * len(chars)


def prose_block(lines):
    """A hard-wrapped paragraph joined into one line per item (bullets keep their own line);
    a block that is mostly code-like lines, or indented as a whole, is kept verbatim instead."""
    if TABLE_RULE.match(lines[0]) or sum(l.count("|") >= 3 for l in lines) > len(lines) / 2:
        return ""  # a text table
    indents = [len(l) - len(l.lstrip()) for l in lines]
    codeish = sum(looks_like_code(l) for l in lines)
    if codeish * 2 > len(lines) or (min(indents) >= 4 and codeish):
        return dedent(lines)
    out = []
    for l in lines:
        s = " ".join(l.split())
        if out and not BULLET.match(l):
            out[-1] += " " + s
        else:
            out.append(s)
    return "\n".join(out).strip()


def blocks(text):
    """Stripped text -> list of blocks: re-flowed prose paragraphs and verbatim code."""
    out = []
    for k, segment in enumerate(re.split("[%s%s]" % (VERBATIM_START, VERBATIM_END),
                                         text.replace("\r", ""))):
        if k % 2:  # inside VERBATIM_START ... VERBATIM_END: code keeps its tabs
            block = dedent(segment.split("\n"))
            block = re.sub(r"\n{3,}", "\n\n", block)
            if block.strip():
                out.append(block)
            continue
        current = []
        for line in segment.replace("\t", "    ").split("\n") + [""]:
            if line.strip():
                current.append(line)
            elif current:
                out.append(prose_block(current))
                current = []
    return [b for b in out if b.strip() and english_enough(b)]


# ----------------------------------------------------------------------------------------------
# reStructuredText
# ----------------------------------------------------------------------------------------------

def indent_of(line):
    return len(line) - len(line.lstrip())


def indented_block_end(lines, i, base):
    """Index of the first non-blank line at indent <= base, from i."""
    while i < len(lines) and (not lines[i].strip() or indent_of(lines[i]) > base):
        i += 1
    return i


RST_PROSE_DIRECTIVES = {"note", "warning", "tip", "important", "attention", "caution", "hint",
                        "danger", "admonition", "topic", "sidebar", "seealso", "versionadded",
                        "versionchanged", "deprecated", "impl-detail", "only", "rubric"}
RST_CODE_DIRECTIVES = {"code-block", "code", "sourcecode", "highlight", "doctest", "testcode",
                       "productionlist", "parsed-literal", "kernel-doc"}
RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+_.:])\1{2,}\s*$")


def strip_rst_inline(text):
    text = re.sub(r":[\w:.-]+:`([^`<]*?)\s*<[^`>]*>`", r"\1", text)
    text = re.sub(r":[\w:.-]+:`~?!?([^`]*)`", r"\1", text)
    text = re.sub(r"`([^`<]+?)\s*<[^`>]+>`__?", r"\1", text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`]+)`_{0,2}", r"\1", text)
    text = re.sub(r"\[#?\w*\]_", "", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    text = re.sub(r"\|(\w[\w -]*)\|", r"\1", text)
    return text


def strip_rst(text):
    """Comments and most directives dropped; admonitions kept as prose; literal blocks (after
    "::") and code directives kept verbatim; section underlines and field lists dropped."""
    lines = text.replace("\t", "        ").split("\n")
    out, i = [], 0
    while i < len(lines):
        line, s = lines[i], lines[i].strip()
        if s.startswith(".. ") or s == "..":
            m = re.match(r"\.\.\s+([\w:-]+)::\s*(.*)", s)
            base = indent_of(line)
            end = indented_block_end(lines, i + 1, base)
            body = [l for l in lines[i + 1:end] if not re.match(r"^\s*:[\w-]+:", l)]
            name = m.group(1) if m else None
            if name in RST_PROSE_DIRECTIVES:
                out += [m.group(2), strip_rst(dedent(body))]
            elif name in RST_CODE_DIRECTIVES and dedent(body).strip():
                out.append(verbatim(dedent(body)))
            out.append("")
            i = end
            continue
        if RST_UNDERLINE.match(line):
            out.append("")
            i += 1
            continue
        if s.endswith("::") and not s.startswith(".."):
            head = line.rstrip()[:-1].rstrip()
            out.append(strip_rst_inline(head) if head.strip() not in ("", ":") else "")
            end = indented_block_end(lines, i + 1, indent_of(line))
            if dedent(lines[i + 1:end]).strip():
                out.append(verbatim(dedent(lines[i + 1:end])))
            i = end
            continue
        if re.match(r"^\s*:[\w -]+:", line):
            i += 1
            continue
        out.append(strip_rst_inline(line))
        i += 1
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Perl POD, Texinfo .info, AsciiDoc, roff man pages
# ----------------------------------------------------------------------------------------------

POD_ENTITIES = {"lt": "<", "gt": ">", "quot": '"', "amp": "&", "verbar": "|", "sol": "/"}


def strip_pod(text):
    """POD: headings and prose kept, verbatim (indented) paragraphs kept as code."""
    out, in_pod = [], True
    for para in re.split(r"\n\s*\n", text):
        if para.startswith("=cut"):
            in_pod = False
            continue
        if para.startswith(("=pod", "=head", "=over", "=item", "=encoding", "=begin")):
            in_pod = True
        if not in_pod:
            continue
        if para[:1].isspace():
            out.append(verbatim(para))
            continue
        if para.startswith("="):
            m = re.match(r"=(head\d|item)\s+(.*)", para, re.S)
            if not m:
                continue
            para = m.group(2)
        for _ in range(4):  # nested formatting codes, innermost first
            para = re.sub(r"[A-Z]<<+\s+(.*?)\s+>>+", r"\1", para, flags=re.S)
            para = re.sub(r"E<(lt|gt|quot|amp|verbar|sol)>", lambda m: POD_ENTITIES[m.group(1)],
                          para)
            para = re.sub(r"[XZ]<[^<>]*>", "", para)
            para = re.sub(r"L<([^<>|]*)\|[^<>]*>", r"\1", para)
            para = re.sub(r"[BICFSLE]<([^<>]*)>", r"\1", para)
        out.append(para.strip())
    return "\n\n".join(out)


def strip_info(text):
    """Texinfo .info: node headers, menus and the tag table dropped; examples (indented five or
    more columns) kept verbatim by blocks()."""
    text = text.split("\x1fTag Table:")[0]
    out, in_menu = [], False
    for line in text.split("\n"):
        if line.startswith(("\x1f", "File: ", "This is ")):
            out.append("")
            continue
        if line.startswith("* Menu:"):
            in_menu = True
            continue
        if in_menu:
            if not line.strip() or line.startswith(("*", " ")):
                continue
            in_menu = False
        if RST_UNDERLINE.match(line):
            out.append("")
            continue
        out.append(line)
    return re.sub(r"\*[Nn]ote ([^:]+)::", r"\1", "\n".join(out))


def strip_asciidoc(text):
    """AsciiDoc (git's manuals): listing blocks kept verbatim; attributes and macros dropped."""
    lines = text.split("\n")
    out, block, delim = [], None, None
    for k, line in enumerate(lines):
        s = line.rstrip()
        if re.fullmatch(r"(-{4,}|\.{4,}|={4,}|\+{4,}|_{4,}|\*{4,}|/{4,})", s):
            prev = lines[k - 1].rstrip() if k else ""
            if block is None and prev and abs(len(prev) - len(s)) <= 2 and s[0] in "-=~^+":
                out.append("")  # a section underline
            elif block is not None and s == delim:
                if delim[0] in "-.":
                    out.append(verbatim("\n".join(block)))
                block = None
            elif block is None:
                block, delim = [], s
            continue
        if block is not None:
            block.append(line)
            continue
        if re.match(r"^(:\w[\w-]*:|\[\w*.*\]$|include::|ifdef::|endif::|ifndef::)", s):
            continue
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"linkgit:([\w-]+)\[\d\]", r"\1", text)
    text = re.sub(r"link:[^\[\s]+\[([^\]]*)\]", r"\1", text)
    text = re.sub(r"<<[^,>]*,([^>]*)>>", r"\1", text)
    text = re.sub(r"[`'](\S[^`'\n]*?)[`']", r"\1", text)
    return text.replace("{litdd}", "--")


ROFF_GLYPHS = {"em": "\u2014", "en": "\u2013", "bu": "\u2022", "lq": "\u201c", "rq": "\u201d",
               "oq": "\u2018", "cq": "\u2019", "aq": "'", "dq": '"', "co": "\u00a9",
               "rg": "\u00ae", "tm": "\u2122", "mu": "\u00d7", "de": "\u00b0", "hy": "-",
               "ti": "~", "ha": "^", "rs": "\\", "ga": "`", "lB": "[", "rB": "]", "<=": "<=",
               ">=": ">=", "->": "->", "<-": "<-", "pl": "+", "mi": "-", "eq": "="}
ROFF_ALTERNATING = {"BR", "RB", "IR", "RI", "BI", "IB"}


def roff_inline(s):
    s = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", s)                   # font changes
    s = re.sub(r"\\s[-+]?\d+|\\s\(\d\d|\\s\[\d+\]", "", s)           # size changes
    s = re.sub(r"\\\*?\((..)", lambda m: ROFF_GLYPHS.get(m.group(1), ""), s)
    s = re.sub(r"\\\*?\[([^\]]*)\]", lambda m: ROFF_GLYPHS.get(m.group(1), ""), s)
    s = re.sub(r"\\\*.", "", s)
    s = s.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "").replace("\\|", "")
    s = s.replace("\\^", "").replace("\\~", " ").replace("\\ ", " ").replace("\\c", "")
    s = s.replace("\\0", " ").replace("\\%", "").replace("\\:", "").replace("\\(", "(")
    s = s.replace("\\,", "").replace("\\/", "")                    # italic corrections
    return s


def roff_args(rest):
    return [a.strip('"') for a in re.findall(r'"[^"]*"|\S+', rest)]


def strip_man(text):
    """roff man page (man/mdoc macros, roughly): headings, paragraphs, tagged items; .nf/.EX
    regions kept verbatim."""
    out, verb = [], None
    for line in text.split("\n"):
        if line.startswith((".\\\"", "'\\\"", "\\\"")) or line in (".", "'"):
            continue
        if verb is not None:
            if re.match(r"^\.\s*(fi|EE|Ef)\b", line):
                out.append(verbatim("\n".join(verb)))
                verb = None
            elif not line.startswith("."):
                verb.append(roff_inline(line))
            continue
        m = re.match(r"^[.']\s*(\w+)\s*(.*)", line)
        if not m:
            out.append(roff_inline(line))
            continue
        macro, rest = m.group(1), m.group(2)
        if macro in ("nf", "EX", "Bd"):
            verb = []
        elif macro == "TH" or macro == "Dt":
            args = roff_args(rest)
            out += ["", "%s(%s)" % tuple((args + ["", ""])[:2]), ""]
        elif macro in ("SH", "SS", "Sh", "Ss"):
            out += ["", roff_inline(" ".join(roff_args(rest))), ""]
        elif macro in ("B", "I", "SM", "SB", "Nm", "Ar", "Fl", "Cm", "Pa", "Em", "Sy", "Nd",
                       "Dv", "Ev", "Fn", "Xr", "Va", "Ic", "Li"):
            out.append(roff_inline(" ".join(roff_args(rest))))
        elif macro in ROFF_ALTERNATING:
            out.append(roff_inline("".join(roff_args(rest))))
        elif macro in ("IP", "TP", "HP", "It"):
            out.append("")
            tag = roff_inline(" ".join(roff_args(rest)))
            if tag and macro in ("IP", "It"):
                out += [tag, ""]
        elif macro in ("PP", "LP", "P", "sp", "Pp", "br", "RS", "RE", "in"):
            out.append("")
        # other requests and macros (fonts, traps, strings, conditionals) carry no text
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# HTML
# ----------------------------------------------------------------------------------------------

class HtmlText(html.parser.HTMLParser):
    """Visible prose of an HTML page and its <pre> blocks (verbatim); tables, navigation,
    scripts and index terms dropped."""
    BLOCK = {"p", "div", "br", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr",
             "blockquote", "section", "ul", "ol", "dl", "title", "td", "th", "hr", "table"}
    SKIP_TAGS = {"script", "style", "head", "table", "nav", "footer", "header", "svg", "math",
                 "form", "button", "select", "textarea"}
    SKIP_CLASSES = {"navheader", "navfooter", "sphinxsidebar", "related", "footer", "toc",
                    "headerlink", "indexterm", "breadcrumb", "docnav", "navigation", "index",
                    "legalnotice", "copyright", "titlepage", "sidebar", "menu-bar",
                    "nav-chapters", "nav-wrapper", "linenos", "lineno", "sig-paren"}
    VOID = {"br", "img", "hr", "meta", "link", "input", "area", "base", "col", "embed",
            "source", "track", "wbr", "param"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.stack, self.skip_depth, self.pre_depth = [], [], None, None

    def handle_starttag(self, tag, attrs):
        if tag in self.BLOCK and self.pre_depth is None:
            self.parts.append("\n\n")
        if tag in self.VOID:
            return
        self.stack.append(tag)
        if self.skip_depth is None:
            cls = dict(attrs).get("class") or ""
            if tag in self.SKIP_TAGS or set(cls.split()) & self.SKIP_CLASSES:
                self.skip_depth = len(self.stack)
            elif tag == "pre" and self.pre_depth is None:
                self.pre_depth = len(self.stack)
                self.parts.append("\n\n" + VERBATIM_START)

    def handle_endtag(self, tag):
        if tag in self.VOID or tag not in self.stack:
            return
        while self.stack:  # tolerate unclosed children
            top = self.stack.pop()
            if self.skip_depth is not None and len(self.stack) < self.skip_depth:
                self.skip_depth = None
            if self.pre_depth is not None and len(self.stack) < self.pre_depth:
                self.pre_depth = None
                self.parts.append(VERBATIM_END + "\n\n")
            if top == tag:
                break
        if tag in self.BLOCK and self.pre_depth is None:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if self.skip_depth is None:
            self.parts.append(data if self.pre_depth is not None else data.replace("\n", " "))


def strip_html(text):
    parser = HtmlText()
    parser.feed(text)
    parser.close()
    if parser.pre_depth is not None:
        parser.parts.append(VERBATIM_END)
    return "".join(parser.parts)


def plain(text):
    return text
