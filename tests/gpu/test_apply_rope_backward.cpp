// apply_rope_backward on the GPU against the CPU.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cstdint>
#include <cstring>

#include "gpu_support.hpp"

using namespace gpu_test;

TEST_CASE("GPU apply_rope_backward equals CPU apply_rope_backward", "[gpu][rope_backward]") {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
      const std::int64_t tokens = 77, hq = 8, hk = 2, dim = 128, rotary = 64;
      const int es = embrope::dtype_size(dtype);
      Buffer dq(tokens * hq * dim * es), dk(tokens * hk * dim * es), pos(tokens * 8);
      fill_random(dq, dtype, tokens * hq * dim, 111);
      fill_random(dk, dtype, tokens * hk * dim, 112);
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::int64_t p = (t * 37) % 4096;
        std::memcpy(pos.host.data() + 8 * t, &p, 8);
      }
      for (Buffer* b : {&dq, &dk, &pos}) b->upload();
      embrope::RopeCache cpu_cache({rotary, 10000.0, 4096});
      embrope::RopeCache gpu_cache({rotary, 10000.0, 4096}, Device::cuda(0));
      embrope::RopeOptions o;
      o.layout = layout;
      embrope::apply_rope_backward(Tensor(dq.host.data(), dtype, {tokens, hq, dim}),
                                   Tensor(dk.host.data(), dtype, {tokens, hk, dim}),
                                   Tensor(pos.host.data(), DType::int64, {tokens}), cpu_cache, o);
      embrope::apply_rope_backward(Tensor(dq.device, dtype, {tokens, hq, dim}, Device::cuda(0)),
                                   Tensor(dk.device, dtype, {tokens, hk, dim}, Device::cuda(0)),
                                   Tensor(pos.device, DType::int64, {tokens}, Device::cuda(0)),
                                   gpu_cache, o);
      cuda_check(cudaDeviceSynchronize());
      compare_rows(dq.download(), dq.host, dtype, tokens * hq * dim, dim);
      compare_rows(dk.download(), dk.host, dtype, tokens * hk * dim, dim);
    }
  }
}
