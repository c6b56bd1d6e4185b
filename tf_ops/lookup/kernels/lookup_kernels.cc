// The fused lookup on the CPU: the functors of SokFusedLookup and
// SokFusedLookupGrad (lookup_op.h) — allocation and threading around the
// numeric code in tf_ops/lookup/core/lookup.h — and SokLookupCheck.
#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tf_ops/common/table_inputs.h"
#include "compat/tf_compat.h"
#include "tf_ops/lookup/core/lookup.h"
#include "tf_ops/lookup/kernels/lookup_args.h"
#include "tf_ops/lookup/kernels/lookup_op.h"

namespace sok_graph {
namespace lookup_kernels {
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

// Runs fn(table, begin, end) over per-table work counts as one parallel loop,
// so N small tables still keep every thread busy.
template <typename Fn>
void ForEachAcrossTables(OpKernelContext* ctx, const std::vector<int64_t>& counts,
                         int64_t cost_per_unit, Fn&& fn) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t t = 0; t < counts.size(); ++t) offsets[t + 1] = offsets[t] + counts[t];
  ParallelFor(ctx, offsets.back(), cost_per_unit, [&](int64_t begin, int64_t end) {
    size_t t = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
    while (begin < end) {
      const int64_t stop = std::min(end, offsets[t + 1]);
      if (stop > begin) fn(t, begin - offsets[t], stop - offsets[t]);
      begin = stop;
      ++t;
    }
  });
}

// A zeroed per-thread buffer of `rows` int32s for unique-by-direct-indexing
// (core::UniqueWithInverseInRange leaves it zeroed again), or nullptr when
// the table is too large for that to pay off: then ids are hashed. Pool
// threads live as long as the process, so the buffer is allocated once.
int32_t* DenseUniqueScratch(int64_t rows) {
  constexpr int64_t kMaxDenseRows = int64_t{1} << 22;  // 16 MiB per thread at most
  if (rows > kMaxDenseRows) return nullptr;
  thread_local std::vector<int32_t> scratch;
  if (static_cast<int64_t>(scratch.size()) < rows) scratch.assign(static_cast<size_t>(rows), 0);
  return scratch.data();
}

// Lowers `slot` to `value` if smaller (first bad position wins, whatever the
// thread order).
void AtomicMin(std::atomic<int64_t>* slot, int64_t value) {
  int64_t seen = slot->load();
  while (value < seen && !slot->compare_exchange_weak(seen, value)) {
  }
}

// The core code's view of each table. A table given one id per sample
// reads its splits 0, 1, ..., nnz from `implied_splits`, kept by the caller
// as long as the views.
template <typename T, typename K>
std::vector<core::TableView<T, K>> Views(const std::vector<LookupTableInput>& tables,
                                         std::vector<std::vector<int64_t>>* implied_splits) {
  std::vector<core::TableView<T, K>> views(tables.size());
  implied_splits->resize(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const LookupTableInput& in = tables[t];
    core::TableView<T, K>& v = views[t];
    v.params = in.params->flat<T>().data();
    v.rows = in.rows;
    v.dim = in.dim;
    v.ids = in.ids->flat<K>().data();
    if (in.row_splits == nullptr) {
      std::vector<int64_t>& made = (*implied_splits)[t];
      made.resize(static_cast<size_t>(in.nnz) + 1);
      for (size_t b = 0; b < made.size(); ++b) made[b] = static_cast<int64_t>(b);
      v.row_splits = made.data();
    } else {
      v.row_splits = reinterpret_cast<const int64_t*>(in.row_splits->flat<TfInt64>().data());
    }
    v.batch = in.batch;
    v.weights = in.weights != nullptr ? in.weights->flat<T>().data() : nullptr;
    v.combiner = in.combiner;
    v.max_norm = in.max_norm;
  }
  return views;
}

constexpr int64_t kNoProblem = FusedLookupAttrs::kNoProblem;

// Per-table first positions of bad ids, found by the passes that read ids
// anyway (the forward pass, the backward's unique step).
struct BadIds {
  explicit BadIds(int n) : first(n) {
    for (auto& f : first) f.store(kNoProblem);
  }
  void Record(size_t table, int64_t position) {
    if (position >= 0) AtomicMin(&first[table], position);
  }
  // The error for the first table with a bad id, if any.
  template <typename View>
  Status Check(const FusedLookupAttrs& attrs, const std::vector<View>& views) const {
    for (int t = 0; t < attrs.num_tables; ++t) {
      const int64_t j = first[t].load();
      if (j == kNoProblem) continue;
      return attrs.BadId(t, static_cast<int64_t>(views[t].ids[j]), j, views[t].rows);
    }
    return OkStatus();
  }
  std::vector<std::atomic<int64_t>> first;
};

// Rough cost of one unit of work, in cycles, for the thread pool's sharding.
int64_t CostPerSample(const std::vector<int64_t>& nnz, const std::vector<int64_t>& batch,
                      int64_t max_dim) {
  int64_t total_nnz = 0, total_batch = 0;
  for (size_t t = 0; t < nnz.size(); ++t) {
    total_nnz += nnz[t];
    total_batch += batch[t];
  }
  const int64_t per_sample = total_batch > 0 ? (total_nnz + total_batch - 1) / total_batch : 1;
  return std::max<int64_t>(1, per_sample) * (max_dim + 8) * 2;
}

}  // namespace

template <typename T, typename K>
struct FusedLookupForward<CpuDevice, T, K> {
  Status operator()(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                    const std::vector<LookupTableInput>& tables) const {
    std::vector<std::vector<int64_t>> implied_splits;
    const std::vector<core::TableView<T, K>> views = Views<T, K>(tables, &implied_splits);
    OpOutputList outputs;
    TF_RETURN_IF_ERROR(ctx->output_list("embeddings", &outputs));
    std::vector<T*> out(views.size());
    std::vector<int64_t> batch(views.size()), nnz(views.size());
    int64_t max_dim = 1;
    for (size_t t = 0; t < views.size(); ++t) {
      Tensor* o = nullptr;
      TF_RETURN_IF_ERROR(outputs.allocate(t, TensorShape({views[t].batch, views[t].dim}), &o));
      out[t] = o->flat<T>().data();
      batch[t] = views[t].batch;
      nnz[t] = tables[t].nnz;
      max_dim = std::max(max_dim, views[t].dim);
    }
    BadIds bad(attrs.num_tables);
    ForEachAcrossTables(ctx, batch, CostPerSample(nnz, batch, max_dim),
                        [&](size_t t, int64_t b0, int64_t b1) {
                          std::vector<float> acc(static_cast<size_t>(views[t].dim) + 1);
                          bad.Record(t, core::LookupForward(views[t], b0, b1, out[t], acc.data()));
                        });
    TF_RETURN_IF_ERROR(bad.Check(attrs, views));
    // Everything was checked above: the check output says so.
    const int n = attrs.num_tables;
    Tensor* checks = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(
        "checks", TensorShape({FusedLookupAttrs::kCheckRows, n}), &checks));
    int64_t* c = reinterpret_cast<int64_t*>(checks->flat<TfInt64>().data());
    for (int t = 0; t < n; ++t) {
      FusedLookupAttrs::ClearColumn(c, n, t, views[t].rows, nnz[t]);
    }
    return OkStatus();
  }
};

namespace {

// SokLookupCheck: the error of a lookup's check output, if any. It runs on
// the host (a GPU forward's check is copied there by TensorFlow, without
// holding up the ops that consume the embeddings).
class LookupCheckOp : public OpKernel {
 public:
  explicit LookupCheckOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &attrs_.num_tables));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &attrs_.names));
    OP_REQUIRES(ctx, attrs_.names.empty() ||
                         static_cast<int>(attrs_.names.size()) == attrs_.num_tables,
                errors::InvalidArgument("table_names must have num_tables=", attrs_.num_tables,
                                        " entries; got ", attrs_.names.size()));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& checks = ctx->input(0);
    const int n = attrs_.num_tables;
    OP_REQUIRES(ctx, checks.dims() == 2 && checks.dim_size(0) == FusedLookupAttrs::kCheckRows &&
                         checks.dim_size(1) == n,
                errors::InvalidArgument("checks must be [", FusedLookupAttrs::kCheckRows, ", ", n,
                                        "] (a SokFusedLookup's check output); got shape ",
                                        checks.shape().DebugString()));
    const int64_t* c = reinterpret_cast<const int64_t*>(checks.flat<TfInt64>().data());
    for (int t = 0; t < n; ++t) OP_REQUIRES_OK(ctx, attrs_.CheckedColumn(t, c));
  }

 private:
  FusedLookupAttrs attrs_;
};

REGISTER_KERNEL_BUILDER(Name("SokLookupCheck").Device(::tensorflow::DEVICE_CPU), LookupCheckOp);
#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA
// Next to a GPU lookup: the check is read in host memory.
REGISTER_KERNEL_BUILDER(Name("SokLookupCheck").Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("checks"), LookupCheckOp);
#endif

}  // namespace

// The gradient's rows per table: each table's distinct ids and their
// summed gradient rows (or, for a dense table, its [rows, dim] gradient).
template <typename T, typename K>
struct FusedLookupBackward<CpuDevice, T, K> {
  using View = core::TableView<T, K>;

  Status operator()(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                    const std::vector<LookupTableInput>& tables,
                    const OpInputList& grads_in) const {
    std::vector<std::vector<int64_t>> implied_splits;
    const std::vector<View> views = Views<T, K>(tables, &implied_splits);
    const int n = attrs.num_tables;
    std::vector<const T*> grads(n);
    std::vector<int64_t> nnz(n);
    int64_t max_dim = 1, total_nnz = 0;
    for (int t = 0; t < n; ++t) {
      grads[t] = grads_in[t].flat<T>().data();
      nnz[t] = tables[t].nnz;
      total_nnz += nnz[t];
      max_dim = std::max(max_dim, views[t].dim);
    }
    const int64_t threads =
        ctx->device()->tensorflow_cpu_worker_threads()->workers->NumThreads();
    // Enough tables to keep every thread busy: each table is summed whole,
    // by one thread, in one pass. Fewer: a plan per table first, then each
    // table's rows split over the threads.
    if (n >= 2 * threads) return SumWholeTables(ctx, attrs, views, nnz, grads, total_nnz, max_dim);
    return SumSplitTables(ctx, attrs, views, nnz, grads, total_nnz, max_dim, threads);
  }

  // Allocates table t's outputs for `num_unique` rows: its unique ids and
  // rows, or (a dense table) its [rows, dim] gradient. `*rows` is where the
  // summed rows go: the output, or a temporary for a dense table.
  static Status AllocateTable(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                              OpOutputList* unique_out, OpOutputList* rows_out, int t,
                              const View& v, int64_t num_unique, K** unique, T** rows,
                              Tensor* summed, Tensor** dense) {
    TF_RETURN_IF_ERROR(AllocateUniqueIds(attrs, unique_out, t, num_unique, unique));
    *dense = nullptr;
    if (attrs.dense_grads[t]) {
      TF_RETURN_IF_ERROR(rows_out->allocate(t, TensorShape({v.rows, v.dim}), dense));
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DataTypeToEnum<T>::value,
                                            TensorShape({num_unique, v.dim}), summed));
      *rows = summed->flat<T>().data();
      return OkStatus();
    }
    Tensor* r = nullptr;
    TF_RETURN_IF_ERROR(rows_out->allocate(t, TensorShape({num_unique, v.dim}), &r));
    *rows = r->flat<T>().data();
    return OkStatus();
  }

  // Table t's unique-ids output: its ids, or none for a dense table.
  static Status AllocateUniqueIds(const FusedLookupAttrs& attrs, OpOutputList* unique_out, int t,
                                  int64_t num_unique, K** unique) {
    Tensor* u = nullptr;
    const bool is_dense = attrs.dense_grads[t];
    TF_RETURN_IF_ERROR(unique_out->allocate(t, TensorShape({is_dense ? 0 : num_unique}), &u));
    *unique = u->flat<K>().data();
    return OkStatus();
  }

  // A dense table's gradient: its summed rows at their ids, zero elsewhere.
  template <typename R>
  static void PlaceDenseRows(const View& v, const std::vector<K>& ids, const R* rows,
                             Tensor* dense) {
    const int64_t dim = v.dim;
    T* out = dense->flat<T>().data();
    std::fill(out, out + v.rows * dim, T(0.0f));
    for (size_t u = 0; u < ids.size(); ++u) {
      const int64_t id = static_cast<int64_t>(ids[u]);
      std::transform(rows + u * dim, rows + (u + 1) * dim, out + id * dim,
                     [](R x) { return static_cast<T>(x); });
    }
  }

  static Status SumWholeTables(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                               const std::vector<View>& views, const std::vector<int64_t>& nnz,
                               const std::vector<const T*>& grads, int64_t total_nnz,
                               int64_t max_dim) {
    const int n = attrs.num_tables;
    // Room for a row per position (a table has at most nnz unique ids);
    // only the rows summed are touched. Float tables hand the first rows on
    // as their output, with no copy.
    std::vector<Tensor> sums(n);
    for (int t = 0; t < n; ++t) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                            TensorShape({nnz[t], views[t].dim}), &sums[t]));
    }
    std::vector<std::vector<K>> unique(n);
    BadIds bad(n);
    const int64_t per_table = (total_nnz / n + 1) * (max_dim + 16) * 2;
    ParallelFor(ctx, n, per_table, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        bad.Record(t, core::SumGradientRows(views[t], grads[t], DenseUniqueScratch(views[t].rows),
                                            &unique[t], sums[t].flat<float>().data()));
      }
    });
    TF_RETURN_IF_ERROR(bad.Check(attrs, views));

    OpOutputList unique_out, rows_out;
    TF_RETURN_IF_ERROR(ctx->output_list("unique_ids", &unique_out));
    TF_RETURN_IF_ERROR(ctx->output_list("grad_rows", &rows_out));
    constexpr bool kFloat = std::is_same<T, float>::value;
    std::vector<K*> unique_dst(n);
    std::vector<T*> rows_dst(n, nullptr);  // rows to convert from float
    std::vector<Tensor*> dense(n, nullptr);
    for (int t = 0; t < n; ++t) {
      const int64_t num_unique = static_cast<int64_t>(unique[t].size());
      TF_RETURN_IF_ERROR(AllocateUniqueIds(attrs, &unique_out, t, num_unique, &unique_dst[t]));
      if (attrs.dense_grads[t]) {
        TF_RETURN_IF_ERROR(
            rows_out.allocate(t, TensorShape({views[t].rows, views[t].dim}), &dense[t]));
      } else if (kFloat) {
        rows_out.set(t, sums[t].Slice(0, num_unique));
      } else {
        Tensor* r = nullptr;
        TF_RETURN_IF_ERROR(rows_out.allocate(t, TensorShape({num_unique, views[t].dim}), &r));
        rows_dst[t] = r->flat<T>().data();
      }
    }
    ParallelFor(ctx, n, per_table / 4, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float* summed = sums[t].flat<float>().data();
        if (dense[t] != nullptr) {
          PlaceDenseRows(views[t], unique[t], summed, dense[t]);
          continue;
        }
        std::copy(unique[t].begin(), unique[t].end(), unique_dst[t]);
        if (rows_dst[t] != nullptr) {
          const int64_t values = static_cast<int64_t>(unique[t].size()) * views[t].dim;
          std::transform(summed, summed + values, rows_dst[t],
                         [](float x) { return static_cast<T>(x); });
        }
      }
    });
    return OkStatus();
  }

  static Status SumSplitTables(OpKernelContext* ctx, const FusedLookupAttrs& attrs,
                               const std::vector<View>& views, const std::vector<int64_t>& nnz,
                               const std::vector<const T*>& grads, int64_t total_nnz,
                               int64_t max_dim, int64_t threads) {
    const int n = attrs.num_tables;
    // Unique ids and each position's unique index: one table per unit of work.
    std::vector<core::BackwardPlan<K>> plans(n);
    BadIds bad(n);
    ParallelFor(ctx, n, 60 * (total_nnz / std::max(n, 1) + 1), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        bad.Record(t, core::PlanBackward(views[t], nnz[t], &plans[t],
                                         DenseUniqueScratch(views[t].rows)));
      }
    });
    TF_RETURN_IF_ERROR(bad.Check(attrs, views));

    OpOutputList unique_out, rows_out;
    TF_RETURN_IF_ERROR(ctx->output_list("unique_ids", &unique_out));
    TF_RETURN_IF_ERROR(ctx->output_list("grad_rows", &rows_out));
    std::vector<T*> rows(n);
    std::vector<int64_t> num_unique(n);
    std::vector<Tensor> summed(n);
    std::vector<Tensor*> dense(n);
    for (int t = 0; t < n; ++t) {
      num_unique[t] = static_cast<int64_t>(plans[t].unique_ids.size());
      K* unique_dst = nullptr;
      TF_RETURN_IF_ERROR(AllocateTable(ctx, attrs, &unique_out, &rows_out, t, views[t],
                                       num_unique[t], &unique_dst, &rows[t], &summed[t],
                                       &dense[t]));
      if (dense[t] == nullptr) {
        std::copy(plans[t].unique_ids.begin(), plans[t].unique_ids.end(), unique_dst);
      }
    }
    // Gradient rows: work items are (table, range of unique ids), each
    // table split in as many pieces as keep every thread busy. Each item
    // scans its table's ids once.
    struct Chunk {
      int table;
      int64_t u0, u1;
    };
    const int64_t pieces = (2 * threads + n - 1) / std::max(n, 1);
    std::vector<Chunk> chunks;
    for (int t = 0; t < n; ++t) {
      const int64_t step = std::max<int64_t>(1, (num_unique[t] + pieces - 1) / pieces);
      for (int64_t u = 0; u < num_unique[t]; u += step) {
        chunks.push_back({t, u, std::min(num_unique[t], u + step)});
      }
    }
    ParallelFor(ctx, static_cast<int64_t>(chunks.size()),
                (total_nnz / std::max<int64_t>(1, n) + 1) * (max_dim + 4) * 2,
                [&](int64_t c0, int64_t c1) {
                  for (int64_t c = c0; c < c1; ++c) {
                    const Chunk& k = chunks[c];
                    core::LookupBackward(views[k.table], plans[k.table], nullptr,
                                         grads[k.table], k.u0, k.u1, rows[k.table]);
                  }
                });
    for (int t = 0; t < n; ++t) {
      if (dense[t] != nullptr) PlaceDenseRows(views[t], plans[t].unique_ids, rows[t], dense[t]);
    }
    return OkStatus();
  }
};

namespace {

#define SOK_REGISTER_LOOKUP(T, K)                                          \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookup")                           \
                              .Device(::tensorflow::DEVICE_CPU)            \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<K>("Tindices"),              \
                          FusedLookupOp<CpuDevice, T, K>);                            \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookupGrad")                       \
                              .Device(::tensorflow::DEVICE_CPU)            \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<K>("Tindices"),              \
                          FusedLookupGradOp<CpuDevice, T, K>);

#define SOK_REGISTER_LOOKUP_ALL_INDICES(T) \
  SOK_REGISTER_LOOKUP(T, int32_t) SOK_REGISTER_LOOKUP(T, TfInt64)

SOK_REGISTER_LOOKUP_ALL_INDICES(float)
SOK_REGISTER_LOOKUP_ALL_INDICES(Eigen::half)
SOK_REGISTER_LOOKUP_ALL_INDICES(::tensorflow::bfloat16)

#undef SOK_REGISTER_LOOKUP_ALL_INDICES
#undef SOK_REGISTER_LOOKUP

}  // namespace
}  // namespace lookup_kernels
}  // namespace sok_graph
