// C launcher of SokSparseApply's CUDA kernel (plain C: the .cu compiles
// without TensorFlow headers).
#ifndef SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_LAUNCHER_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One table of a fused sparse update, all pointers in device memory.
typedef struct {
  float* var;            // [rows, dim]
  float* slot0;          // [rows, dim] or NULL (as the algorithm has slots)
  float* slot1;          // [rows, dim] or NULL
  float* slot2;          // [rows, dim] or NULL
  const void* indices;   // [count] int32 or int64 (index_bytes 4 or 8), distinct
  const float* grads;    // [count, dim]
  int64_t rows;
  int64_t count;
  int32_t dim;
  int32_t index_bytes;
} SokSparseApplyTable;

// Every table's rows indices[i] updated from grads[i] by `algorithm`
// (a core::SparseAlgorithm of tf_ops/optimizer/core/sparse_apply.h), one
// warp per row, all tables in one launch.
// row_offsets [num_tables + 1] (device) is the prefix sum of the tables'
// counts, total_rows its last entry. hyper [kNumHyper] and step (the
// 1-based step of Adam's and Adamax's bias correction) are device memory: nothing waits for the host. Indices
// outside [0, rows) are skipped (the op's caller passes checked ones).
// Returns a cudaError_t.
int sok_sparse_apply_f32(const SokSparseApplyTable* tables, const int64_t* row_offsets,
                         int num_tables, int64_t total_rows, int algorithm, int formulas,
                         int nesterov, const float* hyper, const int64_t* step, void* stream);

// The same update on n contiguous rows [n, dim]: rows (and slot0..slot2 as
// the algorithm has them, else NULL) from grads, element by element; for
// the rows a dynamic table's update gathers into scratch. hyper and step in
// device memory, as above. Returns a cudaError_t.
int sok_dense_apply_f32(float* rows, float* slot0, float* slot1, float* slot2,
                        const float* grads, int64_t n,
                        int64_t dim, int algorithm, int formulas, int nesterov, const float* hyper,
                        const int64_t* step, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_LAUNCHER_H_
