// The OpKernels of the dynamic-table ops: one per op, registered for the
// CPU and (in a CUDA build) the GPU. Each reads its attributes and checks
// its inputs here, once for both devices, so an op fails with the same
// message wherever TensorFlow places it; the work is the table's
// (table_resource.h: the CPU and the GPU implementation behind one
// interface).
//
// Placement follows the resource: the create op builds the table for the
// device it runs on, and every other op on that table must run there too
// (TensorFlow colocates ops with the resources they take; a table reached
// from another device is refused, never read through the wrong memory).
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "compat/tf_compat.h"
#include "tf_ops/common/gpu_stream.h"
#include "tf_ops/dynamic/kernels/dynamic_kernel_common.h"
#include "tf_ops/dynamic/kernels/table_resource.h"

namespace sok_graph {
namespace dynamic_kernels {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// Every op's base: where it runs, and whether it may wait for the device.
// A GPU kernel that waits for its stream (to size an output, or because a
// table grows) runs on a thread of its own (DeviceWaitingKernel); CPU
// kernels always do.
class TableOpKernel : public DeviceWaitingKernel<> {
 public:
  TableOpKernel(OpKernelConstruction* ctx, bool waits_on_gpu)
      : DeviceWaitingKernel(ctx, ctx->device_type() != ::tensorflow::DEVICE_GPU || waits_on_gpu),
        device_type_(ctx->device_type().type_string()) {}

 protected:
  // The table of input 0, held until `input` is destroyed, and, with
  // `with_keys`, the keys of input 1 checked against it.
  struct Input {
    TableResource* table = nullptr;
    ~Input() {
      if (table != nullptr) table->Unref();
    }
    const Tensor& keys(OpKernelContext* ctx) const { return ctx->input(1); }
  };
  Status Read(OpKernelContext* ctx, bool with_keys, Input* in) const {
    TF_RETURN_IF_ERROR(LookupTable(ctx, &in->table));
    if (device_type_ != in->table->device_type()) {
      return errors::FailedPrecondition("the dynamic table '",
                                        ::tensorflow::HandleFromInput(ctx, 0).name(),
                                        "' lives on a ", in->table->device_type(),
                                        " device; an op on a ", device_type_,
                                        " device cannot reach it");
    }
    if (!with_keys) return OkStatus();
    const Tensor& keys = ctx->input(1);
    TF_RETURN_IF_ERROR(CheckKeys(keys, in->table->key_dtype()));
    if (keys.NumElements() > in->table->max_keys_per_call()) {
      return errors::InvalidArgument("keys has ", keys.NumElements(), " entries; a ",
                                     device_type_, " table takes at most ",
                                     in->table->max_keys_per_call(), " per call");
    }
    return OkStatus();
  }

 private:
  const std::string device_type_;
};

// The ops whose dim attribute names the table's dimension.
class DimOpKernel : public TableOpKernel {
 public:
  DimOpKernel(OpKernelConstruction* ctx, bool waits_on_gpu) : TableOpKernel(ctx, waits_on_gpu) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

 protected:
  Status ReadWithDim(OpKernelContext* ctx, bool with_keys, Input* in) const {
    TF_RETURN_IF_ERROR(Read(ctx, with_keys, in));
    return CheckDimAttr(dim_, in->table->dim());
  }
  int dim_ = 0;
};

class CreateOp : public TableOpKernel {
 public:
  explicit CreateOp(OpKernelConstruction* ctx)
      : TableOpKernel(ctx, /*waits_on_gpu=*/false), on_gpu_(ctx->device_type() ==
                                                            ::tensorflow::DEVICE_GPU) {
    OP_REQUIRES_OK(ctx, ParseCreateAttrs(ctx, &config_, &key_dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &name_));
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA
    if (on_gpu_) OP_REQUIRES_OK(ctx, CheckGpuTableConfig(config_));
#endif
  }

  void Compute(OpKernelContext* ctx) override {
    TableResource* table = nullptr;
    const core::TableConfig config = config_;
    const DataType key_dtype = key_dtype_;
    const bool on_gpu = on_gpu_;
    const std::string& name = name_;
    OP_REQUIRES_OK(ctx, ::tensorflow::LookupOrCreateResource<TableResource>(
                            ctx, ::tensorflow::HandleFromInput(ctx, 0), &table,
                            [ctx, &config, key_dtype, on_gpu, &name](TableResource** out) {
                              Status made;
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA
                              if (on_gpu) made = NewGpuTable(ctx, config, key_dtype, out);
#endif
                              (void)ctx;
                              if (!on_gpu) made = NewCpuTable(config, key_dtype, out);
                              if (made.ok()) (*out)->set_name(name);
                              return made;
                            }));
    ::tensorflow::core::ScopedUnref unref(table);
    OP_REQUIRES_OK(ctx,
                   CheckExistingTable(table->dim(), table->key_dtype(), config_.dim, key_dtype_));
  }

 private:
  const bool on_gpu_;
  core::TableConfig config_;
  DataType key_dtype_;
  std::string name_;
};

class IsInitializedOp : public TableOpKernel {
 public:
  explicit IsInitializedOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    TableResource* table = nullptr;
    const bool exists =
        ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), &table).ok();
    if (exists) table->Unref();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = exists;
  }
};

class FindOrInsertOp : public DimOpKernel {
 public:
  explicit FindOrInsertOp(OpKernelConstruction* ctx) : DimOpKernel(ctx, true) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, ReadWithDim(ctx, true, &in));
    OP_REQUIRES_OK(ctx, in.table->FindOrInsert(ctx, in.keys(ctx)));
  }
};

class UniqueFindOrInsertOp : public DimOpKernel {
 public:
  explicit UniqueFindOrInsertOp(OpKernelConstruction* ctx) : DimOpKernel(ctx, true) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, ReadWithDim(ctx, true, &in));
    OP_REQUIRES_OK(ctx, in.table->UniqueFindOrInsert(ctx, in.keys(ctx)));
  }
};

class FindOp : public DimOpKernel {
 public:
  explicit FindOp(OpKernelConstruction* ctx) : DimOpKernel(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, ReadWithDim(ctx, true, &in));
    std::vector<float> default_row;
    OP_REQUIRES_OK(ctx, ReadDefaultRow(ctx->input(2), dim_, &default_row));
    OP_REQUIRES_OK(ctx, in.table->Find(ctx, in.keys(ctx), default_row));
  }
};

class ScatterOp : public TableOpKernel {
 public:
  explicit ScatterOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, true) {
    OP_REQUIRES_OK(ctx, ParseScatterMode(ctx, &mode_));
  }
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, Read(ctx, true, &in));
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows(rows, in.keys(ctx).NumElements(), in.table->dim()));
    OP_REQUIRES_OK(ctx, in.table->Scatter(ctx, in.keys(ctx), rows, mode_));
  }

 private:
  core::ScatterMode mode_ = core::ScatterMode::kUpdate;
};

class RemoveOp : public TableOpKernel {
 public:
  explicit RemoveOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, Read(ctx, true, &in));
    OP_REQUIRES_OK(ctx, in.table->Remove(ctx, in.keys(ctx)));
  }
};

class AddShadowOp : public TableOpKernel {
 public:
  explicit AddShadowOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, Read(ctx, false, &in));
    TableResource* shadow = nullptr;
    const ::tensorflow::ResourceHandle& handle = ::tensorflow::HandleFromInput(ctx, 1);
    const Status found = ::tensorflow::LookupResource(ctx, handle, &shadow);
    // A handle of another device is not found either: say both.
    OP_REQUIRES(ctx, found.ok(),
                errors::FailedPrecondition("the shadow table '", handle.name(),
                                           "' was not found where the table '",
                                           ::tensorflow::HandleFromInput(ctx, 0).name(),
                                           "' lives: it must be on the table's device and "
                                           "exist (run its initializer first); ",
                                           found.ToString()));
    ::tensorflow::core::ScopedUnref unref(shadow);
    // A table that shadowed itself would hold a reference to itself.
    OP_REQUIRES(ctx, shadow != in.table,
                errors::InvalidArgument("a dynamic table cannot shadow itself ('",
                                        handle.name(), "')"));
    OP_REQUIRES(ctx, shadow->key_dtype() == in.table->key_dtype(),
                errors::InvalidArgument(
                    "a shadow table must have the table's key type: the table's keys are ",
                    ::tensorflow::DataTypeString(in.table->key_dtype()), ", the shadow's ",
                    ::tensorflow::DataTypeString(shadow->key_dtype())));
    OP_REQUIRES(ctx, std::strcmp(shadow->device_type(), in.table->device_type()) == 0,
                errors::InvalidArgument("the shadow table lives on a ", shadow->device_type(),
                                        " device, the table on a ", in.table->device_type(),
                                        " device"));
    in.table->AddShadow(shadow);
  }
};

class StatsOp : public TableOpKernel {
 public:
  explicit StatsOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, true) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, Read(ctx, false, &in));
    TableResource::Stats stats;
    OP_REQUIRES_OK(ctx, in.table->ReadStats(ctx, &stats));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 0, stats.size));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 1, stats.row_limit));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 2, stats.evicted_total));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, 3, stats.memory_bytes));
  }
};

class ExportOp : public DimOpKernel {
 public:
  explicit ExportOp(OpKernelConstruction* ctx) : DimOpKernel(ctx, true) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, ReadWithDim(ctx, false, &in));
    ExportArgs args;
    OP_REQUIRES_OK(ctx, ReadExportArgs(ctx, ctx->expected_output_dtype(0),
                                       in.table->key_dtype(), &args));
    OP_REQUIRES_OK(ctx, in.table->Export(ctx, args));
  }
};

class ImportOp : public TableOpKernel {
 public:
  explicit ImportOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, true) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("replace", &replace_));
  }
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, Read(ctx, true, &in));
    const int64_t n = in.keys(ctx).NumElements();
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows(rows, n, in.table->dim()));
    OP_REQUIRES_OK(ctx, CheckImportMetadata(ctx, n));
    OP_REQUIRES_OK(ctx, in.table->Import(ctx, in.keys(ctx), rows, replace_));
  }

 private:
  bool replace_ = false;
};

class ClearOp : public TableOpKernel {
 public:
  explicit ClearOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, Read(ctx, false, &in));
    OP_REQUIRES_OK(ctx, in.table->ClearWithShadows(ctx));
  }
};

// SokDynamicSparseApply: the fused update of a table and its slot tables
// (the same steps as the TensorFlow-op update: find, find-or-insert in each
// slot table, the formula, write every table back).
class SparseApplyOp : public TableOpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, true) {
    OP_REQUIRES_OK(ctx, args_.Parse(ctx));
  }
  void Compute(OpKernelContext* ctx) override {
    Input in;
    OP_REQUIRES_OK(ctx, Read(ctx, true, &in));
    const int64_t dim = in.table->dim();
    OP_REQUIRES_OK(ctx, SparseApplyArgs::CheckInputs(ctx, in.keys(ctx).NumElements(), dim));
    SlotTables<TableResource> slots;
    OP_REQUIRES_OK(ctx, slots.Lookup(ctx, args_.num_slots, dim, in.table->key_dtype(),
                                     [](TableResource& r) { return r.dim(); }));
    for (const TableResource* slot : slots.tables) {
      OP_REQUIRES(ctx, std::strcmp(slot->device_type(), in.table->device_type()) == 0,
                  errors::InvalidArgument("a slot table lives on a ", slot->device_type(),
                                          " device, the table on a ", in.table->device_type(),
                                          " device"));
    }
    OP_REQUIRES_OK(ctx, in.table->SparseApply(ctx, in.keys(ctx), slots.tables, args_.config));
  }

 private:
  SparseApplyArgs args_;
};

using ::tensorflow::DEVICE_CPU;

REGISTER_KERNEL_BUILDER(Name("SokDynamicTableHandle").Device(DEVICE_CPU),
                        ::tensorflow::ResourceHandleOp<TableResource>);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableCreate").Device(DEVICE_CPU), CreateOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableIsInitialized").Device(DEVICE_CPU),
                        IsInitializedOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFindOrInsert").Device(DEVICE_CPU), FindOrInsertOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableUniqueFindOrInsert").Device(DEVICE_CPU),
                        UniqueFindOrInsertOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFind").Device(DEVICE_CPU), FindOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableScatter").Device(DEVICE_CPU), ScatterOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableRemove").Device(DEVICE_CPU), RemoveOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableAddShadow").Device(DEVICE_CPU), AddShadowOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableStats").Device(DEVICE_CPU), StatsOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableExport").Device(DEVICE_CPU), ExportOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableImport").Device(DEVICE_CPU), ImportOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableClear").Device(DEVICE_CPU), ClearOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicSparseApply").Device(DEVICE_CPU), SparseApplyOp);

#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA
using ::tensorflow::DEVICE_GPU;

// On the GPU the resource handle lives in host memory (as TensorFlow's own
// resource ops declare it), and so do the scalars the host reads or writes:
// counts, offsets and limits, default_value, and the frequencies checked
// before an import. Keys, rows and their metadata stay on the device.
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableHandle").Device(DEVICE_GPU).HostMemory("table"),
                        ::tensorflow::ResourceHandleOp<TableResource>);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableIsInitialized")
                            .Device(DEVICE_GPU)
                            .HostMemory("table")
                            .HostMemory("is_initialized"),
                        IsInitializedOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableStats")
                            .Device(DEVICE_GPU)
                            .HostMemory("table")
                            .HostMemory("size")
                            .HostMemory("row_limit")
                            .HostMemory("evicted_total")
                            .HostMemory("memory_bytes"),
                        StatsOp);
REGISTER_KERNEL_BUILDER(Name("SokDynamicTableClear").Device(DEVICE_GPU).HostMemory("table"),
                        ClearOp);
REGISTER_KERNEL_BUILDER(
    Name("SokDynamicTableAddShadow").Device(DEVICE_GPU).HostMemory("table").HostMemory("shadow"),
    AddShadowOp);

// The ops that take or give keys, per key type (the GPU table widens int32
// keys on the device and narrows them on the way out).
#define SOK_REGISTER_DYNAMIC_GPU(K)                                                       \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("SokDynamicTableCreate").Device(DEVICE_GPU).HostMemory("table").TypeConstraint<K>( \
          "key_dtype"),                                                                  \
      CreateOp);                                                                         \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFindOrInsert")                            \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          FindOrInsertOp);                                               \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableUniqueFindOrInsert")                      \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          UniqueFindOrInsertOp);                                         \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableFind")                                    \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("default_value")                               \
                              .TypeConstraint<K>("Tkeys"),                               \
                          FindOp);                                                       \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableScatter")                                 \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          ScatterOp);                                                    \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("SokDynamicTableRemove").Device(DEVICE_GPU).HostMemory("table").TypeConstraint<K>( \
          "Tkeys"),                                                                      \
      RemoveOp);                                                                         \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableExport")                                  \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("offset")                                      \
                              .HostMemory("limit")                                       \
                              .HostMemory("updated_after")                               \
                              .HostMemory("next_offset")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          ExportOp);                                                     \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicTableImport")                                  \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("timestamps")                                  \
                              .HostMemory("frequencies")                                 \
                              .HostMemory("num_evicted")                                 \
                              .TypeConstraint<K>("Tkeys"),                               \
                          ImportOp);                                                     \
  REGISTER_KERNEL_BUILDER(Name("SokDynamicSparseApply")                                  \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("table")                                       \
                              .HostMemory("slots")                                       \
                              .TypeConstraint<K>("Tkeys"),                               \
                          SparseApplyOp);
SOK_REGISTER_DYNAMIC_GPU(TfInt64)
SOK_REGISTER_DYNAMIC_GPU(int32_t)
#undef SOK_REGISTER_DYNAMIC_GPU
#endif  // SOK_GRAPH_WITH_CUDA

}  // namespace
}  // namespace dynamic_kernels
}  // namespace sok_graph
