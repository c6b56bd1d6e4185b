// A CUDA launcher's return code as a TensorFlow error, for every GPU
// OpKernel: the error's name, and for the errors an old NVIDIA driver gives
// (the kernels need the driver of the CUDA runtime they were built with)
// what to do about it.
#ifndef SOK_GRAPH_TF_OPS_COMMON_CUDA_STATUS_H_
#define SOK_GRAPH_TF_OPS_COMMON_CUDA_STATUS_H_

#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {

// cudaErrorInsufficientDriver, cudaErrorCallRequiresNewerDriver,
// cudaErrorNoKernelImageForDevice,
// cudaErrorUnsupportedPtxVersion (driver_types.h; stable across CUDA 11-13).
constexpr int kCudaInsufficientDriver = 35;
constexpr int kCudaCallRequiresNewerDriver = 36;
constexpr int kCudaNoKernelImage = 209;
constexpr int kCudaUnsupportedPtx = 222;

inline ::tensorflow::Status CudaStatus(int rc, const std::string& what) {
  if (rc == 0) return OkStatus();
  const char* name = sok_gpu_error_name(rc);
  const std::string cuda =
      "CUDA error " + std::to_string(rc) + " (" + (name != nullptr ? name : "unknown") + ")";
  if (rc == kCudaInsufficientDriver || rc == kCudaCallRequiresNewerDriver ||
      rc == kCudaNoKernelImage || rc == kCudaUnsupportedPtx) {
    const int runtime = sok_cuda_runtime_version();  // e.g. 12090
    return ::tensorflow::errors::FailedPrecondition(
        what, " failed: ", cuda, ". sok_graph's GPU kernels are built with CUDA ",
        runtime / 1000, ".", (runtime % 1000) / 10, " for sm_80 and sm_90 (A100, H100, H200; ",
        "other GPUs of compute capability 8.x run the sm_80 code) and need an NVIDIA driver >= ",
        sok_cuda_min_driver(), "; GPUs newer than sm_90 compile the kernels' PTX, which can ",
        "need a newer driver (docs/gpu.md). Update the driver, or run the ops on the CPU ",
        "(CUDA_VISIBLE_DEVICES=\"\" or tf.device(\"/CPU:0\"))");
  }
  return ::tensorflow::errors::Internal(what, " failed: ", cuda);
}

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_COMMON_CUDA_STATUS_H_
