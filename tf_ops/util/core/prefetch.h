// Software prefetching of data about to be read at random (embedding rows,
// hash-table entries): issued a few iterations ahead, it overlaps memory
// latency that out-of-order execution alone cannot. TF-independent; C++14.
#ifndef SOK_GRAPH_TF_OPS_UTIL_CORE_PREFETCH_H_
#define SOK_GRAPH_TF_OPS_UTIL_CORE_PREFETCH_H_

#include <cstdint>

namespace sok_graph {
namespace core {

// Prefetches the cache line holding address `line`, with low temporal
// locality (prefetcht2, what __builtin_prefetch(p, 0, 1) emits): the data is
// used a few iterations later, once.
inline void PrefetchLine(uintptr_t line) {
#if defined(__x86_64__)
  // An asm statement, not __builtin_prefetch: gcc 12 (-O2, whose
  // -ffinite-loops lets it delete loops without side effects) removed a
  // loop of __builtin_prefetch over a row's lines entirely wherever the row
  // address came from a table object, and with it every row prefetch of
  // the hash table. A volatile asm statement is never removed.
  asm volatile("prefetcht2 %0" : : "m"(*reinterpret_cast<const char*>(line)));
#else
  __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 1);
#endif
}

// Prefetches every cache line of [p, p + bytes) for reading. Rows are
// rarely aligned to cache lines, so a 64-byte row usually spans two.
inline void PrefetchSpan(const void* p, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t last = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) - 1;
  for (uintptr_t line = first; line <= last; line += 64) PrefetchLine(line);
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_UTIL_CORE_PREFETCH_H_
