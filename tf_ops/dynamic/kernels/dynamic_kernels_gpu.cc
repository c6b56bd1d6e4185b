// GPU kernels of the dynamic-table ops: a resource that owns a GPU hash
// table (dynamic_table.cu through dynamic_table_launcher.h) on the device
// the create op runs on, and OpKernels that check their inputs on the host
// exactly as the CPU kernels do (dynamic_kernel_common.h), then call the C
// launchers on the op's stream. Compiled only when the build found a CUDA
// toolkit (SOK_GRAPH_WITH_CUDA); machines without a GPU never place the ops
// here.
//
// The GPU table stores int64 keys. An int32-keyed table keeps them there
// widened: int32 keys (in device memory, like every tensor of a registered
// GPU kernel that is not declared HostMemory) are widened on the device on
// the way in and narrowed on the way out (evicted keys, exports; exact, as
// every stored key came in as an int32). Placement follows the resource:
// every op on a table runs where its handle op runs.
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
#include <limits>
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
#include "tf_ops/optimizer/kernels/sparse_apply_launcher.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"
#include "tf_ops/util/kernels/unique_set_hint.h"
#include "tf_ops/util/kernels/util_launcher.h"

namespace sok_graph {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;
namespace dk = ::sok_graph::dynamic_kernels;

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
// table. `result` (may be null) tells how many distinct keys a batch had.
Status TableError(OpKernelContext* ctx, int rc, const SokGpuTableResult* result,
                  int64_t row_limit) {
  if (rc == 0) return OkStatus();
  const std::string where = ctx->op_kernel().type_string() + " on the GPU dynamic table '" +
                            ::tensorflow::HandleFromInput(ctx, 0).name() + "': ";
  switch (rc) {
    case SOK_GPU_TABLE_TOO_MANY_KEYS:
      return errors::InvalidArgument(where, "the batch has ",
                                     result != nullptr ? result->distinct_keys : -1,
                                     " distinct keys but the table holds at most ", row_limit,
                                     " rows (keys used in this batch are never evicted)");
    case SOK_GPU_TABLE_BAD_ARGUMENT:
      return errors::InvalidArgument(where, "the GPU table rejected its arguments (a table ",
                                     "that failed to allocate, a negative count, dim < 1 or an ",
                                     "unknown mode)");
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

// Owns one launcher table on the device that created it. Every call that
// changes the table (or its host-side bookkeeping: sizes, scratch) holds the
// lock alone; finds share it.
class GpuTableResource : public ::tensorflow::ResourceBase {
 public:
  GpuTableResource(SokGpuTable* table, int64_t dim, DataType key_dtype, void* stream)
      : table_(table), dim_(dim), key_dtype_(key_dtype), stream_(stream) {}
  ~GpuTableResource() override {
    // Waits for the device's stream (the one every op of this table ran
    // on) before freeing.
    sok_gpu_table_destroy(table_, stream_);
  }

  std::string DebugString() const override {
    return "SokDynamicTable(GPU, dim=" + std::to_string(dim_) + ")";
  }
  TfInt64 MemoryUsed() const override { return sok_gpu_table_memory_bytes(table_); }

  ::tensorflow::mutex* mu() { return &mu_; }
  SokGpuTable* table() { return table_; }
  int64_t dim() const { return dim_; }
  DataType key_dtype() const { return key_dtype_; }
  int64_t row_limit() const { return sok_gpu_table_row_limit(table_); }
  // The time of a call that changes the table, as core::DynamicTable::Tick:
  // the wall clock in microseconds, strictly after every earlier call.
  // Call with the lock held.
  int64_t Tick() {
    now_ = std::max(dk::WallMicros(), now_ + 1);
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

 private:
  ::tensorflow::mutex mu_;
  SokGpuTable* const table_;
  const int64_t dim_;
  const DataType key_dtype_;
  void* const stream_;
  int64_t now_ = 0;
  Tensor present_keys_;
  int64_t present_removals_ = 0;
  bool present_distinct_ = false;
};

int64_t* I64(Tensor* t) { return reinterpret_cast<int64_t*>(t->flat<TfInt64>().data()); }

// The table of input 0 and, if asked, the keys of input 1 as int64 in
// device memory: the tensor itself for int64 keys, a widened copy of int32
// keys (DynamicTableAndKeys of dynamic_kernels.cc on the GPU).
struct GpuTableAndKeys {
  GpuTableResource* table = nullptr;
  const int64_t* keys = nullptr;
  int64_t n = 0;
  Tensor widened;

  ~GpuTableAndKeys() {
    if (table != nullptr) table->Unref();
  }
  Status Read(OpKernelContext* ctx, bool with_keys) {
    TF_RETURN_IF_ERROR(dk::LookupTable(ctx, &table));
    if (!with_keys) return OkStatus();
    const Tensor& k = ctx->input(1);
    TF_RETURN_IF_ERROR(dk::CheckKeys(k, table->key_dtype()));
    n = k.NumElements();
    if (n > kMaxKeysPerCall) {
      return errors::InvalidArgument("keys has ", n, " entries; the GPU table takes at most ",
                                     kMaxKeysPerCall, " per call");
    }
    if (k.dtype() == ::tensorflow::DT_INT64) {
      keys = reinterpret_cast<const int64_t*>(k.flat<TfInt64>().data());
      return OkStatus();
    }
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                          TensorShape({std::max<int64_t>(n, 1)}), &widened));
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_widen_i32(k.flat<int32_t>().data(), I64(&widened), n,
                                                  GpuStreamOf(ctx)),
                                "widening int32 keys"));
    keys = I64(&widened);
    return OkStatus();
  }
};

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

class CreateGpuOp : public OpKernel {
 public:
  explicit CreateGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, dk::ParseCreateAttrs(ctx, &config_, &key_dtype_));
    OP_REQUIRES(ctx, config_.dim <= std::numeric_limits<int32_t>::max() / 4,
                errors::InvalidArgument("dim must be <= ", std::numeric_limits<int32_t>::max() / 4,
                                        " for a GPU table; got ", config_.dim));
    OP_REQUIRES(ctx, config_.max_rows <= SOK_GPU_TABLE_MAX_ROWS,
                errors::InvalidArgument("a bounded GPU table holds at most ",
                                        SOK_GPU_TABLE_MAX_ROWS, " rows; got max_capacity=",
                                        config_.max_rows));
    OP_REQUIRES(ctx, config_.max_rows > 0 || config_.init_capacity <= SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS,
                errors::InvalidArgument("an unbounded GPU table holds at most ",
                                        SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS,
                                        " rows; got init_capacity=", config_.init_capacity));
    std::memset(&gpu_config_, 0, sizeof(gpu_config_));
    gpu_config_.dim = config_.dim;
    gpu_config_.init_capacity = config_.init_capacity;
    gpu_config_.max_rows = config_.max_rows;
    gpu_config_.eviction = config_.eviction == core::Eviction::kLfu ? 1 : 0;
    gpu_config_.init_kind = static_cast<int32_t>(config_.initializer.kind);
    gpu_config_.mean = config_.initializer.mean;
    gpu_config_.stddev = config_.initializer.stddev;
    gpu_config_.minval = config_.initializer.minval;
    gpu_config_.maxval = config_.initializer.maxval;
    gpu_config_.value = config_.initializer.value;
    gpu_config_.seed = config_.initializer.seed;
    gpu_config_.hbm_bytes = config_.hbm_bytes;
  }

  void Compute(OpKernelContext* ctx) override {
    GpuTableResource* table = nullptr;
    void* stream = GpuStreamOf(ctx);
    const SokGpuTableConfig config = gpu_config_;
    const DataType key_dtype = key_dtype_;
    // The device's allocator lives as long as the device, which outlives
    // the resources of its resource manager.
    SokGpuAllocator allocator;
    allocator.alloc = TfAlloc;
    allocator.free = TfFree;
    allocator.context = ctx->device()->GetAllocator(::tensorflow::AllocatorAttributes());
    OP_REQUIRES_OK(ctx, ::tensorflow::LookupOrCreateResource<GpuTableResource>(
                            ctx, ::tensorflow::HandleFromInput(ctx, 0), &table,
                            [ctx, stream, &config, &allocator,
                             key_dtype](GpuTableResource** out) -> Status {
                              SokGpuTable* t = nullptr;
                              const int rc = sok_gpu_table_create(&config, &allocator, stream, &t);
                              if (rc != 0) return TableError(ctx, rc, nullptr, config.max_rows);
                              *out = new GpuTableResource(t, config.dim, key_dtype, stream);
                              return OkStatus();
                            }));
    ::tensorflow::core::ScopedUnref unref(table);
    OP_REQUIRES_OK(ctx, dk::CheckExistingTable(table->dim(), table->key_dtype(), config_.dim,
                                               key_dtype_));
  }

 private:
  core::TableConfig config_;
  DataType key_dtype_;
  SokGpuTableConfig gpu_config_;
};

class IsInitializedGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    GpuTableResource* table = nullptr;
    const bool exists =
        ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), &table).ok();
    if (exists) table->Unref();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = exists;
  }
};

// The outputs num_evicted (at `first`) and evicted_keys (next) of an
// inserting op, from the launcher's `evicted` keys (device, int64).
Status EvictionOutputs(OpKernelContext* ctx, int first, Tensor* evicted, int64_t num_evicted) {
  TF_RETURN_IF_ERROR(dk::ScalarOutput(ctx, first, num_evicted));
  Tensor* keys = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(first + 1, TensorShape({num_evicted}), &keys));
  return KeysToOutput(ctx, I64(evicted), num_evicted, keys);
}

class FindOrInsertGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit FindOrInsertGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    GpuTableResource* table = in.table;
    OP_REQUIRES_OK(ctx, dk::CheckDimAttr(dim_, table->dim()));
    void* stream = GpuStreamOf(ctx);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({in.n, dim_}), &rows));
    // Room for every key (and row) the call could evict (at most one per key).
    const int64_t room = std::max<int64_t>(in.n, 1);
    Tensor evicted, evicted_rows;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({room}), &evicted));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({room, dim_}),
                                           &evicted_rows));
    SokGpuTableResult result{0, -1};
    {
      ::tensorflow::mutex_lock lock(*table->mu());
      const int rc = sok_gpu_table_find_or_insert(
          table->table(), in.keys, in.n, table->Tick(), rows->flat<float>().data(), I64(&evicted),
          evicted_rows.flat<float>().data(), &result, stream);
      OP_REQUIRES_OK(ctx, TableError(ctx, rc, &result, table->row_limit()));
    }
    OP_REQUIRES_OK(ctx, EvictionOutputs(ctx, 1, &evicted, result.num_evicted));
    Tensor* out_rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({result.num_evicted, dim_}),
                                             &out_rows));
    if (result.num_evicted > 0) {
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_on_device(
                                         out_rows->flat<float>().data(),
                                         evicted_rows.flat<float>().data(),
                                         sizeof(float) * result.num_evicted * dim_, stream),
                                     "copying evicted rows"));
    }
  }

 private:
  int dim_ = 0;
};

// SokDynamicTableUniqueFindOrInsert on the GPU: the unique launcher leaves
// the distinct keys and their count on the device, and the table reads the
// count back together with what its insert must know: one wait where
// SokUnique and a find-or-insert of a full table wait once each. Unique's
// hash set is sized by the op's last batch, as SokUnique's; the count of a
// batch that overflows it comes back negative, and the batch runs again
// with the full set (two more waits, once).
class UniqueFindOrInsertGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit UniqueFindOrInsertGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    GpuTableResource* table = in.table;
    OP_REQUIRES_OK(ctx, dk::CheckDimAttr(dim_, table->dim()));
    const int64_t n = in.n;
    // The unique launcher numbers its hash set's slots in 32 bits.
    OP_REQUIRES(ctx, n < (int64_t{1} << 30),
                errors::InvalidArgument("keys has ", n, " entries; the GPU op takes fewer than "
                                        "2^30"));
    void* stream = GpuStreamOf(ctx);
    Tensor* positions = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &positions));
    Tensor distinct_keys, count, evicted, temp;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                           TensorShape({std::max<int64_t>(n, 1)}),
                                           &distinct_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &count));
    // Room for every key the call could evict (at most one per distinct key).
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_INT64,
                            TensorShape({std::max<int64_t>(std::min(n, table->row_limit()), 1)}),
                            &evicted));
    SokGpuTableResult result{0, -1};
    int64_t u = 0;
    ::tensorflow::mutex_lock lock(*table->mu());
    if (n > 0) {
      // Unique, then the table's exact path, which reads the distinct count
      // (with its own counters) and leaves it in u: -1 when unique's set
      // overflowed.
      OP_REQUIRES_OK(
          ctx, hint_.Run(
                   n,
                   [&](int64_t set_slots, int64_t* distinct) -> Status {
                     TF_RETURN_IF_ERROR(LaunchWithScratch(
                         ctx, "unique keys", &temp, [&](void* scratch, size_t* bytes) {
                           return sok_unique_in_set_i64_i64(in.keys, n, set_slots,
                                                            I64(&distinct_keys), I64(positions),
                                                            nullptr, I64(&count), scratch,
                                                            bytes, stream);
                         }));
                     const int rc = sok_gpu_table_ensure_distinct(
                         table->table(), I64(&distinct_keys), I64(&count), n, table->Tick(),
                         I64(&evicted), &result, distinct, stream);
                     return TableError(ctx, rc, &result, table->row_limit());
                   },
                   &u));
    }
    Tensor *unique_keys = nullptr, *rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &unique_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({u, dim_}), &rows));
    OP_REQUIRES_OK(ctx, TableError(ctx, sok_gpu_table_gather_ensured(table->table(), u,
                                                                     rows->flat<float>().data(),
                                                                     stream),
                                   nullptr, table->row_limit()));
    OP_REQUIRES_OK(ctx, KeysToOutput(ctx, I64(&distinct_keys), u, unique_keys));
    table->NotePresent(*unique_keys, /*distinct=*/true);
    OP_REQUIRES_OK(ctx, EvictionOutputs(ctx, 3, &evicted, result.num_evicted));
  }

 private:
  int dim_ = 0;
  UniqueSetHint hint_;
};

class FindGpuOp : public OpKernel {
 public:
  explicit FindGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    GpuTableResource* table = in.table;
    OP_REQUIRES_OK(ctx, dk::CheckDimAttr(dim_, table->dim()));
    std::vector<float> default_row;
    OP_REQUIRES_OK(ctx, dk::ReadDefaultRow(ctx->input(2), dim_, &default_row));
    void* stream = GpuStreamOf(ctx);
    Tensor *rows = nullptr, *found = nullptr, default_dev;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({in.n, dim_}), &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({in.n}), &found));
    if (in.n == 0) return;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({dim_}),
                                           &default_dev));
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_device(default_dev.flat<float>().data(),
                                                        default_row.data(),
                                                        sizeof(float) * dim_, stream),
                                 "copying default_value to the GPU"));
    ::tensorflow::tf_shared_lock lock(*table->mu());
    const int rc = sok_gpu_table_find(table->table(), in.keys, in.n,
                                      default_dev.flat<float>().data(), rows->flat<float>().data(),
                                      reinterpret_cast<uint8_t*>(found->flat<bool>().data()),
                                      stream);
    OP_REQUIRES_OK(ctx, TableError(ctx, rc, nullptr, table->row_limit()));
  }

 private:
  int dim_ = 0;
};

// rows applied to the rows of `keys` (the tensor; `device_keys`, n: its
// int64 keys on the device) in `mode` (the launcher's), without inserting
// (and so without waiting) when the table knows they are all present, and
// without ordering them when it knows they are distinct.
Status ScatterRows(OpKernelContext* ctx, GpuTableResource* table, const Tensor& keys,
                   const int64_t* device_keys, int64_t n, const float* rows, int mode,
                   SokGpuTableResult* result) {
  ::tensorflow::mutex_lock lock(*table->mu());
  bool distinct = false;
  if (table->KnownPresent(keys, &distinct)) {
    return TableError(ctx, sok_gpu_table_scatter_present(table->table(), device_keys, n, rows,
                                                         mode, distinct, table->Tick(),
                                                         GpuStreamOf(ctx)),
                      nullptr, table->row_limit());
  }
  const int rc = sok_gpu_table_scatter(table->table(), device_keys, n, rows, mode, table->Tick(),
                                       result, GpuStreamOf(ctx));
  return TableError(ctx, rc, result, table->row_limit());
}

class ScatterGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit ScatterGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    core::ScatterMode mode = core::ScatterMode::kAdd;
    OP_REQUIRES_OK(ctx, dk::ParseScatterMode(ctx, &mode));
    // The launcher's modes: 0 add, 1 subtract, 2 update.
    mode_ = mode == core::ScatterMode::kAdd ? 0 : mode == core::ScatterMode::kSub ? 1 : 2;
  }
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    GpuTableResource* table = in.table;
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES_OK(ctx, dk::CheckRows(rows, in.n, table->dim()));
    SokGpuTableResult result{0, -1};
    OP_REQUIRES_OK(ctx, ScatterRows(ctx, table, ctx->input(1), in.keys, in.n,
                                    rows.flat<float>().data(), mode_, &result));
    OP_REQUIRES_OK(ctx, dk::ScalarOutput(ctx, 0, result.num_evicted));
  }

 private:
  int mode_ = 0;
};

class RemoveGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    GpuTableResource* table = in.table;
    // num_removed stays on the device: no wait for the stream.
    Tensor* removed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &removed));
    ::tensorflow::mutex_lock lock(*table->mu());
    const int rc = sok_gpu_table_remove(table->table(), in.keys, in.n, I64(removed),
                                        GpuStreamOf(ctx));
    OP_REQUIRES_OK(ctx, TableError(ctx, rc, nullptr, table->row_limit()));
  }
};

class StatsGpuOp : public DeviceWaitingKernel<> {
 public:
  using DeviceWaitingKernel::DeviceWaitingKernel;
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, false));
    GpuTableResource* table = in.table;
    int64_t size = 0, slots = 0, evicted = 0, bytes = 0;
    {
      ::tensorflow::mutex_lock lock(*table->mu());
      const int rc = sok_gpu_table_size(table->table(), &size, &slots, GpuStreamOf(ctx));
      OP_REQUIRES_OK(ctx, TableError(ctx, rc, nullptr, table->row_limit()));
      evicted = sok_gpu_table_evicted_total(table->table());
      bytes = sok_gpu_table_memory_bytes(table->table());
    }
    OP_REQUIRES_OK(ctx, dk::ScalarOutput(ctx, 0, size));
    OP_REQUIRES_OK(ctx, dk::ScalarOutput(ctx, 1, table->row_limit()));
    OP_REQUIRES_OK(ctx, dk::ScalarOutput(ctx, 2, evicted));
    OP_REQUIRES_OK(ctx, dk::ScalarOutput(ctx, 3, bytes));
  }
};

class ExportGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit ExportGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, false));
    GpuTableResource* table = in.table;
    OP_REQUIRES_OK(ctx, dk::CheckDimAttr(dim_, table->dim()));
    dk::ExportArgs args;
    OP_REQUIRES_OK(ctx, dk::ReadExportArgs(ctx, ctx->expected_output_dtype(0), table->key_dtype(),
                                           &args));
    void* stream = GpuStreamOf(ctx);
    // The launcher's counts: [0] rows from `offset` that pass the filter,
    // [1] the position after the chunk.
    Tensor counts_dev;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({2}),
                                           &counts_dev));
    int64_t counts[2] = {0, 0};
    // Exclusive, unlike the CPU export's shared lock: the export's scans use
    // scratch that the GPU table owns, so two exports may not overlap.
    ::tensorflow::mutex_lock lock(*table->mu());
    int64_t size = 0, slots = 0;
    OP_REQUIRES_OK(ctx, TableError(ctx, sok_gpu_table_size(table->table(), &size, &slots, stream),
                                   nullptr, table->row_limit()));
    // How many rows from `offset` pass the filter: all of them, or a counting pass.
    int64_t count = std::max<int64_t>(0, size - args.offset);
    if (args.updated_after != std::numeric_limits<int64_t>::min()) {
      OP_REQUIRES_OK(ctx, TableError(ctx, sok_gpu_table_export(table->table(), args.offset,
                                                               args.updated_after, nullptr,
                                                               nullptr, nullptr, nullptr, 0,
                                                               I64(&counts_dev), stream),
                                     nullptr, table->row_limit()));
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(counts, I64(&counts_dev),
                                                        sizeof(int64_t), stream),
                                   "reading the export count back"));
      count = counts[0];
    }
    const int64_t m = std::min(count, args.limit);
    Tensor *keys_out = nullptr, *rows = nullptr, *ts = nullptr, *freq = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &keys_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m, dim_}), &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({m}), &ts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({m}), &freq));
    // int64 keys go straight to the output; int32 ones through int64
    // scratch, narrowed at the end.
    Tensor keys_dev;
    int64_t* keys = nullptr;
    const bool narrow = keys_out->dtype() != ::tensorflow::DT_INT64;
    if (!narrow) {
      keys = I64(keys_out);
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                             TensorShape({std::max<int64_t>(m, 1)}), &keys_dev));
      keys = I64(&keys_dev);
    }
    if (m > 0) {
      OP_REQUIRES_OK(ctx, TableError(ctx, sok_gpu_table_export(
                                              table->table(), args.offset, args.updated_after,
                                              keys, rows->flat<float>().data(), I64(ts), I64(freq),
                                              m, I64(&counts_dev), stream),
                                     nullptr, table->row_limit()));
    }
    if (narrow) OP_REQUIRES_OK(ctx, KeysToOutput(ctx, keys, m, keys_out));
    // As the CPU export: a full chunk ends after its last row; a short one
    // reached the table's end (or started past it).
    int64_t next = std::max(args.offset, size);
    if (m == args.limit) {
      if (args.updated_after == std::numeric_limits<int64_t>::min()) {
        next = args.offset + m;
      } else {
        OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(counts, I64(&counts_dev),
                                                          sizeof(counts), stream),
                                     "reading the export's end back"));
        next = counts[1];
      }
    }
    OP_REQUIRES_OK(ctx, dk::ScalarOutput(ctx, 4, next));
  }

 private:
  int dim_ = 0;
};

class ImportGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit ImportGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("replace", &replace_));
  }
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    GpuTableResource* table = in.table;
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES_OK(ctx, dk::CheckRows(rows, in.n, table->dim()));
    OP_REQUIRES_OK(ctx, dk::CheckImportMetadata(ctx, in.n));
    void* stream = GpuStreamOf(ctx);
    const Tensor& ts = ctx->input(3);
    const Tensor& freq = ctx->input(4);  // host memory, checked above
    Tensor freq_dev;
    const int64_t* counts = nullptr;
    if (freq.NumElements() > 0) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, freq.shape(), &freq_dev));
      // Through a vector: an input in pinned host memory would be copied
      // truly asynchronously, after this op may have released it.
      const TfInt64* f = freq.flat<TfInt64>().data();
      const std::vector<int64_t> staged(f, f + freq.NumElements());
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_device(I64(&freq_dev), staged.data(),
                                                          sizeof(int64_t) * staged.size(),
                                                          stream),
                                   "copying frequencies to the GPU"));
      counts = I64(&freq_dev);
    }
    const int64_t* times =
        ts.NumElements() > 0 ? reinterpret_cast<const int64_t*>(ts.flat<TfInt64>().data())
                             : nullptr;
    SokGpuTableResult result{0, -1};
    // A replace that cannot fit must fail before the table is emptied: only
    // more keys than the table's bound can hold too many distinct ones.
    if (replace_ && in.n > table->row_limit()) {
      int64_t distinct = 0;
      OP_REQUIRES_OK(ctx, CountDistinct(ctx, in.keys, in.n, stream, &distinct));
      if (distinct > table->row_limit()) {
        result.distinct_keys = distinct;
        OP_REQUIRES_OK(ctx, TableError(ctx, SOK_GPU_TABLE_TOO_MANY_KEYS, &result,
                                       table->row_limit()));
      }
    }
    {
      ::tensorflow::mutex_lock lock(*table->mu());
      // replace: emptied and filled in one step of the stream, under the lock.
      if (replace_) {
        OP_REQUIRES_OK(ctx, TableError(ctx, sok_gpu_table_clear(table->table(), stream), nullptr,
                                       table->row_limit()));
      }
      const int rc = sok_gpu_table_import(table->table(), in.keys, in.n,
                                          rows.flat<float>().data(), times, counts, table->Tick(),
                                          &result, stream);
      OP_REQUIRES_OK(ctx, TableError(ctx, rc, &result, table->row_limit()));
    }
    OP_REQUIRES_OK(ctx, dk::ScalarOutput(ctx, 0, result.num_evicted));
  }

 private:
  // *distinct <- the number of distinct keys among keys[0, n) (one wait).
  static Status CountDistinct(OpKernelContext* ctx, const int64_t* keys, int64_t n, void* stream,
                              int64_t* distinct) {
    // The unique launcher numbers its hash set's slots in 32 bits.
    if (n >= (int64_t{1} << 30)) {
      return errors::InvalidArgument("a replacing import of ", n, " keys into a GPU table: ",
                                     "the GPU counts distinct keys of fewer than 2^30");
    }
    Tensor unique_keys, positions, count, temp;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}),
                                          &unique_keys));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &positions));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &count));
    TF_RETURN_IF_ERROR(LaunchWithScratch(
        ctx, "counting the keys to import", &temp, [&](void* scratch, size_t* bytes) {
          return sok_unique_in_set_i64_i64(keys, n, 0, I64(&unique_keys), I64(&positions),
                                           nullptr, I64(&count), scratch, bytes, stream);
        }));
    return CudaStatus(sok_gpu_copy_to_host(distinct, I64(&count), sizeof(int64_t), stream),
                      "reading the count of keys to import");
  }

  bool replace_ = false;
};

class ClearGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, false));
    GpuTableResource* table = in.table;
    ::tensorflow::mutex_lock lock(*table->mu());
    OP_REQUIRES_OK(ctx, TableError(ctx, sok_gpu_table_clear(table->table(), GpuStreamOf(ctx)),
                                   nullptr, table->row_limit()));
  }
};

// SokDynamicSparseApply on the GPU: the same steps as the CPU kernel, on
// the op's stream with the table launchers, the formula on the gathered rows
// (sok_dense_apply_f32, hyper and step read on the device), nothing read
// back but what the launchers read (a table that must grow or make room).
class SparseApplyGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit SparseApplyGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, args_.Parse(ctx));
  }
  void Compute(OpKernelContext* ctx) override {
    GpuTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    GpuTableResource* table = in.table;
    const int64_t dim = table->dim();
    const int64_t n = in.n;
    OP_REQUIRES_OK(ctx, dk::SparseApplyArgs::CheckInputs(ctx, n, dim));
    dk::SlotTables<GpuTableResource> slots;
    OP_REQUIRES_OK(ctx, slots.Lookup(ctx, args_.num_slots, dim, table->key_dtype(),
                                     [](GpuTableResource& r) { return r.dim(); }));
    if (n == 0) return;
    void* stream = GpuStreamOf(ctx);
    // Scratch: the table's rows and each slot's, [n, dim] each, and room
    // for the keys a slot table's insert may evict.
    Tensor scratch, evicted;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                           TensorShape({1 + args_.num_slots, n, dim}), &scratch));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &evicted));
    float* rows = scratch.flat<float>().data();
    const auto slot_rows = [&](int s) { return rows + (1 + s) * n * dim; };
    // Keys the table knows are a unique op's output are distinct for the
    // slot tables too.
    bool distinct = false;
    {
      ::tensorflow::tf_shared_lock lock(*table->mu());
      table->KnownPresent(ctx->input(1), &distinct);
      OP_REQUIRES_OK(ctx, TableError(ctx, sok_gpu_table_find(table->table(), in.keys, n, nullptr,
                                                             rows, nullptr, stream),
                                     nullptr, table->row_limit()));
    }
    for (int s = 0; s < args_.num_slots; ++s) {
      GpuTableResource* slot = slots.tables[s];
      SokGpuTableResult result{0, -1};
      ::tensorflow::mutex_lock lock(*slot->mu());
      const int rc = sok_gpu_table_find_or_insert(slot->table(), in.keys, n, slot->Tick(),
                                                  slot_rows(s), I64(&evicted), nullptr, &result,
                                                  stream);
      OP_REQUIRES_OK(ctx, TableError(ctx, rc, &result, slot->row_limit()));
      slot->NotePresent(ctx->input(1), distinct);
    }
    const core::SparseApplyConfig c = args_.config;
    OP_REQUIRES_OK(ctx, CudaStatus(sok_dense_apply_f32(
                                       rows, args_.num_slots > 0 ? slot_rows(0) : nullptr,
                                       args_.num_slots > 1 ? slot_rows(1) : nullptr,
                                       args_.num_slots > 2 ? slot_rows(2) : nullptr,
                                       ctx->input(2).flat<float>().data(), n, dim, c.algorithm,
                                       c.tf1, c.nesterov, ctx->input(3).flat<float>().data(),
                                       reinterpret_cast<const int64_t*>(
                                           ctx->input(4).flat<TfInt64>().data()),
                                       stream),
                                   "sok_dense_apply_f32"));
    // The keys are usually all present: the step's lookup inserted them
    // (the table's, when they are its unique find-or-insert's output), or
    // the find-or-insert above did (the slots', noted for this op's own
    // write-back and forgotten after it).
    const auto write_back = [&](GpuTableResource* t, const float* values) {
      SokGpuTableResult result{0, -1};
      return ScatterRows(ctx, t, ctx->input(1), in.keys, n, values, /*update=*/2, &result);
    };
    OP_REQUIRES_OK(ctx, write_back(table, rows));
    for (int s = 0; s < args_.num_slots; ++s) {
      OP_REQUIRES_OK(ctx, write_back(slots.tables[s], slot_rows(s)));
      // The note was for this op's write-back only (the keys are an input).
      ::tensorflow::mutex_lock lock(*slots.tables[s]->mu());
      slots.tables[s]->NotePresent(Tensor());
    }
  }

 private:
  dk::SparseApplyArgs args_;
};

using ::tensorflow::DEVICE_GPU;

// The resource handle lives in host memory on every device (as TensorFlow's
// own resource ops declare it).
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableHandle").Device(DEVICE_GPU).HostMemory("table"),
                        ::tensorflow::ResourceHandleOp<GpuTableResource>);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableIsInitialized")
                            .Device(DEVICE_GPU)
                            .HostMemory("table")
                            .HostMemory("is_initialized"),
                        IsInitializedGpuOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableStats")
                            .Device(DEVICE_GPU)
                            .HostMemory("table")
                            .HostMemory("size")
                            .HostMemory("row_limit")
                            .HostMemory("evicted_total")
                            .HostMemory("memory_bytes"),
                        StatsGpuOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableClear").Device(DEVICE_GPU).HostMemory("table"),
                        ClearGpuOp);

// The ops that take or give keys, per key type; keys of either type in
// device memory (GpuTableAndKeys, KeysToOutput convert int32 ones).
#define SOK_REGISTER_DYNAMIC_GPU(K)                                                       \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("SokDynamicTableCreate").Device(DEVICE_GPU).HostMemory("table").TypeConstraint<K>( \
          "key_dtype"),                                                                  \
      CreateGpuOp);                                                                      \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFindOrInsert")                            \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          FindOrInsertGpuOp);                                            \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableUniqueFindOrInsert")                      \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          UniqueFindOrInsertGpuOp);                                      \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFind")                                    \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("default_value")                               \
                              .TypeConstraint<K>("Tkeys"),                               \
                          FindGpuOp);                                                    \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableScatter")                                 \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          ScatterGpuOp);                                                 \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("SokDynamicTableRemove").Device(DEVICE_GPU).HostMemory("table").TypeConstraint<K>( \
          "Tkeys"),                                                                      \
      RemoveGpuOp);                                                                      \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableExport")                                  \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("offset")                                      \
                              .HostMemory("limit")                                       \
                              .HostMemory("updated_after")                               \
                              .HostMemory("next_offset")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          ExportGpuOp);                                                  \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableImport")                                  \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("frequencies")                                 \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          ImportGpuOp);                                                  \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicSparseApply")                                  \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("slots")                                       \
                              .TypeConstraint<K>("Tkeys"),                               \
                          SparseApplyGpuOp);
SOK_REGISTER_DYNAMIC_GPU(TfInt64)
SOK_REGISTER_DYNAMIC_GPU(int32_t)
#undef SOK_REGISTER_DYNAMIC_GPU

}  // namespace
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
