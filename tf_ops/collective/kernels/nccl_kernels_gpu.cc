// GPU OpKernels of SokNcclAllToAll and SokNcclAllToAllSized: grouped
// ncclSend/ncclRecv, so rows go GPU to GPU (NVLink or PCIe peer copies,
// NCCL's choice), never through host memory.
//
// Streams: each rank queues its NCCL work on a stream of its own that first
// waits for the op's compute stream (the inputs, and memory the op was just
// given, are then free of earlier work). How the op completes depends on
// where the ranks are:
//  - the GPUs of one process ("local:" cliques): when the NCCL stream has
//    finished, read on the host. The compute stream never waits for NCCL
//    there: a wait on it would hold back every later kernel of its GPU until
//    the peers arrive, and where a peer's input depends on such a later
//    kernel (a copy between the GPUs of the process, which TensorFlow queues
//    behind the compute stream) the two GPUs would wait for each other
//    forever. TensorFlow's own NCCL ops complete that way.
//  - one process per GPU: as soon as the exchange is queued, with the
//    compute stream waiting on the GPU for the NCCL stream (an event), as
//    any GPU op completes. Every rank queues its exchanges in the same
//    order, so a GPU that waits for a peer's exchange k waits for work that
//    depends only on the peer's earlier exchanges; TensorFlow's own
//    collectives between the processes (the dense gradients' all-reduce)
//    complete on the host and never hold a compute stream. Waiting on the
//    host instead cost every exchange (four a training step) a full drain of
//    the GPU: the host learns the exchange is done only when all earlier
//    kernels are, and only then queues the kernels that follow
//    (bench/RESULTS.md). What this gives up: a peer that fails or stops now
//    hangs the whole compute stream, not only this op (neither way calls
//    ncclCommAbort), and an error of the NCCL kernels shows in the next
//    operation that waits for the GPU. Two cliques of one process queued in
//    different orders on different ranks could wait for each other through
//    the compute stream; the engines make one clique per process.
//
// Counts: SokNcclAllToAll learns how many rows each peer sends it from a
// small exchange of counts, read back on the host (its output's size). The
// counts come to it in host memory and go on the NCCL stream before that
// waits for the compute stream, so the host waits for the peers and the
// rank's earlier exchanges, not for this GPU to drain (ExchangeCounts).
//
// Communicators: one per rank of a clique, created when the rank's first
// all-to-all runs and kept for the process. A clique named "local:..." is
// the GPUs of this process (a MirroredStrategy's replicas): its first rank to
// arrive draws the unique id, and every rank initialises its communicator on
// its own thread (RankWorker) with its GPU made current. Any other clique
// name is the hex of an ncclUniqueId that rank 0 drew and the engine
// broadcast (one process per GPU).
//
// Ranks must run their all-to-alls in the same order (NCCL matches them by
// order); sok_graph/ops/collective.py chains the ops of each rank with
// control dependencies in the order they are built, which is the same on
// every rank, and each rank's RankWorker runs them in that order (on its
// thread, or on the executor's for an exchange that waits for nothing).
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tf_ops/collective/kernels/nccl_library.h"
#include "tf_ops/common/cuda_status.h"
#include "tf_ops/common/gpu_stream.h"
#include "compat/tf_compat.h"
#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace sok_graph {
namespace {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

constexpr char kLocalPrefix[] = "local:";

// The communicators of one clique, one slot per rank.
struct Clique {
  std::mutex id_mu;
  bool have_id = false;
  nccl::UniqueId id;
  std::vector<std::unique_ptr<std::mutex>> rank_mu;
  std::vector<nccl::Comm> comms;
  std::vector<std::string> failed;  // a rank's init error, reported again
  std::vector<void*> streams;       // each rank's NCCL stream (see the top)
  // Device memory per rank for the counts sent and received (2 x
  // world_size int64, see ExchangeCounts), outside TensorFlow's allocator.
  std::vector<int64_t*> counts_dev;
  // Pinned host memory per rank for the counts read back: a copy to
  // pageable memory holds the CUDA driver's lock while it waits for the
  // stream, and a peer's set-up (cudaMalloc) in this process would then
  // wait for that lock while the stream waits for the peer.
  std::vector<int64_t*> pinned;
  // Ranks of this process that finished their set-up (see Settle).
  std::mutex settle_mu;
  std::condition_variable settled;
  int ready = 0;
  bool broken = false;
};

Clique* CliqueNamed(const std::string& name, int world_size) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Clique>>* cliques =
      new std::map<std::string, std::unique_ptr<Clique>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Clique>& slot = (*cliques)[name];
  if (!slot) {
    slot.reset(new Clique());
    for (int r = 0; r < world_size; ++r) slot->rank_mu.emplace_back(new std::mutex());
    slot->comms.assign(world_size, nullptr);
    slot->failed.assign(world_size, "");
    slot->pinned.assign(world_size, nullptr);
    slot->streams.assign(world_size, nullptr);
    slot->counts_dev.assign(world_size, nullptr);
  }
  return slot.get();
}

bool ParseHexId(const std::string& hex, nccl::UniqueId* id) {
  if (hex.size() != 2 * sizeof(id->internal)) return false;
  for (size_t i = 0; i < sizeof(id->internal); ++i) {
    unsigned value = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = hex[2 * i + k];
      unsigned digit;
      if (c >= '0' && c <= '9') digit = c - '0';
      else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
      else return false;
      value = value * 16 + digit;
    }
    id->internal[i] = static_cast<char>(value);
  }
  return true;
}

// The number ending a device name ("/job:localhost/.../device:GPU:1" -> 1).
int DeviceNumber(const std::string& name) {
  const size_t colon = name.rfind(':');
  return colon == std::string::npos ? 0 : std::atoi(name.c_str() + colon + 1);
}

// One thread per rank of a clique that runs the rank's exchanges one at a
// time, in the order they were started. The kernels are asynchronous and
// only hand their work to this thread: an exchange waits for its peers (in
// NCCL's set-up, and for the counts before it can size its output), and
// while it waits the executor must go on to start the peers' ops, which in
// one process are the other replicas' — TensorFlow may run a function's
// ops inline on one thread, where a waiting kernel would stall them all.
// An exchange that cannot wait (RunOrPush) runs on the caller's thread
// instead when nothing of the rank's is queued or running: the hand-over to
// this thread is a wake-up of another thread on every exchange's way.
class RankWorker {
 public:
  RankWorker() : thread_([this] { Loop(); }) { thread_.detach(); }

  void Push(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    ready_.notify_one();
  }

  // Runs `job` here and now where the rank is idle, else after what is
  // queued (the order the executor started the exchanges stays NCCL's).
  void RunOrPush(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (busy_ || !jobs_.empty()) {
        jobs_.push_back(std::move(job));
        ready_.notify_one();
        return;
      }
      busy_ = true;
    }
    job();
    Idle();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [this] { return !busy_ && !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
      }
      job();
      Idle();
    }
  }

  void Idle() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    ready_.notify_one();
  }

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false;  // a job runs, here or on a caller's thread
  std::thread thread_;
};

// The worker of (clique, rank); made on first use and kept for the process
// (its communicator is).
RankWorker* WorkerOf(const std::string& clique, int rank) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, std::unique_ptr<RankWorker>>* workers =
      new std::map<std::pair<std::string, int>, std::unique_ptr<RankWorker>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<RankWorker>& slot = (*workers)[{clique, rank}];
  if (!slot) slot.reset(new RankWorker());
  return slot.get();
}

class NcclAllToAllOp : public ::tensorflow::AsyncOpKernel {
 public:
  explicit NcclAllToAllOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clique", &clique_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
    OP_REQUIRES(ctx, rank_ < world_size_,
                errors::InvalidArgument("rank must be < world_size (", world_size_, "); got ",
                                        rank_));
    sized_ = ctx->num_inputs() == 3;
    if (!sized_) OP_REQUIRES_OK(ctx, ctx->GetAttr("padded", &padded_));
    device_ = DeviceNumber(ctx->device()->name());
    // Run makes its device current on the thread it runs on. On an
    // executor's thread that is harmless only where the process sees one GPU
    // (the launcher's workers): with several, the thread would keep a device
    // TensorFlow did not choose for it.
    one_gpu_ = sok_cuda_device_count() == 1;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    // Runs in the order the executor started the rank's exchanges (see
    // RankWorker): on the rank's own thread, or, for an exchange that waits
    // for nothing (sizes known, one process per GPU, the only GPU it sees, its
    // communicator made), on this thread where the rank is idle.
    std::function<void()> job = [this, ctx, done]() {
      const Status status = Run(ctx);
      if (!status.ok()) ctx->SetStatus(status);
      done();
    };
    RankWorker* worker = WorkerOf(clique_, rank_);
    if (sized_ && one_gpu_ && !InProcess() && HaveCommunicator()) {
      worker->RunOrPush(std::move(job));
    } else {
      worker->Push(std::move(job));
    }
  }

 private:
  Status Run(OpKernelContext* ctx) {
    // NCCL and the copies take the device from the thread.
    TF_RETURN_IF_ERROR(
        CudaStatus(sok_gpu_set_device(device_), "SokNcclAllToAll: cudaSetDevice"));
    const Tensor& input = ctx->input(0);
    if (input.dims() < 1) {
      return errors::InvalidArgument("input must have rank >= 1; got shape ",
                                     input.shape().DebugString());
    }
    for (int i = 1; i < ctx->num_inputs(); ++i) {
      const Tensor& splits = ctx->input(i);
      if (splits.dims() != 1 || splits.dim_size(0) != world_size_) {
        return errors::InvalidArgument(requested_input(i), " must be a vector of world_size (",
                                       world_size_, ") counts; got shape ",
                                       splits.shape().DebugString());
      }
    }
    std::string load_error;
    const nccl::Library* lib = nccl::Load(&load_error);
    if (lib == nullptr) return errors::FailedPrecondition(load_error);
    void* compute = GpuStreamOf(ctx);
    nccl::Comm comm = nullptr;
    void* stream = nullptr;
    TF_RETURN_IF_ERROR(Communicator(*lib, ctx, compute, &comm, &stream));

    // Both ops take send_splits in host memory.
    std::vector<int64_t> send(world_size_), receive(world_size_);
    std::memcpy(send.data(), ctx->input(1).flat<TfInt64>().data(), 8 * world_size_);
    if (sized_) {
      std::memcpy(receive.data(), ctx->input(2).flat<TfInt64>().data(), 8 * world_size_);
    } else {
      TF_RETURN_IF_ERROR(ExchangeCounts(*lib, comm, stream, send, &receive));
    }
    int64_t sent_rows = 0, received_rows = 0;
    for (int r = 0; r < world_size_; ++r) {
      if (send[r] < 0 || receive[r] < 0) {
        return errors::InvalidArgument("the splits must be >= 0; got ", send[r], " rows to ",
                                       "rank ", r, " and ", receive[r], " from it");
      }
      sent_rows += send[r];
      received_rows += receive[r];
    }
    // Padded input: the rows past the splits are not sent.
    if (sent_rows != input.dim_size(0) && !(padded_ && sent_rows < input.dim_size(0))) {
      return errors::InvalidArgument("send_splits sum to ", sent_rows, " rows; input has ",
                                     input.dim_size(0), padded_ ? " (padded: at most that)" : "");
    }
    TensorShape out_shape = input.shape();
    out_shape.set_dim(0, received_rows);
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, out_shape, &out));
    if (!sized_) {
      Tensor *received_splits = nullptr, *sent_splits = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({world_size_}), &received_splits));
      TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({world_size_}), &sent_splits));
      std::memcpy(received_splits->flat<TfInt64>().data(), receive.data(), 8 * world_size_);
      std::memcpy(sent_splits->flat<TfInt64>().data(), send.data(), 8 * world_size_);
    }
    // Bytes per row: the product of the trailing dimensions.
    size_t row_bytes = ::tensorflow::DataTypeSize(input.dtype());
    for (int d = 1; d < input.dims(); ++d) row_bytes *= static_cast<size_t>(input.dim_size(d));
    const char* in = static_cast<const char*>(input.tensor_data().data());
    char* dst = const_cast<char*>(out->tensor_data().data());
    // After the allocation: memory freed by ops queued on the compute stream
    // before it is then no longer read or written there.
    TF_RETURN_IF_ERROR(StreamAfterCompute(stream, compute));
    const Status queued = ExchangeRows(*lib, comm, stream, in, dst, row_bytes, send, receive);
    if (!queued.ok() || InProcess()) {
      // On an error too: what was queued may still read the input and
      // write the output, which go back to the allocator with this op.
      const Status drained =
          CudaStatus(sok_gpu_stream_sync(stream), "SokNcclAllToAll: waiting for the rows");
      return queued.ok() ? drained : queued;
    }
    // Later kernels of the compute stream (readers of the rows, and whatever
    // reuses the input's memory once this op is done) run after the exchange.
    const Status ordered = CudaStatus(sok_gpu_stream_after(compute, stream),
                                      "SokNcclAllToAll: ordering the compute stream after the rows");
    if (!ordered.ok()) sok_gpu_stream_sync(stream);  // as on an error above
    return ordered;
  }

  // Whether the clique is the GPUs of this process (see the top of the file).
  bool InProcess() const {
    return clique_.compare(0, sizeof(kLocalPrefix) - 1, kLocalPrefix) == 0;
  }

  // Whether this rank's communicator exists (its set-up waits for the peers).
  // Never waits: while the set-up holds the rank's lock the answer is no.
  bool HaveCommunicator() const {
    Clique* clique = CliqueNamed(clique_, world_size_);
    std::unique_lock<std::mutex> lock(*clique->rank_mu[rank_], std::try_to_lock);
    return lock.owns_lock() && clique->comms[rank_] != nullptr;
  }

  static Status StreamAfterCompute(void* stream, void* compute) {
    return CudaStatus(sok_gpu_stream_after(stream, compute),
                      "SokNcclAllToAll: ordering the NCCL stream after the compute stream");
  }

  // This rank's communicator and NCCL stream, made on first use.
  Status Communicator(const nccl::Library& lib, OpKernelContext* ctx, void* compute,
                      nccl::Comm* comm, void** stream) {
    Clique* clique = CliqueNamed(clique_, world_size_);
    std::lock_guard<std::mutex> lock(*clique->rank_mu[rank_]);
    if (clique->comms[rank_] != nullptr) {
      *comm = clique->comms[rank_];
      *stream = clique->streams[rank_];
      return OkStatus();
    }
    if (!clique->failed[rank_].empty()) return errors::Internal(clique->failed[rank_]);
    nccl::UniqueId id;
    {
      std::lock_guard<std::mutex> id_lock(clique->id_mu);
      if (!clique->have_id) {
        if (InProcess()) {
          const int rc = lib.get_unique_id(&clique->id);
          if (rc != nccl::kSuccess) {
            return errors::Internal("ncclGetUniqueId failed: ", nccl::ErrorText(lib, rc));
          }
        } else if (!ParseHexId(clique_, &clique->id)) {
          return errors::InvalidArgument("clique must be \"local:...\" or the ",
                                         2 * sizeof(id.internal), " lowercase hex digits of ",
                                         "an ncclUniqueId; got \"", clique_, "\"");
        }
        clique->have_id = true;
      }
      id = clique->id;
    }
    // NCCL takes the device from the thread. TensorFlow's GPU ids are CUDA's
    // device numbers unless a Session's visible_device_list reorders them.
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_set_device(device_), "SokNcclAllToAll: cudaSetDevice"));
    // Blocks until every rank of the clique is here (NCCL's bootstrap).
    nccl::Comm created = nullptr;
    const int rc = lib.comm_init_rank(&created, world_size_, id, rank_);
    if (rc != nccl::kSuccess) {
      {
        std::lock_guard<std::mutex> settle_lock(clique->settle_mu);
        clique->broken = true;
      }
      clique->settled.notify_all();
      clique->failed[rank_] = "ncclCommInitRank (rank " + std::to_string(rank_) + " of " +
                              std::to_string(world_size_) + ", clique " +
                              clique_.substr(0, 16) + ") failed: " + nccl::ErrorText(lib, rc);
      // NCCL's buffers come from cudaMalloc, outside TensorFlow's allocator,
      // which by default takes all of a GPU's memory but a small reserve.
      if (rc == nccl::kUnhandledCudaError) {
        clique->failed[rank_] +=
            ". NCCL allocates its buffers outside TensorFlow's allocator; if CUDA ran out of "
            "memory (NCCL_DEBUG=WARN says), let TensorFlow grow into the GPU's memory "
            "(tf.config.experimental.set_memory_growth, or TF_FORCE_GPU_ALLOW_GROWTH=true) or "
            "leave NCCL more (TF_DEVICE_MIN_SYS_MEMORY_IN_MB)";
      }
      return errors::Internal(clique->failed[rank_]);
    }
    Status status = CudaStatus(sok_gpu_stream_create(&clique->streams[rank_]),
                               "SokNcclAllToAll: creating the NCCL stream");
    if (status.ok()) status = Settle(lib, clique, created, ctx, compute, clique->streams[rank_]);
    if (!status.ok()) {
      {
        std::lock_guard<std::mutex> settle_lock(clique->settle_mu);
        clique->broken = true;
      }
      clique->settled.notify_all();
      clique->failed[rank_] = status.ToString();
      return status;
    }
    clique->comms[rank_] = created;
    *comm = created;
    *stream = clique->streams[rank_];
    return OkStatus();
  }

  // After ncclCommInitRank: pinned and device memory for the counts, then
  // one message
  // to and from every peer (NCCL connects pairs of ranks at their first
  // message, allocating buffers), between two barriers of this process's
  // ranks where it has several. So no rank waits on an exchange while
  // another still allocates: allocations and waits on the stream would
  // deadlock on the CUDA driver's lock (a rank's cudaMalloc waits for the
  // lock that a waiting copy holds, the copy waits for the peer's kernel).
  Status Settle(const nccl::Library& lib, Clique* clique, nccl::Comm comm, OpKernelContext* ctx,
                void* compute, void* stream) {
    void* pinned = nullptr;
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_host_alloc(&pinned, 8 * 2 * world_size_),
                                  "SokNcclAllToAll: pinned memory for the counts"));
    clique->pinned[rank_] = static_cast<int64_t*>(pinned);
    void* counts_dev = nullptr;
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_device_alloc(&counts_dev, 8 * 2 * world_size_),
                                  "SokNcclAllToAll: device memory for the counts"));
    clique->counts_dev[rank_] = static_cast<int64_t*>(counts_dev);
    // One rank per process: no barrier (the peers are elsewhere), but the
    // pairs still connect now, while the compute stream waits for nothing of
    // NCCL's: later exchanges order the compute stream after the NCCL stream
    // (see the top), and a connection's cudaMalloc must not wait for the
    // driver's lock behind a copy that waits for that stream.
    const bool local = InProcess();
    if (local) TF_RETURN_IF_ERROR(Barrier(clique, 1));
    Tensor bytes;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64,
                                          TensorShape({2 * world_size_}), &bytes));
    int64_t* buf = reinterpret_cast<int64_t*>(bytes.flat<TfInt64>().data());
    TF_RETURN_IF_ERROR(StreamAfterCompute(stream, compute));
    TF_RETURN_IF_ERROR(Grouped(lib, "connecting the ranks", [&]() {
      for (int r = 0; r < world_size_; ++r) {
        if (r == rank_) continue;
        int rc = lib.send(buf + r, 8, nccl::kUint8, r, comm, stream);
        if (rc == nccl::kSuccess) {
          rc = lib.recv(buf + world_size_ + r, 8, nccl::kUint8, r, comm, stream);
        }
        if (rc != nccl::kSuccess) return rc;
      }
      return nccl::kSuccess;
    }));
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(clique->pinned[rank_], buf, 8, stream),
                                  "SokNcclAllToAll: waiting for the first messages"));
    return local ? Barrier(clique, 2) : OkStatus();
  }

  // Waits until all world_size ranks (all in this process) reached `round`.
  Status Barrier(Clique* clique, int round) {
    std::unique_lock<std::mutex> lock(clique->settle_mu);
    ++clique->ready;
    clique->settled.notify_all();
    clique->settled.wait(lock, [&] {
      return clique->broken || clique->ready >= round * world_size_;
    });
    if (clique->broken) {
      return errors::Internal("SokNcclAllToAll: another rank of clique ", clique_.substr(0, 16),
                              " failed its set-up");
    }
    return OkStatus();
  }

  // The counts of rows each rank sends here, from a grouped exchange of one
  // int64 per pair of ranks, read back on the host: the wait that sizes the
  // output (SokNcclAllToAllSized has none). send_splits comes in host memory
  // (TensorFlow copies a count made on this GPU to the host once the compute
  // stream has run the kernel that made it and what was queued before it),
  // and the counts go on the NCCL stream
  // before it waits for the compute stream, from a buffer outside
  // TensorFlow's allocator: the wait is for the peers' counts and this
  // rank's earlier exchanges, not for every kernel queued on the GPU since
  // the count was made. In a training step the next step's counts then
  // reach the host when the step's last exchange (its gradient rows) is
  // done, not after the step's sparse update and the dense layers queued
  // behind it, and the host queues the next keys, owners' reads and rows
  // while the GPU still runs those.
  Status ExchangeCounts(const nccl::Library& lib, nccl::Comm comm, void* stream,
                        const std::vector<int64_t>& send, std::vector<int64_t>* receive) {
    Clique* clique = CliqueNamed(clique_, world_size_);
    int64_t* counts = clique->counts_dev[rank_];
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_device(counts, send.data(), 8 * world_size_,
                                                         stream),
                                  "SokNcclAllToAll: copying the splits"));
    TF_RETURN_IF_ERROR(Grouped(lib, "exchanging the splits", [&]() {
      for (int r = 0; r < world_size_; ++r) {
        int rc = lib.send(counts + r, 8, nccl::kUint8, r, comm, stream);
        if (rc == nccl::kSuccess) {
          rc = lib.recv(counts + world_size_ + r, 8, nccl::kUint8, r, comm, stream);
        }
        if (rc != nccl::kSuccess) return rc;
      }
      return nccl::kSuccess;
    }));
    int64_t* host = clique->pinned[rank_];
    TF_RETURN_IF_ERROR(CudaStatus(sok_gpu_copy_to_host(host, counts + world_size_,
                                                       8 * world_size_, stream),
                                  "SokNcclAllToAll: reading the splits"));
    receive->assign(host, host + world_size_);
    return OkStatus();
  }

  Status ExchangeRows(const nccl::Library& lib, nccl::Comm comm, void* stream, const char* in,
                      char* out, size_t row_bytes, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& receive) {
    std::vector<size_t> send_at(world_size_, 0), receive_at(world_size_, 0);
    for (int r = 1; r < world_size_; ++r) {
      send_at[r] = send_at[r - 1] + static_cast<size_t>(send[r - 1]) * row_bytes;
      receive_at[r] = receive_at[r - 1] + static_cast<size_t>(receive[r - 1]) * row_bytes;
    }
    // What stays on this GPU: one rank alone copies it on the stream; among
    // several it is a message to itself in the same group, which NCCL copies
    // while the peers' rows travel (a copy queued first would hold them back).
    const size_t own = static_cast<size_t>(send[rank_]) * row_bytes;
    if (own != static_cast<size_t>(receive[rank_]) * row_bytes) {
      return errors::Internal("SokNcclAllToAll: rank ", rank_, " sends itself ", send[rank_],
                              " rows but expects ", receive[rank_]);
    }
    if (world_size_ == 1) {
      return CudaStatus(sok_gpu_copy_on_device(out + receive_at[rank_], in + send_at[rank_], own,
                                               stream),
                        "SokNcclAllToAll: the rows this rank keeps");
    }
    return Grouped(lib, "exchanging the rows", [&]() {
      for (int r = 0; r < world_size_; ++r) {
        const size_t out_bytes = static_cast<size_t>(send[r]) * row_bytes;
        const size_t in_bytes = static_cast<size_t>(receive[r]) * row_bytes;
        int rc = nccl::kSuccess;
        if (out_bytes > 0) rc = lib.send(in + send_at[r], out_bytes, nccl::kUint8, r, comm, stream);
        if (rc == nccl::kSuccess && in_bytes > 0) {
          rc = lib.recv(out + receive_at[r], in_bytes, nccl::kUint8, r, comm, stream);
        }
        if (rc != nccl::kSuccess) return rc;
      }
      return nccl::kSuccess;
    });
  }

  template <typename F>
  Status Grouped(const nccl::Library& lib, const char* what, F calls) {
    int rc = lib.group_start();
    if (rc == nccl::kSuccess) {
      const int first = calls();
      rc = lib.group_end();  // a group once started is always ended
      if (first != nccl::kSuccess) rc = first;
    }
    if (rc != nccl::kSuccess) {
      return errors::Internal(name(), " (rank ", rank_, " of ", world_size_, "): ", what,
                              " failed: ", nccl::ErrorText(lib, rc));
    }
    return OkStatus();
  }

  std::string clique_;
  int rank_ = 0;
  int world_size_ = 1;
  bool sized_ = false;
  bool padded_ = false;
  int device_ = 0;
  bool one_gpu_ = false;  // the process sees one GPU (see the constructor)
};

#define SOK_REGISTER_NCCL(type)                                                         \
  REGISTER_KERNEL_BUILDER(Name("SokNcclAllToAll")                                       \
                              .Device(::tensorflow::DEVICE_GPU)                         \
                              .TypeConstraint("T", type)                                \
                              .HostMemory("send_splits")                                \
                              .HostMemory("received_splits")                            \
                              .HostMemory("sent_splits"),                               \
                          NcclAllToAllOp);                                              \
  REGISTER_KERNEL_BUILDER(Name("SokNcclAllToAllSized")                                  \
                              .Device(::tensorflow::DEVICE_GPU)                         \
                              .TypeConstraint("T", type)                                \
                              .HostMemory("send_splits")                                \
                              .HostMemory("receive_splits"),                            \
                          NcclAllToAllOp)

SOK_REGISTER_NCCL(::tensorflow::DT_FLOAT);
SOK_REGISTER_NCCL(::tensorflow::DT_HALF);
SOK_REGISTER_NCCL(::tensorflow::DT_BFLOAT16);
SOK_REGISTER_NCCL(::tensorflow::DT_DOUBLE);
SOK_REGISTER_NCCL(::tensorflow::DT_INT32);
SOK_REGISTER_NCCL(::tensorflow::DT_INT64);

#undef SOK_REGISTER_NCCL

}  // namespace
}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA
