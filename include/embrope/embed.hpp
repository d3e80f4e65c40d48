// embed: token-embedding lookup, optionally fused with absolute positions and token types
// (docs/ops.md, "embed"), in one pass over the output; and embed_backward, its gradients
// with respect to the token, position and type tables (docs/ops.md, "embed_backward").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "embrope/deferred_status.hpp"
#include "embrope/export.hpp"
#include "embrope/tensor.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

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
  // sinusoidal: D even, base finite and >= 1, positions in [0, 2^32).
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

  // Normalisation of the summed row x (the embedding LayerNorm of BERT-style encoders, which
  // TensorRT fuses as embLayerNorm), in float32 before the one rounding:
  //   layer_norm: (x - mean(x)) / sqrt(var(x) + eps) * weight + bias  (var: biased, over D)
  //   rms_norm:   x / sqrt(mean(x^2) + eps) * weight
  // weight and bias are [D], float32 or the table's dtype; absent, 1 and 0. bias is for
  // layer_norm only. norm_unit_offset: the weight applied is (1 + weight), as Gemma stores it.
  // The sums run in a fixed order, the same on the CPU and the GPU (docs/numerics.md).
  // Cannot be combined with vocab_shard: a shard's rows are partial sums, to be normalised
  // after the sum over shards.
  Normalization norm = Normalization::none;
  std::optional<Tensor> norm_weight;
  std::optional<Tensor> norm_bias;
  float norm_eps = 1e-5f;  // finite, >= 0, norm or not (with 0 an all-zero row gives NaN)
  bool norm_unit_offset = false;
  // With a norm: also write the summed row before normalisation (the residual stream of
  // pre-norm models), [ids.shape..., D] in the table's dtype or float32, rounded once.
  std::optional<Tensor> pre_norm_out;

  // Null: a bad id or position makes the call throw. Otherwise it is recorded there.
  DeferredStatus* deferred = nullptr;
  Stream stream{};
};

// out[n] = scale * table[ids[n] - vocab_start] (+ P(pos_n)) (+ type_table[type_ids[n]]),
// then normalised when options.norm says so. table [V, D] and out [ids.shape..., D] share a
// value dtype (float32, float16, bfloat16); ids are int32 or int64 of any shape and strides.
// Arithmetic in float32, one rounding.
EMBROPE_EXPORT void embed(const Tensor& table, const Tensor& ids, const Tensor& out,
                          const EmbedOptions& options = {});

// A token table of V rows of D values, stored quantized (QuantFormat says how), read in place:
// a row's values are dequantized to float32 in the lookup's pass.
struct QuantizedTable {
  QuantFormat format = QuantFormat::int8;
  // [V, C], C the row's elements or bytes, C contiguous (any row stride):
  //   int8: int8 [V, D]; int4: uint8 [V, D / 2] (D even); float8_*: that float8 dtype [V, D];
  //   gguf_*: uint8 [V, D / 32 * 34] (Q8_0), [V, D / 32 * 18] (Q4_0), [V, D / 256 * 144] (Q4_K)
  //   or [V, D / 256 * 210] (Q6_K), D a multiple of the block's values. Blocks need no alignment.
  Tensor data;
  std::int64_t dim = 0;  // D
  // int8, int4 and float8 formats: float32, float16 or bfloat16, shaped
  //   [V] or [V, 1]:  one scale per row;
  //   [V, G]:         one per group of D / G consecutive values of a row (G divides D);
  //   [], [1], [1, 1]: one for the whole table.
  // GGUF formats keep their scales in their blocks: absent.
  std::optional<Tensor> scales;
  // int8 and int4: a zero point per scale, shaped like scales, float32, float16, bfloat16,
  // int8 or int32 (torchao keeps int8, ExecuTorch the scales' dtype). Absent: 0.
  std::optional<Tensor> zero_points;
};

// embed with a quantized token table: every option of the float table's embed (scale,
// positions, types, norm, vocab shards, deferred bad-index reports) and its order of operations,
// the token row's value x read as its format dequantizes it (QuantFormat; then scale * x, the
// positional and type rows added, the norm). out is float32, float16 or bfloat16 and chooses
// the dtype of position_table, type_table, and of norm_weight / norm_bias / pre_norm_out where
// they are not float32. There is no backward for quantized tables (embed_backward takes a
// float gradient table). On CUDA devices the values are dequantized by the element formula, a
// chunk of 16 output bytes per lane where the scale groups allow, the quantized bytes in loads
// of 2, 4 or 8 bytes where every row starts on a multiple of that size, else a value at a
// time (rows and GGUF blocks need no alignment; docs/ops.md).
EMBROPE_EXPORT void embed(const QuantizedTable& table, const Tensor& ids, const Tensor& out,
                          const EmbedOptions& options = {});

// ------------------------------------------------------------------ embed_backward ----

struct EmbedBackwardOptions {
  // The forward's scale: grad_table[id] += scale * (sum of its grad_out rows). Positions and
  // types are not scaled, as in the forward.
  float scale = 1.0f;
  // As in EmbedOptions: the table holds ids [vocab_start, vocab_start + V); with vocab_shard,
  // ids outside the shard contribute nothing to grad_table (another shard owns them).
  // Without it, an id outside the range is a bad index (deferred_status.hpp), as in the forward.
  std::int64_t vocab_start = 0;
  bool vocab_shard = false;
  // Rows whose id equals padding_idx (in the ids' numbering, like vocab_start) give no
  // gradient to grad_table, as torch.nn.Embedding(padding_idx=...). They still give their
  // gradient to the position and type tables. Absent: no padding id.
  std::optional<std::int64_t> padding_idx;

  // Learned positions: grad_position_table [max_positions, D] += the grad_out rows at each
  // position, from explicit position_ids shaped like ids, or implicit positions
  // offset_b + s for ids [B, S] (or [S]) with position_offsets [B] or 0 (as EmbedOptions).
  // Sinusoidal positions have no parameters and so no gradient: leave this absent.
  std::optional<Tensor> grad_position_table;
  std::optional<Tensor> position_ids;
  std::optional<Tensor> position_offsets;
  // Token types: grad_type_table [num_types, D] += the grad_out rows of each type id.
  std::optional<Tensor> grad_type_table;
  std::optional<Tensor> type_ids;

  // embed's norm (EmbedOptions::norm), differentiated before the tables: grad_out is then the
  // gradient of the normalised output, and every table receives, for each row,
  //   dx = (the norm's backward of grad_out at pre_norm) + grad_pre_norm
  // in float32 (docs/ops.md, "embed_backward"). pre_norm is the forward's pre_norm_out (the
  // summed row before the norm, [ids.shape..., D] in float32 or grad_out's dtype, as saved),
  // from which mean and rstd are recomputed in the forward's order, as torch's LayerNorm
  // backward does from its saved input; norm_weight [D], norm_eps and norm_unit_offset are the
  // forward's (the bias does not enter the gradient). Cannot be combined with vocab_shard.
  Normalization norm = Normalization::none;
  std::optional<Tensor> pre_norm;
  std::optional<Tensor> norm_weight;
  float norm_eps = 1e-5f;
  bool norm_unit_offset = false;
  // The gradient of the forward's pre_norm_out when it was used (the residual stream of
  // pre-norm models): like grad_out, float32 or grad_out's dtype. Absent: zero.
  std::optional<Tensor> grad_pre_norm;
  // The norm's parameter gradients, [D] float32, overwritten (not accumulated, unlike the
  // tables') with sum over rows of grad_out * xhat (weight) and of grad_out (bias, layer_norm
  // only), in a fixed order, the same on the CPU and the GPU. Rows found bad give nothing.
  std::optional<Tensor> grad_norm_weight;
  std::optional<Tensor> grad_norm_bias;

  BackwardMode mode = BackwardMode::deterministic;
  // GPU deterministic mode: device memory of at least embed_backward_workspace_size() bytes
  // on the tensors' device, used only by this call's work on `stream` (so reusable by the
  // next call on the same stream). Null: the call takes it from embrope's workspace pool on
  // the stream and frees it in stream order (no synchronisation; the pool keeps up to 64 MiB
  // per device reserved between calls). Ignored on the CPU, which allocates its own host
  // scratch.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;

  // Null: a bad id, position or type id makes the call throw. Otherwise it is recorded there.
  DeferredStatus* deferred = nullptr;
  Stream stream{};
};

// The backward of embed: for every row n of ids (any shape) and grad_out [ids.shape..., D],
//   grad_table[ids[n] - vocab_start]  += scale * grad_out[n]   (unless padding or a miss)
//   grad_position_table[pos_n]        += grad_out[n]           (when given)
//   grad_type_table[type_ids[n]]      += grad_out[n]           (when given)
// Every gradient given is accumulated into (+=, not overwritten). grad_out is float32,
// float16 or bfloat16 (the forward's table dtype); each gradient is [rows, D] in float32 or
// in grad_out's dtype. Sums are formed in float32; the existing gradient value is added
// last and the result rounded once to the gradient's dtype. A row with a bad id, position or
// type id (the forward zero-filled it) gives no gradient to any table and is reported like
// the forward's. At least one gradient must be given; grad_table may be absent (a frozen
// token table), or only the norm's. Gradients must not overlap each other or an input.
EMBROPE_EXPORT void embed_backward(const Tensor& grad_out, const Tensor& ids,
                                   const std::optional<Tensor>& grad_table,
                                   const EmbedBackwardOptions& options = {});

// Bytes of workspace the same call needs: nonzero only for CUDA tensors in deterministic
// mode (or atomic mode with a float16/bfloat16 gradient). Validates the arguments like
// embed_backward; reads no tensor data.
EMBROPE_EXPORT std::size_t embed_backward_workspace_size(const Tensor& grad_out, const Tensor& ids,
                                                         const std::optional<Tensor>& grad_table,
                                                         const EmbedBackwardOptions& options = {});

EMBROPE_END_NAMESPACE
