// A libFuzzer target for the HuggingFace config.json reader, which reads untrusted files: the
// input's first byte picks the layer type asked for (none, full_attention, sliding_attention
// or one no model has), the rest is the JSON text (malformed JSON, every rope_type, wrong
// types, huge and non-finite numbers, nesting).
//
// Invariants: model_config_from_hf_json either returns a configuration a cache can be built
// from (RoPE: a positive even rotary dim within the head, finite positive frequencies and
// attention factor; learned: positive sizes), or throws embrope::Error with invalid_argument
// (out_of_memory for sizes no machine holds) and a message that starts with the reader's name.
// Nothing else may escape: not the JSON library's exceptions, not a standard one.
//
// Built with -fsanitize=fuzzer (EMBROPE_BUILD_FUZZERS) it is the fuzzer; linked with
// replay_main.cpp it replays saved inputs (fuzz/corpus-hf) in every build.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "embrope/embrope.hpp"

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_hf_config: broken invariant: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_config(const embrope::ModelConfig& m) {
  if (m.positions == embrope::PositionKind::rope) {
    const embrope::RopeConfig& c = m.rope;
    if (m.head_dim <= 0 || c.rotary_dim <= 0 || c.rotary_dim % 2 != 0 ||
        c.rotary_dim > m.head_dim) {
      broken("rotary dim", std::to_string(c.rotary_dim) + " of " + std::to_string(m.head_dim));
    }
    if (c.max_positions <= 0) broken("max_positions", std::to_string(c.max_positions));
    // Building the frequencies allocates rotary_dim / 2 doubles: only for sizes a model has
    // (the reader checks the configuration by building them itself).
    if (c.rotary_dim <= (1 << 20)) {
      const embrope::RopeFrequencies f = embrope::rope_frequencies(c);
      for (double w : f.inv_freq) {
        if (!(std::isfinite(w) && w >= 0.0)) broken("inverse frequency", std::to_string(w));
      }
      if (!(std::isfinite(f.attention_factor) && f.attention_factor > 0.0)) {
        broken("attention factor", std::to_string(f.attention_factor));
      }
    }
  } else if (m.max_positions <= 0 || m.hidden_size <= 0) {
    broken("learned positions", std::to_string(m.max_positions));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const char* const kLayerTypes[] = {"", "full_attention", "sliding_attention",
                                            "chunked_attention"};
  const std::string_view layer_type = kLayerTypes[data[0] % 4];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  embrope::ModelConfig config;
  try {
    config = embrope::model_config_from_hf_json(text, layer_type);
  } catch (const embrope::Error& e) {
    const bool known = e.code() == embrope::ErrorCode::invalid_argument ||
                       e.code() == embrope::ErrorCode::out_of_memory;
    if (!known) broken("error code", e.what());
    if (std::string_view(e.what()).rfind("model_config_from_hf_json: ", 0) != 0) {
      broken("error message", e.what());
    }
    return 0;
  } catch (const std::exception& e) {
    broken("an exception other than embrope::Error", e.what());
  }
  // Outside the reader's try: a configuration it returned must build a cache.
  try {
    check_config(config);
  } catch (const std::exception& e) {
    broken("a returned configuration builds no cache", e.what());
  }
  return 0;
}
