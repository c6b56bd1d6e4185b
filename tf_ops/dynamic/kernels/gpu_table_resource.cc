// The GPU table behind the dynamic-table ops (table_resource.h): a GPU
// hash table (dynamic_table_*.cu behind dynamic_table_launcher.h) on the
// device the create op runs on, driven through the C launchers on the op's
// stream. The ops checked their inputs already (dynamic_kernels.cc).
// Compiled only when the build found a CUDA toolkit (SOK_GRAPH_WITH_CUDA);
// machines without a GPU never place the ops here.
//
// The GPU table stores int64 keys. An int32-keyed table keeps them there
// widened: int32 keys (in device memory, like every tensor of a registered
// GPU kernel that is not declared HostMemory) are widened on the device on
// the way in and narrowed on the way out (evicted keys, exports; exact, as
// every stored key came in as an int32). Placement follows the resource:
// every op on a table runs where its handle op runs (dynamic_kernels.cc
// refuses any other).
//
// Memory: the table's storage and scratch come from the device's
// TensorFlow allocator (SokGpuAllocator), so TensorFlow's memory settings
// and statistics cover them. Keys, rows and their metadata stay on the
// device; the scalars the
// host reads or writes (counts, offsets and limits, default_value, and the
// frequencies checked before import) are HostMemory. Ops whose output size
// depends on the table (the evicted keys, an export chunk, stats) wait for
// the stream once to learn it; a find never does.
//
// Export order is the GPU table's slot order; `offset` and next_offset are
// positions in it counted over every row, as the CPU table counts them, so a
// chunked export (with or without `updated_after`) cuts at the same places
// on both devices when their orders agree.
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_scratch.h"
#include "tf_ops/common/gpu_stream.h"
#include "compat/tf_compat.h"
#include "tf_ops/dynamic/kernels/dynamic_kernel_common.h"
#include "tf_ops/dynamic/kernels/dynamic_table_launcher.h"
#include "tf_ops/dynamic/kernels/table_resource.h"
#include "tf_ops/optimizer/kernels/sparse_apply_launcher.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"
#include "tf_ops/util/kernels/unique_set_hint.h"
#include "tf_ops/util/kernels/util_launcher.h"

namespace sok_graph {
namespace dynamic_kernels {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// The launcher takes initializer kinds in the order of core::InitKind.
static_assert(static_cast<int>(core::InitKind::kNormal) == SOK_INIT_NORMAL, "init kinds");
static_assert(static_cast<int>(core::InitKind::kTruncatedNormal) == SOK_INIT_TRUNCATED_NORMAL,
              "init kinds");
static_assert(static_cast<int>(core::InitKind::kUniform) == SOK_INIT_UNIFORM, "init kinds");
static_assert(static_cast<int>(core::InitKind::kZeros) == SOK_INIT_ZEROS, "init kinds");
static_assert(static_cast<int>(core::InitKind::kConstant) == SOK_INIT_CONSTANT, "init kinds");
static_assert(sizeof(SokGpuTableConfig) == 72, "the launcher's config layout");
static_assert(sizeof(bool) == sizeof(uint8_t), "found flags are written as bytes");

// cub counts items in int: a call takes fewer than 2^31 keys.
constexpr int64_t kMaxKeysPerCall = std::numeric_limits<int32_t>::max() - 1;

// A launcher's return code as a TensorFlow error naming the op and the
// table (`table_name`). `result` (may be null) tells how many distinct keys
// a batch had; `bounded`: whether row_limit is the table's max_capacity.
Status TableError(OpKernelContext* ctx, int rc, const SokGpuTableResult* result,
                  int64_t row_limit, bool bounded, const std::string& table_name) {
  if (rc == 0) return OkStatus();
  const std::string where =
      ctx->op_kernel().type_string() + " on the GPU dynamic table '" + table_name + "': ";
  switch (rc) {
    case SOK_GPU_TABLE_TOO_MANY_KEYS:
      return errors::InvalidArgument(
          where, "the batch has ", result != nullptr ? result->distinct_keys : -1,
          " distinct keys but the table holds at most ", row_limit,
          bounded ? " rows, its max_capacity (keys used in this batch are never evicted)"
                  : " rows, the most a table holds");
    case SOK_GPU_TABLE_BAD_ARGUMENT:
      return errors::InvalidArgument(where, "the GPU table rejected its arguments (a table ",
                                     "that failed to allocate, a negative count, dim < 1 or an ",
                                     "unknown mode)");
    case SOK_GPU_TABLE_HOST_MEMORY:
      return errors::ResourceExhausted(
          where, "out of host memory: the rows this table keeps in host memory (past ",
          "max_hbm_for_vectors) could not be allocated as pinned host memory. Give it more GPU ",
          "memory (max_hbm_for_vectors) or fewer rows (max_capacity), or free host memory");
    case SOK_GPU_TABLE_FULL:
      return errors::Internal(where, "no free slot was found for a new key (an invariant of ",
                              "the GPU hash table broke)");
    default:
      break;
  }
  // cudaErrorMemoryAllocation: TensorFlow's allocator for the device (which
  // the table allocates from) had no room left.
  if (rc == 2) {
    return errors::ResourceExhausted(
        where, "out of GPU memory: TensorFlow's allocator for this GPU could not give the ",
        "table the memory it needs to grow. Bound the table (max_capacity / ",
        "max_hbm_for_vectors), or give TensorFlow more of the GPU (a larger memory_limit in ",
        "tf.config.set_logical_device_configuration, or fewer processes sharing the GPU)");
  }
  return CudaStatus(rc, where + "the table's kernels");
}

int64_t* I64(Tensor* t) { return reinterpret_cast<int64_t*>(t->flat<TfInt64>().data()); }

// A keys tensor (device memory) as int64 keys on the device: the tensor
// itself for int64 keys, a widened copy (in `widened`) of int32 keys.
Status KeysAsInt64(OpKernelContext* ctx, const Tensor& k, Tensor* widened, const int64_t** keys) {
  const int64_t n = k.NumElements();
  if (k.dtype() == ::tensorflow::DT_INT64) {
    *keys = reinterpret_cast<const int64_t*>(k.flat<TfInt64>().data());
    return OkStatus();
  }
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                        TensorShape({std::max<int64_t>(n, 1)}), widened));
  TF_RETURN_IF_ERROR(CudaStatus(
      sok_gpu_widen_i32(k.flat<int32_t>().data(), I64(widened), n, GpuStreamOf(ctx)),
      "widening int32 keys"));
  *keys = I64(widened);
  return OkStatus();
}

// Writes m int64 keys (device memory) to a keys output of the table's key
// type: copied for int64, narrowed for int32.
Status KeysToOutput(OpKernelContext* ctx, const int64_t* device_keys, int64_t m, Tensor* out) {
  if (m == 0) return OkStatus();
  if (out->dtype() == ::tensorflow::DT_INT64) {
    return CudaStatus(sok_gpu_copy_on_device(I64(out), device_keys, sizeof(int64_t) * m,
                                             GpuStreamOf(ctx)),
                      "copying keys");
  }
  return CudaStatus(sok_gpu_narrow_i64(device_keys, out->flat<int32_t>().data(), m,
                                       GpuStreamOf(ctx)),
                    "narrowing keys to int32");
}

// The outputs num_evicted (at `first`) and evicted_keys (next) of an
// inserting op, from the launcher's `evicted` keys (device, int64).
Status EvictionOutputs(OpKernelContext* ctx, int first, Tensor* evicted, int64_t num_evicted) {
  TF_RETURN_IF_ERROR(ScalarOutput(ctx, first, num_evicted));
  Tensor* keys = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(first + 1, TensorShape({num_evicted}), &keys));
  return KeysToOutput(ctx, I64(evicted), num_evicted, keys);
}

// The device's TensorFlow allocator behind SokGpuAllocator. Out of memory
// is reported at once (no waiting for other ops to free some): the op then
// fails with ResourceExhausted and the table stays as it was.
void* TfAlloc(void* allocator, size_t bytes) {
  ::tensorflow::AllocationAttributes attributes;
  SetNoRetry(&attributes);
  return static_cast<::tensorflow::Allocator*>(allocator)->AllocateRaw(
      ::tensorflow::Allocator::kAllocatorAlignment, bytes, attributes);
}
void TfFree(void* allocator, void* p) {
  static_cast<::tensorflow::Allocator*>(allocator)->DeallocateRaw(p);
}

SokGpuTableConfig LauncherConfig(const core::TableConfig& config) {
  SokGpuTableConfig c;
  std::memset(&c, 0, sizeof(c));
  c.dim = config.dim;
  c.init_capacity = config.init_capacity;
  c.max_rows = config.max_rows;
  c.eviction = config.eviction == core::Eviction::kLfu ? 1 : 0;
  c.init_kind = static_cast<int32_t>(config.initializer.kind);
  c.mean = config.initializer.mean;
  c.stddev = config.initializer.stddev;
  c.minval = config.initializer.minval;
  c.maxval = config.initializer.maxval;
  c.value = config.initializer.value;
  c.seed = config.initializer.seed;
  c.hbm_bytes = config.hbm_bytes;
  return c;
}

// Owns one launcher table on the device that created it. Every call that
// changes the table (or its host-side bookkeeping: sizes, scratch) holds the
// lock alone; finds share it.
class GpuTableResource : public TableResource {
 public:
  GpuTableResource(SokGpuTable* table, int64_t dim, DataType key_dtype, void* stream,
                   bool bounded)
      : TableResource(dim, key_dtype, ::tensorflow::DEVICE_GPU),
        table_(table),
        stream_(stream),
        bounded_(bounded) {}
  ~GpuTableResource() override {
    // Waits for the device's stream (the one every op of this table ran
    // on) before freeing.
    sok_gpu_table_destroy(table_, stream_);
  }

  std::string DebugString() const override {
    return "SokDynamicTable(GPU, dim=" + std::to_string(dim()) + ")";
  }
  TfInt64 MemoryUsed() const override { return sok_gpu_table_memory_bytes(table_); }
  int64_t max_keys_per_call() const override { return kMaxKeysPerCall; }

  Status FindOrInsert(OpKernelContext* ctx, const Tensor& keys_in) override;
  Status UniqueFindOrInsert(OpKernelContext* ctx, const Tensor& keys_in) override;
  Status Find(OpKernelContext* ctx, const Tensor& keys_in,
              const std::vector<float>& default_row) override;
  Status Scatter(OpKernelContext* ctx, const Tensor& keys_in, const Tensor& rows,
                 core::ScatterMode mode) override;
  Status Remove(OpKernelContext* ctx, const Tensor& keys_in) override;
  Status ReadStats(OpKernelContext* ctx, Stats* stats) override;
  Status Export(OpKernelContext* ctx, const ExportArgs& args) override;
  Status Import(OpKernelContext* ctx, const Tensor& keys_in, const Tensor& rows,
                bool replace) override;
  Status Clear(OpKernelContext* ctx) override;
  Status SparseApply(OpKernelContext* ctx, const Tensor& keys_in,
                     const std::vector<TableResource*>& slot_tables,
                     const core::SparseApplyConfig& config) override;

 protected:
  Status RemoveKeys(OpKernelContext* ctx, const int64_t* keys, int64_t n) override;

 private:
  int64_t row_limit() const { return sok_gpu_table_row_limit(table_); }
  Status Error(OpKernelContext* ctx, int rc, const SokGpuTableResult* result = nullptr) const {
    return TableError(ctx, rc, result, row_limit(), bounded_, NameFor(ctx));
  }
  // The time of a call that changes the table, as core::DynamicTable::Tick:
  // the wall clock in microseconds, strictly after every earlier call.
  // Call with the lock held.
  int64_t Tick() {
    now_ = std::max(WallMicros(), now_ + 1);
    return now_;
  }

  // Keys known to be in the table: the keys tensor of the last call that
  // made them all present, held here so that its buffer is neither freed
  // nor reused meanwhile, the table's removal count after that call
  // (sok_gpu_table_removals), and whether the keys are known distinct (a
  // unique op's). A later call given the same tensor while no key was
  // taken out needs no insert and so no wait for the device: the
  // optimizer's write-back of the keys that the step's lookup inserted (the
  // gradient carries the lookup's keys tensor itself). Only tensors a table
  // op made itself are noted (the unique find-or-insert's distinct keys; a
  // slot table's keys within one optimizer op): a tensor that came in as
  // an input may share the buffer of a TF 1 ref variable, which an assign
  // overwrites in place. Batches larger than the table's bound are not
  // held. Call both with the lock held.
  // An empty `keys` forgets the note.
  void NotePresent(const Tensor& keys, bool distinct = false) {
    if (keys.NumElements() == 0 || keys.NumElements() > row_limit()) {
      present_keys_ = Tensor();
      return;
    }
    present_keys_ = keys;
    present_removals_ = sok_gpu_table_removals(table_);
    present_distinct_ = distinct;
  }
  // *distinct (may be null) <- whether the keys are also known distinct.
  bool KnownPresent(const Tensor& keys, bool* distinct = nullptr) const {
    const bool known = present_keys_.NumElements() > 0 && keys.dtype() == present_keys_.dtype() &&
                       keys.NumElements() == present_keys_.NumElements() &&
                       keys.tensor_data().data() == present_keys_.tensor_data().data() &&
                       sok_gpu_table_removals(table_) == present_removals_;
    if (distinct != nullptr) *distinct = known && present_distinct_;
    return known;
  }

  // rows applied to the rows of `keys` (the tensor; `device_keys`: its
  // int64 keys on the device) in `mode` (the launcher's), without inserting
  // (and so without waiting) when the table knows they are all present, and
  // without ordering them when it knows they are distinct.
  Status ScatterRows(OpKernelContext* ctx, const Tensor& keys, const int64_t* device_keys,
                     const float* rows, int mode, SokGpuTableResult* result);

  // SparseApply of keys this table knows are distinct and present: each
  // slot table makes them present (find-or-insert without rows), then one
  // launch updates every row and slot row in place, this table and the
  // slot tables locked throughout (each slot table's slots of the keys are
  // what its find-or-insert left). *applied <- false, nothing done, for
  // other keys.
  Status ApplyPresent(OpKernelContext* ctx, const Tensor& keys_in, const int64_t* keys,
                      const std::vector<GpuTableResource*>& slots,
                      const core::SparseApplyConfig& c, bool* applied);

  // *distinct <- the number of distinct keys among keys[0, n) (one wait).
  static Status CountDistinct(OpKernelContext* ctx, const int64_t* keys, int64_t n,
                              int64_t* distinct);

  SokGpuTable* const table_;
  void* const stream_;
  const bool bounded_;  // max_capacity given: row_limit() is it
  int64_t now_ = 0;
  Tensor present_keys_;
  int64_t present_removals_ = 0;
  bool present_distinct_ = false;
  // The unique find-or-insert's hash set size, learnt from its last batch.
  UniqueSetHint unique_hint_;
};

Status GpuTableResource::FindOrInsert(OpKernelContext* ctx, const Tensor& keys_in) {
  Tensor widened;
  const int64_t* keys = nullptr;
  TF_RETURN_IF_ERROR(KeysAsInt64(ctx, keys_in, &widened, &keys));
  const int64_t n = keys_in.NumElements();
  const int64_t d = dim();
  void* stream = GpuStreamOf(ctx);
  Tensor* rows = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({n, d}), &rows));
  // Room for every key (and row) the call could evict (at most one per key).
  const int64_t room = std::max<int64_t>(n, 1);
  Tensor evicted, evicted_rows;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({room}), &evicted));
  TF_RETURN_IF_ERROR(
      ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({room, d}), &evicted_rows));
  SokGpuTableResult result{0, -1};
  {
    ::tensorflow::mutex_lock lock(*mu());
    const int rc = sok_gpu_table_find_or_insert(table_, keys, n, Tick(),
                                                rows->flat<float>().data(), I64(&evicted),
                                                evicted_rows.flat<float>().data(), &result, stream);
    TF_RETURN_IF_ERROR(Error(ctx, rc, &result));
  }
  TF_RETURN_IF_ERROR(DropFromShadows(ctx, I64(&evicted), result.num_evicted));
  TF_RETURN_IF_ERROR(EvictionOutputs(ctx, 1, &evicted, result.num_evicted));
  Tensor* out_rows = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({result.num_evicted, d}), &out_rows));
  if (result.num_evicted == 0) return OkStatus();
  return CudaStatus(sok_gpu_copy_on_device(out_rows->flat<float>().data(),
                                           evicted_rows.flat<float>().data(),
                                           sizeof(float) * result.num_evicted * d, stream),
                    "copying evicted rows");
}

// The unique launcher leaves the distinct keys and their count on the
// device, and the table reads the count back together with what its insert
// must know: one wait where SokUnique and a find-or-insert of a full table
// wait once each. Unique's hash set is sized by the op's last batch, as
// SokUnique's; the count of a batch that overflows it comes back negative,
// and the batch runs again with the full set (two more waits, once).
Status GpuTableResource::UniqueFindOrInsert(OpKernelContext* ctx, const Tensor& keys_in) {
  const int64_t n = keys_in.NumElements();
  // The unique launcher numbers its hash set's slots in 32 bits.
  if (n >= (int64_t{1} << 30)) {
    return errors::InvalidArgument("keys has ", n, " entries; the GPU op takes fewer than 2^30");
  }
  Tensor widened;
  const int64_t* keys = nullptr;
  TF_RETURN_IF_ERROR(KeysAsInt64(ctx, keys_in, &widened, &keys));
  void* stream = GpuStreamOf(ctx);
  Tensor* positions = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &positions));
  Tensor distinct_keys, count, evicted, temp;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                        TensorShape({std::max<int64_t>(n, 1)}), &distinct_keys));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &count));
  // Room for every key the call could evict (at most one per distinct key).
  TF_RETURN_IF_ERROR(ctx->allocate_temp(
      ::tensorflow::DT_INT64, TensorShape({std::max<int64_t>(std::min(n, row_limit()), 1)}),
      &evicted));
  SokGpuTableResult result{0, -1};
  int64_t u = 0;
  Tensor *unique_keys = nullptr, *rows = nullptr;
  {
    ::tensorflow::mutex_lock lock(*mu());
    if (n > 0) {
      // Unique, then the table's exact path, which reads the distinct count
      // (with its own counters) and leaves it in u: -1 when unique's set
      // overflowed.
      TF_RETURN_IF_ERROR(unique_hint_.Run(
          n,
          [&](int64_t set_slots, int64_t* distinct) -> Status {
            TF_RETURN_IF_ERROR(LaunchWithScratch(
                ctx, "unique keys", &temp, [&](void* scratch, size_t* bytes) {
                  return sok_unique_in_set_i64_i64(keys, n, set_slots, I64(&distinct_keys),
                                                   I64(positions), nullptr, I64(&count), scratch,
                                                   bytes, stream);
                }));
            const int rc =
                sok_gpu_table_ensure_distinct(table_, I64(&distinct_keys), I64(&count), n, Tick(),
                                              I64(&evicted), &result, distinct, stream);
            return Error(ctx, rc, &result);
          },
          &u));
    }
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({u}), &unique_keys));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({u, dim()}), &rows));
    TF_RETURN_IF_ERROR(
        Error(ctx, sok_gpu_table_gather_ensured(table_, u, rows->flat<float>().data(), stream)));
    TF_RETURN_IF_ERROR(KeysToOutput(ctx, I64(&distinct_keys), u, unique_keys));
    NotePresent(*unique_keys, /*distinct=*/true);
  }
  TF_RETURN_IF_ERROR(DropFromShadows(ctx, I64(&evicted), result.num_evicted));
  return EvictionOutputs(ctx, 3, &evicted, result.num_evicted);
}

Status GpuTableResource::Find(OpKernelContext* ctx, const Tensor& keys_in,
                              const std::vector<float>& default_row) {
  const int64_t n = keys_in.NumElements();
  const int64_t d = dim();
  void* stream = GpuStreamOf(ctx);
  Tensor *rows = nullptr, *found = nullptr, default_dev;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({n, d}), &rows));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &found));
  if (n == 0) return OkStatus();
  Tensor widened;
  const int64_t* keys = nullptr;
  TF_RETURN_IF_ERROR(KeysAsInt64(ctx, keys_in, &widened, &keys));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({d}), &default_dev));
  TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(default_dev.flat<float>().data(),
                                                       default_row.data(), sizeof(float) * d,
                                                       stream),
                                "copying default_value to the GPU"));
  ::tensorflow::tf_shared_lock lock(*mu());
  return Error(ctx, sok_gpu_table_find(table_, keys, n, default_dev.flat<float>().data(),
                                       rows->flat<float>().data(),
                                       reinterpret_cast<uint8_t*>(found->flat<bool>().data()),
                                       stream));
}

Status GpuTableResource::ScatterRows(OpKernelContext* ctx, const Tensor& keys,
                                     const int64_t* device_keys, const float* rows, int mode,
                                     SokGpuTableResult* result) {
  const int64_t n = keys.NumElements();
  void* stream = GpuStreamOf(ctx);
  // The keys a table with shadows evicts, for them to drop.
  Tensor evicted;
  {
    ::tensorflow::mutex_lock lock(*mu());
    bool distinct = false;
    if (KnownPresent(keys, &distinct)) {
      return Error(ctx, sok_gpu_table_scatter_present(table_, device_keys, n, rows, mode,
                                                      distinct, Tick(), stream));
    }
    if (!HasShadows()) {
      return Error(ctx, sok_gpu_table_scatter(table_, device_keys, n, rows, mode, Tick(), result,
                                              stream),
                   result);
    }
    // sok_gpu_table_scatter's steps, the insert reporting what it evicts.
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                          TensorShape({std::max<int64_t>(n, 1)}), &evicted));
    const int64_t now = Tick();
    TF_RETURN_IF_ERROR(Error(
        ctx, sok_gpu_table_insert_missing(table_, device_keys, n, now, I64(&evicted), result,
                                          stream),
        result));
    TF_RETURN_IF_ERROR(Error(ctx, sok_gpu_table_scatter_present(table_, device_keys, n, rows,
                                                                mode, 0, now, stream)));
  }
  return DropFromShadows(ctx, I64(&evicted), result->num_evicted);
}

// The launcher's modes: 0 add, 1 subtract, 2 update.
int LauncherMode(core::ScatterMode mode) {
  return mode == core::ScatterMode::kAdd ? 0 : mode == core::ScatterMode::kSub ? 1 : 2;
}

Status GpuTableResource::Scatter(OpKernelContext* ctx, const Tensor& keys_in, const Tensor& rows,
                                 core::ScatterMode mode) {
  Tensor widened;
  const int64_t* keys = nullptr;
  TF_RETURN_IF_ERROR(KeysAsInt64(ctx, keys_in, &widened, &keys));
  SokGpuTableResult result{0, -1};
  TF_RETURN_IF_ERROR(
      ScatterRows(ctx, keys_in, keys, rows.flat<float>().data(), LauncherMode(mode), &result));
  return ScalarOutput(ctx, 0, result.num_evicted);
}

Status GpuTableResource::Remove(OpKernelContext* ctx, const Tensor& keys_in) {
  Tensor widened;
  const int64_t* keys = nullptr;
  TF_RETURN_IF_ERROR(KeysAsInt64(ctx, keys_in, &widened, &keys));
  // num_removed stays on the device: no wait for the stream.
  Tensor* removed = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({}), &removed));
  {
    ::tensorflow::mutex_lock lock(*mu());
    TF_RETURN_IF_ERROR(Error(ctx, sok_gpu_table_remove(table_, keys, keys_in.NumElements(),
                                                       I64(removed), GpuStreamOf(ctx))));
  }
  return DropFromShadows(ctx, keys, keys_in.NumElements());
}

Status GpuTableResource::RemoveKeys(OpKernelContext* ctx, const int64_t* keys, int64_t n) {
  ::tensorflow::mutex_lock lock(*mu());
  return Error(ctx, sok_gpu_table_remove(table_, keys, n, nullptr, GpuStreamOf(ctx)));
}

Status GpuTableResource::ReadStats(OpKernelContext* ctx, Stats* stats) {
  ::tensorflow::mutex_lock lock(*mu());
  int64_t slots = 0;
  TF_RETURN_IF_ERROR(Error(ctx, sok_gpu_table_size(table_, &stats->size, &slots,
                                                   GpuStreamOf(ctx))));
  stats->row_limit = row_limit();
  stats->evicted_total = sok_gpu_table_evicted_total(table_);
  stats->memory_bytes = sok_gpu_table_memory_bytes(table_);
  return OkStatus();
}

Status GpuTableResource::Export(OpKernelContext* ctx, const ExportArgs& args) {
  void* stream = GpuStreamOf(ctx);
  const int64_t d = dim();
  // The launcher's counts: [0] rows from `offset` that pass the filter,
  // [1] the position after the chunk.
  Tensor counts_dev;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({2}), &counts_dev));
  int64_t counts[2] = {0, 0};
  // Exclusive, unlike the CPU export's shared lock: the export's scans use
  // scratch that the GPU table owns, so two exports may not overlap.
  ::tensorflow::mutex_lock lock(*mu());
  int64_t size = 0, slots = 0;
  TF_RETURN_IF_ERROR(Error(ctx, sok_gpu_table_size(table_, &size, &slots, stream)));
  const bool filtered = args.updated_after != std::numeric_limits<int64_t>::min();
  // How many rows from `offset` pass the filter: all of them, or a counting pass.
  int64_t count = std::max<int64_t>(0, size - args.offset);
  if (filtered) {
    TF_RETURN_IF_ERROR(Error(ctx, sok_gpu_table_export(table_, args.offset, args.updated_after,
                                                       nullptr, nullptr, nullptr, nullptr, 0,
                                                       I64(&counts_dev), stream)));
    TF_RETURN_IF_ERROR(CudaStatus(
        sok_gpu_copy_to_host(counts, I64(&counts_dev), sizeof(int64_t), stream),
        "reading the export count back"));
    count = counts[0];
  }
  const int64_t m = std::min(count, args.limit);
  Tensor *keys_out = nullptr, *rows = nullptr, *ts = nullptr, *freq = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({m}), &keys_out));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({m, d}), &rows));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({m}), &ts));
  TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({m}), &freq));
  // int64 keys go straight to the output; int32 ones through int64
  // scratch, narrowed at the end.
  Tensor keys_dev;
  int64_t* keys = nullptr;
  const bool narrow = keys_out->dtype() != ::tensorflow::DT_INT64;
  if (!narrow) {
    keys = I64(keys_out);
  } else {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                          TensorShape({std::max<int64_t>(m, 1)}), &keys_dev));
    keys = I64(&keys_dev);
  }
  if (m > 0) {
    TF_RETURN_IF_ERROR(Error(ctx, sok_gpu_table_export(table_, args.offset, args.updated_after,
                                                       keys, rows->flat<float>().data(), I64(ts),
                                                       I64(freq), m, I64(&counts_dev), stream)));
  }
  if (narrow) TF_RETURN_IF_ERROR(KeysToOutput(ctx, keys, m, keys_out));
  // As the CPU export: a full chunk ends after its last row; a short one
  // reached the table's end (or started past it).
  int64_t next = std::max(args.offset, size);
  if (m == args.limit) {
    if (!filtered) {
      next = args.offset + m;
    } else {
      TF_RETURN_IF_ERROR(CudaStatus(
          sok_gpu_copy_to_host(counts, I64(&counts_dev), sizeof(counts), stream),
          "reading the export's end back"));
      next = counts[1];
    }
  }
  return ScalarOutput(ctx, 4, next);
}

Status GpuTableResource::CountDistinct(OpKernelContext* ctx, const int64_t* keys, int64_t n,
                                       int64_t* distinct) {
  // The unique launcher numbers its hash set's slots in 32 bits.
  if (n >= (int64_t{1} << 30)) {
    return errors::InvalidArgument("a replacing import of ", n, " keys into a GPU table: ",
                                   "the GPU counts distinct keys of fewer than 2^30");
  }
  void* stream = GpuStreamOf(ctx);
  Tensor unique_keys, positions, count, temp;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &unique_keys));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &positions));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &count));
  TF_RETURN_IF_ERROR(LaunchWithScratch(
      ctx, "counting the keys to import", &temp, [&](void* scratch, size_t* bytes) {
        return sok_unique_in_set_i64_i64(keys, n, 0, I64(&unique_keys), I64(&positions), nullptr,
                                         I64(&count), scratch, bytes, stream);
      }));
  return CudaStatus(sok_gpu_copy_to_host(distinct, I64(&count), sizeof(int64_t), stream),
                    "reading the count of keys to import");
}

// An int64 host tensor of the op's inputs, copied to a temporary on the
// device (*out: nullptr where it is empty). Through a vector: an input in
// pinned host memory would be copied truly asynchronously, after this op
// may have released it.
static Status ToDevice(OpKernelContext* ctx, const Tensor& host, Tensor* temp,
                       const int64_t** out, const char* what) {
  *out = nullptr;
  if (host.NumElements() == 0) return OkStatus();
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, host.shape(), temp));
  const TfInt64* h = host.flat<TfInt64>().data();
  const std::vector<int64_t> staged(h, h + host.NumElements());
  TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(I64(temp), staged.data(),
                                                       sizeof(int64_t) * staged.size(),
                                                       GpuStreamOf(ctx)),
                                what));
  *out = I64(temp);
  return OkStatus();
}

Status GpuTableResource::Import(OpKernelContext* ctx, const Tensor& keys_in, const Tensor& rows,
                                bool replace) {
  Tensor widened;
  const int64_t* keys = nullptr;
  TF_RETURN_IF_ERROR(KeysAsInt64(ctx, keys_in, &widened, &keys));
  const int64_t n = keys_in.NumElements();
  void* stream = GpuStreamOf(ctx);
  // Host memory, checked by the op; the table's clock moves past the
  // latest timestamp (core::DynamicTable::ClockPast).
  const Tensor& ts = ctx->input(3);
  const Tensor& freq = ctx->input(4);
  Tensor ts_dev, freq_dev;
  const int64_t* times = nullptr;
  const int64_t* counts = nullptr;
  TF_RETURN_IF_ERROR(ToDevice(ctx, ts, &ts_dev, &times, "copying timestamps to the GPU"));
  TF_RETURN_IF_ERROR(ToDevice(ctx, freq, &freq_dev, &counts, "copying frequencies to the GPU"));
  int64_t latest = 0;
  for (int64_t i = 0; i < ts.NumElements(); ++i) {
    latest = std::max<int64_t>(latest, ts.flat<TfInt64>()(i));
  }
  SokGpuTableResult result{0, -1};
  // A replace that cannot fit must fail before the table is emptied: only
  // more keys than the table's bound can hold too many distinct ones.
  if (replace && n > row_limit()) {
    int64_t distinct = 0;
    TF_RETURN_IF_ERROR(CountDistinct(ctx, keys, n, &distinct));
    if (distinct > row_limit()) {
      result.distinct_keys = distinct;
      return Error(ctx, SOK_GPU_TABLE_TOO_MANY_KEYS, &result);
    }
  }
  // The keys an import evicts leave the shadows; a replacing import (a
  // restore) leaves them as they are: the restore that made it decides
  // which keys they keep.
  Tensor evicted;
  const bool follow = !replace && HasShadows();
  if (follow) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                          TensorShape({std::max<int64_t>(n, 1)}), &evicted));
  }
  {
    ::tensorflow::mutex_lock lock(*mu());
    // replace: emptied and filled in one step of the stream, under the lock.
    if (replace) TF_RETURN_IF_ERROR(Error(ctx, sok_gpu_table_clear(table_, stream)));
    const int rc = sok_gpu_table_import(table_, keys, n, rows.flat<float>().data(), times, counts,
                                        Tick(), follow ? I64(&evicted) : nullptr, &result,
                                        stream);
    TF_RETURN_IF_ERROR(Error(ctx, rc, &result));
    now_ = std::max(now_, latest);
  }
  if (follow) TF_RETURN_IF_ERROR(DropFromShadows(ctx, I64(&evicted), result.num_evicted));
  return ScalarOutput(ctx, 0, result.num_evicted);
}

Status GpuTableResource::Clear(OpKernelContext* ctx) {
  ::tensorflow::mutex_lock lock(*mu());
  return Error(ctx, sok_gpu_table_clear(table_, GpuStreamOf(ctx)));
}

Status GpuTableResource::ApplyPresent(OpKernelContext* ctx, const Tensor& keys_in,
                                      const int64_t* keys,
                                      const std::vector<GpuTableResource*>& slots,
                                      const core::SparseApplyConfig& c, bool* applied) {
  *applied = false;
  const int64_t n = keys_in.NumElements();
  const int num_slots = static_cast<int>(slots.size());
  if (num_slots > core::kMaxSlots) return OkStatus();
  // Each table locked once: slot tables that repeat, or name this table,
  // take the general update (whose locks are taken one at a time).
  for (int a = 0; a < num_slots; ++a) {
    if (slots[a] == this) return OkStatus();
    for (int b = 0; b < a; ++b) {
      if (slots[a] == slots[b]) return OkStatus();
    }
  }
  void* stream = GpuStreamOf(ctx);
  // Every table locked for the whole update, in address order, so that two
  // updates sharing tables cannot wait on each other. (TensorFlow defines
  // mutex_lock(x) as a macro that rejects unnamed locks; the alias names
  // the class.)
  using Lock = ::tensorflow::mutex_lock;
  std::vector<GpuTableResource*> order(slots.begin(), slots.end());
  order.push_back(this);
  std::sort(order.begin(), order.end(), std::less<GpuTableResource*>());
  std::vector<std::unique_ptr<Lock>> locks;
  for (GpuTableResource* r : order) locks.emplace_back(new Lock(*r->mu()));
  bool distinct = false;
  if (!KnownPresent(keys_in, &distinct) || !distinct) return OkStatus();
  Tensor evicted;
  if (num_slots > 0) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &evicted));
  }
  std::vector<SokGpuTable*> slot_handles;
  for (GpuTableResource* slot : slots) {
    SokGpuTableResult result{0, -1};
    const int rc = sok_gpu_table_find_or_insert(slot->table_, keys, n, slot->Tick(), nullptr,
                                                I64(&evicted), nullptr, &result, stream);
    TF_RETURN_IF_ERROR(slot->Error(ctx, rc, &result));
    slot_handles.push_back(slot->table_);
  }
  TF_RETURN_IF_ERROR(Error(
      ctx, sok_gpu_table_apply_present(
               table_, slot_handles.data(), num_slots, keys, n,
               ctx->input(2).flat<float>().data(), c.algorithm, c.formulas, c.nesterov,
               ctx->input(3).flat<float>().data(),
               reinterpret_cast<const int64_t*>(ctx->input(4).flat<TfInt64>().data()), Tick(),
               stream)));
  *applied = true;
  return OkStatus();
}

// The same steps as the CPU table's, on the op's stream with the table
// launchers, the formula on the gathered rows (sok_dense_apply_f32, hyper
// and step read on the device), nothing read back but what the launchers
// read (a table that must grow or make room). Keys this table knows are
// distinct and present (its unique find-or-insert's output, the usual
// training step) take ApplyPresent instead: the same formula on the rows in
// place.
Status GpuTableResource::SparseApply(OpKernelContext* ctx, const Tensor& keys_in,
                                     const std::vector<TableResource*>& slot_tables,
                                     const core::SparseApplyConfig& c) {
  const int64_t n = keys_in.NumElements();
  if (n == 0) return OkStatus();
  Tensor widened;
  const int64_t* keys = nullptr;
  TF_RETURN_IF_ERROR(KeysAsInt64(ctx, keys_in, &widened, &keys));
  // The op checked that every slot table is on this device: a GPU table.
  std::vector<GpuTableResource*> slots;
  for (TableResource* s : slot_tables) slots.push_back(static_cast<GpuTableResource*>(s));
  const int num_slots = static_cast<int>(slots.size());
  const int64_t d = dim();
  void* stream = GpuStreamOf(ctx);
  bool applied = false;
  TF_RETURN_IF_ERROR(ApplyPresent(ctx, keys_in, keys, slots, c, &applied));
  if (applied) return OkStatus();
  // Scratch: the table's rows and each slot's, [n, dim] each, and room
  // for the keys a slot table's insert may evict.
  Tensor scratch, evicted;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                        TensorShape({1 + num_slots, n, d}), &scratch));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &evicted));
  float* rows = scratch.flat<float>().data();
  const auto slot_rows = [&](int s) { return rows + (1 + s) * n * d; };
  // Keys the table knows are a unique op's output are distinct for the
  // slot tables too.
  bool distinct = false;
  // The keys' rows, then every key made present as the write-back below
  // would make it, in one locked step. A key evicted since its lookup reads
  // as zeros and is put back, which may evict other keys: they leave the
  // slot tables before any slot row is read, so a key that comes back later
  // starts afresh in every slot, and a slot table (as bounded as this one)
  // never has to evict a key this table keeps.
  SokGpuTableResult inserted{0, -1};
  // Puts the table's earlier note back when the op ends, however it ends.
  struct NoteRestorer {
    GpuTableResource* table;
    Tensor keys;
    int64_t removals;
    bool distinct;
    ~NoteRestorer() {
      ::tensorflow::mutex_lock lock(*table->mu());
      table->present_keys_ = keys;
      table->present_removals_ = removals;
      table->present_distinct_ = distinct;
    }
  };
  std::unique_ptr<NoteRestorer> restore_note;
  {
    ::tensorflow::mutex_lock lock(*mu());
    restore_note.reset(
        new NoteRestorer{this, present_keys_, present_removals_, present_distinct_});
    KnownPresent(keys_in, &distinct);
    TF_RETURN_IF_ERROR(
        Error(ctx, sok_gpu_table_find(table_, keys, n, nullptr, rows, nullptr, stream)));
    TF_RETURN_IF_ERROR(Error(
        ctx, sok_gpu_table_insert_missing(table_, keys, n, Tick(), I64(&evicted), &inserted,
                                          stream),
        &inserted));
    // Noted for this op's write-back (no second insert, which would wait
    // again for a full table), and the earlier note put back after it.
    NotePresent(keys_in, distinct);
  }
  // Out of the slot tables, then `evicted` is free for their inserts.
  TF_RETURN_IF_ERROR(DropFromShadows(ctx, I64(&evicted), inserted.num_evicted, slot_tables));
  for (int s = 0; s < num_slots; ++s) {
    GpuTableResource* slot = slots[s];
    SokGpuTableResult result{0, -1};
    ::tensorflow::mutex_lock lock(*slot->mu());
    const int rc = sok_gpu_table_find_or_insert(slot->table_, keys, n, slot->Tick(), slot_rows(s),
                                                I64(&evicted), nullptr, &result, stream);
    TF_RETURN_IF_ERROR(slot->Error(ctx, rc, &result));
    slot->NotePresent(keys_in, distinct);
  }
  TF_RETURN_IF_ERROR(CudaStatus(
      sok_dense_apply_f32(rows, num_slots > 0 ? slot_rows(0) : nullptr,
                          num_slots > 1 ? slot_rows(1) : nullptr,
                          num_slots > 2 ? slot_rows(2) : nullptr,
                          ctx->input(2).flat<float>().data(), n, d, c.algorithm, c.formulas,
                          c.nesterov, ctx->input(3).flat<float>().data(),
                          reinterpret_cast<const int64_t*>(ctx->input(4).flat<TfInt64>().data()),
                          stream),
      "sok_dense_apply_f32"));
  // The keys are all present (unless another op removed some meanwhile):
  // the insert above made them so in this table, the find-or-insert above
  // in the slots, each noted for this op's own write-back and forgotten
  // after it.
  const auto write_back = [&](GpuTableResource* t, const float* values) {
    SokGpuTableResult result{0, -1};
    return t->ScatterRows(ctx, keys_in, keys, values, /*update=*/2, &result);
  };
  TF_RETURN_IF_ERROR(write_back(this, rows));
  restore_note.reset();
  for (int s = 0; s < num_slots; ++s) {
    TF_RETURN_IF_ERROR(write_back(slots[s], slot_rows(s)));
    // The note was for this op's write-back only (the keys are an input).
    ::tensorflow::mutex_lock lock(*slots[s]->mu());
    slots[s]->NotePresent(Tensor());
  }
  return OkStatus();
}

}  // namespace

Status CheckGpuTableConfig(const core::TableConfig& config) {
  if (config.dim > std::numeric_limits<int32_t>::max() / 4) {
    return errors::InvalidArgument("dim must be <= ", std::numeric_limits<int32_t>::max() / 4,
                                   " for a GPU table; got ", config.dim);
  }
  if (config.max_rows > SOK_GPU_TABLE_MAX_ROWS) {
    return errors::InvalidArgument("a bounded GPU table holds at most ", SOK_GPU_TABLE_MAX_ROWS,
                                   " rows; got max_capacity=", config.max_rows);
  }
  if (config.max_rows == 0 && config.init_capacity > SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS) {
    return errors::InvalidArgument("an unbounded GPU table holds at most ",
                                   SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS, " rows; got init_capacity=",
                                   config.init_capacity);
  }
  return OkStatus();
}

Status NewGpuTable(OpKernelContext* ctx, const core::TableConfig& table_config,
                   DataType key_dtype, TableResource** out) {
  void* stream = GpuStreamOf(ctx);
  const SokGpuTableConfig config = LauncherConfig(table_config);
  // The device's allocator lives as long as the device, which outlives
  // the resources of its resource manager.
  SokGpuAllocator allocator;
  allocator.alloc = TfAlloc;
  allocator.free = TfFree;
  allocator.context = ctx->device()->GetAllocator(::tensorflow::AllocatorAttributes());
  SokGpuTable* t = nullptr;
  const int rc = sok_gpu_table_create(&config, &allocator, stream, &t);
  if (rc != 0) {
    return TableError(ctx, rc, nullptr, config.max_rows, config.max_rows > 0,
                      ::tensorflow::HandleFromInput(ctx, 0).name());
  }
  *out = new GpuTableResource(t, config.dim, key_dtype, stream, config.max_rows > 0);
  return OkStatus();
}

}  // namespace dynamic_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
