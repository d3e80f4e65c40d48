// detail/quant_math.hpp against the gguf package (llama.cpp's gguf-py): every value of GGUF
// blocks it quantized (Q8_0, Q4_0) or of random blocks (Q4_K, Q6_K), dequantized by it, bit
// for bit (tests/data/gguf/make_blocks.py wrote the vectors); and the layouts' sizes and
// scale packing from llama.cpp's ggml-common.h and get_scale_min_k4.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "embrope/detail/quant_math.hpp"
#include "gguf_vectors.hpp"

namespace {

using embrope::detail::GgufBlock;

using gguf_vectors::from_hex;

}  // namespace

TEST_CASE("GGUF block values equal the gguf package's dequantize bit for bit", "[quant]") {
  const std::pair<const char*, GgufBlock> formats[] = {{"Q8_0", GgufBlock::q8_0},
                                                       {"Q4_0", GgufBlock::q4_0},
                                                       {"Q4_K", GgufBlock::q4_k},
                                                       {"Q6_K", GgufBlock::q6_k}};
  for (const auto& [name, format] : formats) {
    INFO(name << " (gguf " << gguf_vectors::all()["gguf_version"].get<std::string>() << ")");
    const nlohmann::json& case_ = gguf_vectors::all()[name];
    const std::vector<std::uint8_t> blocks = from_hex(case_["blocks"].get<std::string>());
    const std::vector<std::uint32_t> want = case_["values"].get<std::vector<std::uint32_t>>();
    const int values = embrope::detail::gguf_block_values(format);
    const int bytes = embrope::detail::gguf_block_bytes(format);
    REQUIRE(blocks.size() % static_cast<std::size_t>(bytes) == 0);
    REQUIRE(want.size() == blocks.size() / bytes * values);
    std::int64_t differ = 0, first = -1;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const std::uint8_t* block = blocks.data() + (i / values) * bytes;
      const float got = embrope::detail::gguf_value(format, block, static_cast<int>(i % values));
      std::uint32_t bits;
      std::memcpy(&bits, &got, sizeof bits);
      if (bits != want[i]) {
        ++differ;
        if (first < 0) first = static_cast<std::int64_t>(i);
      }
    }
    INFO("first differing value " << first);
    CHECK(differ == 0);
  }
}

TEST_CASE("GGUF block sizes and Q4_K's packed scales follow ggml-common.h", "[quant]") {
  using embrope::detail::gguf_block_bytes;
  using embrope::detail::gguf_block_values;
  // sizeof(block_q8_0) = 2 + 32, block_q4_0 = 2 + 16, block_q4_K = 2 + 2 + 12 + 128,
  // block_q6_K = 128 + 64 + 16 + 2.
  CHECK(gguf_block_values(GgufBlock::q8_0) == 32);
  CHECK(gguf_block_bytes(GgufBlock::q8_0) == 34);
  CHECK(gguf_block_values(GgufBlock::q4_0) == 32);
  CHECK(gguf_block_bytes(GgufBlock::q4_0) == 18);
  CHECK(gguf_block_values(GgufBlock::q4_k) == 256);
  CHECK(gguf_block_bytes(GgufBlock::q4_k) == 144);
  CHECK(gguf_block_values(GgufBlock::q6_k) == 256);
  CHECK(gguf_block_bytes(GgufBlock::q6_k) == 210);
  // Eight 6-bit (scale, min) pairs packed as llama.cpp's quantize_row_q4_K_ref packs them:
  // j < 4 in the low bits of bytes j and j + 4; j >= 4 split into bytes j + 4 (low nibbles)
  // and the top two bits of bytes j - 4 and j.
  const int scale[8] = {0, 63, 17, 42, 5, 60, 33, 48}, min[8] = {63, 0, 21, 9, 62, 1, 40, 27};
  std::uint8_t packed[12] = {};
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      packed[j] = static_cast<std::uint8_t>(scale[j]);
      packed[j + 4] = static_cast<std::uint8_t>(min[j]);
    } else {
      packed[j + 4] = static_cast<std::uint8_t>((scale[j] & 0xf) | ((min[j] & 0xf) << 4));
      packed[j - 4] |= static_cast<std::uint8_t>((scale[j] >> 4) << 6);
      packed[j] |= static_cast<std::uint8_t>((min[j] >> 4) << 6);
    }
  }
  for (int j = 0; j < 8; ++j) {
    int s = -1, m = -1;
    embrope::detail::q4_k_scale_min(packed, j, &s, &m);
    INFO("sub-block " << j);
    CHECK(s == scale[j]);
    CHECK(m == min[j]);
  }
}

TEST_CASE("packed int4 rows as ExecuTorch's embedding_4bit packs them, and affine values",
          "[quant]") {
  // ExecuTorch's _pack_embedding_weight: ((q[2k] + 8) << 4) | (q[2k + 1] + 8); its reference
  // packs q = [-4, -4, -1, -2] as 0x44, 0x76.
  const std::uint8_t packed[] = {0x44, 0x76, 0x0f, 0xf0};
  const int want[] = {-4, -4, -1, -2, -8, 7, 7, -8};
  for (int e = 0; e < 8; ++e) {
    INFO("element " << e);
    CHECK(embrope::detail::int4_packed_value(packed, e) == want[e]);
  }
  // (q - zero_point) * scale: the subtraction exact, then one rounded product.
  CHECK(embrope::detail::affine_value(5, 2.0f, 0.1f) == 0.1f * 3.0f);
  CHECK(embrope::detail::affine_value(-128, 0.0f, 0.5f) == -64.0f);
  CHECK(embrope::detail::affine_value(127, -3.0f, 0.25f) == 32.5f);
}
