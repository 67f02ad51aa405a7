// Which blocks sequences hold (kv/cuda/sequence_blocks.h): a sequence's blocks are consecutive
// when they can be (the host tiers copy a run of them at once), the lowest free block otherwise, every
// block is handed out once, and a full pool or table is an error that changes nothing. Host code only:
// runs without a GPU.
#include <gtest/gtest.h>

#include <set>

#include "kv/cuda/sequence_blocks.h"

namespace slimkv::cuda {
namespace {

TEST(SequenceBlocks, ConsecutiveWhenPossibleLowestOtherwiseNeverTwice) {
  SequenceBlocks pool(10, 3, 6);
  const int a = pool.add_sequence().take(), b = pool.add_sequence().take();
  ASSERT_TRUE(pool.grow(a, 2 * kCudaBlockTokens).is_ok());       // a: 0 1
  ASSERT_TRUE(pool.grow(b, kCudaBlockTokens + 1).is_ok());       // b: 2 3
  ASSERT_TRUE(pool.grow(a, 3 * kCudaBlockTokens).is_ok());       // a: 0 1 4 (2 is b's)
  EXPECT_EQ(pool.blocks(a), (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(pool.blocks(b), (std::vector<int>{2, 3}));
  EXPECT_EQ(pool.num_tokens(a), 3 * kCudaBlockTokens);
  EXPECT_EQ(pool.free_blocks(), 5);
  pool.remove_sequence(b);  // 2 and 3 come back
  EXPECT_EQ(pool.free_blocks(), 7);
  const int c = pool.add_sequence().take();
  ASSERT_TRUE(pool.grow(c, 4 * kCudaBlockTokens).is_ok());  // the lowest free (2), then after it: 3, then 5 6
  EXPECT_EQ(pool.blocks(c), (std::vector<int>{2, 3, 5, 6}));
  ASSERT_TRUE(pool.grow(a, 4 * kCudaBlockTokens).is_ok());  // after 4: 5 is c's, so the lowest free: 7
  EXPECT_EQ(pool.blocks(a).back(), 7);
  std::set<int> seen;
  for (int s : {a, c}) {
    for (int block : pool.blocks(s)) EXPECT_TRUE(seen.insert(block).second) << "block " << block << " twice";
  }
  EXPECT_EQ(pool.free_blocks(), 10 - int(seen.size()));
}

TEST(SequenceBlocks, FullPoolOrTableIsAnErrorThatChangesNothing) {
  SequenceBlocks pool(4, 2, 3);
  const int a = pool.add_sequence().take();
  const Status too_long = pool.grow(a, 3 * kCudaBlockTokens + 1);
  ASSERT_FALSE(too_long.is_ok());
  EXPECT_NE(too_long.message().find("block table"), std::string::npos) << too_long.message();
  ASSERT_TRUE(pool.grow(a, 3 * kCudaBlockTokens).is_ok());
  const int b = pool.add_sequence().take();
  const Status full = pool.grow(b, 2 * kCudaBlockTokens);
  ASSERT_FALSE(full.is_ok());
  EXPECT_NE(full.message().find("all in use"), std::string::npos) << full.message();
  EXPECT_TRUE(pool.blocks(b).empty());
  EXPECT_EQ(pool.num_tokens(b), 0);
  EXPECT_FALSE(pool.add_sequence().has_value());  // both ids taken
  // A pool of a billion blocks costs nothing until used.
  SequenceBlocks huge(1 << 30, 1, 2);
  EXPECT_EQ(huge.free_blocks(), 1 << 30);
}

TEST(SequenceBlocks, ReleasedLeadingBlocksGoBackWhileTheTokensStay) {
  SequenceBlocks pool(6, 2, 8);
  const int a = pool.add_sequence().take();
  ASSERT_TRUE(pool.grow(a, 3 * kCudaBlockTokens + 5).is_ok());  // a: 0 1 2 3
  pool.release_leading(a, 3);
  EXPECT_EQ(pool.blocks(a), (std::vector<int>{SequenceBlocks::kReleased, SequenceBlocks::kReleased,
                                              SequenceBlocks::kReleased, 3}));
  EXPECT_EQ(pool.num_tokens(a), 3 * kCudaBlockTokens + 5);
  EXPECT_EQ(pool.released_blocks(a), 3);
  EXPECT_EQ(pool.free_blocks(), 5);
  pool.release_leading(a, 3);  // twice changes nothing
  EXPECT_EQ(pool.free_blocks(), 5);
  ASSERT_TRUE(pool.grow(a, 5 * kCudaBlockTokens).is_ok());  // after 3: 4
  EXPECT_EQ(pool.blocks(a).back(), 4);
  pool.release_leading(a, 5);
  EXPECT_EQ(pool.free_blocks(), 6);
  ASSERT_TRUE(pool.grow(a, 5 * kCudaBlockTokens + 1).is_ok());  // every block released: the lowest free
  EXPECT_EQ(pool.blocks(a).back(), 0);
  pool.remove_sequence(a);
  EXPECT_EQ(pool.free_blocks(), 6);
}

}  // namespace
}  // namespace slimkv::cuda
