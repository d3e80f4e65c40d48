// The CPU kernels' OpenMP teams and fork (fork.cpp): every entry to the CPU kernels notes
// that its thread may have started a team, so that a child forked from that thread runs its
// calls on one thread (GCC's runtime cannot start a team there).
#pragma once

namespace embrope::cpu {

void note_openmp_use() noexcept;

}  // namespace embrope::cpu
