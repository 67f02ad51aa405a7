// The GPU attention's split rule (attention/split_rule.h), on the host: every tile's blocks are covered
// once by its splits, no split is empty, the planner's bound holds every tile of up to the sequence's
// blocks (the rule is not monotone: the case the first GPU run of it failed on), and a sequence alone
// fills about the wave it is given.
#include "attention/split_rule.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace slimkv {
namespace {

TEST(SplitRule, SplitsCoverEveryBlockOnceAndTheBoundHoldsEveryShorterTile) {
  for (const int min_blocks : {kMinBlocksPerSplit, 16}) {
    for (const int splits_per_tile : {1, 2, 7, 33, 132, 264, 1056}) {
      for (const int tiles : {1, 2, 3, 16, 64, 200}) {
        int bound_seen = 0;
        for (int blocks = 0; blocks <= 2100; ++blocks) {
          SCOPED_TRACE(testing::Message() << blocks << " blocks, " << tiles << " tiles, " << splits_per_tile
                                          << " splits a tile, " << min_blocks << " blocks a split");
          const int per_split = blocks_per_split(blocks, tiles, splits_per_tile, min_blocks);
          const int splits = splits_of(blocks, tiles, splits_per_tile, min_blocks);
          ASSERT_GE(per_split, 1);
          ASSERT_GE(per_split * splits, blocks) << "blocks left out";
          ASSERT_LT(per_split * (splits - 1), blocks + (blocks == 0 ? 1 : 0)) << "an empty split";
          ASSERT_LE(splits, std::max(1, splits_per_tile / tiles)) << "more than the sequence's share of the wave";
          if (blocks >= min_blocks) {  // at most ceil(blocks / min_blocks) splits: more than half the floor each
            ASSERT_GT(2 * per_split, min_blocks);
          }
          // The bound for a sequence of `blocks` holds each of its tiles (any count up to it).
          const int bound = most_splits_of(blocks, tiles, splits_per_tile, min_blocks);
          ASSERT_GE(bound, 1);
          bound_seen = std::max(bound_seen, splits);
          ASSERT_GE(bound, bound_seen) << "a shorter tile splits more than the bound";
        }
      }
    }
  }
}

TEST(SplitRule, ASequenceAloneFillsItsWave) {
  // One decode tile of 256 blocks (16K tokens) with 132 splits of the wave: 128 splits of 2 blocks.
  EXPECT_EQ(blocks_per_split(256, 1, 132), 2);
  EXPECT_EQ(splits_of(256, 1, 132), 128);
  // The example of the header: 31 blocks split 16 ways, 33 only 11.
  EXPECT_EQ(splits_of(31, 1, 16), 16);
  EXPECT_EQ(splits_of(33, 1, 16), 11);
  EXPECT_EQ(most_splits_of(33, 1, 16), 16);
  // A prompt chunk of 16 tiles shares the wave: 264 / 16 = 16 splits a tile at most.
  EXPECT_EQ(splits_of(512, 16, 264), 16);
  // The quantized decode kernel's rule on an H200 (half of its wave of 528 CTAs over 8 KV heads: 33, at
  // least 16 blocks a split): 4K tokens in 4 splits of 16 blocks, 16K in 16, 64K in 32 of 32.
  EXPECT_EQ(splits_of(64, 1, 33, 16), 4);
  EXPECT_EQ(splits_of(256, 1, 33, 16), 16);
  EXPECT_EQ(splits_of(1024, 1, 33, 16), 32);
  EXPECT_EQ(blocks_per_split(1024, 1, 33, 16), 32);
}

}  // namespace
}  // namespace slimkv
