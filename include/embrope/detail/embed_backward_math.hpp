// Per-row logic and summation order of embed_backward, shared by the CPU and CUDA backends
// (DESIGN.md 3.6), so that both backends sum in the same order and round the same way.
#pragma once

#include <cstdint>

#include "embrope/detail/config.hpp"
#include "embrope/detail/embed_math.hpp"
#include "embrope/detail/params.hpp"

namespace embrope::detail {

// The rows of one table row's sum are added in chunks of this many grad_out rows (in
// ascending row order): each chunk is summed from zero, then the chunk sums are added in
// chunk order. The GPU splits a long run (one frequent token) across warps at these chunk
// boundaries; the CPU sums in the same order, so that both give the same bits. Fixed, not a
// launch parameter: the order, hence the result, does not depend on the launch.
constexpr std::int64_t kEmbedBackwardChunk = 32;

// Where row n of grad_out goes: the row of each gradient table (-1: nowhere), and the bad
// index found, if any (a bad row gives nothing to any table: its forward output was zero).
struct BackwardRow {
  std::int64_t out_offset = 0;  // element offset of the row in grad_out
  std::int64_t target[EmbedBackwardParams::count] = {-1, -1, -1};
  std::int64_t bad_key = kNoBadIndex;
};

EMBROPE_HD BackwardRow resolve_backward_row(const EmbedBackwardParams& p, std::int64_t n) {
  const EmbedRow r = resolve_embed_row(p.rows, n);
  BackwardRow b;
  b.out_offset = r.out_offset;
  b.bad_key = r.bad_key;
  if (r.bad_key != kNoBadIndex) return b;
  // r.token + vocab_start is the id itself (it was in the shard), so no overflow.
  const bool padding = p.has_padding && r.token + p.rows.vocab_start == p.padding_idx;
  if (p.targets[EmbedBackwardParams::token].grad != nullptr && r.token_hit && !padding) {
    b.target[EmbedBackwardParams::token] = r.token;
  }
  if (p.targets[EmbedBackwardParams::position].grad != nullptr) {
    b.target[EmbedBackwardParams::position] = r.position;
  }
  if (p.targets[EmbedBackwardParams::type].grad != nullptr) {
    b.target[EmbedBackwardParams::type] = r.type;
  }
  return b;
}

// The value written to a gradient element: existing + weight * sum, in float32, with the
// product rounded before the addition on both backends (nvcc would otherwise fuse it into
// an FMA on the GPU only).
EMBROPE_HD float accumulate_gradient(float existing, float sum, float weight) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(existing, __fmul_rn(weight, sum));
#else
  return existing + weight * sum;
#endif
}

}  // namespace embrope::detail
