// Scratch arrays for batch operations, kept per thread between calls.
// A batch of 64k keys needs a few arrays of 512 KB; allocated afresh each
// call, the C library hands such blocks back to the system and takes them
// again, and zeroing the new pages cost a fifth of a table scatter.
// TF-independent; C++14.
#ifndef SOK_GRAPH_TF_OPS_UTIL_CORE_SCRATCH_H_
#define SOK_GRAPH_TF_OPS_UTIL_CORE_SCRATCH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sok_graph {
namespace core {

// Borrows this thread's scratch vector number `Slot` (empty on entry), and
// releases its memory afterwards if it grew beyond kKeepBytes, so one huge
// batch does not pin memory for the thread's lifetime. Two live borrows
// must use different slots.
template <typename T, int Slot>
class Scratch {
 public:
  static constexpr size_t kKeepBytes = size_t{32} << 20;

  Scratch() : v_(Vector()) { v_.clear(); }
  explicit Scratch(size_t n) : Scratch() { v_.resize(n); }
  ~Scratch() {
    if (v_.capacity() * sizeof(T) > kKeepBytes) std::vector<T>().swap(v_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  std::vector<T>& operator*() { return v_; }
  std::vector<T>* operator->() { return &v_; }

 private:
  static std::vector<T>& Vector() {
    thread_local std::vector<T> v;
    return v;
  }
  std::vector<T>& v_;
};

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_UTIL_CORE_SCRATCH_H_
