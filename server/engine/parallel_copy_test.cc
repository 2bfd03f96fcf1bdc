#include "server/engine/parallel_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

// Pieces of the given sizes filled with distinct bytes, and what gathering them must give.
struct Pieces {
  std::vector<std::string> storage;
  std::vector<HostBytes> views;
  std::string expected;

  explicit Pieces(const std::vector<size_t>& sizes, uint32_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t size : sizes) {
      std::string bytes(size, '\0');
      for (size_t i = 0; i < size; i += 8) {
        const uint64_t word = rng();
        std::memcpy(bytes.data() + i, &word, std::min<size_t>(8, size - i));
      }
      expected += bytes;
      storage.push_back(std::move(bytes));
    }
    for (const std::string& s : storage) views.push_back({s.data(), s.size()});
  }
};

void ExpectGathered(ParallelCopier& copier, const std::vector<size_t>& sizes, uint32_t seed) {
  Pieces pieces(sizes, seed);
  // Guard bytes on both sides catch a write past either end.
  std::string dst(pieces.expected.size() + 128, '\x5a');
  copier.Gather(pieces.views, dst.data() + 64);
  EXPECT_EQ(dst.substr(64, pieces.expected.size()), pieces.expected);
  EXPECT_EQ(dst.substr(0, 64), std::string(64, '\x5a'));
  EXPECT_EQ(dst.substr(64 + pieces.expected.size()), std::string(64, '\x5a'));
}

TEST(ParallelCopierTest, SmallInputsAreCopiedByTheCallerAlone) {
  ParallelCopier copier(3);
  ExpectGathered(copier, {}, 1);
  ExpectGathered(copier, {0, 5, 0, 17}, 2);
  ExpectGathered(copier, {ParallelCopier::kMinParallelBytes - 1}, 3);
}

TEST(ParallelCopierTest, LargeInputsSplitAcrossPiecesLandInOrder) {
  ParallelCopier copier(3);
  const size_t min = ParallelCopier::kMinParallelBytes;
  ExpectGathered(copier, {min}, 4);
  ExpectGathered(copier, {min + 7}, 5);
  // Many pieces of odd sizes (a batch's parts), zero-length ones among them, so shares start
  // and end inside pieces and cover several.
  ExpectGathered(copier, {min / 3, 0, 1, min / 2 + 13, 4097, 0, min / 4 + 1, 63, 65}, 6);
}

TEST(ParallelCopierTest, WithoutHelpersTheCallerCopiesEverything) {
  ParallelCopier copier(0);
  ExpectGathered(copier, {ParallelCopier::kMinParallelBytes + 3, 11}, 7);
}

TEST(ParallelCopierTest, BackToBackGathersNeverMixTheirBytes) {
  // The helpers go through many generations; each Gather must see only its own pieces.
  ParallelCopier copier(2);
  std::mt19937 rng(8);
  for (int i = 0; i < 12; ++i) {
    std::vector<size_t> sizes;
    const int count = 1 + static_cast<int>(rng() % 6);
    for (int p = 0; p < count; ++p) sizes.push_back(rng() % (size_t{1} << 19));
    sizes.push_back(ParallelCopier::kMinParallelBytes + rng() % 4096);
    ExpectGathered(copier, sizes, 100 + i);
  }
}

}  // namespace
}  // namespace attnserve::engine
