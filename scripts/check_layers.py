#!/usr/bin/env python3
"""The layer check (docs/design.md "Layers"): an #include "x/..." in src/<folder>/ may point only to its
own folder or to one below it in LAYER_ORDER, so that each layer can be read, tested and replaced without
those above it. Fails, naming file:line and both folders, on an include that points up, and on a src/ top
folder missing from the order (a new folder must be placed before it can be checked).

Usage: check_layers.py [--tools-public-only] [ROOT]     ROOT: the repository (default: this script's)
       check_layers.py --self-test                      plants violations in a temporary tree
--tools-public-only also fails on an include of src/tools/ or src/python/ outside include/slimkv/ and the
including folder itself: the CLI and the Python module are clients of the public API, like the server.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

# Top to bottom; the folders of one entry share a rank and may include each other.
LAYER_ORDER = [
    ("tools", "python"),
    ("router",),
    ("serve", "transfer"),
    ("eval",),
    ("engine",),
    ("model",),
    ("kv",),
    ("attention",),
    ("backend", "tokenizer"),
    ("tensor", "format"),
    ("util",),
]
RANK = {folder: len(LAYER_ORDER) - i for i, entry in enumerate(LAYER_ORDER) for folder in entry}
PUBLIC_API = "slimkv"  # include/slimkv/: the public API, includable from every layer
PUBLIC_ONLY = ("tools", "python")  # clients of the public API alone (--tools-public-only)

INCLUDE = re.compile(r'\s*#\s*include\s*"([^"]+)"')


def check(root, tools_public_only):
    """Returns the violations in root/src, one line each."""
    src = os.path.join(root, "src")
    problems = []
    folders = sorted(entry for entry in os.listdir(src) if os.path.isdir(os.path.join(src, entry)))
    for folder in folders:
        if folder not in RANK:
            problems.append(f"src/{folder}/: not in the layer order of scripts/check_layers.py: place it there")
    for folder in folders:
        if folder not in RANK:
            continue
        for dirpath, dirnames, files in os.walk(os.path.join(src, folder)):
            dirnames.sort()
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                shown = os.path.relpath(path, root)
                with open(path, errors="replace") as lines:
                    for number, line in enumerate(lines, 1):
                        match = INCLUDE.match(line)
                        if not match or "/" not in match.group(1):
                            continue  # not an include, or one of the including file's own folder
                        target = match.group(1).split("/")[0]
                        if target in RANK and RANK[target] > RANK[folder]:
                            problems.append(f'{shown}:{number}: {folder}/ includes "{match.group(1)}" of {target}/, '
                                            f"a layer above it")
                        elif tools_public_only and folder in PUBLIC_ONLY and target not in (PUBLIC_API, folder):
                            problems.append(f'{shown}:{number}: {folder}/ includes "{match.group(1)}" of {target}/, '
                                            f"outside the public API (include/slimkv/)")
    return problems


def self_test():
    """Runs this script on temporary trees: a clean one passes, each planted violation fails by name."""
    def run(files, *options):
        with tempfile.TemporaryDirectory() as root:
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), "w") as out:
                    out.write(text)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), *options, root],
                                  capture_output=True, text=True)
            return done.returncode, done.stdout + done.stderr

    clean = {
        "src/util/half.h": "#pragma once\n",
        "src/kv/store.h": '#include "attention/partial.h"\n#include "kv/codec/codec.h"\n#include "slimkv/status.h"\n',
        "src/kv/codec/codec.h": '#include "tensor/block_shape.h"\n#include <vector>\n',
        "src/attention/partial.h": '#include "util/half.h"\n',
        "src/tools/main.cc": '#include "slimkv/engine.h"\n#include "tools/commands.h"\n#include "commands.h"\n',
        "src/python/module.cc": '#include <pybind11/pybind11.h>\n#include "python/binding.h"\n#include "slimkv/engine.h"\n',
    }
    cases = [  # (name, files, options, expected exit code, texts the output must contain)
        ("clean tree", clean, [], 0, []),
        ("include up", {**clean, "src/attention/partial.h": '#include "util/half.h"\n  #  include "kv/store.h"\n'},
         [], 1, ["src/attention/partial.h:2:", "attention/", "kv/"]),
        ("include up from a subfolder", {**clean, "src/kv/codec/codec.h": '#include "model/llama.h"\n'},
         [], 1, ["src/kv/codec/codec.h:1:", "kv/", "model/"]),
        ("folder not ranked", {**clean, "src/misc/x.h": "#pragma once\n"}, [], 1, ["src/misc/"]),
        ("tools leak, unchecked", {**clean, "src/tools/main.cc": '#include "kv/store.h"\n'}, [], 0, []),
        ("tools leak", {**clean, "src/tools/main.cc": '#include "slimkv/engine.h"\n#include "kv/store.h"\n'},
         ["--tools-public-only"], 1, ["src/tools/main.cc:2:", "tools/", "kv/"]),
        ("tools public only, clean", clean, ["--tools-public-only"], 0, []),
        ("python leak", {**clean, "src/python/module.cc": '#include "slimkv/engine.h"\n#include "engine/sampler.h"\n'},
         ["--tools-public-only"], 1, ["src/python/module.cc:2:", "python/", "engine/"]),
        ("python includes tools", {**clean, "src/python/module.cc": '#include "tools/commands.h"\n'},
         ["--tools-public-only"], 1, ["src/python/module.cc:1:", "python/", "tools/"]),
        ("python leak, unchecked", {**clean, "src/python/module.cc": '#include "kv/store.h"\n'}, [], 0, []),
    ]
    failures = 0
    for name, files, options, expected_code, texts in cases:
        code, output = run(files, *options)
        missing = [text for text in texts if text not in output]
        if code != expected_code or missing:
            failures += 1
            print(f"FAIL self-test '{name}': exit {code} (expected {expected_code}), missing {missing} in:\n{output}")
    print(f"check_layers.py self-test: {len(cases) - failures}/{len(cases)} cases pass")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--tools-public-only", action="store_true",
                        help="also fail on src/tools/ and src/python/ includes outside include/slimkv/ and their own folder")
    parser.add_argument("--self-test", action="store_true", help="check this script on planted violations")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems = check(args.root, args.tools_public_only)
    for problem in problems:
        print(problem)
    order = " → ".join("(" + ", ".join(entry) + ")" if len(entry) > 1 else entry[0] for entry in LAYER_ORDER)
    print(f"layer check: {len(problems)} violation(s) of {order}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
