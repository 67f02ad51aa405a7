// tests/source_dir.h: the tests find the repository's data from wherever their binary runs.
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "source_dir.h"

namespace slimkv::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory tree under /tmp: `checkout` holds the data a source tree holds, `elsewhere` does not.
class SourceDirTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("slimkv_source_dir_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(checkout() / "models/slimkv-llama-15m");
    fs::create_directories(checkout() / "tests/data");
    fs::create_directories(checkout() / "build/release/python");
    fs::create_directories(elsewhere() / "bin");
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path checkout() const { return root_ / "checkout"; }
  fs::path elsewhere() const { return root_ / "elsewhere"; }

 private:
  fs::path root_;
};

TEST_F(SourceDirTree, TheEnvironmentWins) {
  const SourceDirFound found =
      find_source_dir({.env = checkout().string(), .current_dir = elsewhere(), .compiled_in = "/nonexistent"});
  EXPECT_EQ(found.dir, checkout());
  EXPECT_EQ(found.error, "");
}

TEST_F(SourceDirTree, AnEnvironmentWithoutTheDataIsNamed) {
  const SourceDirFound found = find_source_dir({.env = elsewhere().string(), .current_dir = checkout()});
  EXPECT_EQ(found.dir, elsewhere());
  EXPECT_THAT(found.error, HasSubstr("SLIMKV_SOURCE_DIR=" + elsewhere().string() + " holds no models/slimkv-llama-15m"));
}

TEST_F(SourceDirTree, WalksUpFromTheCurrentDirectory) {
  const SourceDirFound found = find_source_dir(
      {.current_dir = checkout() / "build/release/python", .executable_dir = elsewhere() / "bin", .compiled_in = "/nonexistent"});
  EXPECT_EQ(found.dir, checkout());
}

TEST_F(SourceDirTree, WalksUpFromTheExecutableWhenTheCurrentDirectoryHasNoData) {
  const SourceDirFound found = find_source_dir(
      {.current_dir = elsewhere(), .executable_dir = checkout() / "build/release", .compiled_in = "/nonexistent"});
  EXPECT_EQ(found.dir, checkout());
}

TEST_F(SourceDirTree, FallsBackToTheCompiledInPath) {
  const SourceDirFound found =
      find_source_dir({.current_dir = elsewhere(), .executable_dir = elsewhere() / "bin", .compiled_in = checkout()});
  EXPECT_EQ(found.dir, checkout());
  EXPECT_EQ(found.error, "");
}

TEST_F(SourceDirTree, NothingFoundNamesWhereItLooked) {
  const SourceDirFound found =
      find_source_dir({.current_dir = elsewhere(), .executable_dir = elsewhere() / "bin", .compiled_in = "/nonexistent"});
  EXPECT_EQ(found.dir, fs::path("/nonexistent"));
  EXPECT_THAT(found.error, HasSubstr("(" + elsewhere().string() + ")"));
  EXPECT_THAT(found.error, HasSubstr("(" + (elsewhere() / "bin").string() + ")"));
  EXPECT_THAT(found.error, HasSubstr("(/nonexistent)"));
  EXPECT_THAT(found.error, HasSubstr("set SLIMKV_SOURCE_DIR"));
}

// This binary, run by ctest from its build folder, finds the tree it was built from.
TEST(SourceDir, ThisProcessFindsTheBundledModel) {
  EXPECT_TRUE(fs::exists(fs::path(source_dir()) / "models/slimkv-llama-15m/config.json")) << source_dir();
}

}  // namespace
}  // namespace slimkv::test
