// A std::allocator replacement for large arrays read at random (hash-table
// rows and index): blocks of 2 MiB or more are 2 MiB aligned and advised to
// use transparent huge pages, so random reads cost far fewer TLB misses (on
// this project's machines, about twice the random-read throughput).
// TF-independent; C++14; Linux (elsewhere it is a plain allocator).
#ifndef SOK_GRAPH_TF_OPS_UTIL_CORE_HUGE_PAGE_ALLOCATOR_H_
#define SOK_GRAPH_TF_OPS_UTIL_CORE_HUGE_PAGE_ALLOCATOR_H_

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sok_graph {
namespace core {

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHugePage = size_t{1} << 21;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    void* p = nullptr;
    if (bytes >= kHugePage) {
      const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
      if (posix_memalign(&p, kHugePage, rounded) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
    } else {
      p = std::malloc(bytes > 0 ? bytes : 1);
      if (p == nullptr) throw std::bad_alloc();
    }
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }

  // Elements a resize() adds are default-initialised: left as they are for
  // arithmetic types, not zeroed. The table writes every row it appends
  // (initializer, import) right after appending it, and zeroing first was
  // a second pass over each new row.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T, typename U>
bool operator==(const HugePageAllocator<T>&, const HugePageAllocator<U>&) {
  return true;
}
template <typename T, typename U>
bool operator!=(const HugePageAllocator<T>&, const HugePageAllocator<U>&) {
  return false;
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_UTIL_CORE_HUGE_PAGE_ALLOCATOR_H_
