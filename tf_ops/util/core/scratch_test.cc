// Tests for tf_ops/util/core/scratch.h.
#include "tf_ops/util/core/scratch.h"

#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

TEST(ScratchTest, StartsEmptyOrSizedAndIsReusedByTheNextBorrow) {
  const int64_t* first = nullptr;
  {
    Scratch<int64_t, 0> s(1000);
    ASSERT_EQ(s->size(), 1000u);
    for (int64_t& v : *s) EXPECT_EQ(v, 0);
    (*s)[999] = 7;
    first = s->data();
  }
  {
    Scratch<int64_t, 0> s;  // the same vector, emptied
    EXPECT_TRUE(s->empty());
    s->resize(10);
    EXPECT_EQ(s->data(), first);  // no new allocation below the kept capacity
    for (int64_t v : *s) EXPECT_EQ(v, 0);
  }
}

TEST(ScratchTest, SlotsAreDistinctVectors) {
  Scratch<int64_t, 1> a(4);
  Scratch<int64_t, 2> b(4);
  EXPECT_NE(a->data(), b->data());
  (*a)[0] = 1;
  EXPECT_EQ((*b)[0], 0);
}

TEST(ScratchTest, ThreadsHaveTheirOwnVectors) {
  const int64_t* mine = nullptr;
  const int64_t* theirs = nullptr;
  Scratch<int64_t, 3> s(16);
  mine = s->data();
  std::thread([&theirs] {
    Scratch<int64_t, 3> t(16);
    theirs = t->data();
  }).join();
  EXPECT_NE(mine, theirs);
}

TEST(ScratchTest, ReleasesMemoryBeyondTheKeptSize) {
  const size_t big = Scratch<char, 4>::kKeepBytes + 1;
  {
    Scratch<char, 4> s(big);
    EXPECT_GE(s->capacity(), big);
  }
  {
    Scratch<char, 4> s;
    EXPECT_EQ(s->capacity(), 0u);  // released by the borrow before
    s->resize(16);
  }
  Scratch<char, 4> again;  // small: kept between borrows
  EXPECT_GE(again->capacity(), 16u);
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
