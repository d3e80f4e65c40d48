// The per-row index arguments that embed and embed_backward share (position ids or implicit
// positions with per-row offsets, token-type ids): checked and written into the RowIndex of
// detail::EmbedParams once, for both ops.
#pragma once

#include <optional>

#include "embrope/detail/params.hpp"
#include "embrope/tensor.hpp"

namespace embrope {

// An index tensor shaped like ids, on the ids' device.
void check_like_ids(const char* op, const char* name, const Tensor& t, const Tensor& ids);

// Positions of each row: explicit `position_ids` (shaped like ids), or implicit offset_b + s
// for ids [S] or [B, S] with optional `position_offsets` [B]. The two are exclusive.
void set_row_positions(const char* op, const Tensor& ids, const std::optional<Tensor>& position_ids,
                       const std::optional<Tensor>& position_offsets, detail::EmbedParams& p);

// Token-type ids (shaped like ids) of a type table of `num_types` rows.
void set_row_types(const char* op, const Tensor& ids, const Tensor& type_ids,
                   std::int64_t num_types, detail::EmbedParams& p);

}  // namespace embrope
