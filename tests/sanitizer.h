// Tests that only measure quality (an answer, a recall) on the bundled model, where the ASan+UBSan build
// (clang: -O1 library, -O0 tests) adds nothing the lighter tests do not already check for memory errors,
// skip there with SKIP_UNDER_ASAN(): each such test's comment names what covers its code under ASan.
// docs/testing.md ("CI time") lists them. __SANITIZE_ADDRESS__: GCC defines it with -fsanitize=address,
// CMakeLists.txt defines it for the tests under clang.
#pragma once

#include <gtest/gtest.h>

#if defined(__SANITIZE_ADDRESS__)
#define SKIP_UNDER_ASAN() GTEST_SKIP() << "quality only: run by the release build (docs/testing.md, CI time)"
#else
#define SKIP_UNDER_ASAN() (void)0
#endif
