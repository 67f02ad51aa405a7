"""scripts/heldout_ppl.py --record: it refuses, before any window runs, a reference file without an
entry at the run's context or over other windows, naming what is missing; and over matching windows it
records slimkv's perplexity beside the reference's, keeping the rest of the file.
Usage: heldout_ppl_script_test.py SLIMKV_BINARY SOURCE_DIR (ctest runs it)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SLIMKV, SOURCE = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(SOURCE, "scripts", "heldout_ppl.py")
MODEL = os.path.join(SOURCE, "models", "slimkv-llama-15m")
CONTEXT, WINDOWS = 64, 2


class HeldoutPplRecordTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        # The first lines of the held-out text: a few windows of CONTEXT tokens, so each run takes seconds.
        with open(os.path.join(MODEL, "heldout.txt"), encoding="utf-8") as f:
            lines = f.read(20000).split("\n")[:-1]
        self.text = os.path.join(self.work.name, "text.txt")
        with open(self.text, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        self.reference = os.path.join(self.work.name, "reference.json")

    def tearDown(self):
        self.work.cleanup()

    def run_script(self, reference, kv="dense"):
        with open(self.reference, "w") as f:
            json.dump(reference, f)
        return subprocess.run([sys.executable, SCRIPT, "--model", MODEL, "--text", self.text, "--slimkv", SLIMKV,
                               "--context", str(CONTEXT), "--max-windows", str(WINDOWS), "--kv", kv,
                               "--record", self.reference], capture_output=True, text=True, timeout=120)

    def assert_refused(self, reference, *named):
        # A KV spec slimkv refuses: had a window run, that would be the error instead.
        result = self.run_script(reference, kv="no-such-codec")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("heldout_ppl: --record " + self.reference, result.stderr)
        for name in named:
            self.assertIn(name, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        with open(self.reference) as f:
            self.assertEqual(json.load(f), reference)  # untouched

    def test_a_reference_without_the_context_is_refused(self):
        self.assert_refused({"ppl_1024": {"context": 1024, "windows": WINDOWS, "ppl": 26.2}},
                            'no "ppl_%d" entry' % CONTEXT, "context %d" % CONTEXT)

    def test_a_reference_over_other_windows_is_refused(self):
        self.assert_refused({"ppl_%d" % CONTEXT: {"context": CONTEXT, "windows": 64, "ppl": 30.0}},
                            '"ppl_%d" is over 64 windows, this run over %d' % (CONTEXT, WINDOWS), "--max-windows")

    def test_an_entry_without_windows_is_refused(self):
        self.assert_refused({"ppl_%d" % CONTEXT: {"context": CONTEXT, "ppl": 30.0}}, "is over None windows")

    def test_a_file_that_is_not_json_is_refused(self):
        with open(self.reference, "w") as f:
            f.write("{not json")
        result = subprocess.run([sys.executable, SCRIPT, "--model", MODEL, "--text", self.text, "--slimkv", SLIMKV,
                                 "--context", str(CONTEXT), "--max-windows", str(WINDOWS), "--kv", "no-such-codec",
                                 "--record", self.reference], capture_output=True, text=True, timeout=120)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("cannot read it as JSON", result.stderr)

    def test_matching_windows_are_recorded_beside_the_reference(self):
        reference = {"ppl_%d" % CONTEXT: {"context": CONTEXT, "windows": WINDOWS, "ppl": 30.0}, "heldout_tokens": 9}
        result = self.run_script(reference)
        self.assertEqual(result.returncode, 0, result.stderr)
        printed = json.loads(result.stdout)
        self.assertEqual((printed["windows"], printed["tokens"]), (WINDOWS, WINDOWS * (CONTEXT - 1)))
        # A small model on real text: a perplexity well above 1 and well below the vocabulary (8192).
        self.assertTrue(2 < printed["ppl"] < 1000, printed)
        with open(self.reference) as f:
            recorded = json.load(f)
        entry = recorded["ppl_%d" % CONTEXT]
        self.assertEqual((entry["slimkv_ppl"], entry["slimkv_kv"]), (printed["ppl"], "dense"))
        self.assertEqual((entry["ppl"], entry["windows"], recorded["heldout_tokens"]), (30.0, WINDOWS, 9))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
