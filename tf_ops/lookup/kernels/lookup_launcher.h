// C launchers of the lookup family's CUDA kernels (plain C: the .cu compiles
// without TensorFlow headers, and tests/gpu calls it through ctypes).
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_LAUNCHER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One table of a fused lookup, all pointers in device memory. Layout is
// part of the C interface (tests/gpu builds it with ctypes): 88 bytes.
typedef struct {
  const float* params;        // [rows, dim]
  const void* ids;            // [nnz] int32 or int64 (id_bytes 4 or 8)
  const int64_t* row_splits;  // [batch + 1]; read clamped to [0, nnz], checked on the device.
                              // The gradient's: or NULL, one id per sample (batch = nnz, no
                              // weights, else the plan returns cudaErrorInvalidValue); the
                              // forward needs them
  const float* weights;       // [nnz] or NULL (all 1)
  const float* clip;          // [nnz] max_norm factors (sok_lookup_clip_factors) or NULL
  float* out;                 // [batch, dim]
  int64_t batch;
  int64_t rows;               // ids must lie in [0, rows)
  int64_t nnz;                // number of ids (row_splits must end there)
  int32_t dim;
  int32_t combiner;  // 0 sum, 1 mean, 2 sqrtn
  int32_t id_bytes;  // 4 or 8
  float max_norm;    // <= 0: no clipping
} SokLookupTable;

// out of every table: the combined rows of each sample, a warp or a team of
// lanes per sample, all tables in one launch. sample_offsets [num_tables + 1] (device) is the
// prefix sum of the tables' batch sizes; total_samples its last entry.
// Deterministic: ids of a sample are added in order. `vectorized` (16-byte
// loads) needs every dim % 4 == 0 and params/out 16-byte aligned: the caller
// checks; 2 is `vectorized` for batches whose samples average at most one id
// (total nnz <= total_samples): a kernel that takes one-id samples several
// at a time, the same results bit for bit
// (sok_lookup_vectorized_kind). id_bytes (4 or 8) is the width of every table's ids (their
// id_bytes). Ids outside [0, rows) are never read through: they add nothing,
// and first_bad[t] (device, num_tables int64 the caller sets to INT64_MAX;
// may be NULL) receives the smallest such position of table t, for the
// caller to read back and report. lanes_per_sample: 32 (a warp per
// sample: long samples, any layout) or 4, 8 or 16 (teams of that many lanes,
// 32 / lanes samples per warp: short samples; vectorized only); see
// sok_lookup_lanes_per_sample. Returns a cudaError_t (cudaErrorInvalidValue for
// other lane counts, or teams without `vectorized`).
int sok_lookup_forward_f32(const SokLookupTable* tables, const int64_t* sample_offsets,
                           int num_tables, int64_t total_samples, int vectorized,
                           int id_bytes, int lanes_per_sample, int64_t* first_bad,
                           void* stream);

// The `vectorized` argument of a forward launch: 2 (one-id samples several
// at a time) when the samples average at most one id, else 1.
static inline int sok_lookup_vectorized_kind(int64_t total_nnz, int64_t total_samples) {
  return total_nnz <= total_samples ? 2 : 1;
}

// The lanes per sample for a forward launch, from what the host knows
// without reading the device: teams while samples average at most 8 ids (a
// warp per sample then leaves most lanes idle: at dim 16 and one id, 4 of
// 32 work), as many lanes as the widest row has float4 chunks (at least 4,
// at most 16); else a warp per sample.
static inline int sok_lookup_lanes_per_sample(int vectorized, int32_t max_dim, int64_t total_nnz,
                                              int64_t total_samples) {
  if (!vectorized || total_samples <= 0 || total_nnz > 8 * total_samples) return 32;
  int lanes = 4;
  while (lanes < max_dim / 4 && lanes < 32) lanes *= 2;
  return lanes <= 16 ? lanes : 32;
}

// The input check of a lookup, in device memory: int64 [SOK_LOOKUP_CHECK_ROWS,
// num_tables], column t for table t. Rows: 0 the first position of an id
// outside [0, rows) (INT64_MAX if none), 1 that id, 2 rows, 3 the first
// row_splits problem as 2 * k for "row_splits[k] is not 0 (k = 0) or is
// below row_splits[k - 1]", 2 * batch + 1 for "does not end at nnz"
// (INT64_MAX if none), 4 row_splits[k], 5 row_splits[k - 1], 6 nnz. The
// caller sets rows 0 and 3 to INT64_MAX and 2 and 6; the kernels fill the rest.
#define SOK_LOOKUP_CHECK_ROWS 7

// Row 3 of `checks` for every table (device descriptors). One launch.
int sok_lookup_check_splits(const SokLookupTable* tables, int num_tables, int64_t max_batch,
                            int64_t* checks, void* stream);
// Rows 1, 4 and 5 of `checks` from rows 0 and 3 (after the kernels that
// fill those). One launch.
int sok_lookup_fill_check_values(const SokLookupTable* tables, int num_tables, int64_t* checks,
                                 void* stream);

// clip[j] <- tf.clip_by_norm's factor max_norm / max(||params[ids[j]]||,
// max_norm) for the nnz ids of one table (host struct, device pointers;
// max_norm > 0). Bad ids get 0 and are reported in *first_bad as above.
int sok_lookup_clip_factors(const SokLookupTable* table, int64_t nnz, float* clip,
                            int64_t* first_bad, void* stream);

// Where the gradient of one table goes (device pointers). 32 bytes.
typedef struct {
  const float* grads;  // [batch, dim]: the gradient of the table's output
  void* unique_ids;    // [distinct ids], the table's id type; unused when dense
  float* grad_rows;    // [distinct ids, dim]; [rows, dim] when dense
  int32_t dense;       // 1: each distinct id's row goes to row id of grad_rows, which the
                       // caller has zeroed (nothing needs the count of distinct ids)
  int32_t path;        // callers pass 0; sok_lookup_backward_dense_unordered writes (on the
                       // device) which of its kernels sums the table
} SokLookupGradTable;

// The gradient of every table of a lookup, as the CPU kernel computes it:
// per table, its distinct ids in order of first appearance, and for each
// the sum over its occurrences j (sample b) of weight_j * combiner factor_b
// * grads[b, :], in position order, then through max_norm's clip. All
// tables go through one launch sequence. Two calls around one host
// synchronisation, each given the descriptors twice: `host_tables` (host
// memory: the sizes, from which both calls lay out `temp` alike) and
// `tables` (the same, in device memory; `out` and `clip` unused):
//   plan: sorts the ids of all tables; num_unique[t] (device int64
//     [num_tables]) <- table t's number of distinct ids (num_unique NULL:
//     every table's gradient is dense, and the plan leaves out what only
//     sparse rows need: their order of first appearance); first_bad[t]
//     (device, INT64_MAX on entry) <- table t's first position of an id
//     outside [0, rows). Call with temp == NULL for *temp_bytes first.
//   rows: with the same temp, writes each table's unique_ids and grad_rows
//     (outs: device SokLookupGradTable [num_tables], sized by num_unique, or
//     by rows for a dense table); only valid when no id was bad and every
//     table's row_splits were valid. `checks` (device, the lookup's check
//     [SOK_LOOKUP_CHECK_ROWS, num_tables] with rows 0 and 3 filled, or
//     NULL): a dense table whose column records a problem gets no rows —
//     its gradient stays zero when the caller does not wait for the check.
// The sort looks at as many bits as the largest table's rows and the
// table count need. Returns a cudaError_t (cudaErrorInvalidValue for more
// than 65535 tables or 2^31 - 1 ids in all).
int sok_lookup_backward_plan(const SokLookupTable* host_tables, const SokLookupTable* tables,
                             int num_tables, int64_t* num_unique, int64_t* first_bad, void* temp,
                             size_t* temp_bytes, void* stream);
int sok_lookup_backward_rows(const SokLookupTable* host_tables, const SokLookupTable* tables,
                             int num_tables, const SokLookupGradTable* outs,
                             const int64_t* checks, void* temp, void* stream);

// The gradient of every table of a lookup when every table's is dense
// (outs[t].dense, grad_rows [rows, dim] zeroed by the caller) and none
// clips (max_norm <= 0): the same sums as plan + rows, added with float
// atomics in no fixed order, so they may differ from those in the last
// bits and from one call to the next (TensorFlow's GPU scatter-add and
// unsorted segment sum behave so too). No sort, no scratch, one pass over
// the gradient rows in order. `checks` (device, the lookup's check
// [SOK_LOOKUP_CHECK_ROWS, num_tables], rows 0 and 3 as described above,
// row 3 already filled): row 0 receives each table's first position of an
// id outside [0, rows), and a table with a bad id or malformed row_splits
// gets no rows. Returns a cudaError_t (cudaErrorInvalidValue for a
// clipping table, `checks` NULL, more than 65535 tables or 2^31 - 1 ids in
// all, or a table without row_splits that is not one unweighted id per
// sample).
// In a build that takes them (sok_lookup_backward_dense_slices_built), a
// table of one id per sample given without row_splits whose rows are
// few for its ids (rows x min(dim, 4) floats fit a block's shared memory,
// and the ids outnumber the rows many times over: the DemoModel's 8.2M ids
// on 8192 rows) is summed per SM in shared memory, a slice of columns per
// block, and added to grad_rows once per block. A table of one id per
// sample whose ids often repeat (a hot id: a probe of a few stretches of
// its ids decides on the device) has the samples of each 32 that share an
// id summed first, then added with one atomic per column. The launcher
// writes outs[t].path on the device (outs is its own).
int sok_lookup_backward_dense_unordered(const SokLookupTable* host_tables,
                                        const SokLookupTable* tables, int num_tables,
                                        SokLookupGradTable* outs, int64_t* checks,
                                        void* stream);
// The same without the shared-memory path (global atomics for every table):
// for the checks and timings that compare the two.
int sok_lookup_backward_dense_atomics(const SokLookupTable* host_tables,
                                      const SokLookupTable* tables, int num_tables,
                                      SokLookupGradTable* outs, int64_t* checks,
                                      void* stream);
// *width <- the columns per shared-memory slice that the unordered gradient
// gives table *host_table on the current device (0: global atomics).
// Returns a cudaError_t.
int sok_lookup_backward_dense_slice_width(const SokLookupTable* host_table, int* width);
// 1 where this build takes the shared-memory slices at all (nvcc's), 0
// where every table takes global atomics (clang's, the package's: its
// slices were slower than its atomics on every shape timed).
int sok_lookup_backward_dense_slices_built();

// Backward core: the distinct ids of `ids` [n] (ascending) and, for each, the
// sum of the rows of `grads` [n, dim] at its positions, added in position
// order (deterministic). Outputs unique_ids [n] and summed [n, dim] (only
// the first *num_unique rows are written; num_unique is a device int64).
// key_bits: when every id lies in [0, 2^key_bits) (a static table of at
// most 2^key_bits rows), the sort looks at those bits only; <= 0 or >= 64
// for arbitrary int64 ids (dynamic tables). Call first with temp == NULL to
// get *temp_bytes, then with that much device scratch. Returns a cudaError_t.
int sok_unique_segment_sum_f32(const int64_t* ids, const float* grads, int64_t n, int dim,
                               int key_bits, int64_t* unique_ids, float* summed,
                               int64_t* num_unique, void* temp, size_t* temp_bytes,
                               void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_LAUNCHER_H_
