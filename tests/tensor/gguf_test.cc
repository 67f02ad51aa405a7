// GGUF parsing: files built byte by byte here (every value type, nested arrays, tensors of each
// supported type), then every way a header can be malformed, each refused with a message naming
// the field and what was expected.
#include "tensor/gguf.h"
#include "source_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace slimkv {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A GGUF file under construction: header fields appended in order.
class Builder {
 public:
  template <typename T>
  Builder& raw(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& str(const std::string& s) {
    raw<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Builder& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    return raw<uint32_t>(0x46554747).raw<uint32_t>(version).raw<uint64_t>(tensors).raw<uint64_t>(kvs);
  }
  Builder& key(const std::string& name, GgufValueType type) { return str(name).raw<uint32_t>(uint32_t(type)); }
  Builder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).raw<uint32_t>(uint32_t(ne.size()));
    for (uint64_t n : ne) raw<uint64_t>(n);
    return raw<uint32_t>(type).raw<uint64_t>(offset);
  }
  Builder& pad_to(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }
  Builder& data(size_t count, uint8_t value = 0) {
    bytes.insert(bytes.end(), count, value);
    return *this;
  }
  Expected<GgufContents> parse() const { return parse_gguf(bytes.data(), bytes.size(), "t.gguf"); }

  std::vector<uint8_t> bytes;
};

TEST(Gguf, ReadsEveryValueTypeAndTensors) {
  Builder b;
  b.header(/*tensors=*/3, /*kvs=*/14);
  b.key("u8", GgufValueType::kUint8).raw<uint8_t>(200);
  b.key("i8", GgufValueType::kInt8).raw<int8_t>(-5);
  b.key("u16", GgufValueType::kUint16).raw<uint16_t>(60000);
  b.key("i16", GgufValueType::kInt16).raw<int16_t>(-30000);
  b.key("u32", GgufValueType::kUint32).raw<uint32_t>(4000000000u);
  b.key("i32", GgufValueType::kInt32).raw<int32_t>(-7);
  b.key("f32", GgufValueType::kFloat32).raw<float>(1.5f);
  b.key("bool", GgufValueType::kBool).raw<uint8_t>(1);
  b.key("str", GgufValueType::kString).str("héllo");
  b.key("u64", GgufValueType::kUint64).raw<uint64_t>(1ull << 40);
  b.key("i64", GgufValueType::kInt64).raw<int64_t>(-(1ll << 40));
  b.key("f64", GgufValueType::kFloat64).raw<double>(0.25);
  b.key("strings", GgufValueType::kArray).raw<uint32_t>(uint32_t(GgufValueType::kString)).raw<uint64_t>(2).str("a").str("b c");
  b.key("nested", GgufValueType::kArray).raw<uint32_t>(uint32_t(GgufValueType::kArray)).raw<uint64_t>(1);
  b.raw<uint32_t>(uint32_t(GgufValueType::kInt32)).raw<uint64_t>(2).raw<int32_t>(3).raw<int32_t>(-4);
  b.tensor("w", {64, 3}, kGgmlQ8_0, 0);     // 3 rows of 2 blocks of 34 bytes = 204
  b.tensor("norm", {64}, kGgmlF32, 224);    // 256 bytes
  b.tensor("k", {256, 1}, kGgmlQ4_K, 480);  // one block of 144
  b.pad_to(32).data(480 + 144, 7);
  auto parsed = b.parse();
  ASSERT_TRUE(parsed.has_value()) << parsed.status().message();
  const auto& m = parsed->metadata;
  EXPECT_EQ(parsed->version, 3u);
  EXPECT_EQ(m.at("u8").integer, 200);
  EXPECT_EQ(m.at("i8").integer, -5);
  EXPECT_EQ(m.at("u16").integer, 60000);
  EXPECT_EQ(m.at("i16").integer, -30000);
  EXPECT_EQ(m.at("u32").integer, 4000000000ll);
  EXPECT_EQ(m.at("i32").integer, -7);
  EXPECT_EQ(m.at("f32").real, 1.5);
  EXPECT_EQ(m.at("bool").integer, 1);
  EXPECT_EQ(m.at("str").text, "héllo");
  EXPECT_EQ(m.at("u64").integer, 1ll << 40);
  EXPECT_EQ(m.at("i64").integer, -(1ll << 40));
  EXPECT_EQ(m.at("f64").real, 0.25);
  EXPECT_EQ(m.at("strings").texts, (std::vector<std::string>{"a", "b c"}));
  ASSERT_EQ(m.at("nested").arrays.size(), 1u);
  EXPECT_EQ(m.at("nested").arrays[0].integers, (std::vector<int64_t>{3, -4}));
  ASSERT_EQ(parsed->tensors.size(), 3u);
  EXPECT_EQ(parsed->tensors[0].shape, (std::vector<int64_t>{3, 64}));  // outermost first
  EXPECT_EQ(parsed->tensors[0].size_bytes, 204u);
  EXPECT_EQ(parsed->tensors[1].size_bytes, 256u);
  EXPECT_EQ(parsed->tensors[2].size_bytes, 144u);
  EXPECT_EQ(parsed->tensors[2].data - b.bytes.data(), std::ptrdiff_t(parsed->data_offset + 480));
  EXPECT_EQ(parsed->data_offset % 32, 0u);
}

TEST(Gguf, FileLookupsNameTheKeyAndType) {
  const std::string path = ::testing::TempDir() + "/lookups.gguf";
  Builder b;
  b.header(0, 2).key("general.architecture", GgufValueType::kString).str("llama");
  b.key("ids", GgufValueType::kArray).raw<uint32_t>(uint32_t(GgufValueType::kInt32)).raw<uint64_t>(1).raw<int32_t>(9);
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(b.bytes.data(), 1, b.bytes.size(), f);
  std::fclose(f);
  EXPECT_TRUE(has_gguf_magic(path));
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().message();
  EXPECT_EQ(*file->get_string("general.architecture"), "llama");
  EXPECT_EQ(**file->get_ints("ids"), (std::vector<int64_t>{9}));
  EXPECT_THAT(file->get_int("general.architecture").status().message(),
              AllOf(HasSubstr("'general.architecture'"), HasSubstr("expected an integer, found string")));
  EXPECT_THAT(file->get_strings("ids").status().message(), HasSubstr("expected an array of strings, found array of i32"));
  EXPECT_THAT(file->get_real("missing").status().message(), HasSubstr("metadata 'missing' is missing"));
}

// Each malformed header, and the words its error must contain.
struct BadCase {
  const char* name;
  Builder file;
  std::vector<std::string> expected;
};

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> cases;
  const auto add = [&](const char* name, Builder b, std::vector<std::string> expected) {
    cases.push_back({name, std::move(b), std::move(expected)});
  };
  add("empty", Builder(), {"magic", "truncated"});
  add("bad magic", Builder().raw<uint32_t>(0x12345678).data(20), {"magic", "not a GGUF file"});
  add("version 1", Builder().header(0, 0, 1), {"version", "expected 3", "found 1"});
  add("huge kv count", Builder().header(0, 1ull << 60), {"metadata_kv_count", "cannot fit"});
  add("huge tensor count", Builder().header(1ull << 60, 0), {"tensor_count", "cannot fit"});
  add("truncated key", Builder().header(0, 1).raw<uint64_t>(1000).data(5), {"metadata key 0", "runs past the end"});
  add("unknown value type", Builder().header(0, 1).key("k", GgufValueType(99)), {"'k'", "value type 99"});
  add("bool 2", Builder().header(0, 1).key("k", GgufValueType::kBool).raw<uint8_t>(2), {"'k'", "expected 0 or 1"});
  add("huge array", Builder().header(0, 1).key("a", GgufValueType::kArray).raw<uint32_t>(5).raw<uint64_t>(1ull << 40),
      {"'a'", "cannot fit"});
  add("array of unknown", Builder().header(0, 1).key("a", GgufValueType::kArray).raw<uint32_t>(77).raw<uint64_t>(1),
      {"'a'", "element type 77"});
  add("u64 too large", Builder().header(0, 1).key("k", GgufValueType::kUint64).raw<uint64_t>(~0ull), {"'k'", "2^63"});
  add("duplicate key",
      Builder().header(0, 2).key("k", GgufValueType::kUint8).raw<uint8_t>(1).key("k", GgufValueType::kUint8).raw<uint8_t>(2),
      {"'k'", "twice"});
  add("alignment not a power of two",
      Builder().header(0, 1).key("general.alignment", GgufValueType::kUint32).raw<uint32_t>(24),
      {"general.alignment", "power of two"});
  add("alignment wrong type", Builder().header(0, 1).key("general.alignment", GgufValueType::kUint64).raw<uint64_t>(32),
      {"general.alignment", "u32"});
  add("zero dims", Builder().header(1, 0).tensor("t", {}, kGgmlF32, 0), {"'t'", "n_dims is 0"});
  add("five dims", Builder().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, kGgmlF32, 0), {"'t'", "n_dims is 5"});
  add("zero dim", Builder().header(1, 0).tensor("t", {4, 0}, kGgmlF32, 0).pad_to(32).data(16), {"'t'", "ne[1] = 0"});
  add("overflowing dims", Builder().header(1, 0).tensor("t", {1ull << 40, 1ull << 40}, kGgmlF32, 0), {"'t'", "overflows"});
  add("unknown type", Builder().header(1, 0).tensor("t", {4}, 99, 0), {"'t'", "ggml type 99"});
  add("partial block", Builder().header(1, 0).tensor("t", {48}, kGgmlQ8_0, 0).pad_to(32).data(64),
      {"'t'", "Q8_0", "not a multiple"});
  add("misaligned offset", Builder().header(1, 0).tensor("t", {4}, kGgmlF32, 8).pad_to(32).data(64),
      {"'t'", "offset 8", "alignment 32"});
  add("past the end", Builder().header(1, 0).tensor("t", {64}, kGgmlF32, 0).pad_to(32).data(100),
      {"'t'", "runs past", "truncated"});
  add("overlap",
      Builder().header(2, 0).tensor("a", {16}, kGgmlF32, 0).tensor("b", {16}, kGgmlF32, 32).pad_to(32).data(128),
      {"'b'", "overlaps", "'a'"});
  add("duplicate tensor",
      Builder().header(2, 0).tensor("a", {8}, kGgmlF32, 0).tensor("a", {8}, kGgmlF32, 32).pad_to(32).data(64),
      {"'a'", "twice"});
  add("data region past the end", Builder().header(1, 0).tensor("t", {8}, kGgmlF32, 0), {"data region", "past the end"});
  return cases;
}

TEST(Gguf, RefusesMalformedFilesNamingTheField) {
  for (const BadCase& c : bad_cases()) {
    auto parsed = c.file.parse();
    ASSERT_FALSE(parsed.has_value()) << c.name;
    const std::string message = parsed.status().message();
    EXPECT_THAT(message, HasSubstr("t.gguf")) << c.name;
    for (const std::string& word : c.expected) EXPECT_THAT(message, HasSubstr(word)) << c.name;
  }
}

TEST(Gguf, EveryTruncationOfAValidFileIsRefused) {
  Builder b;
  b.header(1, 1).key("name", GgufValueType::kString).str("x").tensor("t", {32}, kGgmlQ4_0, 0).pad_to(32).data(18);
  ASSERT_TRUE(b.parse().has_value());
  for (size_t size = 0; size < b.bytes.size(); ++size) {
    auto parsed = parse_gguf(b.bytes.data(), size, "t.gguf");
    EXPECT_FALSE(parsed.has_value()) << "truncated to " << size;
  }
}

// blocks.gguf (scripts/gguf/make_fixtures.py): random blocks of each quantized type beside gguf-py's
// own numpy dequantization of them, an independent reading of the block layouts.
TEST(GgufBlocks, ReferenceDequantizationMatchesGgufPy) {
  auto file = GgufFile::open(slimkv::test::source_dir() + "/tests/data/gguf/blocks.gguf");
  ASSERT_TRUE(file.has_value()) << file.status().message();
  const std::vector<std::pair<std::string, BlockQuant>> types = {
      {"Q8_0", BlockQuant::kQ8_0}, {"Q4_0", BlockQuant::kQ4_0}, {"Q4_K", BlockQuant::kQ4_K}, {"Q6_K", BlockQuant::kQ6_K}};
  for (const auto& [name, quant] : types) {
    const GgufTensor* blocks = nullptr;
    const GgufTensor* expected = nullptr;
    for (const GgufTensor& t : file->tensors()) {
      if (t.name == name) blocks = &t;
      if (t.name == name + ".f32") expected = &t;
    }
    ASSERT_TRUE(blocks && expected) << name;
    ASSERT_EQ(blocks->num_elements(), expected->num_elements());
    std::vector<float> values(static_cast<size_t>(blocks->num_elements()));
    dequantize_reference(quant, blocks->data, values.data(), blocks->num_elements());
    const auto* want = reinterpret_cast<const float*>(expected->data);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(values[i], want[i], 1e-6f * (1.0f + std::fabs(want[i]))) << name << " value " << i;
    }
  }
}

}  // namespace
}  // namespace slimkv
