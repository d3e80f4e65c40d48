// packed_positions: RoPE positions of a packed variable-length batch, from cu_seqlens.
#pragma once

#include <cstddef>
#include <optional>

#include "embrope/deferred_status.hpp"
#include "embrope/export.hpp"
#include "embrope/tensor.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

struct PackedPositionsOptions {
  // [B] int32/int64: the position of each sequence's first token (for example the length of
  // its KV cache when decoding or continuing a prefill). Absent: every sequence starts at 0.
  std::optional<Tensor> start_offsets;
  // GPU: device memory of at least packed_positions_workspace_size() bytes on the tensors'
  // device, used only by this call's work on `stream` (reusable by the next call on the same
  // stream). Null: the call takes it from embrope's workspace pool on the stream and frees it
  // in stream order (no synchronisation; the pool keeps up to 64 MiB per device reserved
  // between calls). Ignored on the CPU, which needs none.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Null: an invalid cu_seqlens makes the call throw. Otherwise it is recorded there.
  DeferredStatus* deferred = nullptr;
  Stream stream{};
};

// A batch of B sequences packed into one token dimension of T tokens (FlashAttention's
// varlen layout): sequence b holds tokens [cu_seqlens[b], cu_seqlens[b + 1]). Writes
//   positions[t] = start_offsets[b] + (t - cu_seqlens[b])   for each token t of sequence b,
// so that apply_rope on the packed [T, H, D] tensors gives each sequence its own positions,
// with a grid proportional to T (no B x max_len padding). Runs on the device of the tensors
// without a host round trip (on a GPU: CUB's DeviceScan over sequence starts).
//
// cu_seqlens [B + 1] and positions [T] are int32 or int64, positions with any stride.
// cu_seqlens must be non-decreasing from 0 to T (empty sequences allowed) and positions must
// be representable in their dtype: these checks need the values, so they run where the data
// is, and a violation is reported like a bad index (deferred_status.hpp): the first offending entry
// and its value. Tokens then get position -1, which apply_rope rejects.
EMBROPE_EXPORT void packed_positions(const Tensor& cu_seqlens, const Tensor& positions,
                                     const PackedPositionsOptions& options = {});

// Bytes of workspace the same call needs: nonzero only for CUDA tensors. Validates the
// arguments like packed_positions; reads no tensor data.
EMBROPE_EXPORT std::size_t packed_positions_workspace_size(
    const Tensor& cu_seqlens, const Tensor& positions, const PackedPositionsOptions& options = {});

EMBROPE_END_NAMESPACE
