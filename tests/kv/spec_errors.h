// KV specs that make_kv_pipeline must refuse, each with a message that quotes the spec and names what is
// wrong (`must_mention`): shared by the spec tests of each stage and option.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv/kv_factory.h"

namespace slimkv::test {

struct BadSpec {
  std::string spec, must_mention;
};

inline void expect_specs_refused(const std::vector<BadSpec>& bad) {
  for (const BadSpec& b : bad) {
    auto pipeline = make_kv_pipeline(b.spec);
    ASSERT_FALSE(pipeline) << b.spec;
    EXPECT_NE(pipeline.status().message().find(b.must_mention), std::string::npos)
        << "spec '" << b.spec << "' gave: " << pipeline.status().message();
    if (!b.spec.empty()) {
      EXPECT_NE(pipeline.status().message().find("'" + b.spec + "'"), std::string::npos) << b.spec;
    }
  }
}

}  // namespace slimkv::test
