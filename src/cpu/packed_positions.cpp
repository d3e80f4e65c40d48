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

}  // namespace

void packed_positions(const detail::PackedPositionsParams& p) {
  constexpr auto op = detail::BadIndexOp::packed_positions;
  std::int64_t previous = 0;
  for (std::int64_t b = 0; b <= p.sequences; ++b) {
    const detail::BadIndexValue entry = detail::cu_seqlens_entry(p, b, previous);
    if (!detail::entry_in_range(entry)) {
      detail::lower_bad_index(p.bad, detail::bad_index_key(b, detail::BadIndexArg::cu_seqlens), op,
                              [&](std::int64_t) { return entry; });
      fill(p, 0, p.tokens, -1);
      return;
    }
    previous = entry.value;
  }
  std::int64_t first_bad = detail::kNoBadIndex;
#pragma omp parallel for schedule(dynamic, 64) reduction(min : first_bad) if (p.tokens >= (1 << 16))
  for (std::int64_t b = 0; b < p.sequences; ++b) {
    const std::int64_t begin = detail::cu_seqlens_at(p, b);
    const std::int64_t end = detail::cu_seqlens_at(p, b + 1);
    const std::int64_t start = detail::start_offset_at(p, b);
    if (!detail::start_offset_valid(p, b, start)) {
      first_bad = std::min(first_bad, detail::bad_index_key(b, detail::BadIndexArg::start_offsets));
      fill(p, begin, end, -1);
      continue;
    }
    fill(p, begin, end, start);
  }
  detail::lower_bad_index(p.bad, first_bad, op, [&](std::int64_t key) {
    return detail::start_offset_entry(p, detail::bad_index_row(key));
  });
}

}  // namespace embrope::cpu
