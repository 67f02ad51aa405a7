// What the files of the Python module share: the exception every engine error becomes, conversions
// between engine values and Python ones, and the engine handle sessions and streams keep alive.
#pragma once

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "slimkv/engine.h"
#include "slimkv/status.h"

namespace slimkv::python {

namespace py = pybind11;

// An error the engine returned (its Status message): raised in Python as slimkv.Error, a RuntimeError.
struct EngineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void throw_if_error(const Status& status) {
  if (!status.is_ok()) throw EngineError(status.message());
}
template <typename T>
T value_or_throw(Expected<T> expected) {
  throw_if_error(expected.status());
  return expected.take();
}

// A loaded engine and the lock that makes it "driven by one thread at a time" (engine.h) when several
// Python threads, sessions and streams share it. Every call that runs the model takes the lock with the
// GIL released, so that other Python threads (other engines, or waiting ones) go on meanwhile.
struct EngineHandle {
  std::unique_ptr<Engine> engine;
  std::mutex mutex;
};

// A float32 NumPy array over `values` (moved, not copied: a capsule owns the vector).
py::array_t<float> to_numpy(std::vector<float>&& values, std::vector<py::ssize_t> shape);

// Python values (dict, list, tuple, str, int, float, bool, None) as JSON, dict keys in their order;
// anything else is a TypeError naming `what`.
nlohmann::ordered_json to_json(const py::handle& value, const std::string& what);

void bind_engine(py::module_& module);   // engine.cc: Engine, generate, stream, tokenizer, chat template
void bind_session(py::module_& module);  // session.cc: Session, its KV
void bind_evaluate(py::module_& module);  // evaluate.cc: evaluate, KvSpec
void bind_codecs(py::module_& module);    // codecs.cc: slimkv.codecs

}  // namespace slimkv::python
