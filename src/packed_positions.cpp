// packed_positions: validate the shapes once and fill PackedPositionsParams (prepare), then
// run the CPU or CUDA kernel.
#include "embrope/packed_positions.hpp"
#include "embrope/version.hpp"

#include "backend.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE

namespace {

constexpr const char* kOp = "packed_positions";
using validate::fail;

// Validates every argument and fills the parameters of the call.
internal::PackedPositionsParams prepare(const Tensor& cu_seqlens, const Tensor& positions,
                                        const PackedPositionsOptions& options) {
  validate::check_view(kOp, "cu_seqlens", cu_seqlens, 1, 1);
  validate::check_index_dtype(kOp, "cu_seqlens", cu_seqlens);
  const Device device = cu_seqlens.device();
  validate::check_device_usable(kOp, device);
  validate::check_view(kOp, "positions", positions, 1, 1);
  validate::check_index_dtype(kOp, "positions", positions);
  validate::check_same_device(kOp, "positions", positions, "cu_seqlens", device);
  if (cu_seqlens.shape(0) < 1) {
    fail(kOp, "cu_seqlens has shape {}; it needs B + 1 >= 1 entries",
         validate::shape_string(cu_seqlens));
  }
  const std::int64_t sequences = cu_seqlens.shape(0) - 1;
  if (sequences >= INT32_MAX) {
    fail(kOp, "cu_seqlens holds {} sequences; at most {} are supported", sequences, INT32_MAX - 1);
  }
  internal::PackedPositionsParams p;
  p.cu_seqlens = cu_seqlens.data();
  p.cu_dtype = cu_seqlens.dtype();
  p.cu_stride = cu_seqlens.stride(0);
  p.sequences = sequences;
  p.positions = positions.data();
  p.position_dtype = positions.dtype();
  p.position_stride = positions.stride(0);
  p.tokens = positions.shape(0);
  if (options.start_offsets) {
    const Tensor& s = *options.start_offsets;
    validate::check_view(kOp, "start_offsets", s, 1, 1);
    validate::check_index_dtype(kOp, "start_offsets", s);
    validate::check_same_device(kOp, "start_offsets", s, "cu_seqlens", device);
    validate::check_dim(kOp, "start_offsets", s, 0, sequences,
                        "the number of sequences B (cu_seqlens has B + 1 entries)");
    p.start_offsets = s.data();
    p.start_dtype = s.dtype();
    p.start_stride = s.stride(0);
  }
  validate::check_no_self_overlap(kOp, "positions", positions);
  validate::check_no_overlap(kOp, "positions", positions, "cu_seqlens", cu_seqlens);
  if (options.start_offsets) {
    validate::check_no_overlap(kOp, "positions", positions, "start_offsets",
                               *options.start_offsets);
  }
  p.workspace = options.workspace;
  p.workspace_bytes = options.workspace_bytes;
  return p;
}

}  // namespace

void packed_positions(const Tensor& cu_seqlens, const Tensor& positions,
                      const PackedPositionsOptions& options) {
  internal::PackedPositionsParams p = prepare(cu_seqlens, positions, options);
  const Device device = cu_seqlens.device();
  if (device.kind == DeviceKind::cuda && p.workspace != nullptr) {
    const std::size_t needed = gpu::packed_positions_workspace_size(p, device);
    if (p.workspace_bytes < needed) {
      fail(kOp, "workspace_bytes {} is less than the {} bytes this call needs", p.workspace_bytes,
           needed);
    }
  }
  run_kernel(kOp, device, options.stream, options.deferred, p, p.bad, cpu::packed_positions,
             gpu::packed_positions);
}

std::size_t packed_positions_workspace_size(const Tensor& cu_seqlens, const Tensor& positions,
                                            const PackedPositionsOptions& options) {
  const internal::PackedPositionsParams p = prepare(cu_seqlens, positions, options);
  if (cu_seqlens.device().kind == DeviceKind::cpu) return 0;
  return gpu::packed_positions_workspace_size(p, cu_seqlens.device());
}

EMBROPE_END_NAMESPACE
