// The util ops on the GPU: the functors of SokUnique, SokUniqueWithCounts,
// SokUniquePadded and SokUnsortedSegmentSum (util_op.h;
// float data, int64 keys and ids): the C launchers of util_kernels.cu on the
// op's stream. Compiled only when the build found a CUDA toolkit
// (SOK_GRAPH_WITH_CUDA).
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
#include "tf_ops/util/kernels/util_op.h"
#include "tf_ops/util/kernels/unique_set_hint.h"
#include "tf_ops/util/kernels/util_launcher.h"

namespace sok_graph {
namespace util_kernels {
namespace {

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

int SegmentSum(const float* data, const int64_t* ids, int64_t n, int64_t width, int64_t segs,
               float* out, int64_t* bad, void* temp, size_t* bytes, void* s) {
  return sok_unsorted_segment_sum_f32_i64(data, ids, n, width, segs, out, bad, temp, bytes, s);
}

}  // namespace

// The hash set of a call is sized by the op's last batch (UniqueSetHint);
// the padded unique's groups are counted on the device (Padded).
template <typename K, typename I>
struct UniqueFunctor<GpuDevice, K, I> {
  Status operator()(OpKernelContext* ctx, const Tensor& x, bool with_counts, int64_t groups,
                    bool padded) {
    const int64_t n = x.NumElements();
    // The GPU kernel's hash set has 2n slots or more, numbered in 32 bits.
    if (n >= (int64_t{1} << 30)) {
      return errors::InvalidArgument("x has ", n, " elements; the GPU kernel takes fewer than ",
                                     "2^30");
    }
    void* stream = GpuStreamOf(ctx);
    Tensor* idx = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, x.shape(), &idx));
    if (padded) return Padded(ctx, x, groups, idx, stream);
    // y and count need room for n until the number of distinct values is known.
    Tensor y_all, count_all, num, temp;
    const TensorShape room({n > 0 ? n : 1});
    TF_RETURN_IF_ERROR(ctx->allocate_temp(x.dtype(), room, &y_all));
    if (with_counts) TF_RETURN_IF_ERROR(ctx->allocate_temp(idx->dtype(), room, &count_all));
    // The number of distinct values.
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &num));
    int64_t read_back = 0;
    const C<K>* xs = reinterpret_cast<const C<K>*>(x.flat<K>().data());
    C<K>* ys = reinterpret_cast<C<K>*>(Data(y_all));
    C<I>* idxs = reinterpret_cast<C<I>*>(idx->flat<I>().data());
    C<I>* counts = with_counts ? reinterpret_cast<C<I>*>(Data(count_all)) : nullptr;
    int64_t* u_dev = reinterpret_cast<int64_t*>(Data(num));
    int64_t u = -1;
    TF_RETURN_IF_ERROR(hint_.Run(
        n,
        [&](int64_t set_slots, int64_t* distinct) -> Status {
          TF_RETURN_IF_ERROR(LaunchWithScratch(ctx, "sok_unique_with_counts", &temp,
                                               [&](void* scratch, size_t* bytes) {
                                                 return Unique(xs, n, set_slots, ys, idxs, counts,
                                                               u_dev, scratch, bytes, stream);
                                               }));
          TF_RETURN_IF_ERROR(CudaStatus(
              sok_gpu_copy_to_host(&read_back, u_dev, sizeof(read_back), stream),
              "reading the number of distinct values back"));
          *distinct = read_back;
          return OkStatus();
        },
        &u));
    Tensor* y = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({u}), &y));
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_on_device(Data(*y), ys, sizeof(K) * u, stream),
                                  "copying unique values"));
    if (!with_counts) return OkStatus();
    Tensor* count = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({u}), &count));
    return CudaStatus(sok_gpu_copy_on_device(Data(*count), counts, sizeof(I) * u, stream),
                      "copying counts");
  }

  UniqueSetHint hint_;

 private:
  // SokUniquePadded: the full hash set, which cannot overflow, so nothing is
  // read back; the outputs are written in place and stay on the device.
  Status Padded(OpKernelContext* ctx, const Tensor& x, int64_t groups, Tensor* idx,
                void* stream) {
    const int64_t n = x.NumElements();
    Tensor *y = nullptr, *count = nullptr, *sizes = nullptr, temp;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, x.shape(), &y));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({}), &count));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({groups}), &sizes));
    const int64_t* xs = reinterpret_cast<const int64_t*>(x.flat<K>().data());
    int64_t* ys = reinterpret_cast<int64_t*>(Data(*y));
    int64_t* idxs = reinterpret_cast<int64_t*>(Data(*idx));
    int64_t* u_dev = reinterpret_cast<int64_t*>(Data(*count));
    TF_RETURN_IF_ERROR(LaunchWithScratch(ctx, "sok_unique_padded", &temp,
                                         [&](void* scratch, size_t* bytes) {
                                           return Unique(xs, n, 0, ys, idxs, nullptr, u_dev,
                                                         scratch, bytes, stream);
                                         }));
    if (groups > 0) {
      TF_RETURN_IF_ERROR(CudaStatus(
          sok_unique_group_sizes_i64(ys, u_dev, n, groups,
                                     reinterpret_cast<int64_t*>(Data(*sizes)), stream),
          "counting distinct values per group"));
    }
    return CudaStatus(sok_unique_pad_i64(ys, u_dev, n, -1, stream), "padding unique values");
  }
};

template <typename I>
struct SegmentSumFunctor<GpuDevice, float, I> {
  Status operator()(OpKernelContext* ctx, const Tensor& data, const Tensor& ids,
                    int64_t num_segments, int64_t width, bool check_ids, Tensor* out) const {
    const int64_t n = ids.NumElements();
    if (n >= INT32_MAX) {
      return errors::InvalidArgument("segment_ids has ", n, " entries; the GPU kernel takes ",
                                     "fewer than 2^31");
    }
    if (num_segments >= INT32_MAX && width > 0 && num_segments > 0) {
      return errors::InvalidArgument("num_segments is ", num_segments, "; the GPU kernel takes ",
                                     "fewer than 2^31 - 1");
    }
    void* stream = GpuStreamOf(ctx);
    Tensor bad_dev, temp;
    int64_t* bad = nullptr;
    if (check_ids) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({1}), &bad_dev));
      bad = reinterpret_cast<int64_t*>(Data(bad_dev));
      TF_RETURN_IF_ERROR(
          CudaStatus(sok_gpu_fill_i64(bad, INT64_MAX, 1, stream), "clearing a flag"));
    }
    const C<I>* seg = reinterpret_cast<const C<I>*>(ids.flat<I>().data());
    const float* src = data.flat<float>().data();
    float* dst = out->flat<float>().data();
    TF_RETURN_IF_ERROR(LaunchWithScratch(ctx, "sok_unsorted_segment_sum", &temp,
                                         [&](void* scratch, size_t* bytes) {
                                           return SegmentSum(src, seg, n, width, num_segments,
                                                             dst, bad, scratch, bytes, stream);
                                         }));
    if (!check_ids) return OkStatus();  // ids in range by construction: no read-back
    // Ids >= num_segments are an error, as on the CPU: one read-back.
    int64_t first_bad = INT64_MAX;
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(&first_bad, bad, sizeof(first_bad), stream),
                                  "reading the id check back"));
    if (first_bad == INT64_MAX) return OkStatus();
    C<I> id = 0;
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(&id, seg + first_bad, sizeof(id), stream),
                                  "reading a bad id back"));
    return errors::InvalidArgument("segment_ids must be < num_segments (", num_segments,
                                   "); got ", static_cast<int64_t>(id), " at position ",
                                   first_bad);
  }
};

// int64 only (the launchers' types); other types run on the CPU kernel,
// where TensorFlow places them.
SOK_REGISTER_UNIQUE_OPS(DEVICE_GPU, GpuDevice, TfInt64, TfInt64)

#define SOK_REGISTER_SEGMENT_SUM_GPU(I, N)                        \
  REGISTER_KERNEL_BUILDER(Name("SokUnsortedSegmentSum")           \
                              .Device(::tensorflow::DEVICE_GPU)   \
                              .TypeConstraint<float>("T")         \
                              .TypeConstraint<I>("Tindices")      \
                              .TypeConstraint<N>("Tnumsegments")  \
                              .HostMemory("num_segments"),        \
                          UnsortedSegmentSumOp<GpuDevice, float, I, N>);
// int64 segment ids only (see above); num_segments is read on the host.
SOK_REGISTER_SEGMENT_SUM_GPU(TfInt64, int32_t)
SOK_REGISTER_SEGMENT_SUM_GPU(TfInt64, TfInt64)
#undef SOK_REGISTER_SEGMENT_SUM_GPU

}  // namespace util_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
