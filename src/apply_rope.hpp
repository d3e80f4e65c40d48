// The host side of apply_rope shared with apply_rope_backward, which runs the same
// validation and kernels with the rotation transposed. Its errors name its own op and
// arguments (dq, dk, ...) through the same checks: the checks take the names to speak of.
#pragma once

#include <array>

#include <optional>

#include "bad_index.hpp"
#include "embrope/apply_qk_norm_rope.hpp"
#include "embrope/apply_rope.hpp"
#include "apply_qk_norm_rope_params.hpp"
#include "apply_rope_append_kv_params.hpp"
#include "apply_rope_params.hpp"

namespace embrope::internal {

// Which outputs of a RoPE op may be float8 (RopeOptions' q_out / k_out and their scales).
enum class RopeFloat8 {
  none,     // neither: the outputs have the inputs' dtype
  q_and_k,  // apply_rope: both or neither, of one dtype
  q_only,   // the cache-append ops: q_out alone (k goes to the cache, quantized by k_scale)
};

struct RopeNames {
  const char* op;
  const char* q;
  const char* k;
  const char* q_out;
  const char* k_out;
  const char* q_token_dims;   // "the token dimensions of q"
  const char* q_head_dim;     // "head_dim of q"
  BadIndexOp bad_op;          // how a bad position is reported
  RopeFloat8 float8_outputs;  // which outputs may be float8
  // Whether k, without a k_out, is rotated in place (the cache-append ops only read it then).
  bool k_in_place;
};

// clang-format off
inline constexpr RopeNames kRopeForwardNames{
    "apply_rope", "q", "k", "q_out", "k_out",
    "the token dimensions of q", "head_dim of q", BadIndexOp::apply_rope, RopeFloat8::q_and_k, true};
inline constexpr RopeNames kRopeBackwardNames{
    "apply_rope_backward", "dq", "dk", "dq_out", "dk_out",
    "the token dimensions of dq", "head_dim of dq", BadIndexOp::apply_rope_backward, RopeFloat8::none, true};
inline constexpr RopeNames kRopeAppendKvNames{
    "apply_rope_append_kv", "q", "k", "q_out", "k_out",
    "the token dimensions of q", "head_dim of q", BadIndexOp::apply_rope_append_kv, RopeFloat8::q_only,
    false};
inline constexpr RopeNames kQkNormRopeAppendKvNames{
    "apply_qk_norm_rope_append_kv", "q", "k", "q_out", "k_out",
    "the token dimensions of q", "head_dim of q", BadIndexOp::apply_qk_norm_rope_append_kv,
    RopeFloat8::q_only, false};
inline constexpr RopeNames kQkNormRopeNames{
    "apply_qk_norm_rope", "q", "k", "q_out", "k_out",
    "the token dimensions of q", "head_dim of q", BadIndexOp::apply_qk_norm_rope, RopeFloat8::none, true};
inline constexpr RopeNames kQkNormRopeBackwardNames{
    "apply_qk_norm_rope_backward", "dq", "dk", "dq_out", "dk_out",
    "the token dimensions of dq", "head_dim of dq", BadIndexOp::apply_qk_norm_rope_backward,
    RopeFloat8::none, true};
// clang-format on

// Where the cos/sin values come from, whatever their owner.
struct CosSinTable {
  const void* cos;
  const void* sin;
  DType dtype;
  std::int64_t cos_stride, sin_stride, rows, rotary_dim;
  Device device;
  const char* name;           // for messages: "the cache" or "cos"
  Tensor cos_view, sin_view;  // the memory read, for the overlap checks
  // An axial cache's axes (RopeCache::axes_dim); all zero for any other table.
  std::array<std::int64_t, detail::kMaxPositionStreams> axes_dim;
};
CosSinTable cos_sin_table(const char* op, const RopeCache& cache);
// Checks cos and sin [max_positions, rotary_dim / 2].
CosSinTable cos_sin_table(const RopeNames& names, const Tensor& cos, const Tensor& sin);

// Validates q, k (optional), positions, the table and the options (q_out and k_out absent
// mean in place) and fills the rotation's parameters.
RopeParams prepare_rope(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
                        const Tensor& positions, const CosSinTable& table,
                        const RopeOptions& options);

// Checks that an output named `name` shares no byte with the table's cos or sin values.
void check_apart_from_table(const char* op, const char* name, const Tensor& out,
                            const CosSinTable& table);

void apply_rope_named(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
                      const Tensor& positions, const RopeCache& cache, const RopeOptions& options);

// Checks the per-head norm against q and k (its eps, weights and unit offset; errors name
// `op`) and gives its kernel parameters (apply_qk_norm_rope.cpp).
QkNormWeights prepare_qk_norm(const char* op, const Tensor& q, const std::optional<Tensor>& k,
                              const QkNorm& norm);
void apply_rope_named(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
                      const Tensor& positions, const Tensor& cos, const Tensor& sin,
                      const RopeOptions& options);

}  // namespace embrope::internal
