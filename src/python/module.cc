// The `slimkv` Python module: a thin binding over the public API (include/slimkv/), docs/python.md.
#include <pybind11/stl.h>

#include "python/binding.h"

namespace slimkv::python {

py::array_t<float> to_numpy(std::vector<float>&& values, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<float>(std::move(values));
  py::capsule owner(owned, [](void* vector) { delete static_cast<std::vector<float>*>(vector); });
  return py::array_t<float>(std::move(shape), owned->data(), owner);
}

nlohmann::ordered_json to_json(const py::handle& value, const std::string& what) {
  if (value.is_none()) return nullptr;
  // bool before int: Python's True is an int too.
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::dict>(value)) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (const auto& [key, item] : value.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key)) {
        throw py::type_error(what + ": dict keys must be str, not " + std::string(py::str(key.get_type().attr("__name__"))));
      }
      const std::string name = key.cast<std::string>();
      object[name] = to_json(item, what + "['" + name + "']");
    }
    return object;
  }
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    nlohmann::ordered_json array = nlohmann::ordered_json::array();
    size_t index = 0;
    for (const auto& item : value) array.push_back(to_json(item, what + "[" + std::to_string(index++) + "]"));
    return array;
  }
  throw py::type_error(what + ": " + std::string(py::str(value.get_type().attr("__name__"))) +
                       " is not a JSON value (dict, list, str, int, float, bool or None)");
}

}  // namespace slimkv::python

PYBIND11_MODULE(slimkv, module) {
  using namespace slimkv::python;
  module.doc() = "slimkv: an LLM inference engine with a compressed, tiered KV cache (docs/python.md)";
  py::register_exception<EngineError>(module, "Error", PyExc_RuntimeError);
  module.attr("__version__") = SLIMKV_VERSION;
  bind_engine(module);
  bind_session(module);
  bind_evaluate(module);
  bind_codecs(module);
}
