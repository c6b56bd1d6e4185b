// SokUnsortedSegmentSum's input checks and output shape, in one place for
// the CPU kernel (util_kernels.cc) and the GPU kernel (util_kernels_gpu.cc).
#ifndef SOK_GRAPH_TF_OPS_UTIL_KERNELS_SEGMENT_SUM_ARGS_H_
#define SOK_GRAPH_TF_OPS_UTIL_KERNELS_SEGMENT_SUM_ARGS_H_

#include <cstdint>
#include <limits>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"

namespace sok_graph {

// Checks data / segment_ids / num_segments (input 2, of type N) and gives
// num_segments, the elements per row (`width`) and the output's shape
// [num_segments] + data.shape[1:]. Segment ids themselves are range-checked
// by the passes that read them.
template <typename N>
::tensorflow::Status SegmentSumArgs(::tensorflow::OpKernelContext* ctx, int64_t* num_segments,
                                    int64_t* width, ::tensorflow::TensorShape* out_shape) {
  namespace errors = ::tensorflow::errors;
  const ::tensorflow::Tensor& data = ctx->input(0);
  const ::tensorflow::Tensor& ids = ctx->input(1);
  const ::tensorflow::Tensor& num = ctx->input(2);
  if (data.dims() < 1) return errors::InvalidArgument("data must have rank >= 1; got a scalar");
  if (!(ids.dims() == 1 && ids.dim_size(0) == data.dim_size(0))) {
    return errors::InvalidArgument("segment_ids must be a vector with one id per row of data (",
                                   data.dim_size(0), "); got shape ", ids.shape().DebugString());
  }
  if (num.dims() != 0) {
    return errors::InvalidArgument("num_segments must be a scalar; got shape ",
                                   num.shape().DebugString());
  }
  *num_segments = static_cast<int64_t>(num.scalar<N>()());
  if (*num_segments < 0) {
    return errors::InvalidArgument("num_segments must be >= 0; got ", *num_segments);
  }
  // set_dim aborts the process when a running product of the output's
  // dimensions (num_segments, data.shape[1:]...) overflows int64, even if a
  // later dimension is 0: reject exactly those shapes first.
  int64_t elements = *num_segments;
  *width = 1;
  for (int d = 1; d < data.dims(); ++d) {
    const int64_t size = data.dim_size(d);
    if (size != 0 && elements > std::numeric_limits<int64_t>::max() / size) {
      return errors::InvalidArgument("num_segments=", *num_segments, " is too large: an output ",
                                     "of shape [", *num_segments, "] + ",
                                     data.shape().DebugString(), "[1:] overflows a tensor's ",
                                     "element count");
    }
    if (size != 0 && *width > std::numeric_limits<int64_t>::max() / size) {
      return errors::InvalidArgument("data's rows of shape ", data.shape().DebugString(),
                                     "[1:] overflow a tensor's element count");
    }
    elements *= size;
    *width *= size;
  }
  *out_shape = data.shape();
  out_shape->set_dim(0, *num_segments);
  return OkStatus();
}

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_UTIL_KERNELS_SEGMENT_SUM_ARGS_H_
