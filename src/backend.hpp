// The entry points each backend provides. src/<op>.cpp validates, fills detail::*Params and
// calls one of these; kernels trust their parameters.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embrope/detail/params.hpp"
#include "embrope/rope_cache.hpp"
#include "embrope/tensor.hpp"

namespace embrope::cpu {

void embed(const detail::EmbedParams& params);
void apply_rope(const detail::RopeParams& params);
void packed_positions(const detail::PackedPositionsParams& params);
// Fills a [max_positions, R] table (layout in rope_cache.hpp) from inv_freq [R/2].
void build_rope_cache(float* table, std::int64_t max_positions, std::int64_t rotary_dim,
                      const double* inv_freq, double attention_factor);

}  // namespace embrope::cpu

namespace embrope::cuda {

// Runtime services. Without CUDA (at build time or at run time) device_count() is 0 and the
// rest throw Error(not_implemented).
int device_count();
void* allocate(std::size_t bytes, Device device);
void release(void* pointer, Device device) noexcept;
void copy_to_host(void* host, const void* device_pointer, std::size_t bytes, Device device,
                  Stream stream);
void copy_to_device(void* device_pointer, const void* host, std::size_t bytes, Device device,
                    Stream stream);
void synchronize(Stream stream, Device device);

// Kernels: enqueue on the stream and return.
void embed(const detail::EmbedParams& params, Device device, Stream stream);
void apply_rope(const detail::RopeParams& params, Device device, Stream stream);
void packed_positions(const detail::PackedPositionsParams& params, Device device, Stream stream);
void build_rope_cache(float* table, std::int64_t max_positions, std::int64_t rotary_dim,
                      const double* inv_freq, double attention_factor, Device device,
                      Stream stream);

}  // namespace embrope::cuda

// ---------------------------------------------------------------- backward passes ----

namespace embrope::cpu {
void embed_backward(const detail::EmbedBackwardParams& params);
}  // namespace embrope::cpu

namespace embrope::cuda {
// Enqueues on the stream and returns (no host synchronisation).
void embed_backward(const detail::EmbedBackwardParams& params, Device device, Stream stream);
// Bytes of workspace embed_backward needs for these parameters (0 in atomic mode when every
// gradient is float32).
std::size_t embed_backward_workspace_size(const detail::EmbedBackwardParams& params, Device device);
}  // namespace embrope::cuda
