#include "eval/plots.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <map>
#include <set>

#include "util/atomic_file.h"

extern char** environ;

namespace slimkv {
namespace {

// A gnuplot string literal (double-quoted, backslash escapes). Text is drawn with enhanced mode off,
// so '_' in a spec is not a subscript.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::vector<const ResultRow*> select(const EvalResults& results, const std::string& task, const std::string& metric) {
  std::vector<const ResultRow*> rows;
  for (const ResultRow& row : results.rows()) {
    if (row.task == task && row.metric == metric) rows.push_back(&row);
  }
  return rows;
}

// One image: a gnuplot "set output" and the commands drawing it.
struct Figure {
  std::string file;
  int width = 0, height = 0;  // pixels
  std::string commands;       // what draws it, after the terminal and output are set
};

std::string passkey_heatmaps(const EvalResults& results, const std::vector<std::string>& specs, int& panels) {
  const auto rows = select(results, "passkey", "accuracy");
  std::string out;
  panels = 0;
  for (const std::string& spec : specs) {
    for (const char* placement : {"after", "before"}) {
      std::map<std::pair<int, double>, double> cells;
      std::set<int> lengths;
      std::set<double> depths;
      for (const ResultRow* row : rows) {
        if (row->spec != spec || row->placement != placement || !row->length || !row->depth) continue;
        cells[{*row->length, *row->depth}] = row->value;
        lengths.insert(*row->length);
        depths.insert(*row->depth);
      }
      if (cells.empty()) continue;
      ++panels;
      // A matrix with row/column headers: x = depth, y = length.
      out += "$passkey" + std::to_string(panels) + " << EOD\nx";
      for (double depth : depths) out += " " + std::to_string(int(depth * 100));
      out += "\n";
      for (int length : lengths) {
        out += std::to_string(length);
        for (double depth : depths) out += " " + std::to_string(cells[{length, depth}]);
        out += "\n";
      }
      out += "EOD\n";
      out += "set title " + quoted(spec + " (question " + placement + ")") + "\n";
      out += "plot $passkey" + std::to_string(panels) +
             " matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey" + std::to_string(panels) +
             " matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle\n";
    }
  }
  return out;
}

// Lines of `metric` against a grid key (length or layer), one per spec and, for kvret, per placement.
std::string lines_by_key(const EvalResults& results, const std::vector<std::string>& specs, const std::string& task,
                         const std::string& metric, bool by_layer, const std::string& placement) {
  const auto rows = select(results, task, metric);
  std::string data, plot;
  int series = 0;
  for (const std::string& spec : specs) {
    std::string block;
    for (const ResultRow* row : rows) {
      if (row->spec != spec) continue;
      if (!placement.empty() && row->placement != placement) continue;
      const std::optional<int> key = by_layer ? row->layer : row->length;
      if (!key) continue;
      block += std::to_string(*key) + " " + std::to_string(row->value) + "\n";
    }
    if (block.empty()) continue;
    const std::string name = "$" + task + std::to_string(++series) + placement;
    data += name + " << EOD\n" + block + "EOD\n";
    plot += std::string(plot.empty() ? "plot " : ", ") + name + " using 1:2 with linespoints title " + quoted(spec);
  }
  return plot.empty() ? "" : data + plot + "\n";
}

std::string tradeoff(const EvalResults& results, const std::vector<std::string>& specs) {
  std::map<std::string, double> bytes, ppl;
  for (const ResultRow& row : results.rows()) {
    if (!row.is_overall() || row.tier) continue;
    if (row.task == "memory" && row.metric == "kv_bytes_per_token") bytes[row.spec] = row.value;
    if (row.task == "ppl" && row.metric == "ppl") ppl[row.spec] = row.value;
  }
  std::string data;
  for (const std::string& spec : specs) {
    if (bytes.count(spec) && ppl.count(spec)) {
      data += std::to_string(bytes[spec]) + " " + std::to_string(ppl[spec]) + " " + quoted(spec) + "\n";
    }
  }
  if (data.empty()) return "";
  return "$tradeoff << EOD\n" + data +
         "EOD\nset xlabel 'KV bytes per token per layer'\nset ylabel 'perplexity (decode path)'\nset logscale xy\n"
         "plot $tradeoff using 1:2 with points pt 7 notitle, $tradeoff using 1:2:3 with labels offset 0,1 font ',8' "
         "notitle\n";
}

// Runs plots.gp in `dir`, where its images go.
Status run_gnuplot(const std::string& dir) {
  const std::string program = "gnuplot", option = "-e", change_dir = "cd " + quoted(dir), script = "plots.gp";
  char* argv[] = {const_cast<char*>(program.c_str()), const_cast<char*>(option.c_str()),
                  const_cast<char*>(change_dir.c_str()), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  if (posix_spawnp(&pid, program.c_str(), nullptr, nullptr, argv, environ) != 0) {
    return error("cannot start gnuplot (install gnuplot-nox, or pass --no-plots)");
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return error("gnuplot failed on ", dir, "/plots.gp (its messages are above)");
  }
  return Status::ok();
}

}  // namespace

Status write_plots(const EvalResults& results, const std::vector<std::string>& specs, const std::string& out_dir) {
  std::vector<Figure> figures;
  int panels = 0;
  const std::string heatmaps = passkey_heatmaps(results, specs, panels);
  if (panels > 0) {
    const int columns = 2, rows = (panels + 1) / 2;
    figures.push_back({"passkey.png", 1000, 320 * rows,
                       "set multiplot layout " + std::to_string(rows) + "," + std::to_string(columns) +
                                          "\nset xlabel 'depth (%)'\nset ylabel 'length (tokens)'\nset cbrange [0:1]\n"
                                          "set palette defined (0 '#b2182b', 0.5 '#f7f7f7', 1 '#2166ac')\n" +
                                          heatmaps + "unset multiplot\n"});
  }
  std::string kvret;
  for (const char* placement : {"after", "before"}) {
    const std::string lines = lines_by_key(results, specs, "kvret", "accuracy", false, placement);
    if (!lines.empty()) kvret += "set title 'question " + std::string(placement) + "'\n" + lines;
  }
  if (!kvret.empty()) {
    figures.push_back({"kvret.png", 1000, 420, "set multiplot layout 1,2\nset xlabel "
                                    "'length (tokens)'\nset ylabel 'accuracy'\nset yrange [0:1.05]\nset key bottom left\n" +
                                        kvret + "unset multiplot\n"});
  }
  const std::string fidelity = lines_by_key(results, specs, "fidelity", "rel_l2", true, "");
  if (!fidelity.empty()) {
    figures.push_back({"fidelity.png", 800, 500, "set title 'attention output error against "
                                       "the reference'\nset xlabel 'layer'\nset ylabel 'relative L2 error'\nset logscale "
                                       "y\nset key outside right\n" +
                                           fidelity});
  }
  const std::string points = tradeoff(results, specs);
  if (!points.empty()) {
    figures.push_back({"tradeoff.png", 800, 500, "set title 'KV memory against quality'\n" + points});
  }
  if (figures.empty()) return Status::ok();

  std::string script = "# Drawn by slimkv eval; run `gnuplot plots.gp` in this folder to redraw.\nset encoding utf8\n";
  for (const Figure& figure : figures) {  // each from a clean state: reset
    script += str_cat("\nreset\nset terminal pngcairo size ", figure.width, ",", figure.height,
                      "\nset termoption noenhanced\nset output ", quoted(figure.file), "\n", figure.commands,
                      "unset output\n");
  }
  SLIMKV_RETURN_IF_ERROR(write_file_atomically(out_dir + "/plots.gp", {std::span(reinterpret_cast<const uint8_t*>(script.data()), script.size())}));
  return run_gnuplot(out_dir);
}

}  // namespace slimkv
