#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace slimkv {

Status check_input_file(const std::string& path) {
  if (path.empty()) return error("empty file path (expected a file name)");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int saved = errno;
    if (saved == ENOENT) return error(path, ": does not exist");
    if (saved == ENOTDIR) return error(path, ": does not exist (a parent in the path is not a directory)");
    if (saved == EACCES) return error(path, ": not readable (permission denied on a parent directory)");
    return error(path, ": cannot be opened: ", std::strerror(saved));
  }
  if (S_ISDIR(info.st_mode)) return error(path, ": is a directory, expected a file");
  if (S_ISFIFO(info.st_mode)) return error(path, ": is a FIFO (named pipe), expected a regular file");
  if (S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode)) {
    return error(path, ": is a device, expected a regular file");
  }
  if (S_ISSOCK(info.st_mode)) return error(path, ": is a socket, expected a regular file");
  if (!S_ISREG(info.st_mode)) return error(path, ": is not a regular file");
  if (::access(path.c_str(), R_OK) != 0) {
    return error(path, ": not readable (", std::strerror(errno), "; check its permissions)");
  }
  return Status::ok();
}

Status check_output_file(const std::string& path) {
  if (path.empty()) return error("empty output path (expected a file name)");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return error(path, ": is a directory, expected a file name to write");
    if (!S_ISREG(info.st_mode)) return error(path, ": exists and is not a regular file (a FIFO or device?)");
    if (::access(path.c_str(), W_OK) != 0) return error(path, ": not writable (", std::strerror(errno), ")");
    return Status::ok();
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  if (::stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return error(path, ": cannot be written: its folder ", folder, " does not exist");
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return error(path, ": cannot be written: its folder ", folder, " is not writable (", std::strerror(errno), ")");
  }
  return Status::ok();
}

Status check_output_directory(const std::string& path) {
  if (path.empty()) return error("empty output directory (expected a directory name)");
  std::filesystem::path existing = std::filesystem::path(path);
  struct stat info {};
  // The nearest existing ancestor decides: create_directories makes the rest.
  while (::stat(existing.c_str(), &info) != 0) {
    if (!existing.has_parent_path() || existing.parent_path() == existing) {
      existing = ".";
      if (::stat(".", &info) != 0) return error(path, ": cannot find a folder to create it in");
      break;
    }
    existing = existing.parent_path();
  }
  if (!S_ISDIR(info.st_mode)) {
    return error(path, ": cannot be an output directory: ", existing.string(),
                 existing.string() == path ? " is" : " (part of the path) is", " not a directory");
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    return error(path, ": cannot be written: ", existing.string(), " is not writable (", std::strerror(errno), ")");
  }
  return Status::ok();
}

Expected<MappedFile> MappedFile::open(const std::string& path) {
  SLIMKV_RETURN_IF_ERROR(check_input_file(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return error(path, ": cannot be opened: ", std::strerror(errno));
  struct stat info {};
  // Checked again on the descriptor: the path may have been replaced since check_input_file.
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return error(path, ": is not a regular file");
  }
  MappedFile file;
  file.path_ = path;
  file.size_bytes_ = size_t(info.st_size);
  if (file.size_bytes_ > 0) {
    void* mapped = ::mmap(nullptr, file.size_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int saved = errno;
      ::close(fd);
      return error("cannot map ", path, ": ", std::strerror(saved));
    }
    file.data_ = static_cast<const uint8_t*>(mapped);
  }
  ::close(fd);  // the mapping keeps the file alive
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_bytes_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

void MappedFile::release_pages(const void* data, size_t bytes) const {
  const auto* begin = static_cast<const uint8_t*>(data);
  if (data_ == nullptr || begin < data_ || begin + bytes > data_ + size_bytes_) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (uintptr_t(begin) + page - 1) / page * page, last = (uintptr_t(begin) + bytes) / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_bytes_);
}

Expected<std::string> read_text_file(const std::string& path) {
  SLIMKV_RETURN_IF_ERROR(check_input_file(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(path, ": cannot be opened: ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return error(path, ": read failed");
  return contents.str();
}

}  // namespace slimkv
