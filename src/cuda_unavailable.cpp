// The CUDA backend of a build without CUDA: no devices, and a clear error for CUDA tensors.
#include "backend.hpp"
#include "device_runtime.hpp"
#include "embrope/error.hpp"

namespace embrope::gpu {
namespace {
[[noreturn]] void unavailable(const char* what) {
  throw Error(
      ErrorCode::not_implemented,
      std::string(what) + ": embrope was built without CUDA (configure with EMBROPE_CUDA=ON)");
}
}  // namespace

int device_count() {
  return 0;
}
void* allocate(std::size_t, Device) {
  unavailable("allocate");
}
void release(void*, Device) noexcept {}
void copy_to_host(void*, const void*, std::size_t, Device, Stream) {
  unavailable("copy_to_host");
}
void copy_to_device(void*, const void*, std::size_t, Device, Stream) {
  unavailable("copy_to_device");
}
void synchronize(Stream, Device) {
  unavailable("synchronize");
}
bool capturing(Stream, Device) {
  unavailable("capturing");
}
void embed(const internal::EmbedParams&, Device, Stream) {
  unavailable("embed");
}
void apply_rope(const internal::RopeParams&, Device, Stream) {
  unavailable("apply_rope");
}
void apply_rope_append_kv(const internal::RopeAppendKvParams&, Device, Stream) {
  unavailable("apply_rope_append_kv");
}
void apply_qk_norm_rope(const internal::QkNormRopeParams&, Device, Stream) {
  unavailable("apply_qk_norm_rope");
}
void apply_qk_norm_rope_append_kv(const internal::RopeAppendKvParams&, Device, Stream) {
  unavailable("apply_qk_norm_rope_append_kv");
}
void apply_qk_norm_rope_backward(const internal::QkNormRopeParams&, Device, Stream) {
  unavailable("apply_qk_norm_rope_backward");
}
std::size_t apply_qk_norm_rope_backward_workspace_size(const internal::QkNormRopeParams&, Device) {
  unavailable("apply_qk_norm_rope_backward");
}
void packed_positions(const internal::PackedPositionsParams&, Device, Stream) {
  unavailable("packed_positions");
}
void build_rope_cache(float*, std::int64_t, std::int64_t, const double*, double, Device, Stream) {
  unavailable("RopeCache");
}

void embed_backward(const internal::EmbedBackwardParams&, Device, Stream) {
  unavailable("embed_backward");
}
std::size_t embed_backward_workspace_size(const internal::EmbedBackwardParams&, Device) {
  unavailable("embed_backward");
}
std::size_t packed_positions_workspace_size(const internal::PackedPositionsParams&, Device) {
  unavailable("packed_positions");
}

}  // namespace embrope::gpu
