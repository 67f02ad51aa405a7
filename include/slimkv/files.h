// Reading the files a user names (prompts, token lists, texts): one place, so that every command
// reports a bad path the same way.
#pragma once

#include <string>

#include "slimkv/status.h"

namespace slimkv {

// Ok when `path` is a regular file this process can read; otherwise an error naming the path and what
// it is instead: missing, a directory, a FIFO, a device, a socket, or unreadable (permission). Every
// input file goes through this first, so that a directory is never read as empty text and reported
// later as "invalid JSON" or "empty prompt", and a FIFO never blocks the open.
Status check_input_file(const std::string& path);

// Checked before a command's work starts, so that an hour of evaluation is not lost to a bad --out.
// check_output_file: `path` is not a directory (nor a FIFO/device), its folder exists and is
// writable, and an existing file there is writable. check_output_directory: `path` is a writable
// directory, or can be created (its nearest existing ancestor is a writable directory).
Status check_output_file(const std::string& path);
Status check_output_directory(const std::string& path);

// Reads a whole (small) file into a string; the error names the file and, via check_input_file, what
// is wrong with it.
Expected<std::string> read_text_file(const std::string& path);

}  // namespace slimkv
