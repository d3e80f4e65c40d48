// Hostile HF config.json text to model_config_from_hf_json (docs/ops.md, docs/errors.md): empty,
// truncated and deeply nested text, numbers out of range, values of the wrong type. The
// harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "model_config";

std::vector<ArenaCase> model_config_cases() {
  std::vector<ArenaCase> cases;
  // ---- HF config.json text.
  struct Json {
    std::string name;
    std::string text;
    std::string op;
    std::vector<std::string> parts;
  };
  const std::string head =
      R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, )"
      R"("max_position_embeddings": 128)";
  std::string deep = std::string(5000, '[') + std::string(5000, ']');
  const std::vector<Json> json = {
      {"empty text", "", "model_config_from_hf_json", {"JSON"}},
      {"truncated", head, "model_config_from_hf_json", {"JSON"}},
      // Found by the config.json fuzzer: the JSON library's overflow error escaped as its own.
      {"a number past double's range",
       head + R"(, "rope_theta": 1E645})",
       "model_config_from_hf_json",
       {"not valid JSON", "overflow"}},
      {"5000 nested arrays", deep, "model_config_from_hf_json", {"not an object"}},
      {"hidden_size 1e300",
       R"({"model_type": "llama", "hidden_size": 1e300, "num_attention_heads": 2, "max_position_embeddings": 8})",
       "model_config_from_hf_json",
       {"hidden_size", "integer"}},
      {"num_attention_heads 0",
       R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 0, "max_position_embeddings": 8})",
       "model_config_from_hf_json",
       {"positive"}},
      {"head_dim -4",
       head + R"(, "head_dim": -4})",
       "model_config_from_hf_json",
       {"head_dim", "positive"}},
      {"partial_rotary_factor 1e300",
       head + R"(, "partial_rotary_factor": 1e300})",
       "model_config_from_hf_json",
       {"partial_rotary_factor", "(0, 1]"}},
      {"rope_scaling a string",
       head + R"(, "rope_scaling": "yes"})",
       "model_config_from_hf_json",
       {"rope_scaling", "object"}},
      {"mrope_section of two",
       head + R"(, "rope_scaling": {"type": "mrope", "mrope_section": [8, 8]}})",
       "model_config_from_hf_json",
       {"mrope_section", "3"}},
      {"short_factor a string",
       head + R"(, "rope_scaling": {"type": "longrope", "short_factor": "x", "long_factor": [1]}})",
       "model_config_from_hf_json",
       {"short_factor", "array"}},
      {"factor a string",
       head + R"(, "rope_scaling": {"rope_type": "linear", "factor": "8"}})",
       "model_config_from_hf_json",
       {"factor", "number"}},
      {"max_position_embeddings -1",
       R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": -1})",
       "model_config_from_hf_json",
       {"max_positions", "positive"}},
  };
  for (const Json& k : json) {
    cases.push_back({"model_config_from_hf_json " + k.name, k.op, invalid(k.parts), Surface::cpp,
                     [k](Arena& arena) {
                       arena.seal();
                       return run_cpp([&] { embrope::model_config_from_hf_json(k.text); });
                     }});
  }
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> model_config_hostile_case_names() {
  return names_of(kGroup, model_config_cases());
}

TEST_CASE("hostile inputs: model_config_from_hf_json", "[hostile][model_config]") {
  run_arena_cases(kGroup, model_config_cases());
}
