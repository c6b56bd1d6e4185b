// GPU OpKernels of SokFusedLookup and SokFusedLookupGrad (float tables):
// validation and allocation here, the arithmetic in the C launchers of
// lookup_forward.cu / lookup_backward.cu, run on the op's stream. Compiled
// only when the build found a CUDA toolkit (SOK_GRAPH_WITH_CUDA).
//
// row_splits arrive in host memory (HostMemory), so they are checked on the
// host exactly as the CPU kernel checks them before any kernel reads through
// them. Ids of either type (int32, int64) are in device memory, which the
// launchers read at their width (id_bytes). Ids are checked on the device by the kernels that read them: a bad
// id is never read through, its first position is read back (the forward's
// one host synchronisation) and reported as the CPU kernel reports it.
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_stream.h"
#include "tf_ops/lookup/kernels/lookup_tables.h"
#include "tf_ops/common/tf_compat.h"
#include "tf_ops/lookup/kernels/lookup_args.h"
#include "tf_ops/lookup/kernels/lookup_launcher.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

constexpr int64_t kNoBadId = INT64_MAX;

Status Temp(OpKernelContext* ctx, int64_t bytes, Tensor* t) {
  return ctx->allocate_temp(::tensorflow::DT_INT8, TensorShape({bytes > 0 ? bytes : 1}), t);
}

void* Data(Tensor& t) { return const_cast<char*>(t.tensor_data().data()); }

template <typename K>
class FusedLookupGpuBase : public OpKernel {
 public:
  explicit FusedLookupGpuBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
  }

 protected:
  std::string TableName(int t) const { return attrs_.TableName(t); }

  // Checks every table's shapes and (host) row_splits, copies the splits to
  // the device and describes each table. `out` pointers are left null.
  // Variables among the params stay read-locked while `params` lives.
  Status ReadTables(OpKernelContext* ctx, TableInputs* params,
                    std::vector<SokLookupTable>* tables, std::vector<int64_t>* nnz,
                    std::vector<Tensor>* device_splits) {
    OpInputList ids, splits, weights;
    TF_RETURN_IF_ERROR(params->Read(ctx, "params", attrs_.num_tables,
                                    [this](int t) { return this->TableName(t); }));
    TF_RETURN_IF_ERROR(ctx->input_list("ids", &ids));
    TF_RETURN_IF_ERROR(ctx->input_list("row_splits", &splits));
    TF_RETURN_IF_ERROR(ctx->input_list("weights", &weights));
    tables->assign(attrs_.num_tables, SokLookupTable());
    nnz->assign(attrs_.num_tables, 0);
    device_splits->resize(attrs_.num_tables);
    void* stream = GpuStreamOf(ctx);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const Tensor& p = (*params)[t];
      const Tensor& i = ids[t];
      const Tensor& s = splits[t];
      const Tensor& w = weights[t];
      TF_RETURN_IF_ERROR(attrs_.CheckTable(t, p, ::tensorflow::DT_FLOAT, i, s, w));
      if (p.dim_size(1) > INT32_MAX / 4) {
        return errors::InvalidArgument("params of ", TableName(t), " has dim ", p.dim_size(1),
                                       "; the GPU kernel takes at most ", INT32_MAX / 4);
      }
      (*nnz)[t] = i.NumElements();
      const int64_t* host_splits = reinterpret_cast<const int64_t*>(s.flat<TfInt64>().data());
      Tensor& d = (*device_splits)[t];
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, s.shape(), &d));
      TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(Data(d), host_splits,
                                                     sizeof(int64_t) * s.NumElements(), stream),
                              "copying row_splits to the GPU"));
      SokLookupTable& v = (*tables)[t];
      v.params = p.flat<float>().data();
      v.ids = i.flat<K>().data();
      v.row_splits = reinterpret_cast<const int64_t*>(Data(d));
      v.weights = attrs_.weighted[t] ? w.flat<float>().data() : nullptr;
      v.clip = nullptr;
      v.out = nullptr;
      v.batch = s.NumElements() - 1;
      v.rows = p.dim_size(0);
      v.dim = static_cast<int32_t>(p.dim_size(1));
      v.combiner = static_cast<int32_t>(attrs_.combiners[t]);  // the launcher's int
      v.id_bytes = static_cast<int32_t>(sizeof(K));
      v.max_norm = attrs_.max_norms[t];
    }
    return OkStatus();
  }

  // The CPU kernel's error for the first table with a bad id, if any;
  // first_bad holds each table's first bad position (kNoBadId if none).
  Status CheckIds(OpKernelContext* ctx, const std::vector<int64_t>& first_bad,
                  const std::vector<SokLookupTable>& tables) {
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const int64_t j = first_bad[t];
      if (j == kNoBadId) continue;
      K id = 0;
      TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(&id, static_cast<const K*>(tables[t].ids) + j,
                                                   sizeof(K), GpuStreamOf(ctx)),
                              "reading a bad id back"));
      return attrs_.BadId(t, static_cast<int64_t>(id), j, tables[t].rows);
    }
    return OkStatus();
  }

  FusedLookupAttrs attrs_;
};

template <typename K>
class FusedLookupGpuOp : public FusedLookupGpuBase<K> {
 public:
  using FusedLookupGpuBase<K>::FusedLookupGpuBase;

  void Compute(OpKernelContext* ctx) override {
    const int n = this->attrs_.num_tables;
    void* stream = GpuStreamOf(ctx);
    std::vector<SokLookupTable> tables;
    std::vector<int64_t> nnz;
    std::vector<Tensor> splits;
    TableInputs params;
    OP_REQUIRES_OK(ctx, this->ReadTables(ctx, &params, &tables, &nnz, &splits));
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("embeddings", &outputs));
    Tensor bad_dev;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), &bad_dev));
    int64_t* bad = reinterpret_cast<int64_t*>(Data(bad_dev));
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_fill_i64(bad, kNoBadId, n, stream), "clearing flags"));
    std::vector<Tensor> clips(n);
    std::vector<int64_t> offsets(n + 1, 0);
    bool vectorized = true;
    for (int t = 0; t < n; ++t) {
      SokLookupTable& v = tables[t];
      Tensor* o = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(t, TensorShape({v.batch, v.dim}), &o));
      v.out = o->flat<float>().data();
      offsets[t + 1] = offsets[t] + v.batch;
      vectorized = vectorized && v.dim % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(v.params) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(v.out) % 16 == 0;
      if (v.max_norm > 0.0f && nnz[t] > 0) {
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({nnz[t]}),
                                               &clips[t]));
        float* clip = clips[t].flat<float>().data();
        OP_REQUIRES_OK(ctx, CudaStatus(sok_lookup_clip_factors(&v, nnz[t], clip, bad + t, stream),
                                 "sok_lookup_clip_factors"));
        v.clip = clip;
      }
    }
    if (offsets[n] > 0) {
      Tensor descs, offsets_dev;
      OP_REQUIRES_OK(ctx, Temp(ctx, sizeof(SokLookupTable) * n, &descs));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n + 1}),
                                             &offsets_dev));
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_device(Data(descs), tables.data(),
                                                      sizeof(SokLookupTable) * n, stream),
                               "copying table descriptors"));
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_device(Data(offsets_dev), offsets.data(),
                                                      sizeof(int64_t) * (n + 1), stream),
                               "copying sample offsets"));
      OP_REQUIRES_OK(ctx, CudaStatus(sok_lookup_forward_f32(
                                   static_cast<const SokLookupTable*>(Data(descs)),
                                   static_cast<const int64_t*>(Data(offsets_dev)), n,
                                   offsets[n], vectorized ? 1 : 0, static_cast<int>(sizeof(K)),
                                   bad, stream),
                               "sok_lookup_forward_f32"));
    }
    std::vector<int64_t> first_bad(n);
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(first_bad.data(), bad, sizeof(int64_t) * n,
                                                  stream),
                             "reading the id check back"));
    OP_REQUIRES_OK(ctx, this->CheckIds(ctx, first_bad, tables));
  }
};

template <typename K>
class FusedLookupGradGpuOp : public FusedLookupGpuBase<K> {
 public:
  using FusedLookupGpuBase<K>::FusedLookupGpuBase;

  void Compute(OpKernelContext* ctx) override {
    const int n = this->attrs_.num_tables;
    void* stream = GpuStreamOf(ctx);
    std::vector<SokLookupTable> tables;
    std::vector<int64_t> nnz;
    std::vector<Tensor> splits;
    TableInputs params;
    OP_REQUIRES_OK(ctx, this->ReadTables(ctx, &params, &tables, &nnz, &splits));
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    for (int t = 0; t < n; ++t) {
      const Tensor& g = grads[t];
      OP_REQUIRES_OK(ctx, this->attrs_.CheckGrads(t, g, tables[t].batch, tables[t].dim));
      OP_REQUIRES(ctx, nnz[t] < INT32_MAX,
                  errors::InvalidArgument("ids of ", this->TableName(t), " has ", nnz[t],
                                          " entries; the GPU gradient takes fewer than 2^31"));
      // The gradient's plan numbers samples in int32 too.
      OP_REQUIRES(ctx, tables[t].batch < INT32_MAX,
                  errors::InvalidArgument("row_splits of ", this->TableName(t), " describe ",
                                          tables[t].batch, " samples; the GPU gradient takes ",
                                          "fewer than 2^31"));
    }
    // Per table: [0] distinct ids, [1] first bad position; read back at once.
    Tensor counts_dev;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({2 * n}),
                                           &counts_dev));
    int64_t* counts = reinterpret_cast<int64_t*>(Data(counts_dev));
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_fill_i64(counts, kNoBadId, 2 * n, stream), "clearing"));
    std::vector<Tensor> plans(n);
    for (int t = 0; t < n; ++t) {
      // Static tables bound their ids: the sort looks at those bits only.
      int bits = 1;
      while (bits < 63 && (int64_t{1} << bits) < tables[t].rows) ++bits;
      size_t bytes = 0;
      OP_REQUIRES_OK(ctx, CudaStatus(sok_lookup_backward_plan(&tables[t], nnz[t], bits, nullptr,
                                                        nullptr, nullptr, &bytes, stream),
                               "sizing the gradient's scratch"));
      OP_REQUIRES_OK(ctx, Temp(ctx, static_cast<int64_t>(bytes), &plans[t]));
      OP_REQUIRES_OK(ctx, CudaStatus(sok_lookup_backward_plan(&tables[t], nnz[t], bits, counts + 2 * t,
                                                        counts + 2 * t + 1, Data(plans[t]),
                                                        &bytes, stream),
                               "sok_lookup_backward_plan"));
    }
    std::vector<int64_t> host(2 * n);
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(host.data(), counts, sizeof(int64_t) * 2 * n,
                                                  stream),
                             "reading the gradient's sizes back"));
    std::vector<int64_t> first_bad(n);
    for (int t = 0; t < n; ++t) first_bad[t] = host[2 * t + 1];
    OP_REQUIRES_OK(ctx, this->CheckIds(ctx, first_bad, tables));
    OpOutputList unique_out, rows_out;
    OP_REQUIRES_OK(ctx, ctx->output_list("unique_ids", &unique_out));
    OP_REQUIRES_OK(ctx, ctx->output_list("grad_rows", &rows_out));
    for (int t = 0; t < n; ++t) {
      const int64_t u = nnz[t] > 0 ? host[2 * t] : 0;
      Tensor* ids_out = nullptr;
      Tensor* rows = nullptr;
      OP_REQUIRES_OK(ctx, unique_out.allocate(t, TensorShape({u}), &ids_out));
      OP_REQUIRES_OK(ctx, rows_out.allocate(t, TensorShape({u, tables[t].dim}), &rows));
      if (u == 0) continue;
      OP_REQUIRES_OK(ctx, CudaStatus(sok_lookup_backward_rows(&tables[t], nnz[t],
                                                        grads[t].flat<float>().data(),
                                                        Data(plans[t]), ids_out->flat<K>().data(),
                                                        rows->flat<float>().data(), stream),
                               "sok_lookup_backward_rows"));
    }
  }
};

#define SOK_REGISTER_LOOKUP_GPU(K)                                         \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookup")                           \
                              .Device(::tensorflow::DEVICE_GPU)            \
                              .TypeConstraint<float>("T")                  \
                              .TypeConstraint<K>("Tindices")               \
                              .HostMemory("row_splits"),                   \
                          FusedLookupGpuOp<K>);                            \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookupGrad")                       \
                              .Device(::tensorflow::DEVICE_GPU)            \
                              .TypeConstraint<float>("T")                  \
                              .TypeConstraint<K>("Tindices")               \
                              .HostMemory("row_splits"),                   \
                          FusedLookupGradGpuOp<K>);
SOK_REGISTER_LOOKUP_GPU(TfInt64)
SOK_REGISTER_LOOKUP_GPU(int32_t)
#undef SOK_REGISTER_LOOKUP_GPU

}  // namespace
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
