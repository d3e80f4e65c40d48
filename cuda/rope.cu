// RoPE on the GPU: Su et al. 2021 (RoFormer) rotation, pairs as in GPT-NeoX (rotate_half)
// or GPT-J (interleaved), the same detail::rotate_pair as the CPU path.
//
// Shape of the launch: one warp per (token, head) row, q heads then k heads in one grid
// (one launch for both), grid-stride over rows. Each lane owns whole rotation pairs, so in
// place is race-free. This is the straightforward kernel; its speed is measured by the
// benchmark.
#include "../src/backend.hpp"
#include "common.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"

namespace embrope::cuda {
namespace {

using detail::BFloat16;
using detail::from_float;
using detail::Half;
using detail::to_float;

constexpr int kWarpsPerBlock = 8;

template <typename T, typename C>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    rope_kernel(const __grid_constant__ detail::RopeParams p) {
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  const std::int64_t rows = p.batch * p.seq * heads;
  const std::int64_t half = p.rotary_dim / 2;
  const float sin_sign = p.inverse ? -1.0f : 1.0f;
  const int lane = threadIdx.x;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.y;
       r < rows; r += warp_stride) {
    const std::int64_t t = r / heads;
    const std::int64_t h = r - t * heads;
    const std::int64_t b = t / p.seq;
    const std::int64_t s = t - b * p.seq;
    const bool is_q = h < p.q.heads;
    const detail::RopeHeads& x = is_q ? p.q : p.k;
    const std::int64_t hh = is_q ? h : h - p.q.heads;
    const T* in = static_cast<const T*>(x.in) + b * x.in_stride_b + s * x.in_stride_s +
                  hh * x.in_stride_h;
    T* out = static_cast<T*>(x.out) + b * x.out_stride_b + s * x.out_stride_s +
             hh * x.out_stride_h;
    const std::int64_t position = detail::load_index(
        p.positions, p.position_dtype, b * p.position_stride_b + s * p.position_stride_s);
    if (position < 0 || position >= p.table_rows) {
      for (std::int64_t j = lane; j < p.head_dim; j += 32) out[j] = from_float<T>(0.0f);
      if (lane == 0) report_bad_row(p.bad, detail::bad_index_key(t, detail::BadIndexArg::positions));
      continue;
    }
    const C* cos_row = static_cast<const C*>(p.cos) + position * p.cos_stride;
    const C* sin_row = static_cast<const C*>(p.sin) + position * p.sin_stride;
    for (std::int64_t i = lane; i < half; i += 32) {
      const std::int64_t ia = p.layout == RopeLayout::neox ? i : 2 * i;
      const std::int64_t ib = p.layout == RopeLayout::neox ? i + half : 2 * i + 1;
      float a = to_float(in[ia]);
      float v = to_float(in[ib]);
      detail::rotate_pair(a, v, to_float(cos_row[i]), sin_sign * to_float(sin_row[i]));
      out[ia] = from_float<T>(a);
      out[ib] = from_float<T>(v);
    }
    if (out != in) {
      for (std::int64_t j = p.rotary_dim + lane; j < p.head_dim; j += 32) out[j] = in[j];
    }
  }
  if (last_block_done(p.bad)) {
    const std::int64_t key = p.bad->key;
    if (key != detail::kNoBadIndex && key / 8 < p.batch * p.seq &&
        key % 8 == static_cast<std::int64_t>(detail::BadIndexArg::positions)) {
      const std::int64_t t = key / 8;
      const std::int64_t b = t / p.seq;
      const std::int64_t value = detail::load_index(
          p.positions, p.position_dtype, b * p.position_stride_b + (t - b * p.seq) * p.position_stride_s);
      if (value < 0 || value >= p.table_rows) {
        p.bad->value = value;
        p.bad->lower = 0;
        p.bad->upper = p.table_rows;
        p.bad->op = static_cast<std::int32_t>(detail::BadIndexOp::apply_rope);
      }
    }
  }
}

template <typename T, typename C>
void launch(const detail::RopeParams& p, cudaStream_t stream) {
  const std::int64_t rows = p.batch * p.seq * (p.q.heads + (p.has_k ? p.k.heads : 0));
  const dim3 block(32, kWarpsPerBlock);
  rope_kernel<T, C><<<grid_for(rows, kWarpsPerBlock), block, 0, stream>>>(p);
  check_launch("rope_kernel");
}

template <typename T>
void launch_for_table(const detail::RopeParams& p, cudaStream_t stream) {
  switch (p.table_dtype) {
    case DType::float16: return launch<T, Half>(p, stream);
    case DType::bfloat16: return launch<T, BFloat16>(p, stream);
    default: return launch<T, float>(p, stream);
  }
}

}  // namespace

void apply_rope(const detail::RopeParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  switch (p.dtype) {
    case DType::float16: return launch_for_table<Half>(p, to_cuda(stream));
    case DType::bfloat16: return launch_for_table<BFloat16>(p, to_cuda(stream));
    default: return launch_for_table<float>(p, to_cuda(stream));
  }
}

}  // namespace embrope::cuda
