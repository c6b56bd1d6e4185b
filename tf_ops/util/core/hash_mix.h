// The key hash of sok_graph's hash sets and tables: murmur3's 64-bit
// finalizer, cheap, and it spreads sequential ids (the common case for row
// ids) over the whole table. One definition for the host (the CPU unique,
// the CPU dynamic table) and the device (the GPU dynamic table), so the CPU
// and GPU tables place a key alike. TF-independent; C++14.
#ifndef SOK_GRAPH_TF_OPS_UTIL_CORE_HASH_MIX_H_
#define SOK_GRAPH_TF_OPS_UTIL_CORE_HASH_MIX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SOK_HASH_HOST_DEVICE __host__ __device__
#else
#define SOK_HASH_HOST_DEVICE
#endif

namespace sok_graph {
namespace core {

SOK_HASH_HOST_DEVICE inline uint64_t MixHash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_UTIL_CORE_HASH_MIX_H_
