// Reading the files a user names (prompts, token lists, texts): one place, so that every command
// reports a bad path the same way.
#pragma once

#include <string>

#include "slimkv/status.h"

namespace slimkv {

// Reads a whole (small) file into a string; the error names the file.
Expected<std::string> read_text_file(const std::string& path);

}  // namespace slimkv
