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
  template <typename... Args>
  explicit PerThread(bool threaded, const Args&... args) {
    const int threads = threaded ? std::max(1, omp_get_max_threads()) : 1;
    items_.reserve(static_cast<std::size_t>(threads));
    for (int i = 0; i < threads; ++i) items_.emplace_back(args...);
  }

  // The region's num_threads.
  int threads() const { return static_cast<int>(items_.size()); }

  // The calling thread's item, inside the region.
  Item& mine() { return items_[static_cast<std::size_t>(omp_get_thread_num())]; }

 private:
  std::vector<Item> items_;
};

}  // namespace embrope::cpu
