// CUDA forward of the fused lookup (see lookup_launcher.h).
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/lookup/core/combiner.h"
#include "tf_ops/lookup/kernels/lookup_launcher.h"

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float CombinerScale(int combiner, float wsum, float wsq) {
  return sok_graph::core::CombinerScale(static_cast<sok_graph::core::Combiner>(combiner), wsum,
                                        wsq);
}

template <typename K>
__device__ __forceinline__ int64_t IdAt(const SokLookupTable& t, int64_t j) {
  return static_cast<int64_t>(__ldg(static_cast<const K*>(t.ids) + j));
}

// Bounds checks stay off the loads' critical path: a bad id reads row 0
// with weight 0 instead of branching (so the next rows' loads can issue
// early), and each lane keeps its first bad position in a register until
// the end. Tables with no rows never reach a load.
__device__ __forceinline__ bool IdOk(int64_t id, int64_t rows) {
  return static_cast<uint64_t>(id) < static_cast<uint64_t>(rows);
}

__device__ __forceinline__ int64_t ClampSplit(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

__device__ __forceinline__ void ReportBad(int64_t my_bad, int64_t* first_bad) {
  if (first_bad && my_bad != INT64_MAX) {
    atomicMin(reinterpret_cast<unsigned long long*>(first_bad),
              static_cast<unsigned long long>(my_bad));
  }
}

// The factor of id j: its weight, times its max_norm clip when given.
__device__ __forceinline__ float Factor(const SokLookupTable& t, int64_t j) {
  float w = t.weights ? __ldg(t.weights + j) : 1.0f;
  if (t.clip) w *= __ldg(t.clip + j);
  return w;
}

constexpr int kBatch = 4;  // ids whose rows one lane loads before adding any

// Rows of ids j0, j0 + step, ... (kBatch of them, those < end) at float4
// chunk c, added to acc in id order. Ids and factors come first, then all
// the row loads back to back, so several rows are in flight per lane; bad
// ids read row 0 with factor 0 and land in *my_bad.
template <typename K>
__device__ __forceinline__ void AddRows4(const SokLookupTable& t, int64_t j0, int64_t step,
                                         int64_t end, int c, float4* acc, int64_t* my_bad) {
  int64_t id[kBatch];
  float w[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int64_t j = j0 + u * step;
    id[u] = 0;
    w[u] = 0.0f;
    if (j < end) {
      id[u] = IdAt<K>(t, j);
      w[u] = t.weights ? __ldg(t.weights + j) : 1.0f;
      if (t.clip) w[u] *= __ldg(t.clip + j);
      if (!IdOk(id[u], t.rows)) {
        *my_bad = min(*my_bad, j);
        id[u] = 0;
        w[u] = 0.0f;
      }
    }
  }
  float4 r[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    r[u] = __ldg(reinterpret_cast<const float4*>(t.params + id[u] * t.dim) + c);
  }
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    if (j0 + u * step < end) {
      acc->x += w[u] * r[u].x;
      acc->y += w[u] * r[u].y;
      acc->z += w[u] * r[u].z;
      acc->w += w[u] * r[u].w;
    }
  }
}

// Where global sample `sample` lies: its table, its row in that table's
// batch, its ids [begin, end) and its combiner factor.
struct SampleSpan {
  int table;
  int64_t b, begin, end;
  float scale;
};

__device__ __forceinline__ SampleSpan LocateSample(const SokLookupTable* __restrict__ tables,
                                                   const int64_t* __restrict__ sample_offsets,
                                                   int num_tables, int64_t sample) {
  SampleSpan span;
  int lo = 0, hi = num_tables;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (sample_offsets[mid] <= sample) lo = mid; else hi = mid;
  }
  const SokLookupTable& t = tables[lo];
  span.table = lo;
  span.b = sample - sample_offsets[lo];
  // Clamped: malformed row_splits (reported by sok_lookup_check_splits)
  // never lead outside the ids.
  span.begin = ClampSplit(t.row_splits[span.b], 0, t.nnz);
  span.end = ClampSplit(t.row_splits[span.b + 1], span.begin, t.nnz);
  // The combiner's weight sums use the weights alone, not the clip.
  float wsum = 0.0f, wsq = 0.0f;
  if (t.combiner != 0) {
    if (t.weights) {
      for (int64_t j = span.begin; j < span.end; ++j) {
        const float w = __ldg(t.weights + j);
        wsum += w;
        wsq += w * w;
      }
    } else {
      wsum = wsq = static_cast<float>(span.end - span.begin);
    }
  }
  span.scale = CombinerScale(t.combiner, wsum, wsq);
  return span;
}

// A table without rows (every id is bad; the output row is zeros) or
// without columns (nothing to add; ids are still checked): handled here by
// the `width` lanes of a sample, lane `lane` of them. Returns whether it was
// such a table.
template <typename K>
__device__ __forceinline__ bool NothingToAdd(const SokLookupTable& t, const SampleSpan& span,
                                             int lane, int width, int64_t* bad) {
  if (t.rows <= 0) {
    if (lane == 0 && span.begin < span.end) ReportBad(span.begin, bad);
    for (int d = lane; d < t.dim; d += width) t.out[span.b * t.dim + d] = 0.0f;
    return true;
  }
  if (t.dim <= 0) {
    int64_t my_bad = INT64_MAX;
    for (int64_t j = span.begin + lane; j < span.end; j += width) {
      if (!IdOk(IdAt<K>(t, j), t.rows)) my_bad = min(my_bad, j);
    }
    ReportBad(my_bad, bad);
    return true;
  }
  return false;
}

// One sample's row, by the kTeam lanes of its team (tl: this lane), its
// span located.
template <int kTeam, typename K>
__device__ __forceinline__ void TeamSample(const SokLookupTable* __restrict__ tables,
                                           const SampleSpan& span, int64_t* first_bad) {
  const int tl = threadIdx.x % kTeam;
  // A team's lanes share `sample`, so they leave or stay together and
  // shuffles within the team see all of its lanes.
  const unsigned team_mask =
      kTeam == kWarp ? kFull
                     : ((1u << (kTeam % kWarp)) - 1u) << (threadIdx.x % kWarp / kTeam * kTeam);
  const SokLookupTable& t = tables[span.table];
  int64_t* bad = first_bad ? first_bad + span.table : nullptr;
  if (NothingToAdd<K>(t, span, tl, kTeam, bad)) return;
  float* out = t.out + span.b * t.dim;
  const float s = span.scale;
  const int64_t begin = span.begin, end = span.end;
  int64_t my_bad = INT64_MAX;
  const int chunks = t.dim / 4;
  if (chunks <= kTeam && (chunks & (chunks - 1)) == 0) {
    const int groups = kTeam / chunks;
    const int g = tl / chunks, c = tl % chunks;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t j = begin + g; j < end; j += kBatch * groups) {
      AddRows4<K>(t, j, groups, end, c, &acc, &my_bad);
    }
    for (int off = kTeam / 2; off >= chunks; off /= 2) {
      acc.x += __shfl_down_sync(team_mask, acc.x, off, kTeam);
      acc.y += __shfl_down_sync(team_mask, acc.y, off, kTeam);
      acc.z += __shfl_down_sync(team_mask, acc.z, off, kTeam);
      acc.w += __shfl_down_sync(team_mask, acc.w, off, kTeam);
    }
    if (tl < chunks) {
      reinterpret_cast<float4*>(out)[c] = make_float4(acc.x * s, acc.y * s, acc.z * s, acc.w * s);
    }
  } else {
    for (int c0 = 0; c0 < chunks; c0 += kTeam) {
      const int c = c0 + tl;
      const int cc = c < chunks ? c : 0;  // lanes past the row's end load chunk 0, unused
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int64_t j = begin; j < end; j += kBatch) AddRows4<K>(t, j, 1, end, cc, &acc, &my_bad);
      if (c < chunks) {
        reinterpret_cast<float4*>(out)[c] =
            make_float4(acc.x * s, acc.y * s, acc.z * s, acc.w * s);
      }
    }
  }
  ReportBad(my_bad, bad);
}

// A team of kTeam lanes (4, 8, 16, or a whole warp) per sample, 32 / kTeam
// samples per warp; float4 loads. Short samples (DLRM's one to a few ids)
// take small teams, since a warp per sample would leave most lanes idle;
// long ones a warp. Rows of at most kTeam chunks are read by `chunks` lanes
// each, kTeam / chunks ids at once, summed by a fixed shuffle tree within
// the team; wider rows are covered kTeam chunks at a time, ids in order.
// Deterministic either way. Teams stride over the samples (a grid of a few
// blocks per SM): with one-id samples a team's work is one row, so a block
// per 64 samples would spend much of its time being scheduled.

template <int kTeam, typename K>
__global__ void LookupForwardTeamKernel(const SokLookupTable* __restrict__ tables,
                                        const int64_t* __restrict__ sample_offsets,
                                        int num_tables, int64_t total, int64_t* first_bad) {
  static_assert(kTeam >= 2 && kTeam <= kWarp && (kTeam & (kTeam - 1)) == 0, "team size");
  const int64_t teams = static_cast<int64_t>(gridDim.x) * blockDim.x / kTeam;
  for (int64_t sample = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kTeam;
       sample < total; sample += teams) {
    TeamSample<kTeam, K>(tables, LocateSample(tables, sample_offsets, num_tables, sample),
                         first_bad);
  }
}

// LookupForwardTeamKernel for batches whose samples average at most one id
// (DemoModel-style inputs: one key per sample), launched when the host sees
// that (sok_lookup_vectorized_kind). A team takes kSamplesPerTurn samples a
// turn (teams apart, so each is coalesced over the teams) and locates them
// all first. When each has at most one id and its row fits the team, their
// ids, rows and outputs are loaded and stored side by side: a turn waits for
// three loads in a row instead of three per sample, which is what bounds a
// one-id lookup. The sums are those of TeamSample, operation for operation:
// 0 + w * row, times the scale. A turn with a longer sample runs TeamSample
// on each, locating it again (keeping the spans would put them in local
// memory); that costs samples of several ids about twice the plain
// kernel's time, hence the separate kernel.
constexpr int kSamplesPerTurn = 4;

template <int kTeam, typename K>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock, 4)
    LookupForwardShortKernel(const SokLookupTable* __restrict__ tables,
                             const int64_t* __restrict__ sample_offsets, int num_tables,
                             int64_t total, int64_t* first_bad) {
  static_assert(kTeam >= 2 && kTeam <= kWarp && (kTeam & (kTeam - 1)) == 0, "team size");
  const int64_t teams = static_cast<int64_t>(gridDim.x) * blockDim.x / kTeam;
  const int tl = threadIdx.x % kTeam;
  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kTeam;
       first < total; first += kSamplesPerTurn * teams) {
    SampleSpan span[kSamplesPerTurn];
    bool short_rows = true;
#pragma unroll
    for (int u = 0; u < kSamplesPerTurn; ++u) {
      const int64_t sample = first + u * teams;
      if (sample >= total) {  // past the end: table 0, empty, never stored
        span[u] = SampleSpan{0, 0, 0, 0, 0.0f};
        continue;
      }
      span[u] = LocateSample(tables, sample_offsets, num_tables, sample);
      const SokLookupTable& t = tables[span[u].table];
      const int chunks = t.dim / 4;
      short_rows = short_rows && span[u].end - span[u].begin <= 1 && t.rows > 0 && t.dim > 0 &&
                   chunks <= kTeam && (chunks & (chunks - 1)) == 0;
    }
    if (!short_rows) {
#pragma unroll 1
      for (int u = 0; u < kSamplesPerTurn; ++u) {
        const int64_t sample = first + u * teams;
        if (sample < total) {
          TeamSample<kTeam, K>(tables, LocateSample(tables, sample_offsets, num_tables, sample),
                               first_bad);
        }
      }
      continue;
    }
    // Lanes past a row's chunks (tl >= chunks) add nothing in TeamSample
    // either: their zeros reach the row only through + 0 (below).
    int64_t id[kSamplesPerTurn];
    float w[kSamplesPerTurn];
    bool live[kSamplesPerTurn];
#pragma unroll
    for (int u = 0; u < kSamplesPerTurn; ++u) {
      const SokLookupTable& t = tables[span[u].table];
      live[u] = first + u * teams < total && tl < t.dim / 4;
      id[u] = 0;
      w[u] = 0.0f;
      if (live[u] && span[u].begin < span[u].end) {
        const int64_t j = span[u].begin;
        id[u] = IdAt<K>(t, j);
        w[u] = Factor(t, j);
        if (!IdOk(id[u], t.rows)) {
          ReportBad(j, first_bad ? first_bad + span[u].table : nullptr);
          id[u] = 0;
          w[u] = 0.0f;
        }
      }
    }
    float4 r[kSamplesPerTurn];
#pragma unroll
    for (int u = 0; u < kSamplesPerTurn; ++u) {
      r[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (live[u] && span[u].begin < span[u].end) {
        const SokLookupTable& t = tables[span[u].table];
        r[u] = __ldg(reinterpret_cast<const float4*>(t.params + id[u] * t.dim) + tl);
      }
    }
#pragma unroll
    for (int u = 0; u < kSamplesPerTurn; ++u) {
      if (!live[u]) continue;
      const SokLookupTable& t = tables[span[u].table];
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      if (span[u].begin < span[u].end) {
        acc.x += w[u] * r[u].x;
        acc.y += w[u] * r[u].y;
        acc.z += w[u] * r[u].z;
        acc.w += w[u] * r[u].w;
      }
      if (t.dim / 4 < kTeam) {
        // TeamSample's shuffle tree adds the idle groups' +0 here, which
        // turns a -0 (a product that underflows) into +0; so does this.
        // __fadd_rn, not +=: clang (the package's CUDA compiler) dropped a
        // += 0.0f, as the sum before it cannot be -0 when computed as
        // written, and then fused that sum's product into a multiply-add
        // with +0, which does give -0. The intrinsic is kept as written.
        acc.x = __fadd_rn(acc.x, 0.0f);
        acc.y = __fadd_rn(acc.y, 0.0f);
        acc.z = __fadd_rn(acc.z, 0.0f);
        acc.w = __fadd_rn(acc.w, 0.0f);
      }
      const float sc = span[u].scale;
      reinterpret_cast<float4*>(t.out + span[u].b * t.dim)[tl] =
          make_float4(acc.x * sc, acc.y * sc, acc.z * sc, acc.w * sc);
    }
  }
}

// A warp per sample in single floats, for layouts float4 loads cannot take
// (a dim not a multiple of 4, or unaligned tensors); ids are read once per
// warp and broadcast.
template <typename K>
__global__ void LookupForwardScalarKernel(const SokLookupTable* __restrict__ tables,
                                          const int64_t* __restrict__ sample_offsets,
                                          int num_tables, int64_t total, int64_t* first_bad) {
  const int64_t sample = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (sample >= total) return;
  const SampleSpan span = LocateSample(tables, sample_offsets, num_tables, sample);
  const SokLookupTable& t = tables[span.table];
  int64_t* bad = first_bad ? first_bad + span.table : nullptr;
  if (NothingToAdd<K>(t, span, lane, kWarp, bad)) return;
  int64_t my_bad = INT64_MAX;
  for (int d0 = 0; d0 < t.dim; d0 += kWarp) {
    const int d = d0 + lane;
    float acc = 0.0f;
    for (int64_t j = span.begin; j < span.end; ++j) {
      int64_t id = IdAt<K>(t, j);
      float w = Factor(t, j);
      if (!IdOk(id, t.rows)) {
        my_bad = min(my_bad, j);
        id = 0;
        w = 0.0f;
      }
      if (d < t.dim) acc += w * __ldg(t.params + id * t.dim + d);
    }
    if (d < t.dim) t.out[span.b * t.dim + d] = acc * span.scale;
  }
  ReportBad(my_bad, bad);
}

// A warp per id: the row's norm, summed in a fixed order (deterministic).
template <typename K>
__global__ void ClipFactorsKernel(SokLookupTable t, int64_t nnz, float* __restrict__ clip,
                                  int64_t* first_bad) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  for (int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; j < nnz;
       j += warps) {
    const int64_t id = IdAt<K>(t, j);
    if (!IdOk(id, t.rows)) {
      if (lane == 0) {
        ReportBad(j, first_bad);
        clip[j] = 0.0f;
      }
      continue;
    }
    float sq = 0.0f;
    for (int d = lane; d < t.dim; d += kWarp) {
      const float v = __ldg(t.params + id * t.dim + d);
      sq += v * v;
    }
    for (int off = kWarp / 2; off > 0; off /= 2) sq += __shfl_xor_sync(kFull, sq, off);
    if (lane == 0) {
      const float norm = sqrtf(sq);
      // A NaN norm gives a NaN factor (combiner.h's MaxNormScale).
      clip[j] = norm <= t.max_norm ? 1.0f : t.max_norm / norm;
    }
  }
}

// Table blockIdx.y's row_splits problem (see SOK_LOOKUP_CHECK_ROWS), the
// smallest key over its batch + 1 entries. A table without row_splits (one
// id per sample, the gradient's) has none.
__global__ void CheckSplitsKernel(const SokLookupTable* __restrict__ tables, int num_tables,
                                  int64_t* checks) {
  const SokLookupTable t = tables[blockIdx.y];
  if (t.row_splits == nullptr) return;
  int64_t key = INT64_MAX;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i <= t.batch;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = t.row_splits[i];
    if (i == 0 && v != 0) key = min(key, int64_t{0});
    if (i > 0 && v < t.row_splits[i - 1]) key = min(key, 2 * i);
    if (i == t.batch && v != t.nnz) key = min(key, 2 * i + 1);
  }
  ReportBad(key, checks + 3 * num_tables + blockIdx.y);
}

__global__ void FillCheckValuesKernel(const SokLookupTable* __restrict__ tables, int num_tables,
                                      int64_t* checks) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= num_tables) return;
  const SokLookupTable tb = tables[t];
  const int64_t pos = checks[t];
  if (pos != INT64_MAX && pos >= 0 && pos < tb.nnz) {
    checks[num_tables + t] = tb.id_bytes == 8 ? static_cast<const int64_t*>(tb.ids)[pos]
                                              : static_cast<const int32_t*>(tb.ids)[pos];
  }
  const int64_t key = checks[3 * num_tables + t];
  if (key != INT64_MAX) {
    const int64_t k = key / 2;
    checks[4 * num_tables + t] = tb.row_splits[k];
    checks[5 * num_tables + t] = k > 0 ? tb.row_splits[k - 1] : 0;
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int sok_lookup_check_splits(
    const SokLookupTable* tables, int num_tables, int64_t max_batch, int64_t* checks,
    void* stream) {
  if (num_tables <= 0) return 0;
  if (num_tables > 65535) return static_cast<int>(cudaErrorInvalidValue);
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((max_batch + 1 + threads - 1) / threads, 1024);
  CheckSplitsKernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(num_tables)),
                      threads, 0, static_cast<cudaStream_t>(stream)>>>(tables, num_tables,
                                                                       checks);
  return static_cast<int>(cudaGetLastError());
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_fill_check_values(
    const SokLookupTable* tables, int num_tables, int64_t* checks, void* stream) {
  if (num_tables <= 0) return 0;
  const int threads = 128;
  FillCheckValuesKernel<<<(num_tables + threads - 1) / threads, threads, 0,
                          static_cast<cudaStream_t>(stream)>>>(tables, num_tables, checks);
  return static_cast<int>(cudaGetLastError());
}

// Blocks of `threads` that fit on the current device at once (a grid-stride
// kernel's grid): SMs times the threads an SM holds (2048 on sm_80 and
// sm_90, 1536 on sm_86 and sm_89), host-side attribute queries.
static int64_t ResidentBlocks(int threads) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device) !=
          cudaSuccess ||
      sms <= 0 || per_sm < threads) {
    sms = 132;
    per_sm = 2048;
  }
  return static_cast<int64_t>(sms) * (per_sm / threads);
}

template <int kTeam, typename K>
void LaunchTeams(bool short_samples, const SokLookupTable* tables, const int64_t* sample_offsets,
                 int num_tables, int64_t total_samples, int64_t* first_bad, cudaStream_t s) {
  const int threads = kWarp * kWarpsPerBlock;
  const int64_t per_block = threads / kTeam;
  const int64_t blocks = std::min<int64_t>((total_samples + per_block - 1) / per_block,
                                           ResidentBlocks(threads));
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(blocks, 1));
  if (short_samples) {
    LookupForwardShortKernel<kTeam, K><<<grid, threads, 0, s>>>(
        tables, sample_offsets, num_tables, total_samples, first_bad);
  } else {
    LookupForwardTeamKernel<kTeam, K><<<grid, threads, 0, s>>>(
        tables, sample_offsets, num_tables, total_samples, first_bad);
  }
}

template <typename K>
void LaunchForward(int vectorized, int lanes, const SokLookupTable* tables,
                   const int64_t* sample_offsets, int num_tables, int64_t total_samples,
                   int64_t* first_bad, cudaStream_t s) {
  if (!vectorized) {
    const int threads = kWarp * kWarpsPerBlock;
    const unsigned grid =
        static_cast<unsigned>((total_samples + kWarpsPerBlock - 1) / kWarpsPerBlock);
    LookupForwardScalarKernel<K><<<grid, threads, 0, s>>>(tables, sample_offsets, num_tables,
                                                          total_samples, first_bad);
  } else if (lanes == 4) {
    LaunchTeams<4, K>(vectorized == 2, tables, sample_offsets, num_tables, total_samples, first_bad, s);
  } else if (lanes == 8) {
    LaunchTeams<8, K>(vectorized == 2, tables, sample_offsets, num_tables, total_samples, first_bad, s);
  } else if (lanes == 16) {
    LaunchTeams<16, K>(vectorized == 2, tables, sample_offsets, num_tables, total_samples, first_bad, s);
  } else {
    LaunchTeams<kWarp, K>(vectorized == 2, tables, sample_offsets, num_tables, total_samples, first_bad, s);
  }
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_forward_f32(
    const SokLookupTable* tables, const int64_t* sample_offsets, int num_tables,
    int64_t total_samples, int vectorized, int id_bytes, int lanes_per_sample,
    int64_t* first_bad, void* stream) {
  if (id_bytes != 4 && id_bytes != 8) return static_cast<int>(cudaErrorInvalidValue);
  const int lanes = lanes_per_sample;
  if (lanes != 4 && lanes != 8 && lanes != 16 && lanes != kWarp) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (lanes < kWarp && !vectorized) return static_cast<int>(cudaErrorInvalidValue);
  if (vectorized < 0 || vectorized > 2) return static_cast<int>(cudaErrorInvalidValue);
  if (total_samples <= 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (id_bytes == 8) {
    LaunchForward<int64_t>(vectorized, lanes, tables, sample_offsets, num_tables, total_samples,
                           first_bad, s);
  } else {
    LaunchForward<int32_t>(vectorized, lanes, tables, sample_offsets, num_tables, total_samples,
                           first_bad, s);
  }
  return static_cast<int>(cudaGetLastError());
}

extern "C" __attribute__((visibility("default"))) int sok_lookup_clip_factors(
    const SokLookupTable* table, int64_t nnz, float* clip, int64_t* first_bad, void* stream) {
  if (nnz <= 0) return 0;
  const int threads = kWarp * kWarpsPerBlock;
  const int64_t blocks = std::min<int64_t>((nnz + kWarpsPerBlock - 1) / kWarpsPerBlock, 65536);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (table->id_bytes == 4) {
    ClipFactorsKernel<int32_t><<<static_cast<unsigned>(blocks), threads, 0, s>>>(*table, nnz, clip,
                                                                              first_bad);
  } else {
    ClipFactorsKernel<int64_t><<<static_cast<unsigned>(blocks), threads, 0, s>>>(*table, nnz, clip,
                                                                              first_bad);
  }
  return static_cast<int>(cudaGetLastError());
}
