// Device scratch for a CUDA launcher that reports its size when given none
// (launch(nullptr, &bytes)), allocated from TensorFlow as a temporary of the
// op's Compute call. It is released when Compute returns, before the
// launched work has run, which is safe because an op that gets the memory
// next queues its work on the same stream, behind this.
#ifndef SOK_GRAPH_TF_OPS_COMMON_GPU_SCRATCH_H_
#define SOK_GRAPH_TF_OPS_COMMON_GPU_SCRATCH_H_

#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/cuda_status.h"

namespace sok_graph {

// launch(nullptr, &bytes), then launch(scratch, &bytes) with `bytes` of
// scratch held in `temp` (the caller keeps it until Compute returns).
// `what` names the launch in errors.
template <typename Launch>
::tensorflow::Status LaunchWithScratch(::tensorflow::OpKernelContext* ctx, const char* what,
                                       ::tensorflow::Tensor* temp, Launch launch) {
  size_t bytes = 0;
  TF_RETURN_IF_ERROR(CudaStatus(launch(nullptr, &bytes), std::string("sizing the scratch of ") +
                                                             what));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT8,
                                        ::tensorflow::TensorShape(
                                            {static_cast<int64_t>(bytes) + 1}),
                                        temp));
  void* scratch = const_cast<char*>(temp->tensor_data().data());
  return CudaStatus(launch(scratch, &bytes), what);
}

}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA

#endif  // SOK_GRAPH_TF_OPS_COMMON_GPU_SCRATCH_H_
