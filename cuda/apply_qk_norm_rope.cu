// qk-norm + RoPE on the GPU: RMSNorm of each (token, head) row (Zhang & Sennrich 2019,
// arXiv:1910.07467; per head as in Qwen3 and Gemma 3), then the RoFormer rotation (Su et al.
// 2021), and the gradient of the pair; the arithmetic of detail/norm_math.hpp and
// detail/rope_math.hpp, the sums in the CPU's order (docs/numerics.md), so both backends give
// the same bits.
//
// 32 lanes per row, lane l owning elements 256 k + 8 l + w, so that its 8 running sums are the
// canonical partials; reduce_norm_partials combines them by halving. The sum pass reads a
// lane's elements (one 16-byte chunk per 8 16-bit values when kVector); the writing pass hands
// out whole rotation pairs instead (lane l: pairs l, l + 32, ...), so a pair is read and written
// by one thread and in place is race-free (the sum's reads all precede the reduction's
// barriers).
// - qk_norm_rope_kernel: blocks of kNormBlockRows rows walked in lockstep (the barriers need
//   every thread), inactive slots passing zero partials.
// - qk_norm_rope_neox_kernel, qk_norm_rope_append_kv_neox_kernel and
//   qk_norm_rope_backward_neox_kernel: the fast path of neox rows rotated whole with D 64, 128
//   or 256 (below, before the first of them; the backward's before it).
// - qk_norm_rope_backward_kernel: one block per chunk of detail::kWeightGradRows rows of q (or
//   of k), rows in ascending order, so that a lane adding g_j * xhat_j of its elements into the
//   chunk's workspace row sums each chunk in the CPU's order; qk_weight_grad_kernel then sums
//   the chunk rows in order. The gradient needs two row sums (x^2, then u * xhat) and writes
//   dx by pairs after both.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "../src/backend.hpp"
#include "../src/dispatch.hpp"
#include "bad_index.cuh"
#include "common.cuh"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "kv_cache.cuh"
#include "norm_reduce.cuh"
#include "rope.cuh"
#include "vector.cuh"
#include "workspace.cuh"

namespace embrope::gpu {
namespace {

using detail::from_float;
using detail::to_float;
using internal::QkNormRopeParams;

constexpr int kLanes = detail::kNormLanes;
constexpr int kWidth = detail::kNormLaneWidth;
constexpr int kForwardThreads = kNormBlockRows * kLanes;

// This lane's partial sum of squares of the row x (elements 256 k + 8 lane + w), or zeros when
// the row is inactive. kVector: D a multiple of 8 and the row in whole 16-byte chunks.
template <typename T, bool kVector>
__device__ __forceinline__ void square_partials(const T* x, std::int64_t dim, int lane, bool active,
                                                float* part) {
#pragma unroll
  for (int w = 0; w < kWidth; ++w) part[w] = 0.0f;
  if (!active) return;
  for (std::int64_t j0 = lane * kWidth; j0 < dim; j0 += kLanes * kWidth) {
    float v[kWidth];
    if constexpr (kVector) {
      constexpr int kLoad = kVec16<T>;
#pragma unroll
      for (int c = 0; c < kWidth; c += kLoad) {
        const Chunk<T, kLoad> chunk = *reinterpret_cast<const Chunk<T, kLoad>*>(x + j0 + c);
#pragma unroll
        for (int w = 0; w < kLoad; ++w) v[c + w] = to_float(chunk.v[w]);
      }
    } else {
#pragma unroll
      for (int w = 0; w < kWidth; ++w) v[w] = j0 + w < dim ? to_float(x[j0 + w]) : 0.0f;
    }
#pragma unroll
    for (int w = 0; w < kWidth; ++w) {
      if (kVector || j0 + w < dim) part[w] += detail::norm_square_term(v[w], 0.0f);
    }
  }
}

// Zero bits (0 in every value dtype, float8 codes included).
template <typename T>
__device__ __forceinline__ void zero_row(T* out, std::int64_t dim, int lane) {
  for (std::int64_t j = lane; j < dim; j += kLanes) out[j] = T{};
}

// Row n of a walk over `rows` rows, `heads` per token (kNormBlockRows rows per block, slot
// threadIdx.y): its token t = (b, s) and head h, or an inactive slot past the end (token 0).
struct BlockRow {
  bool active;
  std::int64_t t, h, b, s;
};
__device__ __forceinline__ BlockRow block_row(const internal::RopeParams& r, std::int64_t n,
                                              std::int64_t rows, std::int64_t heads) {
  const bool active = n < rows;
  const std::int64_t t = active ? n / heads : 0;
  const std::int64_t b = t / r.seq;
  return {active, t, active ? n - t * heads : 0, b, t - b * r.seq};
}

// The writing pass of a row whose rstd is known: lane l normalises and rotates pairs l,
// l + 32, ... (then the elements past rotary_dim), handing each element, in float32 (rounded by
// the caller: to T, or once to a float8 output), to store(j, value). A pair is read and written by
// one thread, so in place is race-free.
template <typename T, typename C, typename Store>
__device__ __forceinline__ void normalize_rotate_row(const internal::RopeParams& r,
                                                     const internal::QkNormWeights& norm, bool is_q,
                                                     const T* in, float rstd, std::int64_t b,
                                                     std::int64_t s, int lane, Store&& store) {
  const float sin_sign = r.inverse ? -1.0f : 1.0f;
  const internal::TokenPositions pos = internal::token_positions(r, b, s);
  auto normalized = [&](std::int64_t j) {
    return detail::norm_product(detail::rms_normalized(to_float(in[j]), rstd),
                                internal::qk_norm_weight(norm, is_q, j));
  };
  for (std::int64_t i = lane; i < r.rotary_dim / 2; i += kLanes) {
    const std::int64_t ia = internal::rope_pair_first(r, i);
    const std::int64_t ib = internal::rope_pair_second(r, i);
    float c, sn;
    internal::rope_pair_cos_sin<C>(r, pos, i, sin_sign, c, sn);
    float a = normalized(ia), v = normalized(ib);
    detail::rotate_pair(a, v, c, sn);
    store(ia, a);
    store(ib, v);
  }
  for (std::int64_t j = r.rotary_dim + lane; j < r.head_dim; j += kLanes) {
    store(j, normalized(j));
  }
}

template <typename T, typename C, bool kVector>
__global__ void __launch_bounds__(kForwardThreads)
    qk_norm_rope_kernel(const __grid_constant__ QkNormRopeParams p) {
  const internal::RopeParams& r = p.rope;
  const int lane = threadIdx.x;
  const int slot = threadIdx.y;
  const std::int64_t heads = r.q.heads + (r.has_k ? r.k.heads : 0);
  const std::int64_t rows = r.batch * r.seq * heads;
  const std::int64_t dim = r.head_dim;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kNormBlockRows;
  for (std::int64_t first = blockIdx.x * static_cast<std::int64_t>(kNormBlockRows); first < rows;
       first += row_stride) {
    const BlockRow row_at = block_row(r, first + slot, rows, heads);
    const bool active = row_at.active;
    const std::int64_t t = row_at.t, h = row_at.h, b = row_at.b, s = row_at.s;
    const internal::RopeRow<T> row = internal::rope_row<T>(r, b, s, h);
    const bool bad = active && internal::rope_bad_stream(r, b, s) >= 0;
    if (bad) {
      zero_row(row.out, dim, lane);
      if (lane == 0)
        report_bad_row(r.bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
    }
    const bool good = active && !bad;
    float part[kWidth];
    square_partials<T, kVector>(row.in, dim, lane, good, part);
    const float rstd = detail::norm_rstd(reduce_norm_partials(part, slot, lane), dim, p.norm.eps);
    if (!good) continue;

    T* const out = row.out;
    normalize_rotate_row<T, C>(r, p.norm, h < r.q.heads, row.in, rstd, b, s, lane,
                               [&](std::int64_t j, float y) { out[j] = from_float<T>(y); });
  }
  if (last_block_done(r.bad)) describe_bad_rope_position(r);
}

// The fast path, for neox rows rotated whole with D = 64, 128 or 256 (Qwen3, Gemma 3) and a
// float32 table (qk_norm_rope_neox_kernel, qk_norm_rope_append_kv_neox_kernel): one warp per
// head row, lane l holding elements l + 32 k, k < D / 32. Those are the canonical partials
// l + 32 k, so the lane computes its node of the sum's tree itself (sum_norm_nodes: one barrier
// per row), and a pair (i, i + D / 2) lies within one lane, so the row is read once and rotated
// in registers. After rope_vector_kernel (apply_rope.cu): a block walks whole tokens (or a
// split of a token's rows, for decode-sized calls), the token's cos and sin of the lane's pairs
// loaded once for all its rows and the norm weights of the lane's elements once per block;
// rows in rounds of blockDim.y (at most kNeoxRows), every warp taking part in each round's
// barrier. The elementwise arithmetic is normalize_rotate_row's, so both paths, and the CPU,
// give the same bits. Measured on an H200: 2.1x the general kernel, which was bound by
// instruction issue (benchmarks/results/gpu-2026-11-27-h200-0f74b65).
constexpr int kNeoxRows = 8;
constexpr int kNeoxThreads = kNeoxRows * kLanes;
static_assert(2 * kNeoxRows * kLanes <= kNormBlockRows * (detail::kNormPartials + kLanes),
              "two buffers of nodes per row fit in the norm scratch");

// What a lane of the fast path holds: the norm weights of its elements and the token's cos and
// sin of its pairs (arrays indexed by constants only, so that they stay in registers).
template <int kHeadDim>
struct NeoxLane {
  static constexpr int kElements = kHeadDim / kLanes;  // l + 32 k
  static constexpr int kPairs = kElements / 2;         // pairs l + 32 k, partners + D / 2
  static_assert(kElements <= kLeavesPerNode && kElements % 2 == 0, "64 <= D <= 256, D % 64 == 0");
  int lane;
  float q_weight[kElements], k_weight[kElements];
  float c[kPairs], sn[kPairs];

  __device__ __forceinline__ explicit NeoxLane(int lane_index) : lane(lane_index) {}

  __device__ __forceinline__ void load_weights(const internal::QkNormWeights& norm, bool has_k) {
#pragma unroll
    for (int k = 0; k < kElements; ++k) {
      q_weight[k] = internal::qk_norm_weight(norm, true, lane + kLanes * k);
      k_weight[k] = has_k ? internal::qk_norm_weight(norm, false, lane + kLanes * k) : 1.0f;
    }
  }

  __device__ __forceinline__ void load_cos_sin(const internal::RopeParams& r, std::int64_t b,
                                               std::int64_t s) {
    const internal::TokenPositions pos = internal::token_positions(r, b, s);
    const float sin_sign = r.inverse ? -1.0f : 1.0f;
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      internal::rope_pair_cos_sin<float>(r, pos, lane + kLanes * k, sin_sign, c[k], sn[k]);
    }
  }

  // Row `in` (a q row when is_q) normalised and rotated, each element handed in float32 to
  // store(j, value); `in` null: a slot without a row, which still takes part in the barrier.
  // nodes: the slot's buffer for sum_norm_nodes, the other one in the next round.
  template <typename T, typename Store>
  __device__ __forceinline__ void normalize_rotate(const T* in, bool is_q, float* nodes, float eps,
                                                   Store&& store) const {
    float x[kElements];
    float part[kLeavesPerNode];  // partials lane + 32 k; zero past D and in an empty slot
#pragma unroll
    for (int k = 0; k < kLeavesPerNode; ++k) part[k] = 0.0f;
    if (in != nullptr) {
#pragma unroll
      for (int k = 0; k < kElements; ++k) {
        x[k] = to_float(in[lane + kLanes * k]);
        part[k] += detail::norm_square_term(x[k], 0.0f);
      }
    }
    const float sum = sum_norm_nodes(subtree_sum<kLeavesPerNode / 2>(part), nodes, lane);
    if (in == nullptr) return;
    const float rstd = detail::norm_rstd(sum, kHeadDim, eps);
    // (A pointer to either weight array would put both in local memory.)
    auto weight = [&](int k) { return is_q ? q_weight[k] : k_weight[k]; };
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      float a = detail::norm_product(detail::rms_normalized(x[k], rstd), weight(k));
      float v =
          detail::norm_product(detail::rms_normalized(x[k + kPairs], rstd), weight(k + kPairs));
      detail::rotate_pair(a, v, c[k], sn[k]);
      store(lane + kLanes * k, a);
      store(lane + kLanes * (k + kPairs), v);
    }
  }
};

// The slot's buffer of nodes for this round (two per slot, alternating round by round).
__device__ __forceinline__ float* neox_nodes(int& buffer, int slot) {
  float* const nodes =
      block_shared().norm_scratch + (buffer * kNeoxRows + slot) * static_cast<int>(kLanes);
  buffer ^= 1;
  return nodes;
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kNeoxThreads)
    qk_norm_rope_neox_kernel(const __grid_constant__ QkNormRopeParams p,
                             std::int64_t rows_per_split) {
  const internal::RopeParams& r = p.rope;
  const int slot = threadIdx.y;
  const std::int64_t heads = r.q.heads + (r.has_k ? r.k.heads : 0);
  const std::int64_t tokens = r.batch * r.seq;
  const std::int64_t head_begin = blockIdx.y * rows_per_split;
  const std::int64_t head_end = min(heads, head_begin + rows_per_split);
  NeoxLane<kHeadDim> lane(static_cast<int>(threadIdx.x));
  lane.load_weights(p.norm, r.has_k);
  int buffer = 0;
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int64_t b = t / r.seq;
    const std::int64_t s = t - b * r.seq;
    if (internal::rope_bad_stream(r, b, s) >= 0) {  // the same for the whole block: no barrier
      for (std::int64_t h = head_begin + slot; h < head_end; h += blockDim.y) {
        zero_row(internal::rope_row<T>(r, b, s, h).out, kHeadDim, lane.lane);
      }
      if (lane.lane == 0 && slot == 0 && blockIdx.y == 0) {
        report_bad_row(r.bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
      }
      continue;
    }
    lane.load_cos_sin(r, b, s);
    for (std::int64_t round = head_begin; round < head_end; round += blockDim.y) {
      const std::int64_t h = round + slot;
      const internal::RopeRow<T> row =
          h < head_end ? internal::rope_row<T>(r, b, s, h) : internal::RopeRow<T>{nullptr, nullptr};
      lane.normalize_rotate(row.in, h < r.q.heads, neox_nodes(buffer, slot), p.norm.eps,
                            [&](std::int64_t j, float y) { row.out[j] = from_float<T>(y); });
    }
  }
  if (last_block_done(r.bad)) describe_bad_rope_position(r);
}

// Where a q or k row of qk-norm + RoPE + KV append puts its elements (y: the normalised,
// rotated value in float32): a float8 q's codes into q8; otherwise the value rounded to T into
// out (q's output, or k_out) and, for a k row, into the k cache at element `at`.
template <typename T>
struct AppendRowStores {
  const internal::RopeAppendKvParams& p;
  T* out;
  std::uint8_t* q8;
  float q8_scale;
  bool to_cache;
  std::int64_t at;
  __device__ __forceinline__ void operator()(std::int64_t j, float y) const {
    if (q8 != nullptr) {
      q8[j] = internal::rope_float8_code(y, q8_scale, p.rope.out_dtype);
      return;
    }
    const T value = from_float<T>(y);
    if (out != nullptr) out[j] = value;
    if (to_cache) store_to_cache<false>(p.k_cache, at + j, Chunk<T, 1>{{value}});
  }
};

// v head vh of token (b, s) into the v cache at the token's slot, lanes strided by 32.
template <typename T>
__device__ __forceinline__ void copy_v_row(const internal::RopeAppendKvParams& p, std::int64_t b,
                                           std::int64_t s, std::int64_t vh,
                                           const internal::KvSlot& cache_slot, int lane) {
  const T* in =
      static_cast<const T*>(p.v) + b * p.v_stride_b + s * p.v_stride_s + vh * p.v_stride_h;
  const std::int64_t at = cache_row(p.v_cache, cache_slot.page, cache_slot.offset, vh);
  for (std::int64_t j = lane; j < p.v_cache.head_dim; j += kLanes) {
    store_to_cache<false>(p.v_cache, at + j, Chunk<T, 1>{{in[j]}});
  }
}

// qk-norm + RoPE + KV-cache append (Qwen3 serving), one launch: the rows of a token are its q
// heads, its k heads and its v heads, kNormBlockRows rows per block as qk_norm_rope_kernel
// walks them (a v row takes part in the barriers with zero partials). A q row is normalised
// and rotated into q's output; a k row into k_out when asked and into the k cache at the
// token's slot (rounded to the activations' dtype, then converted: apply_rope_append_kv's
// bytes); a v row is copied into the v cache. Lane 0 of a token's first row reports its bad
// position or slot.
// (kForwardThreads, 8): with the bound alone ptxas aimed at the register budget of 32 blocks
// per multiprocessor and spilled 8-24 bytes around the float8 cache stores' division in the
// 16-bit instantiations; 8 blocks (16 warps) leave it 128 registers.
template <typename T, typename C, bool kVector>
__global__ void __launch_bounds__(kForwardThreads, 8)
    qk_norm_rope_append_kv_kernel(const __grid_constant__ internal::RopeAppendKvParams p) {
  const internal::RopeParams& r = p.rope;
  const int lane = threadIdx.x;
  const int slot = threadIdx.y;
  const std::int64_t qk_heads = r.q.heads + r.k.heads;
  const std::int64_t heads = qk_heads + r.k.heads;
  const std::int64_t rows = r.batch * r.seq * heads;
  const std::int64_t dim = r.head_dim;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kNormBlockRows;
  for (std::int64_t first = blockIdx.x * static_cast<std::int64_t>(kNormBlockRows); first < rows;
       first += row_stride) {
    const BlockRow row_at = block_row(r, first + slot, rows, heads);
    const bool active = row_at.active;
    const std::int64_t t = row_at.t, h = row_at.h, b = row_at.b, s = row_at.s;
    const bool is_v = h >= qk_heads;
    const TokenCacheWrite token = active ? token_cache_write(p, b, s) : TokenCacheWrite{};
    if (active && h == 0 && lane == 0) report_bad_token(p, t, token);
    const bool is_q = h < r.q.heads;
    const internal::RopeRow<T> row =
        is_v ? internal::RopeRow<T>{nullptr, nullptr} : internal::rope_row<T>(r, b, s, h);
    // q's output always (float8: q8, its codes); k's only into k_out.
    const bool q_float8 = is_q && internal::rope_quantized(r);
    T* const out = (is_q && !q_float8) || (!is_q && p.write_k_out) ? row.out : nullptr;
    std::uint8_t* const q8 =
        q_float8 && active ? internal::heads_row<T, std::uint8_t>(r.q, b, s, h).out : nullptr;
    if (active && !is_v && token.bad_position) {
      if (out != nullptr) zero_row(out, dim, lane);
      if (q8 != nullptr) zero_row(q8, dim, lane);
    }
    const bool good = active && !is_v && !token.bad_position;
    float part[kWidth];
    square_partials<T, kVector>(row.in, dim, lane, good, part);
    const float rstd = detail::norm_rstd(reduce_norm_partials(part, slot, lane), dim, p.norm.eps);
    if (active && is_v && token.write) copy_v_row<T>(p, b, s, h - qk_heads, token.slot, lane);
    const bool to_cache = !is_q && token.write;
    if (!good || (out == nullptr && q8 == nullptr && !to_cache)) continue;
    const std::int64_t at =
        to_cache ? cache_row(p.k_cache, token.slot.page, token.slot.offset, h - r.q.heads) : 0;
    const float q8_scale = q8 != nullptr ? internal::rope_out_scale(r, h) : 1.0f;
    normalize_rotate_row<T, C>(r, p.norm, is_q, row.in, rstd, b, s, lane,
                               AppendRowStores<T>{p, out, q8, q8_scale, to_cache, at});
  }
  if (last_block_done(r.bad)) describe_bad_token(p);
}

// qk_norm_rope_append_kv_kernel's fast path (the conditions and the lanes of
// qk_norm_rope_neox_kernel): a token's rows are its q heads, k heads and v heads, in rounds of
// blockDim.y; a v row takes part in the round's barrier without a row to normalise and is
// copied into the v cache; the token's position and cache slot are read once for all its rows.
// The stores are qk_norm_rope_append_kv_kernel's, element for element.
// (No minimum of blocks in the bound: ptxas takes 98-118 registers, two blocks of 256 threads per
// multiprocessor, as many warps as qk_norm_rope_append_kv_kernel's eight blocks of 64; asked
// for three, it spilled up to 332 bytes in the D 256 instantiations.)
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kNeoxThreads)
    qk_norm_rope_append_kv_neox_kernel(const __grid_constant__ internal::RopeAppendKvParams p,
                                       std::int64_t rows_per_split) {
  const internal::RopeParams& r = p.rope;
  const int slot = threadIdx.y;
  const std::int64_t qk_heads = r.q.heads + r.k.heads;
  const std::int64_t heads = qk_heads + r.k.heads;
  const std::int64_t tokens = r.batch * r.seq;
  const std::int64_t head_begin = blockIdx.y * rows_per_split;
  const std::int64_t head_end = min(heads, head_begin + rows_per_split);
  const bool q_float8 = internal::rope_quantized(r);
  NeoxLane<kHeadDim> lane(static_cast<int>(threadIdx.x));
  lane.load_weights(p.norm, true);
  int buffer = 0;
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int64_t b = t / r.seq;
    const std::int64_t s = t - b * r.seq;
    const TokenCacheWrite token = token_cache_write(p, b, s);
    if (lane.lane == 0 && slot == 0 && blockIdx.y == 0) {
      report_bad_token(p, t, token);
    }
    // Row h's outputs: q's always (float8: q8, its codes), k's only into k_out.
    auto out_row = [&](std::int64_t h) {
      const bool is_q = h < r.q.heads;
      return (is_q && !q_float8) || (!is_q && p.write_k_out) ? internal::rope_row<T>(r, b, s, h).out
                                                             : nullptr;
    };
    auto q8_row = [&](std::int64_t h) {
      return q_float8 && h < r.q.heads ? internal::heads_row<T, std::uint8_t>(r.q, b, s, h).out
                                       : nullptr;
    };
    if (token.bad_position) {  // the same for the whole block: no barrier
      for (std::int64_t h = head_begin + slot; h < min(head_end, qk_heads); h += blockDim.y) {
        if (T* const out = out_row(h)) zero_row(out, kHeadDim, lane.lane);
        if (std::uint8_t* const q8 = q8_row(h)) zero_row(q8, kHeadDim, lane.lane);
      }
      continue;
    }
    lane.load_cos_sin(r, b, s);
    for (std::int64_t round = head_begin; round < head_end; round += blockDim.y) {
      const std::int64_t h = round + slot;
      const bool active = h < head_end;
      const bool is_q = h < r.q.heads;
      const bool is_v = h >= qk_heads;
      T* const out = active && !is_v ? out_row(h) : nullptr;
      std::uint8_t* const q8 = active ? q8_row(h) : nullptr;
      const bool to_cache = active && !is_q && !is_v && token.write;
      const bool rotate = out != nullptr || q8 != nullptr || to_cache;
      const std::int64_t at =
          to_cache ? cache_row(p.k_cache, token.slot.page, token.slot.offset, h - r.q.heads) : 0;
      const float q8_scale = q8 != nullptr ? internal::rope_out_scale(r, h) : 1.0f;
      lane.normalize_rotate(rotate ? internal::rope_row<T>(r, b, s, h).in : nullptr, is_q,
                            neox_nodes(buffer, slot), p.norm.eps,
                            AppendRowStores<T>{p, out, q8, q8_scale, to_cache, at});
      if (active && is_v && token.write)
        copy_v_row<T>(p, b, s, h - qk_heads, token.slot, lane.lane);
    }
  }
  if (last_block_done(r.bad)) describe_bad_token(p);
}

// g_j: the gradient of the normalised element j, the output's gradient dy rotated back (the
// same rotate_pair as the CPU's, so the same bits whichever element of the pair is wanted).
template <typename T, typename C>
__device__ __forceinline__ float normalized_gradient(const internal::RopeParams& r, const T* dy,
                                                     std::int64_t j,
                                                     const internal::TokenPositions& pos,
                                                     float sin_sign) {
  if (j >= r.rotary_dim) return to_float(dy[j]);
  const internal::RopePairOf pair = internal::rope_pair_of(r, j);
  float c, sn;
  internal::rope_pair_cos_sin<C>(r, pos, pair.pair, sin_sign, c, sn);
  float a = to_float(dy[pair.first ? j : pair.partner]);
  float v = to_float(dy[pair.first ? pair.partner : j]);
  detail::rotate_pair(a, v, c, sn);
  return pair.first ? a : v;
}

// One block (32 lanes) per chunk: blockIdx.x < q_chunks takes q's chunk blockIdx.x, the rest
// k's. partials: [chunks, D] per side (q's then k's), or null without weight gradients.
// Launch bounds: a 32-thread block alone would have ptxas fit 32 blocks per multiprocessor
// (64 registers) and spill; 16 blocks leave it 128.
template <typename T, typename C, bool kVector>
__global__ void __launch_bounds__(kLanes, 16)
    qk_norm_rope_backward_kernel(const __grid_constant__ QkNormRopeParams p, float* q_partials,
                                 float* k_partials) {
  const internal::RopeParams& r = p.rope;
  const int lane = threadIdx.x;
  const std::int64_t dim = r.head_dim;
  const std::int64_t tokens = r.batch * r.seq;
  const std::int64_t q_chunks = detail::weight_grad_chunks(tokens * r.q.heads);
  const std::int64_t k_chunks = r.has_k ? detail::weight_grad_chunks(tokens * r.k.heads) : 0;
  const float sin_sign = r.inverse ? -1.0f : 1.0f;
  for (std::int64_t block = blockIdx.x; block < q_chunks + k_chunks; block += gridDim.x) {
    const bool is_q = block < q_chunks;
    const std::int64_t chunk = is_q ? block : block - q_chunks;
    const std::int64_t side_heads = is_q ? r.q.heads : r.k.heads;
    const std::int64_t rows = tokens * side_heads;
    float* partial = is_q ? q_partials : k_partials;
    if (partial != nullptr) {
      partial += chunk * dim;
      for (std::int64_t j = lane; j < dim; j += kLanes) partial[j] = 0.0f;
    }
    const std::int64_t end = min(rows, (chunk + 1) * detail::kWeightGradRows);
    for (std::int64_t n = chunk * detail::kWeightGradRows; n < end; ++n) {
      const std::int64_t t = n / side_heads;
      const std::int64_t h = n - t * side_heads;
      const std::int64_t b = t / r.seq;
      const std::int64_t s = t - b * r.seq;
      const internal::RopeRow<T> row = internal::rope_row<T>(r, b, s, is_q ? h : r.q.heads + h);
      if (internal::rope_bad_stream(r, b, s) >= 0) {  // the same for every lane: no barrier skew
        zero_row(row.out, dim, lane);
        if (lane == 0)
          report_bad_row(r.bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
        continue;
      }
      const T* x = internal::qk_saved_row<T>(p, is_q, b, s, h);
      const internal::TokenPositions pos = internal::token_positions(r, b, s);
      float part[kWidth];
      square_partials<T, kVector>(x, dim, lane, true, part);
      const float rstd = detail::norm_rstd(reduce_norm_partials(part, 0, lane), dim, p.norm.eps);

      // The sum of u_j * xhat_j over this lane's elements; the weight gradient's terms.
#pragma unroll
      for (int w = 0; w < kWidth; ++w) part[w] = 0.0f;
      for (std::int64_t j0 = lane * kWidth; j0 < dim; j0 += kLanes * kWidth) {
#pragma unroll
        for (int w = 0; w < kWidth; ++w) {
          const std::int64_t j = j0 + w;
          if (j < dim) {
            const float g = normalized_gradient<T, C>(r, row.in, j, pos, sin_sign);
            const float xhat = detail::rms_normalized(to_float(x[j]), rstd);
            if (partial != nullptr) partial[j] += detail::norm_product(g, xhat);
            part[w] += detail::norm_product(
                detail::norm_product(internal::qk_norm_weight(p.norm, is_q, j), g), xhat);
          }
        }
      }
      const float c = detail::rms_backward_factor(reduce_norm_partials(part, 0, lane), dim, rstd);

      // dx, pair by pair (then the pass-through elements): each element read and written by
      // one thread.
      auto gradient = [&](std::int64_t j, float g) {
        const float u = detail::norm_product(internal::qk_norm_weight(p.norm, is_q, j), g);
        const float xhat = detail::rms_normalized(to_float(x[j]), rstd);
        return from_float<T>(detail::rms_backward_value(u, xhat, rstd, c));
      };
      for (std::int64_t i = lane; i < r.rotary_dim / 2; i += kLanes) {
        const std::int64_t ia = internal::rope_pair_first(r, i);
        const std::int64_t ib = internal::rope_pair_second(r, i);
        float cs, sn;
        internal::rope_pair_cos_sin<C>(r, pos, i, sin_sign, cs, sn);
        float a = to_float(row.in[ia]), v = to_float(row.in[ib]);
        detail::rotate_pair(a, v, cs, sn);
        row.out[ia] = gradient(ia, a);
        row.out[ib] = gradient(ib, v);
      }
      for (std::int64_t j = r.rotary_dim + lane; j < dim; j += kLanes) {
        row.out[j] = gradient(j, to_float(row.in[j]));
      }
    }
  }
  if (last_block_done(r.bad)) describe_bad_rope_position(r);
}

// The backward's fast path (launch_neox_path: neox rows rotated whole, D 64, 128 or 256, a
// float32 table), after the forward's: one warp per chunk of detail::kWeightGradRows rows as in
// qk_norm_rope_backward_kernel, lane l holding elements l + 32 k. kBackwardRows rows at a time:
// their x and dy loads in flight together, dy rotated back in registers (a pair lies within
// the lane), each of the two row sums by sum_norm_nodes (one barrier per row and sum), then
// dx written by the lane that read the element (in place is race-free). The chunk's weight-
// gradient terms g_j * xhat_j are summed in registers in row order, from +0 as the workspace
// row was, and written once at the chunk's end: the same additions in the same order, so the
// same bits as the general kernel and the CPU, where the general kernel added each row's terms
// into the workspace row (a load and a store per element and row; the model put it at 21% of
// its bound, with 27 L1 sectors per DRAM sector).
// Rows at a time: 4, and 2 for D 256, whose blocks get 8 per multiprocessor (255 registers:
// at 128 and 170 the float16 / float32 instantiations spilled).
template <int kHeadDim>
constexpr int kBackwardRows = kHeadDim <= 128 ? 4 : 2;
static_assert(2 * kNormNodes <= kNormBlockRows * (detail::kNormPartials + kLanes),
              "two buffers of nodes fit in the norm scratch");

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kLanes, kHeadDim <= 128 ? 16 : 8)
    qk_norm_rope_backward_neox_kernel(const __grid_constant__ QkNormRopeParams p, float* q_partials,
                                      float* k_partials) {
  constexpr int kElements = kHeadDim / kLanes;  // l + 32 k
  constexpr int kPairs = kElements / 2;         // pairs l + 32 k, partners + D / 2
  static_assert(kElements <= kLeavesPerNode && kElements % 2 == 0, "64 <= D <= 256, D % 64 == 0");
  constexpr int kRows = kBackwardRows<kHeadDim>;
  const internal::RopeParams& r = p.rope;
  const int lane = threadIdx.x;
  const std::int64_t tokens = r.batch * r.seq;
  const std::int64_t q_chunks = detail::weight_grad_chunks(tokens * r.q.heads);
  const std::int64_t k_chunks = r.has_k ? detail::weight_grad_chunks(tokens * r.k.heads) : 0;
  const float sin_sign = r.inverse ? -1.0f : 1.0f;
  int buffer = 0;
  // The buffer of nodes for the next sum (two, alternating: a lane may still read the last).
  auto next_nodes = [&]() {
    float* const nodes = block_shared().norm_scratch + buffer * kNormNodes;
    buffer ^= 1;
    return nodes;
  };
  for (std::int64_t block = blockIdx.x; block < q_chunks + k_chunks; block += gridDim.x) {
    const bool is_q = block < q_chunks;
    const std::int64_t chunk = is_q ? block : block - q_chunks;
    const std::int64_t side_heads = is_q ? r.q.heads : r.k.heads;
    const std::int64_t end = min(tokens * side_heads, (chunk + 1) * detail::kWeightGradRows);
    float weight[kElements], weight_grad[kElements];
#pragma unroll
    for (int k = 0; k < kElements; ++k) {
      weight[k] = internal::qk_norm_weight(p.norm, is_q, lane + kLanes * k);
      weight_grad[k] = 0.0f;
    }
    for (std::int64_t first = chunk * detail::kWeightGradRows; first < end; first += kRows) {
      float x[kRows][kElements] = {}, g[kRows][kElements] = {};
      float c[kRows][kPairs] = {}, sn[kRows][kPairs] = {};
      T x_in[kRows][kElements] = {}, dy_in[kRows][kElements] = {};
      T* out[kRows];
      bool good[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const std::int64_t n = first + i;
        good[i] = false;
        out[i] = nullptr;
        if (n >= end) continue;
        const std::int64_t t = n / side_heads;
        const std::int64_t h = n - t * side_heads;
        const std::int64_t b = t / r.seq;
        const std::int64_t s = t - b * r.seq;
        const internal::RopeRow<T> row = internal::rope_row<T>(r, b, s, is_q ? h : r.q.heads + h);
        out[i] = row.out;
        if (internal::rope_bad_stream(r, b, s) >= 0) {  // the same for every lane
          zero_row(row.out, kHeadDim, lane);
          if (lane == 0)
            report_bad_row(r.bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
          continue;
        }
        good[i] = true;
        const T* saved = internal::qk_saved_row<T>(p, is_q, b, s, h);
#pragma unroll
        for (int k = 0; k < kElements; ++k) {  // converted below: the loads stay in flight
          x_in[i][k] = saved[lane + kLanes * k];
          dy_in[i][k] = row.in[lane + kLanes * k];
        }
        const internal::TokenPositions pos = internal::token_positions(r, b, s);
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          internal::rope_pair_cos_sin<float>(r, pos, lane + kLanes * k, sin_sign, c[i][k],
                                             sn[i][k]);
        }
      }
      // g: dy rotated back (normalized_gradient's pairs), after every row's loads were issued.
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (!good[i]) continue;
#pragma unroll
        for (int k = 0; k < kElements; ++k) {
          x[i][k] = to_float(x_in[i][k]);
          g[i][k] = to_float(dy_in[i][k]);
        }
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          detail::rotate_pair(g[i][k], g[i][k + kPairs], c[i][k], sn[i][k]);
        }
      }
      float rstd[kRows], factor[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {  // the sum of x^2 (zeros for a row not there)
        float part[kLeavesPerNode];
#pragma unroll
        for (int k = 0; k < kLeavesPerNode; ++k) part[k] = 0.0f;
        if (good[i]) {
#pragma unroll
          for (int k = 0; k < kElements; ++k) part[k] += detail::norm_square_term(x[i][k], 0.0f);
        }
        const float sum = sum_norm_nodes(subtree_sum<kLeavesPerNode / 2>(part), next_nodes(), lane);
        rstd[i] = detail::norm_rstd(sum, kHeadDim, p.norm.eps);
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {  // the sum of u * xhat, u = w * g
        float part[kLeavesPerNode];
#pragma unroll
        for (int k = 0; k < kLeavesPerNode; ++k) part[k] = 0.0f;
        if (good[i]) {
#pragma unroll
          for (int k = 0; k < kElements; ++k) {
            part[k] += detail::norm_product(detail::norm_product(weight[k], g[i][k]),
                                            detail::rms_normalized(x[i][k], rstd[i]));
          }
        }
        const float sum = sum_norm_nodes(subtree_sum<kLeavesPerNode / 2>(part), next_nodes(), lane);
        factor[i] = detail::rms_backward_factor(sum, kHeadDim, rstd[i]);
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (!good[i]) continue;
#pragma unroll
        for (int k = 0; k < kElements; ++k) {
          const float xhat = detail::rms_normalized(x[i][k], rstd[i]);
          weight_grad[k] += detail::norm_product(g[i][k], xhat);
          const float u = detail::norm_product(weight[k], g[i][k]);
          out[i][lane + kLanes * k] =
              from_float<T>(detail::rms_backward_value(u, xhat, rstd[i], factor[i]));
        }
      }
    }
    float* const partial = is_q ? q_partials : k_partials;
    if (partial != nullptr) {
#pragma unroll
      for (int k = 0; k < kElements; ++k) {
        partial[chunk * kHeadDim + lane + kLanes * k] = weight_grad[k];
      }
    }
  }
  if (last_block_done(r.bad)) describe_bad_rope_position(r);
}

// dw_j = the chunk partials of column j summed in ascending chunk order from +0 (zero for no
// rows). Ids [0, D) take q's columns, [D, 2 D) k's, striding over the grid (grid_for caps it).
__global__ void qk_weight_grad_kernel(float* q_grad, const float* q_partials, std::int64_t q_chunks,
                                      float* k_grad, const float* k_partials, std::int64_t k_chunks,
                                      std::int64_t dim) {
  for (std::int64_t id = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       id < 2 * dim; id += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const bool is_q = id < dim;
    const std::int64_t j = is_q ? id : id - dim;
    float* grad = is_q ? q_grad : k_grad;
    if (grad == nullptr) continue;
    const float* partials = is_q ? q_partials : k_partials;
    const std::int64_t chunks = is_q ? q_chunks : k_chunks;
    float sum = 0.0f;
    for (std::int64_t c = 0; c < chunks; ++c) sum += partials[c * dim + j];
    grad[j] = sum;
  }
}

// The workspace: [chunks, D] float32 partials for each side whose gradient is requested.
struct PartialsLayout {
  float* q = nullptr;
  float* k = nullptr;
  std::int64_t q_chunks = 0, k_chunks = 0;
};
PartialsLayout lay_out(const QkNormRopeParams& p, WorkspaceLayout& layout) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t tokens = r.batch * r.seq;
  PartialsLayout out;
  out.q_chunks = detail::weight_grad_chunks(tokens * r.q.heads);
  out.k_chunks = r.has_k ? detail::weight_grad_chunks(tokens * r.k.heads) : 0;
  const auto dim = static_cast<std::size_t>(r.head_dim);
  if (p.q_weight_grad != nullptr) out.q = layout.take<float>(out.q_chunks * dim);
  if (p.k_weight_grad != nullptr) out.k = layout.take<float>(out.k_chunks * dim);
  return out;
}

// The sum pass's 16-byte loads need D a multiple of 8 and every row start in whole chunks.
template <typename T>
bool fits_vector_path(const internal::RopeHeads& x, bool present, std::int64_t dim) {
  constexpr std::int64_t vec = kVec16<T>;
  if (!present) return true;
  return dim % kWidth == 0 && is_aligned(x.in, 16) && x.in_stride_b % vec == 0 &&
         x.in_stride_s % vec == 0 && x.in_stride_h % vec == 0;
}

// The fast path, where it applies (neox, the whole row rotated, D 64, 128 or 256, a float32
// table): run(std::integral_constant<int, D>) and true; otherwise false.
template <typename C, typename Run>
bool launch_neox_path(const internal::RopeParams& r, std::int64_t rows, Run&& run) {
  if (!std::is_same_v<C, float> || r.layout != RopeLayout::neox || r.rotary_dim != r.head_dim ||
      rows == 0) {
    return false;
  }
  switch (r.head_dim) {
    case 64:
      run(std::integral_constant<int, 64>{});
      return true;
    case 128:
      run(std::integral_constant<int, 128>{});
      return true;
    case 256:
      run(std::integral_constant<int, 256>{});
      return true;
    default:
      return false;
  }
}

template <typename T, int kHeadDim>
void launch_neox(const QkNormRopeParams& p, cudaStream_t stream) {
  const internal::RopeParams& r = p.rope;
  const RowsLaunch shape =
      rows_launch(r.batch * r.seq, r.q.heads + (r.has_k ? r.k.heads : 0), kLanes);
  qk_norm_rope_neox_kernel<T, kHeadDim>
      <<<shape.grid, shape.block, 0, stream>>>(p, shape.rows_per_split);
  check_launch("qk_norm_rope_neox_kernel");
}

template <typename T, typename C>
void launch_forward(const QkNormRopeParams& p, cudaStream_t stream) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t rows = r.batch * r.seq * (r.q.heads + (r.has_k ? r.k.heads : 0));
  if (launch_neox_path<C>(r, rows,
                          [&](auto dim) { launch_neox<T, decltype(dim)::value>(p, stream); })) {
    return;
  }
  const dim3 block(kLanes, kNormBlockRows);
  const unsigned grid = grid_for(rows, kNormBlockRows, kForwardThreads);
  if (fits_vector_path<T>(r.q, true, r.head_dim) && fits_vector_path<T>(r.k, r.has_k, r.head_dim)) {
    qk_norm_rope_kernel<T, C, true><<<grid, block, 0, stream>>>(p);
  } else {
    qk_norm_rope_kernel<T, C, false><<<grid, block, 0, stream>>>(p);
  }
  check_launch("qk_norm_rope_kernel");
}

template <typename T, int kHeadDim>
void launch_append_kv_neox(const internal::RopeAppendKvParams& p, cudaStream_t stream) {
  const internal::RopeParams& r = p.rope;
  const RowsLaunch shape = rows_launch(r.batch * r.seq, r.q.heads + 2 * r.k.heads, kLanes);
  qk_norm_rope_append_kv_neox_kernel<T, kHeadDim>
      <<<shape.grid, shape.block, 0, stream>>>(p, shape.rows_per_split);
  check_launch("qk_norm_rope_append_kv_neox_kernel");
}

template <typename T, typename C>
void launch_append_kv(const internal::RopeAppendKvParams& p, cudaStream_t stream) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t rows = r.batch * r.seq * (r.q.heads + 2 * r.k.heads);
  if (launch_neox_path<C>(
          r, rows, [&](auto dim) { launch_append_kv_neox<T, decltype(dim)::value>(p, stream); })) {
    return;
  }
  const dim3 block(kLanes, kNormBlockRows);
  const unsigned grid = grid_for(rows, kNormBlockRows, kForwardThreads);
  if (fits_vector_path<T>(r.q, true, r.head_dim) && fits_vector_path<T>(r.k, true, r.head_dim)) {
    qk_norm_rope_append_kv_kernel<T, C, true><<<grid, block, 0, stream>>>(p);
  } else {
    qk_norm_rope_append_kv_kernel<T, C, false><<<grid, block, 0, stream>>>(p);
  }
  check_launch("qk_norm_rope_append_kv_kernel");
}

template <typename T, typename C>
void launch_backward(const QkNormRopeParams& p, cudaStream_t stream) {
  const internal::RopeParams& r = p.rope;
  const bool weight_grads = p.q_weight_grad != nullptr || p.k_weight_grad != nullptr;
  WorkspaceLayout sizes(nullptr);
  lay_out(p, sizes);
  PartialsLayout partials;
  std::optional<Workspace> workspace;
  if (weight_grads) {
    workspace.emplace(p.workspace, sizes.required_bytes(), stream, "apply_qk_norm_rope_backward");
    WorkspaceLayout layout(workspace->base());
    partials = lay_out(p, layout);
  } else {
    WorkspaceLayout layout(nullptr);
    partials = lay_out(p, layout);
  }
  const std::int64_t blocks = partials.q_chunks + partials.k_chunks;
  const unsigned grid = grid_for(blocks, 1, kLanes);
  const bool neox = launch_neox_path<C>(r, blocks, [&](auto dim) {
    qk_norm_rope_backward_neox_kernel<T, decltype(dim)::value>
        <<<grid, kLanes, 0, stream>>>(p, partials.q, partials.k);
    check_launch("qk_norm_rope_backward_neox_kernel");
  });
  if (!neox && blocks > 0) {
    const bool vector = fits_vector_path<T>(p.saved_q, true, r.head_dim) &&
                        fits_vector_path<T>(p.saved_k, r.has_k, r.head_dim);
    if (vector) {
      qk_norm_rope_backward_kernel<T, C, true>
          <<<grid, kLanes, 0, stream>>>(p, partials.q, partials.k);
    } else {
      qk_norm_rope_backward_kernel<T, C, false>
          <<<grid, kLanes, 0, stream>>>(p, partials.q, partials.k);
    }
    check_launch("qk_norm_rope_backward_kernel");
  }
  if (weight_grads && r.head_dim > 0) {
    qk_weight_grad_kernel<<<grid_for(2 * r.head_dim, 256, 256), 256, 0, stream>>>(
        p.q_weight_grad, partials.q, partials.q_chunks, p.k_weight_grad, partials.k,
        partials.k_chunks, r.head_dim);
    check_launch("qk_weight_grad_kernel");
  }
}

template <typename Run>
void dispatch(const internal::RopeParams& r, Run&& run) {
  internal::dispatch_value_dtype(r.dtype, [&](auto t) {
    internal::dispatch_value_dtype(r.table_dtype, [&](auto c) { run(t, c); });
  });
}

}  // namespace

void apply_qk_norm_rope(const QkNormRopeParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  dispatch(p.rope, [&](auto t, auto c) {
    launch_forward<typename decltype(t)::type, typename decltype(c)::type>(p, to_cuda(stream));
  });
}

void apply_qk_norm_rope_append_kv(const internal::RopeAppendKvParams& p, Device device,
                                  Stream stream) {
  DeviceGuard guard(device);
  dispatch(p.rope, [&](auto t, auto c) {
    launch_append_kv<typename decltype(t)::type, typename decltype(c)::type>(p, to_cuda(stream));
  });
}

void apply_qk_norm_rope_backward(const QkNormRopeParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  dispatch(p.rope, [&](auto t, auto c) {
    launch_backward<typename decltype(t)::type, typename decltype(c)::type>(p, to_cuda(stream));
  });
}

std::size_t apply_qk_norm_rope_backward_workspace_size(const QkNormRopeParams& p, Device) {
  if (p.q_weight_grad == nullptr && p.k_weight_grad == nullptr) return 0;
  WorkspaceLayout sizes(nullptr);
  lay_out(p, sizes);
  return sizes.required_bytes();
}

}  // namespace embrope::gpu
