// What every CUDA source of the launchers uses: the error-return macro, the
// grid-stride loop and its grid size, scratch alignment, and an iota kernel.
// Compiled into each .cu that includes it (internal linkage); plain CUDA, no
// TensorFlow headers.
#ifndef SOK_GRAPH_TF_OPS_COMMON_CUDA_HELPERS_CUH_
#define SOK_GRAPH_TF_OPS_COMMON_CUDA_HELPERS_CUH_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

// Returns the cudaError_t of `expr` (as an int) from the enclosing launcher
// when it failed.
#define SOK_CUDA(expr)                                              \
  do {                                                              \
    const cudaError_t sok_err_ = (expr);                            \
    if (sok_err_ != cudaSuccess) return static_cast<int>(sok_err_); \
  } while (0)

// A grid-stride loop over [0, n) of 64-bit indices.
#define SOK_FOR_EACH(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

namespace sok_graph {
namespace cuda {
namespace {

// Blocks of 256 threads for `items`, at least 1, at most 8192 (the loops
// stride over the rest).
inline unsigned Grid(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + 255) / 256, 8192)));
}

// Scratch pieces start at 256-byte boundaries (what CUB's temporary storage
// and vector loads want).
inline size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }

__global__ void Iota(int64_t* out, int64_t n) {
  SOK_FOR_EACH(i, n) out[i] = i;
}

}  // namespace
}  // namespace cuda
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_COMMON_CUDA_HELPERS_CUH_
