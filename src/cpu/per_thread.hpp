// A thread's scratch in the CPU kernels' OpenMP regions, made before the region.
//
// An exception cannot leave an OpenMP structured block: the runtime ends the process. Scratch
// made inside a region would turn an allocation that fails into that; made here, it throws
// std::bad_alloc on the caller's thread, which the C API reports as EMBROPE_ERROR_OUT_OF_MEMORY
// and the C++ API passes on. Use:
//
//   PerThread<std::vector<float>> scratch(threaded, n);
//   #pragma omp parallel num_threads(scratch.threads()) if (threaded)
//   { std::vector<float>& mine = scratch.mine(); ... }
//
// The team never has more threads than num_threads asks for (OpenMP 5.2, 2.6.1: a team is at
// most that size), so every thread has its own item.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace embrope::cpu {

template <typename Item>
class PerThread {
 public:
  // One Item(args...) for each thread of the region the caller is about to open: as many as
  // OpenMP would start there when `threaded`, else one.
  // Inside a caller's parallel region where no further level may be active, the team is the
  // calling thread alone.
  template <typename... Args>
  explicit PerThread(bool threaded, const Args&... args) {
    const bool nested_serial = omp_get_active_level() >= omp_get_max_active_levels();
    const int threads = threaded && !nested_serial ? std::max(1, omp_get_max_threads()) : 1;
    items_.reserve(static_cast<std::size_t>(threads));
    for (int i = 0; i < threads; ++i) items_.emplace_back(args...);
  }

  // The region's num_threads.
  int threads() const { return static_cast<int>(items_.size()); }

  // The calling thread's item, inside the region.
  Item& mine() { return items_[static_cast<std::size_t>(omp_get_thread_num())].item; }

 private:
  // Each item on cache lines of its own: a thread writes its item's members (a sinusoid row
  // cache's positions, say), which must not share a line with another thread's.
  struct alignas(64) Slot {
    Item item;
    template <typename... Args>
    explicit Slot(const Args&... args) : item(args...) {}
  };
  std::vector<Slot> items_;
};

}  // namespace embrope::cpu
