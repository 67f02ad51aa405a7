#include "slimkv/device_name.h"

#include <charconv>

namespace slimkv {

Expected<DeviceName> parse_device_name(std::string_view name) {
  const auto refused = [&] {
    return error("device '", name, "' is not known: expected cpu, cuda, or cuda:N for visible GPU N (0 is the first, ",
                 "as CUDA_VISIBLE_DEVICES orders them)");
  };
  if (name == "cpu") return DeviceName{};
  if (name == "cuda") return DeviceName{.cuda = true, .gpu = 0};
  constexpr std::string_view kCudaPrefix = "cuda:";
  if (!name.starts_with(kCudaPrefix)) return refused();
  const std::string_view digits = name.substr(kCudaPrefix.size());
  int gpu = -1;
  const auto [end, failure] = std::from_chars(digits.data(), digits.data() + digits.size(), gpu);
  // Digits alone: from_chars takes a '-' (cuda:-1) and stops early at anything else (cuda:1x, cuda:).
  if (digits.empty() || digits.front() == '-' || failure != std::errc() || end != digits.data() + digits.size()) {
    return refused();
  }
  return DeviceName{.cuda = true, .gpu = gpu};
}

}  // namespace slimkv
