// A process forked after a threaded call: GCC's OpenMP runtime keeps the forking thread's pool
// of worker threads, which the child does not have, so the child's next parallel region on
// that thread waits for them forever (libgomp does not support fork; Python's multiprocessing
// and PyTorch's DataLoader workers fork by default on Linux). In the child, if the forking
// thread ran an op of this library on the CPU (and so may have started a team), its OpenMP
// thread count is set to 1: its calls run on itself, with the same bits (each op gives the
// same bits on any number of threads). A child forked from another thread, and the threads a
// child starts, keep the default. LLVM's runtime (libomp) restarts itself in a forked child:
// the handler is registered with GCC's only (EMBROPE_OPENMP_LIBGOMP, from CMake).
#include "fork.hpp"

#include <omp.h>
#include <pthread.h>

namespace embrope::cpu {

namespace {

bool& ran_openmp() noexcept {
  thread_local bool ran = false;
  return ran;
}

#if defined(EMBROPE_OPENMP_LIBGOMP) && EMBROPE_OPENMP_LIBGOMP
void one_thread_in_forked_child() {
  if (ran_openmp()) omp_set_num_threads(1);
}

[[maybe_unused]] const int registered =
    pthread_atfork(nullptr, nullptr, one_thread_in_forked_child);
#endif

}  // namespace

void note_openmp_use() noexcept {
  ran_openmp() = true;
}

}  // namespace embrope::cpu
