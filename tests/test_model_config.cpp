// Model presets and HuggingFace config.json parsing: published config.json files (tests/data/hf)
// give the configuration each model's architecture defines (expected values written from the
// models' documented architecture, and frequencies from the HF transliteration); every preset
// builds; malformed configs are clear errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "reference_rope_scaling.hpp"

namespace {

using embrope::ErrorCode;
using embrope::ModelConfig;
using embrope::PositionKind;
using embrope::RopeLayout;
using embrope::RopeScaling;

ModelConfig load(const char* file) {
  return embrope::model_config_from_hf_file(std::string(EMBROPE_TEST_DATA_DIR) + "/hf/" + file);
}

template <typename F>
void expect_invalid(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    FAIL("no embrope::Error was thrown");
  } catch (const embrope::Error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == ErrorCode::invalid_argument);
    for (const char* part : parts) {
      INFO("expected the message to mention \"" << part << "\"");
      CHECK(ref::mentions(e.what(), part));
    }
  }
}

void check_frequencies(const embrope::RopeConfig& config, const ref::hf::Result& want) {
  const embrope::RopeFrequencies got = embrope::rope_frequencies(config);
  REQUIRE(got.inv_freq.size() == want.inv_freq.size());
  for (std::size_t i = 0; i < got.inv_freq.size(); ++i) {
    INFO("inv_freq " << i);
    CHECK(got.inv_freq[i] == Approx(want.inv_freq[i]).epsilon(1e-13));
  }
  CHECK(got.attention_factor == Approx(want.attention_factor).epsilon(1e-14));
}

}  // namespace

TEST_CASE("Llama 3.1 config.json: llama3 scaling over 8192, theta 500000, 128-dim heads",
          "[model_config]") {
  const ModelConfig m = load("llama-3.1-8b-instruct.json");
  CHECK(m.model_type == "llama");
  CHECK(m.positions == PositionKind::rope);
  CHECK(m.hidden_size == 4096);
  CHECK(m.num_heads == 32);
  CHECK(m.num_kv_heads == 8);
  CHECK(m.head_dim == 128);
  CHECK(m.vocab_size == 128256);
  CHECK(m.layout == RopeLayout::neox);
  CHECK(m.rope.rotary_dim == 128);
  CHECK(m.rope.base == 500000.0);
  CHECK(m.rope.max_positions == 131072);
  CHECK(m.rope.scaling == RopeScaling::llama3);
  CHECK(m.rope.factor == 8.0);
  CHECK(m.rope.low_freq_factor == 1.0);
  CHECK(m.rope.high_freq_factor == 4.0);
  CHECK(m.rope.original_max_positions == 8192);
  ref::hf::RopeParameters hf;
  hf.rope_theta = 500000.0;
  hf.dim = 128;
  hf.factor = 8.0;
  hf.low_freq_factor = 1.0;
  hf.high_freq_factor = 4.0;
  hf.original_max_position_embeddings = 8192;
  check_frequencies(m.rope, ref::hf::compute_llama3(hf));
  // The preset is the same configuration.
  const ModelConfig preset = embrope::model_preset("llama-3.1-8b");
  check_frequencies(preset.rope, ref::hf::compute_llama3(hf));
  CHECK(preset.rope.max_positions == 131072);
}

TEST_CASE("Qwen3-VL text config: interleaved mrope sections [24, 20, 20]", "[model_config]") {
  // The rope_scaling block of Qwen/Qwen3-VL-8B-Instruct's text_config.
  const ModelConfig m = embrope::model_config_from_hf_json(R"({
    "model_type": "qwen3_vl_text", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 262144,
    "rope_theta": 5000000,
    "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                     "rope_type": "default"}})");
  CHECK(m.mrope_section == std::array<std::int64_t, 3>{24, 20, 20});
  CHECK(m.mrope_interleaved);
  CHECK(m.rope_options().mrope_interleaved);
  CHECK_THROWS_WITH(embrope::model_config_from_hf_json(R"({
    "model_type": "qwen3_vl_text", "hidden_size": 4096, "num_attention_heads": 32,
    "max_position_embeddings": 4096, "rope_theta": 5000000,
    "rope_scaling": {"mrope_interleaved": 1, "mrope_section": [24, 20, 20]}})"),
                    Catch::Contains("mrope_interleaved is 1, not a boolean"));
}

TEST_CASE("Qwen2-VL config.json: mrope sections [16, 24, 24] on 128-dim heads", "[model_config]") {
  const ModelConfig m = load("qwen2-vl-7b-instruct.json");
  CHECK(m.model_type == "qwen2_vl");
  CHECK(m.head_dim == 128);
  CHECK(m.rope.rotary_dim == 128);
  CHECK(m.rope.base == 1000000.0);
  CHECK(m.rope.scaling == RopeScaling::none);
  CHECK(m.mrope_section == std::array<std::int64_t, 3>{16, 24, 24});
  CHECK_FALSE(m.mrope_interleaved);
  const embrope::RopeOptions o = m.rope_options();
  CHECK(o.mrope_section == m.mrope_section);
  CHECK(o.rotary_dim == 128);
  CHECK(o.layout == RopeLayout::neox);
}

TEST_CASE("a VL config with the language model under text_config; HF's default mrope sections",
          "[model_config]") {
  // As transformers >= 5 writes Qwen3-VL's config: no top-level hidden size, the text fields
  // in text_config, and (in a config made from the defaults) no mrope_section: HF's rotary
  // modules then take [24, 20, 20] interleaved (Qwen3-VL) or [16, 24, 24] (Qwen2-VL).
  const ModelConfig m = embrope::model_config_from_hf_json(R"({
    "model_type": "qwen3_vl", "vision_config": {"hidden_size": 1152, "num_heads": 16},
    "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096,
      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
      "max_position_embeddings": 262144,
      "rope_parameters": {"rope_type": "default", "rope_theta": 5000000}}})");
  CHECK(m.model_type == "qwen3_vl_text");
  CHECK(m.hidden_size == 4096);
  CHECK(m.rope.base == 5000000.0);
  CHECK(m.mrope_section == std::array<std::int64_t, 3>{24, 20, 20});
  CHECK(m.mrope_interleaved);
  const ModelConfig q2 = embrope::model_config_from_hf_json(R"({
    "model_type": "qwen2_vl", "text_config": {"hidden_size": 3584,
      "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000}}})");
  CHECK(q2.model_type == "qwen2_vl");  // the outer type where the inner has none
  CHECK(q2.head_dim == 128);
  CHECK(q2.mrope_section == std::array<std::int64_t, 3>{16, 24, 24});
  CHECK_FALSE(q2.mrope_interleaved);
  // rope_type "mrope" without sections: HF's text config makes it "default", with the
  // rotary module's default sections; another family's is an error.
  const ModelConfig typed = embrope::model_config_from_hf_json(R"({
    "model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
    "max_position_embeddings": 32768, "rope_theta": 1000000,
    "rope_scaling": {"type": "mrope"}})");
  CHECK(typed.mrope_section == std::array<std::int64_t, 3>{16, 24, 24});
  CHECK(typed.rope.scaling == RopeScaling::none);
  CHECK_THROWS_WITH(embrope::model_config_from_hf_json(R"({
    "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "max_position_embeddings": 128, "rope_theta": 10000, "rope_scaling": {"type": "mrope"}})"),
                    Catch::Contains("type is mrope but mrope_section is missing"));
  // A config with its own hidden size is read as it is (text_config ignored).
  const ModelConfig flat = embrope::model_config_from_hf_json(R"({
    "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "max_position_embeddings": 128, "rope_theta": 10000,
    "text_config": {"hidden_size": 4096, "num_attention_heads": 32}})");
  CHECK(flat.head_dim == 16);
  CHECK(flat.mrope_section == std::array<std::int64_t, 3>{0, 0, 0});
}

TEST_CASE("Phi-3 config.json: longrope (type su), factor from the two lengths", "[model_config]") {
  const ModelConfig m = load("phi-3-vision-128k-instruct.json");
  CHECK(m.model_type == "phi3");
  CHECK(m.head_dim == 96);
  CHECK(m.rope.rotary_dim == 96);
  CHECK(m.rope.scaling == RopeScaling::longrope);
  CHECK(m.rope.original_max_positions == 4096);
  CHECK(m.rope.factor == 32.0);  // 131072 / 4096, as HF derives it
  REQUIRE(m.rope.short_factor.size() == 48);
  REQUIRE(m.rope.long_factor.size() == 48);
  CHECK(m.rope.short_factor[0] == 1.05);
  CHECK(m.rope.long_factor[47] == 64.81001281738281);
  ref::hf::RopeParameters hf;
  hf.dim = 96;
  hf.factor = 32.0;
  hf.short_factor = m.rope.short_factor;
  hf.long_factor = m.rope.long_factor;
  // sequence_length 0 = max_positions 131072 > 4096: the long factors.
  check_frequencies(m.rope, ref::hf::compute_longrope(hf, 4096, 131072));
  // sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5/12)
  CHECK(embrope::rope_frequencies(m.rope).attention_factor ==
        Approx(std::sqrt(1.0 + 5.0 / 12.0)).epsilon(1e-15));
}

TEST_CASE("longrope with its original length in rope_scaling and no factor: HF's ratio",
          "[model_config]") {
  // HF's _compute_longrope_parameters: factor = max_position_embeddings / original when
  // rope_scaling gives none, wherever the original length is kept.
  std::string factors = "[";
  for (int i = 0; i < 32; ++i) factors += (i ? ", " : "") + std::to_string(1.0 + 0.25 * i);
  factors += "]";
  const ModelConfig m = embrope::model_config_from_hf_json(
      R"({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
          "max_position_embeddings": 8192, "rope_theta": 10000.0,
          "rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 2048,
                           "short_factor": )" +
      factors + R"(, "long_factor": )" + factors + "}}");
  CHECK(m.rope.original_max_positions == 2048);
  CHECK(m.rope.factor == 4.0);
  // sqrt(1 + ln 4 / ln 2048) = sqrt(1 + 2/11)
  CHECK(embrope::rope_frequencies(m.rope).attention_factor ==
        Approx(std::sqrt(1.0 + 2.0 / 11.0)).epsilon(1e-15));
}

TEST_CASE("yarn: a top-level original_max_position_embeddings wins, as in HF", "[model_config]") {
  const ModelConfig m = embrope::model_config_from_hf_json(
      R"({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
          "max_position_embeddings": 8192, "original_max_position_embeddings": 1024,
          "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                           "original_max_position_embeddings": 4096}})");
  CHECK(m.rope.original_max_positions == 1024);
}

TEST_CASE("DeepSeek-V3 config.json: yarn with mscale on the 64-dim RoPE part, interleaved",
          "[model_config]") {
  const ModelConfig m = load("deepseek-v3.json");
  CHECK(m.rope.rotary_dim == 64);
  CHECK(m.head_dim == 64);
  CHECK(m.layout == RopeLayout::interleaved);
  CHECK(m.rope.scaling == RopeScaling::yarn);
  CHECK(m.rope.factor == 40.0);
  CHECK(m.rope.original_max_positions == 4096);
  CHECK(m.rope.max_positions == 163840);
  ref::hf::RopeParameters hf;
  hf.dim = 64;
  hf.factor = 40.0;
  hf.original_max_position_embeddings = 4096;
  hf.mscale = 1.0;
  hf.mscale_all_dim = 1.0;
  hf.beta_fast = 32.0;
  hf.beta_slow = 1.0;
  const auto want = ref::hf::compute_yarn(hf);
  CHECK(want.attention_factor == 1.0);  // mscale == mscale_all_dim: the ratio is 1
  check_frequencies(m.rope, want);
}

TEST_CASE("GPT-J and Pythia config.json: interleaved 64 of 256, neox 25% of 64", "[model_config]") {
  const ModelConfig j = load("gpt-j-6b.json");
  CHECK(j.layout == RopeLayout::interleaved);
  CHECK(j.head_dim == 256);
  CHECK(j.rope.rotary_dim == 64);
  CHECK(j.rope.max_positions == 2048);
  CHECK(j.rope.base == 10000.0);
  const ModelConfig p = load("pythia-160m.json");
  CHECK(p.layout == RopeLayout::neox);
  CHECK(p.head_dim == 64);
  CHECK(p.rope.rotary_dim == 16);
  CHECK(p.rope.base == 10000.0);
}

TEST_CASE("Gemma config.json: embeddings scaled by sqrt(hidden_size)", "[model_config]") {
  const ModelConfig m = load("gemma-2b.json");
  CHECK(m.embedding_scale == std::sqrt(2048.0));
  CHECK(m.embed_options().scale == static_cast<float>(std::sqrt(2048.0)));
  CHECK(m.head_dim == 256);
  CHECK(m.num_kv_heads == 1);
  CHECK(m.rope.scaling == RopeScaling::none);  // "rope_scaling": null
}

// Gemma 3 (HF Gemma3TextConfig): sliding-window layers rotate with base 1e4, full-attention
// layers with base 1e6 and linear x8; transformers >= 5 writes rope_parameters per layer type,
// earlier versions rope_local_base_freq beside rope_theta / rope_scaling.
TEST_CASE("Gemma 3: one RoPE per layer type, and none without saying which", "[model_config]") {
  const std::string head =
      R"({"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
          "vocab_size": 262208, )";
  const std::string v5 = head + R"("rope_parameters": {
          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
          "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}})";
  const std::string v4 = head + R"("rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}})";
  for (const std::string& text : {v5, v4}) {
    const ModelConfig local = embrope::model_config_from_hf_json(text, "sliding_attention");
    CHECK(local.rope.base == 10000.0);
    CHECK(local.rope.scaling == RopeScaling::none);
    CHECK(local.rope.rotary_dim == 256);
    CHECK(local.embedding_scale == std::sqrt(2560.0));
    const ModelConfig global = embrope::model_config_from_hf_json(text, "full_attention");
    CHECK(global.rope.base == 1000000.0);
    CHECK(global.rope.scaling == RopeScaling::linear);
    CHECK(global.rope.factor == 8.0);
    const auto ambiguous = [&] { embrope::model_config_from_hf_json(text); };
    CHECK_THROWS_WITH(ambiguous(),
                      Catch::Contains("gemma3_text has") && Catch::Contains("full_attention") &&
                          Catch::Contains("sliding_attention") && Catch::Contains("layer_type"));
    CHECK_THROWS_WITH(embrope::model_config_from_hf_json(text, "chunked_attention"),
                      Catch::Contains("layer_type chunked_attention is not one of"));
  }
  // A model with one RoPE takes any layer type.
  const ModelConfig llama = embrope::model_config_from_hf_json(
      R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
          "max_position_embeddings": 128, "rope_theta": 500000.0})",
      "full_attention");
  CHECK(llama.rope.base == 500000.0);
}

TEST_CASE("BERT and GPT-2 config.json: learned positions (and token types for BERT)",
          "[model_config]") {
  const ModelConfig b = load("bert-base-uncased.json");
  CHECK(b.positions == PositionKind::learned);
  CHECK(b.hidden_size == 768);
  CHECK(b.max_positions == 512);
  CHECK(b.type_vocab_size == 2);
  CHECK(b.embed_options().positions == embrope::PositionEncoding::learned);
  const ModelConfig g = load("gpt2.json");
  CHECK(g.positions == PositionKind::learned);
  CHECK(g.hidden_size == 768);
  CHECK(g.max_positions == 1024);
  CHECK(g.vocab_size == 50257);
}

TEST_CASE("every preset is a valid configuration; RoPE presets build their caches' frequencies",
          "[model_config]") {
  const std::vector<std::string> names = embrope::model_presets();
  CHECK(names.size() >= 15);
  for (const std::string& name : names) {
    INFO(name);
    const ModelConfig m = embrope::model_preset(name);
    if (m.positions == PositionKind::rope) {
      const embrope::RopeFrequencies f = embrope::rope_frequencies(m.rope);
      CHECK(static_cast<std::int64_t>(f.inv_freq.size()) == m.rope.rotary_dim / 2);
      CHECK(m.rope.rotary_dim <= m.head_dim);
    } else {
      CHECK(m.max_positions > 0);
    }
  }
  // A small RopeCache from a preset works end to end.
  embrope::ModelConfig qwen = embrope::model_preset("qwen2-vl-7b");
  qwen.rope.max_positions = 64;
  const embrope::RopeCache cache(qwen.rope);
  ref::Buffer q(embrope::DType::bfloat16, 2 * 28 * 128), pos(embrope::DType::int64, 3 * 2);
  ref::fill_random(q, 5);
  ref::fill_random_indices(pos, 6, 0, 63);
  embrope::apply_rope(ref::view(q, 0, {2, 28, 128}), std::nullopt, ref::view(pos, 0, {3, 2}), cache,
                      qwen.rope_options());
}

TEST_CASE("rope_parameters (transformers 5) and rope_scaling agree", "[model_config]") {
  const ModelConfig a = embrope::model_config_from_hf_json(R"({
    "model_type": "qwen2", "hidden_size": 1024, "num_attention_heads": 8,
    "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                        "original_max_position_embeddings": 32768}})");
  const ModelConfig b = embrope::model_config_from_hf_json(R"({
    "model_type": "qwen2", "hidden_size": 1024, "num_attention_heads": 8,
    "max_position_embeddings": 131072, "rope_theta": 1000000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})");
  CHECK(a.rope.scaling == RopeScaling::yarn);
  CHECK(a.rope.base == 1000000.0);
  CHECK(embrope::rope_frequencies(a.rope).inv_freq == embrope::rope_frequencies(b.rope).inv_freq);
  CHECK(embrope::rope_frequencies(a.rope).attention_factor ==
        Approx(0.1 * std::log(4.0) + 1.0).epsilon(1e-15));
}

TEST_CASE("malformed or unsupported configs are clear errors", "[model_config][errors]") {
  expect_invalid([] { embrope::model_config_from_hf_json("{not json"); },
                 {"model_config_from_hf_json", "JSON"});
  expect_invalid([] { embrope::model_config_from_hf_json("[1, 2]"); },
                 {"model_config_from_hf_json", "not an object"});
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
                "max_position_embeddings": 128, "rope_scaling": {"rope_type": "funky"}})");
      },
      {"model_config_from_hf_json", "rope_type", "funky", "not supported"});
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
                "max_position_embeddings": 128, "rope_scaling": {"rope_type": "yarn"}})");
      },
      {"model_config_from_hf_json", "rope_scaling.factor", "missing"});
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "llama", "hidden_size": 40, "num_attention_heads": 4,
                "partial_rotary_factor": 0.5, "max_position_embeddings": 128})");
      },
      {"model_config_from_hf_json", "rotary dim 5", "even"});
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "llama", "num_attention_heads": 4, "max_position_embeddings": 8})");
      },
      {"model_config_from_hf_json", "hidden size", "missing"});
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "llama", "hidden_size": "4096", "num_attention_heads": 4,
                "max_position_embeddings": 8})");
      },
      {"model_config_from_hf_json", "hidden_size", "not an integer"});
  // A learned-position model's sizes are positive (a fuzzed BERT config had hidden_size -68).
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "bert", "hidden_size": -68, "max_position_embeddings": 512})");
      },
      {"model_config_from_hf_json", "embedding dim -68", "positive"});
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "gpt2", "n_embd": 768, "n_positions": 0})");
      },
      {"model_config_from_hf_json", "position table size 0", "positive"});
  // llama3's original_max_position_embeddings likewise (it was converted unchecked).
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
                "max_position_embeddings": 128,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 1e300}})");
      },
      {"model_config_from_hf_json", "original_max_position_embeddings", "not an integer"});
  // Sections must be whole numbers a 64-bit integer holds (a fuzzed 6.7e72 was converted to
  // int64_t: undefined behaviour).
  for (const char* section : {"6.66667e72", "2.5", "1e300"}) {
    INFO(section);
    expect_invalid(
        [section] {
          embrope::model_config_from_hf_json(
              std::string(R"({"model_type": "qwen2_vl", "hidden_size": 3584,
                  "num_attention_heads": 28, "max_position_embeddings": 32768,
                  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, )") +
              section + "]}}");
        },
        {"model_config_from_hf_json", "mrope_section[2]", "not an integer"});
  }
  expect_invalid(
      [] {
        embrope::model_config_from_hf_json(
            R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
                "max_position_embeddings": 128,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                 "high_freq_factor": 1.0, "original_max_position_embeddings": 64}})");
      },
      {"model_config_from_hf_json", "RoPE parameters", "low_freq_factor 4", "high_freq_factor 1"});
  expect_invalid(
      [] { embrope::model_config_from_hf_json(R"({"model_type": "t5", "d_model": 512})"); },
      {"model_config_from_hf_json", "t5"});
  expect_invalid([] { embrope::model_preset("llama-9"); },
                 {"model_preset", "llama-9", "llama-3.1-8b"});
  expect_invalid([] { embrope::model_config_from_hf_file("/nonexistent/config.json"); },
                 {"model_config_from_hf_file", "cannot open"});
}
