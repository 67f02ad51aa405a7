#include "slimkv/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "util/mapped_file.h"

namespace slimkv {

Status write_npy_f32(const std::string& path, const float* values, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t count = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ",";
    count *= d;
  }
  if (shape.size() > 1) dims.pop_back();  // "(3,)" for one dim, "(3,4)" otherwise
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t unpadded = 10 + header.size() + 1;  // magic(6) version(2) length(2) header '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return error("cannot write ", path, ": ", std::strerror(errno));
  const uint16_t length = uint16_t(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&length), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(values), std::streamsize(count * 4));
  if (!out) return error("cannot write ", path, ": ", std::strerror(errno));
  return Status::ok();
}

Expected<NpyArray> read_npy_f32(const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  const uint8_t* p = file.data();
  if (file.size_bytes() < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) return error(path, ": not a .npy file");
  size_t header_length, offset;
  if (p[6] == 1) {
    header_length = size_t(p[8]) | size_t(p[9]) << 8;
    offset = 10;
  } else {
    if (file.size_bytes() < 12) return error(path, ": truncated .npy header");
    header_length = size_t(p[8]) | size_t(p[9]) << 8 | size_t(p[10]) << 16 | size_t(p[11]) << 24;
    offset = 12;
  }
  if (offset + header_length > file.size_bytes()) return error(path, ": .npy header runs past the end of the file");
  const std::string header(reinterpret_cast<const char*>(p + offset), header_length);
  if (header.find("'descr': '<f4'") == std::string::npos) return error(path, ": expected float32 ('<f4') data");
  if (header.find("'fortran_order': False") == std::string::npos) return error(path, ": expected C order");
  const size_t shape_at = header.find("'shape': (");
  const size_t shape_end = shape_at == std::string::npos ? shape_at : header.find(')', shape_at);
  if (shape_end == std::string::npos) return error(path, ": no shape in the .npy header");
  NpyArray array;
  int64_t count = 1;
  std::istringstream dims(header.substr(shape_at + 10, shape_end - shape_at - 10));
  for (std::string dim; std::getline(dims, dim, ',');) {
    if (dim.find_first_not_of(' ') == std::string::npos) continue;  // "(3,)"
    array.shape.push_back(std::stoll(dim));
    count *= array.shape.back();
  }
  const size_t data_offset = offset + header_length;
  if (data_offset + size_t(count) * 4 != file.size_bytes()) {
    return error(path, ": shape says ", count, " floats but the file holds ", (file.size_bytes() - data_offset) / 4);
  }
  array.values.resize(size_t(count));
  std::memcpy(array.values.data(), p + data_offset, size_t(count) * 4);
  return array;
}

}  // namespace slimkv
