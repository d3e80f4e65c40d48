// Sinusoidal position rows on the CPU (detail/sinusoid.hpp). Every value is the pure function
// detail::sinusoid_sin_cos: the float32 angle-addition combination (detail::sinusoid_term) of
// the anchor's and the offset's float32 sin and cos, here read from rows laid out like the
// output row:
// - the anchor row of sin/cos(a w_i): per thread, recomputed only when a row's anchor differs
//   from that of the thread's previous row (consecutive positions share it);
// - the offset rows of sin/cos(b w_i), b < kSinusoidBlock: per thread, each computed when
//   first needed;
// - the frequencies w_i, once per call.
// A row of consecutive positions then costs two multiplies and an add per element, and a
// float64 sin/cos per element only once per kSinusoidBlock rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "embrope/detail/config.hpp"
#include "embrope/detail/sinusoid.hpp"
#include "embrope/types.hpp"

namespace embrope::cpu {

// One position's sinusoids as two rows [D] in the output's layout, the pair i at elements
// (first, second) = split ? (i, D/2 + i) : (2i, 2i + 1): anchor (sin a w_i, cos a w_i) and
// offset (cos b w_i, sin b w_i).
struct SinusoidRow {
  const float* anchor;
  const float* offset;
  std::int64_t half;
  bool split;
};

// The sine and cosine of pair i (detail::sinusoid_combine's operations).
EMBROPE_INLINE_INTO_CALLER void sinusoid_pair(const SinusoidRow& s, std::int64_t i, float* sin_out,
                                              float* cos_out) {
  const std::int64_t first = s.split ? i : 2 * i, second = s.split ? s.half + i : 2 * i + 1;
  const float sin_a = s.anchor[first], cos_a = s.anchor[second];
  const float cos_b = s.offset[first], sin_b = s.offset[second];
  *sin_out = detail::sinusoid_term(sin_a, cos_b, cos_a, sin_b);
  *cos_out = detail::sinusoid_term(cos_a, cos_b, sin_a, -sin_b);
}

// The row of multiple * w_i in the layout above: (sin, cos) pairs for an anchor, (cos, sin)
// for an offset. scratch: D doubles. Inlined into each caller (the vector bodies compile it
// for their instruction set).
EMBROPE_INLINE_INTO_CALLER void sinusoid_sin_cos_row(std::int64_t multiple, const double* freqs,
                                                     std::int64_t half, bool split, bool offset,
                                                     float* row, double* scratch) {
  const double m = static_cast<double>(multiple);
  double* sin_v = scratch;
  double* cos_v = scratch + half;
  // Two loops: the float64 one vectorizes only on its own (GCC 12).
#pragma omp simd
  for (std::int64_t i = 0; i < half; ++i) {
    const detail::SinCos v = detail::sin_cos_f64(m * freqs[i]);
    sin_v[i] = v.sin;
    cos_v[i] = v.cos;
  }
  const double* first = offset ? cos_v : sin_v;
  const double* second = offset ? sin_v : cos_v;
  if (split) {
#pragma omp simd
    for (std::int64_t i = 0; i < half; ++i) {
      row[i] = static_cast<float>(first[i]);
      row[half + i] = static_cast<float>(second[i]);
    }
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < half; ++i) {
      row[2 * i] = static_cast<float>(first[i]);
      row[2 * i + 1] = static_cast<float>(second[i]);
    }
  }
}

using SinusoidSinCosRow = void (*)(std::int64_t, const double*, std::int64_t, bool, bool, float*,
                                   double*);

inline void portable_sinusoid_sin_cos_row(std::int64_t multiple, const double* freqs,
                                          std::int64_t half, bool split, bool offset, float* row,
                                          double* scratch) {
  sinusoid_sin_cos_row(multiple, freqs, half, split, offset, row, scratch);
}

// The sinusoids of one call: its frequencies, computed once.
class SinusoidCall {
 public:
  // sin_cos_row: sinusoid_sin_cos_row as compiled for the call's instruction set.
  SinusoidCall(std::int64_t dim, double base, SinusoidLayout layout, SinusoidSinCosRow sin_cos_row)
      : dim_(dim),
        split_(layout == SinusoidLayout::split),
        sin_cos_row_(sin_cos_row),
        freqs_(static_cast<std::size_t>(dim / 2)) {
    for (std::int64_t i = 0; i < dim / 2; ++i) freqs_[i] = detail::sinusoid_freq(i, dim, base);
  }

  // One thread's rows: that of the last anchor it met, and those of the offsets it has needed
  // so far.
  class Rows {
   public:
    explicit Rows(const SinusoidCall& call)
        : call_(call),
          anchor_(static_cast<std::size_t>(call.dim_)),
          scratch_(static_cast<std::size_t>(call.dim_)),
          // Not value-initialised: only the offset rows a thread uses are ever touched.
          offsets_(new float[static_cast<std::size_t>(detail::kSinusoidBlock * call.dim_)]) {}

    // The rows of a position in [0, kSinusoidPositionLimit); valid until the next call.
    SinusoidRow row(std::int64_t position) {
      const std::int64_t half = call_.dim_ / 2;
      const std::int64_t a = detail::sinusoid_anchor(position);
      const std::int64_t b = position - a;
      if (a != anchor_position_) {
        call_.sin_cos_row_(a, call_.freqs_.data(), half, call_.split_, false, anchor_.data(),
                           scratch_.data());
        anchor_position_ = a;
      }
      float* offset = offsets_.get() + b * call_.dim_;
      if (!have_offset_[b]) {
        call_.sin_cos_row_(b, call_.freqs_.data(), half, call_.split_, true, offset,
                           scratch_.data());
        have_offset_[b] = true;
      }
      return {anchor_.data(), offset, half, call_.split_};
    }

   private:
    const SinusoidCall& call_;
    std::vector<float> anchor_;
    std::vector<double> scratch_;
    std::unique_ptr<float[]> offsets_;  // [kSinusoidBlock][D]
    bool have_offset_[detail::kSinusoidBlock] = {};
    std::int64_t anchor_position_ = -1;
  };

 private:
  std::int64_t dim_;
  bool split_;
  SinusoidSinCosRow sin_cos_row_;
  std::vector<double> freqs_;
};

}  // namespace embrope::cpu
