// Descriptions of apply_rope cases, shared by the CPU tests (tests/test_apply_rope.cpp,
// tests/test_apply_rope_mrope.cpp) and the GPU parity suite (tests/gpu/test_apply_rope.cpp).
// Plain data and the standard library only: the GPU suite is also built without the CPU
// tests' helpers.
#pragma once

#include <embrope/embrope.hpp>

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace op_cases {

using embrope::DType;

// How q and k sit in memory.
enum class Arrangement {
  contiguous,  // separate row-major buffers
  fused_qkv,   // one buffer per token: q heads, k heads, v heads; padding after each head
               // (the CPU tests also pad after each token and each batch row)
  transposed,  // separate [B, H, S, D + 2] buffers viewed as [B, S, H, D]
};
inline const char* arrangement_name(Arrangement a) {
  return a == Arrangement::contiguous  ? "contiguous"
         : a == Arrangement::fused_qkv ? "fused_qkv"
                                       : "transposed";
}

enum class TableKind { cache, caller };

// One apply_rope call: dtypes, pairing, shapes, memory arrangement, table and positions.
struct RopeCase {
  DType dtype = DType::float32;
  DType pos_dtype = DType::int64;
  bool interleaved = false;
  bool inverse = false;
  std::int64_t head_dim = 64, rotary_dim = 64;
  std::int64_t batch = 0;  // 0: [T, H, D] tensors and positions [T] (T = seq)
  std::int64_t seq = 5;
  std::int64_t hq = 4, hk = 2;  // hk 0: k is std::nullopt
  Arrangement arrangement = Arrangement::contiguous;
  bool out_of_place = false;
  TableKind table = TableKind::cache;
  DType table_dtype = DType::float32;  // of caller tables
  double base = 10000.0;
  std::int64_t max_positions = 64;
  std::int64_t position_stride = 1;     // element stride of the positions' last dimension
  std::vector<std::int64_t> positions;  // explicit (flat, B*S); empty: random in range
  std::int64_t seed = 1;
};

inline std::string describe(const RopeCase& c) {
  std::ostringstream os;
  os << "dtype " << embrope::dtype_name(c.dtype) << ", positions "
     << embrope::dtype_name(c.pos_dtype) << ", " << (c.interleaved ? "interleaved" : "neox")
     << (c.inverse ? ", inverse" : "") << ", head_dim " << c.head_dim << ", rotary_dim "
     << c.rotary_dim << ", " << (c.batch == 0 ? "[T,H,D] T=" : "[B,S,H,D] B=") << c.batch
     << " S=" << c.seq << ", Hq " << c.hq << ", Hk " << c.hk << ", "
     << arrangement_name(c.arrangement) << (c.out_of_place ? ", out of place" : ", in place")
     << ", " << (c.table == TableKind::cache ? "RopeCache" : "caller cos/sin ")
     << (c.table == TableKind::caller ? embrope::dtype_name(c.table_dtype) : "")
     << ", max_positions " << c.max_positions << ", position stride " << c.position_stride
     << ", seed " << c.seed;
  return os.str();
}

// A multimodal RoPE case (mrope_section): positions [3, T] or [3, B, S], one stream per section.
struct MropeCase {
  DType dtype = DType::float32;
  DType pos_dtype = DType::int64;
  bool interleaved = false;          // the pair layout
  bool streams_interleaved = false;  // Qwen3-VL's interleaved streams (mrope_interleaved)
  std::int64_t head_dim = 128, rotary_dim = 128;
  std::array<std::int64_t, 3> section = {16, 24, 24};
  std::int64_t batch = 0, seq = 7, hq = 4, hk = 2;
  bool positions_token_major = false;  // positions stored [T, 3] and viewed as [3, T]
  std::int64_t max_positions = 4096;
};

// Axial RoPE (RopeCache::axial): the axes' feature slices (trailing zeros unused) and bases.
struct AxialCase {
  DType dtype = DType::float32;
  DType pos_dtype = DType::int64;
  bool interleaved = false;  // the pair layout (Flux, Wan: adjacent; Qwen2-VL vision: halves)
  std::int64_t head_dim = 128;
  std::array<std::int64_t, 4> axes_dim = {16, 56, 56, 0};
  std::array<double, 4> bases = {10000.0, 10000.0, 10000.0, 10000.0};
  std::int64_t batch = 0, seq = 7, hq = 4, hk = 2;
  bool positions_token_major = false;  // positions stored [T, N] (Flux's ids), viewed [N, T]
  bool out_of_place = false, inverse = false;
  std::int64_t max_positions = 300;
};

}  // namespace op_cases
