// The C API: DLTensor arguments converted to Tensor views, exceptions turned into status
// codes and a per-thread message. Nothing thrown crosses this file's functions.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>
#include <string>

#include "embrope/embrope.h"
#include "embrope/dlpack.hpp"
#include "embrope/embrope.hpp"
#include "c_enum.hpp"
#include "rope_scaling.hpp"

struct embrope_rope_cache {
  embrope::RopeCache cache;
};

struct embrope_deferred_status {
  embrope::DeferredStatus status;
  explicit embrope_deferred_status(embrope::Device device) : status(device) {}
};

namespace {

using embrope::Error;
using embrope::ErrorCode;
using embrope::Tensor;

thread_local std::string last_error;

[[noreturn]] void fail(const char* function, const std::string& message) {
  throw Error(ErrorCode::invalid_argument, fmt::format("{}: {}", function, message));
}

using embrope::internal::raw_enum;

template <typename... Args>
[[noreturn]] void fail(const char* function, fmt::format_string<Args...> format, Args&&... args) {
  fail(function, fmt::format(format, std::forward<Args>(args)...));
}

Tensor to_tensor(const char* function, const char* name, const DLTensor* t) {
  return embrope::tensor_from_dlpack(t, function, name);
}

std::optional<Tensor> to_optional(const char* function, const char* name, const DLTensor* t) {
  if (t == nullptr) return std::nullopt;
  return to_tensor(function, name, t);
}

// A C normalization enum, read as the int a C caller stored (by reference: loading a C enum
// outside its enumerators as a value is undefined in C++).
embrope::Normalization normalization_of(const char* function, const embrope_normalization_t& norm) {
  switch (raw_enum(norm)) {
    case EMBROPE_NORM_NONE:
      return embrope::Normalization::none;
    case EMBROPE_NORM_LAYER_NORM:
      return embrope::Normalization::layer_norm;
    case EMBROPE_NORM_RMS_NORM:
      return embrope::Normalization::rms_norm;
    default:
      fail(function, fmt::format("norm {} is not an embrope_normalization_t", raw_enum(norm)));
  }
}

// The C statuses are the C++ error codes' values, cast one to the other here.
static_assert(EMBROPE_OK == static_cast<int>(ErrorCode::ok) &&
              EMBROPE_ERROR_INVALID_ARGUMENT == static_cast<int>(ErrorCode::invalid_argument) &&
              EMBROPE_ERROR_INDEX_OUT_OF_RANGE == static_cast<int>(ErrorCode::index_out_of_range) &&
              EMBROPE_ERROR_NOT_IMPLEMENTED == static_cast<int>(ErrorCode::not_implemented) &&
              EMBROPE_ERROR_CUDA == static_cast<int>(ErrorCode::cuda_error) &&
              EMBROPE_ERROR_OUT_OF_MEMORY == static_cast<int>(ErrorCode::out_of_memory) &&
              EMBROPE_ERROR_INTERNAL == static_cast<int>(ErrorCode::internal));
embrope_status_t to_status(ErrorCode code) {
  return static_cast<embrope_status_t>(code);
}

// The message of a C function starts with that function's name: an error raised by the C++
// op it wraps ("embed: ids[3] = -1 ...") has the op's name replaced by the function's.
void set_last_error(const char* function, const char* op, const char* message) {
  const std::string prefix = std::string(op) + ": ";
  const std::size_t skip =
      std::strncmp(message, prefix.c_str(), prefix.size()) == 0 ? prefix.size() : 0;
  if (skip == 0 && std::strncmp(message, function, std::strlen(function)) == 0) {
    last_error = message;
    return;
  }
  last_error = std::string(function) + ": " + (message + skip);
}

// Runs body, translating every exception into a status and the thread's message.
// `op` is the C++ op the function wraps.
template <typename Body>
embrope_status_t guarded(const char* function, const char* op, Body&& body) noexcept {
  try {
    body();
    last_error.clear();
    return EMBROPE_OK;
  } catch (const Error& e) {
    set_last_error(function, op, e.what());
    return to_status(e.code());
  } catch (const std::bad_alloc&) {
    set_last_error(function, op, "out of host memory");
    return EMBROPE_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(function, op, (std::string("internal error: ") + e.what()).c_str());
    return EMBROPE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(function, op, "internal error: unknown exception");
    return EMBROPE_ERROR_INTERNAL;
  }
}

// Binary compatibility (embrope.h, docs/abi.md): a caller's options / config struct holds
// struct_size bytes, the sizeof of the header it was compiled with: a multiple of the
// struct's alignment (every struct starts with a size_t), at least that size_t, and far
// below a page (a garbage size from a struct never initialised is refused before any byte
// past the caller's object is read).
template <class T>
void check_struct_size(const char* function, const char* name, const T* in) {
  const std::size_t size = in->struct_size;
  if (size < sizeof(std::size_t) || size > 4096 || size % alignof(T) != 0) {
    fail(function, fmt::format("{}->struct_size is {}, not the size of an embrope.h struct: "
                               "initialise the struct with its *_init function before setting "
                               "fields",
                               name, size));
  }
}

// read_sized gives this library's struct: the caller's fields, this library's defaults for
// the fields past them; a larger struct (a newer header) must hold zeros past the fields this
// library knows (as Linux's copy_struct_from_user rules for openat2 and clone3).
template <class T>
T read_sized(const char* function, const char* name, const T* in,
             void (*init_size)(T*, std::size_t)) {
  T local;
  init_size(&local, sizeof(T));
  check_struct_size(function, name, in);
  const std::size_t size = in->struct_size;
  if (size > sizeof(T)) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(in);
    for (std::size_t i = sizeof(T); i < size; ++i) {
      if (bytes[i] != 0) {
        fail(function, fmt::format("{} is a {}-byte struct with fields set past the {} bytes this "
                                   "library ({}) knows: the program was built against a newer "
                                   "embrope.h than the library it runs with",
                                   name, size, sizeof(T), EMBROPE_VERSION_STRING));
      }
    }
  }
  std::memcpy(static_cast<void*>(&local), in, std::min(size, sizeof(T)));
  local.struct_size = sizeof(T);
  return local;
}

// *_init_size: the defaults written into a caller's struct of struct_size bytes (zeros past
// the fields this library knows).
template <class T>
void write_defaults(T* out, std::size_t struct_size, T defaults) {
  if (out == nullptr || struct_size < sizeof(std::size_t)) return;
  std::memset(static_cast<void*>(out), 0, struct_size);
  defaults.struct_size = struct_size;
  std::memcpy(static_cast<void*>(out), &defaults, std::min(struct_size, sizeof(T)));
}

embrope::RopeOptions rope_options(const char* function, const embrope_rope_options_t* o,
                                  void* stream) {
  embrope::RopeOptions options;
  options.stream.handle = stream;
  if (o == nullptr) return options;
  const embrope_rope_options_t copy =
      read_sized(function, "options", o, embrope_rope_options_init_size);
  o = &copy;
  const long long layout = raw_enum(o->layout);
  if (layout != EMBROPE_ROPE_NEOX && layout != EMBROPE_ROPE_INTERLEAVED) {
    fail(function, fmt::format("layout {} is neither NEOX (0) nor INTERLEAVED (1)", layout));
  }
  options.layout =
      layout == EMBROPE_ROPE_NEOX ? embrope::RopeLayout::neox : embrope::RopeLayout::interleaved;
  options.inverse = o->inverse != 0;
  options.rotary_dim = o->rotary_dim;
  options.q_out = to_optional(function, "q_out", o->q_out);
  options.k_out = to_optional(function, "k_out", o->k_out);
  for (int i = 0; i < 3; ++i) options.mrope_section[i] = o->mrope_section[i];
  for (int i = 0; i < 4; ++i) options.axes_dim[static_cast<std::size_t>(i)] = o->axes_dim[i];
  options.mrope_interleaved = o->mrope_interleaved != 0;
  if (o->deferred != nullptr) options.deferred = &o->deferred->status;
  // A zero scale (the init's, and an older header's) is the default 1 (docs/abi.md, rule 1).
  options.q_out_scale = o->q_out_scale == 0.0f ? 1.0f : o->q_out_scale;
  options.k_out_scale = o->k_out_scale == 0.0f ? 1.0f : o->k_out_scale;
  options.q_out_head_scales = to_optional(function, "q_out_head_scales", o->q_out_head_scales);
  options.k_out_head_scales = to_optional(function, "k_out_head_scales", o->k_out_head_scales);
  options.q_nope = to_optional(function, "q_nope", o->q_nope);
  options.q_nope_out = to_optional(function, "q_nope_out", o->q_nope_out);
  options.k_nope = to_optional(function, "k_nope", o->k_nope);
  options.k_nope_out = to_optional(function, "k_nope_out", o->k_nope_out);
  return options;
}

embrope::QkNorm qk_norm(const char* function, const embrope_qk_norm_t* n) {
  embrope::QkNorm norm;
  if (n == nullptr) return norm;
  const embrope_qk_norm_t copy = read_sized(function, "norm", n, embrope_qk_norm_init_size);
  n = &copy;
  norm.q_weight = to_optional(function, "q_weight", n->q_weight);
  norm.k_weight = to_optional(function, "k_weight", n->k_weight);
  norm.eps = n->eps;
  norm.unit_offset = n->unit_offset != 0;
  return norm;
}

embrope::QkNormGradients qk_norm_gradients(const char* function,
                                           const embrope_qk_norm_gradients_t* g) {
  embrope::QkNormGradients grads;
  if (g == nullptr) return grads;
  const embrope_qk_norm_gradients_t copy =
      read_sized(function, "grads", g, embrope_qk_norm_gradients_init_size);
  g = &copy;
  grads.q_weight = to_optional(function, "grads.q_weight", g->q_weight);
  grads.k_weight = to_optional(function, "grads.k_weight", g->k_weight);
  grads.workspace = g->workspace;
  grads.workspace_bytes = g->workspace_bytes;
  return grads;
}

}  // namespace

namespace {

// The C scaling values are the C++ ones' (scaling_variant looks a C value up among them, and
// embrope_rope_cache_info casts back).
static_assert(EMBROPE_ROPE_SCALING_NONE == static_cast<int>(embrope::RopeScaling::none) &&
              EMBROPE_ROPE_SCALING_LINEAR == static_cast<int>(embrope::RopeScaling::linear) &&
              EMBROPE_ROPE_SCALING_DYNAMIC == static_cast<int>(embrope::RopeScaling::dynamic) &&
              EMBROPE_ROPE_SCALING_YARN == static_cast<int>(embrope::RopeScaling::yarn) &&
              EMBROPE_ROPE_SCALING_LLAMA3 == static_cast<int>(embrope::RopeScaling::llama3) &&
              EMBROPE_ROPE_SCALING_LONGROPE == static_cast<int>(embrope::RopeScaling::longrope));

embrope::RopeConfig to_rope_config(const char* fn, const embrope_rope_config_t& caller) {
  const embrope_rope_config_t in = read_sized(fn, "config", &caller, embrope_rope_config_init_size);
  embrope::RopeConfig c;
#define EMBROPE_FROM_C(field) c.field = in.field;
  EMBROPE_ROPE_CONFIG_VALUES(EMBROPE_FROM_C)
#undef EMBROPE_FROM_C
  const embrope::internal::ScalingVariant* variant =
      embrope::internal::scaling_variant(raw_enum(in.scaling));
  if (variant == nullptr) {
    fail(fn, "config->scaling {} is not an embrope_rope_scaling_t value", raw_enum(in.scaling));
  }
  c.scaling = variant->kind;
  if (in.num_factors < 0) fail(fn, "config->num_factors {} must be non-negative", in.num_factors);
  if (in.num_factors > 0 && (in.short_factor == nullptr || in.long_factor == nullptr)) {
    fail(fn, "config->num_factors is {} but short_factor or long_factor is null", in.num_factors);
  }
  if (in.num_factors == 0 && (in.short_factor != nullptr || in.long_factor != nullptr)) {
    fail(fn, "config->short_factor/long_factor are set but num_factors is 0");
  }
  if (in.num_factors > 0) {
    c.short_factor.assign(in.short_factor, in.short_factor + in.num_factors);
    c.long_factor.assign(in.long_factor, in.long_factor + in.num_factors);
  }
  return c;
}

// The C description of a KV cache and its slots, as C++ views.
std::pair<embrope::KvCache, embrope::KvSlots> kv_cache_views(const char* fn,
                                                             const embrope_kv_cache_t* kv) {
  if (kv == nullptr) fail(fn, "kv is null");
  const embrope_kv_cache_t copy = read_sized(fn, "kv", kv, embrope_kv_cache_init_size);
  kv = &copy;
  const long long layout_value = raw_enum(kv->layout);
  if (layout_value != EMBROPE_KV_NHD && layout_value != EMBROPE_KV_HND) {
    fail(fn, fmt::format("layout {} is neither NHD (0) nor HND (1)", layout_value));
  }
  const auto layout =
      layout_value == EMBROPE_KV_NHD ? embrope::KvCacheLayout::nhd : embrope::KvCacheLayout::hnd;
  embrope::KvCache cache;
  if (kv->kv_cache != nullptr) {
    if (kv->k_cache != nullptr || kv->v_cache != nullptr) {
      fail(fn, "give kv_cache or k_cache and v_cache, not both");
    }
    cache = embrope::KvCache::combined(to_tensor(fn, "kv_cache", kv->kv_cache), layout, kv->k_scale,
                                       kv->v_scale);
  } else {
    cache.k = to_tensor(fn, "k_cache", kv->k_cache);
    cache.v = to_tensor(fn, "v_cache", kv->v_cache);
    cache.layout = layout;
    cache.k_scale = kv->k_scale;
    cache.v_scale = kv->v_scale;
  }
  embrope::KvSlots slots;
  slots.slot_mapping = to_optional(fn, "slot_mapping", kv->slot_mapping);
  slots.cache_offsets = to_optional(fn, "cache_offsets", kv->cache_offsets);
  slots.cu_seqlens = to_optional(fn, "cu_seqlens", kv->cu_seqlens);
  return {cache, slots};
}

// embed's options from the C struct (o may be NULL: the defaults).
embrope::EmbedOptions embed_options_of(const char* fn, const embrope_embed_options_t* o,
                                       void* stream) {
  embrope::EmbedOptions options;
  options.stream.handle = stream;
  embrope_embed_options_t copy;
  if (o != nullptr) {
    copy = read_sized(fn, "options", o, embrope_embed_options_init_size);
    o = &copy;
    options.scale = o->scale;
    options.vocab_start = o->vocab_start;
    options.vocab_shard = o->vocab_shard != 0;
    switch (raw_enum(o->positions)) {
      case EMBROPE_POSITIONS_NONE:
        options.positions = embrope::PositionEncoding::none;
        break;
      case EMBROPE_POSITIONS_LEARNED:
        options.positions = embrope::PositionEncoding::learned;
        break;
      case EMBROPE_POSITIONS_SINUSOIDAL:
        options.positions = embrope::PositionEncoding::sinusoidal;
        break;
      default:
        fail(fn, fmt::format("positions {} is not an embrope_position_encoding_t",
                             raw_enum(o->positions)));
    }
    const long long sinusoid_layout = raw_enum(o->sinusoid_layout);
    if (sinusoid_layout != EMBROPE_SINUSOID_INTERLEAVED &&
        sinusoid_layout != EMBROPE_SINUSOID_SPLIT) {
      fail(fn,
           fmt::format("sinusoid_layout {} is not an embrope_sinusoid_layout_t", sinusoid_layout));
    }
    options.sinusoid_base = o->sinusoid_base;
    options.sinusoid_layout = sinusoid_layout == EMBROPE_SINUSOID_SPLIT
                                  ? embrope::SinusoidLayout::split
                                  : embrope::SinusoidLayout::interleaved;
    options.position_table = to_optional(fn, "position_table", o->position_table);
    options.position_ids = to_optional(fn, "position_ids", o->position_ids);
    options.position_offsets = to_optional(fn, "position_offsets", o->position_offsets);
    options.type_table = to_optional(fn, "type_table", o->type_table);
    options.type_ids = to_optional(fn, "type_ids", o->type_ids);
    if (o->deferred != nullptr) options.deferred = &o->deferred->status;
    options.norm = normalization_of(fn, o->norm);
    options.norm_weight = to_optional(fn, "norm_weight", o->norm_weight);
    options.norm_bias = to_optional(fn, "norm_bias", o->norm_bias);
    options.norm_eps = o->norm_eps;
    options.norm_unit_offset = o->norm_unit_offset != 0;
    options.pre_norm_out = to_optional(fn, "pre_norm_out", o->pre_norm_out);
  }
  return options;
}

}  // namespace

extern "C" {

const char* embrope_version(void) {
  return EMBROPE_VERSION_STRING;
}

const char* embrope_last_error(void) {
  return last_error.c_str();
}

int embrope_cuda_device_count(void) {
  try {
    return embrope::cuda_device_count();
  } catch (...) {
    return 0;
  }
}

void embrope_rope_config_init_size(embrope_rope_config_t* out, size_t struct_size) {
  embrope_rope_config_t defaults{};
  embrope_rope_config_t* config = &defaults;
  const embrope::RopeConfig d;
#define EMBROPE_TO_C(field) config->field = d.field;
  EMBROPE_ROPE_CONFIG_VALUES(EMBROPE_TO_C)
#undef EMBROPE_TO_C
  config->scaling = EMBROPE_ROPE_SCALING_NONE;
  config->short_factor = nullptr;
  config->long_factor = nullptr;
  config->num_factors = 0;
  write_defaults(out, struct_size, defaults);
}

embrope_status_t embrope_rope_frequencies(const embrope_rope_config_t* config, double* inv_freq,
                                          int64_t capacity, double* attention_factor) {
  constexpr const char* fn = "embrope_rope_frequencies";
  return guarded("embrope_rope_frequencies", "RopeCache", [&] {
    if (config == nullptr) fail(fn, "config is null");
    const embrope::RopeFrequencies f = embrope::rope_frequencies(to_rope_config(fn, *config));
    const auto count = static_cast<int64_t>(f.inv_freq.size());
    if (inv_freq == nullptr || capacity < count) {
      fail(fn, "inv_freq needs room for rotary_dim / 2 = {} values (capacity {})", count, capacity);
    }
    std::copy(f.inv_freq.begin(), f.inv_freq.end(), inv_freq);
    if (attention_factor != nullptr) *attention_factor = f.attention_factor;
  });
}

embrope_status_t embrope_rope_cache_create(const embrope_rope_config_t* config, DLDevice device,
                                           void* stream, embrope_rope_cache_t** cache) {
  constexpr const char* fn = "embrope_rope_cache_create";
  return guarded(fn, "RopeCache", [&] {
    if (cache == nullptr) fail(fn, "cache (the output handle) is null");
    *cache = nullptr;
    if (config == nullptr) fail(fn, "config is null");
    *cache = new embrope_rope_cache{embrope::RopeCache(
        to_rope_config(fn, *config), embrope::device_from_dlpack(device, fn, "device"),
        embrope::Stream{stream})};
  });
}

embrope_status_t embrope_rope_cache_create_axial(const embrope_rope_config_t* const* axes,
                                                 size_t num_axes, DLDevice device, void* stream,
                                                 embrope_rope_cache_t** cache) {
  constexpr const char* fn = "embrope_rope_cache_create_axial";
  return guarded(fn, "RopeCache", [&] {
    if (cache == nullptr) fail(fn, "cache (the output handle) is null");
    *cache = nullptr;
    if (axes == nullptr) fail(fn, "axes is null");
    if (num_axes == 0 || num_axes > 4) {
      fail(fn, fmt::format("num_axes {} must be 1 to 4", num_axes));
    }
    std::vector<embrope::RopeConfig> configs;
    for (std::size_t a = 0; a < num_axes; ++a) {
      if (axes[a] == nullptr) fail(fn, fmt::format("axes[{}] is null", a));
      configs.push_back(to_rope_config(fn, *axes[a]));
    }
    *cache = new embrope_rope_cache{embrope::RopeCache::axial(
        configs, embrope::device_from_dlpack(device, fn, "device"), embrope::Stream{stream})};
  });
}

embrope_status_t embrope_rope_cache_axes_dim(const embrope_rope_cache_t* cache,
                                             int64_t axes_dim[4]) {
  constexpr const char* fn = "embrope_rope_cache_axes_dim";
  return guarded(fn, "RopeCache", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    if (axes_dim == nullptr) fail(fn, "axes_dim is null");
    const std::vector<int64_t> dims = cache->cache.axes_dim();
    for (std::size_t a = 0; a < 4; ++a) axes_dim[a] = a < dims.size() ? dims[a] : 0;
  });
}

embrope_status_t embrope_rope_cache_destroy(embrope_rope_cache_t* cache) {
  return guarded("embrope_rope_cache_destroy", "RopeCache", [&] { delete cache; });
}

embrope_status_t embrope_rope_cache_info(const embrope_rope_cache_t* cache,
                                         embrope_rope_config_t* config, DLDevice* device) {
  constexpr const char* fn = "embrope_rope_cache_info";
  return guarded(fn, "RopeCache", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    if (config != nullptr) {
      // Written up to the caller's struct_size (a struct from an older header is shorter).
      check_struct_size(fn, "config", config);  // an output: written up to its size
      const std::size_t size = config->struct_size;
      embrope_rope_config_t* out = config;
      embrope_rope_config_t full;
      config = &full;
      const embrope::RopeConfig& c = cache->cache.config();
      embrope_rope_config_init(config);
#define EMBROPE_TO_C(field) config->field = c.field;
      EMBROPE_ROPE_CONFIG_VALUES(EMBROPE_TO_C)
#undef EMBROPE_TO_C
      config->scaling = static_cast<embrope_rope_scaling_t>(c.scaling);
      if (!c.short_factor.empty()) {
        config->short_factor = c.short_factor.data();
        config->long_factor = c.long_factor.data();
        config->num_factors = static_cast<int64_t>(c.short_factor.size());
      }
      std::memcpy(static_cast<void*>(out), &full, std::min(size, sizeof full));
      // A newer caller's fields past this library's struct: zero, their defaults (docs/abi.md).
      if (size > sizeof full) {
        std::memset(reinterpret_cast<unsigned char*>(out) + sizeof full, 0, size - sizeof full);
      }
      out->struct_size = size;
    }
    if (device != nullptr) {
      const embrope::Device d = cache->cache.device();
      device->device_type = d.kind == embrope::DeviceKind::cpu ? kDLCPU : kDLCUDA;
      device->device_id = d.index;
    }
  });
}

embrope_status_t embrope_rope_cache_copy_to_host(const embrope_rope_cache_t* cache, float* cos,
                                                 float* sin) {
  constexpr const char* fn = "embrope_rope_cache_copy_to_host";
  return guarded(fn, "RopeCache", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    if (cos == nullptr || sin == nullptr) fail(fn, "cos and sin must not be null");
    cache->cache.copy_to_host(cos, sin);
  });
}

void embrope_rope_options_init_size(embrope_rope_options_t* out, size_t struct_size) {
  embrope_rope_options_t defaults{};
  embrope_rope_options_t* options = &defaults;
  options->layout = EMBROPE_ROPE_NEOX;
  options->inverse = 0;
  options->rotary_dim = 0;
  options->q_out = nullptr;
  options->k_out = nullptr;
  for (int64_t& s : options->mrope_section) s = 0;
  for (int64_t& a : options->axes_dim) a = 0;
  options->deferred = nullptr;
  options->mrope_interleaved = 0;
  options->q_out_head_scales = nullptr;
  options->k_out_head_scales = nullptr;
  options->q_out_scale = 0.0f;  // 1
  options->k_out_scale = 0.0f;
  write_defaults(out, struct_size, defaults);
}

embrope_status_t embrope_apply_rope(const DLTensor* q, const DLTensor* k, const DLTensor* positions,
                                    const embrope_rope_cache_t* cache,
                                    const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_rope";
  return guarded(fn, "apply_rope", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    embrope::apply_rope(to_tensor(fn, "q", q), to_optional(fn, "k", k),
                        to_tensor(fn, "positions", positions), cache->cache,
                        rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_rope_cos_sin(const DLTensor* q, const DLTensor* k,
                                            const DLTensor* positions, const DLTensor* cos,
                                            const DLTensor* sin,
                                            const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_rope_cos_sin";
  return guarded(fn, "apply_rope", [&] {
    embrope::apply_rope(to_tensor(fn, "q", q), to_optional(fn, "k", k),
                        to_tensor(fn, "positions", positions), to_tensor(fn, "cos", cos),
                        to_tensor(fn, "sin", sin), rope_options(fn, options, stream));
  });
}

void embrope_kv_cache_init_size(embrope_kv_cache_t* out, size_t struct_size) {
  embrope_kv_cache_t defaults{};
  embrope_kv_cache_t* kv = &defaults;
  *kv = embrope_kv_cache_t{};
  kv->layout = EMBROPE_KV_NHD;
  kv->k_scale = 1.0f;
  kv->v_scale = 1.0f;
  write_defaults(out, struct_size, defaults);
}

embrope_status_t embrope_apply_rope_append_kv(const DLTensor* q, const DLTensor* k,
                                              const DLTensor* v, const DLTensor* positions,
                                              const embrope_rope_cache_t* cache,
                                              const embrope_kv_cache_t* kv,
                                              const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_rope_append_kv";
  return guarded(fn, "apply_rope_append_kv", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    const auto [kv_cache, slots] = kv_cache_views(fn, kv);
    embrope::apply_rope_append_kv(to_tensor(fn, "q", q), to_tensor(fn, "k", k),
                                  to_tensor(fn, "v", v), to_tensor(fn, "positions", positions),
                                  cache->cache, kv_cache, slots, rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_rope_append_kv_cos_sin(const DLTensor* q, const DLTensor* k,
                                                      const DLTensor* v, const DLTensor* positions,
                                                      const DLTensor* cos, const DLTensor* sin,
                                                      const embrope_kv_cache_t* kv,
                                                      const embrope_rope_options_t* options,
                                                      void* stream) {
  constexpr const char* fn = "embrope_apply_rope_append_kv_cos_sin";
  return guarded(fn, "apply_rope_append_kv", [&] {
    const auto [kv_cache, slots] = kv_cache_views(fn, kv);
    embrope::apply_rope_append_kv(to_tensor(fn, "q", q), to_tensor(fn, "k", k),
                                  to_tensor(fn, "v", v), to_tensor(fn, "positions", positions),
                                  to_tensor(fn, "cos", cos), to_tensor(fn, "sin", sin), kv_cache,
                                  slots, rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_packed_positions(const DLTensor* cu_seqlens, const DLTensor* start_offsets,
                                          const DLTensor* positions,
                                          embrope_deferred_status_t* deferred, void* stream) {
  constexpr const char* fn = "embrope_packed_positions";
  return guarded("embrope_packed_positions", "packed_positions", [&] {
    embrope::PackedPositionsOptions options;
    if (deferred != nullptr) options.deferred = &deferred->status;
    options.start_offsets = to_optional(fn, "start_offsets", start_offsets);
    options.stream.handle = stream;
    embrope::packed_positions(to_tensor(fn, "cu_seqlens", cu_seqlens),
                              to_tensor(fn, "positions", positions), options);
  });
}

void embrope_embed_options_init_size(embrope_embed_options_t* out, size_t struct_size) {
  embrope_embed_options_t defaults{};
  embrope_embed_options_t* options = &defaults;
  options->scale = 1.0f;
  options->vocab_start = 0;
  options->vocab_shard = 0;
  options->positions = EMBROPE_POSITIONS_NONE;
  options->position_table = nullptr;
  options->sinusoid_base = 10000.0;
  options->sinusoid_layout = EMBROPE_SINUSOID_INTERLEAVED;
  options->position_ids = nullptr;
  options->position_offsets = nullptr;
  options->type_table = nullptr;
  options->type_ids = nullptr;
  options->deferred = nullptr;
  options->norm = EMBROPE_NORM_NONE;
  options->norm_weight = nullptr;
  options->norm_bias = nullptr;
  options->norm_eps = 1e-5f;
  options->norm_unit_offset = 0;
  options->pre_norm_out = nullptr;
  write_defaults(out, struct_size, defaults);
}

embrope_status_t embrope_embed(const DLTensor* table, const DLTensor* ids, const DLTensor* out,
                               const embrope_embed_options_t* o, void* stream) {
  constexpr const char* fn = "embrope_embed";
  return guarded(fn, "embed", [&] {
    const embrope::EmbedOptions options = embed_options_of(fn, o, stream);
    embrope::embed(to_tensor(fn, "table", table), to_tensor(fn, "ids", ids),
                   to_tensor(fn, "out", out), options);
  });
}

void embrope_quantized_table_init_size(embrope_quantized_table_t* out, size_t struct_size) {
  embrope_quantized_table_t defaults{};
  defaults.format = EMBROPE_QUANT_INT8;
  defaults.data = nullptr;
  defaults.dim = 0;
  defaults.scales = nullptr;
  defaults.zero_points = nullptr;
  write_defaults(out, struct_size, defaults);
}

embrope_status_t embrope_embed_quantized(const embrope_quantized_table_t* t, const DLTensor* ids,
                                         const DLTensor* out, const embrope_embed_options_t* o,
                                         void* stream) {
  constexpr const char* fn = "embrope_embed_quantized";
  return guarded(fn, "embed", [&] {
    if (t == nullptr) fail(fn, "table is null");
    const embrope_quantized_table_t c =
        read_sized(fn, "table", t, embrope_quantized_table_init_size);
    embrope::QuantizedTable table;
    switch (raw_enum(c.format)) {
      case EMBROPE_QUANT_INT8:
        table.format = embrope::QuantFormat::int8;
        break;
      case EMBROPE_QUANT_INT4:
        table.format = embrope::QuantFormat::int4;
        break;
      case EMBROPE_QUANT_FLOAT8_E4M3FN:
        table.format = embrope::QuantFormat::float8_e4m3fn;
        break;
      case EMBROPE_QUANT_FLOAT8_E5M2:
        table.format = embrope::QuantFormat::float8_e5m2;
        break;
      case EMBROPE_QUANT_GGUF_Q8_0:
        table.format = embrope::QuantFormat::gguf_q8_0;
        break;
      case EMBROPE_QUANT_GGUF_Q4_0:
        table.format = embrope::QuantFormat::gguf_q4_0;
        break;
      case EMBROPE_QUANT_GGUF_Q4_K:
        table.format = embrope::QuantFormat::gguf_q4_k;
        break;
      case EMBROPE_QUANT_GGUF_Q6_K:
        table.format = embrope::QuantFormat::gguf_q6_k;
        break;
      default:
        fail(fn,
             fmt::format("table->format {} is not an embrope_quant_format_t", raw_enum(c.format)));
    }
    table.data = to_tensor(fn, "table.data", c.data);
    table.dim = c.dim;
    table.scales = to_optional(fn, "table.scales", c.scales);
    table.zero_points = to_optional(fn, "table.zero_points", c.zero_points);
    const embrope::EmbedOptions options = embed_options_of(fn, o, stream);
    embrope::embed(table, to_tensor(fn, "ids", ids), to_tensor(fn, "out", out), options);
  });
}

// ---------------------------------------------------------------- backward passes ----

void embrope_embed_backward_options_init_size(embrope_embed_backward_options_t* out,
                                              size_t struct_size) {
  embrope_embed_backward_options_t defaults{};
  embrope_embed_backward_options_t* options = &defaults;
  options->scale = 1.0f;
  options->vocab_start = 0;
  options->vocab_shard = 0;
  options->has_padding_idx = 0;
  options->padding_idx = 0;
  options->grad_position_table = nullptr;
  options->position_ids = nullptr;
  options->position_offsets = nullptr;
  options->grad_type_table = nullptr;
  options->type_ids = nullptr;
  options->mode = EMBROPE_BACKWARD_DETERMINISTIC;
  options->workspace = nullptr;
  options->workspace_bytes = 0;
  options->deferred = nullptr;
  options->norm = EMBROPE_NORM_NONE;
  options->pre_norm = nullptr;
  options->norm_weight = nullptr;
  options->norm_eps = 1e-5f;
  options->norm_unit_offset = 0;
  options->grad_pre_norm = nullptr;
  options->grad_norm_weight = nullptr;
  options->grad_norm_bias = nullptr;
  write_defaults(out, struct_size, defaults);
}

embrope_status_t embrope_deferred_status_create(DLDevice device,
                                                embrope_deferred_status_t** status) {
  constexpr const char* fn = "embrope_deferred_status_create";
  return guarded("embrope_deferred_status_create", "DeferredStatus", [&] {
    if (status == nullptr) fail(fn, "status (the output handle) is null");
    *status = nullptr;
    *status = new embrope_deferred_status(embrope::device_from_dlpack(device, fn, "device"));
  });
}

embrope_status_t embrope_deferred_status_destroy(embrope_deferred_status_t* status) {
  return guarded("embrope_deferred_status_destroy", "DeferredStatus", [&] { delete status; });
}

embrope_status_t embrope_deferred_status_check(embrope_deferred_status_t* status, void* stream) {
  constexpr const char* fn = "embrope_deferred_status_check";
  return guarded("embrope_deferred_status_check", "DeferredStatus", [&] {
    if (status == nullptr) fail(fn, "status is null");
    status->status.check(embrope::Stream{stream});
  });
}

}  // extern "C"

namespace {

embrope::EmbedBackwardOptions embed_backward_options(const char* fn,
                                                     const embrope_embed_backward_options_t* o,
                                                     void* stream) {
  embrope::EmbedBackwardOptions options;
  options.stream.handle = stream;
  if (o == nullptr) return options;
  const embrope_embed_backward_options_t copy =
      read_sized(fn, "options", o, embrope_embed_backward_options_init_size);
  o = &copy;
  options.scale = o->scale;
  options.vocab_start = o->vocab_start;
  options.vocab_shard = o->vocab_shard != 0;
  if (o->has_padding_idx != 0) options.padding_idx = o->padding_idx;
  options.grad_position_table = to_optional(fn, "grad_position_table", o->grad_position_table);
  options.position_ids = to_optional(fn, "position_ids", o->position_ids);
  options.position_offsets = to_optional(fn, "position_offsets", o->position_offsets);
  options.grad_type_table = to_optional(fn, "grad_type_table", o->grad_type_table);
  options.type_ids = to_optional(fn, "type_ids", o->type_ids);
  // Read as the int a C caller stored: in C++, loading an enum outside its enumerators'
  // range is undefined.
  int mode = 0;
  static_assert(sizeof mode == sizeof o->mode, "a C enum is int-sized");
  std::memcpy(&mode, &o->mode, sizeof mode);
  switch (mode) {
    case EMBROPE_BACKWARD_DETERMINISTIC:
      options.mode = embrope::BackwardMode::deterministic;
      break;
    case EMBROPE_BACKWARD_ATOMIC:
      options.mode = embrope::BackwardMode::atomic;
      break;
    default:
      fail(fn, fmt::format("mode {} is not an embrope_backward_mode_t", mode));
  }
  options.workspace = o->workspace;
  options.workspace_bytes = o->workspace_bytes;
  if (o->deferred != nullptr) options.deferred = &o->deferred->status;
  options.norm = normalization_of(fn, o->norm);
  options.pre_norm = to_optional(fn, "pre_norm", o->pre_norm);
  options.norm_weight = to_optional(fn, "norm_weight", o->norm_weight);
  options.norm_eps = o->norm_eps;
  options.norm_unit_offset = o->norm_unit_offset != 0;
  options.grad_pre_norm = to_optional(fn, "grad_pre_norm", o->grad_pre_norm);
  options.grad_norm_weight = to_optional(fn, "grad_norm_weight", o->grad_norm_weight);
  options.grad_norm_bias = to_optional(fn, "grad_norm_bias", o->grad_norm_bias);
  return options;
}

}  // namespace

extern "C" {

embrope_status_t embrope_embed_backward(const DLTensor* grad_out, const DLTensor* ids,
                                        const DLTensor* grad_table,
                                        const embrope_embed_backward_options_t* options,
                                        void* stream) {
  constexpr const char* fn = "embrope_embed_backward";
  return guarded("embrope_embed_backward", "embed_backward", [&] {
    embrope::embed_backward(to_tensor(fn, "grad_out", grad_out), to_tensor(fn, "ids", ids),
                            to_optional(fn, "grad_table", grad_table),
                            embed_backward_options(fn, options, stream));
  });
}

embrope_status_t embrope_embed_backward_workspace_size(
    const DLTensor* grad_out, const DLTensor* ids, const DLTensor* grad_table,
    const embrope_embed_backward_options_t* options, size_t* bytes) {
  constexpr const char* fn = "embrope_embed_backward_workspace_size";
  return guarded("embrope_embed_backward_workspace_size", "embed_backward", [&] {
    if (bytes == nullptr) fail(fn, "bytes (the result pointer) is null");
    *bytes = embrope::embed_backward_workspace_size(
        to_tensor(fn, "grad_out", grad_out), to_tensor(fn, "ids", ids),
        to_optional(fn, "grad_table", grad_table), embed_backward_options(fn, options, nullptr));
  });
}

embrope_status_t embrope_apply_rope_backward(const DLTensor* dq, const DLTensor* dk,
                                             const DLTensor* positions,
                                             const embrope_rope_cache_t* cache,
                                             const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_rope_backward";
  return guarded("embrope_apply_rope_backward", "apply_rope_backward", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    embrope::apply_rope_backward(to_tensor(fn, "dq", dq), to_optional(fn, "dk", dk),
                                 to_tensor(fn, "positions", positions), cache->cache,
                                 rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_rope_backward_cos_sin(const DLTensor* dq, const DLTensor* dk,
                                                     const DLTensor* positions, const DLTensor* cos,
                                                     const DLTensor* sin,
                                                     const embrope_rope_options_t* options,
                                                     void* stream) {
  constexpr const char* fn = "embrope_apply_rope_backward_cos_sin";
  return guarded("embrope_apply_rope_backward_cos_sin", "apply_rope_backward", [&] {
    embrope::apply_rope_backward(to_tensor(fn, "dq", dq), to_optional(fn, "dk", dk),
                                 to_tensor(fn, "positions", positions), to_tensor(fn, "cos", cos),
                                 to_tensor(fn, "sin", sin), rope_options(fn, options, stream));
  });
}

void embrope_qk_norm_init_size(embrope_qk_norm_t* out, size_t struct_size) {
  embrope_qk_norm_t defaults{};
  embrope_qk_norm_t* norm = &defaults;
  *norm = embrope_qk_norm_t{};
  norm->eps = 1e-6f;
  write_defaults(out, struct_size, defaults);
}

void embrope_qk_norm_gradients_init_size(embrope_qk_norm_gradients_t* out, size_t struct_size) {
  embrope_qk_norm_gradients_t defaults{};
  embrope_qk_norm_gradients_t* grads = &defaults;
  *grads = embrope_qk_norm_gradients_t{};
  write_defaults(out, struct_size, defaults);
}

embrope_status_t embrope_apply_qk_norm_rope(const DLTensor* q, const DLTensor* k,
                                            const DLTensor* positions,
                                            const embrope_rope_cache_t* cache,
                                            const embrope_qk_norm_t* norm,
                                            const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_qk_norm_rope";
  return guarded(fn, "apply_qk_norm_rope", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    embrope::apply_qk_norm_rope(to_tensor(fn, "q", q), to_optional(fn, "k", k),
                                to_tensor(fn, "positions", positions), cache->cache,
                                qk_norm(fn, norm), rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_qk_norm_rope_cos_sin(const DLTensor* q, const DLTensor* k,
                                                    const DLTensor* positions, const DLTensor* cos,
                                                    const DLTensor* sin,
                                                    const embrope_qk_norm_t* norm,
                                                    const embrope_rope_options_t* options,
                                                    void* stream) {
  constexpr const char* fn = "embrope_apply_qk_norm_rope_cos_sin";
  return guarded(fn, "apply_qk_norm_rope", [&] {
    embrope::apply_qk_norm_rope(to_tensor(fn, "q", q), to_optional(fn, "k", k),
                                to_tensor(fn, "positions", positions), to_tensor(fn, "cos", cos),
                                to_tensor(fn, "sin", sin), qk_norm(fn, norm),
                                rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_qk_norm_rope_append_kv(
    const DLTensor* q, const DLTensor* k, const DLTensor* v, const DLTensor* positions,
    const embrope_rope_cache_t* cache, const embrope_kv_cache_t* kv, const embrope_qk_norm_t* norm,
    const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_qk_norm_rope_append_kv";
  return guarded(fn, "apply_qk_norm_rope_append_kv", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    const auto [kv_cache, slots] = kv_cache_views(fn, kv);
    embrope::apply_qk_norm_rope_append_kv(
        to_tensor(fn, "q", q), to_tensor(fn, "k", k), to_tensor(fn, "v", v),
        to_tensor(fn, "positions", positions), cache->cache, kv_cache, slots, qk_norm(fn, norm),
        rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_qk_norm_rope_append_kv_cos_sin(
    const DLTensor* q, const DLTensor* k, const DLTensor* v, const DLTensor* positions,
    const DLTensor* cos, const DLTensor* sin, const embrope_kv_cache_t* kv,
    const embrope_qk_norm_t* norm, const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_qk_norm_rope_append_kv_cos_sin";
  return guarded(fn, "apply_qk_norm_rope_append_kv", [&] {
    const auto [kv_cache, slots] = kv_cache_views(fn, kv);
    embrope::apply_qk_norm_rope_append_kv(
        to_tensor(fn, "q", q), to_tensor(fn, "k", k), to_tensor(fn, "v", v),
        to_tensor(fn, "positions", positions), to_tensor(fn, "cos", cos), to_tensor(fn, "sin", sin),
        kv_cache, slots, qk_norm(fn, norm), rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_qk_norm_rope_backward(
    const DLTensor* dq, const DLTensor* dk, const DLTensor* q, const DLTensor* k,
    const DLTensor* positions, const embrope_rope_cache_t* cache, const embrope_qk_norm_t* norm,
    const embrope_qk_norm_gradients_t* grads, const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_qk_norm_rope_backward";
  return guarded(fn, "apply_qk_norm_rope_backward", [&] {
    if (cache == nullptr) fail(fn, "cache is null");
    embrope::apply_qk_norm_rope_backward(
        to_tensor(fn, "dq", dq), to_optional(fn, "dk", dk), to_tensor(fn, "q", q),
        to_optional(fn, "k", k), to_tensor(fn, "positions", positions), cache->cache,
        qk_norm(fn, norm), qk_norm_gradients(fn, grads), rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_qk_norm_rope_backward_cos_sin(
    const DLTensor* dq, const DLTensor* dk, const DLTensor* q, const DLTensor* k,
    const DLTensor* positions, const DLTensor* cos, const DLTensor* sin,
    const embrope_qk_norm_t* norm, const embrope_qk_norm_gradients_t* grads,
    const embrope_rope_options_t* options, void* stream) {
  constexpr const char* fn = "embrope_apply_qk_norm_rope_backward_cos_sin";
  return guarded(fn, "apply_qk_norm_rope_backward", [&] {
    embrope::apply_qk_norm_rope_backward(
        to_tensor(fn, "dq", dq), to_optional(fn, "dk", dk), to_tensor(fn, "q", q),
        to_optional(fn, "k", k), to_tensor(fn, "positions", positions), to_tensor(fn, "cos", cos),
        to_tensor(fn, "sin", sin), qk_norm(fn, norm), qk_norm_gradients(fn, grads),
        rope_options(fn, options, stream));
  });
}

embrope_status_t embrope_apply_qk_norm_rope_backward_workspace_size(
    const DLTensor* dq, const DLTensor* dk, const embrope_qk_norm_gradients_t* grads,
    size_t* bytes) {
  constexpr const char* fn = "embrope_apply_qk_norm_rope_backward_workspace_size";
  return guarded(fn, "apply_qk_norm_rope_backward", [&] {
    if (bytes == nullptr) fail(fn, "bytes (the result pointer) is null");
    *bytes = embrope::apply_qk_norm_rope_backward_workspace_size(
        to_tensor(fn, "dq", dq), to_optional(fn, "dk", dk), qk_norm_gradients(fn, grads));
  });
}

}  // extern "C"
