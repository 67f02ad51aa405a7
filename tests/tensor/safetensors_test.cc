// safetensors parsing, writing and validation: a round trip through the writer, then every way a
// file can be corrupt, each expected to fail with a message naming the file (and the tensor).
#include "tensor/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "util/half.h"

namespace slimkv {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// --- helpers ----------------------------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("slimkv_st_") + test->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// A safetensors blob from a literal header and data region; the header is padded to 8 bytes.
std::vector<uint8_t> make_blob(std::string header, const std::vector<uint8_t>& data = {}) {
  while ((8 + header.size()) % 8) header.push_back(' ');
  std::vector<uint8_t> blob;
  blob.reserve(8 + header.size() + data.size());  // (also keeps GCC 12's -Warray-bounds false positive away)
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) blob.push_back(uint8_t(length >> (8 * i)));
  blob.insert(blob.end(), header.begin(), header.end());
  blob.insert(blob.end(), data.begin(), data.end());
  return blob;
}

Status parse_blob(const std::vector<uint8_t>& blob, size_t size) {
  return parse_safetensors(blob.data(), size, "bad.safetensors").status();
}
Status parse_blob(const std::vector<uint8_t>& blob) { return parse_blob(blob, blob.size()); }

// A small valid file's tensors (odd-length BF16 to exercise layout).
struct SampleTensors {
  std::vector<float> weight = {1, 2, 3, 4, 5, 6};  // [2, 3] F32
  std::vector<uint16_t> norm;                      // [5] BF16
  std::vector<uint16_t> half;                      // [1, 3] F16
  std::vector<uint8_t> weight_bytes, norm_bytes, half_bytes;
  SampleTensors() {
    for (int i = 0; i < 5; ++i) norm.push_back(float_to_bf16(0.5f * float(i)));
    for (int i = 0; i < 3; ++i) half.push_back(float_to_fp16(-1.0f * float(i)));
    weight_bytes = to_bytes(weight);
    norm_bytes = to_bytes(norm);
    half_bytes = to_bytes(half);
  }
  std::vector<TensorToWrite> list() const {
    return {{"model.norm.weight", DType::kBF16, {5}, norm_bytes},
            {"model.layers.0.weight", DType::kF32, {2, 3}, weight_bytes},
            {"empty", DType::kF32, {0, 4}, {}},
            {"half", DType::kF16, {1, 3}, half_bytes}};
  }
};

// --- round trip -------------------------------------------------------------------------------

TEST(Safetensors, RoundTripThroughWriter) {
  TempDir dir;
  SampleTensors sample;
  const std::string path = dir.file("model.safetensors");
  ASSERT_TRUE(write_safetensors(path, sample.list(), {{"format", "pt"}}).is_ok());

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().message();
  EXPECT_EQ(file->tensors().size(), 4u);
  EXPECT_EQ(file->metadata().at("format"), "pt");

  const TensorInfo* weight = file->find("model.layers.0.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->dtype, DType::kF32);
  EXPECT_EQ(weight->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(weight->num_elements(), 6);
  EXPECT_EQ(weight->size_bytes, 24u);
  EXPECT_EQ(weight->file, path);
  EXPECT_EQ(0, std::memcmp(weight->data, sample.weight_bytes.data(), 24));
  EXPECT_EQ(weight->owned_copy, nullptr) << "writer output must be aligned in place";

  const TensorInfo* norm = file->find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kBF16);
  EXPECT_EQ(0, std::memcmp(norm->data, sample.norm_bytes.data(), 10));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(norm->data) % 2, 0u);

  const TensorInfo* half = file->find("half");
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->dtype, DType::kF16);
  EXPECT_EQ(fp16_to_float(reinterpret_cast<const uint16_t*>(half->data)[2]), -2.0f);

  const TensorInfo* empty = file->find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->num_elements(), 0);
  EXPECT_EQ(empty->size_bytes, 0u);
  EXPECT_NE(empty->data, nullptr);

  EXPECT_EQ(file->find("nope"), nullptr);
}

TEST(Safetensors, WriterAlignsDataAndPacksWithoutGaps) {
  TempDir dir;
  SampleTensors sample;
  const std::string path = dir.file("a.safetensors");
  ASSERT_TRUE(write_safetensors(path, sample.list()).is_ok());
  const std::vector<uint8_t> bytes = read_bytes(path);
  auto contents = parse_safetensors_contents(bytes.data(), bytes.size(), path);
  ASSERT_TRUE(contents.has_value()) << contents.status().message();
  EXPECT_EQ(contents->data_region_offset % 8, 0u);
  uint64_t end = 0;
  for (const TensorInfo& info : contents->tensors) {
    EXPECT_EQ(info.data_begin, end) << info.name;
    EXPECT_EQ(info.data_begin % info.element_size_bytes, 0u) << info.name;
    end = info.data_end;
  }
  EXPECT_EQ(contents->data_region_offset + end, bytes.size());
  EXPECT_TRUE(contents->metadata.empty());
}

TEST(Safetensors, ScalarAndNoTensors) {
  TempDir dir;
  const std::vector<uint8_t> one = to_bytes(std::vector<float>{3.5f});
  ASSERT_TRUE(
      write_safetensors(dir.file("s.safetensors"), {{"scale", DType::kF32, {}, one}}).is_ok());
  auto file = SafetensorsFile::open(dir.file("s.safetensors"));
  ASSERT_TRUE(file.has_value()) << file.status().message();
  EXPECT_EQ(file->find("scale")->num_elements(), 1);
  EXPECT_EQ(*reinterpret_cast<const float*>(file->find("scale")->data), 3.5f);

  ASSERT_TRUE(write_safetensors(dir.file("none.safetensors"), {}).is_ok());
  auto none = SafetensorsFile::open(dir.file("none.safetensors"));
  ASSERT_TRUE(none.has_value()) << none.status().message();
  EXPECT_TRUE(none->tensors().empty());
}

TEST(Safetensors, WriterRefusesBadInput) {
  TempDir dir;
  const std::vector<uint8_t> four = to_bytes(std::vector<float>{1, 2, 3, 4});
  const std::string path = dir.file("w.safetensors");
  Status status =
      write_safetensors(path, {{"a", DType::kF32, {4}, four}, {"a", DType::kF32, {4}, four}});
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'a'"), HasSubstr("twice")));
  status = write_safetensors(path, {{"a", DType::kF32, {5}, four}});
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'a'"), HasSubstr("16 bytes"), HasSubstr("20")));
  status = write_safetensors(path, {{"", DType::kF32, {4}, four}});
  EXPECT_THAT(status.message(), HasSubstr("empty name"));
  status = write_safetensors(path, {{"__metadata__", DType::kF32, {4}, four}});
  EXPECT_THAT(status.message(), HasSubstr("reserved"));
  status = write_safetensors(path, {{"a", DType::kF32, {-4}, four}});
  EXPECT_THAT(status.message(), HasSubstr("negative"));
  status = write_safetensors(path, {{"a", DType::kF32, {int64_t(1) << 62}, {}}});
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'a'"), HasSubstr("64 bits")));
  EXPECT_FALSE(std::filesystem::exists(path));
  status =
      write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", DType::kF32, {4}, four}});
  EXPECT_THAT(status.message(), HasSubstr("no/such/dir"));
}

// --- corruption ---------------------------------------------------------------------------------

TEST(Safetensors, EveryTruncationFailsNamingFileAndTensor) {
  TempDir dir;
  SampleTensors sample;
  const std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(write_safetensors(path, sample.list()).is_ok());
  const std::vector<uint8_t> bytes = read_bytes(path);
  auto full = parse_safetensors_contents(bytes.data(), bytes.size(), path);
  ASSERT_TRUE(full.has_value());

  for (size_t length = 0; length < bytes.size(); ++length) {
    // Copy so ASan catches any read past `length`.
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + length);
    const Status status = parse_safetensors(cut.data(), cut.size(), "t.safetensors").status();
    ASSERT_FALSE(status.is_ok()) << "length " << length;
    EXPECT_THAT(status.message(), HasSubstr("t.safetensors")) << "length " << length;
    if (length >= full->data_region_offset) {
      // The first tensor (by name) whose end is cut off.
      EXPECT_THAT(status.message(), AllOf(HasSubstr("tensor '"), HasSubstr("past the data region")))
          << "length " << length;
    }
  }
  // Through the file system too.
  for (size_t length : {size_t(0), size_t(7), size_t(8), size_t(40), bytes.size() - 1}) {
    write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + length));
    auto file = SafetensorsFile::open(path);
    ASSERT_FALSE(file.has_value()) << "length " << length;
    EXPECT_THAT(file.status().message(), HasSubstr(path));
  }
}

TEST(Safetensors, FlippedHeaderBytesNeverCrash) {
  TempDir dir;
  SampleTensors sample;
  const std::string path = dir.file("f.safetensors");
  ASSERT_TRUE(write_safetensors(path, sample.list()).is_ok());
  const std::vector<uint8_t> bytes = read_bytes(path);
  const uint32_t seed = 20240611;
  std::mt19937 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  auto header_end =
      parse_safetensors_contents(bytes.data(), bytes.size(), path)->data_region_offset;
  int failures = 0;
  for (size_t position = 0; position < header_end; ++position) {
    for (uint8_t flip : {uint8_t(0x01), uint8_t(0x20), uint8_t(0x80), uint8_t(rng() | 1)}) {
      std::vector<uint8_t> bad = bytes;
      bad[position] ^= flip;
      auto result = parse_safetensors(bad.data(), bad.size(), "f.safetensors");
      if (!result.has_value()) {
        ++failures;
        EXPECT_THAT(result.status().message(), HasSubstr("f.safetensors")) << "at " << position;
      } else {
        for (const TensorInfo& info : *result) {  // touch every byte: ASan checks the bounds
          volatile uint8_t sink = 0;
          for (size_t i = 0; i < info.size_bytes; ++i) sink = sink ^ info.data[i];
        }
      }
    }
  }
  EXPECT_GT(failures, 0);
}

TEST(Safetensors, ShortFileAndHeaderLength) {
  std::vector<uint8_t> blob = make_blob("{}");
  EXPECT_TRUE(parse_blob(blob).is_ok());
  EXPECT_THAT(parse_blob(blob, 5).message(),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("5 bytes"), HasSubstr("shorter")));
  EXPECT_THAT(parse_safetensors(nullptr, 0, "bad.safetensors").status().message(),
              HasSubstr("0 bytes"));

  std::vector<uint8_t> past = blob;
  past[0] = 200;  // header length 200 in a 16-byte file
  EXPECT_THAT(parse_blob(past).message(),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("header length 200"),
                    HasSubstr("past the end")));

  std::vector<uint8_t> absurd = blob;
  absurd[7] = 0x7f;  // ~9e18
  EXPECT_THAT(parse_blob(absurd).message(),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("limit")));
  std::vector<uint8_t> just_over = blob;
  const uint64_t over = kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) just_over[i] = uint8_t(over >> (8 * i));
  EXPECT_THAT(parse_blob(just_over).message(), HasSubstr("limit"));

  std::vector<uint8_t> zero(8, 0);
  EXPECT_THAT(parse_blob(zero).message(), HasSubstr("empty"));
}

TEST(Safetensors, HeaderNotJsonObject) {
  EXPECT_THAT(parse_blob(make_blob("{\"a\": ")).message(),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("not valid JSON")));
  EXPECT_THAT(
      parse_blob(make_blob("[1, 2]")).message(),
      AllOf(HasSubstr("bad.safetensors"), HasSubstr("array"), HasSubstr("expected an object")));
  EXPECT_THAT(parse_blob(make_blob("\"x\"")).message(), HasSubstr("string"));
  EXPECT_THAT(parse_blob(make_blob("{\"a\":\"\xff\xfe\"}")).message(), HasSubstr("not valid JSON"));
  std::vector<uint8_t> nul = make_blob("{}");
  nul[9] = 0;  // a NUL inside the header
  EXPECT_THAT(parse_blob(nul).message(), HasSubstr("not valid JSON"));
}

struct BadEntryCase {
  const char* header;
  std::vector<const char*> expected_substrings;
};

TEST(Safetensors, BadTensorEntriesNameTheTensor) {
  const std::vector<uint8_t> data(64, 0);
  const std::vector<BadEntryCase> cases = {
      {R"({"w": 3})", {"'w'", "number", "expected an object"}},
      {R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", {"'w'", "no \"dtype\""}},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", {"'w'", "no \"shape\""}},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", {"'w'", "no \"data_offsets\""}},
      {R"({"w": {"dtype": 32, "shape": [2], "data_offsets": [0, 8]}})",
       {"'w'", "\"dtype\"", "string"}},
      {R"({"w": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 8]}})",
       {"'w'", "unknown dtype \"Q4_K\"", "BF16"}},
      {R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})",
       {"'w'", "\"shape\"", "array"}},
      {R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",
       {"'w'", "shape[0]", "2.5"}},
      {R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})",
       {"'w'", "shape[1]", "negative"}},
      {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
       {"'w'", "64 bits"}},
      {R"({"w": {"dtype": "F32", "shape": [2305843009213693952], "data_offsets": [0, 8]}})",
       {"'w'", "9223372036854775808 bytes"}},
      {R"({"w": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 8]}})",
       {"'w'", "64 bits"}},
      {R"({"w": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 8]}})",
       {"'w'", "shape[0]"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", {"'w'", "[begin, end]"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})",
       {"'w'", "[begin, end]"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}})",
       {"'w'", "[begin, end]"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": {"a": 1}}})",
       {"'w'", "[begin, end]"}},
      {R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})",
       {"'w'", "begin after end"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [60, 68]}})",
       {"'w'", "past the data region", "64 bytes"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551615]}})",
       {"'w'", "past the data region"}},
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
       {"'w'", "8 bytes", "[3]", "12 bytes"}},
      {R"({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})",
       {"'w'", "16 bytes", "BF16", "8 bytes"}},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
       {"'w'", "overlap", "'a'"}},
      {R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
          "w": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}})",
       {"'w'", "overlap", "'a'"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
       {"'w'", "twice"}},
      {R"({"__metadata__": {"format": 1}})", {"__metadata__", "'format'", "expected a string"}},
      {R"({"__metadata__": ["pt"]})", {"__metadata__", "array"}},
  };
  for (const BadEntryCase& c : cases) {
    const Status status = parse_blob(make_blob(c.header, data));
    ASSERT_FALSE(status.is_ok()) << c.header;
    EXPECT_THAT(status.message(), HasSubstr("bad.safetensors")) << c.header;
    for (const char* expected : c.expected_substrings) {
      EXPECT_THAT(status.message(), HasSubstr(expected)) << c.header;
    }
  }
}

TEST(Safetensors, AcceptsEdgeCasesThatAreValid) {
  const std::vector<uint8_t> data(32, 0);
  // Identical offsets of empty tensors do not overlap anything; gaps are tolerated; metadata kept.
  const std::vector<uint8_t> blob = make_blob(R"({"__metadata__": {"format": "pt", "k": "v"},
                   "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "e1": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                   "e2": {"dtype": "BF16", "shape": [3, 0], "data_offsets": [4, 4]},
                   "b": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]}})",
                                              data);
  auto contents = parse_safetensors_contents(blob.data(), blob.size(), "ok.safetensors");
  ASSERT_TRUE(contents.has_value()) << contents.status().message();
  ASSERT_EQ(contents->tensors.size(), 4u);
  EXPECT_EQ(contents->tensors.front().name, "a");  // data order
  EXPECT_EQ(contents->tensors.back().name, "b");
  EXPECT_EQ(contents->metadata.at("k"), "v");
}

TEST(Safetensors, OtherDTypesAreListedButMarkedUnsupported) {
  const std::vector<uint8_t> data(16, 7);
  const std::vector<uint8_t> blob = make_blob(
      R"({"q": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]},
          "d": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]}})",
      data);
  auto tensors = parse_safetensors(blob.data(), blob.size(), "q.safetensors");
  ASSERT_TRUE(tensors.has_value()) << tensors.status().message();
  ASSERT_EQ(tensors->size(), 2u);
  EXPECT_EQ((*tensors)[0].stored_dtype, "I8");
  EXPECT_FALSE((*tensors)[0].dtype_supported);
  EXPECT_EQ((*tensors)[1].stored_dtype, "F64");
  EXPECT_EQ((*tensors)[1].element_size_bytes, 8u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*tensors)[1].data) % 8, 0u);
}

// An F32 tensor right after a 1-element F16 one starts 2 bytes past an alignment boundary: it must
// come back as an aligned copy with the same bytes (UBSan would flag float loads otherwise).
TEST(Safetensors, MisalignedTensorGetsAlignedCopy) {
  std::vector<uint8_t> data(10);
  const uint16_t h = float_to_fp16(1.5f);
  std::memcpy(data.data(), &h, 2);
  const float values[2] = {-3.25f, 7.0f};
  std::memcpy(data.data() + 2, values, 8);
  const std::vector<uint8_t> blob = make_blob(
      R"({"h": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
          "f": {"dtype": "F32", "shape": [2], "data_offsets": [2, 10]}})",
      data);

  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  write_bytes(path, blob);
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().message();
  const TensorInfo* f = file->find("f");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->owned_copy, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data) % alignof(float), 0u);
  const float* loaded = reinterpret_cast<const float*>(f->data);
  EXPECT_EQ(loaded[0], -3.25f);
  EXPECT_EQ(loaded[1], 7.0f);
  EXPECT_EQ(file->find("h")->owned_copy, nullptr);

  // The copy outlives the file when the TensorInfo is copied out.
  TensorInfo kept = *f;
  file = Status::error("dropped");
  EXPECT_EQ(reinterpret_cast<const float*>(kept.data)[1], 7.0f);

  // From memory at every base misalignment.
  std::vector<uint8_t> buffer(blob.size() + 8);
  for (size_t shift = 0; shift < 8; ++shift) {
    std::memcpy(buffer.data() + shift, blob.data(), blob.size());
    auto tensors = parse_safetensors(buffer.data() + shift, blob.size(), "m.safetensors");
    ASSERT_TRUE(tensors.has_value()) << tensors.status().message();
    for (const TensorInfo& info : *tensors) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(info.data) % info.element_size_bytes, 0u)
          << info.name << " shift " << shift;
    }
    EXPECT_EQ(reinterpret_cast<const float*>((*tensors)[1].data)[0], -3.25f);
  }
}

TEST(Safetensors, OpenMissingFileNamesIt) {
  auto file = SafetensorsFile::open("/nonexistent/dir/model.safetensors");
  ASSERT_FALSE(file.has_value());
  EXPECT_THAT(file.status().message(), HasSubstr("/nonexistent/dir/model.safetensors"));
}

}  // namespace
}  // namespace slimkv
