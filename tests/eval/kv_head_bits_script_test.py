"""scripts/kv_head_bits.py: every (layer, KV head) of the bundled model measured once, ranked by the KL it
removes, and the printed spec widens the best --heads of them (a spec slimkv accepts); a base spec without
hibits (dense) is refused by slimkv, and the script fails with its message.
Usage: kv_head_bits_script_test.py SLIMKV_BINARY SOURCE_DIR (ctest runs it)."""
import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

SLIMKV, SOURCE = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(SOURCE, "scripts", "kv_head_bits.py")
MODEL = os.path.join(SOURCE, "models", "slimkv-llama-15m")
TEXT = sorted(glob.glob(os.path.join(SOURCE, "docs", "*.md")))[:3]


def run(spec, json_path=None, heads=3):
    command = [sys.executable, SCRIPT, "--slimkv", SLIMKV, "--model", MODEL, "--spec", spec, "--heads", str(heads),
               "--context", "256", "--windows", "1", "--threads", "1", "--text", *TEXT]
    if json_path:
        command += ["--json", json_path]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


class KvHeadBitsScriptTest(unittest.TestCase):
    def test_every_head_ranked_and_the_best_widened(self):
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "heads.json")
            done = run("hack:bits=2,pi=64", path)
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(path) as f:
                measured = json.load(f)
            with open(os.path.join(MODEL, "config.json")) as f:
                config = json.load(f)
            heads = [(h["layer"], h["head"]) for h in measured["heads"]]
            self.assertEqual(sorted(heads), [(l, g) for l in range(config["num_hidden_layers"])
                                             for g in range(config["num_key_value_heads"])])
            gains = [h["kld_gain"] for h in measured["heads"]]
            self.assertEqual(gains, sorted(gains, reverse=True))
            self.assertGreater(gains[0], 0.0)  # some head's 4-bit blocks bring the KV nearer dense
            best = sorted(heads[:3])
            spec = done.stdout.strip().splitlines()[-1]
            self.assertEqual(spec, "hack:bits=2,pi=64,hibits=4,hiheads=" + "/".join(f"{l}.{g}" for l, g in best))
            self.assertIn(f"KL {measured['base_kld']:.5f}", done.stdout)

    def test_a_spec_without_hibits_is_refused_by_name(self):
        done = run("dense")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("hibits", done.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
