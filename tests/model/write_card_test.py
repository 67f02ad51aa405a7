"""scripts/train/write_card.py: a model folder without eval.json or config.json is refused with a
message naming the missing file; the bundled model's folder gives back its committed card (README.md),
which may add free paragraphs (--notes) between the generated lines but no number of its own.
Usage: write_card_test.py SOURCE_DIR (ctest runs it)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = sys.argv[1]
SCRIPT = os.path.join(SOURCE, "scripts", "train", "write_card.py")
MODEL = os.path.join(SOURCE, "models", "slimkv-llama-15m")
# The arguments the committed card was written with (write_card.py's docstring).
ARGS = ["--gpu-calls", "6", "--trained", "2026-11-28", "--replaces",
        "the first slimkv-llama-15m (corpus v2, 2026-11-26), whose pass key at 8K was 0.9, records lookup at 8K "
        "0.35, and held-out sources 1.91x the perplexity of its decontaminated split; that one had replaced "
        "slimkv-llama-14m, which had learned its 26M-token corpus by heart (51 passes)."]


def write_card(cwd, model_dir):
    return subprocess.run([sys.executable, SCRIPT, "--model-dir", model_dir, *ARGS], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


class WriteCardTest(unittest.TestCase):
    def test_a_folder_without_eval_or_config_is_refused_naming_what_is_missing(self):
        with tempfile.TemporaryDirectory() as folder:
            result = write_card(folder, folder)
            self.assertEqual(result.returncode, 1)
            self.assertIn("write_card: %s has no eval.json or config.json" % folder, result.stderr)
            shutil.copy(os.path.join(MODEL, "config.json"), folder)
            result = write_card(folder, folder)
            self.assertEqual(result.returncode, 1)
            self.assertIn("write_card: %s has no eval.json (" % folder, result.stderr)
            os.remove(os.path.join(folder, "config.json"))
            shutil.copy(os.path.join(MODEL, "eval.json"), folder)
            result = write_card(folder, folder)
            self.assertEqual(result.returncode, 1)
            self.assertIn("write_card: %s has no config.json (" % folder, result.stderr)
            self.assertFalse(os.path.exists(os.path.join(folder, "README.md")))

    def test_the_bundled_model_gives_back_its_committed_card(self):
        with tempfile.TemporaryDirectory() as work:
            # The model folder by links (no copy of the weights), at the same relative path as in the tree.
            folder = os.path.join(work, "models", "slimkv-llama-15m")
            os.makedirs(folder)
            for name in os.listdir(MODEL):
                if name != "README.md":
                    os.symlink(os.path.join(MODEL, name), os.path.join(folder, name))
            result = write_card(work, "models/slimkv-llama-15m")
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(folder, "README.md")) as f:
                generated = f.read().split("\n")
        with open(os.path.join(MODEL, "README.md")) as f:
            committed = f.read().split("\n")
        # Every generated line, in order, in the committed card; the committed card's other lines are notes.
        at = 0
        for line in generated:
            while at < len(committed) and committed[at] != line:
                at += 1
            self.assertLess(at, len(committed), "the committed card lacks the generated line %r" % line)
            at += 1
        self.assertGreater(len(generated), 40)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
