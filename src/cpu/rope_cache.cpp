// Building the cos/sin table on the CPU: one row per position, threaded over positions.
// Values from detail::rope_cos_sin (float64 angles, one rounding), as on the GPU.
#include "../backend.hpp"
#include "fork.hpp"
#include "embrope/detail/rope_math.hpp"

namespace embrope::cpu {

void build_rope_cache(float* table, std::int64_t max_positions, std::int64_t rotary_dim,
                      const double* inv_freq, double attention_factor) {
  const std::int64_t half = rotary_dim / 2;
  note_openmp_use();  // a child forked from this thread must not start a team
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < max_positions; ++p) {
    float* row = table + p * rotary_dim;
    for (std::int64_t i = 0; i < half; ++i) {
      detail::rope_cos_sin(p, inv_freq[i], attention_factor, &row[i], &row[half + i]);
    }
  }
}

}  // namespace embrope::cpu
