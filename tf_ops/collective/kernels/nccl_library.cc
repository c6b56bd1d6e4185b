// See nccl_library.h. Only GPU builds use NCCL.
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include "tf_ops/collective/kernels/nccl_library.h"

#include <dlfcn.h>

#include <mutex>

namespace sok_graph {
namespace nccl {
namespace {

template <typename F>
bool Resolve(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *out != nullptr;
}

}  // namespace

const Library* Load(std::string* error) {
  static std::once_flag once;
  static Library library;
  static const Library* loaded = nullptr;
  static std::string load_error;
  std::call_once(once, [] {
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      load_error = std::string("NCCL could not be loaded (libnccl.so.2: ") +
                   (why != nullptr ? why : "not found") +
                   "). Install it with `pip install nvidia-nccl-cu12` (or -cu13 for CUDA 13 "
                   "drivers), or put its directory on LD_LIBRARY_PATH; without NCCL set "
                   "SOK_GRAPH_NCCL=0 to exchange rows through TensorFlow's copies instead";
      return;
    }
    std::string missing;
    Library& l = library;
    Resolve(handle, "ncclGetUniqueId", &l.get_unique_id, &missing);
    Resolve(handle, "ncclCommInitRank", &l.comm_init_rank, &missing);
    Resolve(handle, "ncclCommInitAll", &l.comm_init_all, &missing);
    Resolve(handle, "ncclSend", &l.send, &missing);
    Resolve(handle, "ncclRecv", &l.recv, &missing);
    Resolve(handle, "ncclGroupStart", &l.group_start, &missing);
    Resolve(handle, "ncclGroupEnd", &l.group_end, &missing);
    Resolve(handle, "ncclGetErrorString", &l.error_string, &missing);
    Resolve(handle, "ncclGetVersion", &l.get_version, &missing);
    if (!missing.empty()) {
      load_error = "libnccl.so.2 lacks " + missing + " (sok_graph needs NCCL >= 2.7)";
      return;
    }
    loaded = &library;
  });
  if (loaded == nullptr && error != nullptr) *error = load_error;
  return loaded;
}

std::string ErrorText(const Library& nccl, int result) {
  const char* text = nccl.error_string(result);
  return "NCCL error " + std::to_string(result) + " (" + (text != nullptr ? text : "unknown") +
         ")";
}

}  // namespace nccl
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
