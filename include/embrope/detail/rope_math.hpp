// The arithmetic of rotary position embedding, shared by the CPU and CUDA backends.
// Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", eq. 34:
// pair (a, b) at angle theta becomes (a cos - b sin, a sin + b cos),
// theta_i = p * base^(-2i/R).
#pragma once

#include <cmath>
#include <cstdint>

#include "embrope/detail/config.hpp"

namespace embrope::detail {

// inv_freq_i = base^(-2i / rotary_dim), in float64 (docs/numerics.md).
EMBROPE_HD double rope_inv_freq(std::int64_t i, std::int64_t rotary_dim, double base) {
  return ::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
}

// One cache entry: cos and sin of p * inv_freq times the attention factor, all in float64,
// rounded once to float32 (docs/numerics.md).
EMBROPE_HD void rope_cos_sin(std::int64_t position, double inv_freq, double attention_factor,
                             float* cos_out, float* sin_out) {
  const double angle = static_cast<double>(position) * inv_freq;
  *cos_out = static_cast<float>(::cos(angle) * attention_factor);
  *sin_out = static_cast<float>(::sin(angle) * attention_factor);
}

// Rotation of one pair by the angle whose cos and sin are given (sin negated for inverse).
EMBROPE_HD void rotate_pair(float& a, float& b, float cos_v, float sin_v) {
  const float ra = a * cos_v - b * sin_v;
  const float rb = a * sin_v + b * cos_v;
  a = ra;
  b = rb;
}

// The most position streams a RoPE call takes: mrope's three, or an axial call's axes (FLUX.2
// has four).
constexpr int kMaxPositionStreams = 4;

// Multimodal and axial RoPE: the position stream (mrope: 0 temporal, 1 height, 2 width; axial:
// the axis) that frequency i takes its angle from, given kMaxPositionStreams section sizes
// (frequencies per stream; unused ones 0) and their running sums end[j] = section[0] + ... +
// section[j] (section_ends).
// - contiguous (Qwen2-VL, HF apply_multimodal_rotary_pos_emb; axial RoPE, diffusers'
//   FluxPosEmbed): section j holds the next section[j] frequencies, below end[j]. The sums
//   are precomputed: on the GPU the comparisons then read the kernel's parameters, where
//   adding the sizes in the kernel held the sums in registers and made ptxas spill;
// - interleaved (Qwen3-VL, HF Qwen3VLTextRotaryEmbedding.recomposition_frequencies): i = 3k + 1
//   below 3 section[1] takes height, i = 3k + 2 below 3 section[2] takes width, every other i
//   temporal.
EMBROPE_HD int mrope_stream(std::int64_t i, const std::int64_t* section, const std::int64_t* end,
                            bool interleaved) {
  if (interleaved) {
    const std::int64_t r = i % 3;
    if (r == 1 && i < 3 * section[1]) return 1;
    if (r == 2 && i < 3 * section[2]) return 2;
    return 0;
  }
  return i < end[0] ? 0 : i < end[1] ? 1 : i < end[2] ? 2 : 3;
}

// The running sums of kMaxPositionStreams section sizes (mrope_stream's end).
EMBROPE_HD void section_ends(const std::int64_t* section, std::int64_t* end) {
  std::int64_t sum = 0;
  for (int j = 0; j < kMaxPositionStreams; ++j) end[j] = sum += section[j];
}

// The stream shared by frequencies [first, first + n), or -1 where they take more than one.
EMBROPE_HD int mrope_chunk_stream(std::int64_t first, std::int64_t n, const std::int64_t* section,
                                  const std::int64_t* end, bool interleaved) {
  const int stream = mrope_stream(first, section, end, interleaved);
  if (n == 1) return stream;
  if (interleaved) {  // past both interleaved ranges, all temporal
    const std::int64_t last = 3 * (section[1] > section[2] ? section[1] : section[2]);
    return first >= last ? 0 : -1;
  }
  return stream == mrope_stream(first + n - 1, section, end, interleaved) ? stream : -1;
}

}  // namespace embrope::detail
