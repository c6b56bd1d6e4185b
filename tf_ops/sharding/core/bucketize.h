// Model-parallel placement of ids: which worker owns an id, the permutation
// that groups ids by owner (and the one that undoes it), and the row an id
// occupies in its owner's shard. TF-independent; C++14.
//
// Distributed tables: global row i lives on worker i % N as local row i // N.
// Localized tables: every row lives on one fixed worker under its own id.
#ifndef SOK_GRAPH_TF_OPS_SHARDING_CORE_BUCKETIZE_H_
#define SOK_GRAPH_TF_OPS_SHARDING_CORE_BUCKETIZE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sok_graph {
namespace core {

// The first position holding a negative id, or -1.
template <typename K>
int64_t FirstNegative(const K* ids, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0) return i;
  }
  return -1;
}

// fixed_owner >= 0: every id belongs to that worker; otherwise id % world_size.
template <typename K>
inline int64_t OwnerOf(K id, int64_t world_size, int64_t fixed_owner) {
  return fixed_owner >= 0 ? fixed_owner : static_cast<int64_t>(id) % world_size;
}

// Stable counting sort of non-negative ids by owner:
//   bucketed[k] = ids[permutation[k]], owners non-decreasing along k;
//   inverse[permutation[k]] = k, so bucketed rows are put back in input order
//   by gathering with `inverse`;
//   sizes[w] = number of ids owned by worker w.
template <typename K>
void BucketizeByOwner(const K* ids, int64_t n, int64_t world_size, int64_t fixed_owner,
                      K* bucketed, int64_t* sizes, int64_t* permutation, int64_t* inverse) {
  std::vector<int64_t> next(static_cast<size_t>(world_size), 0);
  for (int64_t w = 0; w < world_size; ++w) sizes[w] = 0;
  for (int64_t i = 0; i < n; ++i) ++sizes[OwnerOf(ids[i], world_size, fixed_owner)];
  for (int64_t w = 1; w < world_size; ++w) next[w] = next[w - 1] + sizes[w - 1];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = next[OwnerOf(ids[i], world_size, fixed_owner)]++;
    bucketed[k] = ids[i];
    permutation[k] = i;
    inverse[i] = k;
  }
}

// The row a (non-negative) id occupies on its owner: id // world_size.
template <typename K>
void LocalRows(const K* ids, int64_t begin, int64_t end, int64_t world_size, K* out) {
  for (int64_t i = begin; i < end; ++i) out[i] = static_cast<K>(ids[i] / world_size);
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_SHARDING_CORE_BUCKETIZE_H_
