"""scripts/make_random_model.py (the random-weight models of real shapes that the GPU serving figures
load): its tiny shape in both dtypes is a model `slimkv generate` loads and runs, the files hold what
config.json says, the same seed gives the same bytes and another seed others, --layers keeps that
many layers, and a non-empty --out or a bad --layers is refused.
Usage: random_model_test.py SLIMKV_BINARY SOURCE_DIR (ctest runs it)."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

SLIMKV, SOURCE = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(SOURCE, "scripts", "make_random_model.py")


def make(out, *flags):
    return subprocess.run([sys.executable, SCRIPT, "--shape", "tiny", "--out", out, *flags],
                          capture_output=True, text=True, timeout=120)


def safetensors_header(path):
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(length))


def weights_bytes(folder):
    with open(os.path.join(folder, "model-00001-of-00001.safetensors"), "rb") as f:
        return f.read()


class RandomModelTest(unittest.TestCase):
    def test_each_dtype_is_a_model_slimkv_runs(self):
        for dtype, stored in (("bfloat16", "BF16"), ("float16", "F16")):
            with tempfile.TemporaryDirectory() as out:
                made = make(out, "--dtype", dtype)
                self.assertEqual(made.returncode, 0, made.stderr)
                with open(os.path.join(out, "config.json")) as f:
                    config = json.load(f)
                self.assertEqual(config["torch_dtype"], dtype)
                header = safetensors_header(os.path.join(out, "model-00001-of-00001.safetensors"))
                self.assertEqual({t["dtype"] for name, t in header.items() if name != "__metadata__"}, {stored})
                self.assertEqual(header["model.layers.1.mlp.down_proj.weight"]["shape"],
                                 [config["hidden_size"], config["intermediate_size"]])
                generated = subprocess.run([SLIMKV, "generate", "--model", out, "--prompt", "Hello there",
                                            "--max-tokens", "6", "--temperature", "0", "--threads", "2"],
                                           capture_output=True, text=True, timeout=120)
                self.assertEqual(generated.returncode, 0, generated.stderr)
                self.assertIn("<random", generated.stdout, dtype)  # the padded vocabulary decodes

    def test_the_seed_decides_the_bytes(self):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
                tempfile.TemporaryDirectory() as c:
            for out, seed in ((a, "7"), (b, "7"), (c, "8")):
                self.assertEqual(make(out, "--seed", seed).returncode, 0)
            self.assertEqual(weights_bytes(a), weights_bytes(b))
            self.assertNotEqual(weights_bytes(a), weights_bytes(c))

    def test_a_non_empty_out_is_refused(self):
        with tempfile.TemporaryDirectory() as out:
            open(os.path.join(out, "keep.txt"), "w").close()
            made = make(out)
            self.assertNotEqual(made.returncode, 0)
            self.assertIn("exists and is not empty", made.stderr)
            self.assertEqual(os.listdir(out), ["keep.txt"])

    def test_layers_keeps_that_many_at_their_real_shape(self):
        with tempfile.TemporaryDirectory() as out:
            made = make(out, "--layers", "1")
            self.assertEqual(made.returncode, 0, made.stderr)
            with open(os.path.join(out, "config.json")) as f:
                config = json.load(f)
            self.assertEqual(config["num_hidden_layers"], 1)
            header = safetensors_header(os.path.join(out, "model-00001-of-00001.safetensors"))
            self.assertIn("model.layers.0.mlp.down_proj.weight", header)
            self.assertNotIn("model.layers.1.mlp.down_proj.weight", header)
        for bad in ("0", "3"):  # the tiny shape has 2 layers
            with tempfile.TemporaryDirectory() as out:
                made = make(out, "--layers", bad)
                self.assertNotEqual(made.returncode, 0)
                self.assertIn(f"--layers {bad}: expected 1 to 2", made.stderr)
                self.assertEqual(os.listdir(out), [])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
