// The gguf package's blocks and the float32 values it dequantized from them
// (tests/data/gguf/blocks.json, written by tests/data/gguf/make_blocks.py), for the tests of
// GGUF numerics and of embed from GGUF tables.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace gguf_vectors {

inline std::vector<std::uint8_t> from_hex(const std::string& hex) {
  std::vector<std::uint8_t> bytes(hex.size() / 2);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return bytes;
}

// {"gguf_version": ..., "Q8_0": {"blocks": hex, "values": [float32 bits]}, "Q4_0": ...}
inline const nlohmann::json& all() {
  static const nlohmann::json vectors = [] {
    std::ifstream in(std::string(EMBROPE_TEST_DATA_DIR) + "/gguf/blocks.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return vectors;
}

}  // namespace gguf_vectors
