// embed: token-embedding lookup, optionally fused with absolute positions and token types
// (DESIGN.md 3.1 and 3.2), in one pass over the output.
#pragma once

#include "embrope/detail/export.hpp"

#include <cstdint>
#include <optional>

#include "embrope/status.hpp"
#include "embrope/tensor.hpp"

namespace embrope {

enum class PositionEncoding : std::uint8_t {
  none,        // out = scale * table[id]
  learned,     // + position_table[p]                  (BERT, GPT-2, OPT)
  sinusoidal,  // + sinusoid(p), Vaswani et al. 2017
};

// Where sin and cos go in a sinusoidal position vector, w_i = base^(-2i/D):
enum class SinusoidLayout : std::uint8_t {
  interleaved,  // P[2i] = sin(p w_i), P[2i+1] = cos(p w_i)  (the paper)
  split,        // P[i] = sin(p w_i), P[D/2 + i] = cos(p w_i)  (tensor2tensor, fairseq)
};

struct EmbedOptions {
  // Multiplies the looked-up token row (sqrt(D) for Gemma and T5-style models).
  float scale = 1.0f;
  // The table holds ids [vocab_start, vocab_start + V) of a larger vocabulary.
  std::int64_t vocab_start = 0;
  // Vocab-parallel shard: ids outside the shard give zero token rows (positions and types
  // are still added), so that a sum over shards gives the full lookup. Without it, an id
  // outside [vocab_start, vocab_start + V) is an error.
  bool vocab_shard = false;

  PositionEncoding positions = PositionEncoding::none;
  // learned: [max_positions, D], the table's dtype.
  std::optional<Tensor> position_table;
  // sinusoidal: D even, base finite and > 0.
  double sinusoid_base = 10000.0;
  SinusoidLayout sinusoid_layout = SinusoidLayout::interleaved;
  // Explicit positions, the shape of ids (int32/int64). Absent: implicit positions
  // offset_b + s for ids [B, S] (or [S]), with position_offsets [B] (int32/int64) or 0.
  std::optional<Tensor> position_ids;
  std::optional<Tensor> position_offsets;

  // Optional token-type (segment) embedding as in BERT: [num_types, D] table in the table's
  // dtype and type ids shaped like ids.
  std::optional<Tensor> type_table;
  std::optional<Tensor> type_ids;

  // Null: a bad id or position makes the call throw. Otherwise it is recorded there.
  DeferredStatus* deferred = nullptr;
  Stream stream{};
};

// out[n] = scale * table[ids[n] - vocab_start] (+ P(pos_n)) (+ type_table[type_ids[n]]).
// table [V, D] and out [ids.shape..., D] share a value dtype (float32, float16, bfloat16);
// ids are int32 or int64 of any shape and strides. Arithmetic in float32, one rounding.
EMBROPE_EXPORT void embed(const Tensor& table, const Tensor& ids, const Tensor& out,
                          const EmbedOptions& options = {});

}  // namespace embrope
