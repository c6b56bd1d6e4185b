// The CPU table behind the dynamic-table ops (table_resource.h): a
// core::DynamicTable in host memory and the batch operations of
// tf_ops/dynamic/core/batch_ops.h, parallel over the op's CPU threads.
#include <algorithm>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "compat/tf_compat.h"
#include "tf_ops/dynamic/core/batch_ops.h"
#include "tf_ops/dynamic/kernels/dynamic_kernel_common.h"
#include "tf_ops/dynamic/kernels/table_resource.h"
#include "tf_ops/optimizer/kernels/apply_rows.h"
#include "tf_ops/util/core/unique.h"

namespace sok_graph {
namespace dynamic_kernels {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

core::ParallelRunner RunnerFor(OpKernelContext* ctx) {
  return [ctx](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    ParallelFor(ctx, total, cost, fn);
  };
}

// A keys tensor as int64 (int32 keys are widened into `widened`).
const int64_t* KeysAsInt64(const Tensor& t, std::vector<int64_t>* widened) {
  if (t.dtype() == ::tensorflow::DT_INT64) {
    return reinterpret_cast<const int64_t*>(t.flat<TfInt64>().data());
  }
  const int32_t* k32 = t.flat<int32_t>().data();
  widened->assign(k32, k32 + t.NumElements());
  return widened->data();
}

// Table keys (int64) to a keys output of the table's key type (int32 keys
// narrow exactly: every stored key came in as an int32).
void CopyKeysOut(const std::vector<int64_t>& keys, Tensor* out) {
  if (out->dtype() == ::tensorflow::DT_INT64) {
    std::copy(keys.begin(), keys.end(), out->flat<TfInt64>().data());
  } else {
    std::copy(keys.begin(), keys.end(), out->flat<int32_t>().data());
  }
}

class CpuTableResource : public TableResource {
 public:
  CpuTableResource(const core::TableConfig& config, DataType key_dtype)
      : TableResource(config.dim, key_dtype, ::tensorflow::DEVICE_CPU), table_(config) {}

  std::string DebugString() const override {
    return "SokDynamicTable(dim=" + std::to_string(table_.dim()) + ")";
  }
  TfInt64 MemoryUsed() const override { return table_.memory_bytes(); }
  int64_t max_keys_per_call() const override { return std::numeric_limits<int64_t>::max(); }

  Status FindOrInsert(OpKernelContext* ctx, const Tensor& keys_in) override {
    std::vector<int64_t> widened;
    const int64_t* keys = KeysAsInt64(keys_in, &widened);
    const int64_t n = keys_in.NumElements();
    Tensor* rows = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({n, dim()}), &rows));
    std::vector<int64_t> evicted_keys;
    std::vector<float> evicted_rows;
    TF_RETURN_IF_ERROR(RunWrite(ctx, 1, [&](core::DynamicTable& t, int64_t now,
                                            std::string* error) {
      return core::FindOrInsertBatch(t, keys, n, now, rows->flat<float>().data(), RunnerFor(ctx),
                                     error, &evicted_keys, &evicted_rows);
    }));
    TF_RETURN_IF_ERROR(DropFromShadows(ctx, evicted_keys.data(), Count(evicted_keys)));
    Tensor* out_keys = nullptr;
    const int64_t m = static_cast<int64_t>(evicted_keys.size());
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({m}), &out_keys));
    CopyKeysOut(evicted_keys, out_keys);
    Tensor* out_rows = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({m, dim()}), &out_rows));
    std::copy(evicted_rows.begin(), evicted_rows.end(), out_rows->flat<float>().data());
    return OkStatus();
  }

  // core::UniqueWithInverse, then the distinct keys through FindOrInsertBatch.
  Status UniqueFindOrInsert(OpKernelContext* ctx, const Tensor& keys_in) override {
    std::vector<int64_t> widened;
    const int64_t* keys = KeysAsInt64(keys_in, &widened);
    const int64_t n = keys_in.NumElements();
    Tensor* positions = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &positions));
    std::vector<int64_t> unique;
    core::UniqueWithInverse<int64_t, TfInt64>(keys, n, &unique, positions->flat<TfInt64>().data(),
                                              nullptr);
    const int64_t u = static_cast<int64_t>(unique.size());
    Tensor* unique_keys = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({u}), &unique_keys));
    CopyKeysOut(unique, unique_keys);
    Tensor* rows = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({u, dim()}), &rows));
    std::vector<int64_t> evicted_keys;
    TF_RETURN_IF_ERROR(RunWrite(ctx, 3, [&](core::DynamicTable& t, int64_t now,
                                            std::string* error) {
      return core::FindOrInsertBatch(t, unique.data(), u, now, rows->flat<float>().data(),
                                     RunnerFor(ctx), error, &evicted_keys);
    }));
    TF_RETURN_IF_ERROR(DropFromShadows(ctx, evicted_keys.data(), Count(evicted_keys)));
    Tensor* out_keys = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(
        4, TensorShape({static_cast<int64_t>(evicted_keys.size())}), &out_keys));
    CopyKeysOut(evicted_keys, out_keys);
    return OkStatus();
  }

  Status Find(OpKernelContext* ctx, const Tensor& keys_in,
              const std::vector<float>& default_row) override {
    std::vector<int64_t> widened;
    const int64_t* keys = KeysAsInt64(keys_in, &widened);
    const int64_t n = keys_in.NumElements();
    Tensor *rows = nullptr, *found = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({n, dim()}), &rows));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &found));
    ::tensorflow::tf_shared_lock lock(*mu());
    core::FindBatch(table_, keys, n, default_row.data(), rows->flat<float>().data(),
                    found->flat<bool>().data(), RunnerFor(ctx));
    return OkStatus();
  }

  Status Scatter(OpKernelContext* ctx, const Tensor& keys_in, const Tensor& rows,
                 core::ScatterMode mode) override {
    std::vector<int64_t> widened;
    const int64_t* keys = KeysAsInt64(keys_in, &widened);
    const int64_t n = keys_in.NumElements();
    std::vector<int64_t> evicted_keys;
    TF_RETURN_IF_ERROR(RunWrite(ctx, 0, [&](core::DynamicTable& t, int64_t now,
                                            std::string* error) {
      return core::ScatterBatch(t, keys, n, rows.flat<float>().data(), mode, now, RunnerFor(ctx),
                                error, &evicted_keys);
    }));
    return DropFromShadows(ctx, evicted_keys.data(), Count(evicted_keys));
  }

  Status Remove(OpKernelContext* ctx, const Tensor& keys_in) override {
    std::vector<int64_t> widened;
    const int64_t* keys = KeysAsInt64(keys_in, &widened);
    const int64_t n = keys_in.NumElements();
    TF_RETURN_IF_ERROR(ScalarOutput(ctx, 0, RemoveCounted(keys, n)));
    return DropFromShadows(ctx, keys, n);
  }

  Status ReadStats(OpKernelContext* ctx, Stats* stats) override {
    ::tensorflow::tf_shared_lock lock(*mu());
    stats->size = table_.size();
    stats->row_limit = table_.row_limit();
    stats->evicted_total = table_.evicted_total();
    stats->memory_bytes = table_.memory_bytes();
    return OkStatus();
  }

  Status Export(OpKernelContext* ctx, const ExportArgs& args) override {
    ::tensorflow::tf_shared_lock lock(*mu());
    std::vector<int64_t> entries;
    const int64_t next =
        core::ExportEntries(table_, args.offset, args.limit, args.updated_after, &entries);
    const int64_t m = static_cast<int64_t>(entries.size());
    const int64_t d = dim();
    Tensor *keys = nullptr, *rows = nullptr, *ts = nullptr, *freq = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({m}), &keys));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({m, d}), &rows));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({m}), &ts));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({m}), &freq));
    std::vector<int64_t> exported(m);
    auto r = rows->flat<float>();
    auto tsv = ts->flat<TfInt64>();
    auto fv = freq->flat<TfInt64>();
    for (int64_t i = 0; i < m; ++i) {
      const int64_t e = entries[i];
      exported[i] = table_.Key(e);
      std::copy(table_.Row(e), table_.Row(e) + d, r.data() + i * d);
      tsv(i) = table_.Timestamp(e);
      fv(i) = table_.Frequency(e);
    }
    CopyKeysOut(exported, keys);
    return ScalarOutput(ctx, 4, next);
  }

  Status Import(OpKernelContext* ctx, const Tensor& keys_in, const Tensor& rows,
                bool replace) override {
    std::vector<int64_t> widened;
    const int64_t* keys = KeysAsInt64(keys_in, &widened);
    const int64_t n = keys_in.NumElements();
    const Tensor& ts = ctx->input(3);
    const Tensor& freq = ctx->input(4);
    // In range: the op read every one.
    std::vector<uint32_t> counts;
    for (int64_t i = 0; i < freq.NumElements(); ++i) {
      counts.push_back(static_cast<uint32_t>(freq.flat<TfInt64>()(i)));
    }
    const int64_t* times =
        ts.NumElements() > 0 ? reinterpret_cast<const int64_t*>(ts.flat<TfInt64>().data())
                             : nullptr;
    // A replacing import (a restore) leaves the shadows as they are: the
    // restore that made it decides which keys they keep.
    std::vector<int64_t> evicted_keys;
    TF_RETURN_IF_ERROR(RunWrite(ctx, 0, [&](core::DynamicTable& t, int64_t now,
                                            std::string* error) {
      const float* r = rows.flat<float>().data();
      const uint32_t* f = counts.empty() ? nullptr : counts.data();
      return replace ? core::ReplaceBatch(t, keys, n, r, times, f, now, RunnerFor(ctx), error)
                     : core::ImportBatch(t, keys, n, r, times, f, now, RunnerFor(ctx), error,
                                         &evicted_keys);
    }));
    return DropFromShadows(ctx, evicted_keys.data(), Count(evicted_keys));
  }

  Status Clear(OpKernelContext* ctx) override {
    ::tensorflow::mutex_lock lock(*mu());
    table_.Clear();
    return OkStatus();
  }

  // Each step under its table's lock, as the separate ops would take it.
  Status SparseApply(OpKernelContext* ctx, const Tensor& keys_in,
                     const std::vector<TableResource*>& slot_tables,
                     const core::SparseApplyConfig& config) override {
    std::vector<int64_t> widened;
    const int64_t* keys = KeysAsInt64(keys_in, &widened);
    const int64_t n = keys_in.NumElements();
    const int64_t d = dim();
    const int num_slots = static_cast<int>(slot_tables.size());
    if (n == 0) return OkStatus();
    std::vector<CpuTableResource*> slots;
    for (TableResource* s : slot_tables) slots.push_back(static_cast<CpuTableResource*>(s));
    const size_t elems = static_cast<size_t>(n * d);
    std::vector<float> rows(elems);
    std::vector<std::vector<float>> slot_rows(num_slots, std::vector<float>(elems));
    const std::vector<float> zeros(static_cast<size_t>(d), 0.0f);
    // The keys' rows, then every key made present as the write-back below
    // would make it, in one locked step. A key evicted since its lookup
    // reads as zeros and is put back, which may evict other keys: they
    // leave the slot tables before any slot row is read, so a key that
    // comes back later starts afresh in every slot, and a slot table (as
    // bounded as this one) never has to evict a key this table keeps.
    std::vector<int64_t> evicted_keys;
    int64_t evicted = 0;
    TF_RETURN_IF_ERROR(RunLocked(
        ctx,
        [&](core::DynamicTable& t, int64_t now, std::string* error) {
          core::FindBatch(t, keys, n, zeros.data(), rows.data(), nullptr, RunnerFor(ctx));
          std::vector<int64_t> entries(static_cast<size_t>(n));
          return core::EnsureEntries(t, keys, n, now, /*accessed=*/false, /*initialize=*/true,
                                     entries.data(), RunnerFor(ctx), error, &evicted_keys);
        },
        &evicted));
    TF_RETURN_IF_ERROR(DropFromShadows(ctx, evicted_keys.data(), Count(evicted_keys),
                                       slot_tables));
    for (int s = 0; s < num_slots; ++s) {
      float* out = slot_rows[s].data();
      TF_RETURN_IF_ERROR(slots[s]->RunLocked(
          ctx, [&](core::DynamicTable& t, int64_t now, std::string* error) {
            return core::FindOrInsertBatch(t, keys, n, now, out, RunnerFor(ctx), error);
          },
          &evicted));
    }
    const float* hyper = ctx->input(3).flat<float>().data();
    const int64_t step = static_cast<int64_t>(ctx->input(4).scalar<TfInt64>()());
    const float alpha = core::StepAlpha(config.algorithm, hyper, step);
    const optimizer_kernels::ApplyRowFn apply_row =
        optimizer_kernels::ApplyRowFor(config.algorithm);
    if (apply_row == nullptr) {
      return errors::Internal("no CPU update for algorithm ", config.algorithm);
    }
    const float* grads = ctx->input(2).flat<float>().data();
    float* s0 = num_slots > 0 ? slot_rows[0].data() : nullptr;
    float* s1 = num_slots > 1 ? slot_rows[1].data() : nullptr;
    float* s2 = num_slots > 2 ? slot_rows[2].data() : nullptr;
    ParallelFor(ctx, n, 20 * d, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t o = i * d;
        apply_row(config, hyper, alpha, grads + o, rows.data() + o, s0 ? s0 + o : nullptr,
                  s1 ? s1 + o : nullptr, s2 ? s2 + o : nullptr, d);
      }
    });
    // The keys are present (the insert above), unless another op removed
    // some meanwhile: what putting those back evicts leaves the shadows too.
    evicted_keys.clear();
    const auto write_back = [&](CpuTableResource* table, const float* values,
                                std::vector<int64_t>* evicting) {
      return table->RunLocked(
          ctx, [&](core::DynamicTable& t, int64_t now, std::string* error) {
            return core::ScatterBatch(t, keys, n, values, core::ScatterMode::kUpdate, now,
                                      RunnerFor(ctx), error, evicting);
          },
          &evicted);
    };
    TF_RETURN_IF_ERROR(write_back(this, rows.data(), &evicted_keys));
    TF_RETURN_IF_ERROR(DropFromShadows(ctx, evicted_keys.data(), Count(evicted_keys)));
    for (int s = 0; s < num_slots; ++s) {
      TF_RETURN_IF_ERROR(write_back(slots[s], slot_rows[s].data(), nullptr));
    }
    return OkStatus();
  }

 protected:
  Status RemoveKeys(OpKernelContext* ctx, const int64_t* keys, int64_t n) override {
    (void)ctx;
    RemoveCounted(keys, n);
    return OkStatus();
  }

 private:
  static int64_t Count(const std::vector<int64_t>& v) { return static_cast<int64_t>(v.size()); }

  // Removes those of keys[0, n) the table holds; returns how many.
  int64_t RemoveCounted(const int64_t* keys, int64_t n) {
    int64_t removed = 0;
    ::tensorflow::mutex_lock lock(*mu());
    for (int64_t i = 0; i < n; ++i) removed += table_.Remove(keys[i]) ? 1 : 0;
    return removed;
  }

  // Runs a batch operation that changes the table: under the table's lock,
  // at this call's time. `op(table, now, error)` returns the number of
  // evicted rows (*evicted), or -1 with `error` set (raised naming the op
  // and the table, as the GPU table's errors do).
  template <typename Op>
  Status RunLocked(OpKernelContext* ctx, Op&& op, int64_t* evicted) {
    std::string error;
    {
      ::tensorflow::mutex_lock lock(*mu());
      // Growth allocates in this thread; running out of memory must be an
      // error, not std::terminate. Vector growth keeps the table consistent.
      try {
        *evicted = op(table_, table_.Tick(WallMicros()), &error);
      } catch (const std::bad_alloc&) {
        return errors::ResourceExhausted("out of memory growing a dynamic table of ",
                                         table_.size(), " rows of dimension ", table_.dim());
      }
    }
    if (*evicted < 0) {
      return errors::InvalidArgument(ctx->op_kernel().type_string(), " on the dynamic table '",
                                     NameFor(ctx), "': ", error);
    }
    return OkStatus();
  }

  // RunLocked, writing the number of evicted rows to output `evicted_output`.
  template <typename Op>
  Status RunWrite(OpKernelContext* ctx, int evicted_output, Op&& op) {
    int64_t evicted = 0;
    TF_RETURN_IF_ERROR(RunLocked(ctx, std::forward<Op>(op), &evicted));
    return ScalarOutput(ctx, evicted_output, evicted);
  }

  core::DynamicTable table_;
};

}  // namespace

Status NewCpuTable(const core::TableConfig& config, DataType key_dtype, TableResource** out) {
  try {
    *out = new CpuTableResource(config, key_dtype);
  } catch (const std::bad_alloc&) {
    return errors::ResourceExhausted("out of memory allocating a dynamic table of ",
                                     config.init_capacity, " rows of dimension ", config.dim,
                                     " (init_capacity)");
  }
  return OkStatus();
}

}  // namespace dynamic_kernels
}  // namespace sok_graph
