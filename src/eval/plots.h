// The PNG plots of slimkv eval, drawn by gnuplot from the results table (whichever tasks ran):
//   passkey.png    accuracy heatmaps, length x depth, one panel per spec and question placement
//   kvret.png      accuracy by length, a line per spec, one panel per question placement
//   fidelity.png   attention-output error by layer, a line per spec (log scale)
//   tradeoff.png   KV bytes per token against perplexity, a point per spec
// The gnuplot script (with its data inline) is kept as plots.gp beside them, to redraw or restyle.
#pragma once

#include <string>
#include <vector>

#include "slimkv/eval_results.h"
#include "slimkv/status.h"

namespace slimkv {

Status write_plots(const EvalResults& results, const std::vector<std::string>& specs, const std::string& out_dir);

}  // namespace slimkv
