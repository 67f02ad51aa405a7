// Tests whose cost under ASan+UBSan (clang: -O1 library, -O0 tests) buys nothing the lighter tests do
// not already check for memory errors (a quality figure on the bundled model, a million steps of one
// loop) skip there with SKIP_UNDER_ASAN("why"); each such test's comment names what covers its code.
// docs/testing.md ("CI time") lists them. __SANITIZE_ADDRESS__: GCC defines it with -fsanitize=address,
// CMakeLists.txt defines it for the tests under clang.
#pragma once

#include <gtest/gtest.h>

#if defined(__SANITIZE_ADDRESS__)
#define SKIP_UNDER_ASAN(why) GTEST_SKIP() << why << ": run by the release build (docs/testing.md, CI time)"
#else
#define SKIP_UNDER_ASAN(why) (void)0
#endif
