// WeightStore: single-file and sharded model directories built in a temp dir, and every way the
// index and the shards can disagree.
#include "model/weight_store.h"
#include "util/mapped_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace slimkv {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class ModelDir {
 public:
  ModelDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("slimkv_ws_") + test->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ModelDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
  }

 private:
  std::filesystem::path path_;
};

std::vector<uint8_t> float_bytes(size_t count, float start) {
  std::vector<uint8_t> bytes(count * 4);
  for (size_t i = 0; i < count; ++i) {
    const float value = start + float(i);
    std::memcpy(bytes.data() + 4 * i, &value, 4);
  }
  return bytes;
}

struct Tensors {
  std::vector<uint8_t> embed = float_bytes(4 * 8, 0);  // [4, 8]
  std::vector<uint8_t> q = float_bytes(8 * 8, 100);    // [8, 8]
  std::vector<uint8_t> norm = float_bytes(8, 1000);    // [8]
  std::vector<TensorToWrite> shard1() const {
    return {{"model.embed_tokens.weight", DType::kF32, {4, 8}, embed},
            {"model.layers.0.self_attn.q_proj.weight", DType::kF32, {8, 8}, q}};
  }
  std::vector<TensorToWrite> shard2() const {
    return {{"model.norm.weight", DType::kF32, {8}, norm}};
  }
  std::vector<TensorToWrite> all() const {
    auto list = shard1();
    for (auto& t : shard2()) list.push_back(t);
    return list;
  }
};

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

const char* kIndex = R"({"metadata": {"total_size": 416}, "weight_map": {
  "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
  "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
  "model.norm.weight": "model-00002-of-00002.safetensors"}})";

void write_sharded(const ModelDir& dir, const Tensors& tensors) {
  ASSERT_TRUE(write_safetensors(dir.file(kShard1), tensors.shard1()).is_ok());
  ASSERT_TRUE(write_safetensors(dir.file(kShard2), tensors.shard2()).is_ok());
  dir.write_text("model.safetensors.index.json", kIndex);
}

// --- single file --------------------------------------------------------------------------------

TEST(WeightStore, SingleFile) {
  ModelDir dir;
  Tensors tensors;
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), tensors.all()).is_ok());
  auto store = WeightStore::open(dir.path());
  ASSERT_TRUE(store.has_value()) << store.status().message();
  EXPECT_FALSE(store->is_sharded());
  EXPECT_EQ(store->size(), 3u);
  EXPECT_EQ(store->total_bytes(), (32u + 64u + 8u) * 4u);
  EXPECT_EQ(store->names(), (std::vector<std::string>{"model.embed_tokens.weight",
                                                      "model.layers.0.self_attn.q_proj.weight",
                                                      "model.norm.weight"}));
  EXPECT_TRUE(store->contains("model.norm.weight"));
  EXPECT_FALSE(store->contains("lm_head.weight"));

  auto norm = store->get("model.norm.weight", {8});
  ASSERT_TRUE(norm.has_value()) << norm.status().message();
  EXPECT_EQ(reinterpret_cast<const float*>(norm->data)[3], 1003.0f);
  EXPECT_EQ(norm->file, dir.file("model.safetensors"));

  // Data stays valid when the store moves.
  WeightStore moved = store.take();
  auto q = moved.get("model.layers.0.self_attn.q_proj.weight", {8, 8});
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(reinterpret_cast<const float*>(q->data)[63], 163.0f);
}

TEST(WeightStore, GetChecksShapeAndNamesEverything) {
  ModelDir dir;
  Tensors tensors;
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), tensors.all()).is_ok());
  auto store = WeightStore::open(dir.path());
  ASSERT_TRUE(store.has_value()) << store.status().message();

  auto wrong = store->get("model.embed_tokens.weight", {4, 16});
  ASSERT_FALSE(wrong.has_value());
  EXPECT_THAT(wrong.status().message(), AllOf(HasSubstr("model.embed_tokens.weight"),
                                              HasSubstr(dir.file("model.safetensors")),
                                              HasSubstr("[4, 8]"), HasSubstr("expected [4, 16]")));

  auto transposed = store->get("model.embed_tokens.weight", {8, 4});
  EXPECT_THAT(transposed.status().message(), HasSubstr("transposed"));

  auto missing = store->get("model.layers.0.self_attn.k_proj.weight", {8, 8});
  ASSERT_FALSE(missing.has_value());
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("model.layers.0.self_attn.k_proj.weight"), HasSubstr("not found"),
                    HasSubstr(dir.path()), HasSubstr("model.layers.0.self_attn.q_proj.weight")));
}

TEST(WeightStore, GetRefusesUnsupportedDType) {
  ModelDir dir;
  // Hand-made file with an I8 tensor (the writer only writes what we compute with).
  std::string header =
      R"({"model.layers.0.mlp.qweight": {"dtype": "I8", "shape": [8], "data_offsets": [0, 8]}})";
  while ((8 + header.size()) % 8) header.push_back(' ');
  std::ofstream out(dir.file("model.safetensors"), std::ios::binary);
  const uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << std::string(8, '\x01');
  out.close();

  auto store = WeightStore::open(dir.path());
  ASSERT_TRUE(store.has_value()) << store.status().message();
  EXPECT_TRUE(store->contains("model.layers.0.mlp.qweight"));
  auto tensor = store->get("model.layers.0.mlp.qweight", {8});
  ASSERT_FALSE(tensor.has_value());
  EXPECT_THAT(tensor.status().message(), AllOf(HasSubstr("model.layers.0.mlp.qweight"),
                                               HasSubstr("I8"), HasSubstr("model.safetensors")));
}

TEST(WeightStore, CorruptFileErrorNamesFileAndTensor) {
  ModelDir dir;
  Tensors tensors;
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), tensors.all()).is_ok());
  std::filesystem::resize_file(dir.file("model.safetensors"),
                               std::filesystem::file_size(dir.file("model.safetensors")) - 4);
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr(dir.file("model.safetensors")), HasSubstr("tensor '")));
}

// --- what a directory may lack ------------------------------------------------------------------

TEST(WeightStore, MissingWeightsExplained) {
  ModelDir dir;
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr(dir.path()), HasSubstr("model.safetensors"),
                                              HasSubstr("model.safetensors.index.json")));

  dir.write_text("pytorch_model.bin", "x");
  EXPECT_THAT(WeightStore::open(dir.path()).status().message(), HasSubstr("convert"));

  Tensors tensors;
  ASSERT_TRUE(write_safetensors(dir.file(kShard1), tensors.shard1()).is_ok());
  EXPECT_THAT(WeightStore::open(dir.path()).status().message(),
              AllOf(HasSubstr(kShard1), HasSubstr("index")));

  EXPECT_THAT(WeightStore::open(dir.file("no_such_dir")).status().message(),
              AllOf(HasSubstr("no_such_dir"), HasSubstr("not a directory")));
}

// --- sharded
// --------------------------------------------------------------------------------------

TEST(WeightStore, Sharded) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  auto store = WeightStore::open(dir.path() + "/");
  ASSERT_TRUE(store.has_value()) << store.status().message();
  EXPECT_TRUE(store->is_sharded());
  EXPECT_EQ(store->size(), 3u);
  auto norm = store->get("model.norm.weight", {8});
  ASSERT_TRUE(norm.has_value()) << norm.status().message();
  EXPECT_THAT(norm->file, HasSubstr(kShard2));
  EXPECT_EQ(reinterpret_cast<const float*>(norm->data)[7], 1007.0f);
  auto embed = store->get("model.embed_tokens.weight", {4, 8});
  ASSERT_TRUE(embed.has_value());
  EXPECT_THAT(embed->file, HasSubstr(kShard1));
}

TEST(WeightStore, IndexWinsOverSingleFile) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), tensors.shard2()).is_ok());
  auto store = WeightStore::open(dir.path());
  ASSERT_TRUE(store.has_value()) << store.status().message();
  EXPECT_TRUE(store->is_sharded());
  EXPECT_EQ(store->size(), 3u);
}

TEST(WeightStore, BadIndexFiles) {
  struct Case {
    std::string index;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"{\"weight_map\": ", {"model.safetensors.index.json", "not valid JSON"}},
      {"[]", {"model.safetensors.index.json", "array"}},
      {"{\"metadata\": {}}", {"model.safetensors.index.json", "no \"weight_map\""}},
      {"{\"weight_map\": []}", {"model.safetensors.index.json", "\"weight_map\"", "array"}},
      {"{\"weight_map\": {}}", {"model.safetensors.index.json", "empty"}},
      {R"({"weight_map": {"model.norm.weight": 2}})", {"'model.norm.weight'", "number"}},
      {R"({"weight_map": {"model.norm.weight": "../model-00002-of-00002.safetensors"}})",
       {"'model.norm.weight'", "not a plain file name"}},
      {R"({"weight_map": {"model.norm.weight": ""}})",
       {"'model.norm.weight'", "not a plain file name"}},
  };
  for (const Case& c : cases) {
    ModelDir dir;
    Tensors tensors;
    write_sharded(dir, tensors);
    dir.write_text("model.safetensors.index.json", c.index);
    auto store = WeightStore::open(dir.path());
    ASSERT_FALSE(store.has_value()) << c.index;
    for (const std::string& expected : c.expected) {
      EXPECT_THAT(store.status().message(), HasSubstr(expected)) << c.index;
    }
  }
}

TEST(WeightStore, MissingShardFile) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  std::filesystem::remove(dir.file(kShard2));
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr(kShard2), HasSubstr("model.norm.weight"),
                                              HasSubstr("does not exist")));
}

// Paths of the wrong kind are named for what they are, by the loaders too (not "missing shard" or
// "invalid JSON").
TEST(WeightStore, ShardOrIndexOfTheWrongKind) {
  {
    ModelDir dir;
    Tensors tensors;
    write_sharded(dir, tensors);
    std::filesystem::remove(dir.file(kShard2));
    std::filesystem::create_directory(dir.file(kShard2));
    auto store = WeightStore::open(dir.path());
    ASSERT_FALSE(store.has_value());
    EXPECT_THAT(store.status().message(), AllOf(HasSubstr(kShard2), HasSubstr("is a directory, expected a file")));
  }
  {
    ModelDir dir;
    Tensors tensors;
    write_sharded(dir, tensors);
    std::filesystem::remove(dir.file(kShard2));
    ASSERT_EQ(::mkfifo(dir.file(kShard2).c_str(), 0600), 0);
    auto store = WeightStore::open(dir.path());  // must not block on the FIFO
    ASSERT_FALSE(store.has_value());
    EXPECT_THAT(store.status().message(), HasSubstr("is a FIFO (named pipe), expected a regular file"));
  }
  {
    ModelDir dir;
    std::filesystem::create_directory(dir.file("model.safetensors.index.json"));
    auto store = WeightStore::open(dir.path());
    ASSERT_FALSE(store.has_value());
    EXPECT_THAT(store.status().message(),
                AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("is a directory, expected a file")));
  }
  {
    ModelDir dir;
    dir.write_text("model.safetensors", "x");
    ::chmod(dir.file("model.safetensors").c_str(), 0);
    auto store = WeightStore::open(dir.path());
    ASSERT_FALSE(store.has_value());
    if (::geteuid() == 0) {
      std::printf("skipping the unreadable case: running as root, which reads a chmod 000 file\n");
    } else {
      EXPECT_THAT(store.status().message(), HasSubstr("not readable"));
    }
  }
}

TEST(ReadTextFile, NamesWhatThePathIs) {
  ModelDir dir;
  std::filesystem::create_directory(dir.file("sub"));
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0600), 0);
  dir.write_text("ok.txt", "hello");
  EXPECT_THAT(read_text_file(dir.file("sub")).status().message(), HasSubstr("sub: is a directory"));
  EXPECT_THAT(read_text_file(dir.file("pipe")).status().message(), HasSubstr("pipe: is a FIFO"));
  EXPECT_THAT(read_text_file(dir.file("none")).status().message(), HasSubstr("none: does not exist"));
  EXPECT_THAT(read_text_file(dir.file("ok.txt/x")).status().message(), HasSubstr("does not exist"));
  EXPECT_THAT(read_text_file("/dev/null").status().message(), HasSubstr("is a device"));
  EXPECT_THAT(read_text_file("").status().message(), HasSubstr("empty file path"));
  EXPECT_THAT(MappedFile::open(dir.file("sub")).status().message(), HasSubstr("sub: is a directory"));
  auto text = read_text_file(dir.file("ok.txt"));
  ASSERT_TRUE(text.has_value()) << text.status().message();
  EXPECT_EQ(*text, "hello");
}

TEST(WeightStore, TensorListedForShardThatLacksIt) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  // The index also lists a tensor nobody has.
  dir.write_text("model.safetensors.index.json", R"({"weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
    "lm_head.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors"}})");
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr("'lm_head.weight'"), HasSubstr(kShard1),
                                              HasSubstr("does not contain")));
}

TEST(WeightStore, TensorInWrongShard) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  dir.write_text("model.safetensors.index.json", R"({"weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00001-of-00002.safetensors"}})");
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(), HasSubstr("'model.norm.weight'"));
  EXPECT_THAT(store.status().message(), HasSubstr(kShard1));
}

TEST(WeightStore, TensorNotInIndex) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  dir.write_text("model.safetensors.index.json", R"({"weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors"}})");
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr("'model.layers.0.self_attn.q_proj.weight'"),
                                              HasSubstr(kShard1), HasSubstr("does not list")));
}

TEST(WeightStore, TensorInTwoShards) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  auto second = tensors.shard2();
  second.push_back({"model.embed_tokens.weight", DType::kF32, {4, 8}, tensors.embed});
  ASSERT_TRUE(write_safetensors(dir.file(kShard2), second).is_ok());
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr("'model.embed_tokens.weight'"), HasSubstr("two shards"),
                    HasSubstr(kShard1), HasSubstr(kShard2)));
}

TEST(WeightStore, CorruptShardNamesIt) {
  ModelDir dir;
  Tensors tensors;
  write_sharded(dir, tensors);
  std::ofstream(dir.file(kShard2), std::ios::binary) << "garbage";
  auto store = WeightStore::open(dir.path());
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr(kShard2), HasSubstr("shorter")));
}

}  // namespace
}  // namespace slimkv
