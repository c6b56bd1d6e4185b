// CPU kernels of the fused lookup: validation, allocation and threading
// around the numeric code in tf_ops/lookup/core/lookup.h.
#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tf_ops/lookup/kernels/lookup_tables.h"
#include "compat/tf_compat.h"
#include "tf_ops/lookup/core/lookup.h"
#include "tf_ops/lookup/kernels/lookup_args.h"

namespace sok_graph {
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

template <typename T, typename K>
class FusedLookupBase : public OpKernel {
 public:
  explicit FusedLookupBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
  }

 protected:
  std::string TableName(int t) const { return attrs_.TableName(t); }

  // Checks the shapes and row_splits of every table and describes them as
  // TableViews. Ids are range-checked by the passes that read them (CheckIds).
  // Variables among the params stay read-locked while `params` lives. A
  // table given one id per sample (an empty row_splits, where the op takes
  // it) reads its splits 0, 1, ..., nnz from `implied_splits`, kept by the
  // caller as long as the views.
  Status ReadTables(OpKernelContext* ctx, TableInputs* params,
                    std::vector<core::TableView<T, K>>* views, std::vector<int64_t>* nnz,
                    std::vector<std::vector<int64_t>>* implied_splits = nullptr) {
    OpInputList ids, splits, weights;
    TF_RETURN_IF_ERROR(params->Read(ctx, "params", attrs_.num_tables,
                                    [this](int t) { return this->TableName(t); }));
    TF_RETURN_IF_ERROR(ctx->input_list("ids", &ids));
    TF_RETURN_IF_ERROR(ctx->input_list("row_splits", &splits));
    TF_RETURN_IF_ERROR(ctx->input_list("weights", &weights));
    views->assign(attrs_.num_tables, core::TableView<T, K>());
    nnz->assign(attrs_.num_tables, 0);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const Tensor& p = (*params)[t];
      const Tensor& i = ids[t];
      const Tensor& s = splits[t];
      TF_RETURN_IF_ERROR(attrs_.CheckTable(t, p, ::tensorflow::DataTypeToEnum<T>::v(), i, s,
                                           weights[t]));
      core::TableView<T, K>& v = (*views)[t];
      v.params = p.flat<T>().data();
      v.rows = p.dim_size(0);
      v.dim = p.dim_size(1);
      v.ids = i.flat<K>().data();
      if (attrs_.OneIdPerSample(s)) {
        if (implied_splits == nullptr) {
          return ::tensorflow::errors::Internal("row_splits of ", TableName(t),
                                                " is empty, which this op does not take");
        }
        implied_splits->resize(attrs_.num_tables);
        std::vector<int64_t>& made = (*implied_splits)[t];
        made.resize(static_cast<size_t>(i.NumElements()) + 1);
        for (size_t b = 0; b < made.size(); ++b) made[b] = static_cast<int64_t>(b);
        v.row_splits = made.data();
        v.batch = i.NumElements();
      } else {
        v.row_splits = reinterpret_cast<const int64_t*>(s.flat<TfInt64>().data());
        v.batch = s.NumElements() - 1;
      }
      v.weights = attrs_.weighted[t] ? weights[t].flat<T>().data() : nullptr;
      v.combiner = attrs_.combiners[t];
      v.max_norm = attrs_.max_norms[t];
      (*nnz)[t] = i.NumElements();
    }
    return OkStatus();
  }

  // Per-table first positions of bad ids, found by the passes that read ids
  // anyway (the forward pass, the backward's unique step).
  struct BadIds {
    explicit BadIds(int n) : first(n) {
      for (auto& f : first) f.store(kNoProblem);
    }
    void Record(size_t table, int64_t position) {
      if (position >= 0) AtomicMin(&first[table], position);
    }
    std::vector<std::atomic<int64_t>> first;
  };

  // The error for the first table with a bad id, if any.
  Status CheckIds(const BadIds& bad, const std::vector<core::TableView<T, K>>& views) const {
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const int64_t j = bad.first[t].load();
      if (j == kNoProblem) continue;
      return attrs_.BadId(t, static_cast<int64_t>(views[t].ids[j]), j, views[t].rows);
    }
    return OkStatus();
  }

  static constexpr int64_t kNoProblem = INT64_MAX;
  FusedLookupAttrs attrs_;
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

template <typename T, typename K>
class FusedLookupOp : public FusedLookupBase<T, K> {
 public:
  using FusedLookupBase<T, K>::FusedLookupBase;

  void Compute(OpKernelContext* ctx) override {
    TableInputs params;
    std::vector<core::TableView<T, K>> views;
    std::vector<int64_t> nnz;
    OP_REQUIRES_OK(ctx, this->ReadTables(ctx, &params, &views, &nnz));
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("embeddings", &outputs));
    std::vector<T*> out(views.size());
    std::vector<int64_t> batch(views.size());
    int64_t max_dim = 1;
    for (size_t t = 0; t < views.size(); ++t) {
      Tensor* o = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(t, TensorShape({views[t].batch, views[t].dim}), &o));
      out[t] = o->flat<T>().data();
      batch[t] = views[t].batch;
      max_dim = std::max(max_dim, views[t].dim);
    }
    typename FusedLookupBase<T, K>::BadIds bad(this->attrs_.num_tables);
    ForEachAcrossTables(ctx, batch, CostPerSample(nnz, batch, max_dim),
                        [&](size_t t, int64_t b0, int64_t b1) {
                          std::vector<float> acc(static_cast<size_t>(views[t].dim) + 1);
                          bad.Record(t, core::LookupForward(views[t], b0, b1, out[t], acc.data()));
                        });
    OP_REQUIRES_OK(ctx, this->CheckIds(bad, views));
    // Everything was checked above: the check output says so.
    const int n = this->attrs_.num_tables;
    Tensor* checks = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output("checks",
                                             TensorShape({FusedLookupAttrs::kCheckRows, n}),
                                             &checks));
    int64_t* c = reinterpret_cast<int64_t*>(checks->flat<TfInt64>().data());
    for (int t = 0; t < n; ++t) {
      FusedLookupAttrs::ClearColumn(c, n, t, views[t].rows, nnz[t]);
    }
  }
};

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

template <typename T, typename K>
class FusedLookupGradOp : public FusedLookupBase<T, K> {
 public:
  explicit FusedLookupGradOp(OpKernelConstruction* ctx) : FusedLookupBase<T, K>(ctx) {
    this->attrs_.one_id_splits = true;
  }

  void Compute(OpKernelContext* ctx) override {
    TableInputs params;
    std::vector<core::TableView<T, K>> views;
    std::vector<int64_t> nnz;
    std::vector<std::vector<int64_t>> implied_splits;
    OP_REQUIRES_OK(ctx, this->ReadTables(ctx, &params, &views, &nnz, &implied_splits));
    const int n = this->attrs_.num_tables;
    OpInputList grads_in;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads_in));
    std::vector<const T*> grads(n);
    int64_t max_dim = 1;
    for (int t = 0; t < n; ++t) {
      const Tensor& g = grads_in[t];
      OP_REQUIRES_OK(ctx, this->attrs_.CheckGrads(t, g, views[t].batch, views[t].dim));
      grads[t] = g.flat<T>().data();
      max_dim = std::max(max_dim, views[t].dim);
    }

    int64_t total_nnz = 0;
    for (int64_t c : nnz) total_nnz += c;
    const int64_t threads =
        ctx->device()->tensorflow_cpu_worker_threads()->workers->NumThreads();
    // Enough tables to keep every thread busy: each table is summed whole,
    // by one thread, in one pass. Fewer: a plan per table first, then each
    // table's rows split over the threads.
    if (n >= 2 * threads) {
      SumWholeTables(ctx, views, nnz, grads, total_nnz, max_dim);
    } else {
      SumSplitTables(ctx, views, nnz, grads, total_nnz, max_dim, threads);
    }
  }

 private:
  using View = core::TableView<T, K>;

  // Allocates table t's outputs for `num_unique` rows: its unique ids and
  // rows, or (a dense table) its [rows, dim] gradient. `*rows` is where the
  // summed rows go: the output, or a temporary for a dense table.
  Status AllocateTable(OpKernelContext* ctx, OpOutputList* unique_out, OpOutputList* rows_out,
                       int t, const View& v, int64_t num_unique, K** unique, T** rows,
                       Tensor* summed, Tensor** dense) {
    TF_RETURN_IF_ERROR(AllocateUniqueIds(unique_out, t, num_unique, unique));
    *dense = nullptr;
    if (this->attrs_.dense_grads[t]) {
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
  Status AllocateUniqueIds(OpOutputList* unique_out, int t, int64_t num_unique, K** unique) {
    Tensor* u = nullptr;
    const bool is_dense = this->attrs_.dense_grads[t];
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

  void SumWholeTables(OpKernelContext* ctx, const std::vector<View>& views,
                      const std::vector<int64_t>& nnz, const std::vector<const T*>& grads,
                      int64_t total_nnz, int64_t max_dim) {
    const int n = this->attrs_.num_tables;
    // Room for a row per position (a table has at most nnz unique ids);
    // only the rows summed are touched. Float tables hand the first rows on
    // as their output, with no copy.
    std::vector<Tensor> sums(n);
    for (int t = 0; t < n; ++t) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                             TensorShape({nnz[t], views[t].dim}), &sums[t]));
    }
    std::vector<std::vector<K>> unique(n);
    typename FusedLookupBase<T, K>::BadIds bad(n);
    const int64_t per_table = (total_nnz / n + 1) * (max_dim + 16) * 2;
    ParallelFor(ctx, n, per_table, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        bad.Record(t, core::SumGradientRows(views[t], grads[t], DenseUniqueScratch(views[t].rows),
                                            &unique[t], sums[t].flat<float>().data()));
      }
    });
    OP_REQUIRES_OK(ctx, this->CheckIds(bad, views));

    OpOutputList unique_out, rows_out;
    OP_REQUIRES_OK(ctx, ctx->output_list("unique_ids", &unique_out));
    OP_REQUIRES_OK(ctx, ctx->output_list("grad_rows", &rows_out));
    constexpr bool kFloat = std::is_same<T, float>::value;
    std::vector<K*> unique_dst(n);
    std::vector<T*> rows_dst(n, nullptr);  // rows to convert from float
    std::vector<Tensor*> dense(n, nullptr);
    for (int t = 0; t < n; ++t) {
      const int64_t num_unique = static_cast<int64_t>(unique[t].size());
      OP_REQUIRES_OK(ctx, AllocateUniqueIds(&unique_out, t, num_unique, &unique_dst[t]));
      if (this->attrs_.dense_grads[t]) {
        OP_REQUIRES_OK(ctx, rows_out.allocate(
                                t, TensorShape({views[t].rows, views[t].dim}), &dense[t]));
      } else if (kFloat) {
        rows_out.set(t, sums[t].Slice(0, num_unique));
      } else {
        Tensor* r = nullptr;
        OP_REQUIRES_OK(ctx, rows_out.allocate(t, TensorShape({num_unique, views[t].dim}), &r));
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
  }

  void SumSplitTables(OpKernelContext* ctx, const std::vector<View>& views,
                      const std::vector<int64_t>& nnz, const std::vector<const T*>& grads,
                      int64_t total_nnz, int64_t max_dim, int64_t threads) {
    const int n = this->attrs_.num_tables;
    // Unique ids and each position's unique index: one table per unit of work.
    std::vector<core::BackwardPlan<K>> plans(n);
    typename FusedLookupBase<T, K>::BadIds bad(n);
    ParallelFor(ctx, n, 60 * (total_nnz / std::max(n, 1) + 1), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        bad.Record(t, core::PlanBackward(views[t], nnz[t], &plans[t],
                                         DenseUniqueScratch(views[t].rows)));
      }
    });
    OP_REQUIRES_OK(ctx, this->CheckIds(bad, views));

    OpOutputList unique_out, rows_out;
    OP_REQUIRES_OK(ctx, ctx->output_list("unique_ids", &unique_out));
    OP_REQUIRES_OK(ctx, ctx->output_list("grad_rows", &rows_out));
    std::vector<T*> rows(n);
    std::vector<int64_t> num_unique(n);
    std::vector<Tensor> summed(n);
    std::vector<Tensor*> dense(n);
    for (int t = 0; t < n; ++t) {
      num_unique[t] = static_cast<int64_t>(plans[t].unique_ids.size());
      K* unique_dst = nullptr;
      OP_REQUIRES_OK(ctx, AllocateTable(ctx, &unique_out, &rows_out, t, views[t], num_unique[t],
                                        &unique_dst, &rows[t], &summed[t], &dense[t]));
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
  }
};

#define SOK_REGISTER_LOOKUP(T, K)                                          \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookup")                           \
                              .Device(::tensorflow::DEVICE_CPU)            \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<K>("Tindices"),              \
                          FusedLookupOp<T, K>);                            \
  REGISTER_KERNEL_BUILDER(Name("SokFusedLookupGrad")                       \
                              .Device(::tensorflow::DEVICE_CPU)            \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<K>("Tindices"),              \
                          FusedLookupGradOp<T, K>);

#define SOK_REGISTER_LOOKUP_ALL_INDICES(T) \
  SOK_REGISTER_LOOKUP(T, int32_t) SOK_REGISTER_LOOKUP(T, TfInt64)

SOK_REGISTER_LOOKUP_ALL_INDICES(float)
SOK_REGISTER_LOOKUP_ALL_INDICES(Eigen::half)
SOK_REGISTER_LOOKUP_ALL_INDICES(::tensorflow::bfloat16)

#undef SOK_REGISTER_LOOKUP_ALL_INDICES
#undef SOK_REGISTER_LOOKUP

}  // namespace
}  // namespace sok_graph
