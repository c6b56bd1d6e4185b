// Spellings that differ between the TensorFlow versions sok_graph builds
// against (1.15 as C++14, 2.15 and 2.21 as C++17). Kernels use these instead
// of version checks of their own.
#ifndef SOK_GRAPH_COMPAT_TF_COMPAT_H_
#define SOK_GRAPH_COMPAT_TF_COMPAT_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/threadpool.h"
#include "tensorflow/core/public/version.h"
// The TensorFlow major version, for the few places below that differ. TF 1.x
// and 2.x up to 2.15 define TF_MAJOR_VERSION in version.h; later releases
// move it to release_version.h, which expects it from the compiler's command
// line, and a pip installation's headers do not define it. That header only
// exists in TF 2.x.
#if defined(TF_MAJOR_VERSION)
#define SOK_GRAPH_TF_MAJOR TF_MAJOR_VERSION
#elif __has_include("tensorflow/core/public/release_version.h")
#define SOK_GRAPH_TF_MAJOR 2
#else
#error "sok_graph: cannot tell the TensorFlow major version from its headers"
#endif
// tf.config.experimental.enable_op_determinism's flag (TF 2.8 and later).
#if __has_include("tensorflow/core/util/determinism.h")
#include "tensorflow/core/util/determinism.h"
#define SOK_GRAPH_HAS_OP_DETERMINISM 1
#else
#define SOK_GRAPH_HAS_OP_DETERMINISM 0
#endif

namespace sok_graph {

#if SOK_GRAPH_TF_MAJOR < 2
// TF 1.x registers int64 tensors as `long long`; int64_t is `long` there.
using TfInt64 = ::tensorflow::int64;
#else
using TfInt64 = int64_t;
#endif

// The OK status: a default-constructed Status in every version
// (Status::OK() is gone in 2.x, OkStatus() does not exist in 1.x).
inline ::tensorflow::Status OkStatus() { return ::tensorflow::Status(); }

// Asks an allocator to fail at once instead of waiting for memory to be
// freed (1.x: no_retry_on_failure; 2.x: retry_on_failure). The attributes
// are not copyable in 2.x, so they are set in place.
inline void SetNoRetry(::tensorflow::AllocationAttributes* attributes) {
#if SOK_GRAPH_TF_MAJOR < 2
  attributes->no_retry_on_failure = true;
#else
  attributes->retry_on_failure = false;
#endif
}

// Whether the user asked for deterministic ops: TensorFlow's own flag
// (tf.config.experimental.enable_op_determinism, or TF_DETERMINISTIC_OPS,
// which it also reads) where the headers have it; the environment variable
// alone before that. Read at Compute time: the flag may be set after a
// kernel is built, and eager kernels are cached.
inline bool OpDeterminismRequired() {
#if SOK_GRAPH_HAS_OP_DETERMINISM
  return ::tensorflow::OpDeterminismRequired();
#else
  const char* v = std::getenv("TF_DETERMINISTIC_OPS");
  return v != nullptr && (std::strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0);
#endif
}

// Runs fn(begin, end) over [0, total) on the op's intra-op thread pool.
// `cost_per_unit` is a rough count of cycles for one unit of work.
template <typename Fn>
void ParallelFor(::tensorflow::OpKernelContext* ctx, int64_t total, int64_t cost_per_unit,
                 Fn&& fn) {
  if (total <= 0) return;
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  pool->ParallelFor(static_cast<TfInt64>(total), static_cast<TfInt64>(cost_per_unit),
                    [&fn](TfInt64 begin, TfInt64 end) {
                      fn(static_cast<int64_t>(begin), static_cast<int64_t>(end));
                    });
}

}  // namespace sok_graph

#endif  // SOK_GRAPH_COMPAT_TF_COMPAT_H_
