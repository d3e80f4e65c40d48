// The C API: DLTensor arguments converted to Tensor views, exceptions turned into status
// codes and a per-thread message. Nothing thrown crosses this file's functions.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <string>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"

struct embrope_rope_cache {
  embrope::RopeCache cache;
};

namespace {

using embrope::Error;
using embrope::ErrorCode;
using embrope::Tensor;

thread_local std::string last_error;

[[noreturn]] void fail(const char* function, const std::string& message) {
  throw Error(ErrorCode::invalid_argument, fmt::format("{}: {}", function, message));
}

// The value a C caller stored in an enum field. C lets any int live in an enum object; in
// C++ loading a value outside the enum's range is undefined, so the bytes are read as the
// underlying integer and compared against the enumerators.
template <typename Enum>
long long raw_enum(const Enum& field) {
  std::underlying_type_t<Enum> value;
  std::memcpy(&value, &field, sizeof value);
  return static_cast<long long>(value);
}

embrope::Device to_device(const char* function, const char* name, DLDevice device) {
  const long long type = raw_enum(device.device_type);
  switch (type) {
    case kDLCPU:
      return embrope::Device::cpu();
    case kDLCUDA:
      return embrope::Device::cuda(device.device_id);
    default:
      fail(function, fmt::format("{} has DLPack device type {}; only kDLCPU ({}) and kDLCUDA ({}) "
                                 "are supported",
                                 name, type, static_cast<int>(kDLCPU), static_cast<int>(kDLCUDA)));
  }
}

embrope::DType to_dtype(const char* function, const char* name, DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return embrope::DType::float32;
    if (t.code == kDLFloat && t.bits == 16) return embrope::DType::float16;
    if (t.code == kDLBfloat && t.bits == 16) return embrope::DType::bfloat16;
    if (t.code == kDLInt && t.bits == 32) return embrope::DType::int32;
    if (t.code == kDLInt && t.bits == 64) return embrope::DType::int64;
  }
  fail(function, fmt::format("{} has DLPack dtype (code {}, bits {}, lanes {}); supported are "
                             "float32, float16, bfloat16, int32 and int64 with one lane",
                             name, static_cast<int>(t.code), static_cast<int>(t.bits),
                             static_cast<int>(t.lanes)));
}

Tensor to_tensor(const char* function, const char* name, const DLTensor* t) {
  if (t == nullptr) fail(function, fmt::format("{} is null", name));
  if (t->ndim < 0 || t->ndim > embrope::kMaxDims) {
    fail(function,
         fmt::format("{} has ndim {}; at most {} are supported", name, t->ndim, embrope::kMaxDims));
  }
  if (t->ndim > 0 && t->shape == nullptr) fail(function, fmt::format("{} has a null shape", name));
  const embrope::DType dtype = to_dtype(function, name, t->dtype);
  const int size = embrope::dtype_size(dtype);
  if (t->byte_offset % static_cast<std::uint64_t>(size) != 0) {
    fail(function, fmt::format("{} has byte_offset {}, not a multiple of its element size {}", name,
                               t->byte_offset, size));
  }
  // Added as integers: a byte_offset that wraps the address space is an error, not a
  // pointer overflow.
  const auto base = reinterpret_cast<std::uintptr_t>(t->data);
  if (t->data != nullptr && t->byte_offset > UINTPTR_MAX - base) {
    fail(function, fmt::format("{} has byte_offset {}, which wraps past the end of the address "
                               "space",
                               name, t->byte_offset));
  }
  void* data = t->data == nullptr ? nullptr : reinterpret_cast<void*>(base + t->byte_offset);
  return Tensor(data, dtype, t->ndim, t->shape, t->strides, to_device(function, name, t->device));
}

std::optional<Tensor> to_optional(const char* function, const char* name, const DLTensor* t) {
  if (t == nullptr) return std::nullopt;
  return to_tensor(function, name, t);
}

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

embrope::RopeOptions rope_options(const char* function, const embrope_rope_options_t* o,
                                  void* stream) {
  embrope::RopeOptions options;
  options.stream.handle = stream;
  if (o == nullptr) return options;
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

void embrope_rope_config_init(embrope_rope_config_t* config) {
  if (config == nullptr) return;
  config->rotary_dim = 0;
  config->base = 10000.0;
  config->max_positions = 0;
}

embrope_status_t embrope_rope_cache_create(const embrope_rope_config_t* config, DLDevice device,
                                           void* stream, embrope_rope_cache_t** cache) {
  constexpr const char* fn = "embrope_rope_cache_create";
  return guarded(fn, "RopeCache", [&] {
    if (cache == nullptr) fail(fn, "cache (the output handle) is null");
    *cache = nullptr;
    if (config == nullptr) fail(fn, "config is null");
    embrope::RopeConfig c;
    c.rotary_dim = config->rotary_dim;
    c.base = config->base;
    c.max_positions = config->max_positions;
    *cache = new embrope_rope_cache{
        embrope::RopeCache(c, to_device(fn, "device", device), embrope::Stream{stream})};
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
      config->rotary_dim = cache->cache.rotary_dim();
      config->base = cache->cache.config().base;
      config->max_positions = cache->cache.max_positions();
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

void embrope_rope_options_init(embrope_rope_options_t* options) {
  if (options == nullptr) return;
  options->layout = EMBROPE_ROPE_NEOX;
  options->inverse = 0;
  options->rotary_dim = 0;
  options->q_out = nullptr;
  options->k_out = nullptr;
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

void embrope_embed_options_init(embrope_embed_options_t* options) {
  if (options == nullptr) return;
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
}

embrope_status_t embrope_embed(const DLTensor* table, const DLTensor* ids, const DLTensor* out,
                               const embrope_embed_options_t* o, void* stream) {
  constexpr const char* fn = "embrope_embed";
  return guarded(fn, "embed", [&] {
    embrope::EmbedOptions options;
    options.stream.handle = stream;
    if (o != nullptr) {
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
        fail(fn, fmt::format("sinusoid_layout {} is not an embrope_sinusoid_layout_t",
                             sinusoid_layout));
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
    }
    embrope::embed(to_tensor(fn, "table", table), to_tensor(fn, "ids", ids),
                   to_tensor(fn, "out", out), options);
  });
}

}  // extern "C"
