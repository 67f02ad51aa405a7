// KvConfig: a KV spec string parsed once. A spec names a pipeline of stages joined by '+', and an
// optional tier after '@':
//     dense            dense:dtype=f16         hack:bits=2,pi=64         zack:r=0.05+hack:bits=4
//     pq:m=2,b=6,topk=0.2+hack                 dense@kvpr
// Each stage is `name` or `name:key=value,key=value`. This parser checks the grammar only; which
// names and options exist is decided where stages are built (kv/kv_factory.h), and every error quotes
// the whole spec.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

struct KvStage {
  std::string name;
  std::vector<std::pair<std::string, std::string>> options;  // in the order written
};

struct KvConfig {
  std::string spec;             // the spec as the user wrote it
  std::vector<KvStage> stages;  // selector and codec stages, in the order written
  KvStage tier{"fast", {}};     // after '@'; "fast" when absent
};

Expected<KvConfig> parse_kv_spec(std::string_view spec);

// The spec checked whole (the grammar, then every stage's name and options, as an engine would build it)
// and written with every option spelled out: "hack:bits=2" -> "hack:bits=2,...,pi=64,...". Two specs
// that run the same pipeline have the same canonical form. Needs no model: shape checks (head dims a
// codec can encode) come when an engine loads.
Expected<std::string> canonical_kv_spec(std::string_view spec);

}  // namespace slimkv
