// Transparent huge pages for large arrays read at random (hash-table rows
// and index, embedding tables and their optimizer slots), so random reads
// cost far fewer TLB misses (on this project's machines, about twice the
// random-read throughput of a hash table; a fifth off the CPU lookup of
// rows not in cache):
//   - HugePageAllocator, a std::allocator replacement: blocks of 2 MiB or
//     more are 2 MiB aligned and advised to use huge pages;
//   - AdviseHugePages, for memory allocated elsewhere (TensorFlow's tensors).
// TF-independent; C++14; Linux (elsewhere the advice does nothing).
#ifndef SOK_GRAPH_TF_OPS_UTIL_CORE_HUGE_PAGE_ALLOCATOR_H_
#define SOK_GRAPH_TF_OPS_UTIL_CORE_HUGE_PAGE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sok_graph {
namespace core {

constexpr size_t kHugePageBytes = size_t{1} << 21;

// Advises the 2 MiB pages lying wholly inside [p, p + bytes) to be huge
// pages and, where the kernel can (Linux 6.1+, MADV_COLLAPSE), makes the
// ones already in use huge now rather than when the kernel's background
// scan gets to them. The memory's contents stay as they are; it costs a
// copy of the range, once. Advice only: every failure (an older kernel,
// huge pages disabled) is harmless and ignored. For host memory only.
inline void AdviseHugePages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uintptr_t last = (begin + bytes) & ~(kHugePageBytes - 1);
  if (last <= first) return;
  void* const start = reinterpret_cast<void*>(first);
  if (madvise(start, last - first, MADV_HUGEPAGE) != 0) return;
  constexpr int kCollapse = 25;  // MADV_COLLAPSE, absent from older headers
  madvise(start, last - first, kCollapse);
#else
  (void)p;
  (void)bytes;
#endif
}

template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    void* p = nullptr;
    if (bytes >= kHugePageBytes) {
      const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
      if (posix_memalign(&p, kHugePageBytes, rounded) != 0) throw std::bad_alloc();
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
