#include "tensor/finite.h"

#include <cstring>

namespace slimkv {
namespace {

// An IEEE value is NaN or Inf exactly when its exponent bits are all ones; the loop ORs a flag per
// chunk so the compiler vectorises it, and only a chunk that has one is searched element by element.
template <typename Bits>
int64_t first_all_ones_exponent(const uint8_t* data, size_t count, Bits exponent_mask) {
  constexpr size_t kChunk = 4096;
  for (size_t begin = 0; begin < count; begin += kChunk) {
    const size_t end = begin + kChunk < count ? begin + kChunk : count;
    // A count in the element's own width (not a bool OR, which GCC 12 does not vectorise): at most
    // kChunk, so it cannot wrap to 0 for uint16_t.
    Bits hits = 0;
    for (size_t i = begin; i < end; ++i) {
      Bits bits;
      std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
      hits = Bits(hits + Bits((bits & exponent_mask) == exponent_mask));
    }
    if (hits == 0) continue;
    for (size_t i = begin; i < end; ++i) {
      Bits bits;
      std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
      if ((bits & exponent_mask) == exponent_mask) return int64_t(i);
    }
  }
  return -1;
}

template <typename Bits>
const char* classify(const uint8_t* data, size_t index, Bits exponent_mask, Bits sign_mask) {
  Bits bits;
  std::memcpy(&bits, data + index * sizeof(Bits), sizeof(Bits));
  const Bits mantissa_mask = Bits(~(exponent_mask | sign_mask));
  if (bits & mantissa_mask) return "NaN";
  return (bits & sign_mask) ? "-Inf" : "+Inf";
}

}  // namespace

int64_t first_non_finite(const uint8_t* data, DType dtype, size_t count) {
  switch (dtype) {
    case DType::kF32: return first_all_ones_exponent<uint32_t>(data, count, 0x7F800000u);
    case DType::kF16: return first_all_ones_exponent<uint16_t>(data, count, uint16_t(0x7C00));
    case DType::kBF16: return first_all_ones_exponent<uint16_t>(data, count, uint16_t(0x7F80));
  }
  return -1;
}

const char* non_finite_name(const uint8_t* data, DType dtype, size_t index) {
  switch (dtype) {
    case DType::kF32: return classify<uint32_t>(data, index, 0x7F800000u, 0x80000000u);
    case DType::kF16: return classify<uint16_t>(data, index, uint16_t(0x7C00), uint16_t(0x8000));
    case DType::kBF16: return classify<uint16_t>(data, index, uint16_t(0x7F80), uint16_t(0x8000));
  }
  return "?";
}

}  // namespace slimkv
