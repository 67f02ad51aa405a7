// Where the tests find the repository's data (models/slimkv-llama-15m, tests/data, fuzz/corpus) at run
// time. A test binary may run far from the tree it was built in: the GPU host gets a copy of the working
// tree at another path, and a binary copied elsewhere keeps only the path compiled into it. So the root
// is, in order: $SLIMKV_SOURCE_DIR (taken as given; a message if it lacks the data); the first holding both
// models/slimkv-llama-15m and tests/data walking up from the current directory, then from the
// executable's directory (/proc/self/exe); the compiled-in SLIMKV_SOURCE_DIR if it holds them. When
// none does, a message on stderr says where it looked, and the compiled-in path is used, so that each
// test needing data fails naming the file it could not open.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace slimkv::test {

// Whether `dir` is a slimkv checkout with its data.
inline bool holds_source_data(const std::filesystem::path& dir) {
  std::error_code error;
  return std::filesystem::is_directory(dir / "models/slimkv-llama-15m", error) &&
         std::filesystem::is_directory(dir / "tests/data", error);
}

// `start` and each directory above it, the first holding the data; empty when none does.
inline std::filesystem::path find_source_data_above(const std::filesystem::path& start) {
  for (std::filesystem::path dir = start; !dir.empty(); dir = dir.parent_path()) {
    if (holds_source_data(dir)) return dir;
    if (dir == dir.parent_path()) break;  // the root: its parent is itself
  }
  return {};
}

// The search above, given its inputs (an empty env or start is skipped), so that a test can drive it.
struct SourceDirSearch {
  std::string env{};                      // $SLIMKV_SOURCE_DIR
  std::filesystem::path current_dir{};    // where the test runs
  std::filesystem::path executable_dir{}; // where the test binary lies
  std::filesystem::path compiled_in{};    // SLIMKV_SOURCE_DIR at build time
};
struct SourceDirFound {
  std::filesystem::path dir{};
  std::string error{};  // empty when found; else where it looked
};
inline SourceDirFound find_source_dir(const SourceDirSearch& search) {
  if (!search.env.empty()) {
    if (holds_source_data(search.env)) return {search.env, ""};
    return {search.env, "slimkv tests: SLIMKV_SOURCE_DIR=" + search.env + " holds no models/slimkv-llama-15m and tests/data"};
  }
  for (const std::filesystem::path& start : {search.current_dir, search.executable_dir}) {
    if (start.empty()) continue;
    if (std::filesystem::path found = find_source_data_above(start); !found.empty()) return {found, ""};
  }
  if (holds_source_data(search.compiled_in)) return {search.compiled_in, ""};
  return {search.compiled_in,
          "slimkv tests: no directory holding models/slimkv-llama-15m and tests/data in or above the current "
          "directory (" + search.current_dir.string() + ") or the executable's (" + search.executable_dir.string() +
              "), nor at the build's source directory (" + search.compiled_in.string() +
              "); set SLIMKV_SOURCE_DIR to the repository's root"};
}

// The repository root for this process (searched once).
inline const std::string& source_dir() {
  static const std::string dir = [] {
    SourceDirSearch search{.compiled_in = SLIMKV_SOURCE_DIR};
    if (const char* env = std::getenv("SLIMKV_SOURCE_DIR")) search.env = env;
    std::error_code error;
    search.current_dir = std::filesystem::current_path(error);
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
    if (!error) search.executable_dir = exe.parent_path();
    SourceDirFound found = find_source_dir(search);
    if (!found.error.empty()) std::fprintf(stderr, "%s\n", found.error.c_str());
    return found.dir.string();
  }();
  return dir;
}

}  // namespace slimkv::test
