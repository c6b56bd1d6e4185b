// CPU kernels of the dynamic-table ops: the resource that owns a
// core::DynamicTable, its lock, and argument checking (shared with the GPU
// kernels: dynamic_kernel_common.h) around the batch operations in
// tf_ops/dynamic/core/batch_ops.h.
#include <algorithm>
#include <new>
#include <utility>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "compat/tf_compat.h"
#include "tf_ops/dynamic/core/batch_ops.h"
#include "tf_ops/dynamic/kernels/dynamic_kernel_common.h"
#include "tf_ops/optimizer/kernels/apply_rows.h"
#include "tf_ops/util/core/unique.h"

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
using dynamic_kernels::CheckRows;
using dynamic_kernels::ScalarOutput;
using dynamic_kernels::WallMicros;

// The TensorFlow resource: one table, one lock. Finds share the lock; every
// op that changes the table holds it alone, so concurrent ops behave as some
// serial order of them.
class DynamicTableResource : public ::tensorflow::ResourceBase {
 public:
  DynamicTableResource(const core::TableConfig& config, DataType key_dtype)
      : table_(config), key_dtype_(key_dtype) {}

  std::string DebugString() const override {
    return "SokDynamicTable(dim=" + std::to_string(table_.dim()) + ")";
  }
  TfInt64 MemoryUsed() const override { return table_.memory_bytes(); }

  ::tensorflow::mutex* mu() { return &mu_; }
  core::DynamicTable& table() { return table_; }
  const core::DynamicTable& table() const { return table_; }
  DataType key_dtype() const { return key_dtype_; }

 private:
  ::tensorflow::mutex mu_;
  core::DynamicTable table_;
  const DataType key_dtype_;
};

core::ParallelRunner RunnerFor(OpKernelContext* ctx) {
  return [ctx](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    ParallelFor(ctx, total, cost, fn);
  };
}

// Keys of input `index` as int64 (int32 keys are widened); checks the dtype
// and rank against the table.
Status ReadKeys(OpKernelContext* ctx, int index, const DynamicTableResource& table,
                std::vector<int64_t>* widened, const int64_t** keys, int64_t* n) {
  const Tensor& t = ctx->input(index);
  TF_RETURN_IF_ERROR(dynamic_kernels::CheckKeys(t, table.key_dtype()));
  *n = t.NumElements();
  if (t.dtype() == ::tensorflow::DT_INT64) {
    *keys = reinterpret_cast<const int64_t*>(t.flat<TfInt64>().data());
  } else {
    const int32_t* k32 = t.flat<int32_t>().data();
    widened->assign(k32, k32 + *n);
    *keys = widened->data();
  }
  return OkStatus();
}

Status CheckDimAttr(const DynamicTableResource& table, int dim) {
  return dynamic_kernels::CheckDimAttr(dim, table.table().dim());
}

// What most table ops read first: the table of input 0 (a reference held
// until destruction) and, if asked, the keys of input 1 (checked against the
// table, widened to int64). GpuTableAndKeys is its GPU counterpart.
struct DynamicTableAndKeys {
  DynamicTableResource* table = nullptr;
  std::vector<int64_t> widened;
  const int64_t* keys = nullptr;
  int64_t n = 0;

  ~DynamicTableAndKeys() {
    if (table != nullptr) table->Unref();
  }
  Status Read(OpKernelContext* ctx, bool with_keys) {
    TF_RETURN_IF_ERROR(dynamic_kernels::LookupTable(ctx, &table));
    if (with_keys) TF_RETURN_IF_ERROR(ReadKeys(ctx, 1, *table, &widened, &keys, &n));
    return OkStatus();
  }
  core::DynamicTable& t() { return table->table(); }
};

// Runs a batch operation that changes the table: under the table's lock, at
// this call's time. `op(table, now, error)` returns the number of evicted
// rows (*evicted), or -1 with `error` set.
template <typename Op>
Status RunLocked(DynamicTableResource* table, Op&& op, int64_t* evicted) {
  std::string error;
  {
    ::tensorflow::mutex_lock lock(*table->mu());
    core::DynamicTable& t = table->table();
    // Growth allocates in this thread; running out of memory must be an
    // error, not std::terminate. Vector growth keeps the table consistent.
    try {
      *evicted = op(t, t.Tick(WallMicros()), &error);
    } catch (const std::bad_alloc&) {
      return errors::ResourceExhausted("out of memory growing a dynamic table of ", t.size(),
                                       " rows of dimension ", t.dim());
    }
  }
  if (*evicted < 0) return errors::InvalidArgument(error);
  return OkStatus();
}

// RunLocked, writing the number of evicted rows to output `evicted_output`.
template <typename Op>
Status RunWrite(OpKernelContext* ctx, DynamicTableResource* table, int evicted_output, Op&& op) {
  int64_t evicted = 0;
  TF_RETURN_IF_ERROR(RunLocked(table, std::forward<Op>(op), &evicted));
  return ScalarOutput(ctx, evicted_output, evicted);
}

class CreateOp : public OpKernel {
 public:
  explicit CreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, dynamic_kernels::ParseCreateAttrs(ctx, &config_, &key_dtype_));
  }

  void Compute(OpKernelContext* ctx) override {
    DynamicTableResource* table = nullptr;
    const core::TableConfig config = config_;
    const DataType key_dtype = key_dtype_;
    OP_REQUIRES_OK(ctx, ::tensorflow::LookupOrCreateResource<DynamicTableResource>(
                            ctx, ::tensorflow::HandleFromInput(ctx, 0), &table,
                            [&config, key_dtype](DynamicTableResource** out) -> Status {
                              try {
                                *out = new DynamicTableResource(config, key_dtype);
                              } catch (const std::bad_alloc&) {
                                return errors::ResourceExhausted(
                                    "out of memory allocating a dynamic table of ",
                                    config.init_capacity, " rows of dimension ", config.dim,
                                    " (init_capacity)");
                              }
                              return OkStatus();
                            }));
    ::tensorflow::core::ScopedUnref unref(table);
    OP_REQUIRES_OK(ctx, dynamic_kernels::CheckExistingTable(
                            table->table().dim(), table->key_dtype(), config_.dim, key_dtype_));
  }

 private:
  core::TableConfig config_;
  DataType key_dtype_;
};

class IsInitializedOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    DynamicTableResource* table = nullptr;
    const bool exists = ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0),
                                                     &table)
                            .ok();
    if (exists) table->Unref();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = exists;
  }
};

// Table keys (int64) to a keys output of the table's key type (int32 keys
// narrow exactly: every stored key came in as an int32).
void CopyKeysOut(const std::vector<int64_t>& keys, Tensor* out) {
  if (out->dtype() == ::tensorflow::DT_INT64) {
    std::copy(keys.begin(), keys.end(), out->flat<TfInt64>().data());
  } else {
    std::copy(keys.begin(), keys.end(), out->flat<int32_t>().data());
  }
}

class FindOrInsertOp : public OpKernel {
 public:
  explicit FindOrInsertOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    OP_REQUIRES_OK(ctx, CheckDimAttr(*in.table, dim_));
    const int64_t* keys = in.keys;
    const int64_t n = in.n;
    DynamicTableResource* table = in.table;
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &rows));
    std::vector<int64_t> evicted_keys;
    std::vector<float> evicted_rows;
    OP_REQUIRES_OK(ctx, RunWrite(ctx, table, 1,
                                 [&](core::DynamicTable& t, int64_t now, std::string* error) {
                                   return core::FindOrInsertBatch(
                                       t, keys, n, now, rows->flat<float>().data(),
                                       RunnerFor(ctx), error, &evicted_keys, &evicted_rows);
                                 }));
    Tensor* out_keys = nullptr;
    const int64_t m = static_cast<int64_t>(evicted_keys.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({m}), &out_keys));
    CopyKeysOut(evicted_keys, out_keys);
    Tensor* out_rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({m, dim_}), &out_rows));
    std::copy(evicted_rows.begin(), evicted_rows.end(), out_rows->flat<float>().data());
  }

 private:
  int dim_ = 0;
};

// SokDynamicTableUniqueFindOrInsert: core::UniqueWithInverse, then the
// distinct keys through FindOrInsertBatch.
class UniqueFindOrInsertOp : public OpKernel {
 public:
  explicit UniqueFindOrInsertOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    OP_REQUIRES_OK(ctx, CheckDimAttr(*in.table, dim_));
    Tensor* positions = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({in.n}), &positions));
    std::vector<int64_t> unique;
    core::UniqueWithInverse<int64_t, TfInt64>(in.keys, in.n, &unique,
                                              positions->flat<TfInt64>().data(), nullptr);
    const int64_t u = static_cast<int64_t>(unique.size());
    Tensor* unique_keys = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &unique_keys));
    CopyKeysOut(unique, unique_keys);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({u, dim_}), &rows));
    std::vector<int64_t> evicted_keys;
    OP_REQUIRES_OK(ctx, RunWrite(ctx, in.table, 3,
                                 [&](core::DynamicTable& t, int64_t now, std::string* error) {
                                   return core::FindOrInsertBatch(
                                       t, unique.data(), u, now, rows->flat<float>().data(),
                                       RunnerFor(ctx), error, &evicted_keys);
                                 }));
    Tensor* out_keys = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            4, TensorShape({static_cast<int64_t>(evicted_keys.size())}),
                            &out_keys));
    CopyKeysOut(evicted_keys, out_keys);
  }

 private:
  int dim_ = 0;
};

class FindOp : public OpKernel {
 public:
  explicit FindOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    OP_REQUIRES_OK(ctx, CheckDimAttr(*in.table, dim_));
    const int64_t* keys = in.keys;
    const int64_t n = in.n;
    DynamicTableResource* table = in.table;
    std::vector<float> default_row;
    OP_REQUIRES_OK(ctx, dynamic_kernels::ReadDefaultRow(ctx->input(2), dim_, &default_row));
    Tensor *rows = nullptr, *found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &found));
    ::tensorflow::tf_shared_lock lock(*table->mu());
    core::FindBatch(table->table(), keys, n, default_row.data(), rows->flat<float>().data(),
                    found->flat<bool>().data(), RunnerFor(ctx));
  }

 private:
  int dim_ = 0;
};

class ScatterOp : public OpKernel {
 public:
  explicit ScatterOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, dynamic_kernels::ParseScatterMode(ctx, &mode_));
  }
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    const int64_t* keys = in.keys;
    const int64_t n = in.n;
    DynamicTableResource* table = in.table;
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows(rows, n, table->table().dim()));
    OP_REQUIRES_OK(ctx, RunWrite(ctx, table, 0,
                                 [&](core::DynamicTable& t, int64_t now, std::string* error) {
                                   return core::ScatterBatch(t, keys, n, rows.flat<float>().data(),
                                                             mode_, now, RunnerFor(ctx), error);
                                 }));
  }

 private:
  core::ScatterMode mode_;
};

class RemoveOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    const int64_t* keys = in.keys;
    const int64_t n = in.n;
    DynamicTableResource* table = in.table;
    int64_t removed = 0;
    {
      ::tensorflow::mutex_lock lock(*table->mu());
      for (int64_t i = 0; i < n; ++i) removed += table->table().Remove(keys[i]) ? 1 : 0;
    }
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, removed));
  }
};

class StatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, false));
    DynamicTableResource* table = in.table;
    ::tensorflow::tf_shared_lock lock(*table->mu());
    const core::DynamicTable& t = table->table();
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, t.size()));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 1, t.row_limit()));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 2, t.evicted_total()));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 3, t.memory_bytes()));
  }
};

template <typename K>
class ExportOp : public OpKernel {
 public:
  explicit ExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, false));
    DynamicTableResource* table = in.table;
    OP_REQUIRES_OK(ctx, CheckDimAttr(*table, dim_));
    dynamic_kernels::ExportArgs args;
    OP_REQUIRES_OK(ctx, dynamic_kernels::ReadExportArgs(ctx, ::tensorflow::DataTypeToEnum<K>::value,
                                                        table->key_dtype(), &args));
    ::tensorflow::tf_shared_lock lock(*table->mu());
    const core::DynamicTable& t = table->table();
    std::vector<int64_t> entries;
    const int64_t next =
        core::ExportEntries(t, args.offset, args.limit, args.updated_after, &entries);
    const int64_t m = static_cast<int64_t>(entries.size());
    Tensor *keys = nullptr, *rows = nullptr, *ts = nullptr, *freq = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m, dim_}), &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({m}), &ts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({m}), &freq));
    auto k = keys->flat<K>();
    auto r = rows->flat<float>();
    auto tsv = ts->flat<TfInt64>();
    auto fv = freq->flat<TfInt64>();
    for (int64_t i = 0; i < m; ++i) {
      const int64_t e = entries[i];
      k(i) = static_cast<K>(t.Key(e));
      std::copy(t.Row(e), t.Row(e) + dim_, r.data() + i * dim_);
      tsv(i) = t.Timestamp(e);
      fv(i) = t.Frequency(e);
    }
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 4, next));
  }

 private:
  int dim_ = 0;
};

class ImportOp : public OpKernel {
 public:
  explicit ImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("replace", &replace_));
  }
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    const int64_t* keys = in.keys;
    const int64_t n = in.n;
    DynamicTableResource* table = in.table;
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows(rows, n, table->table().dim()));
    OP_REQUIRES_OK(ctx, dynamic_kernels::CheckImportMetadata(ctx, n));
    const Tensor& ts = ctx->input(3);
    const Tensor& freq = ctx->input(4);
    // In range: CheckImportMetadata read every one.
    std::vector<uint32_t> counts;
    for (int64_t i = 0; i < freq.NumElements(); ++i) {
      counts.push_back(static_cast<uint32_t>(freq.flat<TfInt64>()(i)));
    }
    const int64_t* times =
        ts.NumElements() > 0 ? reinterpret_cast<const int64_t*>(ts.flat<TfInt64>().data())
                             : nullptr;
    const bool replace = replace_;
    OP_REQUIRES_OK(ctx, RunWrite(ctx, table, 0,
                                 [&](core::DynamicTable& t, int64_t now, std::string* error) {
                                   const float* r = rows.flat<float>().data();
                                   const uint32_t* f = counts.empty() ? nullptr : counts.data();
                                   return replace ? core::ReplaceBatch(t, keys, n, r, times, f, now,
                                                                       RunnerFor(ctx), error)
                                                  : core::ImportBatch(t, keys, n, r, times, f, now,
                                                                      RunnerFor(ctx), error);
                                 }));
  }

 private:
  bool replace_ = false;
};

class ClearOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, false));
    DynamicTableResource* table = in.table;
    ::tensorflow::mutex_lock lock(*table->mu());
    table->table().Clear();
  }
};

// SokDynamicSparseApply: the steps of the TensorFlow-op update of a
// dynamic table (find, find-or-insert in each slot table, the formula,
// scatter "update" into each table), each under its table's lock as the
// separate ops would take it, with the formula of SokSparseApply.
class SparseApplyOp : public OpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, args_.Parse(ctx));
  }
  void Compute(OpKernelContext* ctx) override {
    DynamicTableAndKeys in;
    OP_REQUIRES_OK(ctx, in.Read(ctx, true));
    const int64_t dim = in.t().dim();
    const int64_t n = in.n;
    const int64_t* keys = in.keys;
    OP_REQUIRES_OK(ctx, dynamic_kernels::SparseApplyArgs::CheckInputs(ctx, n, dim));
    dynamic_kernels::SlotTables<DynamicTableResource> slots;
    OP_REQUIRES_OK(ctx, slots.Lookup(ctx, args_.num_slots, dim, in.table->key_dtype(),
                                     [](DynamicTableResource& r) { return r.table().dim(); }));
    if (n == 0) return;
    const size_t elems = static_cast<size_t>(n * dim);
    std::vector<float> rows(elems);
    std::vector<std::vector<float>> slot_rows(args_.num_slots, std::vector<float>(elems));
    const std::vector<float> zeros(static_cast<size_t>(dim), 0.0f);
    {
      ::tensorflow::tf_shared_lock lock(*in.table->mu());
      core::FindBatch(in.t(), keys, n, zeros.data(), rows.data(), nullptr, RunnerFor(ctx));
    }
    int64_t evicted = 0;
    for (int s = 0; s < args_.num_slots; ++s) {
      float* out = slot_rows[s].data();
      OP_REQUIRES_OK(ctx, RunLocked(slots.tables[s],
                                    [&](core::DynamicTable& t, int64_t now, std::string* error) {
                                      return core::FindOrInsertBatch(t, keys, n, now, out,
                                                                     RunnerFor(ctx), error);
                                    },
                                    &evicted));
    }
    const float* hyper = ctx->input(3).flat<float>().data();
    const int64_t step = static_cast<int64_t>(ctx->input(4).scalar<TfInt64>()());
    const core::SparseApplyConfig config = args_.config;
    const float alpha = core::StepAlpha(config.algorithm, hyper, step);
    const optimizer_kernels::ApplyRowFn apply_row = optimizer_kernels::ApplyRowFor(config.algorithm);
    OP_REQUIRES(ctx, apply_row != nullptr,
                errors::Internal("no CPU update for algorithm ", config.algorithm));
    const float* grads = ctx->input(2).flat<float>().data();
    float* s0 = args_.num_slots > 0 ? slot_rows[0].data() : nullptr;
    float* s1 = args_.num_slots > 1 ? slot_rows[1].data() : nullptr;
    float* s2 = args_.num_slots > 2 ? slot_rows[2].data() : nullptr;
    ParallelFor(ctx, n, 20 * dim, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t o = i * dim;
        apply_row(config, hyper, alpha, grads + o, rows.data() + o, s0 ? s0 + o : nullptr,
                  s1 ? s1 + o : nullptr, s2 ? s2 + o : nullptr, dim);
      }
    });
    const auto write_back = [&](DynamicTableResource* table, const float* values) {
      return RunLocked(table,
                       [&](core::DynamicTable& t, int64_t now, std::string* error) {
                         return core::ScatterBatch(t, keys, n, values, core::ScatterMode::kUpdate,
                                                   now, RunnerFor(ctx), error);
                       },
                       &evicted);
    };
    OP_REQUIRES_OK(ctx, write_back(in.table, rows.data()));
    for (int s = 0; s < args_.num_slots; ++s) {
      OP_REQUIRES_OK(ctx, write_back(slots.tables[s], slot_rows[s].data()));
    }
  }

 private:
  dynamic_kernels::SparseApplyArgs args_;
};

using ::tensorflow::DEVICE_CPU;

REGISTER_KERNEL_BUILDER(Name("SokDynamicTableHandle").Device(DEVICE_CPU),
                        ::tensorflow::ResourceHandleOp<DynamicTableResource>);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableCreate").Device(DEVICE_CPU), CreateOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableIsInitialized").Device(DEVICE_CPU),
                        IsInitializedOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFindOrInsert").Device(DEVICE_CPU), FindOrInsertOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableUniqueFindOrInsert").Device(DEVICE_CPU),
                        UniqueFindOrInsertOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFind").Device(DEVICE_CPU), FindOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableScatter").Device(DEVICE_CPU), ScatterOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableRemove").Device(DEVICE_CPU), RemoveOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableStats").Device(DEVICE_CPU), StatsOp);
REGISTER_KERNEL_BUILDER(
    Name("SokDynamicTableExport").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tkeys"),
    ExportOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("SokDynamicTableExport").Device(DEVICE_CPU).TypeConstraint<TfInt64>("Tkeys"),
    ExportOp<TfInt64>);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableImport").Device(DEVICE_CPU), ImportOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableClear").Device(DEVICE_CPU), ClearOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicSparseApply").Device(DEVICE_CPU), SparseApplyOp);

}  // namespace
}  // namespace sok_graph
