// The fused lookup's dense gradient in no fixed order
// (sok_lookup_backward_dense_unordered and _atomics, see lookup_launcher.h),
// apart from the ordered plan (lookup_backward_plan.cu), whose sort it
// does without; what both use is in lookup_backward_internal.cuh.
//
// Dense gradients in no fixed order (sok_lookup_backward_dense_unordered):
// no sort and no plan. Each (sample, column) adds its factor times its
// upstream row straight into the rows of its ids with float atomics, as
// TensorFlow's own scatter-add and unsorted segment sum do on the GPU; only
// the order of the additions, so the rounding, differs from the ordered
// plan. A DemoModel step's 8.2M positions read their gradient rows in
// order (coalesced) instead of in sorted order (a random read each) after a
// sort of all positions.
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/lookup/kernels/lookup_backward_internal.cuh"
#include "tf_ops/lookup/kernels/lookup_launcher.h"

namespace sok_graph {
namespace lookup_backward {
namespace {

// Row 0 of the check: each table's first position of an id outside
// [0, rows), before any row is written, so that such a table is left whole
// (CheckFailed) rather than summed in part.
__global__ void DenseCheckIds(const SokLookupTable* __restrict__ tables,
                              int64_t* __restrict__ first_bad) {
  const SokLookupTable tb = tables[blockIdx.y];
  SOK_FOR_EACH(j, tb.nnz) ReportIfBad(tb, j, LoadId(tb, j), first_bad + blockIdx.y);
}

// Whether a table's batch x dim gradient items, and the overshoot of a
// grid-stride index past them, fit the 32-bit index loops of the dense
// kernels (64-bit division is emulated; those loops are otherwise a load
// and an atomic).
__device__ __forceinline__ bool NarrowItems(const SokLookupTable& tb) {
  return tb.batch * tb.dim < UINT32_MAX / 2;
}

// A float addition into global memory whose result nothing reads. nvcc
// compiles atomicAdd so to a reduction (RED); clang, which builds the
// package, kept an atomic that returns the old value, and the package's
// dense gradients took 1.4-1.7x nvcc's time on an H100 (8.2M one-id
// positions into 8192 rows 0.54 against 0.38 ms; 64 samples of 4096 ids
// 0.54 against 0.31). Under clang the reduction is written out in PTX
// (0.44 and 0.45 ms); under nvcc that was slower (0.44 against 0.38), so
// nvcc keeps atomicAdd. No memory clobber: nothing in the kernels that add
// this way reads the rows they add to. (Shared memory keeps atomicAdd: a
// PTX reduction there gained nothing under clang and lost under nvcc.)
__device__ __forceinline__ void AddToGlobal(float* p, float v) {
#if defined(__clang__)
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v));
#else
  atomicAdd(p, v);
#endif
}

// Hot ids among one-id samples (a table without row_splits). Each of a
// row's atomics queues on the same place in L2, so a hot id serialises
// DenseTable (H100, 8.2M positions in 200,000 rows, half on one id: 8.4 ms,
// a tenth on one id: 2.1 ms, against 0.4 for uniform ids). DenseRepeats
// takes such tables: a warp takes 32 samples at a time (a window) and finds
// those that share an id (__match_any_sync, once per window); the lowest
// sample of each group adds the group's rows, summed in registers, with one
// atomic per column, so a hot id costs an atomic per column per window
// (1.2 and 0.93 ms; Zipf(1.2) ids in 1M rows 4.7 -> 1.8 ms). For ids that
// seldom repeat it was slower than DenseTable (0.53 against 0.39 ms,
// unexplained: not its instruction count, registers, the match or the
// order it reads the gradient in), so a probe of a few windows decides.
//
// R holds an id: 32 bits when every id and the padding lanes' stand-ins
// fit (FitsRow32), else 64.
template <typename R>
__device__ __forceinline__ R PaddingId(unsigned lane);
template <>
__device__ __forceinline__ unsigned PaddingId<unsigned>(unsigned lane) {
  return 0xffffffffu - lane;
}
template <>
__device__ __forceinline__ long long PaddingId<long long>(unsigned lane) {
  return -1 - static_cast<long long>(lane);
}
__device__ __forceinline__ bool FitsRow32(const SokLookupTable& tb) {
  return tb.rows <= 0xffffffffLL - 32;
}

constexpr unsigned kWarpLanes = 0xffffffffu;

// The id of sample b, or (b past the batch) the lane's stand-in that no id
// (checked ids are in [0, rows)) and no other lane has; and which lanes of
// the warp lead a group of equal ids (the lowest lane of each).
template <typename R>
__device__ __forceinline__ R WindowId(const SokLookupTable& tb, int64_t b, unsigned lane) {
  return b < tb.batch ? static_cast<R>(LoadId(tb, b)) : PaddingId<R>(lane);
}
template <typename R>
__device__ __forceinline__ unsigned WindowLeaders(R id, unsigned lane, unsigned* group) {
  *group = __match_any_sync(kWarpLanes, id);
  return __ballot_sync(kWarpLanes, (*group & ((1u << lane) - 1u)) == 0u);
}

// The probe (ProbeRepeats, a warp per table): kProbeWindows windows of 32
// samples spread over the batch; DenseRepeats when their samples that
// repeat an earlier one of their window number at least kProbeRepeats (one
// a window on average) more than twice what uniform ids would give. Those
// repeat about 32 x 31 / 2 / R = 496 / R times a window on R rows (at most
// 31) and are summed faster by the slices or DenseTable (400 rows x 128:
// 0.28 ms in slices, 0.52 in DenseRepeats); an id on a tenth of the
// samples repeats about 2.2 times a window. The probe writes its choice to
// the table's SokLookupGradTable.path, which the three kernels read (a
// probe in every block of DenseRows slowed it by half, even for the tables
// it skipped).
constexpr int kProbeWindows = 8;
constexpr int kProbeRepeats = 8;
constexpr int32_t kPathRepeats = 1;
// Tables of fewer items are not probed (path 0): a probe and a launch cost
// about 13 us, what half of 2^20 items on one id costs DenseTable.
constexpr int64_t kProbeItems = int64_t{1} << 20;
__host__ __device__ inline bool Probed(const SokLookupTable& tb) {
  return tb.row_splits == nullptr && tb.batch * tb.dim >= kProbeItems;
}
__device__ __forceinline__ bool TakesRepeats(const SokLookupTable& tb,
                                             const SokLookupGradTable& out) {
  return Probed(tb) && out.path == kPathRepeats;
}
__device__ __forceinline__ double RepeatsNeeded(int64_t rows) {
  const double uniform = rows > 16 ? 496.0 / static_cast<double>(rows) : 31.0;
  return kProbeRepeats + 2.0 * kProbeWindows * uniform;
}
template <typename R>
__device__ __forceinline__ int WindowsRepeats(const SokLookupTable& tb) {
  const unsigned lane = threadIdx.x & 31u;
  const int64_t last = tb.batch > 32 ? tb.batch - 32 : 0;
  R ids[kProbeWindows];
#pragma unroll
  for (int q = 0; q < kProbeWindows; ++q) {
    ids[q] = WindowId<R>(tb, last * q / (kProbeWindows - 1) + lane, lane);
  }
  int repeats = 0;
#pragma unroll
  for (int q = 0; q < kProbeWindows; ++q) {
    unsigned group = 0;
    repeats += 32 - __popc(WindowLeaders(ids[q], lane, &group));
  }
  return repeats;
}

// A window's 32 samples x dim items, 32 at a time: lane k of pass p takes
// item 32p + k, (sample, column) side by side as DenseTable lays them out;
// a pass's loads are issued kRepeatLoads at a time (a whole window of dim
// 16, 512 floats, at once: 0.56 -> 0.52 ms on the DemoModel's shape).
constexpr int kRepeatLoads = 16;
template <typename I, typename R>
__device__ __forceinline__ void DenseRepeats(const SokLookupTable& tb,
                                             const float* __restrict__ grads,
                                             float* __restrict__ rows) {
  const unsigned lane = threadIdx.x & 31u;
  const I batch = static_cast<I>(tb.batch), dim = static_cast<I>(tb.dim);
  // The warp's lane-0 thread index is its first window's first sample, so
  // the windows of all warps tile the samples. The loop is uniform over a
  // warp (the block is whole warps), as __match_any_sync and __shfl_sync
  // need.
  for (I w0 = static_cast<I>(blockIdx.x) * blockDim.x + (threadIdx.x & ~31u); w0 < batch;
       w0 += static_cast<I>(gridDim.x) * blockDim.x) {
    const R id = WindowId<R>(tb, w0 + lane, lane);
    unsigned group = 0;
    const unsigned leaders = WindowLeaders(id, lane, &group);
    const I items = (batch - w0 < 32 ? batch - w0 : 32) * dim;
    const float* g = grads + w0 * dim;
    for (I p = 0; p < items; p += 32 * kRepeatLoads) {
      float v[kRepeatLoads];
#pragma unroll
      for (int u = 0; u < kRepeatLoads; ++u) {
        const I k = p + 32 * u + lane;
        v[u] = k < items ? LoadGlobal(g + k) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kRepeatLoads; ++u) {
        const I k = p + 32 * u + lane;
        const unsigned s = k < items ? static_cast<unsigned>(k / dim) : 0u;
        const I c = k - s * dim;
        const R row = __shfl_sync(kWarpLanes, id, s);
        const unsigned members = __shfl_sync(kWarpLanes, group, s);
        if (k < items && ((leaders >> s) & 1u) != 0u) {
          float sum = v[u];
          for (unsigned m = members & (members - 1u); m != 0u; m &= m - 1u) {
            sum += LoadGlobal(g + static_cast<I>(__ffs(m) - 1) * dim + c);
          }
          AddToGlobal(rows + static_cast<int64_t>(row) * tb.dim + c, sum);
        }
      }
    }
  }
}

// One thread per (sample, column) of a table, adding weight_j * combiner
// factor * grads[b, c] to column c of the rows of the sample's ids: the
// lanes of a warp add to whole rows side by side (a float4 per lane, four
// atomics 16 bytes apart, took twice as long for the DemoModel). A table
// without row_splits is one unweighted id per sample (factor 1); row_splits
// are read clamped, as in the forward. I is the index type (NarrowItems).
constexpr int kOneIdLoads = 2;
template <typename I>
__device__ __forceinline__ void DenseTable(const SokLookupTable& tb,
                                           const float* __restrict__ grads,
                                           float* __restrict__ rows) {
  const I items = static_cast<I>(tb.batch * tb.dim), dim = static_cast<I>(tb.dim);
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  I i = blockIdx.x * blockDim.x + threadIdx.x;
  if (tb.row_splits == nullptr) {
    // kOneIdLoads items per thread at a time, their loads before their
    // additions, then the rest one by one: rolled, clang's loop had one
    // gradient load in flight per thread (with the registers capped, H100:
    // the DemoModel's shape 0.40 -> 0.39 ms, 2000 rows x 64 0.35 -> 0.34;
    // 4 at a time were no faster). No wrap: the grid is at most 2^21
    // threads, and a narrow I holds below 2^31 items.
    for (; i + (kOneIdLoads - 1) * stride < items; i += kOneIdLoads * stride) {
      float g[kOneIdLoads];
      int64_t at[kOneIdLoads];
#pragma unroll
      for (int u = 0; u < kOneIdLoads; ++u) {
        const I k = i + u * stride;
        const I b = k / dim;
        g[u] = LoadGlobal(grads + k);
        at[u] = LoadId(tb, b) * tb.dim + (k - b * dim);
      }
#pragma unroll
      for (int u = 0; u < kOneIdLoads; ++u) AddToGlobal(rows + at[u], g[u]);
    }
    for (; i < items; i += stride) {
      const I b = i / dim;
      AddToGlobal(rows + LoadId(tb, b) * tb.dim + (i - b * dim), LoadGlobal(grads + i));
    }
    return;
  }
  for (; i < items; i += stride) {
    const I b = i / dim;
    const I c = i - b * dim;
    const float g = LoadGlobal(grads + i);
    int64_t j0 = 0, j1 = 0;
    const float scale = SampleScale(tb, b, &j0, &j1);
    for (int64_t j = j0; j < j1; ++j) {
      AddToGlobal(rows + LoadId(tb, j) * tb.dim + c, Weight(tb, j) * scale * g);
    }
  }
}

// Few rows, many one-id samples (the DemoModel: 8.2M positions into the
// 8192 distinct rows of its batch): global atomics cost each position's row
// dim of them. Here a block
// sums a slice of `width` columns of every row of its table in shared
// memory (a grid of one block per SM, each slice as wide as a block's
// shared memory allows), over its share of the samples, then adds its slice to
// grad_rows once. The blocks of a table take its column slices in turn, so
// the `slices` blocks that read a stretch of samples run side by side and
// share its gradient rows in L2. Shared-memory float atomics bound it
// (H100, against DenseRows): 1.05x for the DemoModel's uniform ids,
// 1.13-1.41x on 2000 and 400 rows of dims 64 and 128. Slices of 4 columns
// with float4 loads took twice as long (a warp's rows 4 floats apart fall
// on 8 of the 32 banks). A hot id queues on one row of shared memory
// (half the positions on one id: 2.5 ms against 7.4 with DenseTable), so
// the probe gives such a table to DenseRepeats (0.66 ms).
struct SharedSlices {
  int width = 0;   // columns per slice; 0: the table takes DenseRows
  int slices = 0;  // ceil(dim / width)
};

// The threads of a shared-slice block, and the samples whose loads a
// thread has in flight at once (8 and 16 were no faster).
constexpr int kSliceThreads = 1024;
constexpr int kSliceUnroll = 4;

// Whether and how table tb takes the shared-slice path, for `blocks`
// blocks per table of `slice_floats` floats of shared memory each. Host
// and device decide alike from the same arguments. Only tables of one id
// per sample given without row_splits (the DemoModel's): samples of 4 ids
// on 1000 rows took 0.111 ms here against 0.091 with DenseRows. A slice
// narrower than 4 columns (or the whole row) reads too little of each
// 32-byte sector. The blocks' final additions (blocks x rows x width) must
// stay an eighth of the atomics they save (the table's ids x dim).
__host__ __device__ inline SharedSlices SlicesOf(const SokLookupTable& tb, int64_t slice_floats,
                                                 int blocks) {
  SharedSlices s;
  if (tb.row_splits != nullptr || tb.rows <= 0 || tb.dim <= 0 || tb.nnz <= 0) return s;
  int64_t width = slice_floats / tb.rows;
  if (width > tb.dim) width = tb.dim;
  if (width > kSliceThreads) width = kSliceThreads;  // a thread per column of a sample
  if (width < (tb.dim < 4 ? tb.dim : 4)) return s;
  const int64_t slices = (tb.dim + width - 1) / width;
  // As even as that count allows (the last may still be narrower).
  width = (tb.dim + slices - 1) / slices;
  if (blocks < slices || static_cast<int64_t>(blocks) * tb.rows * width * 8 > tb.nnz * tb.dim) {
    return s;
  }
  s.width = static_cast<int>(width);
  s.slices = static_cast<int>(slices);
  return s;
}

// Thread (pos, col) of a block adds column c0 + col of the one-id samples
// first + pos, + step, ... into acc [rows, width]: kSliceUnroll samples'
// loads first, then their additions. I is the index type (NarrowItems).
template <typename I>
__device__ __forceinline__ void SliceSamples(const SokLookupTable& tb,
                                             const float* __restrict__ grads, float* acc,
                                             int width, int c0, I first, I step, int pos,
                                             int col) {
  const I batch = static_cast<I>(tb.batch), dim = static_cast<I>(tb.dim);
  const uint64_t rows = static_cast<uint64_t>(tb.rows);
  for (I b = first + pos; b < batch; b += kSliceUnroll * step) {
    int row[kSliceUnroll];
    float g[kSliceUnroll];
#pragma unroll
    for (int u = 0; u < kSliceUnroll; ++u) {
      const I bu = b + u * step;
      // (Bad ids were checked before; the bound keeps any stray one out of
      // the neighbouring rows' shared memory all the same.)
      const int64_t id = bu < batch ? LoadId(tb, bu) : -1;
      row[u] = static_cast<uint64_t>(id) < rows ? static_cast<int>(id) : -1;
      g[u] = bu < batch ? LoadGlobal(grads + bu * dim + c0 + col) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kSliceUnroll; ++u) {
      if (row[u] >= 0) atomicAdd(acc + row[u] * width + col, g[u]);
    }
  }
}

__global__ void __launch_bounds__(kSliceThreads, 1)
    DenseRowsShared(const SokLookupTable* __restrict__ tables,
                    const SokLookupGradTable* __restrict__ outs,
                    const int64_t* __restrict__ checks, int64_t slice_floats) {
  extern __shared__ float acc[];
  const int t = blockIdx.y;
  const SokLookupTable tb = tables[t];
  const SharedSlices s = SlicesOf(tb, slice_floats, gridDim.x);
  if (s.width == 0 || TakesRepeats(tb, outs[t]) || CheckFailed(checks, t, gridDim.y)) return;
  // Block k of its slice's gridDim.x / slices blocks; the samples go round
  // them a tile (the samples one pass of the block's threads covers) at a
  // time.
  const int slice = blockIdx.x % s.slices;
  const int k = blockIdx.x / s.slices, blocks = gridDim.x / s.slices;
  if (k >= blocks) return;
  const int c0 = slice * s.width;
  const int width = min(s.width, static_cast<int>(tb.dim) - c0);  // the last may be narrower
  const int64_t floats = tb.rows * s.width;
  for (int64_t e = threadIdx.x; e < floats; e += blockDim.x) acc[e] = 0.0f;
  __syncthreads();
  const int tile = kSliceThreads / s.width;
  const int pos = threadIdx.x / s.width, col = threadIdx.x - pos * s.width;
  if (pos < tile && col < width) {
    const int64_t first = static_cast<int64_t>(k) * tile;
    const int64_t step = static_cast<int64_t>(blocks) * tile;
    if (NarrowItems(tb)) {
      SliceSamples<uint32_t>(tb, outs[t].grads, acc, s.width, c0, static_cast<uint32_t>(first),
                             static_cast<uint32_t>(step), pos, col);
    } else {
      SliceSamples<int64_t>(tb, outs[t].grads, acc, s.width, c0, first, step, pos, col);
    }
  }
  __syncthreads();
  float* rows = outs[t].grad_rows;
  for (int64_t e = threadIdx.x; e < floats; e += blockDim.x) {
    const float v = acc[e];
    const int64_t r = e / s.width;
    const int c = static_cast<int>(e - r * s.width);
    if (v != 0.0f && c < width) AddToGlobal(rows + r * tb.dim + c0 + c, v);
  }
}

// The tables that DenseRowsShared and DenseRowsRepeats leave: with
// row_splits, or one id per sample that seldom repeats.
// 8 blocks of kDenseRowsThreads per SM, a whole SM's threads: registers
// capped at 32. nvcc kept it to 32 by itself; clang took 40 (a block of
// threads fewer per SM), and the package's global atomics ran 1.1-1.2x
// nvcc's time (H100: the DemoModel's shape 0.45 -> 0.39 ms with the cap
// and the loads above, 64 samples of 4096 ids 0.46 -> 0.44).
constexpr int kDenseRowsThreads = 256;
__global__ void __launch_bounds__(kDenseRowsThreads, 8)
    DenseRows(const SokLookupTable* __restrict__ tables,
              const SokLookupGradTable* __restrict__ outs, const int64_t* __restrict__ checks,
              int64_t slice_floats, int slice_blocks) {
  const int t = blockIdx.y;
  // A table whose check failed keeps the zero gradient the caller wrote,
  // as the ordered rows step leaves it (SkipTable).
  if (CheckFailed(checks, t, gridDim.y)) return;
  const SokLookupTable tb = tables[t];
  // (Written so, DenseTable's loop ran as fast as before the probe; with
  // the path read first, 10% slower on uniform ids.)
  if (tb.row_splits == nullptr) {
    if (SlicesOf(tb, slice_floats, slice_blocks).width != 0) return;
    if (TakesRepeats(tb, outs[t])) return;
  }
  if (NarrowItems(tb)) {
    DenseTable<uint32_t>(tb, outs[t].grads, outs[t].grad_rows);
  } else {
    DenseTable<int64_t>(tb, outs[t].grads, outs[t].grad_rows);
  }
}

// outs[t].path of every table: kPathRepeats for a probed one-id table whose
// ids repeat often, else 0. Such a table takes DenseRepeats even where it
// would take the shared-memory slices: half the DemoModel's positions on
// one id took 0.66 ms there against 2.46 in slices. A warp per table
// (blockIdx.x).
__global__ void ProbeRepeats(const SokLookupTable* __restrict__ tables,
                             SokLookupGradTable* outs) {
  const int t = blockIdx.x;
  const SokLookupTable tb = tables[t];
  int32_t path = 0;
  if (Probed(tb)) {
    const int repeats =
        FitsRow32(tb) ? WindowsRepeats<unsigned>(tb) : WindowsRepeats<long long>(tb);
    if (repeats >= RepeatsNeeded(tb.rows)) path = kPathRepeats;
  }
  if (threadIdx.x == 0) outs[t].path = path;
}

// The tables ProbeRepeats gave to DenseRepeats.
__global__ void DenseRowsRepeats(const SokLookupTable* __restrict__ tables,
                                 const SokLookupGradTable* __restrict__ outs,
                                 const int64_t* __restrict__ checks) {
  const int t = blockIdx.y;
  const SokLookupTable tb = tables[t];
  if (!TakesRepeats(tb, outs[t]) || CheckFailed(checks, t, gridDim.y)) return;
  const float* grads = outs[t].grads;
  float* rows = outs[t].grad_rows;
  if (NarrowItems(tb)) {
    if (FitsRow32(tb)) {
      DenseRepeats<uint32_t, unsigned>(tb, grads, rows);
    } else {
      DenseRepeats<uint32_t, long long>(tb, grads, rows);
    }
  } else if (FitsRow32(tb)) {
    DenseRepeats<int64_t, unsigned>(tb, grads, rows);
  } else {
    DenseRepeats<int64_t, long long>(tb, grads, rows);
  }
}

// Whether the unordered gradient takes the shared-memory slices at all in
// this build. clang's build of DenseRowsShared (the package's) ran slower
// than its own global atomics on every shape timed (H100: the DemoModel's
// 0.52 against 0.39 ms, 400 rows x 128 0.59 against 0.37, 2000 x 64 0.61
// against 0.33), for a cause not found: its loads are global and issued
// ahead of the additions, as nvcc's are, and its registers are fewer.
// nvcc's build wins where each row takes thousands of ids (400 x 128: 0.29
// against 0.37 ms), so the checks and timings built by nvcc keep it.
#if defined(__clang__)
constexpr bool kSlicesBuilt = false;
#else
constexpr bool kSlicesBuilt = true;
#endif

// The shared-slice launch on the current device: a block per SM, each with
// the most shared memory a block may have (none where the build takes no
// slices: then SlicesOf gives every table width 0).
struct SliceLaunch {
  int blocks = 0;
  int64_t slice_floats = 0;
};
cudaError_t SliceLaunchOf(SliceLaunch* l) {
  // A build without slices asks the device nothing (zero floats: no table
  // takes them, whatever the block count).
  if (!kSlicesBuilt) return cudaSuccess;
  int device = 0, sms = 0, per_block = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  l->blocks = sms;
  l->slice_floats = per_block / static_cast<int64_t>(sizeof(float));
  return err;
}

int DenseUnordered(const SokLookupTable* host_tables, const SokLookupTable* tables,
                   int num_tables, SokLookupGradTable* outs, int64_t* checks,
                   bool slices, void* stream) {
  const PlanSizes z = SizesOf(host_tables, num_tables);
  // max_norm's clip needs each distinct id once (the ordered rows step).
  if (!Valid(z, num_tables) || z.any_max_norm || checks == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (z.nnz == 0) return 0;
  SliceLaunch sl;
  if (slices) {
    const cudaError_t err = SliceLaunchOf(&sl);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  DenseCheckIds<<<TableGrid(z.max_nnz, num_tables), 256, 0, s>>>(tables, checks);
  // The largest table's work in DenseRows, DenseRowsShared and
  // DenseRowsRepeats (the probed one-id tables: which of the three such a
  // table takes, ProbeRepeats decides on the device).
  int64_t max_items = 0, max_one_ids = 0, shared_floats = 0;
  for (int t = 0; t < num_tables; ++t) {
    const SokLookupTable& tb = host_tables[t];
    const SharedSlices sv = SlicesOf(tb, sl.slice_floats, sl.blocks);
    if (sv.width != 0) {
      shared_floats = std::max(shared_floats, tb.rows * sv.width);
    } else {
      max_items = std::max(max_items, tb.batch * tb.dim);
    }
    if (Probed(tb)) max_one_ids = std::max(max_one_ids, tb.batch * tb.dim);
  }
  if (shared_floats > 0) {
    // Always the device's whole limit, not this call's need: ops on other
    // host threads set it too, between this call's setting and its launch.
    const cudaError_t err =
        cudaFuncSetAttribute(DenseRowsShared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(sl.slice_floats * sizeof(float)));
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  if (max_one_ids > 0) {
    ProbeRepeats<<<num_tables, 32, 0, s>>>(tables, outs);
  }
  if (max_items > 0) {
    DenseRows<<<TableGrid(max_items, num_tables), kDenseRowsThreads, 0, s>>>(
        tables, outs, checks, sl.slice_floats, sl.blocks);
  }
  if (max_one_ids > 0) {
    // Its warps stride over the windows; a grid of one wave or so, as most
    // calls' blocks return at once (path 0).
    const dim3 grid(std::min(Grid(max_one_ids), 1024u), static_cast<unsigned>(num_tables));
    DenseRowsRepeats<<<grid, 256, 0, s>>>(tables, outs, checks);
  }
  if (shared_floats > 0) {
    DenseRowsShared<<<dim3(sl.blocks, num_tables), kSliceThreads,
                      static_cast<size_t>(shared_floats) * sizeof(float), s>>>(
        tables, outs, checks, sl.slice_floats);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace
}  // namespace lookup_backward
}  // namespace sok_graph

// The names the C launchers below use, from the namespace above.
using sok_graph::lookup_backward::DenseUnordered;
using sok_graph::lookup_backward::kSlicesBuilt;
using sok_graph::lookup_backward::SliceLaunch;
using sok_graph::lookup_backward::SliceLaunchOf;
using sok_graph::lookup_backward::SlicesOf;

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_unordered(
    const SokLookupTable* host_tables, const SokLookupTable* tables, int num_tables,
    SokLookupGradTable* outs, int64_t* checks, void* stream) {
  return DenseUnordered(host_tables, tables, num_tables, outs, checks, true, stream);
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_atomics(
    const SokLookupTable* host_tables, const SokLookupTable* tables, int num_tables,
    SokLookupGradTable* outs, int64_t* checks, void* stream) {
  return DenseUnordered(host_tables, tables, num_tables, outs, checks, false, stream);
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_slices_built() {
  return kSlicesBuilt ? 1 : 0;
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_backward_dense_slice_width(
    const SokLookupTable* host_table, int* width) {
  SliceLaunch sl;
  const cudaError_t err = SliceLaunchOf(&sl);
  *width = err == cudaSuccess ? SlicesOf(*host_table, sl.slice_floats, sl.blocks).width : 0;
  return static_cast<int>(err);
}
