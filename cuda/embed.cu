// embed on the GPU: the call's tables (sinusoids, norm factors) and the launch of embed.cuh's
// kernels for its output type; quantized token tables in embed_quantized_<type>.cu.
#include <optional>

#include "embed.cuh"

namespace embrope::gpu {

namespace {

// Block (i, b): the frequency w_i (b = 0 writes it) and sin/cos(b w_i) in float32.
__global__ void __launch_bounds__(kThreadsPerBlock)
    sinusoid_table_kernel(std::int64_t dim, double base, double* freq, float2* offset) {
  const std::int64_t half = dim / 2;
  const std::int64_t b = blockIdx.y;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < half;
       i += stride) {
    const double w = detail::sinusoid_freq(i, dim, base);
    if (b == 0) freq[i] = w;
    const detail::SinCos v = detail::sin_cos_f64(static_cast<double>(b) * w);
    offset[b * half + i] = make_float2(static_cast<float>(v.sin), static_cast<float>(v.cos));
  }
}

// The norm's factors of the call (NormFactors): element j's weight and bias.
__global__ void __launch_bounds__(kThreadsPerBlock)
    norm_factor_kernel(const __grid_constant__ internal::EmbedParams p, float* weight,
                       float* bias) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < p.dim;
       j += stride) {
    const internal::NormFactor f = internal::norm_factor(p, j);
    weight[j] = f.weight;
    bias[j] = f.bias;
  }
}

// The pieces of the call's tables in a workspace layout: the sinusoids (sinusoidal positions)
// and the norm's factors (with a norm).
struct TablePieces {
  double* freq = nullptr;
  float2* offset = nullptr;
  float* weight = nullptr;
  float* bias = nullptr;
};
TablePieces take_table_pieces(const internal::EmbedParams& p, WorkspaceLayout& layout) {
  TablePieces pieces;
  const auto dim = static_cast<std::size_t>(p.dim);
  if (p.positions == PositionEncoding::sinusoidal) {
    pieces.freq = layout.take<double>(dim / 2);
    pieces.offset =
        layout.take<float2>(static_cast<std::size_t>(detail::kSinusoidBlock) * (dim / 2));
  }
  if (p.norm != Normalization::none) {
    pieces.weight = layout.take<float>(dim);
    pieces.bias = layout.take<float>(dim);
  }
  return pieces;
}

struct CallTables {
  SinusoidTable sinusoids;
  NormFactors norm;
};

// The call's tables, in `workspace` (allocated on the stream, freed in stream order when the
// call returns), or none.
CallTables make_call_tables(const internal::EmbedParams& p, std::optional<Workspace>& workspace,
                            cudaStream_t stream) {
  WorkspaceLayout sizes(nullptr);
  take_table_pieces(p, sizes);
  if (sizes.used_bytes() == 0) return {};  // no table to build
  workspace.emplace(nullptr, sizes.required_bytes(), stream, "embed");
  WorkspaceLayout layout(workspace->base());
  const TablePieces pieces = take_table_pieces(p, layout);
  if (pieces.freq != nullptr) {
    const std::int64_t half = p.dim / 2;
    const dim3 grid(grid_for(half, kThreadsPerBlock, kThreadsPerBlock),
                    static_cast<unsigned>(detail::kSinusoidBlock));
    sinusoid_table_kernel<<<grid, kThreadsPerBlock, 0, stream>>>(p.dim, p.sinusoid_base,
                                                                 pieces.freq, pieces.offset);
    check_launch("sinusoid_table_kernel");
  }
  if (pieces.weight != nullptr) {
    norm_factor_kernel<<<grid_for(p.dim, kThreadsPerBlock, kThreadsPerBlock), kThreadsPerBlock, 0,
                         stream>>>(p, pieces.weight, pieces.bias);
    check_launch("norm_factor_kernel");
  }
  return {{pieces.freq, pieces.offset}, {pieces.weight, pieces.bias}};
}

template <typename T>
void launch(const internal::EmbedParams& p, cudaStream_t stream) {
  std::optional<Workspace> workspace;
  const CallTables tables = make_call_tables(p, workspace, stream);
  const SinusoidTable& sinusoids = tables.sinusoids;
  if (p.quantized) {
    launch_quantized<T>(p, sinusoids, tables.norm, stream);
    return;
  }
  if (p.norm != Normalization::none) {
    launch_norm<T>(p, sinusoids, tables.norm, stream);
    return;
  }
  if (fits_vector_path<T>(p)) {
    launch_vector_groups<T, false>(p, sinusoids, stream);
  } else {
    launch_group<T, 1, 32>(p, sinusoids, stream);
  }
  check_launch("embed_kernel");
}

}  // namespace

void embed(const internal::EmbedParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  internal::dispatch_value_dtype(
      p.dtype, [&](auto t) { launch<typename decltype(t)::type>(p, to_cuda(stream)); });
}

}  // namespace embrope::gpu
