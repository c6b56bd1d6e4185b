// The argument checks of the dynamic-table ops (dynamic_kernels.cc): the
// create op's attributes, the checks of every input, and the tables' clock,
// used by the one OpKernel of each op whatever device it runs on.
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_KERNEL_COMMON_H_
#define SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_KERNEL_COMMON_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "compat/tf_compat.h"
#include "tf_ops/dynamic/core/batch_ops.h"
#include "tf_ops/optimizer/core/sparse_apply.h"
#include "tf_ops/optimizer/kernels/sparse_apply_spec.h"

namespace sok_graph {
namespace dynamic_kernels {

inline int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The table of input 0 as resource type R; the caller Unrefs it.
template <typename R>
::tensorflow::Status LookupTable(::tensorflow::OpKernelContext* ctx, R** table) {
  ::tensorflow::Status s =
      ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), table);
  if (!s.ok()) {
    return ::tensorflow::errors::FailedPrecondition(
        "the dynamic table does not exist: it was deleted (its DynamicVariable was garbage-",
        "collected while a tf.function or graph still reads it: keep a reference to the ",
        "table as long as what reads it), or, in graph mode, its initializer has not run ",
        "(tf.compat.v1.global_variables_initializer()); ", s.ToString());
  }
  return OkStatus();
}

// The attributes of SokDynamicTableCreate as a table configuration, with
// init_capacity clipped to the bound (max_capacity and max_bytes combined).
inline ::tensorflow::Status ParseCreateAttrs(::tensorflow::OpKernelConstruction* ctx,
                                             core::TableConfig* config,
                                             ::tensorflow::DataType* key_dtype) {
  namespace errors = ::tensorflow::errors;
  TF_RETURN_IF_ERROR(ctx->GetAttr("key_dtype", key_dtype));
  int dim = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("dim", &dim));
  config->dim = dim;
  std::string init, eviction;
  TF_RETURN_IF_ERROR(ctx->GetAttr("initializer", &init));
  if (!core::ParseInitKind(init, &config->initializer.kind)) {
    return errors::InvalidArgument("initializer must be one of 'normal', 'truncated_normal', ",
                                   "'uniform', 'zeros', 'constant'; got '", init, "'");
  }
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_mean", &config->initializer.mean));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_stddev", &config->initializer.stddev));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_minval", &config->initializer.minval));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_maxval", &config->initializer.maxval));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_value", &config->initializer.value));
  TfInt64 seed = 0, init_capacity = 0, max_capacity = 0, max_bytes = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("seed", &seed));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_capacity", &init_capacity));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_capacity", &max_capacity));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_bytes", &max_bytes));
  TfInt64 hbm_bytes = -1;
  TF_RETURN_IF_ERROR(ctx->GetAttr("hbm_bytes", &hbm_bytes));
  if (hbm_bytes < -1) {
    return errors::InvalidArgument("hbm_bytes must be >= 0 (-1: every row in device memory); got ",
                                   hbm_bytes);
  }
  config->hbm_bytes = hbm_bytes;
  const int64_t most = core::DynamicTable::kMaxEntries;
  if (init_capacity < 0) {
    return errors::InvalidArgument("init_capacity must be >= 0; got ", init_capacity);
  }
  if (init_capacity > most) {
    return errors::InvalidArgument("init_capacity must be <= ", most,
                                   " (the most rows a table holds); got ", init_capacity);
  }
  if (max_capacity < 0) {
    return errors::InvalidArgument("max_capacity must be >= 0 (0: no bound); got ",
                                   max_capacity);
  }
  if (max_bytes < 0) {
    return errors::InvalidArgument("max_bytes must be >= 0 (0: no bound); got ", max_bytes);
  }
  if (max_capacity > most) {
    return errors::InvalidArgument("max_capacity must be <= ", most, "; got ", max_capacity);
  }
  config->initializer.seed = static_cast<uint64_t>(seed);
  int64_t limit = max_capacity;
  if (max_bytes > 0) {
    const int64_t by_bytes = max_bytes / (dim * static_cast<int64_t>(sizeof(float)));
    if (by_bytes < 1) {
      return errors::InvalidArgument("max_bytes=", max_bytes, " holds no row of ", dim,
                                     " floats");
    }
    limit = limit > 0 ? std::min(limit, by_bytes) : by_bytes;
  }
  config->max_rows = limit;
  config->init_capacity = limit > 0 ? std::min<int64_t>(init_capacity, limit) : init_capacity;
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction", &eviction));
  if (eviction != "lru" && eviction != "lfu") {
    return errors::InvalidArgument("eviction must be 'lru' or 'lfu'; got '", eviction, "'");
  }
  config->eviction = eviction == "lru" ? core::Eviction::kLru : core::Eviction::kLfu;
  return OkStatus();
}

// A create op found a table under its name already: it must be the same kind.
inline ::tensorflow::Status CheckExistingTable(int64_t dim, ::tensorflow::DataType key_dtype,
                                               int64_t want_dim,
                                               ::tensorflow::DataType want_key_dtype) {
  if (dim == want_dim && key_dtype == want_key_dtype) return OkStatus();
  return ::tensorflow::errors::InvalidArgument(
      "a dynamic table of dimension ", dim, " and keys ", ::tensorflow::DataTypeString(key_dtype),
      " already exists under this name");
}

inline ::tensorflow::Status ParseScatterMode(::tensorflow::OpKernelConstruction* ctx,
                                             core::ScatterMode* mode) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("mode", &name));
  *mode = name == "add" ? core::ScatterMode::kAdd
                        : name == "sub" ? core::ScatterMode::kSub : core::ScatterMode::kUpdate;
  return OkStatus();
}

// Keys must have the table's key dtype and be a vector.
inline ::tensorflow::Status CheckKeys(const ::tensorflow::Tensor& keys,
                                      ::tensorflow::DataType table_key_dtype) {
  if (keys.dtype() != table_key_dtype) {
    return ::tensorflow::errors::InvalidArgument(
        "keys must be ", ::tensorflow::DataTypeString(table_key_dtype),
        " (the table's key dtype); got ", ::tensorflow::DataTypeString(keys.dtype()));
  }
  if (keys.dims() != 1) {
    return ::tensorflow::errors::InvalidArgument("keys must be a vector; got shape ",
                                                 keys.shape().DebugString());
  }
  return OkStatus();
}

inline ::tensorflow::Status CheckDimAttr(int dim, int64_t table_dim) {
  if (dim != table_dim) {
    return ::tensorflow::errors::InvalidArgument("dim=", dim,
                                                 " does not match the table's dimension ",
                                                 table_dim);
  }
  return OkStatus();
}

inline ::tensorflow::Status CheckRows(const ::tensorflow::Tensor& rows, int64_t n, int64_t dim) {
  if (rows.dims() != 2 || rows.dim_size(0) != n || rows.dim_size(1) != dim) {
    return ::tensorflow::errors::InvalidArgument(
        "rows must be [", n, ", ", dim, "] (one row of the table's dimension per key); got ",
        rows.shape().DebugString());
  }
  return OkStatus();
}

// An int64 scalar output written by the host (in host memory on a GPU).
inline ::tensorflow::Status ScalarOutput(::tensorflow::OpKernelContext* ctx, int index,
                                         int64_t value) {
  ::tensorflow::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, ::tensorflow::TensorShape({}), &out));
  out->scalar<TfInt64>()() = value;
  return OkStatus();
}

// SokDynamicTableFind's default_value (a scalar or a [dim] row, in host
// memory) as a row of dim floats.
inline ::tensorflow::Status ReadDefaultRow(const ::tensorflow::Tensor& def, int dim,
                                           std::vector<float>* row) {
  if (!(def.NumElements() == 1 || (def.dims() == 1 && def.dim_size(0) == dim))) {
    return ::tensorflow::errors::InvalidArgument("default_value must be a scalar or a [", dim,
                                                 "] row; got shape ", def.shape().DebugString());
  }
  row->resize(static_cast<size_t>(dim));
  for (int d = 0; d < dim; ++d) {
    (*row)[d] = def.NumElements() == 1 ? def.flat<float>()(0) : def.flat<float>()(d);
  }
  return OkStatus();
}

// SokDynamicTableExport's offset, limit and updated_after (inputs 1-3, host
// scalars) and its Tkeys against the table's key dtype.
struct ExportArgs {
  int64_t offset = 0;
  int64_t limit = 0;
  int64_t updated_after = 0;
};

inline ::tensorflow::Status ReadExportArgs(::tensorflow::OpKernelContext* ctx,
                                           ::tensorflow::DataType tkeys,
                                           ::tensorflow::DataType table_key_dtype,
                                           ExportArgs* args) {
  namespace errors = ::tensorflow::errors;
  // scalar<>() aborts the process on any other shape: check first.
  const char* const names[] = {"offset", "limit", "updated_after"};
  for (int i = 1; i <= 3; ++i) {
    if (!::tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape())) {
      return errors::InvalidArgument(names[i - 1], " must be a scalar; got shape ",
                                     ctx->input(i).shape().DebugString());
    }
  }
  args->offset = ctx->input(1).scalar<TfInt64>()();
  args->limit = ctx->input(2).scalar<TfInt64>()();
  args->updated_after = ctx->input(3).scalar<TfInt64>()();
  if (args->offset < 0) {
    return errors::InvalidArgument("offset must be >= 0; got ", args->offset);
  }
  if (args->limit < 1) return errors::InvalidArgument("limit must be >= 1; got ", args->limit);
  if (tkeys != table_key_dtype) {
    return errors::InvalidArgument("Tkeys must be ", ::tensorflow::DataTypeString(table_key_dtype),
                                   " (the table's key dtype)");
  }
  return OkStatus();
}

// The bound of an imported timestamp (microseconds, as the tables' own
// clock, now about 2^51): the clock moves past the latest one imported and
// must still count on from there.
constexpr int64_t kLatestTimestamp = int64_t{1} << 62;

// SokDynamicTableImport's timestamps (input 3) and frequencies (input 4):
// each empty or one entry per key, both read on the host; timestamps in
// [0, kLatestTimestamp), frequencies within the tables' 32-bit use counts.
inline ::tensorflow::Status CheckImportMetadata(::tensorflow::OpKernelContext* ctx, int64_t n) {
  for (int i = 3; i <= 4; ++i) {
    const ::tensorflow::Tensor& m = ctx->input(i);
    if (!(m.dims() == 1 && (m.NumElements() == 0 || m.NumElements() == n))) {
      return ::tensorflow::errors::InvalidArgument(
          "timestamps and frequencies must be empty or have one entry per key (", n,
          "); got shape ", m.shape().DebugString());
    }
  }
  const ::tensorflow::Tensor& ts = ctx->input(3);
  for (int64_t i = 0; i < ts.NumElements(); ++i) {
    const int64_t t = ts.flat<TfInt64>()(i);
    if (t < 0 || t >= kLatestTimestamp) {
      return ::tensorflow::errors::InvalidArgument(
          "timestamps must be in [0, 2^62) (microseconds since 1970); got ", t, " at position ",
          i);
    }
  }
  const ::tensorflow::Tensor& freq = ctx->input(4);
  for (int64_t i = 0; i < freq.NumElements(); ++i) {
    const int64_t f = freq.flat<TfInt64>()(i);
    if (f < 0 || f > std::numeric_limits<uint32_t>::max()) {
      return ::tensorflow::errors::InvalidArgument("frequencies must be in [0, 2^32); got ", f,
                                                   " at position ", i);
    }
  }
  return OkStatus();
}

// SokDynamicSparseApply: its attributes, the shapes of its inputs (table 0,
// keys 1, grads 2, hyper 3, step 4, then the slot tables) and its slot
// tables, looked up as resource type R (the CPU or the GPU table).
struct SparseApplyArgs {
  core::SparseApplyConfig config{};
  int num_slots = 0;

  ::tensorflow::Status Parse(::tensorflow::OpKernelConstruction* ctx) {
    std::string algorithm;
    bool nesterov = false;
    int32_t formulas = core::kKerasFormulas;
    TF_RETURN_IF_ERROR(ctx->GetAttr("algorithm", &algorithm));
    TF_RETURN_IF_ERROR(ParseSparseFormulas(ctx, &formulas));
    TF_RETURN_IF_ERROR(ctx->GetAttr("nesterov", &nesterov));
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_slots", &num_slots));
    TF_RETURN_IF_ERROR(CheckSparseApplySpec(ctx));
    core::SparseAlgorithm a;
    if (!core::ParseSparseAlgorithm(algorithm.c_str(), &a)) {
      return ::tensorflow::errors::InvalidArgument("unknown algorithm '", algorithm, "'");
    }
    if (num_slots != core::SlotCount(a)) {
      return ::tensorflow::errors::InvalidArgument(
          "algorithm '", algorithm, "' keeps ", core::SlotCount(a), " slot tables; got ",
          num_slots);
    }
    config = core::SparseApplyConfig{static_cast<int32_t>(a), formulas, nesterov ? 1 : 0};
    return OkStatus();
  }

  static ::tensorflow::Status CheckInputs(::tensorflow::OpKernelContext* ctx, int64_t n,
                                          int64_t dim) {
    const ::tensorflow::Tensor& grads = ctx->input(2);
    if (grads.dims() != 2 || grads.dim_size(0) != n || grads.dim_size(1) != dim) {
      return ::tensorflow::errors::InvalidArgument(
          "grads must be [", n, ", ", dim, "] (one row of the table's dimension per key); got ",
          grads.shape().DebugString());
    }
    if (ctx->input(3).dims() != 1 || ctx->input(3).NumElements() != core::kNumHyper) {
      return ::tensorflow::errors::InvalidArgument(
          "hyper must be a vector of ", static_cast<int>(core::kNumHyper), " entries; got shape ",
          ctx->input(3).shape().DebugString());
    }
    if (!::tensorflow::TensorShapeUtils::IsScalar(ctx->input(4).shape())) {
      return ::tensorflow::errors::InvalidArgument("step must be a scalar; got shape ",
                                                   ctx->input(4).shape().DebugString());
    }
    return OkStatus();
  }
};

// The slot tables of SokDynamicSparseApply (inputs 5...), each checked to
// have the table's dimension and key dtype; Unref'd on destruction.
template <typename R>
struct SlotTables {
  std::vector<R*> tables;

  ~SlotTables() {
    for (R* t : tables) t->Unref();
  }
  // dim_of(R&) gives a table's dimension.
  template <typename DimOf>
  ::tensorflow::Status Lookup(::tensorflow::OpKernelContext* ctx, int count, int64_t dim,
                              ::tensorflow::DataType key_dtype, DimOf dim_of) {
    for (int s = 0; s < count; ++s) {
      R* slot = nullptr;
      ::tensorflow::Status st =
          ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 5 + s), &slot);
      if (!st.ok()) {
        return ::tensorflow::errors::FailedPrecondition(
            "slot table ", s, " of the update does not exist: run its initializer first; ",
            st.ToString());
      }
      tables.push_back(slot);
      if (dim_of(*slot) != dim || slot->key_dtype() != key_dtype) {
        return ::tensorflow::errors::InvalidArgument(
            "slot table ", s, " has dimension ", dim_of(*slot), " and keys ",
            ::tensorflow::DataTypeString(slot->key_dtype()), "; the table has dimension ", dim,
            " and keys ", ::tensorflow::DataTypeString(key_dtype));
      }
    }
    return OkStatus();
  }
};

}  // namespace dynamic_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_KERNEL_COMMON_H_
