// Writing files so that a reader never sees one half-written.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

// Writes the pieces, in order, to PATH.tmp.PID and renames that over PATH once every byte is written;
// on any error the temporary is removed and PATH is left as it was. Errors name the file.
Status write_file_atomically(const std::string& path, const std::vector<std::span<const uint8_t>>& pieces);

}  // namespace slimkv
