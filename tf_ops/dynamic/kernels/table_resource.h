// The one table interface of the dynamic-table ops. Every op has one
// OpKernel (dynamic_kernels.cc), registered for the CPU and the GPU, that
// reads its attributes and checks its inputs once, then calls one method of
// TableResource; the CPU table (cpu_table_resource.cc, a core::DynamicTable
// under a lock) and the GPU table (gpu_table_resource.cc, the launchers of
// dynamic_table_launcher.h on the op's stream) implement them. A table kind
// of its own (another device, another memory tier) is one more
// implementation and one more factory, nothing in the kernels.
//
// A method is called after its op's checks: the keys have the table's key
// dtype and are a vector, the dim attribute equals the table's dimension,
// rows have the right shape. It writes the op's outputs itself: how large
// some are (evicted keys, an export chunk) only the device learns.
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_TABLE_RESOURCE_H_
#define SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_TABLE_RESOURCE_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "compat/tf_compat.h"
#include "tf_ops/dynamic/core/batch_ops.h"
#include "tf_ops/dynamic/kernels/dynamic_kernel_common.h"

namespace sok_graph {
namespace dynamic_kernels {

class TableResource : public ::tensorflow::ResourceBase {
 public:
  TableResource(int64_t dim, ::tensorflow::DataType key_dtype, const char* device_type)
      : dim_(dim), key_dtype_(key_dtype), device_type_(device_type) {}
  ~TableResource() override {
    for (TableResource* shadow : shadows_) shadow->Unref();
  }

  int64_t dim() const { return dim_; }
  ::tensorflow::DataType key_dtype() const { return key_dtype_; }
  // The table's name in errors: its variable's name (SokDynamicTableCreate's
  // table_name, set once when the table is made), else its handle's (which
  // an eager table draws at random: "the table holds at most 8 rows" then
  // named no table a user knows).
  void set_name(const std::string& name) { name_ = name; }
  std::string NameFor(::tensorflow::OpKernelContext* ctx) const {
    return name_.empty() ? ::tensorflow::HandleFromInput(ctx, 0).name() : name_;
  }
  // DEVICE_CPU or DEVICE_GPU: where the table's memory is.
  const char* device_type() const { return device_type_; }
  // The most keys one call may pass (the GPU counts them in 32 bits).
  virtual int64_t max_keys_per_call() const = 0;

  // Finds share the lock; every call that changes the table holds it alone,
  // so concurrent ops behave as some serial order of them.
  ::tensorflow::mutex* mu() { return &mu_; }

  // SokDynamicTableFindOrInsert: outputs rows, num_evicted, evicted_keys,
  // evicted_rows.
  virtual ::tensorflow::Status FindOrInsert(::tensorflow::OpKernelContext* ctx,
                                            const ::tensorflow::Tensor& keys) = 0;
  // SokDynamicTableUniqueFindOrInsert: outputs unique_keys, positions, rows,
  // num_evicted, evicted_keys.
  virtual ::tensorflow::Status UniqueFindOrInsert(::tensorflow::OpKernelContext* ctx,
                                                  const ::tensorflow::Tensor& keys) = 0;
  // SokDynamicTableFind: outputs rows and found; missing keys read
  // default_row (dim floats).
  virtual ::tensorflow::Status Find(::tensorflow::OpKernelContext* ctx,
                                    const ::tensorflow::Tensor& keys,
                                    const std::vector<float>& default_row) = 0;
  // SokDynamicTableScatter: output num_evicted.
  virtual ::tensorflow::Status Scatter(::tensorflow::OpKernelContext* ctx,
                                       const ::tensorflow::Tensor& keys,
                                       const ::tensorflow::Tensor& rows,
                                       core::ScatterMode mode) = 0;
  // SokDynamicTableRemove: output num_removed.
  virtual ::tensorflow::Status Remove(::tensorflow::OpKernelContext* ctx,
                                      const ::tensorflow::Tensor& keys) = 0;
  // SokDynamicTableStats's four numbers.
  struct Stats {
    int64_t size = 0;
    int64_t row_limit = 0;
    int64_t evicted_total = 0;
    int64_t memory_bytes = 0;
  };
  virtual ::tensorflow::Status ReadStats(::tensorflow::OpKernelContext* ctx, Stats* stats) = 0;
  // SokDynamicTableExport: outputs keys, rows, timestamps, frequencies,
  // next_offset. `offset` and next_offset count every row of the table in
  // its order, whatever `updated_after` lets through.
  virtual ::tensorflow::Status Export(::tensorflow::OpKernelContext* ctx,
                                      const ExportArgs& args) = 0;
  // SokDynamicTableImport (input 3 timestamps, input 4 frequencies, both
  // checked): output num_evicted. `replace` empties the table first, in the
  // same locked step, and fails before emptying it when the keys cannot fit.
  virtual ::tensorflow::Status Import(::tensorflow::OpKernelContext* ctx,
                                      const ::tensorflow::Tensor& keys,
                                      const ::tensorflow::Tensor& rows, bool replace) = 0;
  virtual ::tensorflow::Status Clear(::tensorflow::OpKernelContext* ctx) = 0;
  // SokDynamicSparseApply: the rows of `keys` and of each slot table (of
  // this table's kind, checked) updated by the fused formula (inputs grads 2,
  // hyper 3, step 4). Keys this table evicts to put back a key it lost
  // since the lookup leave the slot tables first.
  virtual ::tensorflow::Status SparseApply(::tensorflow::OpKernelContext* ctx,
                                           const ::tensorflow::Tensor& keys,
                                           const std::vector<TableResource*>& slots,
                                           const core::SparseApplyConfig& config) = 0;

  // SokDynamicTableAddShadow. A shadow is a table keyed like this one (an
  // optimizer's slot table) that drops every key this table evicts or
  // removes, in the op that evicts or removes it: a key that comes back
  // starts afresh in all of them, whichever op made room (a lookup, a
  // scatter, an import, the optimizer's own update), eagerly or in any
  // graph. Held by reference; adding one twice adds it once.
  void AddShadow(TableResource* shadow) {
    ::tensorflow::mutex_lock lock(shadows_mu_);
    for (TableResource* s : shadows_) {
      if (s == shadow) return;
    }
    shadow->Ref();
    shadows_.push_back(shadow);
  }
  bool HasShadows() {
    ::tensorflow::mutex_lock lock(shadows_mu_);
    return !shadows_.empty();
  }
  // SokDynamicTableClear: empties this table and its shadows (their own
  // shadows keep their keys, as DropFromShadows leaves them), so a key that
  // comes back starts afresh in all, however long after the shadows were
  // linked the clear op was built. Each table is emptied under its own lock.
  ::tensorflow::Status ClearWithShadows(::tensorflow::OpKernelContext* ctx) {
    TF_RETURN_IF_ERROR(Clear(ctx));
    std::vector<TableResource*> targets;
    {
      ::tensorflow::mutex_lock lock(shadows_mu_);
      targets = shadows_;
    }
    for (TableResource* t : targets) {
      TF_RETURN_IF_ERROR(t->Clear(ctx));
    }
    return OkStatus();
  }

 protected:
  // Removes keys[0, n) (int64, in this table's memory: host memory for a
  // CPU table, device memory on the op's stream for a GPU one) from every
  // shadow and from each of `also` that is not one (the slot tables an
  // update was given). Called without this table's lock held: a shadow's
  // lock is never taken inside it.
  ::tensorflow::Status DropFromShadows(::tensorflow::OpKernelContext* ctx, const int64_t* keys,
                                       int64_t n, const std::vector<TableResource*>& also = {}) {
    if (n <= 0) return OkStatus();
    std::vector<TableResource*> targets;
    {
      ::tensorflow::mutex_lock lock(shadows_mu_);
      targets = shadows_;
    }
    for (TableResource* t : also) {
      if (t != this && std::find(targets.begin(), targets.end(), t) == targets.end()) {
        targets.push_back(t);
      }
    }
    for (TableResource* t : targets) {
      TF_RETURN_IF_ERROR(t->RemoveKeys(ctx, keys, n));
    }
    return OkStatus();
  }
  // Removes those of keys[0, n) (as DropFromShadows takes them) this table
  // holds, under its lock; nothing more (its own shadows keep them).
  virtual ::tensorflow::Status RemoveKeys(::tensorflow::OpKernelContext* ctx,
                                          const int64_t* keys, int64_t n) = 0;

 private:
  ::tensorflow::mutex mu_;
  // Shadows live at least as long as this table (AddShadow's reference);
  // their list changes under its own lock, never this table's.
  ::tensorflow::mutex shadows_mu_;
  std::vector<TableResource*> shadows_;
  const int64_t dim_;
  const ::tensorflow::DataType key_dtype_;
  const char* const device_type_;
  std::string name_;
};

// The factories: a new table of `config` for the device of `ctx`.
::tensorflow::Status NewCpuTable(const core::TableConfig& config,
                                 ::tensorflow::DataType key_dtype, TableResource** out);
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA
// What the GPU table cannot hold, checked when the create op is built.
::tensorflow::Status CheckGpuTableConfig(const core::TableConfig& config);
::tensorflow::Status NewGpuTable(::tensorflow::OpKernelContext* ctx,
                                 const core::TableConfig& config,
                                 ::tensorflow::DataType key_dtype, TableResource** out);
#endif

}  // namespace dynamic_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_TABLE_RESOURCE_H_
