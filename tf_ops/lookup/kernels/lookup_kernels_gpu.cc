// The fused lookup on the GPU: the functors of
// SokFusedLookup and SokFusedLookupGrad (lookup_op.h, which reads and
// checks the inputs) — the GPU's own limits and allocation here, the
// arithmetic in the C launchers of lookup_forward.cu / lookup_backward_*.cu,
// run on the op's stream. Compiled
// only when the build found a CUDA toolkit (SOK_GRAPH_WITH_CUDA).
//
// The kernels compute in float32. A float16 or bfloat16 lookup converts
// its tables, weights and incoming gradients to float32 on the device and
// rounds its outputs back once, as the CPU kernel accumulates in float32
// and rounds once: the same bits. sok.lookup_sparse hands the op only the
// batch's distinct rows of a low-precision variable, so what is converted
// is the batch's size, not the table's.
//
// Everything stays in device memory: ids and row_splits are checked on the
// device by the kernels that read them (a bad id is never read through,
// malformed row_splits are read clamped to the ids). The forward waits for
// nothing: it leaves what it found in its `checks` output, which
// SokLookupCheck reports on the host once TensorFlow has copied it there.
// The gradient must know how many distinct ids each table has before it
// can allocate its outputs: its one host synchronisation reads those counts
// and the checks together, and reports a problem as the CPU kernel does.
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_scratch.h"
#include "tf_ops/common/gpu_stream.h"
#include "compat/tf_compat.h"
#include "tf_ops/lookup/kernels/lookup_args.h"
#include "tf_ops/lookup/kernels/lookup_launcher.h"
#include "tf_ops/lookup/kernels/lookup_op.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {
namespace lookup_kernels {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;


Status Temp(OpKernelContext* ctx, int64_t bytes, Tensor* t) {
  return ctx->allocate_temp(::tensorflow::DT_INT8, TensorShape({bytes > 0 ? bytes : 1}), t);
}

void* Data(Tensor& t) { return const_cast<char*>(t.tensor_data().data()); }
float* FloatData(const Tensor& t) {
  return reinterpret_cast<float*>(const_cast<char*>(t.tensor_data().data()));
}

// The launchers' description of each table (device pointers, row_splits
// included; `out` and `clip` left null), after the GPU's own limits.
Status Descriptors(const FusedLookupAttrs& attrs, const std::vector<LookupTableInput>& in,
                   int id_bytes, std::vector<SokLookupTable>* tables) {
  tables->assign(in.size(), SokLookupTable());
  for (size_t t = 0; t < in.size(); ++t) {
    const LookupTableInput& i = in[t];
    if (i.dim > INT32_MAX / 4) {
      return errors::InvalidArgument("params of ", attrs.TableName(t), " has dim ", i.dim,
                                     "; the GPU kernel takes at most ", INT32_MAX / 4);
    }
    SokLookupTable& v = (*tables)[t];
    v.params = i.params->flat<float>().data();
    v.ids = i.ids->tensor_data().data();
    // One id per sample: no splits; the kernels that would read them know
    // the samples so.
    v.row_splits = i.row_splits == nullptr
                       ? nullptr
                       : reinterpret_cast<const int64_t*>(i.row_splits->tensor_data().data());
    v.weights = i.weights != nullptr ? i.weights->flat<float>().data() : nullptr;
    v.clip = nullptr;
    v.out = nullptr;
    v.batch = i.batch;
    v.rows = i.rows;
    v.nnz = i.nnz;
    v.dim = static_cast<int32_t>(i.dim);
    v.combiner = static_cast<int32_t>(i.combiner);  // the launcher's int
    v.id_bytes = id_bytes;
    v.max_norm = i.max_norm;
  }
  return OkStatus();
}

// A cleared check [kCheckRows, n] at `checks` (device), the table
// descriptors copied to `descs` (device), and row_splits checked into it.
Status StartChecks(OpKernelContext* ctx, const std::vector<SokLookupTable>& tables,
                   int64_t* checks, Tensor* descs) {
  const int n = static_cast<int>(tables.size());
  void* stream = GpuStreamOf(ctx);
  std::vector<int64_t> host(static_cast<size_t>(FusedLookupAttrs::kCheckRows) * n);
  int64_t max_batch = 0;
  bool any_splits = false;  // tables given one id per sample have none to check
  for (int t = 0; t < n; ++t) {
    FusedLookupAttrs::ClearColumn(host.data(), n, t, tables[t].rows, tables[t].nnz);
    if (tables[t].row_splits == nullptr) continue;
    any_splits = true;
    max_batch = std::max(max_batch, tables[t].batch);
  }
  TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(checks, host.data(),
                                                       sizeof(int64_t) * host.size(), stream),
                                "clearing the input check"));
  TF_RETURN_IF_ERROR(Temp(ctx, sizeof(SokLookupTable) * n, descs));
  TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(Data(*descs), tables.data(),
                                                       sizeof(SokLookupTable) * n, stream),
                                "copying table descriptors"));
  if (!any_splits) return OkStatus();
  return CudaStatus(sok_lookup_check_splits(static_cast<const SokLookupTable*>(Data(*descs)), n,
                                            max_batch, checks, stream),
                    "sok_lookup_check_splits");
}

// Where the float32 kernels write table t's output of `shape`: the op's own
// output for a float32 lookup, a float32 scratch tensor for a low-precision
// one (LowPrecision below).
using FloatOutput = std::function<Status(int t, const TensorShape& shape, float** out)>;

// The forward of every table in float32 (FusedLookupForward).
template <typename K>
Status ForwardF32(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                  const std::vector<LookupTableInput>& in, const FloatOutput& output) {
  const int n = attrs.num_tables;
  void* stream = GpuStreamOf(ctx);
  std::vector<SokLookupTable> tables;
  TF_RETURN_IF_ERROR(Descriptors(attrs, in, sizeof(K), &tables));
  std::vector<int64_t> nnz(n);
  for (int t = 0; t < n; ++t) nnz[t] = in[t].nnz;
  Tensor* checks_out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(
                          "checks", TensorShape({FusedLookupAttrs::kCheckRows, n}), &checks_out));
  int64_t* checks = reinterpret_cast<int64_t*>(Data(*checks_out));
  int64_t* bad = checks;  // row 0: each table's first bad id position
  std::vector<Tensor> clips(n);
  std::vector<int64_t> offsets(n + 1, 0);
  bool vectorized = true;
  for (int t = 0; t < n; ++t) {
    SokLookupTable& v = tables[t];
    TF_RETURN_IF_ERROR(output(t, TensorShape({v.batch, v.dim}), &v.out));
    offsets[t + 1] = offsets[t] + v.batch;
    vectorized = vectorized && v.dim % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(v.params) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(v.out) % 16 == 0;
    if (v.max_norm > 0.0f && nnz[t] > 0) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({nnz[t]}),
                                             &clips[t]));
      v.clip = clips[t].flat<float>().data();
    }
  }
  // The descriptors (with their outputs and clip buffers) and the check.
  Tensor descs;
  TF_RETURN_IF_ERROR(StartChecks(ctx, tables, checks, &descs));
  for (int t = 0; t < n; ++t) {
    if (tables[t].clip == nullptr) continue;
    TF_RETURN_IF_ERROR(CudaStatus(sok_lookup_clip_factors(&tables[t], nnz[t],
                                                           const_cast<float*>(tables[t].clip),
                                                           bad + t, stream),
                                   "sok_lookup_clip_factors"));
  }
  const SokLookupTable* descs_dev = static_cast<const SokLookupTable*>(Data(descs));
  if (offsets[n] > 0) {
    Tensor offsets_dev;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n + 1}),
                                           &offsets_dev));
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(Data(offsets_dev), offsets.data(),
                                                          sizeof(int64_t) * (n + 1), stream),
                                   "copying sample offsets"));
    int32_t max_dim = 0;
    int64_t total_nnz = 0;
    for (int t = 0; t < n; ++t) {
      max_dim = std::max(max_dim, tables[t].dim);
      total_nnz += nnz[t];
    }
    const int lanes = sok_lookup_lanes_per_sample(vectorized ? 1 : 0, max_dim, total_nnz,
                                                  offsets[n]);
    TF_RETURN_IF_ERROR(CudaStatus(sok_lookup_forward_f32(
                                       descs_dev, static_cast<const int64_t*>(Data(offsets_dev)),
                                       n, offsets[n],
                                       vectorized ? sok_lookup_vectorized_kind(total_nnz,
                                                                               offsets[n])
                                                  : 0,
                                       static_cast<int>(sizeof(K)), lanes, bad, stream),
                                   "sok_lookup_forward_f32"));
  }
  return CudaStatus(sok_lookup_fill_check_values(descs_dev, n, checks, stream),
                    "sok_lookup_fill_check_values");
}

// The gradient of every table in float32 (FusedLookupBackward): grads[t]
// is table t's incoming gradient [batch, dim], its rows written where
// `rows_output` says.
template <typename K>
Status BackwardF32(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                   const std::vector<LookupTableInput>& in, const std::vector<const float*>& grads,
                   const FloatOutput& rows_output) {
  const int n = attrs.num_tables;
  void* stream = GpuStreamOf(ctx);
  std::vector<SokLookupTable> tables;
  TF_RETURN_IF_ERROR(Descriptors(attrs, in, sizeof(K), &tables));
  std::vector<int64_t> nnz(n);
  for (int t = 0; t < n; ++t) {
    nnz[t] = in[t].nnz;
    // The gradient's plan numbers samples in int32 too.
    if (tables[t].batch >= INT32_MAX) {
      return errors::InvalidArgument(
          tables[t].row_splits != nullptr ? "row_splits of " : "ids of ", attrs.TableName(t),
          tables[t].row_splits != nullptr ? " describe " : " (one id per sample) are ",
          tables[t].batch, " samples; the GPU gradient takes fewer than 2^31");
    }
  }
  // The gradient sorts every table's ids together and numbers their
  // positions in int32.
  int64_t total_nnz = 0;
  for (int t = 0; t < n; ++t) total_nnz += nnz[t];
  if (total_nnz >= INT32_MAX) {
    return errors::InvalidArgument("the ids of the ", n, " tables have ", total_nnz,
                                   " entries in all; the GPU gradient takes fewer than 2^31 - 1");
  }
  // The check [kCheckRows, n], then each table's distinct ids [n]: read
  // back at once, the op's one host synchronisation.
  const int64_t check_size = static_cast<int64_t>(FusedLookupAttrs::kCheckRows) * n;
  Tensor counts_dev;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                         TensorShape({check_size + n}), &counts_dev));
  int64_t* checks = reinterpret_cast<int64_t*>(Data(counts_dev));
  int64_t* counts = checks + check_size;
  Tensor descs;
  TF_RETURN_IF_ERROR(StartChecks(ctx, tables, checks, &descs));
  const SokLookupTable* descs_dev = static_cast<const SokLookupTable*>(Data(descs));
  const auto& dense = attrs.dense_grads;
  const bool all_dense = std::all_of(dense.begin(), dense.end(), [](bool d) { return d; });
  // Dense gradients alone, none clipped, and no determinism asked for:
  // summed with float atomics, as TensorFlow sums its own embedding
  // gradients on the GPU — no sort, no plan (see
  // sok_lookup_backward_dense_unordered). Otherwise the ordered plan, the
  // same bits on every run.
  const bool unordered =
      all_dense && !OpDeterminismRequired() &&
      std::none_of(tables.begin(), tables.end(),
                   [](const SokLookupTable& v) { return v.max_norm > 0.0f && v.nnz > 0; });
  Tensor plan;
  std::vector<int64_t> host(check_size + n, 0);
  if (!unordered) {
    // Every table's plan in one launch sequence. Dense tables' outputs
    // are sized by their rows: when every table is dense, nothing needs
    // the counts (the plan then neither reports them nor ranks the runs),
    // and the op does not wait (the check is then the forward's,
    // SokLookupCheck; a table that fails it gets a zero gradient, see
    // sok_lookup_backward_rows).
    TF_RETURN_IF_ERROR(LaunchWithScratch(ctx, "sok_lookup_backward_plan", &plan,
                                          [&](void* scratch, size_t* bytes) {
                                            return sok_lookup_backward_plan(
                                                tables.data(), descs_dev, n,
                                                all_dense ? nullptr : counts, checks, scratch,
                                                bytes, stream);
                                          }));
  }
  if (!all_dense) {
    TF_RETURN_IF_ERROR(CudaStatus(sok_lookup_fill_check_values(descs_dev, n, checks, stream),
                                   "sok_lookup_fill_check_values"));
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(host.data(), checks,
                                                        sizeof(int64_t) * host.size(), stream),
                                   "reading the gradient's sizes back"));
    for (int t = 0; t < n; ++t) TF_RETURN_IF_ERROR(attrs.CheckedColumn(t, host.data()));
  }
  OpOutputList unique_out;
  TF_RETURN_IF_ERROR(ctx->output_list("unique_ids", &unique_out));
  std::vector<SokLookupGradTable> outs(n);
  for (int t = 0; t < n; ++t) {
    const int64_t u = dense[t] ? 0 : (nnz[t] > 0 ? host[check_size + t] : 0);
    const int64_t out_rows = dense[t] ? tables[t].rows : u;
    Tensor* ids_out = nullptr;
    float* rows = nullptr;
    TF_RETURN_IF_ERROR(unique_out.allocate(t, TensorShape({u}), &ids_out));
    TF_RETURN_IF_ERROR(rows_output(t, TensorShape({out_rows, tables[t].dim}), &rows));
    outs[t].grads = grads[t];
    outs[t].unique_ids = u > 0 ? Data(*ids_out) : nullptr;
    outs[t].grad_rows = out_rows > 0 ? rows : nullptr;
    outs[t].dense = dense[t] ? 1 : 0;
    outs[t].path = 0;
    const int64_t elements = out_rows * tables[t].dim;
    if (dense[t] && elements > 0) {
      TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_memset_zero(rows, sizeof(float) * elements,
                                                         stream),
                                     "zeroing a dense gradient"));
    }
  }
  Tensor outs_dev;
  TF_RETURN_IF_ERROR(Temp(ctx, sizeof(SokLookupGradTable) * n, &outs_dev));
  TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(Data(outs_dev), outs.data(),
                                                        sizeof(SokLookupGradTable) * n, stream),
                                 "copying the gradient's outputs"));
  auto* outs_desc = static_cast<SokLookupGradTable*>(Data(outs_dev));
  if (unordered) {
    return CudaStatus(sok_lookup_backward_dense_unordered(tables.data(), descs_dev, n,
                                                          outs_desc, checks, stream),
                      "sok_lookup_backward_dense_unordered");
  }
  return CudaStatus(sok_lookup_backward_rows(tables.data(), descs_dev, n, outs_desc, checks,
                                             Data(plan), stream),
                    "sok_lookup_backward_rows");
}

// A float16 or bfloat16 lookup's float32 copies, on the device: its
// tables, weights and gradients widened, and its outputs rounded back.
template <typename T>
class LowPrecision {
 public:
  explicit LowPrecision(OpKernelContext* ctx) : ctx_(ctx) {}

  // `in` with each table's params and weights replaced by float32 copies
  // (kept by this object).
  Status Widened(const std::vector<LookupTableInput>& in, std::vector<LookupTableInput>* out) {
    *out = in;
    for (auto& table : *out) {
      TF_RETURN_IF_ERROR(Widen(*table.params, &table.params));
      if (table.weights != nullptr) TF_RETURN_IF_ERROR(Widen(*table.weights, &table.weights));
    }
    return OkStatus();
  }

  Status Widen(const Tensor& x, const Tensor** wide) {
    held_.emplace_back();
    Tensor& f = held_.back();
    TF_RETURN_IF_ERROR(ctx_->allocate_temp(::tensorflow::DT_FLOAT, x.shape(), &f));
    *wide = &f;
    return CudaStatus(sok_gpu_16_to_f32(reinterpret_cast<const uint16_t*>(x.tensor_data().data()),
                                        FloatData(f), x.NumElements(), kBfloat,
                                        GpuStreamOf(ctx_)),
                      "widening a 16-bit float input");
  }

  // A float32 scratch tensor for an output of `shape` (FloatOutput), to
  // be rounded into the op's output `index` of `list` by Narrow.
  FloatOutput Scratch(const char* list) {
    return [this, list](int t, const TensorShape& shape, float** out) -> Status {
      held_.emplace_back();
      Tensor& f = held_.back();
      TF_RETURN_IF_ERROR(ctx_->allocate_temp(::tensorflow::DT_FLOAT, shape, &f));
      pending_.push_back({list, t, &f});
      *out = FloatData(f);
      return OkStatus();
    };
  }

  // Every scratch output rounded into the op's output.
  Status Narrow() {
    for (const Pending& p : pending_) {
      OpOutputList list;
      TF_RETURN_IF_ERROR(ctx_->output_list(p.list, &list));
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(list.allocate(p.index, p.wide->shape(), &out));
      TF_RETURN_IF_ERROR(CudaStatus(
          sok_gpu_f32_to_16(FloatData(*p.wide), reinterpret_cast<uint16_t*>(Data(*out)),
                            p.wide->NumElements(), kBfloat, GpuStreamOf(ctx_)),
          "rounding a 16-bit float output"));
    }
    return OkStatus();
  }

 private:
  static constexpr int kBfloat = std::is_same<T, ::tensorflow::bfloat16>::value ? 1 : 0;
  struct Pending {
    const char* list;
    int index;
    const Tensor* wide;
  };
  OpKernelContext* ctx_;
  std::deque<Tensor> held_;  // stable addresses: descriptors point into them
  std::vector<Pending> pending_;
};

// The op's own output `index` of `list`, a float32 tensor.
FloatOutput OwnOutput(OpKernelContext* ctx, const char* list) {
  return [ctx, list](int t, const TensorShape& shape, float** out) -> Status {
    OpOutputList outputs;
    TF_RETURN_IF_ERROR(ctx->output_list(list, &outputs));
    Tensor* o = nullptr;
    TF_RETURN_IF_ERROR(outputs.allocate(t, shape, &o));
    *out = o->flat<float>().data();
    return OkStatus();
  };
}

}  // namespace

template <typename K>
struct FusedLookupForward<GpuDevice, float, K> {
  Status operator()(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                    const std::vector<LookupTableInput>& in) const {
    return ForwardF32<K>(ctx, attrs, in, OwnOutput(ctx, "embeddings"));
  }
};

template <typename K>
struct FusedLookupBackward<GpuDevice, float, K> {
  Status operator()(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                    const std::vector<LookupTableInput>& in, const OpInputList& grads) const {
    std::vector<const float*> g(attrs.num_tables);
    for (int t = 0; t < attrs.num_tables; ++t) g[t] = grads[t].flat<float>().data();
    return BackwardF32<K>(ctx, attrs, in, g, OwnOutput(ctx, "grad_rows"));
  }
};

template <typename T, typename K>
struct LowPrecisionForward {
  Status operator()(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                    const std::vector<LookupTableInput>& in) const {
    LowPrecision<T> wide(ctx);
    std::vector<LookupTableInput> widened;
    TF_RETURN_IF_ERROR(wide.Widened(in, &widened));
    TF_RETURN_IF_ERROR(ForwardF32<K>(ctx, attrs, widened, wide.Scratch("embeddings")));
    return wide.Narrow();
  }
};

template <typename T, typename K>
struct LowPrecisionBackward {
  Status operator()(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                    const std::vector<LookupTableInput>& in, const OpInputList& grads) const {
    LowPrecision<T> wide(ctx);
    std::vector<LookupTableInput> widened;
    TF_RETURN_IF_ERROR(wide.Widened(in, &widened));
    std::vector<const float*> g(attrs.num_tables);
    for (int t = 0; t < attrs.num_tables; ++t) {
      const Tensor* w = nullptr;
      TF_RETURN_IF_ERROR(wide.Widen(grads[t], &w));
      g[t] = w->flat<float>().data();
    }
    TF_RETURN_IF_ERROR(BackwardF32<K>(ctx, attrs, widened, g, wide.Scratch("grad_rows")));
    return wide.Narrow();
  }
};

template <typename K>
struct FusedLookupForward<GpuDevice, Eigen::half, K> : LowPrecisionForward<Eigen::half, K> {};
template <typename K>
struct FusedLookupBackward<GpuDevice, Eigen::half, K> : LowPrecisionBackward<Eigen::half, K> {};
template <typename K>
struct FusedLookupForward<GpuDevice, ::tensorflow::bfloat16, K>
    : LowPrecisionForward<::tensorflow::bfloat16, K> {};
template <typename K>
struct FusedLookupBackward<GpuDevice, ::tensorflow::bfloat16, K>
    : LowPrecisionBackward<::tensorflow::bfloat16, K> {};

#define SOK_REGISTER_LOOKUP_GPU(T, K)                                      \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookup")                           \
                              .Device(::tensorflow::DEVICE_GPU)            \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<K>("Tindices"),              \
                          FusedLookupOp<GpuDevice, T, K>);                 \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookupGrad")                       \
                              .Device(::tensorflow::DEVICE_GPU)            \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<K>("Tindices"),              \
                          FusedLookupGradOp<GpuDevice, T, K>);
#define SOK_REGISTER_LOOKUP_GPU_ALL_INDICES(T) \
  SOK_REGISTER_LOOKUP_GPU(T, TfInt64)          \
  SOK_REGISTER_LOOKUP_GPU(T, int32_t)
SOK_REGISTER_LOOKUP_GPU_ALL_INDICES(float)
SOK_REGISTER_LOOKUP_GPU_ALL_INDICES(Eigen::half)
SOK_REGISTER_LOOKUP_GPU_ALL_INDICES(::tensorflow::bfloat16)
#undef SOK_REGISTER_LOOKUP_GPU_ALL_INDICES
#undef SOK_REGISTER_LOOKUP_GPU

}  // namespace lookup_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
