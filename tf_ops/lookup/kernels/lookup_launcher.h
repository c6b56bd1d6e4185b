// C launchers of the lookup family's CUDA kernels (plain C: the .cu compiles
// without TensorFlow headers, and tests/gpu calls it through ctypes).
#ifndef SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_LOOKUP_KERNELS_LOOKUP_LAUNCHER_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One table of a fused forward, all pointers in device memory. Layout is
// part of the C interface (tests/gpu builds it with numpy): 56 bytes.
typedef struct {
  const float* params;        // [rows, dim]
  const int64_t* ids;         // [nnz], each in [0, rows): checked by the caller
  const int64_t* row_splits;  // [batch + 1]
  const float* weights;       // [nnz] or NULL (all 1)
  float* out;                 // [batch, dim]
  int64_t batch;
  int32_t dim;
  int32_t combiner;  // 0 sum, 1 mean, 2 sqrtn
} SokLookupTable;

// out of every table: the combined rows of each sample, one warp per sample,
// all tables in one launch. sample_offsets [num_tables + 1] (device) is the
// prefix sum of the tables' batch sizes; total_samples its last entry.
// Deterministic: ids of a sample are added in order. `vectorized` (16-byte
// loads) needs every dim % 4 == 0 and params/out 16-byte aligned: the caller
// checks. Returns a cudaError_t.
int sok_lookup_forward_f32(const SokLookupTable* tables, const int64_t* sample_offsets,
                           int num_tables, int64_t total_samples, int vectorized,
                           void* stream);

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
