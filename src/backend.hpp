// The kernels each backend provides, and the one way an op reaches them (the device runtime's
// memory and stream services are device_runtime.hpp's). src/<op>.cpp
// validates its arguments and fills detail::<Op>Params (prepare), then calls run_kernel,
// which applies the bad-index policy and calls cpu::<op> or gpu::<op>. Kernels trust their
// parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "bad_index.hpp"
#include "cpu/fork.hpp"
#include "embrope/deferred_status.hpp"
#include "embrope/error.hpp"
#include "embrope/embrope.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"
#include "apply_qk_norm_rope_params.hpp"
#include "apply_rope_append_kv_params.hpp"
#include "apply_rope_params.hpp"
#include "embed_params.hpp"
#include "packed_positions_params.hpp"

namespace embrope::cpu {

void embed(const internal::EmbedParams& params);
void embed_backward(const internal::EmbedBackwardParams& params);
void apply_rope(const internal::RopeParams& params);
void apply_rope_append_kv(const internal::RopeAppendKvParams& params);
void apply_qk_norm_rope(const internal::QkNormRopeParams& params);
void apply_qk_norm_rope_append_kv(const internal::RopeAppendKvParams& params);  // params.qk_norm
void apply_qk_norm_rope_backward(const internal::QkNormRopeParams& params);
// Rotates the q and k heads of the one token of `token` (batch = seq = 1, pointers at the
// token) with the instruction set apply_rope uses, float8 outputs with their non-rotary rows
// included. widened: 3 * rotary_dim floats.
void rotate_one_token(const internal::RopeParams& token, float* widened);
// Zero codes into every output row of the one token of `token` (a bad position).
void zero_one_token(const internal::RopeParams& token);
// apply_qk_norm_rope of one token (batch = seq = 1, its position valid) on the calling thread,
// in the same instruction set and bits; float8 outputs (q's alone: the cache-append ops)
// rounded once from float32. weights: qk_norm_weight_factors of the call (made once per
// call); scratch holds qk_norm_token_floats(token) floats.
void qk_norm_weight_factors(const internal::QkNormRopeParams& params, float* weights);  // 2 D
std::int64_t qk_norm_token_floats(const internal::QkNormRopeParams& token);
void qk_norm_rope_one_token(const internal::QkNormRopeParams& token, const float* weights,
                            float* scratch);
void packed_positions(const internal::PackedPositionsParams& params);
// Fills a [max_positions, R] table (layout in rope_cache.hpp) from inv_freq [R/2].
void build_rope_cache(float* table, std::int64_t max_positions, std::int64_t rotary_dim,
                      const double* inv_freq, double attention_factor);

}  // namespace embrope::cpu

// The CUDA backend (cuda/; src/cuda_unavailable.cpp in a build without CUDA).
namespace embrope::gpu {

// Kernels: enqueue on the stream and return (no host synchronisation).
void embed(const internal::EmbedParams& params, Device device, Stream stream);
void embed_backward(const internal::EmbedBackwardParams& params, Device device, Stream stream);
// Bytes of workspace embed_backward needs for these parameters (0 in atomic mode when every
// gradient is float32).
std::size_t embed_backward_workspace_size(const internal::EmbedBackwardParams& params,
                                          Device device);
void apply_rope(const internal::RopeParams& params, Device device, Stream stream);
void apply_rope_append_kv(const internal::RopeAppendKvParams& params, Device device, Stream stream);
void apply_qk_norm_rope(const internal::QkNormRopeParams& params, Device device, Stream stream);
void apply_qk_norm_rope_append_kv(const internal::RopeAppendKvParams& params, Device device,
                                  Stream stream);
void apply_qk_norm_rope_backward(const internal::QkNormRopeParams& params, Device device,
                                 Stream stream);
// Bytes of workspace apply_qk_norm_rope_backward needs (0 without a weight gradient).
std::size_t apply_qk_norm_rope_backward_workspace_size(const internal::QkNormRopeParams& params,
                                                       Device device);
void packed_positions(const internal::PackedPositionsParams& params, Device device, Stream stream);
// Bytes of workspace packed_positions needs for these parameters.
std::size_t packed_positions_workspace_size(const internal::PackedPositionsParams& params,
                                            Device device);
void build_rope_cache(float* table, std::int64_t max_positions, std::int64_t rotary_dim,
                      const double* inv_freq, double attention_factor, Device device,
                      Stream stream);

}  // namespace embrope::gpu

EMBROPE_BEGIN_NAMESPACE

// Runs an op's kernel on the tensors' device under the caller's bad-index policy: `bad` (the
// params' record pointer) is pointed at the caller's DeferredStatus or at a record of this
// call, then cpu_kernel(params) or gpu_kernel(params, device, stream) runs. A CUDA runtime
// error ("rope_vector_kernel: invalid resource handle", from a launch, a copy or an
// allocation) is reported with the op's name first, as every other error of the op is.
template <typename Params, typename CpuKernel, typename GpuKernel>
void run_kernel(const char* op, Device device, Stream stream, DeferredStatus* deferred,
                Params& params, internal::BadIndexRecord*& bad, CpuKernel cpu_kernel,
                GpuKernel gpu_kernel) {
  try {
    run_with_bad_index_policy(op, device, stream, deferred, [&](internal::BadIndexRecord* record) {
      bad = record;
      if (device.kind == DeviceKind::cpu) {
        // The instruction set is chosen here, on the calling thread: a bad EMBROPE_CPU_ISA
        // throws, which inside a kernel's thread team would terminate the process.
        cpu_isa();
        cpu::note_openmp_use();  // a child forked from this thread must not start a team
        cpu_kernel(params);
      } else {
        gpu_kernel(params, device, stream);
      }
    });
  } catch (const Error& e) {
    if (e.code() != ErrorCode::cuda_error && e.code() != ErrorCode::out_of_memory) throw;
    const std::string prefix = std::string(op) + ": ";
    if (std::string_view(e.what()).substr(0, prefix.size()) == prefix) throw;
    throw Error(e.code(), prefix + e.what());
  }
}

EMBROPE_END_NAMESPACE
