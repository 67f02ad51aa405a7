// engine.session(): one sequence run by hand (prefill, decode) with NumPy logits, and its KV cache read
// per (layer, KV head) through slimkv/kv_inspection.h (on device cuda: a host copy of the GPU's KV).
#include <span>

#include <pybind11/stl.h>

#include "python/binding.h"
#include "slimkv/kv_inspection.h"

namespace slimkv::python {
namespace {

// Runs f() holding the engine's lock, the GIL released first (so that a thread running the model never
// waits on the GIL, and Python threads go on). f must not touch Python objects.
template <typename F>
auto with_engine_locked(EngineHandle& handle, F&& f) {
  py::gil_scoped_release release;
  std::lock_guard lock(handle.mutex);
  return f();
}

// A session and the engine it must not outlive.
struct SessionHandle {
  std::shared_ptr<EngineHandle> engine;
  std::unique_ptr<Session> session;
  // The KV as session.kv last read it, until the next prefill or decode: on device cuda a host copy
  // (taken once for every head and block read meanwhile), on device cpu the live store.
  std::shared_ptr<const KvSnapshot> kv;

  ~SessionHandle() {  // removing the sequence mutates the engine: under its lock
    with_engine_locked(*engine, [this] {
      kv.reset();
      session.reset();
      return 0;
    });
  }

  // Runs tokens (the GIL released, the engine locked); the KV read before is stale after.
  std::vector<float> run(std::span<const int32_t> ids, bool all_logits) {
    return value_or_throw(with_engine_locked(*engine, [&] {
      kv.reset();
      return session->prefill(ids, all_logits);
    }));
  }

  std::shared_ptr<const KvSnapshot> snapshot() {
    using Shared = std::shared_ptr<const KvSnapshot>;
    Expected<Shared> taken = with_engine_locked(*engine, [this]() -> Expected<Shared> {
      if (!kv) {
        SLIMKV_ASSIGN_OR_RETURN(KvSnapshot snapshot, kv_snapshot(*engine->engine, *session));
        kv = std::make_shared<const KvSnapshot>(std::move(snapshot));
      }
      return kv;
    });
    return value_or_throw(std::move(taken));
  }
};

py::dict memory_dict(const KvMemory& memory) {
  py::dict tier;
  tier["hits"] = memory.tier.hits;
  tier["misses"] = memory.tier.misses;
  tier["hit_rate"] = memory.tier.hit_rate();
  tier["bytes_moved"] = memory.tier.bytes_moved;
  tier["bytes_written"] = memory.tier.bytes_written;
  py::dict out;
  out["sealed_bytes"] = memory.sealed_bytes;
  out["open_bytes"] = memory.open_bytes;
  out["selector_bytes"] = memory.selector_bytes;
  out["sealed_in_slow_tier"] = memory.sealed_in_slow_tier;
  out["cache_bytes"] = memory.cache_bytes;
  out["fast_bytes"] = memory.fast_bytes();
  out["slow_bytes"] = memory.slow_bytes();
  out["sealed_blocks"] = memory.sealed_blocks;
  out["sealed_tokens"] = memory.sealed_tokens;
  out["sealed_bytes_per_token"] = memory.sealed_bytes_per_token();
  out["tier"] = tier;
  return out;
}

// K [tokens, k_dim] and V [tokens, v_dim] as a pair of float32 arrays.
py::tuple kv_arrays(std::vector<float>&& k, std::vector<float>&& v, int k_dim, int v_dim) {
  const py::ssize_t tokens = k_dim ? py::ssize_t(k.size()) / k_dim : 0;
  return py::make_tuple(to_numpy(std::move(k), {tokens, k_dim}), to_numpy(std::move(v), {tokens, v_dim}));
}

// One sealed block of one (layer, KV head), of the snapshot it was listed from.
struct KvBlock {
  std::shared_ptr<SessionHandle> owner;
  std::shared_ptr<const KvSnapshot> kv;
  int layer = 0, head = 0, index = 0;
  int first_token = 0, last_token = 0;  // [first, last)
  int k_dim = 0, v_dim = 0;
  size_t bytes = 0;
  std::string codec, tier;

  py::tuple decode() const {
    std::vector<float> k, v;
    throw_if_error(with_engine_locked(*owner->engine, [&] {
      return decode_kv_block(*kv, layer, head, index, k, v);
    }));
    return kv_arrays(std::move(k), std::move(v), k_dim, v_dim);
  }
};

// One (layer, KV head) of the session's KV, as it was when asked for.
struct KvHead {
  std::shared_ptr<SessionHandle> owner;
  std::shared_ptr<const KvSnapshot> kv;
  int layer = 0, head = 0;
  KvHeadLayout layout;
  std::vector<KvBlock> blocks;

  py::tuple open() const {
    std::vector<float> k, v;
    throw_if_error(with_engine_locked(*owner->engine, [&] { return read_open_kv(*kv, layer, head, k, v); }));
    return kv_arrays(std::move(k), std::move(v), layout.k_dim, layout.v_dim);
  }
  py::object last_selection() const {
    KvSelection selection = value_or_throw(with_engine_locked(*owner->engine, [&] {
      return kv_last_selection(*kv, layer, head);
    }));
    if (selection.all) return py::none();
    return py::array_t<int>(py::ssize_t(selection.tokens.size()), selection.tokens.data());
  }
};

// session.kv: the session's KV cache.
struct KvView {
  std::shared_ptr<SessionHandle> owner;

  KvLayout layout() const {
    const std::shared_ptr<const KvSnapshot> kv = owner->snapshot();
    return with_engine_locked(*owner->engine, [&] { return kv_layout(*kv); });
  }
  KvHead head(int layer, int head) const {
    KvHead out{owner, owner->snapshot(), layer, head, {}, {}};
    KvLayout whole;
    out.layout = value_or_throw(with_engine_locked(*owner->engine, [&] {
      whole = kv_layout(*out.kv);
      return kv_head_layout(*out.kv, layer, head);
    }));
    for (int i = 0; i < out.layout.sealed_blocks; ++i) {
      out.blocks.push_back({owner, out.kv, layer, head, i, i * whole.block_tokens, (i + 1) * whole.block_tokens,
                            out.layout.k_dim, out.layout.v_dim, out.layout.block_bytes, out.layout.codec,
                            whole.sealed_in_slow_tier ? "slow" : "fast"});
    }
    return out;
  }
  py::dict memory() const {
    const KvMemory memory = value_or_throw(with_engine_locked(*owner->engine, [&] {
      return owner->engine->engine->kv_memory(owner->session->sequence());
    }));
    return memory_dict(memory);
  }
};

}  // namespace

void bind_session(py::module_& module) {
  py::class_<KvBlock>(module, "KvBlock", "A sealed KV block of one layer and KV head")
      .def_readonly("layer", &KvBlock::layer)
      .def_readonly("head", &KvBlock::head)
      .def_readonly("index", &KvBlock::index)
      .def_readonly("first_token", &KvBlock::first_token)
      .def_readonly("last_token", &KvBlock::last_token, "one past the block's last token")
      .def_readonly("bytes", &KvBlock::bytes, "the block as the codec encodes it")
      .def_readonly("codec", &KvBlock::codec)
      .def_readonly("tier", &KvBlock::tier, "'fast' (RAM) or 'slow' (@offload's file)")
      .def("decode", &KvBlock::decode, "(K [block_tokens, k_dim], V [block_tokens, v_dim]) float32, decoded by the codec")
      .def("__repr__", [](const KvBlock& block) {
        return "KvBlock(layer=" + std::to_string(block.layer) + ", head=" + std::to_string(block.head) + ", tokens=[" +
               std::to_string(block.first_token) + ", " + std::to_string(block.last_token) + "), " +
               std::to_string(block.bytes) + " bytes, " + block.codec + ", " + block.tier + ")";
      });

  py::class_<KvHead>(module, "KvHead", "The KV of one layer and KV head: sealed blocks, then open tokens")
      .def_readonly("layer", &KvHead::layer)
      .def_readonly("head", &KvHead::head)
      .def_readonly("blocks", &KvHead::blocks)
      .def_property_readonly("k_dim", [](const KvHead& head) { return head.layout.k_dim; })
      .def_property_readonly("v_dim", [](const KvHead& head) { return head.layout.v_dim; })
      .def_property_readonly("open_tokens", [](const KvHead& head) { return head.layout.open_tokens; })
      .def("open", &KvHead::open, "(K [open_tokens, k_dim], V [open_tokens, v_dim]) float32: the open block")
      .def("last_selection", &KvHead::last_selection,
           "the token indices the selector chose at the last decode step (int32 array), None for every token");

  py::class_<KvLayout>(module, "KvLayout")
      .def_readonly("num_layers", &KvLayout::num_layers)
      .def_readonly("num_kv_heads", &KvLayout::num_kv_heads)
      .def_readonly("block_tokens", &KvLayout::block_tokens)
      .def_readonly("spec", &KvLayout::spec)
      .def_readonly("codec", &KvLayout::codec)
      .def_readonly("sealed_in_slow_tier", &KvLayout::sealed_in_slow_tier)
      .def_readonly("rotated", &KvLayout::rotated, "K/V stored Hadamard-rotated (rot=hadamard)");

  py::class_<KvView>(module, "KvView",
                    "A session's KV cache per (layer, KV head); on device cuda a host copy of it, taken once until the "
                    "session's next prefill or decode")
      .def_property_readonly("layout", &KvView::layout)
      .def("head", &KvView::head, py::arg("layer"), py::arg("head"))
      .def("__getitem__", [](const KvView& view, std::pair<int, int> index) { return view.head(index.first, index.second); })
      .def("memory", &KvView::memory, "what the sequence's KV takes and where (slimkv/kv_memory.h), as a dict");

  py::class_<SessionHandle, std::shared_ptr<SessionHandle>>(module, "Session",
                                                             "One sequence run by hand: prefill, then decode")
      .def("prefill",
           [](SessionHandle& handle, const std::vector<int32_t>& ids, bool all_logits) {
             std::vector<float> logits = handle.run(ids, all_logits);
             const py::ssize_t vocab = handle.engine->engine->vocab_size();
             if (all_logits) return to_numpy(std::move(logits), {py::ssize_t(ids.size()), vocab});
             return to_numpy(std::move(logits), {vocab});
           },
           py::arg("ids"), py::arg("all_logits") = false,
           "Runs token ids; returns float32 logits [vocab] of the last one, or [len(ids), vocab] with all_logits")
      .def("decode",
           [](SessionHandle& handle, int32_t id) {
             std::vector<float> logits = handle.run(std::span<const int32_t>(&id, 1), false);
             return to_numpy(std::move(logits), {py::ssize_t(handle.engine->engine->vocab_size())});
           },
           py::arg("id"), "Runs one token; returns float32 logits [vocab]")
      .def_property_readonly("num_tokens", [](SessionHandle& handle) {
        return with_engine_locked(*handle.engine, [&] { return handle.session->num_tokens(); });
      })
      .def_property_readonly("kv", [](const std::shared_ptr<SessionHandle>& handle) { return KvView{handle}; });

  // Engine.session() lives here, beside the Session it makes.
  py::class_<EngineHandle, std::shared_ptr<EngineHandle>> engine =
      py::reinterpret_borrow<py::class_<EngineHandle, std::shared_ptr<EngineHandle>>>(module.attr("Engine"));
  engine.def("session", [](const std::shared_ptr<EngineHandle>& handle) {
    auto session = std::make_shared<SessionHandle>();
    session->engine = handle;
    session->session = with_engine_locked(*handle, [&] { return handle->engine->new_session(); });
    return session;
  }, "A new sequence of this engine, removed when the Session is dropped");
}

}  // namespace slimkv::python
