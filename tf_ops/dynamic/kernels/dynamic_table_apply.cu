// The optimizer's update of a GPU hash table in place (dynamic_table_internal.cuh):
// for distinct keys that a call made present, each row and its optimizer
// slots are updated where they live by the shared formula
// (tf_ops/optimizer/core/sparse_apply.h, as sok_dense_apply_f32 applies it to
// gathered copies), one probe per key. The general update gathers the rows,
// applies the formula to the copies and scatters them back, probing each
// key twice: at a few million distinct keys a step that was most of the
// update's time.
#include <cstdint>

#include <cuda_runtime.h>

#include "tf_ops/common/cuda_helpers.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_internal.cuh"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"
#include "tf_ops/optimizer/core/sparse_apply.h"

namespace sok_graph {
namespace gpu_table {
namespace {

using sok_graph::core::SparseApplyConfig;

// The most slot tables an update has: the formula's own bound.
constexpr int kMaxSlotTables = sok_graph::core::kMaxSlots;

struct SlotTables {
  DevTable table[kMaxSlotTables];
  const int64_t* slot_of[kMaxSlotTables];  // each slot table's slots of the keys
  int count;
};

// Each lane of a warp finds one key's slot; the warp then updates its 32
// keys' rows together, element by element. A key missing from the table
// after all breaks the caller's promise: it is counted as a failure, which
// the table's next wait reports, and skipped, as scatter_present does. A
// key a slot table could not place (its find-or-insert counted that
// failure in its own counters) is skipped.
__global__ void ApplyPresentKernel(DevTable t, SlotTables slots, const int64_t* __restrict__ keys,
                                   int64_t n, const float* __restrict__ grads,
                                   SparseApplyConfig config, const float* __restrict__ hyper_dev,
                                   const int64_t* __restrict__ step, int64_t now,
                                   long long* counters) {
  __shared__ float hyper[sok_graph::core::kNumHyper];
  __shared__ float alpha;
  __shared__ int64_t warp_slots[kWarpsPerBlock][kWarp];
  sok_graph::core::LoadHyperIntoBlock(config, hyper_dev, step, hyper, &alpha);
  int64_t base;
  int lane;
  if (!WarpTile(n, &base, &lane)) return;
  const int64_t i = base + lane;
  int64_t slot = -1;
  bool missing = false;
  if (i < n) {
    slot = FindSlot(t, keys[i]);
    missing = slot < 0;
    for (int k = 0; k < slots.count; ++k) {
      if (slots.slot_of[k][i] < 0) slot = -1;
    }
    if (slot >= 0) t.ts[slot] = now;
  }
  WarpCount(missing, counters + kFail, lane);
  const int w = threadIdx.x / kWarp;
  warp_slots[w][lane] = slot;
  __syncwarp();
  const int dim = t.dim;
  const int64_t items = static_cast<int64_t>(kWarp) * dim;
  for (int64_t e = lane; e < items; e += kWarp) {
    const int p = static_cast<int>(e / dim);
    const int d = static_cast<int>(e - static_cast<int64_t>(p) * dim);
    const int64_t s = warp_slots[w][p];
    if (s < 0) continue;
    const int64_t j = base + p;
    float* extra[kMaxSlotTables] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < slots.count; ++k) {
      extra[k] = slots.table[k].rows.Row(slots.slot_of[k][j], dim) + d;
    }
    sok_graph::core::ApplyElement(config, hyper, alpha, grads[j * dim + d],
                                  t.rows.Row(s, dim) + d, extra[0], extra[1], extra[2]);
  }
}

}  // namespace
}  // namespace gpu_table
}  // namespace sok_graph

using sok_graph::gpu_table::ApplyPresentKernel;
using sok_graph::gpu_table::BadTable;
using sok_graph::gpu_table::BlocksFor;
using sok_graph::gpu_table::kMaxSlotTables;
using sok_graph::gpu_table::kThreads;
using sok_graph::gpu_table::SlotTables;
using sok_graph::gpu_table::StreamOf;

extern "C" {

__attribute__((visibility("default"))) int sok_gpu_table_apply_present(
    SokGpuTable* t, SokGpuTable* const* slot_tables, int num_slot_tables, const int64_t* keys,
    int64_t n, const float* grads, int algorithm, int formulas, int nesterov, const float* hyper,
    const int64_t* step, int64_t now, void* stream) {
  if (BadTable(t) || n < 0 || num_slot_tables < 0 || num_slot_tables > kMaxSlotTables) {
    return SOK_GPU_TABLE_BAD_ARGUMENT;
  }
  SlotTables slots{};
  slots.count = num_slot_tables;
  for (int k = 0; k < num_slot_tables; ++k) {
    SokGpuTable* s = slot_tables[k];
    // The slots of the keys are those the slot table's last call left.
    if (BadTable(s) || s->dev.dim != t->dev.dim || s->scratch_n < n) {
      return SOK_GPU_TABLE_BAD_ARGUMENT;
    }
    slots.table[k] = s->dev;
    slots.slot_of[k] = s->slot_of;
  }
  if (n == 0) return 0;
  sok_graph::core::SparseApplyConfig config{algorithm, formulas, nesterov};
  ApplyPresentKernel<<<BlocksFor(n), kThreads, 0, StreamOf(stream)>>>(
      t->dev, slots, keys, n, grads, config, hyper, step, now, t->counters);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
