// embed on the GPU: one warp per output row, grid-stride over rows. Token row scaled, then
// the positional row (learned, or sinusoidal after Vaswani et al. 2017) and the type row
// added in float32 in that order, as on the CPU, and rounded once. Row resolution and
// range checks are detail::resolve_embed_row, shared with the CPU path.
#include "../src/backend.hpp"
#include "common.cuh"
#include "embrope/detail/embed_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/sinusoid.hpp"

namespace embrope::cuda {
namespace {

using detail::BFloat16;
using detail::from_float;
using detail::Half;
using detail::to_float;

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) embed_kernel(const __grid_constant__ detail::EmbedParams p) {
  const int lane = threadIdx.x;
  const std::int64_t dim = p.dim;
  const std::int64_t half = dim / 2;
  const bool sinusoidal = p.positions == PositionEncoding::sinusoidal;
  const bool split = p.sinusoid_layout == SinusoidLayout::split;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t n = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.y;
       n < p.rows; n += warp_stride) {
    std::int64_t offsets[detail::RowIndex::count];
    detail::row_offsets(p.index, n, offsets);
    T* out = static_cast<T*>(p.out) + offsets[detail::RowIndex::out];
    const detail::EmbedRow r = detail::resolve_embed_row(p, n);
    if (r.bad_key != detail::kNoBadIndex) {
      for (std::int64_t j = lane; j < dim; j += 32) out[j] = from_float<T>(0.0f);
      if (lane == 0) report_bad_row(p.bad, r.bad_key);
      continue;
    }
    const T* token = static_cast<const T*>(p.table) + r.token * p.table_stride;
    const T* pos = p.position_table == nullptr
                       ? nullptr
                       : static_cast<const T*>(p.position_table) + r.position * p.position_table_stride;
    const T* type = p.type_table == nullptr
                        ? nullptr
                        : static_cast<const T*>(p.type_table) + r.type * p.type_table_stride;
    for (std::int64_t j = lane; j < dim; j += 32) {
      float v = r.token_hit ? p.scale * to_float(token[j]) : 0.0f;
      if (pos != nullptr) {
        v += to_float(pos[j]);
      } else if (sinusoidal) {
        const std::int64_t i = split ? (j < half ? j : j - half) : j / 2;
        const bool is_sin = split ? j < half : (j % 2 == 0);
        float sv, cv;
        detail::sinusoid_sin_cos(r.position, detail::sinusoid_freq(i, dim, p.sinusoid_base), &sv, &cv);
        v += is_sin ? sv : cv;
      }
      if (type != nullptr) v += to_float(type[j]);
      out[j] = from_float<T>(v);
    }
  }
  if (last_block_done(p.bad)) {
    const std::int64_t key = p.bad->key;
    if (key != detail::kNoBadIndex && key / 8 < p.rows) {
      const detail::EmbedRow r = detail::resolve_embed_row(p, key / 8);
      if (r.bad_key == key) {
        p.bad->value = r.bad_value;
        p.bad->lower = r.bad_lower;
        p.bad->upper = r.bad_upper;
        p.bad->op = static_cast<std::int32_t>(detail::BadIndexOp::embed);
      }
    }
  }
}

template <typename T>
void launch(const detail::EmbedParams& p, cudaStream_t stream) {
  const dim3 block(32, kWarpsPerBlock);
  embed_kernel<T><<<grid_for(p.rows, kWarpsPerBlock), block, 0, stream>>>(p);
  check_launch("embed_kernel");
}

}  // namespace

void embed(const detail::EmbedParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  switch (p.dtype) {
    case DType::float16: return launch<Half>(p, to_cuda(stream));
    case DType::bfloat16: return launch<BFloat16>(p, to_cuda(stream));
    default: return launch<float>(p, to_cuda(stream));
  }
}

}  // namespace embrope::cuda
