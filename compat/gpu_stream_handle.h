// The CUstream behind a TensorFlow stream executor Stream, across the
// TensorFlow versions sok_graph builds against (where the stream executor's
// headers live, and how a Stream hands out its CUDA stream). Only GPU
// OpKernels include this, through tf_ops/common/gpu_stream.h.
#ifndef SOK_GRAPH_COMPAT_GPU_STREAM_HANDLE_H_
#define SOK_GRAPH_COMPAT_GPU_STREAM_HANDLE_H_

#include "compat/tf_compat.h"

// The stream executor moved from tensorflow/ (1.x) to tensorflow/compiler/xla
// (2.x) to xla/ (2.15 onwards).
#if __has_include("xla/stream_executor/stream.h")
#include "xla/stream_executor/stream.h"
#elif __has_include("tensorflow/compiler/xla/stream_executor/stream.h")
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#if __has_include("tensorflow/compiler/xla/stream_executor/stream_executor_internal.h")
#include "tensorflow/compiler/xla/stream_executor/stream_executor_internal.h"
#endif
#else
#include "tensorflow/stream_executor/stream.h"
#include "tensorflow/stream_executor/stream_executor_internal.h"
#endif

namespace sok_graph {
namespace gpu_stream_internal {

// The CUstream of a stream executor Stream. Newer TensorFlow (2.14 on)
// hands it out as platform_specific_handle().stream; older ones (1.x up to
// 2.13) only through their GPU stream implementation's GpuStreamHack().
// Chosen by what the Stream type has (the int overload wins when viable),
// so no version number has to say where the change happened.
template <class S>
auto Handle(S* stream, int) -> decltype(static_cast<void*>(stream->platform_specific_handle().stream)) {
  return stream->platform_specific_handle().stream;
}
template <class S>
void* Handle(S* stream, long) {  // NOLINT(runtime/int): the overload's rank
  return stream->implementation()->GpuStreamHack();
}

}  // namespace gpu_stream_internal
}  // namespace sok_graph

#endif  // SOK_GRAPH_COMPAT_GPU_STREAM_HANDLE_H_
