// GPU OpKernels of SokUnique, SokUniqueWithCounts and SokUnsortedSegmentSum (float
// data): the C launchers of util_kernels.cu on the op's stream. Compiled only
// when the build found a CUDA toolkit (SOK_GRAPH_WITH_CUDA).
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_scratch.h"
#include "tf_ops/common/gpu_stream.h"
#include "compat/tf_compat.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"
#include "tf_ops/util/kernels/segment_sum_args.h"
#include "tf_ops/util/kernels/unique_set_hint.h"
#include "tf_ops/util/kernels/util_launcher.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

void* Data(const Tensor& t) { return const_cast<char*>(t.tensor_data().data()); }

// The registered (int64) variant; the launchers' int32 variants serve
// callers outside TensorFlow (see the registrations below).
int Unique(const int64_t* x, int64_t n, int64_t set_slots, int64_t* y, int64_t* idx,
           int64_t* count, int64_t* u, void* temp, size_t* bytes, void* s) {
  return sok_unique_in_set_i64_i64(x, n, set_slots, y, idx, count, u, temp, bytes, s);
}


// TfInt64 is `long long` on TF 1.x; the launchers take int64_t.
template <typename T>
using C = typename std::conditional<sizeof(T) == 8, int64_t, int32_t>::type;

// SokUniqueWithCounts (kCounts), SokUnique and SokUniqueGrouped (an op with
// a `groups` attribute: the distinct values per group come back with their
// number, in the same read-back); the hash set of a call is sized by the
// op's last batch (UniqueSetHint).
template <typename K, typename I, bool kCounts>
class UniqueGpuOp : public DeviceWaitingKernel<> {
 public:
  explicit UniqueGpuOp(OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    if (ctx->HasAttr("groups")) {
      TfInt64 groups = 0;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("groups", &groups));
      groups_ = groups;
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES(ctx, x.dims() == 1,
                errors::InvalidArgument("x must be a vector; got shape ", x.shape().DebugString()));
    const int64_t n = x.NumElements();
    OP_REQUIRES(ctx, sizeof(I) == 8 || n <= INT32_MAX,
                errors::InvalidArgument("x has ", n, " elements, too many for out_idx=int32; ",
                                        "use out_idx=int64"));
    // The GPU kernel's hash set has 2n slots or more, numbered in 32 bits.
    OP_REQUIRES(ctx, n < (int64_t{1} << 30),
                errors::InvalidArgument("x has ", n, " elements; the GPU kernel takes fewer ",
                                        "than 2^30"));
    void* stream = GpuStreamOf(ctx);
    Tensor* idx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x.shape(), &idx));
    // y and count need room for n until the number of distinct values is known.
    Tensor y_all, count_all, num, temp;
    const TensorShape room({n > 0 ? n : 1});
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(x.dtype(), room, &y_all));
    if (kCounts) OP_REQUIRES_OK(ctx, ctx->allocate_temp(idx->dtype(), room, &count_all));
    // The number of distinct values, then (grouped) each group's share.
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1 + groups_}),
                                           &num));
    std::vector<int64_t> read_back(1 + groups_, 0);
    const C<K>* xs = reinterpret_cast<const C<K>*>(x.flat<K>().data());
    C<K>* ys = reinterpret_cast<C<K>*>(Data(y_all));
    C<I>* idxs = reinterpret_cast<C<I>*>(idx->flat<I>().data());
    C<I>* counts = kCounts ? reinterpret_cast<C<I>*>(Data(count_all)) : nullptr;
    int64_t* u_dev = reinterpret_cast<int64_t*>(Data(num));
    int64_t u = -1;
    OP_REQUIRES_OK(ctx, hint_.Run(
                            n,
                            [&](int64_t set_slots, int64_t* distinct) -> Status {
                              TF_RETURN_IF_ERROR(LaunchWithScratch(
                                  ctx, "sok_unique_with_counts", &temp,
                                  [&](void* scratch, size_t* bytes) {
                                    return Unique(xs, n, set_slots, ys, idxs, counts, u_dev,
                                                  scratch, bytes, stream);
                                  }));
                              if (groups_ > 0) {
                                TF_RETURN_IF_ERROR(CudaStatus(
                                    sok_unique_group_sizes_i64(
                                        reinterpret_cast<const int64_t*>(ys), u_dev, n, groups_,
                                        u_dev + 1, stream),
                                    "counting distinct values per group"));
                              }
                              TF_RETURN_IF_ERROR(CudaStatus(
                                  sok_gpu_copy_to_host(read_back.data(), u_dev,
                                                       sizeof(int64_t) * read_back.size(), stream),
                                  "reading the number of distinct values back"));
                              *distinct = read_back[0];
                              return OkStatus();
                            },
                            &u));
    if (groups_ > 0) {
      Tensor* sizes = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({groups_}), &sizes));
      std::copy(read_back.begin() + 1, read_back.end(), sizes->flat<TfInt64>().data());
    }
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &y));
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_on_device(Data(*y), ys, sizeof(K) * u, stream),
                             "copying unique values"));
    if (kCounts) {
      Tensor* count = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({u}), &count));
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_on_device(Data(*count), counts, sizeof(I) * u,
                                                            stream),
                                     "copying counts"));
    }
  }

 private:
  UniqueSetHint hint_;
  int64_t groups_ = 0;
};

int SegmentSum(const float* data, const int64_t* ids, int64_t n, int64_t width, int64_t segs,
               float* out, int64_t* bad, void* temp, size_t* bytes, void* s) {
  return sok_unsorted_segment_sum_f32_i64(data, ids, n, width, segs, out, bad, temp, bytes, s);
}

template <typename I, typename N>
class UnsortedSegmentSumGpuOp : public DeviceWaitingKernel<> {
 public:
  using DeviceWaitingKernel::DeviceWaitingKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& data = ctx->input(0);
    const Tensor& ids = ctx->input(1);
    int64_t num_segments = 0, width = 1;
    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, SegmentSumArgs<N>(ctx, &num_segments, &width, &out_shape));
    const int64_t n = ids.NumElements();
    OP_REQUIRES(ctx, n < INT32_MAX,
                errors::InvalidArgument("segment_ids has ", n, " entries; the GPU kernel takes ",
                                        "fewer than 2^31"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    void* stream = GpuStreamOf(ctx);
    Tensor bad_dev, temp;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &bad_dev));
    int64_t* bad = reinterpret_cast<int64_t*>(Data(bad_dev));
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_fill_i64(bad, INT64_MAX, 1, stream), "clearing a flag"));
    const C<I>* seg = reinterpret_cast<const C<I>*>(ids.flat<I>().data());
    const float* src = data.flat<float>().data();
    float* dst = out->flat<float>().data();
    OP_REQUIRES_OK(ctx, LaunchWithScratch(ctx, "sok_unsorted_segment_sum", &temp,
                                          [&](void* scratch, size_t* bytes) {
                                            return SegmentSum(src, seg, n, width, num_segments,
                                                              dst, bad, scratch, bytes, stream);
                                          }));
    // Ids >= num_segments are an error, as on the CPU: one read-back.
    int64_t first_bad = INT64_MAX;
    OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(&first_bad, bad, sizeof(first_bad), stream),
                             "reading the id check back"));
    if (first_bad != INT64_MAX) {
      C<I> id = 0;
      OP_REQUIRES_OK(ctx, CudaStatus(sok_gpu_copy_to_host(&id, seg + first_bad, sizeof(id), stream),
                               "reading a bad id back"));
      ctx->CtxFailure(errors::InvalidArgument("segment_ids must be < num_segments (",
                                              num_segments, "); got ", static_cast<int64_t>(id),
                                              " at position ", first_bad));
    }
  }
};

#define SOK_REGISTER_UNIQUE_GPU(K, I)                             \
  REGISTER_KERNEL_BUILDER(Name("SokUniqueWithCounts")             \
                              .Device(::tensorflow::DEVICE_GPU)   \
                              .TypeConstraint<K>("T")             \
                              .TypeConstraint<I>("out_idx"),      \
                          UniqueGpuOp<K, I, true>);           \
  REGISTER_KERNEL_BUILDER(Name("SokUnique")                       \
                              .Device(::tensorflow::DEVICE_GPU)   \
                              .TypeConstraint<K>("T")             \
                              .TypeConstraint<I>("out_idx"),      \
                          UniqueGpuOp<K, I, false>);          \
  REGISTER_KERNEL_BUILDER(Name("SokUniqueGrouped")                \
                              .Device(::tensorflow::DEVICE_GPU)   \
                              .TypeConstraint<K>("T")             \
                              .TypeConstraint<I>("out_idx")       \
                              .HostMemory("group_sizes"),         \
                          UniqueGpuOp<K, I, false>);
// int64 only (the launchers' types); other types run on the CPU kernel,
// where TensorFlow places them.
SOK_REGISTER_UNIQUE_GPU(TfInt64, TfInt64)
#undef SOK_REGISTER_UNIQUE_GPU

#define SOK_REGISTER_SEGMENT_SUM_GPU(I, N)                        \
  REGISTER_KERNEL_BUILDER(Name("SokUnsortedSegmentSum")           \
                              .Device(::tensorflow::DEVICE_GPU)   \
                              .TypeConstraint<float>("T")         \
                              .TypeConstraint<I>("Tindices")      \
                              .TypeConstraint<N>("Tnumsegments")  \
                              .HostMemory("num_segments"),        \
                          UnsortedSegmentSumGpuOp<I, N>);
// int64 segment ids only (see above); num_segments is read on the host.
SOK_REGISTER_SEGMENT_SUM_GPU(TfInt64, int32_t)
SOK_REGISTER_SEGMENT_SUM_GPU(TfInt64, TfInt64)
#undef SOK_REGISTER_SEGMENT_SUM_GPU

}  // namespace
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
