// The vocabulary every other header speaks: dtypes, devices, the stream handle and the
// enums of the ops' options. Depends on nothing but <cstdint>, so that any layer (the
// numerics in detail/, the kernels' parameters, the C API) can use it.
#pragma once

#include "embrope/version.hpp"

#include <cstdint>

EMBROPE_BEGIN_NAMESPACE

// float8_e4m3fn and float8_e5m2 (OCP 8-bit floating point, as in PyTorch and CUDA's
// cuda_fp8.h) are storage formats: of KV caches (apply_rope_append_kv.hpp), of apply_rope's
// quantized outputs (apply_rope.hpp) and of quantized embedding tables (embed.hpp). uint8 and
// int8 hold quantized tables' bytes and values, and zero points (QuantizedTable).
enum class DType : std::uint8_t {
  float32,
  float16,
  bfloat16,
  int32,
  int64,
  float8_e4m3fn,
  float8_e5m2,
  uint8,
  int8
};

// Bytes per element of a dtype.
constexpr int dtype_size(DType dtype) {
  return dtype == DType::float16 || dtype == DType::bfloat16 ? 2
         : dtype == DType::int64                             ? 8
         : dtype == DType::float8_e4m3fn || dtype == DType::float8_e5m2 || dtype == DType::uint8 ||
                 dtype == DType::int8
             ? 1
             : 4;
}
constexpr bool is_value_dtype(DType d) {
  return d == DType::float32 || d == DType::float16 || d == DType::bfloat16;
}
constexpr bool is_index_dtype(DType d) {
  return d == DType::int32 || d == DType::int64;
}
constexpr bool is_float8_dtype(DType d) {
  return d == DType::float8_e4m3fn || d == DType::float8_e5m2;
}

enum class DeviceKind : std::uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // the CUDA device ordinal; 0 for the CPU

  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  friend constexpr bool operator==(Device a, Device b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }
};

// A cudaStream_t passed as an opaque handle, so that public headers need no CUDA headers.
// The null handle is the legacy default stream. Ignored for CPU tensors.
struct Stream {
  void* handle = nullptr;
};

// The most dimensions a tensor view has.
constexpr int kMaxDims = 8;

// embed: the absolute position added to each token row.
enum class PositionEncoding : std::uint8_t {
  none,        // out = scale * table[id]
  learned,     // + position_table[p]                  (BERT, GPT-2, OPT)
  sinusoidal,  // + sinusoid(p), Vaswani et al. 2017
};

// embed: where sin and cos go in a sinusoidal position vector, w_i = base^(-2i/D).
enum class SinusoidLayout : std::uint8_t {
  interleaved,  // P[2i] = sin(p w_i), P[2i+1] = cos(p w_i)  (the paper)
  split,        // P[i] = sin(p w_i), P[D/2 + i] = cos(p w_i)  (Marian; not fairseq's spacing)
};

// embed: the normalisation of each summed row, in float32 before the one rounding
// (docs/ops.md, "embed"; detail/norm_math.hpp).
enum class Normalization : std::uint8_t {
  none,
  layer_norm,  // (x - mean) / sqrt(var + eps) * weight + bias  (Ba et al. 2016; BERT)
  rms_norm,    // x / sqrt(mean(x^2) + eps) * weight             (Zhang & Sennrich 2019; T5)
};

// apply_rope: which elements form a rotation pair within the first rotary_dim of a head.
enum class RopeLayout : std::uint8_t {
  neox,         // (x[i], x[i + R/2]): GPT-NeoX, HF Llama rotate_half
  interleaved,  // (x[2i], x[2i + 1]): GPT-J, RoFormer, Meta's complex form
};

// apply_rope_append_kv: the order of a paged KV cache's dimensions (FlashInfer's names).
enum class KvCacheLayout : std::uint8_t {
  nhd,  // [pages, page_size, kv_heads, head_dim]: vLLM, FlashInfer's default
  hnd,  // [pages, kv_heads, page_size, head_dim]: TensorRT-LLM's KV blocks
};

// RopeCache: how the frequencies are modified for context extension (docs/ops.md). The
// definitions follow HF transformers' modeling_rope_utils.py.
enum class RopeScaling : std::uint8_t {
  none,      // inv_freq_i = base^(-2i/R)
  linear,    // inv_freq_i / factor (position interpolation, Chen et al. 2023)
  dynamic,   // NTK-aware: base grows with the sequence length past original_max_positions
  yarn,      // Peng et al. 2023: ramp between interpolated and original frequencies
  llama3,    // Llama 3.1: low frequencies / factor, high kept, a smooth band between
  longrope,  // Phi-3 (Ding et al. 2024): per-frequency short or long factors
};

// embed with a QuantizedTable (embed.hpp): how the token table's rows are stored. Each value
// is dequantized to float32 in the lookup's pass (detail/quant_math.hpp).
enum class QuantFormat : std::uint8_t {
  // int8 values, one per byte: x = (q - zero_point) * scale (ExecuTorch's embedding_byte,
  // torchao's int8 weight-only embedding).
  int8,
  // int4 values in [-8, 7], two per byte, ExecuTorch's embedding_4bit packing: the even
  // element in the high nibble, each stored plus 8. x = (q - zero_point) * scale.
  int4,
  // float8 values: x = float(q) * scale (torchao's float8 weight-only tables).
  float8_e4m3fn,
  float8_e5m2,
  // llama.cpp's GGUF blocks, as a .gguf file stores token_embd.weight: their scales are in
  // the blocks. 32 values in 34 bytes (Q8_0) or 18 (Q4_0); 256 values in 144 (Q4_K) or 210
  // (Q6_K).
  gguf_q8_0,
  gguf_q4_0,
  gguf_q4_k,
  gguf_q6_k,
};

// embed_backward: how a GPU sums the grad_out rows that share a table row (the CPU path is
// always deterministic).
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

EMBROPE_END_NAMESPACE
