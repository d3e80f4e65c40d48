// A process forked after a threaded call: GCC's OpenMP runtime keeps the forking thread's pool
// of worker threads, which the child does not have, so the child's next parallel region on
// that thread waits for them forever (libgomp does not support fork; Python's multiprocessing
// and PyTorch's DataLoader workers fork by default on Linux). In the child, that thread's
// OpenMP thread count is set to 1: its calls run on itself, with the same bits (each op
// gives the same bits on any number of threads). Threads the child starts have pools
// of their own and keep the default.
#include <omp.h>
#include <pthread.h>

namespace {

void one_thread_in_forked_child() {
  omp_set_num_threads(1);
}

[[maybe_unused]] const int registered =
    pthread_atfork(nullptr, nullptr, one_thread_in_forked_child);

}  // namespace
