// Deterministic segment sums: positions are grouped by segment with a stable
// counting sort, then each segment is summed in increasing position order
// (in pieces, see SumSegments), so the result does not depend on how the
// work is split over threads.
// TF-independent; C++14.
#ifndef SOK_GRAPH_TF_OPS_UTIL_CORE_SEGMENT_SUM_H_
#define SOK_GRAPH_TF_OPS_UTIL_CORE_SEGMENT_SUM_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sok_graph {
namespace core {

// Positions grouped by segment: the positions of segment s are
// order[offsets[s]], ..., order[offsets[s + 1] - 1], in increasing order.
struct SegmentGroups {
  std::vector<int64_t> offsets;  // num_segments + 1
  std::vector<int64_t> order;    // positions with a segment id >= 0
};

// Segment ids < 0 are skipped (tf.math.unsorted_segment_sum drops them). The
// caller has checked that every id is < num_segments.
template <typename I>
void GroupBySegment(const I* segment_ids, int64_t n, int64_t num_segments, SegmentGroups* g) {
  g->offsets.assign(static_cast<size_t>(num_segments + 1), 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = static_cast<int64_t>(segment_ids[i]);
    if (s < 0) continue;
    ++g->offsets[static_cast<size_t>(s + 1)];
    ++kept;
  }
  for (int64_t s = 0; s < num_segments; ++s) g->offsets[s + 1] += g->offsets[s];
  g->order.resize(static_cast<size_t>(kept));
  std::vector<int64_t> next(g->offsets.begin(), g->offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = static_cast<int64_t>(segment_ids[i]);
    if (s < 0) continue;
    g->order[static_cast<size_t>(next[static_cast<size_t>(s)]++)] = i;
  }
}

// A segment's rows are added in pieces of kSegmentPiece positions: each
// piece is summed in position order from zero, and the pieces' sums are
// added in order. The GPU kernel sums a long segment's pieces in parallel
// (a hot key of a Zipf stream repeats hundreds of thousands of times in a
// batch; one thread adding them all was a long serial loop) and the CPU
// adds in the same association, so both give the same bits. A segment of at
// most kSegmentPiece positions is one piece: a plain sum in position order.
constexpr int64_t kSegmentPiece = 1024;

// out[s, :] = sum of data[i, :] over positions i of segment s, for segments
// [seg_begin, seg_end). `data` is [n, width], `out` is [num_segments, width].
// Sums are accumulated in Acc (float for half types) and rounded once.
template <typename T, typename Acc>
void SumSegments(const T* data, int64_t width, const SegmentGroups& g, int64_t seg_begin,
                 int64_t seg_end, T* out, Acc* scratch /* 2 * width */) {
  Acc* total = scratch;
  Acc* piece = scratch + width;
  for (int64_t s = seg_begin; s < seg_end; ++s) {
    std::fill(total, total + width, Acc(0));
    for (int64_t p = g.offsets[s]; p < g.offsets[s + 1]; p += kSegmentPiece) {
      const int64_t end = std::min(p + kSegmentPiece, g.offsets[s + 1]);
      std::fill(piece, piece + width, Acc(0));
      for (int64_t k = p; k < end; ++k) {
        const T* row = data + g.order[k] * width;
        for (int64_t d = 0; d < width; ++d) piece[d] += static_cast<Acc>(row[d]);
      }
      for (int64_t d = 0; d < width; ++d) total[d] += piece[d];
    }
    T* dst = out + s * width;
    for (int64_t d = 0; d < width; ++d) dst[d] = static_cast<T>(total[d]);
  }
}

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_UTIL_CORE_SEGMENT_SUM_H_
