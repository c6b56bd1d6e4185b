// The one OpKernel of SokFusedLookup and of SokFusedLookupGrad, for every
// device: each parses its attributes, reads and checks its tables once
// (lookup_args.h), and hands them to the device's functor — the CPU's in
// lookup_kernels.cc (tf_ops/lookup/core/lookup.h on the op's threads), the
// GPU's in lookup_kernels_gpu.cc (the launchers of lookup_forward.cu and
// lookup_backward_*.cu on the op's stream). Each device file registers the
// kernels with its functor.
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_OP_H_
#define SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_OP_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "compat/tf_compat.h"
#include "tf_ops/common/gpu_stream.h"
#include "tf_ops/lookup/kernels/lookup_args.h"
#include "tf_ops/common/table_inputs.h"

namespace sok_graph {
namespace lookup_kernels {

struct CpuDevice {};
struct GpuDevice {};

// One table of a fused lookup as the op's inputs give it, checked.
struct LookupTableInput {
  const ::tensorflow::Tensor* params = nullptr;  // [rows, dim]
  const ::tensorflow::Tensor* ids = nullptr;     // [nnz]
  // [batch + 1]; null when the table has one id per sample (an empty
  // row_splits, where the op takes it).
  const ::tensorflow::Tensor* row_splits = nullptr;
  const ::tensorflow::Tensor* weights = nullptr;  // [nnz]; null when unweighted
  int64_t batch = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t nnz = 0;
  core::Combiner combiner = core::Combiner::kSum;
  float max_norm = 0.0f;
};

// Reads the params, ids, row_splits and weights of every table and checks
// them (CheckTable: row_splits' values too where they are in host memory).
// Variables among the params stay read-locked while `params` lives.
inline ::tensorflow::Status ReadLookupTables(::tensorflow::OpKernelContext* ctx,
                                             const FusedLookupAttrs& attrs,
                                             ::tensorflow::DataType dtype, bool splits_on_host,
                                             TableInputs* params,
                                             std::vector<LookupTableInput>* tables) {
  ::tensorflow::OpInputList ids, splits, weights;
  TF_RETURN_IF_ERROR(params->Read(ctx, "params", attrs.num_tables,
                                  [&attrs](int t) { return attrs.TableName(t); }));
  TF_RETURN_IF_ERROR(ctx->input_list("ids", &ids));
  TF_RETURN_IF_ERROR(ctx->input_list("row_splits", &splits));
  TF_RETURN_IF_ERROR(ctx->input_list("weights", &weights));
  tables->assign(attrs.num_tables, LookupTableInput());
  for (int t = 0; t < attrs.num_tables; ++t) {
    const ::tensorflow::Tensor& p = (*params)[t];
    const ::tensorflow::Tensor& i = ids[t];
    const ::tensorflow::Tensor& s = splits[t];
    const ::tensorflow::Tensor& w = weights[t];
    TF_RETURN_IF_ERROR(attrs.CheckTable(t, p, dtype, i, s, w, splits_on_host));
    LookupTableInput& v = (*tables)[t];
    v.params = &p;
    v.ids = &i;
    const bool one_id = attrs.OneIdPerSample(s);
    v.row_splits = one_id ? nullptr : &s;
    v.weights = attrs.weighted[t] ? &w : nullptr;
    v.batch = one_id ? i.NumElements() : s.NumElements() - 1;
    v.rows = p.dim_size(0);
    v.dim = p.dim_size(1);
    v.nnz = i.NumElements();
    v.combiner = attrs.combiners[t];
    v.max_norm = attrs.max_norms[t];
  }
  return OkStatus();
}

// The devices' work: Status operator()(ctx, attrs, tables) for the
// forward; (ctx, attrs, tables, grads) for the gradient, grads[t] checked
// to have table t's embeddings' shape.
template <typename Device, typename T, typename K>
struct FusedLookupForward;
template <typename Device, typename T, typename K>
struct FusedLookupBackward;

// Whether row_splits are in host memory (checked when read) or in device
// memory (checked by the device's kernels).
inline bool SplitsOnHost(CpuDevice) { return true; }
inline bool SplitsOnHost(GpuDevice) { return false; }

template <typename Device, typename T, typename K>
class FusedLookupOp : public ::tensorflow::OpKernel {
 public:
  explicit FusedLookupOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    TableInputs params;
    std::vector<LookupTableInput> tables;
    OP_REQUIRES_OK(ctx, ReadLookupTables(ctx, attrs_, ::tensorflow::DataTypeToEnum<T>::v(),
                                         SplitsOnHost(Device()), &params, &tables));
    OP_REQUIRES_OK(ctx, (FusedLookupForward<Device, T, K>()(ctx, attrs_, tables)));
  }

 private:
  FusedLookupAttrs attrs_;
};

// The gradient takes an empty row_splits as one id per sample. On the GPU
// it waits for its output sizes unless every table's gradient is dense.
template <typename Device, typename T, typename K>
class FusedLookupGradOp : public DeviceWaitingKernel<> {
 public:
  explicit FusedLookupGradOp(::tensorflow::OpKernelConstruction* ctx)
      : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
    attrs_.one_id_splits = true;
    const auto& dense = attrs_.dense_grads;
    set_waits(SplitsOnHost(Device()) ||
              !std::all_of(dense.begin(), dense.end(), [](bool d) { return d; }));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    TableInputs params;
    std::vector<LookupTableInput> tables;
    OP_REQUIRES_OK(ctx, ReadLookupTables(ctx, attrs_, ::tensorflow::DataTypeToEnum<T>::v(),
                                         SplitsOnHost(Device()), &params, &tables));
    ::tensorflow::OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    for (int t = 0; t < attrs_.num_tables; ++t) {
      OP_REQUIRES_OK(ctx, attrs_.CheckGrads(t, grads[t], tables[t].batch, tables[t].dim));
    }
    OP_REQUIRES_OK(ctx, (FusedLookupBackward<Device, T, K>()(ctx, attrs_, tables, grads)));
  }

 private:
  FusedLookupAttrs attrs_;
};

}  // namespace lookup_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_OP_H_
