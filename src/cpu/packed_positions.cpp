// Positions of a packed variable-length batch on the CPU: check cu_seqlens in one pass, then
// write each sequence's positions (threaded over sequences).
#include <algorithm>

#include "../backend.hpp"

namespace embrope::cpu {
namespace {

void fill(const internal::PackedPositionsParams& p, std::int64_t begin, std::int64_t end,
          std::int64_t first_position) {
  for (std::int64_t t = begin; t < end; ++t) {
    internal::store_index(p.positions, p.position_dtype, t * p.position_stride,
                          first_position < 0 ? -1 : first_position + (t - begin));
  }
}

}  // namespace

void packed_positions(const internal::PackedPositionsParams& p) {
  constexpr auto op = internal::BadIndexOp::packed_positions;
  std::int64_t previous = 0;
  for (std::int64_t b = 0; b <= p.sequences; ++b) {
    const internal::BadIndexValue entry = internal::cu_seqlens_entry(p, b, previous);
    if (!internal::entry_in_range(entry)) {
      internal::lower_bad_index(p.bad,
                                internal::bad_index_key(b, internal::BadIndexArg::cu_seqlens), op,
                                [&](std::int64_t) { return entry; });
      fill(p, 0, p.tokens, -1);
      return;
    }
    previous = entry.value;
  }
  std::int64_t first_bad = internal::kNoBadIndex;
#pragma omp parallel for schedule(dynamic, 64) reduction(min : first_bad) if (p.tokens >= (1 << 16))
  for (std::int64_t b = 0; b < p.sequences; ++b) {
    const std::int64_t begin = internal::cu_seqlens_at(p, b);
    const std::int64_t end = internal::cu_seqlens_at(p, b + 1);
    const std::int64_t start = internal::start_offset_at(p, b);
    if (!internal::start_offset_valid(p, b, start)) {
      first_bad =
          std::min(first_bad, internal::bad_index_key(b, internal::BadIndexArg::start_offsets));
      fill(p, begin, end, -1);
      continue;
    }
    fill(p, begin, end, start);
  }
  internal::lower_bad_index(p.bad, first_bad, op, [&](std::int64_t key) {
    return internal::start_offset_entry(p, internal::bad_index_row(key));
  });
}

}  // namespace embrope::cpu
