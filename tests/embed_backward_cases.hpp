// Descriptions of embed_backward cases, shared by the CPU tests (tests/test_embed_backward.cpp)
// and the GPU parity suite (tests/gpu/test_embed_backward.cpp). Plain data and the standard
// library only: the GPU suite is also built without the CPU tests' helpers.
#pragma once

#include <embrope/embrope.hpp>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace op_cases {

using embrope::BackwardMode;
using embrope::DType;

// One embed_backward call: dtypes, shapes, strides, options and the gradients asked for.
struct BackwardCase {
  DType dtype = DType::float32;       // grad_out (the forward's table dtype)
  DType grad_dtype = DType::float32;  // every gradient table: float32 or dtype
  DType id_dtype = DType::int64;
  std::int64_t vocab = 50, dim = 64;
  std::vector<std::int64_t> ids_shape = {40};
  std::int64_t id_stride = 1;  // ids this many elements apart
  std::int64_t out_pad = 0;    // padding after each grad_out row
  std::int64_t grad_pad = 0;   // padding after each gradient table row
  double scale = 1.0;
  std::int64_t vocab_start = 0;
  bool shard = false;
  std::optional<std::int64_t> padding;
  bool token = true;  // grad_table given
  bool learned = false;
  bool explicit_positions = true;
  bool with_offsets = false;
  std::int64_t max_positions = 30;
  std::int64_t num_types = 0;
  bool zero_init = false;  // gradients start at zero (default: random, testing +=)
  BackwardMode mode = BackwardMode::deterministic;
  // Explicit values (flat row-major over ids' shape); empty: random valid ones.
  std::vector<std::int64_t> ids, position_ids, type_ids, offsets;
  std::int64_t seed = 1;
};

inline std::string describe(const BackwardCase& c) {
  std::ostringstream os;
  os << "grad_out " << embrope::dtype_name(c.dtype) << ", grads "
     << embrope::dtype_name(c.grad_dtype) << ", ids " << embrope::dtype_name(c.id_dtype) << " [";
  for (std::size_t i = 0; i < c.ids_shape.size(); ++i) os << (i ? "," : "") << c.ids_shape[i];
  os << "], V " << c.vocab << ", D " << c.dim << ", out_pad " << c.out_pad << ", grad_pad "
     << c.grad_pad << ", scale " << c.scale << ", vocab_start " << c.vocab_start
     << (c.shard ? ", shard" : "") << (c.padding ? ", padding " + std::to_string(*c.padding) : "")
     << (c.token ? "" : ", no grad_table") << ", id_stride " << c.id_stride
     << (c.learned ? (c.explicit_positions ? ", learned explicit"
                      : c.with_offsets     ? ", learned implicit with offsets"
                                           : ", learned implicit")
                   : "")
     << ", types " << c.num_types << (c.zero_init ? ", zero init" : "") << ", seed " << c.seed;
  return os.str();
}

}  // namespace op_cases
