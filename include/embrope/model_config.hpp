// Model presets and HuggingFace config.json: what a model family needs from embrope (its
// RoPE frequencies, pairing and sections, or its learned or sinusoidal positions, and its
// embedding scale), without writing the formulas by hand.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "embrope/apply_rope.hpp"
#include "embrope/embed.hpp"
#include "embrope/export.hpp"
#include "embrope/rope_cache.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

enum class PositionKind : std::uint8_t {
  rope,        // rotary, applied to q and k (apply_rope with `rope`, `layout`, `mrope_section`)
  learned,     // a trained [max_positions, D] table added to the token rows (embed)
  sinusoidal,  // Vaswani et al. 2017, added to the token rows (embed)
};

struct EMBROPE_EXPORT ModelConfig {
  std::string model_type;  // HF's model_type ("llama", "qwen2_vl", "gpt2", ...)
  PositionKind positions = PositionKind::rope;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;  // D of the embedding table
  std::int64_t num_heads = 0;    // query heads
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  // Token rows are multiplied by this (Gemma: sqrt(hidden_size); HF rounds it to the model's
  // dtype first: sqrt(3072) is 55.4256 in float32, 55.5 in bfloat16).
  double embedding_scale = 1.0;
  // rope: the cache configuration (rotary_dim, base, max_positions = max_position_embeddings,
  // scaling), the pairing and the multimodal sections.
  RopeConfig rope;
  RopeLayout layout = RopeLayout::neox;
  std::array<std::int64_t, 3> mrope_section{};
  bool mrope_interleaved = false;  // Qwen3-VL's interleaved streams (RopeOptions)
  // learned: rows of the position table; type_vocab_size: rows of the token-type table.
  std::int64_t max_positions = 0;
  std::int64_t type_vocab_size = 0;

  // apply_rope options carrying layout and mrope_section (and rotary_dim as a guard).
  RopeOptions rope_options() const;
  // embed options carrying scale and the position encoding (tables left to the caller).
  EmbedOptions embed_options() const;
};

// The names of the built-in presets ("llama-3.1-8b", "qwen2-vl-7b", ...): see the README.
EMBROPE_EXPORT std::vector<std::string> model_presets();
// A preset by name; an unknown name is Error(invalid_argument) listing the known ones.
EMBROPE_EXPORT ModelConfig model_preset(std::string_view name);

// Reads the fields of a HuggingFace config.json that decide positions and embeddings:
// model_type, hidden_size / n_embd, num_attention_heads / n_head, num_key_value_heads,
// head_dim, vocab_size, rope_theta (or rotary_emb_base), partial_rotary_factor (or
// rotary_pct, rotary_dim, qk_rope_head_dim), max_position_embeddings (or n_positions),
// original_max_position_embeddings, rope_scaling or rope_parameters (rope_type or type:
// default, linear, dynamic, yarn, llama3, longrope or su, mrope with mrope_section),
// rope_interleave, type_vocab_size. A field left out takes the default HF transformers' config
// class of the model_type gives it (src/hf_rope_defaults.inc; docs/ops.md, "Model configs");
// a malformed field, or a missing one without such a default, is Error(invalid_argument)
// naming it; an unsupported rope_type likewise (never ignored).
EMBROPE_EXPORT ModelConfig model_config_from_hf_json(std::string_view json_text);
// The same for the layers of one type, for models with a RoPE per layer type (Gemma 3:
// "sliding_attention" layers base 1e4, "full_attention" layers base 1e6 with linear x8; in
// transformers >= 5 rope_parameters keyed by layer type, before that rope_local_base_freq
// beside rope_theta, or for Gemma 3's model types without it its default 1e4). Without a
// layer type such a config is Error(invalid_argument) saying so, never one of the two
// silently; a config with one RoPE takes any layer type.
EMBROPE_EXPORT ModelConfig model_config_from_hf_json(std::string_view json_text,
                                                     std::string_view layer_type);
// The same from a file (for example a downloaded model's config.json).
EMBROPE_EXPORT ModelConfig model_config_from_hf_file(const std::string& path);
EMBROPE_EXPORT ModelConfig model_config_from_hf_file(const std::string& path,
                                                     std::string_view layer_type);

EMBROPE_END_NAMESPACE
