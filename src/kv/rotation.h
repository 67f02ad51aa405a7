// The orthonormal Walsh–Hadamard rotation of per-head vectors (`rot=hadamard` in a KV spec).
// Rotating q and k by the same orthonormal H leaves every score q·k unchanged, and rotating v makes
// the attention output H·o, rotated back by H (which is its own inverse). Outlier channels are
// spread over all dims, so per-token/per-column min-max quantization wastes fewer levels on them.
// Dims that are not a power of two are rotated as consecutive power-of-two chunks (96 = 64 + 32):
// still orthonormal.
#pragma once

namespace slimkv {

// x[0..n) ← H x, in place; applying it twice gives x back (up to float rounding).
void hadamard_rotate(float* x, int n);

}  // namespace slimkv
