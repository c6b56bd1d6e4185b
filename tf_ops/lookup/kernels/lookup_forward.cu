// CUDA forward of the fused lookup (see lookup_launcher.h).
#include <cuda_runtime.h>

#include "tf_ops/lookup/kernels/lookup_launcher.h"

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float CombinerScale(int combiner, float wsum, float wsq) {
  if (combiner == 1) return wsum != 0.0f ? 1.0f / wsum : 0.0f;
  if (combiner == 2) return wsq > 0.0f ? rsqrtf(wsq) : 0.0f;
  return 1.0f;
}

// One warp per sample. Lanes cover the row in float4 chunks when the
// dimension and the table allow, else in single floats; ids are read once
// per warp and broadcast.
template <bool kVec4>
__global__ void LookupForwardKernel(const SokLookupTable* __restrict__ tables,
                                    const int64_t* __restrict__ sample_offsets, int num_tables,
                                    int64_t total) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= total) return;
  int lo = 0, hi = num_tables;  // the table holding global sample `warp`
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (sample_offsets[mid] <= warp) lo = mid; else hi = mid;
  }
  const SokLookupTable t = tables[lo];
  const int64_t b = warp - sample_offsets[lo];
  const int64_t begin = t.row_splits[b], end = t.row_splits[b + 1];
  float wsum = 0.0f, wsq = 0.0f;
  const int chunks = t.dim / 4;
  if (kVec4 && chunks <= kWarp / 2 && (chunks & (chunks - 1)) == 0) {
    // Narrow rows (dim 4, 8, 16, 32 or 64): `chunks` lanes read one row, so the warp works
    // on 32 / chunks ids at once; the groups are then summed by a fixed
    // shuffle tree, so the result is the same on every run.
    const int groups = kWarp / chunks;
    const int g = lane / chunks, c = lane % chunks;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t j = begin + g; j < end; j += groups) {
      const int64_t id = __ldg(t.ids + j);
      const float w = t.weights ? __ldg(t.weights + j) : 1.0f;
      const float4 r = __ldg(reinterpret_cast<const float4*>(t.params + id * t.dim) + c);
      acc.x += w * r.x;
      acc.y += w * r.y;
      acc.z += w * r.z;
      acc.w += w * r.w;
    }
    for (int off = kWarp / 2; off >= chunks; off /= 2) {
      acc.x += __shfl_down_sync(0xffffffffu, acc.x, off);
      acc.y += __shfl_down_sync(0xffffffffu, acc.y, off);
      acc.z += __shfl_down_sync(0xffffffffu, acc.z, off);
      acc.w += __shfl_down_sync(0xffffffffu, acc.w, off);
    }
    if (t.combiner != 0) {
      if (t.weights) {
        for (int64_t j = begin; j < end; ++j) {
          const float w = __ldg(t.weights + j);
          wsum += w;
          wsq += w * w;
        }
      } else {
        wsum = wsq = static_cast<float>(end - begin);
      }
    }
    if (lane < chunks) {
      const float s = CombinerScale(t.combiner, wsum, wsq);
      reinterpret_cast<float4*>(t.out + b * t.dim)[c] =
          make_float4(acc.x * s, acc.y * s, acc.z * s, acc.w * s);
    }
    return;
  }
  if (kVec4) {
    for (int c0 = 0; c0 < chunks; c0 += kWarp) {
      const int c = c0 + lane;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      wsum = wsq = 0.0f;
      for (int64_t j = begin; j < end; ++j) {
        const int64_t id = __ldg(t.ids + j);
        const float w = t.weights ? __ldg(t.weights + j) : 1.0f;
        wsum += w;
        wsq += w * w;
        if (c < chunks) {
          const float4 r = __ldg(reinterpret_cast<const float4*>(t.params + id * t.dim) + c);
          acc.x += w * r.x;
          acc.y += w * r.y;
          acc.z += w * r.z;
          acc.w += w * r.w;
        }
      }
      if (c < chunks) {
        const float s = CombinerScale(t.combiner, wsum, wsq);
        reinterpret_cast<float4*>(t.out + b * t.dim)[c] =
            make_float4(acc.x * s, acc.y * s, acc.z * s, acc.w * s);
      }
    }
  } else {
    for (int d0 = 0; d0 < t.dim; d0 += kWarp) {
      const int d = d0 + lane;
      float acc = 0.0f;
      wsum = wsq = 0.0f;
      for (int64_t j = begin; j < end; ++j) {
        const int64_t id = __ldg(t.ids + j);
        const float w = t.weights ? __ldg(t.weights + j) : 1.0f;
        wsum += w;
        wsq += w * w;
        if (d < t.dim) acc += w * __ldg(t.params + id * t.dim + d);
      }
      if (d < t.dim) t.out[b * t.dim + d] = acc * CombinerScale(t.combiner, wsum, wsq);
    }
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_lookup_forward_f32(
    const SokLookupTable* tables, const int64_t* sample_offsets, int num_tables,
    int64_t total_samples, int vectorized, void* stream) {
  if (total_samples <= 0) return 0;
  const int threads = kWarp * kWarpsPerBlock;
  const int64_t blocks = (total_samples + kWarpsPerBlock - 1) / kWarpsPerBlock;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (vectorized) {
    LookupForwardKernel<true><<<static_cast<unsigned>(blocks), threads, 0, s>>>(
        tables, sample_offsets, num_tables, total_samples);
  } else {
    LookupForwardKernel<false><<<static_cast<unsigned>(blocks), threads, 0, s>>>(
        tables, sample_offsets, num_tables, total_samples);
  }
  return static_cast<int>(cudaGetLastError());
}
