// slimkv.codecs: a KV codec on NumPy arrays, without a model (slimkv/codec.h).
#include <cmath>

#include <pybind11/stl.h>

#include "python/binding.h"
#include "slimkv/codec.h"

namespace slimkv::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// An encoded block and the codec that reads it.
struct Block {
  std::shared_ptr<const BlockCodec> codec;
  EncodedBlock encoded;

  py::tuple decode() const {
    std::vector<float> k, v;
    throw_if_error(codec->decode(encoded, k, v));
    return py::make_tuple(to_numpy(std::move(k), {encoded.block_tokens, encoded.k_dim}),
                          to_numpy(std::move(v), {encoded.block_tokens, encoded.v_dim}));
  }
};

std::shared_ptr<const BlockCodec> codec_of(const std::string& spec) {
  return std::make_shared<const BlockCodec>(value_or_throw(BlockCodec::from_spec(spec)));
}

// A [rows, dims] array (a ValueError naming `name` otherwise).
void check_matrix(const FloatArray& array, const char* name, py::ssize_t rows) {
  if (array.ndim() != 2 || array.shape(0) != rows || array.shape(1) < 1) {
    std::string shape;
    for (py::ssize_t i = 0; i < array.ndim(); ++i) shape += (i ? ", " : "") + std::to_string(array.shape(i));
    throw py::value_error(std::string(name) + " must be [" + std::to_string(rows) + ", dims] (the codec's block_tokens " +
                          "rows), got shape (" + shape + ")");
  }
}

Block encode(std::shared_ptr<const BlockCodec> codec, const FloatArray& k, const FloatArray& v, uint64_t seed) {
  check_matrix(k, "k", codec->block_tokens());
  check_matrix(v, "v", codec->block_tokens());
  Expected<EncodedBlock> encoded = [&] {
    py::gil_scoped_release release;
    return codec->encode(k.data(), v.data(), int(k.shape(1)), int(v.shape(1)), seed);
  }();
  return Block{std::move(codec), value_or_throw(std::move(encoded))};
}

py::array_t<float> attention(const FloatArray& q, const Block& block, std::optional<float> scale) {
  const bool one = q.ndim() == 1;
  if (!(one || q.ndim() == 2) || q.shape(q.ndim() - 1) != block.encoded.k_dim || q.size() == 0) {
    throw py::value_error("q must be [k_dim] or [n, k_dim] with k_dim " + std::to_string(block.encoded.k_dim) +
                          " (the block's)");
  }
  const int n = one ? 1 : int(q.shape(0));
  std::vector<float> out;
  {
    py::gil_scoped_release release;
    throw_if_error(block.codec->attention(block.encoded, q.data(), n,
                                          scale.value_or(1.0f / std::sqrt(float(block.encoded.k_dim))), out));
  }
  if (one) return to_numpy(std::move(out), {block.encoded.v_dim});
  return to_numpy(std::move(out), {n, block.encoded.v_dim});
}

}  // namespace

void bind_codecs(py::module_& module) {
  py::module_ codecs = module.def_submodule("codecs", "A KV codec on NumPy arrays, without a model (slimkv/codec.h)");
  py::class_<Block>(codecs, "Block", "A block of K/V as a codec encoded it")
      .def_property_readonly("codec", [](const Block& block) { return block.encoded.codec; })
      .def_property_readonly("block_tokens", [](const Block& block) { return block.encoded.block_tokens; })
      .def_property_readonly("k_dim", [](const Block& block) { return block.encoded.k_dim; })
      .def_property_readonly("v_dim", [](const Block& block) { return block.encoded.v_dim; })
      .def_property_readonly("nbytes", [](const Block& block) { return block.encoded.bytes.size(); })
      .def_property_readonly("data", [](const Block& block) {
        return py::bytes(reinterpret_cast<const char*>(block.encoded.bytes.data()), block.encoded.bytes.size());
      }, "the encoded bytes")
      .def("decode", &Block::decode, "(K [block_tokens, k_dim], V [block_tokens, v_dim]) float32");

  py::class_<BlockCodec, std::shared_ptr<BlockCodec>>(codecs, "Codec", "The codec stage of a KV spec")
      .def(py::init([](const std::string& spec) { return std::const_pointer_cast<BlockCodec>(codec_of(spec)); }),
           py::arg("spec"))
      .def_property_readonly("block_tokens", &BlockCodec::block_tokens)
      .def("__str__", &BlockCodec::describe)
      .def("encode", [](const std::shared_ptr<BlockCodec>& codec, const FloatArray& k, const FloatArray& v, uint64_t seed) {
        return encode(codec, k, v, seed);
      }, py::arg("k"), py::arg("v"), py::arg("seed") = 0);

  codecs.def("encode_block",
             [](const FloatArray& k, const FloatArray& v, const std::string& spec, uint64_t seed) {
               return encode(codec_of(spec), k, v, seed);
             },
             py::arg("k"), py::arg("v"), py::arg("spec"), py::arg("seed") = 0,
             "Encodes k [block_tokens, k_dim] and v [block_tokens, v_dim] with the spec's codec (no rotation: "
             "rot=hadamard is the store's step)");
  codecs.def("attention", &attention, py::arg("q"), py::arg("block"), py::arg("scale") = py::none(),
             "softmax(scale q K^T) V over the block's tokens with the codec's kernel; q [k_dim] or [n, k_dim], "
             "scale default 1/sqrt(k_dim)");
}

}  // namespace slimkv::python
