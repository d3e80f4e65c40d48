// The per-row index arguments that embed and embed_backward share (position ids or implicit
// positions with per-row offsets, token-type ids): checked and written into the RowIndex of
// internal::EmbedParams once, for both ops; and the checks of a norm's settings.
#pragma once

#include <optional>

#include "embrope/tensor.hpp"
#include "embrope/version.hpp"
#include "embed_params.hpp"

EMBROPE_BEGIN_NAMESPACE

// The rows of a call: ids of any shape (one row each) and out's leading dimensions (out is
// grad_out for the backward); D is out's last dimension. Fills rows, dim, the row index and
// the ids and out pointers.
void set_rows(const Tensor& ids, const Tensor& out, internal::EmbedParams& p);

// vocab_start is not negative, and vocab_start + vocab_size fits int64.
void check_vocab_start(const char* op, std::int64_t vocab_start, std::int64_t vocab_size);

// An index tensor shaped like ids, on the ids' device.
void check_like_ids(const char* op, const char* name, const Tensor& t, const Tensor& ids);

// Positions of each row: explicit `position_ids` (shaped like ids), or implicit offset_b + s
// for ids [S] or [B, S] with optional `position_offsets` [B]. The two are exclusive.
void set_row_positions(const char* op, const Tensor& ids, const std::optional<Tensor>& position_ids,
                       const std::optional<Tensor>& position_offsets, internal::EmbedParams& p);

// norm_eps finite and >= 0, checked with or without a norm: a caller who passes -5 or NaN has
// a bug whether or not this call normalises.
void check_norm_eps(const char* op, float eps);

// The settings of a norm given to embed or embed_backward (not none): a Normalization, not with
// vocab_shard, eps finite and >= 0, a unit offset only with a weight.
void check_norm_settings(const char* op, Normalization norm, bool vocab_shard, float eps,
                         bool unit_offset, bool has_weight);

// Token-type ids (shaped like ids) of a type table of `num_types` rows.
void set_row_types(const char* op, const Tensor& ids, const Tensor& type_ids,
                   std::int64_t num_types, internal::EmbedParams& p);

EMBROPE_END_NAMESPACE
