// The fused lookup's attributes and per-table input checks, in one place for
// the CPU kernels (lookup_kernels.cc) and the GPU kernels
// (lookup_kernels_gpu.cc) of SokFusedLookup and SokFusedLookupGrad: both
// reject the same inputs with the same messages before touching any memory.
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_ARGS_H_
#define SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_ARGS_H_

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/lookup/core/combiner.h"

namespace sok_graph {

class FusedLookupAttrs {
 public:
  ::tensorflow::Status Parse(::tensorflow::OpKernelConstruction* ctx) {
    namespace errors = ::tensorflow::errors;
    std::vector<std::string> combiners;
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_tables", &num_tables));
    TF_RETURN_IF_ERROR(ctx->GetAttr("combiners", &combiners));
    TF_RETURN_IF_ERROR(ctx->GetAttr("weighted", &weighted));
    TF_RETURN_IF_ERROR(ctx->GetAttr("max_norms", &max_norms));
    TF_RETURN_IF_ERROR(ctx->GetAttr("table_names", &names));
    TF_RETURN_IF_ERROR(ctx->GetAttr("dense_grads", &dense_grads));
    const size_t n = static_cast<size_t>(num_tables);
    if (dense_grads.empty()) dense_grads.assign(n, false);
    if (dense_grads.size() != n) {
      return errors::InvalidArgument("dense_grads must be empty or have num_tables=",
                                     num_tables, " entries; got ", dense_grads.size());
    }
    if (combiners.size() != n || weighted.size() != n || max_norms.size() != n ||
        (!names.empty() && names.size() != n)) {
      return errors::InvalidArgument("combiners, weighted, max_norms and table_names must ",
                                     "each have num_tables=", num_tables, " entries");
    }
    this->combiners.resize(n);
    for (size_t t = 0; t < n; ++t) {
      if (!core::ParseCombiner(combiners[t], &this->combiners[t])) {
        return errors::InvalidArgument("combiners[", t, "] must be one of ",
                                       core::QuotedCombinerNames(), "; got '", combiners[t],
                                       "'");
      }
    }
    return OkStatus();
  }

  std::string TableName(int t) const {
    if (names.empty()) return "table " + std::to_string(t);
    return "table '" + names[t] + "' (table " + std::to_string(t) + ")";
  }

  // Whether table t's row_splits is the empty vector that stands for one id
  // per sample (0, 1, ..., nnz): only where one_id_splits allows it.
  bool OneIdPerSample(const ::tensorflow::Tensor& row_splits) const {
    return one_id_splits && row_splits.dims() == 1 && row_splits.NumElements() == 0;
  }

  // Table t's inputs: params a [rows, dim] matrix of `dtype`, ids a vector,
  // row_splits a vector that starts at 0, never decreases and ends at the
  // number of ids (or, where one_id_splits allows, empty: one id per sample,
  // for an unweighted table), weights one per id when the table is weighted. Ids are
  // range-checked by the passes that read them; row_splits' values here when
  // they are in host memory (the CPU kernels), else by the GPU kernels
  // (sok_lookup_check_splits, reported through CheckedColumn).
  ::tensorflow::Status CheckTable(int t, const ::tensorflow::Tensor& params,
                                  ::tensorflow::DataType dtype, const ::tensorflow::Tensor& ids,
                                  const ::tensorflow::Tensor& row_splits,
                                  const ::tensorflow::Tensor& weights,
                                  bool splits_on_host = true) const {
    namespace errors = ::tensorflow::errors;
    if (params.dims() != 2) {
      return errors::InvalidArgument("params of ", TableName(t), " must be a matrix [rows, ",
                                     "dim]; got shape ", params.shape().DebugString());
    }
    if (params.dtype() != dtype) {
      return errors::InvalidArgument("params of ", TableName(t), " must be ",
                                     ::tensorflow::DataTypeString(dtype),
                                     " like the weights and embeddings; got ",
                                     ::tensorflow::DataTypeString(params.dtype()));
    }
    if (ids.dims() != 1) {
      return errors::InvalidArgument("ids of ", TableName(t), " must be a vector; got shape ",
                                     ids.shape().DebugString());
    }
    if (!OneIdPerSample(row_splits) &&
        (row_splits.dims() != 1 || row_splits.NumElements() < 1)) {
      return errors::InvalidArgument("row_splits of ", TableName(t), " must be a vector of ",
                                     "batch + 1 >= 1 entries",
                                     one_id_splits ? " (or empty: one id per sample)" : "",
                                     "; got shape ", row_splits.shape().DebugString());
    }
    if (weights.dims() != 1 || (weighted[t] && weights.NumElements() != ids.NumElements())) {
      return errors::InvalidArgument("weights of ", TableName(t), " must be a vector with ",
                                     "one weight per id (", ids.NumElements(), "); got shape ",
                                     weights.shape().DebugString());
    }
    if (OneIdPerSample(row_splits)) {
      if (weighted[t]) {
        return errors::InvalidArgument("row_splits of ", TableName(t), " may be empty (one id ",
                                       "per sample) only for an unweighted table; table ", t,
                                       " is weighted");
      }
      return OkStatus();
    }
    const int64_t nnz = ids.NumElements();
    if (!splits_on_host) {
      if (row_splits.NumElements() == 1 && nnz > 0) {  // no sample, yet ids
        return errors::InvalidArgument("row_splits of ", TableName(t), " must start at 0, ",
                                       "never decrease and end at the number of ids (", nnz,
                                       "); got 1 entry (no samples)");
      }
      return OkStatus();
    }
    const int64_t* splits = reinterpret_cast<const int64_t*>(row_splits.flat<TfInt64>().data());
    const core::SplitsProblem problem =
        core::CheckRowSplits(splits, row_splits.NumElements(), nnz);
    if (problem.kind != core::SplitsProblem::kNone) {
      const int64_t k = problem.position;
      return SplitsError(t, k, problem.kind == core::SplitsProblem::kDecreasing, splits[k],
                         k > 0 ? splits[k - 1] : 0, nnz);
    }
    return OkStatus();
  }

  // The error for row_splits[k] = value of table t (after row_splits[k - 1]
  // = previous where `decreasing`).
  ::tensorflow::Status SplitsError(int t, int64_t k, bool decreasing, int64_t value,
                                   int64_t previous, int64_t nnz) const {
    std::string got = "row_splits[" + std::to_string(k) + "]=" + std::to_string(value);
    if (decreasing) {
      got += " after row_splits[" + std::to_string(k - 1) + "]=" + std::to_string(previous);
    }
    return ::tensorflow::errors::InvalidArgument(
        "row_splits of ", TableName(t), " must start at 0, never decrease and end at the ",
        "number of ids (", nnz, "); got ", got);
  }

  // Column t of a check filled on the GPU (int64 [kCheckRows, num_tables],
  // see SOK_LOOKUP_CHECK_ROWS in lookup_launcher.h): the error the CPU
  // kernel gives for the same input, row_splits first, else OK.
  static constexpr int kCheckRows = 7;
  static constexpr int64_t kNoProblem = INT64_MAX;
  ::tensorflow::Status CheckedColumn(int t, const int64_t* checks) const {
    const int n = num_tables;
    const int64_t key = checks[3 * n + t];
    if (key != kNoProblem) {
      const int64_t k = key / 2;
      return SplitsError(t, k, key % 2 == 0 && k > 0, checks[4 * n + t], checks[5 * n + t],
                         checks[6 * n + t]);
    }
    if (checks[t] != kNoProblem) return BadId(t, checks[n + t], checks[t], checks[2 * n + t]);
    return OkStatus();
  }

  // A check column with no problem (the CPU kernels, which report at once).
  static void ClearColumn(int64_t* checks, int n, int t, int64_t rows, int64_t nnz) {
    for (int r = 0; r < kCheckRows; ++r) checks[r * n + t] = 0;
    checks[t] = kNoProblem;
    checks[3 * n + t] = kNoProblem;
    checks[2 * n + t] = rows;
    checks[6 * n + t] = nnz;
  }

  // The gradient op's upstream gradient of table t: the embeddings' shape.
  ::tensorflow::Status CheckGrads(int t, const ::tensorflow::Tensor& grads, int64_t batch,
                                  int64_t dim) const {
    if (grads.dims() == 2 && grads.dim_size(0) == batch && grads.dim_size(1) == dim) {
      return OkStatus();
    }
    return ::tensorflow::errors::InvalidArgument(
        "grads of ", TableName(t), " must have shape [", batch, ", ", dim,
        "] (the embeddings' shape); got ", grads.shape().DebugString());
  }

  // The error for a bad id at `position` of table t.
  ::tensorflow::Status BadId(int t, int64_t id, int64_t position, int64_t rows) const {
    return ::tensorflow::errors::InvalidArgument("ids of ", TableName(t), " must be in [0, ",
                                                 rows, ") (the table's rows); got ", id,
                                                 " at position ", position);
  }

  int num_tables = 0;
  std::vector<core::Combiner> combiners;
  std::vector<bool> weighted;
  std::vector<float> max_norms;
  std::vector<std::string> names;
  // Per table: its gradient is a dense [rows, dim] tensor (SokFusedLookupGrad).
  std::vector<bool> dense_grads;
  // An empty row_splits is taken as one id per sample (SokFusedLookupGrad's
  // kernels set it: all2all_dense_embedding's gradient then needs no range
  // of n + 1 splits, nor their check, nor the per-sample pass that reads them).
  bool one_id_splits = false;
};

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_ARGS_H_
