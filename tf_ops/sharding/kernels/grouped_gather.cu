// CUDA kernels behind SokGroupedGather and SokGroupedGatherGrad (see
// grouped_gather_launcher.h). One thread per unit of a row (16, 8, 4 or 2
// bytes, the widest that divides the row), so a warp reads or writes
// contiguous memory whatever the dimension.
#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/sharding/kernels/grouped_gather_launcher.h"

namespace {

using sok_graph::cuda::Grid;

template <typename U>
__global__ void GatherKernel(const int64_t* __restrict__ tables, int64_t num_tables,
                             const int64_t* __restrict__ keys, int64_t n, int64_t units,
                             U* __restrict__ out) {
  SOK_FOR_EACH(e, n * units) {
    const int64_t i = e / units;
    const int64_t u = e - i * units;
    const int64_t key = keys[i];
    U value{};
    if (key >= 0) {
      const int64_t t = key % num_tables;
      const int64_t row = key / num_tables;
      if (row < tables[2 * t + 1]) {
        value = reinterpret_cast<const U*>(tables[2 * t])[row * units + u];
      }
    }
    out[e] = value;
  }
}

template <typename U>
__global__ void GatherGradKernel(const int64_t* __restrict__ outputs, int num_tables,
                                 const int64_t* __restrict__ keys,
                                 const int64_t* __restrict__ permutation, int64_t n,
                                 int64_t units, const U* __restrict__ grads) {
  const int64_t* offsets = outputs;
  // Positions past the last table's (offsets[num_tables] <= n) are padding.
  const int64_t grouped = offsets[num_tables];
  SOK_FOR_EACH(e, grouped * units) {
    const int64_t p = e / units;
    const int64_t u = e - p * units;
    int lo = 0, hi = num_tables;  // the table t with offsets[t] <= p < offsets[t + 1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (offsets[mid] <= p) lo = mid; else hi = mid;
    }
    const int64_t j = p - offsets[lo];
    // A position whose key is not one of table lo's (a permutation or
    // table_sizes that do not group the keys by table, a negative key) gets
    // the index -1 and a zero row, which every scatter drops: the CPU
    // kernel reports such input, the GPU's cannot without a wait.
    const int64_t source = permutation[p];
    const int64_t key = source >= 0 && source < n ? keys[source] : -1;
    const bool ok = key >= 0 && key % num_tables == lo;
    U* values = reinterpret_cast<U*>(outputs[num_tables + 1 + num_tables + lo]);
    values[j * units + u] = ok ? grads[source * units + u] : U{};
    if (u == 0) {
      int64_t* indices = reinterpret_cast<int64_t*>(outputs[num_tables + 1 + lo]);
      indices[j] = ok ? key / num_tables : -1;
    }
  }
}

template <typename U>
int LaunchGather(const int64_t* tables, int num_tables, const int64_t* keys, int64_t n,
                 int64_t row_bytes, void* out, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  GatherKernel<U><<<Grid(n * units), 256, 0, stream>>>(
      tables, num_tables, keys, n, units, static_cast<U*>(out));
  return static_cast<int>(cudaGetLastError());
}

template <typename U>
int LaunchGrad(const int64_t* outputs, int num_tables, const int64_t* keys,
               const int64_t* permutation, int64_t n, const void* grads, int64_t row_bytes,
               cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  GatherGradKernel<U><<<Grid(n * units), 256, 0, stream>>>(
      outputs, num_tables, keys, permutation, n, units, static_cast<const U*>(grads));
  return static_cast<int>(cudaGetLastError());
}

// The widest copy unit, at most max_unit_bytes (what every buffer's address
// is a multiple of), that divides a row: every row is then aligned to it.
int UnitBytes(int64_t row_bytes, int max_unit_bytes) {
  for (int unit : {16, 8, 4}) {
    if (unit <= max_unit_bytes && row_bytes % unit == 0) return unit;
  }
  return 2;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int sok_grouped_gather(
    const int64_t* tables, int num_tables, const int64_t* keys, int64_t n, int64_t row_bytes,
    int max_unit_bytes, void* out, void* stream) {
  if (n <= 0 || row_bytes <= 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (UnitBytes(row_bytes, max_unit_bytes)) {
    case 16: return LaunchGather<uint4>(tables, num_tables, keys, n, row_bytes, out, s);
    case 8: return LaunchGather<uint2>(tables, num_tables, keys, n, row_bytes, out, s);
    case 4: return LaunchGather<uint32_t>(tables, num_tables, keys, n, row_bytes, out, s);
    default: return LaunchGather<uint16_t>(tables, num_tables, keys, n, row_bytes, out, s);
  }
}

__attribute__((visibility("default"))) int sok_grouped_gather_grad(
    const int64_t* outputs, int num_tables, const int64_t* keys, const int64_t* permutation,
    int64_t n, const void* grads, int64_t row_bytes, int max_unit_bytes, void* stream) {
  if (n <= 0 || row_bytes <= 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (UnitBytes(row_bytes, max_unit_bytes)) {
    case 16:
      return LaunchGrad<uint4>(outputs, num_tables, keys, permutation, n, grads, row_bytes, s);
    case 8:
      return LaunchGrad<uint2>(outputs, num_tables, keys, permutation, n, grads, row_bytes, s);
    case 4:
      return LaunchGrad<uint32_t>(outputs, num_tables, keys, permutation, n, grads, row_bytes,
                                  s);
    default:
      return LaunchGrad<uint16_t>(outputs, num_tables, keys, permutation, n, grads, row_bytes,
                                  s);
  }
}

}  // extern "C"
