// Model presets and the HuggingFace config.json reader. Field meanings follow HF transformers
// (modeling_rope_utils.py and each model's configuration_*.py); the presets are config.json
// fragments read by the same code, so a preset and its model's config.json agree.
#include "embrope/model_config.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "embrope/error.hpp"
#include "embrope/version.hpp"
#include "rope_scaling.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

using json = nlohmann::json;
constexpr const char* kOp = "model_config_from_hf_json";
using validate::fail;

const json* find(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const json& object, const char* key, const char* where) {
  const json* v = find(object, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) fail(kOp, "{}{} is {}, not a number", where, key, v->dump());
  return v->get<double>();
}

std::optional<std::int64_t> integer(const json& object, const char* key, const char* where) {
  const json* v = find(object, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) return v->get<std::int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<std::int64_t>(d);
    }
  }
  fail(kOp, "{}{} is {}, not an integer", where, key, v->dump());
}

// The first of `keys` present, as an integer; required unless a fallback is given.
std::int64_t first_integer(const json& j, std::initializer_list<const char*> keys,
                           const char* what) {
  for (const char* key : keys) {
    if (auto v = integer(j, key, "")) return *v;
  }
  std::string names;
  for (const char* key : keys) names += std::string(names.empty() ? "" : " or ") + key;
  fail(kOp, "{} ({}) is missing", what, names);
}

std::vector<double> number_array(const json& object, const char* key, const char* where) {
  const json* v = find(object, key);
  if (v == nullptr) fail(kOp, "{}{} is missing", where, key);
  if (!v->is_array()) fail(kOp, "{}{} is not an array", where, key);
  std::vector<double> out;
  for (const json& e : *v) {
    if (!e.is_number()) fail(kOp, "{}{} holds {}, not a number", where, key, e.dump());
    out.push_back(e.get<double>());
  }
  return out;
}

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (s == n) return true;
  }
  return false;
}

void read_learned(const json& j, ModelConfig& m) {
  m.positions = PositionKind::learned;
  m.hidden_size = first_integer(j, {"hidden_size", "n_embd", "dim"}, "the embedding dim");
  m.max_positions =
      first_integer(j, {"max_position_embeddings", "n_positions"}, "the position table size");
  if (m.hidden_size <= 0 || m.max_positions <= 0) {
    fail(kOp, "the embedding dim {} and the position table size {} must be positive", m.hidden_size,
         m.max_positions);
  }
  if (auto types = integer(j, "type_vocab_size", "")) m.type_vocab_size = *types;
  if (auto heads = integer(j, "num_attention_heads", "")) m.num_heads = *heads;
  if (auto heads = integer(j, "n_head", "")) m.num_heads = *heads;
  if (auto heads = integer(j, "n_heads", "")) m.num_heads = *heads;
  m.num_kv_heads = m.num_heads;
  if (m.num_heads > 0) m.head_dim = m.hidden_size / m.num_heads;
}

// Whether a rope_parameters object holds one entry per layer type (transformers >= 5 for
// Gemma 3: {"full_attention": {...}, "sliding_attention": {...}}) rather than one RoPE.
bool per_layer_type(const json& params) {
  if (params.empty()) return false;
  for (const char* key : {"rope_type", "type", "rope_theta", "factor"}) {
    if (params.contains(key)) return false;
  }
  for (const auto& item : params.items()) {
    if (!item.value().is_object()) return false;
  }
  return true;
}

std::string keys_of(const json& object) {
  std::string names;
  for (const auto& item : object.items()) names += (names.empty() ? "" : ", ") + item.key();
  return names;
}

// The adapter below has methods of these functions' names.
std::optional<double> model_config_number(const json& object, const char* key, const char* where) {
  return number(object, key, where);
}
std::optional<std::int64_t> model_config_integer(const json& object, const char* key,
                                                 const char* where) {
  return integer(object, key, where);
}

// HF transformers' RoPE defaults of a model type, where its config class's differ from the
// generic ones: what HF uses when config.json leaves the field out.
struct HfRopeDefaults {
  const char* model_type;
  double theta;            // rope_theta (of the full-attention layers, with a local one)
  double local_theta;      // rope_local_base_freq's (Gemma 3: its sliding-window layers'); 0: none
  double rotary_fraction;  // partial_rotary_factor (GPT-NeoX's rotary_pct)
  const char* rope_type;   // the RoPE's type when the config gives none
};
constexpr HfRopeDefaults kHfRopeDefaults[] = {
#include "hf_rope_defaults.inc"
};

HfRopeDefaults hf_rope_defaults(const std::string& model_type) {
  for (const HfRopeDefaults& d : kHfRopeDefaults) {
    if (model_type == d.model_type) return d;
  }
  return {"", 10000.0, 0.0, 1.0, "default"};  // PretrainedConfig's
}

// Whether the model type has RoPE defaults of its own (so it is a RoPE model).
bool has_hf_rope_defaults(const std::string& model_type) {
  return *hf_rope_defaults(model_type).model_type != '\0';
}

// Phi-3's config class holds original_max_position_embeddings (4096 unless given) outside the
// RoPE parameters, and HF gives it priority over theirs.
std::optional<std::int64_t> class_original_max_positions(const std::string& model_type) {
  if (one_of(model_type, {"phi3", "phi4_multimodal"})) return 4096;
  return std::nullopt;
}

// A variant's view of the rope parameters `p` of config `j` (src/rope_scaling/common.hpp).
class JsonRopeParams final : public internal::HfRopeParams {
 public:
  JsonRopeParams(const json& j, const json& p, const char* where, const std::string& type,
                 std::int64_t max_positions, std::optional<std::int64_t> class_original)
      : j_(j),
        p_(p),
        where_(where),
        type_(type),
        max_positions_(max_positions),
        class_original_(class_original) {}
  std::optional<double> number(const char* key) const override {
    return model_config_number(p_, key, where_);
  }
  double required(const char* key) const override {
    const std::optional<double> v = number(key);
    if (!v) fail(kOp, "{}{} is missing (rope_type {})", where_, key, type_);
    return *v;
  }
  std::optional<std::int64_t> integer(const char* key) const override {
    return model_config_integer(p_, key, where_);
  }
  std::optional<bool> boolean(const char* key) const override {
    const json* v = find(p_, key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) fail(kOp, "{}{} is {}, not a boolean", where_, key, v->dump());
    return v->get<bool>();
  }
  std::vector<double> numbers(const char* key) const override {
    return number_array(p_, key, where_);
  }
  std::optional<std::int64_t> top_level_original_max_positions() const override {
    if (auto given = model_config_integer(j_, "original_max_position_embeddings", "")) {
      return given;
    }
    return class_original_;
  }
  std::int64_t max_positions() const override { return max_positions_; }

 private:
  const json& j_;
  const json& p_;
  const char* where_;
  const std::string& type_;
  std::int64_t max_positions_;
  std::optional<std::int64_t> class_original_;
};

void read_rope(const json& j, ModelConfig& m, std::string_view layer_type) {
  m.positions = PositionKind::rope;
  m.hidden_size = first_integer(j, {"hidden_size", "n_embd", "d_model"}, "the hidden size");
  m.num_heads = first_integer(j, {"num_attention_heads", "n_head", "num_heads"},
                              "the number of attention heads");
  if (m.hidden_size <= 0 || m.num_heads <= 0) {
    fail(kOp, "hidden size {} and number of heads {} must be positive", m.hidden_size, m.num_heads);
  }
  m.num_kv_heads = integer(j, "num_key_value_heads", "").value_or(m.num_heads);
  if (auto head_dim = integer(j, "head_dim", "")) {
    m.head_dim = *head_dim;
    if (m.head_dim <= 0) fail(kOp, "head_dim {} must be positive", m.head_dim);
  } else {
    if (m.hidden_size % m.num_heads != 0) {
      fail(kOp, "hidden_size {} is not a multiple of num_attention_heads {} and head_dim is absent",
           m.hidden_size, m.num_heads);
    }
    m.head_dim = m.hidden_size / m.num_heads;
  }

  // The RoPE parameters: transformers >= 5 writes rope_parameters (with rope_theta inside),
  // earlier versions rope_scaling beside a top-level rope_theta.
  static const json kEmpty = json::object();
  const json* params = find(j, "rope_parameters");
  std::string where_text = "rope_parameters.";
  if (params == nullptr) {
    params = find(j, "rope_scaling");
    where_text = "rope_scaling.";
  }
  if (params != nullptr && !params->is_object()) {
    fail(kOp, "{} is {}, not an object", where_text.substr(0, where_text.size() - 1),
         params->dump());
  }
  // Models whose layers rotate differently by layer type (Gemma 3: sliding-window layers base
  // 1e4, full-attention layers base 1e6 with linear x8) have one RoPE per layer type:
  // transformers >= 5 keys rope_parameters by layer type; earlier versions give the full
  // attention layers' in rope_theta / rope_scaling and the sliding ones' base in
  // rope_local_base_freq (with the default frequencies). Which one is wanted must be said.
  // Fields the config leaves out take HF's defaults for the model type (hf_rope_defaults.inc):
  // Gemma 3's sliding-window layers have base 1e4 without rope_local_base_freq.
  const HfRopeDefaults defaults = hf_rope_defaults(m.model_type);
  json local;
  const json* local_base = find(j, "rope_local_base_freq");
  const json local_default = defaults.local_theta;
  if (local_base == nullptr && defaults.local_theta != 0.0) local_base = &local_default;
  if (params != nullptr && where_text == "rope_parameters." && per_layer_type(*params)) {
    if (layer_type.empty()) {
      fail(kOp,
           "{} has a RoPE per layer type in rope_parameters ({}): say which layers' RoPE is "
           "wanted (layer_type)",
           m.model_type.empty() ? "the model" : m.model_type, keys_of(*params));
    }
    const json* entry = find(*params, std::string(layer_type).c_str());
    if (entry == nullptr) {
      fail(kOp, "layer_type {} is not one of the layer types of rope_parameters ({})", layer_type,
           keys_of(*params));
    }
    params = entry;
    where_text = "rope_parameters." + std::string(layer_type) + ".";
  } else if (local_base != nullptr) {
    if (layer_type.empty()) {
      fail(kOp,
           "{} has two RoPEs: rope_theta (with rope_scaling) for its full_attention layers and "
           "rope_local_base_freq for its sliding_attention layers: say which layers' RoPE is "
           "wanted (layer_type)",
           m.model_type.empty() ? "the model" : m.model_type);
    }
    if (layer_type == "sliding_attention") {
      if (!local_base->is_number()) {
        fail(kOp, "rope_local_base_freq is {}, not a number", local_base->dump());
      }
      local = json{{"rope_type", "default"}, {"rope_theta", *local_base}};
      params = &local;
      where_text = "rope_local_base_freq: ";
    } else if (layer_type != "full_attention") {
      fail(kOp, "layer_type {} is not one of the model's (full_attention, sliding_attention)",
           layer_type);
    }
  }
  const char* where = where_text.c_str();
  const json& p = params != nullptr ? *params : kEmpty;

  RopeConfig& c = m.rope;
  c.base = number(p, "rope_theta", where)
               .value_or(number(j, "rope_theta", "")
                             .value_or(number(j, "rotary_emb_base", "").value_or(defaults.theta)));
  // The rotary dim, in the field each family uses (HF: int(head_dim * partial_rotary_factor)).
  if (auto qk_rope = integer(j, "qk_rope_head_dim", "")) {
    c.rotary_dim = *qk_rope;  // DeepSeek-V2/V3: a separate RoPE part of each head
    m.head_dim = *qk_rope;
  } else if (auto rotary_dim = integer(j, "rotary_dim", "")) {
    c.rotary_dim = *rotary_dim;  // GPT-J
  } else {
    const double fraction =
        number(p, "partial_rotary_factor", where)
            .value_or(
                number(j, "partial_rotary_factor", "")
                    .value_or(number(j, "rotary_pct", "").value_or(defaults.rotary_fraction)));
    if (!(fraction > 0.0 && fraction <= 1.0)) {
      fail(kOp, "the rotary fraction (partial_rotary_factor or rotary_pct) {} must be in (0, 1]",
           fraction);
    }
    c.rotary_dim = static_cast<std::int64_t>(static_cast<double>(m.head_dim) * fraction);
  }
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > m.head_dim) {
    fail(kOp, "the rotary dim {} (of head_dim {}) must be even, positive and at most head_dim",
         c.rotary_dim, m.head_dim);
  }
  const std::int64_t max_positions = first_integer(
      j, {"max_position_embeddings", "n_positions", "max_sequence_length"}, "the context length");
  c.max_positions = max_positions;

  // Pairing: GPT-J and CodeGen rotate interleaved pairs; so do DeepSeek-V2/V3 (HF permutes
  // their q/k to rotate_half form; rope_interleave says so in V3's config).
  const bool interleave_default =
      one_of(m.model_type, {"gptj", "codegen", "deepseek_v2", "deepseek_v3"});
  bool interleaved = interleave_default;
  if (const json* ri = find(j, "rope_interleave")) {
    if (!ri->is_boolean()) fail(kOp, "rope_interleave is {}, not a boolean", ri->dump());
    interleaved = ri->get<bool>();
  }
  m.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;

  std::string type = "default";
  if (const json* t = find(p, "rope_type"); t != nullptr && t->is_string()) {
    type = t->get<std::string>();
  } else if (const json* t2 = find(p, "type"); t2 != nullptr && t2->is_string()) {
    type = t2->get<std::string>();
  } else if (std::string_view(defaults.rope_type) != "default" && params != &local) {
    fail(kOp,
         "{}'s RoPE is {} by default in HF transformers, whose parameters the config does not "
         "give: give rope_scaling or rope_parameters with its rope_type",
         m.model_type, defaults.rope_type);
  }
  // Phi-3's config class reads yarn, a type its earlier checkpoints wrote, as longrope.
  if (one_of(m.model_type, {"phi3", "phi4_multimodal"}) && type == "yarn") type = "longrope";
  if (const json* sections = find(p, "mrope_section")) {
    const std::vector<double> s = number_array(p, "mrope_section", where);
    if (s.size() != 3)
      fail(kOp, "{}mrope_section has {} entries; 3 are supported", where, s.size());
    for (std::size_t i = 0; i < 3; ++i) {
      // Whole numbers an int64_t holds, as integer() reads them (a larger double's conversion
      // is undefined); signs and sum are the RoPE call's check (rotary_dim / 2).
      if (!(std::isfinite(s[i]) && s[i] == std::floor(s[i]) && std::fabs(s[i]) < 9.0e15)) {
        fail(kOp, "{}mrope_section[{}] is {}, not an integer", where, i, s[i]);
      }
      m.mrope_section[i] = static_cast<std::int64_t>(s[i]);
    }
    (void)sections;
    if (const json* mi = find(p, "mrope_interleaved")) {
      if (!mi->is_boolean())
        fail(kOp, "{}mrope_interleaved is {}, not a boolean", where, mi->dump());
      m.mrope_interleaved = mi->get<bool>();
    }
    if (type == "mrope") type = "default";
  } else if (one_of(m.model_type, {"qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"})) {
    // HF's Qwen2VLRotaryEmbedding / Qwen2_5_VLRotaryEmbedding: mrope_section defaults to
    // [16, 24, 24] when the config has none (its rope_type "mrope" is then "default").
    m.mrope_section = {16, 24, 24};
    if (type == "mrope") type = "default";
  } else if (one_of(m.model_type,
                    {"qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"})) {
    m.mrope_section = {24, 20, 20};  // Qwen3VLTextRotaryEmbedding's default
    if (type == "mrope") type = "default";
  } else if (type == "mrope") {
    fail(kOp, "{}type is mrope but mrope_section is missing", where);
  }
  // Qwen3-VL's rotary module interleaves the streams whatever the config says.
  if (one_of(m.model_type, {"qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"})) {
    m.mrope_interleaved = true;
  }

  const internal::ScalingVariant* variant = internal::scaling_variant_for_hf(type);
  if (variant == nullptr) {
    std::string listed;  // "default, linear, ...": every variant's rope_type values
    for (const internal::ScalingVariant& v : internal::kScalingVariants) {
      if (!listed.empty()) listed += ", ";
      for (const char* ch = v.hf_types; *ch != '\0'; ++ch) {
        listed += *ch == ' ' ? std::string(", ") : std::string(1, *ch);
      }
    }
    fail(kOp, "{}rope_type {} is not supported ({}, mrope)", where, type, listed);
  }
  c.scaling = variant->kind;
  variant->from_hf(
      JsonRopeParams(j, p, where, type, max_positions, class_original_max_positions(m.model_type)),
      c);
  if (one_of(m.model_type, {"gemma", "gemma2", "gemma3", "gemma3_text"})) {
    m.embedding_scale = std::sqrt(static_cast<double>(m.hidden_size));
  }
  // The whole configuration is checked now, not when the cache is built, and a rule it breaks
  // is reported as the reader's ("RopeCache: rule" becomes "model_config_from_hf_json: the RoPE
  // parameters give no table: rule").
  try {
    (void)rope_frequencies(c);
  } catch (const Error& e) {
    const std::string what = e.what(), prefix = "RopeCache: ";
    throw Error(e.code(),
                fmt::format("{}: the RoPE parameters give no table: {}", kOp,
                            what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what));
  }
}

}  // namespace

RopeOptions ModelConfig::rope_options() const {
  RopeOptions o;
  o.layout = layout;
  o.mrope_section = mrope_section;
  o.mrope_interleaved = mrope_interleaved;
  o.rotary_dim = rope.rotary_dim;
  return o;
}

EmbedOptions ModelConfig::embed_options() const {
  EmbedOptions o;
  o.scale = static_cast<float>(embedding_scale);
  o.positions = positions == PositionKind::learned      ? PositionEncoding::learned
                : positions == PositionKind::sinusoidal ? PositionEncoding::sinusoidal
                                                        : PositionEncoding::none;
  return o;
}

ModelConfig model_config_from_hf_json(std::string_view json_text) {
  return model_config_from_hf_json(json_text, {});
}

ModelConfig model_config_from_hf_json(std::string_view json_text, std::string_view layer_type) {
  json j;
  try {
    j = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {  // a syntax error, or a number past double's range
    fail(kOp, "the text is not valid JSON: {}", e.what());
  }
  if (!j.is_object()) fail(kOp, "the JSON is a {}, not an object", j.type_name());
  // A multimodal model's config (Qwen2-VL, Qwen3-VL, Gemma 3, ... as transformers >= 5 writes
  // them) holds its language model's fields in text_config; a config with its own hidden size
  // is read as it is.
  if (const json* text = find(j, "text_config");
      text != nullptr && text->is_object() && find(j, "hidden_size") == nullptr &&
      find(j, "n_embd") == nullptr && find(j, "d_model") == nullptr && find(j, "dim") == nullptr) {
    json inner = *text;
    if (find(inner, "model_type") == nullptr && find(j, "model_type") != nullptr) {
      inner["model_type"] = j["model_type"];
    }
    j = std::move(inner);
  }
  ModelConfig m;
  if (const json* t = find(j, "model_type"); t != nullptr && t->is_string()) {
    m.model_type = t->get<std::string>();
  }
  if (auto vocab = integer(j, "vocab_size", "")) m.vocab_size = *vocab;
  if (one_of(m.model_type, {"bert", "gpt2", "distilbert"})) {
    read_learned(j, m);
  } else if (find(j, "rope_theta") != nullptr || find(j, "rope_scaling") != nullptr ||
             find(j, "rope_parameters") != nullptr || find(j, "rotary_dim") != nullptr ||
             find(j, "rotary_emb_base") != nullptr || find(j, "rotary_pct") != nullptr ||
             one_of(m.model_type, {"llama", "mistral", "qwen2", "qwen2_vl", "phi3", "gemma",
                                   "gemma2", "gptj", "gpt_neox", "deepseek_v2", "deepseek_v3"}) ||
             has_hf_rope_defaults(m.model_type)) {
    read_rope(j, m, layer_type);
  } else {
    fail(kOp,
         "model_type \"{}\" has no RoPE fields and is not a known learned-position family "
         "(bert, gpt2, distilbert)",
         m.model_type);
  }
  return m;
}

ModelConfig model_config_from_hf_file(const std::string& path) {
  return model_config_from_hf_file(path, {});
}

ModelConfig model_config_from_hf_file(const std::string& path, std::string_view layer_type) {
  std::ifstream in(path);
  if (!in) fail("model_config_from_hf_file", "cannot open {}", path);
  std::ostringstream text;
  text << in.rdbuf();
  return model_config_from_hf_json(text.str(), layer_type);
}

// ------------------------------------------------------------------------ presets ----

namespace {

// Each preset is the part of its model's published config.json that embrope reads.
struct Preset {
  const char* name;
  const char* config;
};

const Preset kPresets[] = {
    {"gpt-j-6b",
     R"({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64,
         "n_positions": 2048, "vocab_size": 50400})"},
    {"pythia-6.9b",
     R"({"model_type": "gpt_neox", "hidden_size": 4096, "num_attention_heads": 32,
         "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048,
         "vocab_size": 50432})"},
    {"llama-2-7b",
     R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 32, "max_position_embeddings": 4096, "rope_theta": 10000.0,
         "vocab_size": 32000})"},
    {"llama-3-8b",
     R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "max_position_embeddings": 8192, "rope_theta": 500000.0,
         "vocab_size": 128256})"},
    {"llama-3.1-8b",
     R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "max_position_embeddings": 131072, "rope_theta": 500000.0,
         "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "vocab_size": 128256})"},
    {"llama-3.2-1b",
     R"({"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
         "rope_theta": 500000.0,
         "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "vocab_size": 128256})"},
    {"mistral-7b-v0.3",
     R"({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768,
         "rope_theta": 1000000.0, "vocab_size": 32768})"},
    {"qwen2.5-7b",
     R"({"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
         "num_key_value_heads": 4, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
         "vocab_size": 152064})"},
    {"qwen2-vl-7b",
     R"({"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
         "num_key_value_heads": 4, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
         "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
         "vocab_size": 152064})"},
    {"phi-3-mini-128k",
     R"({"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
         "num_key_value_heads": 32, "max_position_embeddings": 131072,
         "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "vocab_size": 32064,
         "rope_scaling": {"type": "longrope",
           "long_factor": [1.0299999713897705, 1.0499999523162842, 1.0499999523162842,
             1.0799999237060547, 1.2299998998641968, 1.2299998998641968, 1.2999999523162842,
             1.4499999284744263, 1.5999999046325684, 1.6499998569488525, 1.8999998569488525,
             2.859999895095825, 3.68999981880188, 5.419999599456787, 5.489999771118164,
             5.489999771118164, 9.09000015258789, 11.579999923706055, 15.65999984741211,
             15.769999504089355, 15.789999961853027, 18.360000610351562, 21.989999771118164,
             23.079999923706055, 30.009998321533203, 32.35000228881836, 32.590003967285156,
             35.56000518798828, 39.95000457763672, 53.840003967285156, 56.20000457763672,
             57.95000457763672, 59.29000473022461, 59.77000427246094, 59.920005798339844,
             61.190006256103516, 61.96000671386719, 62.50000762939453, 63.3700065612793,
             63.48000717163086, 63.48000717163086, 63.66000747680664, 63.850006103515625,
             64.08000946044922, 64.760009765625, 64.80001068115234, 64.81001281738281,
             64.81001281738281],
           "short_factor": [1.05, 1.05, 1.05, 1.1, 1.1, 1.1, 1.2500000000000002,
             1.2500000000000002, 1.4000000000000004, 1.4500000000000004, 1.5500000000000005,
             1.8500000000000008, 1.9000000000000008, 2.000000000000001, 2.000000000000001,
             2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
             2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
             2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
             2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
             2.000000000000001, 2.1000000000000005, 2.1000000000000005, 2.2,
             2.3499999999999996, 2.3499999999999996, 2.3499999999999996, 2.3499999999999996,
             2.3999999999999995, 2.3999999999999995, 2.6499999999999986, 2.6999999999999984,
             2.8999999999999977, 2.9499999999999975, 3.049999999999997, 3.049999999999997,
             3.049999999999997]}})"},
    {"deepseek-v2-lite",
     R"({"model_type": "deepseek_v2", "hidden_size": 2048, "num_attention_heads": 16,
         "qk_rope_head_dim": 64, "max_position_embeddings": 163840, "rope_theta": 10000,
         "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                          "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                          "mscale_all_dim": 0.707},
         "vocab_size": 102400})"},
    {"deepseek-v3",
     R"({"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
         "qk_rope_head_dim": 64, "max_position_embeddings": 163840, "rope_theta": 10000,
         "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                          "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
         "vocab_size": 129280})"},
    {"gemma-7b",
     R"({"model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16,
         "num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192,
         "rope_theta": 10000.0, "vocab_size": 256000})"},
    {"bert-base-uncased",
     R"({"model_type": "bert", "hidden_size": 768, "num_attention_heads": 12,
         "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522})"},
    {"gpt2",
     R"({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_positions": 1024,
         "vocab_size": 50257})"},
};

}  // namespace

std::vector<std::string> model_presets() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

ModelConfig model_preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return model_config_from_hf_json(p.config);
  }
  std::string known;
  for (const Preset& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  fail("model_preset", "no preset named \"{}\" (known: {})", name, known);
}

EMBROPE_END_NAMESPACE
