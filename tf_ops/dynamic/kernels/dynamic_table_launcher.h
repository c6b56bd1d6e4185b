// C launchers of the GPU hash table behind dynamic embeddings (plain C: the
// .cu compiles without TensorFlow headers, and tests/gpu calls it through
// ctypes). Same semantics as the CPU table (tf_ops/dynamic/core):
//
//   - int64 keys (every value, INT64_MIN included), float rows of any dim;
//   - a new key's row comes from the seeded initializer of
//     core/initializer.h, a pure function of (seed, key, column), so the GPU
//     and the CPU table give a key the same initial row;
//   - per key: the time of its last use or update, and its use count;
//   - a bound on the number of rows, kept by evicting the least recently
//     (LRU) or least frequently (LFU, ties by age, then key) used keys; keys
//     used by the call that needs room are never evicted, and a call with
//     more distinct keys than the bound fails before changing anything;
//   - within one call, a key repeated in the batch is inserted once, and
//     repeated updates apply in batch order (scatter add sums in that order,
//     update and import keep the last occurrence), so results are
//     deterministic.
//
// Layout: open addressing with linear probing over 2^k slots in device
// memory; a slot's row, timestamp and count live at the slot's index, so a
// find costs one probe sequence and one row read. Concurrent threads of one
// call insert with compare-and-swap on the key. Removed keys leave
// tombstones, which inserts reuse when a call has to make room and a rehash
// clears. Rows take (2^k + 2) * dim floats: a table starts with slots for
// its init_capacity and grows at most half full; a bounded one stops at
// between 4/3 and 8/3 rows per key at its bound (GPU tables trade memory
// for one random read per find).
// Rows past the config's hbm_bytes live in mapped pinned host memory; keys,
// times and counts stay in device memory. Such a table maps slots to rows
// and every 16 training lookups (more past 2^25 slots) moves its most used
// rows (by use count) into device memory (dynamic_table_tiers.cu); values
// never change by it. A bounded one holds max_rows rows (+ 3), taken by
// its slots from a pool (dynamic_table_internal.cuh, RowSpace).
//
// Every function takes the stream to run on (a cudaStream_t; NULL for the
// default stream) and returns 0, a cudaError_t (> 0), or a SOK_GPU_TABLE_*
// code (< 0). Only calls that must make room or grow the table, and the size
// query, wait for the stream; finds never do.
#ifndef SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_TABLE_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_TABLE_LAUNCHER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The batch has more distinct keys than the table may hold (result->distinct_keys).
#define SOK_GPU_TABLE_TOO_MANY_KEYS (-1)
// A bad argument (null table, negative count, dim < 1, unknown mode or kind).
#define SOK_GPU_TABLE_BAD_ARGUMENT (-2)
// No free slot was found: an internal invariant broke. Never expected.
// Inserting calls do not wait for the device to learn it: the call after
// the one that broke it reports it (and every later one, until a clear).
#define SOK_GPU_TABLE_FULL (-3)
// The rows a table keeps in host memory (past its device-memory budget)
// could not be allocated as pinned host memory: the host has too little
// memory, or the process may lock too little of it.
#define SOK_GPU_TABLE_HOST_MEMORY (-4)

// Size limits: a table has at most 2^30 slots (CUB counts a call's items,
// slots included, in int). A bounded table (max_rows) keeps at most 3/4 of
// its slots occupied, so it holds at most SOK_GPU_TABLE_MAX_ROWS rows; an
// unbounded one stays at most half full as it grows, so its initial
// capacity, and its size, are at most SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS (a
// call that would pass that fails with SOK_GPU_TABLE_TOO_MANY_KEYS).
#define SOK_GPU_TABLE_MAX_SLOTS (1LL << 30)
#define SOK_GPU_TABLE_MAX_ROWS (3LL << 28)
#define SOK_GPU_TABLE_MAX_UNBOUNDED_ROWS (1LL << 29)

// Initializer kinds, in the order of core::InitKind.
#define SOK_INIT_NORMAL 0
#define SOK_INIT_TRUNCATED_NORMAL 1
#define SOK_INIT_UNIFORM 2
#define SOK_INIT_ZEROS 3
#define SOK_INIT_CONSTANT 4

// Layout is part of the C interface (tests/gpu builds it with ctypes): 72 bytes.
typedef struct {
  int64_t dim;
  int64_t init_capacity;  // keys to make room for up front
  int64_t max_rows;       // 0: unbounded; else evict to stay within
  int32_t eviction;       // 0 LRU, 1 LFU
  int32_t init_kind;      // SOK_INIT_*
  float mean, stddev;     // normal, truncated normal
  float minval, maxval;   // uniform [minval, maxval)
  float value;            // constant
  int32_t reserved;
  uint64_t seed;
  // Bytes of row storage in device memory: -1 for every row; else the rows
  // past this budget live in mapped pinned host memory, which the kernels
  // read and write in place (a table larger than the GPU's memory).
  int64_t hbm_bytes;
} SokGpuTableConfig;

typedef struct {
  int64_t num_evicted;    // keys evicted to make room
  int64_t distinct_keys;  // distinct keys of the batch, when counted (else -1)
} SokGpuTableResult;

// Where a table's device memory (storage and scratch) comes from. The
// TensorFlow kernels pass the device's allocator, so TensorFlow's memory
// settings (memory growth, logical-device limits, get_memory_info) cover the
// tables; `alloc` returns NULL when out of memory, `free` takes what `alloc`
// gave. A NULL allocator (or NULL functions) means cudaMalloc / cudaFree.
typedef struct {
  void* (*alloc)(void* context, size_t bytes);
  void (*free)(void* context, void* ptr);
  void* context;
} SokGpuAllocator;

typedef struct SokGpuTable SokGpuTable;

// The allocator is copied; its context must outlive the table.
int sok_gpu_table_create(const SokGpuTableConfig* config, const SokGpuAllocator* allocator,
                         void* stream, SokGpuTable** table);
// Frees the table's device memory (waits for the stream first).
int sok_gpu_table_destroy(SokGpuTable* table, void* stream);
// Empties the table (keeps its memory).
int sok_gpu_table_clear(SokGpuTable* table, void* stream);

// *size <- number of keys; *slots <- slots of the index (2^k). Waits for the stream.
int sok_gpu_table_size(SokGpuTable* table, int64_t* size, int64_t* slots, void* stream);
// Largest number of keys the table may hold.
int64_t sok_gpu_table_row_limit(const SokGpuTable* table);
int64_t sok_gpu_table_evicted_total(const SokGpuTable* table);
// Bytes of device memory the table holds.
int64_t sok_gpu_table_memory_bytes(const SokGpuTable* table);

// Inference lookup: out[i] <- row of keys[i] ([n, dim]); missing keys get
// default_row (dim floats in device memory; NULL: zeros) and found[i] = 0.
// Nothing is inserted or touched. found may be NULL. No host synchronisation.
int sok_gpu_table_find(SokGpuTable* table, const int64_t* keys, int64_t n,
                       const float* default_row, float* out, uint8_t* found, void* stream);

// Training lookup: out[i] <- row of keys[i], inserting missing keys with
// their initial rows (evicting as needed). Every occurrence counts as a use
// at time `now` (the caller's clock; later calls pass larger values).
// evicted_keys (device, n entries, may be NULL) receives the evicted keys,
// evicted_rows (device, [n, dim], may be NULL) their rows, in the same order.
int sok_gpu_table_find_or_insert(SokGpuTable* table, const int64_t* keys, int64_t n,
                                 int64_t now, float* out, int64_t* evicted_keys,
                                 float* evicted_rows, SokGpuTableResult* result, void* stream);

// As sok_gpu_table_find_or_insert without the rows, for the distinct keys
// [0, *count) of `keys` (count: a device int64, as unique leaves it; keys
// has room for max_n >= *count), each counted as one use: *n <- the count.
// Waits for the stream once, reading the count with what the insert must
// know (a bounded table), or before inserting (an unbounded one, which
// then waits again only to grow). A negative count does nothing but give
// *n. sok_gpu_table_gather_ensured then writes the rows; no call on the
// table may come between the two.
int sok_gpu_table_ensure_distinct(SokGpuTable* table, const int64_t* keys, const int64_t* count,
                                  int64_t max_n, int64_t now, int64_t* evicted_keys,
                                  SokGpuTableResult* result, int64_t* n, void* stream);
// out [n, dim] <- the rows of the n keys that sok_gpu_table_ensure_distinct
// made present.
int sok_gpu_table_gather_ensured(SokGpuTable* table, int64_t n, float* out, void* stream);

// rows [n, dim] applied to the rows of keys in batch order: mode 0 add,
// 1 subtract, 2 update (assign). Missing keys are inserted first (with their
// initial rows). Keys are marked updated at `now`; use counts do not change.
int sok_gpu_table_scatter(SokGpuTable* table, const int64_t* keys, int64_t n, const float* rows,
                          int mode, int64_t now, SokGpuTableResult* result, void* stream);

// Makes every key present as sok_gpu_table_scatter's insert does (a new key
// gets its initial row; present keys are marked updated at `now`, use
// counts do not change), writing the keys evicted to make room to
// evicted_keys (device, n entries, may be NULL) and their number to
// result->num_evicted. Waits for the stream when the table must make room.
int sok_gpu_table_insert_missing(SokGpuTable* table, const int64_t* keys, int64_t n, int64_t now,
                                 int64_t* evicted_keys, SokGpuTableResult* result, void* stream);

// As sok_gpu_table_scatter, for keys the caller knows are all in the table
// (a call made them present and sok_gpu_table_removals has not changed
// since): nothing is inserted, so no bound is checked and nothing waits. A
// key that is missing all the same is skipped and reported as
// SOK_GPU_TABLE_FULL by the next call that waits. distinct != 0: the keys
// are distinct too (as unique gives them), so the rows need no ordering.
int sok_gpu_table_scatter_present(SokGpuTable* table, const int64_t* keys, int64_t n,
                                  const float* rows, int mode, int distinct, int64_t now,
                                  void* stream);

// The optimizer's update in place, for distinct keys the caller knows are
// all in the table (as sok_gpu_table_scatter_present's): each key's row,
// and its rows in up to 3 slot tables (Adam's m and v, ...), updated by the
// formula of tf_ops/optimizer/core/sparse_apply.h with gradient row
// grads[i] ([n, dim]); hyper and step in device memory, as
// sok_dense_apply_f32 takes them. Each slot table's last call must have
// been a find-or-insert of these keys (its slots of the keys are what that
// call left). The rows are marked updated at `now`. No wait; a key missing
// all the same is skipped and reported as by sok_gpu_table_scatter_present.
int sok_gpu_table_apply_present(SokGpuTable* table, SokGpuTable* const* slot_tables,
                                int num_slot_tables, const int64_t* keys, int64_t n,
                                const float* grads, int algorithm, int formulas, int nesterov,
                                const float* hyper, const int64_t* step, int64_t now,
                                void* stream);

// How many calls so far may have taken keys out of the table (evictions,
// removes, clears). While it stays the same, every key a call made present
// is still there.
int64_t sok_gpu_table_removals(const SokGpuTable* table);

// Removes keys; *num_removed (device int64, may be NULL) <- how many were present.
int sok_gpu_table_remove(SokGpuTable* table, const int64_t* keys, int64_t n,
                         int64_t* num_removed, void* stream);

// Inserts or overwrites keys with rows [n, dim] and metadata: timestamps[i]
// and frequencies[i] (device, may be NULL: `now` and 0). The last
// occurrence of a repeated key wins. evicted_keys (device, n entries, may
// be NULL) receives the keys evicted to make room.
int sok_gpu_table_import(SokGpuTable* table, const int64_t* keys, int64_t n, const float* rows,
                         const int64_t* timestamps, const int64_t* frequencies, int64_t now,
                         int64_t* evicted_keys, SokGpuTableResult* result, void* stream);

// A table with rows in both tiers: moves its most used rows into device
// memory now (training lookups do it every 16 calls). No wait; a table with
// rows in one tier only has nothing to do.
int sok_gpu_table_rebalance(SokGpuTable* table, void* stream);

// tiers[i] (device, n entries) <- where the row of keys[i] lives: 0 the key
// is missing, 1 device memory, 2 host memory. Nothing changes; no wait.
int sok_gpu_table_row_tiers(SokGpuTable* table, const int64_t* keys, int64_t n, uint8_t* tiers,
                            void* stream);

// An export chunk. A row's position is the number of rows before it in slot
// order (the table's export order); the chunk is the first `capacity` rows
// at positions >= offset whose timestamp is > updated_after (INT64_MIN:
// every row), written in that order into device buffers of `capacity`
// entries: keys, rows [capacity, dim], timestamps, frequencies (each may be
// NULL except keys when capacity > 0). counts (device int64 [2]):
// counts[0] <- how many rows at positions >= offset pass the filter (only
// the first `capacity` are written); counts[1] <- the position after the
// chunk's last row, written only when counts[0] >= capacity > 0 (otherwise
// the chunk reached the table's end). The CPU table's export
// (core::ExportEntries) counts positions the same way.
int sok_gpu_table_export(SokGpuTable* table, int64_t offset, int64_t updated_after, int64_t* keys,
                         float* rows, int64_t* timestamps, int64_t* frequencies, int64_t capacity,
                         int64_t* counts, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_DYNAMIC_KERNELS_DYNAMIC_TABLE_LAUNCHER_H_
