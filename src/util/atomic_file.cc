#include "util/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace slimkv {

Status write_file_atomically(const std::string& path, const std::vector<std::span<const uint8_t>>& pieces) {
  const std::string temp_path = str_cat(path, ".tmp.", ::getpid());
  std::FILE* out = std::fopen(temp_path.c_str(), "wb");
  if (!out) return error("cannot create ", temp_path, ": ", std::strerror(errno));
  bool ok = true;
  for (const std::span<const uint8_t> piece : pieces) {
    if (ok && !piece.empty()) ok = std::fwrite(piece.data(), 1, piece.size(), out) == piece.size();
  }
  const int write_errno = errno;
  if (std::fclose(out) != 0) ok = false;
  if (!ok) {
    std::remove(temp_path.c_str());
    return error("writing ", temp_path, ": ", std::strerror(write_errno));
  }
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temp_path.c_str());
    return error("cannot rename ", temp_path, " to ", path, ": ", std::strerror(rename_errno));
  }
  return Status::ok();
}

}  // namespace slimkv
