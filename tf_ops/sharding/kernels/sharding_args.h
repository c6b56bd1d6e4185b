// The bucketing and local-rows ops' id check, in one place for their CPU
// (sharding_kernels.cc) and GPU (sharding_kernels_gpu.cc) kernels.
#ifndef SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_ARGS_H_
#define SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_ARGS_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/sharding/core/bucketize.h"

namespace sok_graph {

// The error for the first negative id, `id` at `position`.
inline ::tensorflow::Status NegativeIdError(int64_t id, int64_t position) {
  return ::tensorflow::errors::InvalidArgument("ids must be >= 0 to have an owner; got ", id,
                                               " at position ", position);
}

// Every id must be >= 0 to have an owner; `ids` in host memory.
template <typename K>
::tensorflow::Status CheckNonNegative(const K* ids, int64_t n) {
  const int64_t bad = core::FirstNegative(ids, n);
  if (bad < 0) return OkStatus();
  return NegativeIdError(static_cast<int64_t>(ids[bad]), bad);
}

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_ARGS_H_
