// embed_backward: the gradients of embed (DESIGN.md 3.6) with respect to its token table,
// its learned position table and its token-type table, in one call over grad_out.
#pragma once

#include "embrope/detail/export.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>

#include "embrope/status.hpp"
#include "embrope/tensor.hpp"

namespace embrope {

// How a GPU sums the grad_out rows that share a table row. The CPU path is always
// deterministic (each table row's sum is taken in the same order whatever the thread count).
enum class BackwardMode : std::uint8_t {
  // Sort (id, row) pairs with CUB's radix sort, run-length encode the ids, sum each run in a
  // fixed order and write each table row once (after PyTorch's embedding_dense_backward in
  // aten/src/ATen/native/cuda/Embedding.cu). Bitwise reproducible from run to run, on the
  // same GPU and build. Needs a workspace (embed_backward_workspace_size).
  deterministic,
  // float32 atomicAdd of every grad_out row into its table row: one pass and no workspace,
  // but the order of the additions, hence the rounding, changes from run to run. Applies
  // when every gradient given is float32; a call with a float16 or bfloat16 gradient runs
  // the deterministic path instead (a float32 scratch copy of a whole [V, D] table would cost
  // more than the sort).
  atomic,
};

struct EmbedBackwardOptions {
  // The forward's scale: grad_table[id] += scale * (sum of its grad_out rows). Positions and
  // types are not scaled, as in the forward.
  float scale = 1.0f;
  // As in EmbedOptions: the table holds ids [vocab_start, vocab_start + V); with vocab_shard,
  // ids outside the shard contribute nothing to grad_table (another shard owns them).
  // Without it, an id outside the range is a bad index (status.hpp), as in the forward.
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

  BackwardMode mode = BackwardMode::deterministic;
  // GPU deterministic mode: device memory of at least embed_backward_workspace_size() bytes
  // on the tensors' device, used only by this call's work on `stream` (so reusable by the
  // next call on the same stream). Null: the call allocates it with cudaMallocAsync on the
  // stream and frees it with cudaFreeAsync (stream-ordered, no synchronisation). Ignored on
  // the CPU, which allocates its own host scratch.
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
// token table). Gradients must not overlap each other or grad_out.
EMBROPE_EXPORT void embed_backward(const Tensor& grad_out, const Tensor& ids,
                                   const std::optional<Tensor>& grad_table,
                                   const EmbedBackwardOptions& options = {});

// Bytes of workspace the same call needs: nonzero only for CUDA tensors in deterministic
// mode (or atomic mode with a float16/bfloat16 gradient). Validates the arguments like
// embed_backward; reads no tensor data.
EMBROPE_EXPORT std::size_t embed_backward_workspace_size(const Tensor& grad_out, const Tensor& ids,
                                                         const std::optional<Tensor>& grad_table,
                                                         const EmbedBackwardOptions& options = {});

}  // namespace embrope
