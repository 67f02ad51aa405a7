// A read-only memory-mapped file: weights are used in place, paged in by the OS on first touch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "slimkv/files.h"
#include "slimkv/status.h"

namespace slimkv {

class MappedFile {
 public:
  static Expected<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }
  // Drops the pages wholly inside [data, data + bytes) from this process's memory (madvise
  // MADV_DONTNEED) when a copy of them serves instead: the mapping is private and never written, so a
  // later read maps the file's bytes again. Ranges outside this file's mapping are ignored.
  void release_pages(const void* data, size_t bytes) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_bytes_ = 0;
};


}  // namespace slimkv
