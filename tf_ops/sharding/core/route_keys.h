// The sender's side of a grouped exchange (sok_graph/exchange.py), as one
// computation: the ids of T tables become keys that name their table, the
// distinct keys are grouped by the worker that owns them, and each key is
// written as its owner reads it. TF-independent; C++14; the key arithmetic is
// usable from CUDA (route_keys.cu runs the same formulas).
//
// A key is id * T + table. Global row i of a distributed table lives on worker
// i % N as local row i // N, so the owner of key k is (k // T) mod N and the
// owner reads it as (k // (T N)) * T + k mod T: its local row, still naming
// the table (SokGroupedGather's key). A localized table (fixed_owner >= 0)
// lives whole on one worker, which reads the key as it is.
//
// Ids are checked against their tables after the exchange (the rows wait for
// the check, not the exchange), so a bad id, negative or past its table, must
// still give a key, an owner in [0, N) and some local key: floor division and
// two's complement wrapping (as TensorFlow's int64 arithmetic wraps) do that.
#ifndef SOK_GRAPH_TF_OPS_SHARDING_CORE_ROUTE_KEYS_H_
#define SOK_GRAPH_TF_OPS_SHARDING_CORE_ROUTE_KEYS_H_

#include <cstdint>

#ifndef __CUDACC__
#include <vector>

#include "tf_ops/sharding/core/bucketize.h"
#include "tf_ops/util/core/unique.h"
#endif

#ifdef __CUDACC__
#define SOK_ROUTE_FN __host__ __device__ inline
#else
#define SOK_ROUTE_FN inline
#endif

namespace sok_graph {
namespace core {

// a // b and a mod b rounded towards minus infinity (b > 0), as tf.math.floordiv
// and tf.math.floormod.
SOK_ROUTE_FN int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
SOK_ROUTE_FN int64_t FloorMod(int64_t a, int64_t b) {
  const int64_t r = a % b;
  return r < 0 ? r + b : r;
}

// id * num_tables + table, wrapping on overflow.
SOK_ROUTE_FN int64_t GroupedKey(int64_t id, int64_t table, int64_t num_tables) {
  return static_cast<int64_t>(static_cast<uint64_t>(id) * static_cast<uint64_t>(num_tables) +
                              static_cast<uint64_t>(table));
}

SOK_ROUTE_FN int64_t GroupedKeyOwner(int64_t key, int64_t num_tables, int64_t world_size,
                                     int64_t fixed_owner) {
  return fixed_owner >= 0 ? fixed_owner : FloorMod(FloorDiv(key, num_tables), world_size);
}

SOK_ROUTE_FN int64_t GroupedKeyOnOwner(int64_t key, int64_t num_tables, int64_t world_size,
                                       int64_t fixed_owner) {
  if (fixed_owner >= 0) return key;
  const int64_t row = FloorDiv(FloorDiv(key, num_tables), world_size);
  return GroupedKey(row, FloorMod(key, num_tables), num_tables);
}

#ifndef __CUDACC__
// The whole computation on the CPU, for n ids with their tables (each in
// [0, num_tables)):
//   sent[0, d) the d distinct keys as their owners read them, grouped by
//   owner (owners non-decreasing, keys in order of first appearance within
//   an owner); sent[d, n) = -1;
//   sizes[w] (w < world_size) how many of them go to worker w;
//   slots[i] the position in `sent` of id i's key.
inline void RouteGroupedKeys(const int64_t* ids, const int64_t* tables, int64_t n,
                             int64_t num_tables, int64_t world_size, int64_t fixed_owner,
                             int64_t* sent, int64_t* sizes, int64_t* slots) {
  std::vector<int64_t> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keys[i] = GroupedKey(ids[i], tables[i], num_tables);
  std::vector<int64_t> distinct;
  // slots first holds each id's index among the distinct keys.
  UniqueWithInverse<int64_t, int64_t>(keys.data(), n, &distinct, slots, nullptr);
  const int64_t d = static_cast<int64_t>(distinct.size());
  std::vector<int64_t> owners(static_cast<size_t>(d)), by_owner(static_cast<size_t>(d)),
      permutation(static_cast<size_t>(d)), inverse(static_cast<size_t>(d));
  for (int64_t j = 0; j < d; ++j) {
    owners[j] = GroupedKeyOwner(distinct[j], num_tables, world_size, fixed_owner);
  }
  // Owners are ids of themselves here: worker w owns w (w < world_size).
  BucketizeByOwner(owners.data(), d, world_size, -1, by_owner.data(), sizes, permutation.data(),
                   inverse.data());
  for (int64_t k = 0; k < d; ++k) {
    sent[k] = GroupedKeyOnOwner(distinct[permutation[k]], num_tables, world_size, fixed_owner);
  }
  for (int64_t k = d; k < n; ++k) sent[k] = -1;
  for (int64_t i = 0; i < n; ++i) slots[i] = inverse[slots[i]];
}
#endif  // __CUDACC__

}  // namespace core
}  // namespace sok_graph

#undef SOK_ROUTE_FN

#endif  // SOK_GRAPH_TF_OPS_SHARDING_CORE_ROUTE_KEYS_H_
