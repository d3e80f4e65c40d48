// Positions of a packed variable-length batch on the CPU: check cu_seqlens in one pass, then
// write each sequence's positions (threaded over sequences).
#include <algorithm>

#include "../backend.hpp"

namespace embrope::cpu {
namespace {

void fill(const detail::PackedPositionsParams& p, std::int64_t begin, std::int64_t end,
          std::int64_t first_position) {
  for (std::int64_t t = begin; t < end; ++t) {
    detail::store_index(p.positions, p.position_dtype, t * p.position_stride,
                        first_position < 0 ? -1 : first_position + (t - begin));
  }
}

void record(const detail::PackedPositionsParams& p, std::int64_t key, std::int64_t value,
            std::int64_t lower, std::int64_t upper) {
  if (key >= p.bad->key) return;
  p.bad->key = key;
  p.bad->value = value;
  p.bad->lower = lower;
  p.bad->upper = upper;
  p.bad->op = static_cast<std::int32_t>(detail::BadIndexOp::packed_positions);
}

}  // namespace

void packed_positions(const detail::PackedPositionsParams& p) {
  auto cu = [&](std::int64_t b) {
    return detail::load_index(p.cu_seqlens, p.cu_dtype, b * p.cu_stride);
  };
  std::int64_t previous = 0;
  for (std::int64_t b = 0; b <= p.sequences; ++b) {
    const std::int64_t value = cu(b);
    std::int64_t lower = 0, upper = 0;
    detail::cu_seqlens_range(p, b, previous, &lower, &upper);
    if (value < lower || value >= upper) {
      record(p, detail::bad_index_key(b, detail::BadIndexArg::cu_seqlens), value, lower, upper);
      fill(p, 0, p.tokens, -1);
      return;
    }
    previous = value;
  }
  std::int64_t first_bad = detail::kNoBadIndex;
#pragma omp parallel for schedule(dynamic, 64) reduction(min : first_bad) if (p.tokens >= (1 << 16))
  for (std::int64_t b = 0; b < p.sequences; ++b) {
    const std::int64_t begin = cu(b);
    const std::int64_t end = cu(b + 1);
    const std::int64_t start =
        p.start_offsets == nullptr
            ? 0
            : detail::load_index(p.start_offsets, p.start_dtype, b * p.start_stride);
    if (start < 0 || start > detail::max_start_offset(p, end - begin)) {
      first_bad = std::min(first_bad, detail::bad_index_key(b, detail::BadIndexArg::start_offsets));
      fill(p, begin, end, -1);
      continue;
    }
    fill(p, begin, end, start);
  }
  if (first_bad != detail::kNoBadIndex) {
    const std::int64_t b = first_bad / 8;
    record(p, first_bad, detail::load_index(p.start_offsets, p.start_dtype, b * p.start_stride), 0,
           detail::start_offset_upper(p, cu(b + 1) - cu(b)));
  }
}

}  // namespace embrope::cpu
