// Tests for tf_ops/util/core/huge_page_allocator.h: the advice never changes
// memory's contents, whatever the range (unaligned, smaller than a huge
// page, empty), and the allocator's blocks hold what is written to them.
#include "tf_ops/util/core/huge_page_allocator.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

std::vector<uint32_t> Pattern(size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u);
  return v;
}

TEST(AdviseHugePagesTest, KeepsContentsOfAnyRange) {
  // 9 MiB + a little, written before the advice (as a tensor would be),
  // advised from an unaligned start: the interior 2 MiB pages are
  // collapsed where the kernel can, the edges left as they are.
  const size_t n = (size_t{9} << 20) / sizeof(uint32_t) + 123;
  const std::vector<uint32_t> want = Pattern(n);
  std::vector<uint32_t> buffer = want;
  AdviseHugePages(buffer.data() + 5, (n - 5) * sizeof(uint32_t));
  EXPECT_EQ(buffer, want);
  // Ranges holding no whole huge page, and an empty one: nothing happens.
  AdviseHugePages(buffer.data() + 1, kHugePageBytes - 8);
  AdviseHugePages(buffer.data(), 0);
  AdviseHugePages(nullptr, 0);
  EXPECT_EQ(buffer, want);
  // The memory stays usable.
  for (uint32_t& x : buffer) x += 1;
  for (size_t i = 0; i < n; i += 4099) EXPECT_EQ(buffer[i], want[i] + 1);
}

TEST(HugePageAllocatorTest, LargeAndSmallBlocksHoldTheirValues) {
  for (size_t n : {size_t{10}, (size_t{5} << 20) / sizeof(uint32_t) + 7}) {
    std::vector<uint32_t, HugePageAllocator<uint32_t>> v(n);
    const std::vector<uint32_t> want = Pattern(n);
    std::copy(want.begin(), want.end(), v.begin());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), v.begin()));
    if (n * sizeof(uint32_t) >= kHugePageBytes) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
    }
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
