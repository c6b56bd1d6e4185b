// NCCL, loaded at run time. The few functions sok_graph calls are looked up
// in libnccl.so.2 when the first all-to-all runs, so the package builds
// without NCCL's headers and loads where NCCL is absent (then only the
// NCCL ops fail, with an error saying what to install).
// sok_graph/communication/nccl.py loads the library of the `nvidia-nccl`
// wheels first when one is installed, which dlopen then finds by its soname.
#ifndef SOK_GRAPH_TF_OPS_COLLECTIVE_KERNELS_NCCL_LIBRARY_H_
#define SOK_GRAPH_TF_OPS_COLLECTIVE_KERNELS_NCCL_LIBRARY_H_

#include <cstddef>
#include <string>

namespace sok_graph {
namespace nccl {

// NCCL's ABI, stable since 2.7 (nccl.h): an opaque communicator, the 128
// bytes of a unique id, results as ints (0 = ncclSuccess), the datatype
// enum. Rows go as bytes (ncclUint8), which send/recv copy unchanged.
struct CommRecord;  // ncclComm, opaque
typedef CommRecord* Comm;
struct UniqueId {
  char internal[128];
};
constexpr int kSuccess = 0;
// ncclUnhandledCudaError: a CUDA call inside NCCL failed (often cudaMalloc).
constexpr int kUnhandledCudaError = 1;
constexpr int kUint8 = 1;

struct Library {
  int (*get_unique_id)(UniqueId* id);
  int (*comm_init_rank)(Comm* comm, int nranks, UniqueId id, int rank);
  int (*comm_init_all)(Comm* comms, int ndev, const int* devices);
  int (*send)(const void* buf, size_t count, int datatype, int peer, Comm comm, void* stream);
  int (*recv)(void* buf, size_t count, int datatype, int peer, Comm comm, void* stream);
  int (*group_start)();
  int (*group_end)();
  const char* (*error_string)(int result);
  int (*get_version)(int* version);
};

// The loaded library, or nullptr with *error saying why (once loaded, the
// same table for the process).
const Library* Load(std::string* error);

// "NCCL error 2 (unhandled system error)" for messages.
std::string ErrorText(const Library& nccl, int result);

}  // namespace nccl
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_COLLECTIVE_KERNELS_NCCL_LIBRARY_H_
