// embed from a quantized token table into bfloat16 outputs (embed.cuh's launch_quantized_rows):
// a unit per output type, so that the three types' kernels compile side by side.
#include "embed.cuh"

namespace embrope::gpu {

template <>
void launch_quantized<detail::BFloat16>(const internal::EmbedParams& p,
                                        const SinusoidTable& sinusoids, const NormFactors& factors,
                                        cudaStream_t stream) {
  launch_quantized_rows<detail::BFloat16>(p, sinusoids, factors, stream);
}

}  // namespace embrope::gpu
