#!/usr/bin/env python3
"""The docs check (ctest `docs_check`): the README and docs/ cannot drift from the CLI or the tree.

For every Markdown file (README.md, docs/**/*.md):
- every `slimkv ...` command it quotes — in a fenced code block (backslash continuations joined,
  comments dropped) or in an inline code span — parses: it is run as `slimkv --dry-parse ARGS`, which
  parses and validates the options and exits before any work, so an unknown subcommand, an unknown
  flag or a bad choice fails. Placeholders stay as they are (DIR, SPEC are values); `[optional parts]`
  are kept without their brackets, and of `a|b` alternatives the first is used.
- every relative link `[text](path#anchor)` and image resolves to a file or folder inside the
  repository, and an #anchor to a heading of the Markdown file it names (GitHub's heading ids);
- every path in backticks that starts with a top folder of the repository (`src/...`, `docs/...`)
  exists, so no page cites a file that only lives on a branch, and none starts with `../`.

Usage: check_docs.py SLIMKV ROOT        SLIMKV: the built CLI; ROOT: the repository
       check_docs.py --self-test SLIMKV plants a bad flag, subcommand, link, anchor and path in a
                                        temporary tree and expects each to be reported
"""
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import tempfile

TOP_FOLDERS = ("src", "docs", "tests", "bench", "scripts", "include", "models", "fuzz", "examples", "cmake")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files(root):
    files = [os.path.join(root, "README.md")]
    for dirpath, dirnames, names in os.walk(os.path.join(root, "docs")):
        dirnames.sort()
        files += [os.path.join(dirpath, name) for name in sorted(names) if name.endswith(".md")]
    return [path for path in files if os.path.isfile(path)]


def split_blocks(text):
    """Returns (code lines with their line numbers, prose lines with theirs), fences removed."""
    code, prose, in_fence = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        (code if in_fence else prose).append((number, line))
    return code, prose


def logical_lines(numbered_lines):
    """Joins lines ending in a backslash with the next, as the shell does."""
    joined, start, parts = [], None, []
    for number, line in numbered_lines:
        # A synopsis continues an option list on indented lines without a backslash.
        if not parts and joined and re.match(r"^\s+[\[-]", line) and "slimkv" in joined[-1][1]:
            joined[-1] = (joined[-1][0], joined[-1][1] + " " + line.strip())
            continue
        start = number if not parts else start
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        joined.append((start, " ".join(parts)))
        parts = []
    if parts:
        joined.append((start, " ".join(parts)))
    return joined


def resolve_placeholders(words):
    """[--flag VALUE] -> --flag VALUE; a|b -> a (outside quoted values the shell would split anyway)."""
    out = []
    for word in words:
        bare = word.strip("[]")
        if not bare:
            continue
        if "|" in bare and not bare.startswith(("-", '"')) and "," not in bare:
            bare = bare.split("|")[0]
        elif bare.startswith("--") and "|" in bare:
            bare = bare.split("|")[0]
        out.append(bare)
    return out


def slimkv_arguments(command_text):
    """The arguments after the slimkv executable if the text runs it, else None."""
    try:
        words = shlex.split(command_text, comments=True)
    except ValueError:
        return None
    # Leading VAR=value assignments and `time` do not change what runs.
    while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] == "time"):
        words = words[1:]
    if not words or os.path.basename(words[0]) != "slimkv":
        return None
    if len(words) > 1 and words[1].endswith(":"):
        return None  # a quoted message ("slimkv generate: error: ..."), not a command
    words = words[1:]
    # A pipeline or a second command after the first ends its arguments.
    for index, word in enumerate(words):
        if word in ("|", "&&", ";", ">", "2>", "&"):
            words = words[:index]
            break
    return resolve_placeholders(words)


def quoted_commands(text):
    """(line, arguments, whether an inline fragment) of every slimkv command quoted in a Markdown text."""
    code, prose = split_blocks(text)
    found = []
    for number, line in logical_lines(code):
        arguments = slimkv_arguments(line.strip().lstrip("$ "))
        if arguments is not None:
            found.append((number, arguments, False))
    for number, line in prose:
        for span in INLINE_CODE.findall(line):
            arguments = slimkv_arguments(span)
            if arguments:  # a bare `slimkv` names the tool, not a command
                found.append((number, arguments, True))
    return found


def check_command(slimkv, arguments, fragment):
    """An error message, or None when the command line parses."""
    if arguments[0].startswith("-") and arguments[0] not in ("--help", "-h", "--version"):
        return "no subcommand"
    if len(arguments) == 1 or arguments[0] in ("--help", "-h", "--version"):
        argv = [slimkv] + arguments + (["--help"] if len(arguments) == 1 else [])
    else:
        argv = [slimkv, "--dry-parse"] + arguments
    # An inline span may quote part of a command (`slimkv eval --device cuda`): a required option it
    # leaves out is filled in with a placeholder and the rest still checked; a fenced block must hold
    # whole commands.
    for _ in range(4):
        # Parsing takes milliseconds; the generous limit is for a loaded 2-core CI machine, where a
        # process's start (its libraries' loading) can take tens of seconds.
        try:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return "did not finish parsing within 300 s"
        if result.returncode == 0:
            return None
        message = (result.stderr.strip() or result.stdout.strip()).splitlines()[0]
        missing = re.fullmatch(r"(--[\w-]+) is required", message)
        numeric = re.fullmatch(r"Could not convert: (--[\w-]+) = ([A-Z][A-Z_]*)", message)
        if numeric:  # a placeholder such as N or BYTES for a number
            argv = [word if word != numeric.group(2) else "1" for word in argv]
        elif fragment and missing:
            argv = argv + [missing.group(1), "PLACEHOLDER"]
        else:
            return message
    return message


def github_anchor(heading):
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path):
    anchors, seen = set(), {}
    _, prose = split_blocks(open(path, encoding="utf-8").read())
    for _, line in prose:
        match = HEADING.match(line)
        if not match:
            continue
        base = github_anchor(match.group(2))
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def inside(root, path):
    return os.path.commonpath([os.path.realpath(root), os.path.realpath(path)]) == os.path.realpath(root)


def check_links(root, path, text):
    problems = []
    code, prose = split_blocks(text)
    for number, line in prose:
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: — outside the repository by intent
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{os.path.relpath(path, root)}:{number}"
            if not inside(root, resolved):
                problems.append(f"{where}: link {target} leaves the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{where}: link {target}: no such file")
            elif anchor and resolved.endswith(".md") and anchor not in anchors_of(resolved):
                problems.append(f"{where}: link {target}: no heading #{anchor} in {os.path.relpath(resolved, root)}")
        for span in INLINE_CODE.findall(line):
            if span.startswith("../"):
                problems.append(f"{os.path.relpath(path, root)}:{number}: `{span}` points outside the repository")
                continue
            first = span.split("/")[0]
            if first not in TOP_FOLDERS or " " in span or re.search(r"[*{}<>$|]|\.\.\.", span):
                continue
            candidate = span.split(":")[0].split("#")[0].rstrip(".,;")
            if not os.path.exists(os.path.join(root, candidate)):
                problems.append(f"{os.path.relpath(path, root)}:{number}: `{span}`: no such file in the repository")
    return problems


def check(slimkv, root):
    problems, quoted = [], []
    for path in markdown_files(root):
        text = open(path, encoding="utf-8").read()
        problems += check_links(root, path, text)
        quoted += [(path, number, arguments, fragment) for number, arguments, fragment in quoted_commands(text)]
    # A slimkv process spends most of its short life loading its libraries: a few at a time hide that.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        errors = pool.map(lambda q: check_command(slimkv, q[2], q[3]), quoted)
        for (path, number, arguments, _), error in zip(quoted, errors):
            if error:
                shown = " ".join(shlex.quote(word) for word in arguments)
                problems.append(f"{os.path.relpath(path, root)}:{number}: slimkv {shown}: {error}")
    return problems, len(quoted)


def self_test(slimkv):
    """Each planted fault must be reported; the clean page must not be."""
    faults = {
        "flag": "```sh\nslimkv generate --model DIR --no-such-flag 1\n```\n",
        "number": "```sh\nslimkv generate --model DIR --max-tokens many\n```\n",
        "subcommand": "Run `slimkv generat --model DIR`.\n",
        "fragment flag": "Run `slimkv eval --no-such-flag`.\n",
        "choice": "```sh\nbuild/release/slimkv logits --model DIR --tokens 1 --out x.npy --mode sideways\n```\n",
        "link": "See [the guide](no-such-page.md).\n",
        "anchor": "See [models](clean.md#no-such-heading).\n",
        "outside": "See [shared](../../outside.md).\n",
        "path": "The code is in `src/no_such_file.cc`.\n",
    }
    clean = ("# Clean page\n\n## Models and tokenizers\n\n[here](#models-and-tokenizers), [folder](../docs/)\n"
             "```sh\n$B/slimkv generate --model DIR --prompt \"hi\" \\\n    [--kv dense:dtype=f16] # comment\n"
             "slimkv logits --model DIR --tokens 1,2 --out l.npy [--mode prefill|incremental] [--threads N]\n```\n"
             "`slimkv eval` and `src/` exist; `slimkv generate: error: x` is a message.\n")
    failed = False
    for name, page in list(faults.items()) + [("clean", None)]:
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "docs"))
            os.makedirs(os.path.join(root, "src"))
            open(os.path.join(root, "README.md"), "w").write("# Test\n")
            open(os.path.join(root, "docs", "clean.md"), "w").write(clean)
            if page is not None:
                open(os.path.join(root, "docs", "planted.md"), "w").write(page)
            problems, _ = check(slimkv, root)
        expected = page is not None
        if bool(problems) != expected:
            failed = True
            print(f"self-test {name}: expected {'a problem' if expected else 'none'}, got {problems}")
        else:
            print(f"self-test {name}: ok {problems[:1]}")
    return 1 if failed else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--self-test":
        return self_test(sys.argv[2])
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    slimkv, root = sys.argv[1], sys.argv[2]
    problems, commands = check(slimkv, root)
    for problem in problems:
        print(problem)
    print(f"docs check: {len(markdown_files(root))} pages, {commands} slimkv commands, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
