// CUDA kernel of SokSparseApply (see sparse_apply_launcher.h).
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/optimizer/core/sparse_apply.h"
#include "tf_ops/optimizer/kernels/sparse_apply_launcher.h"

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

using sok_graph::core::SparseApplyConfig;

__device__ __forceinline__ int TableOf(const int64_t* offsets, int n, int64_t row) {
  int lo = 0, hi = n - 1;  // the last table whose offset <= row
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__global__ void SparseApplyKernel(const SokSparseApplyTable* tables, const int64_t* offsets,
                                  int n, int64_t total, SparseApplyConfig config,
                                  const float* hyper_dev, const int64_t* step) {
  __shared__ float hyper[sok_graph::core::kNumHyper];
  __shared__ float alpha;
  sok_graph::core::LoadHyperIntoBlock(config, hyper_dev, step, hyper, &alpha);
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       r < total; r += warps) {
    const int t = TableOf(offsets, n, r);
    const SokSparseApplyTable& tb = tables[t];
    const int64_t i = r - offsets[t];
    const int64_t row = tb.index_bytes == 8 ? static_cast<const int64_t*>(tb.indices)[i]
                                            : static_cast<const int32_t*>(tb.indices)[i];
    if (static_cast<uint64_t>(row) >= static_cast<uint64_t>(tb.rows)) continue;
    const int64_t base = row * tb.dim;
    const float* g = tb.grads + i * tb.dim;
    for (int d = lane; d < tb.dim; d += kWarp) {
      sok_graph::core::ApplyElement(config, hyper, alpha, g[d], tb.var + base + d,
                                    tb.slot0 ? tb.slot0 + base + d : nullptr,
                                    tb.slot1 ? tb.slot1 + base + d : nullptr,
                                    tb.slot2 ? tb.slot2 + base + d : nullptr);
    }
  }
}

// One thread per element of n contiguous rows (the rows a dynamic table's
// update gathered into scratch).
__global__ void DenseApplyKernel(float* __restrict__ rows, float* __restrict__ slot0,
                                 float* __restrict__ slot1, float* __restrict__ slot2,
                                 const float* __restrict__ grads,
                                 int64_t total, SparseApplyConfig config,
                                 const float* hyper_dev, const int64_t* step) {
  __shared__ float hyper[sok_graph::core::kNumHyper];
  __shared__ float alpha;
  sok_graph::core::LoadHyperIntoBlock(config, hyper_dev, step, hyper, &alpha);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    sok_graph::core::ApplyElement(config, hyper, alpha, grads[i], rows + i,
                                  slot0 ? slot0 + i : nullptr, slot1 ? slot1 + i : nullptr,
                                  slot2 ? slot2 + i : nullptr);
  }
}

}  // namespace

#define SOK_EXPORT extern "C" __attribute__((visibility("default")))

SOK_EXPORT int sok_sparse_apply_f32(const SokSparseApplyTable* tables,
                                    const int64_t* row_offsets, int num_tables,
                                    int64_t total_rows, int algorithm, int formulas, int nesterov,
                                    const float* hyper, const int64_t* step, void* stream) {
  if (total_rows <= 0) return 0;
  SparseApplyConfig config{algorithm, formulas, nesterov};
  const int64_t blocks_needed = (total_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int blocks = static_cast<int>(blocks_needed < 65536 ? blocks_needed : 65536);
  SparseApplyKernel<<<blocks, kWarp * kWarpsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      tables, row_offsets, num_tables, total_rows, config, hyper, step);
  return static_cast<int>(cudaGetLastError());
}

SOK_EXPORT int sok_dense_apply_f32(float* rows, float* slot0, float* slot1, float* slot2,
                                   const float* grads,
                                   int64_t n, int64_t dim, int algorithm, int formulas, int nesterov,
                                   const float* hyper, const int64_t* step, void* stream) {
  const int64_t total = n * dim;
  if (total <= 0) return 0;
  SparseApplyConfig config{algorithm, formulas, nesterov};
  const int64_t blocks_needed = (total + 255) / 256;
  const int blocks = static_cast<int>(blocks_needed < 65536 ? blocks_needed : 65536);
  DenseApplyKernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      rows, slot0, slot1, slot2, grads, total, config, hyper, step);
  return static_cast<int>(cudaGetLastError());
}
