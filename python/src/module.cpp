// embrope._embrope: the Python extension over libembrope's C++ API. It holds no kernels and no
// rules of its own: arrays arrive through DLPack (any object with __dlpack__, zero-copy) and
// become Tensor views by the library's own conversion (embrope/dlpack.hpp); every check and
// every error message is the library's. embrope::Error becomes a Python exception whose class
// says the error code (InvalidArgumentError is a ValueError, BadIndexError an IndexError, ...).
// The Python package (python/embrope) gives these functions their signatures, defaults and
// docstrings; this file only converts.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "embrope/dlpack.hpp"
#include "embrope/embrope.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using embrope::Tensor;

// ------------------------------------------------------------------ exceptions ----

// The exception class of each ErrorCode, created at import (embrope.Error and subclasses).
PyObject* error_classes[7] = {};

PyObject* make_error_class(nb::module_& m, const char* name, PyObject* builtin, const char* code,
                           const char* doc) {
  nb::object bases = builtin == nullptr
                         ? nb::make_tuple(nb::handle(PyExc_Exception))
                         : nb::make_tuple(nb::handle(error_classes[0]), nb::handle(builtin));
  nb::dict dict;
  dict["code"] = code;
  dict["__doc__"] = doc;
  const std::string qualified = std::string("embrope.") + name;
  PyObject* cls = PyErr_NewException(qualified.c_str(), bases.ptr(), dict.ptr());
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

void register_errors(nb::module_& m) {
  error_classes[0] = make_error_class(m, "Error", nullptr, "",
                                      "Base class of every error embrope raises. `code` names "
                                      "the library's error code.");
  auto sub = [&](embrope::ErrorCode code, const char* name, PyObject* builtin, const char* key,
                 const char* doc) {
    error_classes[static_cast<int>(code)] = make_error_class(m, name, builtin, key, doc);
  };
  sub(embrope::ErrorCode::invalid_argument, "InvalidArgumentError", PyExc_ValueError,
      "invalid_argument", "A shape, stride, dtype, device or option breaks a rule of the op.");
  sub(embrope::ErrorCode::index_out_of_range, "BadIndexError", PyExc_IndexError,
      "index_out_of_range",
      "An id, position or type id outside its table (the first offending row is named).");
  sub(embrope::ErrorCode::not_implemented, "NotAvailableError", PyExc_NotImplementedError,
      "not_implemented", "A path this build does not have (CUDA arrays without CUDA).");
  sub(embrope::ErrorCode::cuda_error, "CudaError", PyExc_RuntimeError, "cuda_error",
      "The CUDA runtime reported an error.");
  sub(embrope::ErrorCode::out_of_memory, "OutOfMemoryError", PyExc_MemoryError, "out_of_memory",
      "An allocation failed.");
  sub(embrope::ErrorCode::internal, "InternalError", PyExc_RuntimeError, "internal",
      "A bug in embrope.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const embrope::Error& e) {
      const int code = static_cast<int>(e.code());
      PyObject* cls = code > 0 && code < 7 ? error_classes[code] : error_classes[6];
      PyErr_SetString(cls, e.what());
    }
  });
}

// ---------------------------------------------------------------------- arrays ----

// Any array argument: nanobind imports it through DLPack (or the buffer protocol) without a
// copy; read-only arrays are accepted, and whether an array may be written is the package's
// check (it knows which arguments an op writes).
using Array = nb::ndarray<nb::ro>;
using OptionalArray = std::optional<Array>;

Tensor view(const Array& a, const char* op, const char* name) {
  DLTensor t{};
  t.data = const_cast<void*>(a.data_handle());
  const std::int32_t device_type = a.device_type();
  std::memcpy(&t.device.device_type, &device_type, sizeof device_type);
  t.device.device_id = a.device_id();
  t.ndim = static_cast<int>(a.ndim());
  t.dtype.code = a.dtype().code;
  t.dtype.bits = a.dtype().bits;
  t.dtype.lanes = a.dtype().lanes;
  t.shape = const_cast<std::int64_t*>(a.shape_ptr());
  t.strides = const_cast<std::int64_t*>(a.stride_ptr());
  t.byte_offset = a.byte_offset();
  return embrope::tensor_from_dlpack(&t, op, name);
}

std::optional<Tensor> view(const OptionalArray& a, const char* op, const char* name) {
  if (!a) return std::nullopt;
  return view(*a, op, name);
}

embrope::Stream stream_of(std::uintptr_t handle) {
  return embrope::Stream{reinterpret_cast<void*>(handle)};
}

embrope::Device device_of(int kind, int index) {
  return kind == 0 ? embrope::Device::cpu() : embrope::Device::cuda(index);
}

std::pair<int, int> device_pair(embrope::Device d) {
  return {d.kind == embrope::DeviceKind::cpu ? 0 : 1, d.index};
}

// A float64 copy handed to NumPy, which frees it.
nb::object numpy_copy(const std::vector<double>& values) {
  auto* data = new double[values.size()];
  std::memcpy(data, values.data(), values.size() * sizeof(double));
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<double*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, double, nb::ndim<1>>(data, {values.size()}, owner));
}

// A workspace given as any writable array on the tensors' device: its bytes.
std::pair<void*, std::size_t> workspace_of(const OptionalArray& a) {
  if (!a) return {nullptr, 0};
  return {static_cast<char*>(const_cast<void*>(a->data_handle())) + a->byte_offset(), a->nbytes()};
}

// The bytes of a NumPy array of Bits seen as `dtype` of the same width, zero-copy. The view
// keeps the array alive (it is the array itself: no converted copy is made, which the view
// would outlive); whether it may be written is the package's check, on the array itself.
template <typename Bits>
nb::ndarray<nb::array_api> bits_view(nb::handle array, nb::dlpack::dtype dtype) {
  const auto bits = nb::cast<nb::ndarray<nb::numpy, Bits, nb::ro>>(array, /*convert=*/false);
  std::vector<std::size_t> shape(bits.ndim());
  std::vector<std::int64_t> strides(bits.ndim());
  for (std::size_t i = 0; i < bits.ndim(); ++i) {
    shape[i] = bits.shape(i);
    strides[i] = bits.stride(i);
  }
  return nb::ndarray<nb::array_api>(const_cast<Bits*>(bits.data()), bits.ndim(), shape.data(),
                                    array, strides.data(), dtype, nb::device::cpu::value);
}

// --------------------------------------------------------------------- bindings ----

void bind_enums(nb::module_& m) {
  nb::enum_<embrope::RopeLayout>(m, "RopeLayout")
      .value("neox", embrope::RopeLayout::neox)
      .value("interleaved", embrope::RopeLayout::interleaved);
  nb::enum_<embrope::KvCacheLayout>(m, "KvCacheLayout")
      .value("nhd", embrope::KvCacheLayout::nhd)
      .value("hnd", embrope::KvCacheLayout::hnd);
  nb::enum_<embrope::RopeScaling>(m, "RopeScaling")
      .value("none", embrope::RopeScaling::none)
      .value("linear", embrope::RopeScaling::linear)
      .value("dynamic", embrope::RopeScaling::dynamic)
      .value("yarn", embrope::RopeScaling::yarn)
      .value("llama3", embrope::RopeScaling::llama3)
      .value("longrope", embrope::RopeScaling::longrope);
  nb::enum_<embrope::PositionEncoding>(m, "PositionEncoding")
      .value("none", embrope::PositionEncoding::none)
      .value("learned", embrope::PositionEncoding::learned)
      .value("sinusoidal", embrope::PositionEncoding::sinusoidal);
  nb::enum_<embrope::Normalization>(m, "Normalization")
      .value("none", embrope::Normalization::none)
      .value("layer_norm", embrope::Normalization::layer_norm)
      .value("rms_norm", embrope::Normalization::rms_norm);
  nb::enum_<embrope::SinusoidLayout>(m, "SinusoidLayout")
      .value("interleaved", embrope::SinusoidLayout::interleaved)
      .value("split", embrope::SinusoidLayout::split);
  nb::enum_<embrope::QuantFormat>(m, "QuantFormat")
      .value("int8", embrope::QuantFormat::int8)
      .value("int4", embrope::QuantFormat::int4)
      .value("float8_e4m3fn", embrope::QuantFormat::float8_e4m3fn)
      .value("float8_e5m2", embrope::QuantFormat::float8_e5m2)
      .value("gguf_q8_0", embrope::QuantFormat::gguf_q8_0)
      .value("gguf_q4_0", embrope::QuantFormat::gguf_q4_0)
      .value("gguf_q4_k", embrope::QuantFormat::gguf_q4_k)
      .value("gguf_q6_k", embrope::QuantFormat::gguf_q6_k);
  nb::enum_<embrope::BackwardMode>(m, "BackwardMode")
      .value("deterministic", embrope::BackwardMode::deterministic)
      .value("atomic", embrope::BackwardMode::atomic);
  nb::enum_<embrope::PositionKind>(m, "PositionKind")
      .value("rope", embrope::PositionKind::rope)
      .value("learned", embrope::PositionKind::learned)
      .value("sinusoidal", embrope::PositionKind::sinusoidal);
}

void bind_rope_config(nb::module_& m) {
  using embrope::RopeConfig;
  nb::class_<RopeConfig> config(m, "RopeConfig");
  config.def(nb::init<>())
      .def("__copy__", [](const RopeConfig& c) { return c; })
      .def_rw("scaling", &RopeConfig::scaling);
  // Every other field, from the one list of them (embrope/rope_cache.hpp); `fields` names
  // them for the Python layer's keyword arguments.
  std::vector<std::string> fields;
#define EMBROPE_BIND_FIELD(field)            \
  config.def_rw(#field, &RopeConfig::field); \
  fields.emplace_back(#field);
  EMBROPE_ROPE_CONFIG_VALUES(EMBROPE_BIND_FIELD)
  EMBROPE_ROPE_CONFIG_FACTORS(EMBROPE_BIND_FIELD)
#undef EMBROPE_BIND_FIELD
  config.attr("fields") = nb::tuple(nb::cast(fields));

  m.def("rope_frequencies", [](const RopeConfig& config) {
    embrope::RopeFrequencies f = embrope::rope_frequencies(config);
    return std::make_pair(numpy_copy(f.inv_freq), f.attention_factor);
  });
}

void bind_rope_cache(nb::module_& m) {
  using embrope::RopeCache;
  nb::class_<RopeCache>(m, "RopeCache")
      .def("__init__",
           [](RopeCache* self, const embrope::RopeConfig& config, int kind, int index,
              std::uintptr_t stream) {
             const embrope::Device device = device_of(kind, index);
             nb::gil_scoped_release nogil;
             new (self) RopeCache(config, device, stream_of(stream));
           })
      .def_static("axial",
                  [](const std::vector<embrope::RopeConfig>& axes, int kind, int index,
                     std::uintptr_t stream) {
                    const embrope::Device device = device_of(kind, index);
                    nb::gil_scoped_release nogil;
                    return RopeCache::axial(axes, device, stream_of(stream));
                  })
      // Copies: a reference would let Python change the live cache's sizes under its table.
      .def_prop_ro("config", [](const RopeCache& c) { return embrope::RopeConfig(c.config()); })
      .def_prop_ro("axes",
                   [](const RopeCache& c) { return std::vector<embrope::RopeConfig>(c.axes()); })
      .def_prop_ro("axes_dim", &RopeCache::axes_dim)
      .def_prop_ro("device", [](const RopeCache& c) { return device_pair(c.device()); })
      .def_prop_ro("attention_factor", &RopeCache::attention_factor)
      .def_prop_ro("inv_freq", [](const RopeCache& c) { return numpy_copy(c.inv_freqs()); })
      // The [max_positions, rotary_dim] float32 table on the cache's device, zero-copy; it
      // keeps the cache alive.
      .def("table", [](nb::handle self) {
        const auto& c = nb::cast<const RopeCache&>(self);
        const std::size_t shape[2] = {static_cast<std::size_t>(c.max_positions()),
                                      static_cast<std::size_t>(c.rotary_dim())};
        const bool cpu = c.device().kind == embrope::DeviceKind::cpu;
        return nb::ndarray<nb::array_api, float>(
            const_cast<float*>(c.data()), 2, shape, self, nullptr, nb::dtype<float>(),
            cpu ? nb::device::cpu::value : nb::device::cuda::value, c.device().index);
      });
}

void bind_deferred_status(nb::module_& m) {
  using embrope::DeferredStatus;
  nb::class_<DeferredStatus>(m, "DeferredStatus")
      .def("__init__", [](DeferredStatus* self, int kind,
                          int index) { new (self) DeferredStatus(device_of(kind, index)); })
      .def_prop_ro("device", [](const DeferredStatus& s) { return device_pair(s.device()); })
      .def(
          "check",
          [](DeferredStatus& s, std::uintptr_t stream) {
            nb::gil_scoped_release nogil;
            s.check(stream_of(stream));
          },
          "stream"_a = 0)
      .def(
          "ok",
          [](DeferredStatus& s, std::uintptr_t stream) {
            nb::gil_scoped_release nogil;
            return s.ok(stream_of(stream));
          },
          "stream"_a = 0);
}

void bind_model_config(nb::module_& m) {
  using embrope::ModelConfig;
  nb::class_<ModelConfig>(m, "ModelConfig")
      .def_ro("model_type", &ModelConfig::model_type)
      .def_ro("positions", &ModelConfig::positions)
      .def_ro("vocab_size", &ModelConfig::vocab_size)
      .def_ro("hidden_size", &ModelConfig::hidden_size)
      .def_ro("num_heads", &ModelConfig::num_heads)
      .def_ro("num_kv_heads", &ModelConfig::num_kv_heads)
      .def_ro("head_dim", &ModelConfig::head_dim)
      .def_ro("embedding_scale", &ModelConfig::embedding_scale)
      .def_ro("rope", &ModelConfig::rope)
      .def_ro("layout", &ModelConfig::layout)
      .def_ro("mrope_section", &ModelConfig::mrope_section)
      .def_ro("mrope_interleaved", &ModelConfig::mrope_interleaved)
      .def_ro("max_positions", &ModelConfig::max_positions)
      .def_ro("type_vocab_size", &ModelConfig::type_vocab_size);
  m.def("model_presets", &embrope::model_presets);
  m.def("model_preset", [](const std::string& name) { return embrope::model_preset(name); });
  m.def(
      "model_config_from_hf_json",
      [](const std::string& text, const std::string& layer_type) {
        return embrope::model_config_from_hf_json(text, layer_type);
      },
      "text"_a, "layer_type"_a = "");
  m.def(
      "model_config_from_hf_file",
      [](const std::string& path, const std::string& layer_type) {
        return embrope::model_config_from_hf_file(path, layer_type);
      },
      "path"_a, "layer_type"_a = "");
}

// ---------------------------------------------------------------------- options ----
// The settings of each options struct (everything in it but tensors, the status and the
// stream) are bound as a class of their own, listed here once; the package builds them by
// keyword (python/embrope/_native.py). The tensors an op reads or writes are keyword
// arguments of its function below, viewed under the op's and the argument's own names so
// that the library's messages name them.

void bind_options(nb::module_& m) {
  using embrope::EmbedBackwardOptions;
  using embrope::EmbedOptions;
  using embrope::QkNorm;
  using embrope::RopeOptions;
  nb::class_<RopeOptions>(m, "RopeOptions")
      .def(nb::init<>())
      .def_rw("layout", &RopeOptions::layout)
      .def_rw("inverse", &RopeOptions::inverse)
      .def_rw("rotary_dim", &RopeOptions::rotary_dim)
      .def_rw("mrope_section", &RopeOptions::mrope_section)
      .def_rw("mrope_interleaved", &RopeOptions::mrope_interleaved)
      .def_rw("axes_dim", &RopeOptions::axes_dim)
      .def_rw("q_out_scale", &RopeOptions::q_out_scale)
      .def_rw("k_out_scale", &RopeOptions::k_out_scale);
  nb::class_<QkNorm>(m, "QkNorm")
      .def(nb::init<>())
      .def_rw("eps", &QkNorm::eps)
      .def_rw("unit_offset", &QkNorm::unit_offset);
  nb::class_<EmbedOptions>(m, "EmbedOptions")
      .def(nb::init<>())
      .def_rw("scale", &EmbedOptions::scale)
      .def_rw("vocab_start", &EmbedOptions::vocab_start)
      .def_rw("vocab_shard", &EmbedOptions::vocab_shard)
      .def_rw("positions", &EmbedOptions::positions)
      .def_rw("sinusoid_base", &EmbedOptions::sinusoid_base)
      .def_rw("sinusoid_layout", &EmbedOptions::sinusoid_layout)
      .def_rw("norm", &EmbedOptions::norm)
      .def_rw("norm_eps", &EmbedOptions::norm_eps)
      .def_rw("norm_unit_offset", &EmbedOptions::norm_unit_offset);
  nb::class_<EmbedBackwardOptions>(m, "EmbedBackwardOptions")
      .def(nb::init<>())
      .def_rw("scale", &EmbedBackwardOptions::scale)
      .def_rw("vocab_start", &EmbedBackwardOptions::vocab_start)
      .def_rw("vocab_shard", &EmbedBackwardOptions::vocab_shard)
      .def_rw("padding_idx", &EmbedBackwardOptions::padding_idx)
      .def_rw("mode", &EmbedBackwardOptions::mode)
      .def_rw("norm", &EmbedBackwardOptions::norm)
      .def_rw("norm_eps", &EmbedBackwardOptions::norm_eps)
      .def_rw("norm_unit_offset", &EmbedBackwardOptions::norm_unit_offset);
}

// ------------------------------------------------------------------- RoPE family ----

// The cos/sin table of a RoPE-family call: a RopeCache, cos and sin [max_positions, R/2], or
// a cos_sin_cache [max_positions, R] (cos half, then sin half: vLLM's and FlashInfer's layout),
// split here into its two halves' views (in Python, two slices cost 2-5 us of a one-token call).
struct RopeTable {
  const embrope::RopeCache* cache = nullptr;
  std::optional<Tensor> cos, sin;

  // run(cache) or run(cos, sin), without the GIL: the op's overload for this table.
  template <class Run>
  void call(Run&& run) const {
    nb::gil_scoped_release nogil;
    if (cache != nullptr) {
      run(*cache);
    } else {
      run(*cos, *sin);
    }
  }
};

RopeTable rope_table(const char* op, const embrope::RopeCache* cache, const OptionalArray& cos,
                     const OptionalArray& sin, const OptionalArray& cos_sin_cache) {
  const int tables =
      (cache != nullptr) + (cos.has_value() || sin.has_value()) + cos_sin_cache.has_value();
  if (tables != 1 || cos.has_value() != sin.has_value()) {
    throw embrope::Error(embrope::ErrorCode::invalid_argument,
                         std::string(op) +
                             ": give the cos/sin table as cache, as cos and sin, or as "
                             "cos_sin_cache");
  }
  if (!cos_sin_cache) return {cache, view(cos, op, "cos"), view(sin, op, "sin")};
  const Tensor table = view(*cos_sin_cache, op, "cos_sin_cache");
  // Its own rules, checked here so that the errors name it rather than one of its halves.
  const auto refuse = [op](const std::string& rule) {
    throw embrope::Error(embrope::ErrorCode::invalid_argument,
                         std::string(op) + ": cos_sin_cache " + rule);
  };
  if (table.ndim() != 2 || table.shape(1) % 2 != 0) {
    std::string shape;
    for (int i = 0; i < table.ndim(); ++i) {
      shape += (i ? ", " : "") + std::to_string(table.shape(i));
    }
    refuse("has shape [" + shape +
           "]; it must be [max_positions, rotary_dim] with rotary_dim even (the cos half, then "
           "the sin half)");
  }
  const embrope::DType dtype = table.dtype();
  if (dtype != embrope::DType::float32 && dtype != embrope::DType::float16 &&
      dtype != embrope::DType::bfloat16) {
    refuse(std::string("has dtype ") + embrope::dtype_name(dtype) +
           "; it must be float32, float16 or bfloat16");
  }
  const std::int64_t half = table.shape(1) / 2;
  const std::int64_t shape[2] = {table.shape(0), half};
  const bool empty = table.shape(0) == 0 || half == 0;
  if (!empty && table.stride(1) != 1) {
    refuse("has stride " + std::to_string(table.stride(1)) +
           " in its last dimension, which must be 1");
  }
  // The sin half starts half a row in (an address formed on the host, valid on any device;
  // none for a table without elements, whose data may be null). A width no real table comes
  // near is refused before the address is formed, so that the arithmetic cannot overflow.
  if (half > (std::int64_t{1} << 56)) refuse("is wider than 2^57 columns");
  char* const data = static_cast<char*>(table.data());
  char* const sin_data = empty ? data : data + half * embrope::dtype_size(dtype);
  return {nullptr, Tensor(data, dtype, 2, shape, table.strides(), table.device()),
          Tensor(sin_data, dtype, 2, shape, table.strides(), table.device())};
}

// A call's RopeOptions: its settings, with its outputs, status and stream.
embrope::RopeOptions rope_options(const char* op, embrope::RopeOptions options,
                                  const OptionalArray& q_out, const OptionalArray& k_out,
                                  embrope::DeferredStatus* deferred, std::uintptr_t stream,
                                  const OptionalArray& q_out_head_scales,
                                  const OptionalArray& k_out_head_scales) {
  options.q_out = view(q_out, op, "q_out");
  options.k_out = view(k_out, op, "k_out");
  options.q_out_head_scales = view(q_out_head_scales, op, "q_out_head_scales");
  options.k_out_head_scales = view(k_out_head_scales, op, "k_out_head_scales");
  options.deferred = deferred;
  options.stream = stream_of(stream);
  return options;
}

// The keyword arguments every RoPE-family function ends with, in the order of its parameters
// (const RopeCache*, cos, sin, cos_sin_cache, const RopeOptions&, q_out, k_out, DeferredStatus*,
// stream, q_out_head_scales, k_out_head_scales).
auto rope_arguments() {
  return std::make_tuple("cache"_a.none() = nb::none(), "cos"_a.none() = nb::none(),
                         "sin"_a.none() = nb::none(), "cos_sin_cache"_a.none() = nb::none(),
                         "options"_a = embrope::RopeOptions{}, "q_out"_a.none() = nb::none(),
                         "k_out"_a.none() = nb::none(), "deferred"_a.none() = nb::none(),
                         "stream"_a = std::uintptr_t{0}, "q_out_head_scales"_a.none() = nb::none(),
                         "k_out_head_scales"_a.none() = nb::none());
}

// m.def(name, f, leading..., rope_arguments()...).
template <class F, class... Leading>
void def_rope_op(nb::module_& m, const char* name, F&& f, Leading&&... leading) {
  std::apply(
      [&](auto&&... tail) {
        m.def(name, std::forward<F>(f), std::forward<Leading>(leading)..., tail...);
      },
      rope_arguments());
}

// apply_rope and apply_rope_backward: the same arguments, dq and dk for q and k.
template <bool Backward>
void bind_rope_direction(nb::module_& m) {
  static constexpr const char* op = Backward ? "apply_rope_backward" : "apply_rope";
  def_rope_op(
      m, op,
      [](const Array& q, const OptionalArray& k, const Array& positions,
         const OptionalArray& q_nope, const OptionalArray& q_nope_out, const OptionalArray& k_nope,
         const OptionalArray& k_nope_out, const embrope::RopeCache* cache, const OptionalArray& cos,
         const OptionalArray& sin, const OptionalArray& cos_sin_cache,
         const embrope::RopeOptions& settings, const OptionalArray& q_out,
         const OptionalArray& k_out, embrope::DeferredStatus* deferred, std::uintptr_t stream,
         const OptionalArray& q_out_head_scales, const OptionalArray& k_out_head_scales) {
        const Tensor q_view = view(q, op, Backward ? "dq" : "q");
        const std::optional<Tensor> k_view = view(k, op, Backward ? "dk" : "k");
        const Tensor positions_view = view(positions, op, "positions");
        embrope::RopeOptions options = rope_options(op, settings, q_out, k_out, deferred, stream,
                                                    q_out_head_scales, k_out_head_scales);
        // Float8 outputs' non-rotary parts (apply_rope's; the backward refuses them).
        options.q_nope = view(q_nope, op, "q_nope");
        options.q_nope_out = view(q_nope_out, op, "q_nope_out");
        options.k_nope = view(k_nope, op, "k_nope");
        options.k_nope_out = view(k_nope_out, op, "k_nope_out");
        rope_table(op, cache, cos, sin, cos_sin_cache).call([&](const auto&... table) {
          if constexpr (Backward) {
            embrope::apply_rope_backward(q_view, k_view, positions_view, table..., options);
          } else {
            embrope::apply_rope(q_view, k_view, positions_view, table..., options);
          }
        });
      },
      Backward ? "dq"_a : "q"_a, (Backward ? "dk"_a : "k"_a).none(), "positions"_a, nb::kw_only(),
      "q_nope"_a.none() = nb::none(), "q_nope_out"_a.none() = nb::none(),
      "k_nope"_a.none() = nb::none(), "k_nope_out"_a.none() = nb::none());
}

void bind_apply_rope(nb::module_& m) {
  bind_rope_direction<false>(m);
  bind_rope_direction<true>(m);
}

embrope::QkNorm qk_norm(const char* op, embrope::QkNorm norm, const OptionalArray& q_weight,
                        const OptionalArray& k_weight) {
  norm.q_weight = view(q_weight, op, "q_weight");
  norm.k_weight = view(k_weight, op, "k_weight");
  return norm;
}

void bind_apply_qk_norm_rope(nb::module_& m) {
  def_rope_op(
      m, "apply_qk_norm_rope",
      [](const Array& q, const OptionalArray& k, const Array& positions,
         const embrope::QkNorm& norm_settings, const OptionalArray& q_weight,
         const OptionalArray& k_weight, const embrope::RopeCache* cache, const OptionalArray& cos,
         const OptionalArray& sin, const OptionalArray& cos_sin_cache,
         const embrope::RopeOptions& settings, const OptionalArray& q_out,
         const OptionalArray& k_out, embrope::DeferredStatus* deferred, std::uintptr_t stream,
         const OptionalArray& q_out_head_scales, const OptionalArray& k_out_head_scales) {
        const char* op = "apply_qk_norm_rope";
        const Tensor q_view = view(q, op, "q");
        const std::optional<Tensor> k_view = view(k, op, "k");
        const Tensor positions_view = view(positions, op, "positions");
        const embrope::QkNorm norm = qk_norm(op, norm_settings, q_weight, k_weight);
        const embrope::RopeOptions options = rope_options(
            op, settings, q_out, k_out, deferred, stream, q_out_head_scales, k_out_head_scales);
        rope_table(op, cache, cos, sin, cos_sin_cache).call([&](const auto&... table) {
          embrope::apply_qk_norm_rope(q_view, k_view, positions_view, table..., norm, options);
        });
      },
      "q"_a, "k"_a.none(), "positions"_a, nb::kw_only(), "norm"_a = embrope::QkNorm{},
      "q_weight"_a.none() = nb::none(), "k_weight"_a.none() = nb::none());

  // The gradient: dq and dk of the outputs, q and k the forward's inputs; the weights'
  // gradients go to q_weight_grad / k_weight_grad.
  def_rope_op(
      m, "apply_qk_norm_rope_backward",
      [](const Array& dq, const OptionalArray& dk, const Array& q, const OptionalArray& k,
         const Array& positions, const embrope::QkNorm& norm_settings,
         const OptionalArray& q_weight, const OptionalArray& k_weight,
         const OptionalArray& q_weight_grad, const OptionalArray& k_weight_grad,
         const embrope::RopeCache* cache, const OptionalArray& cos, const OptionalArray& sin,
         const OptionalArray& cos_sin_cache, const embrope::RopeOptions& settings,
         const OptionalArray& q_out, const OptionalArray& k_out, embrope::DeferredStatus* deferred,
         std::uintptr_t stream, const OptionalArray& q_out_head_scales,
         const OptionalArray& k_out_head_scales) {
        const char* op = "apply_qk_norm_rope_backward";
        const Tensor dq_view = view(dq, op, "dq");
        const std::optional<Tensor> dk_view = view(dk, op, "dk");
        const Tensor q_view = view(q, op, "q");
        const std::optional<Tensor> k_view = view(k, op, "k");
        const Tensor positions_view = view(positions, op, "positions");
        const embrope::QkNorm norm = qk_norm(op, norm_settings, q_weight, k_weight);
        embrope::QkNormGradients grads;
        grads.q_weight = view(q_weight_grad, op, "q_weight_grad");
        grads.k_weight = view(k_weight_grad, op, "k_weight_grad");
        const embrope::RopeOptions options = rope_options(
            op, settings, q_out, k_out, deferred, stream, q_out_head_scales, k_out_head_scales);
        rope_table(op, cache, cos, sin, cos_sin_cache).call([&](const auto&... table) {
          embrope::apply_qk_norm_rope_backward(dq_view, dk_view, q_view, k_view, positions_view,
                                               table..., norm, grads, options);
        });
      },
      "dq"_a, "dk"_a.none(), "q"_a, "k"_a.none(), "positions"_a, nb::kw_only(),
      "norm"_a = embrope::QkNorm{}, "q_weight"_a.none() = nb::none(),
      "k_weight"_a.none() = nb::none(), "q_weight_grad"_a.none() = nb::none(),
      "k_weight_grad"_a.none() = nb::none());
}

// The cache a RoPE + append call writes: k_cache and v_cache, or kv_cache [pages, 2, ...].
embrope::KvCache kv_cache_of(const char* op, const OptionalArray& k_cache,
                             const OptionalArray& v_cache, const OptionalArray& kv_cache,
                             embrope::KvCacheLayout kv_layout, float k_scale, float v_scale) {
  embrope::KvCache kv;
  if (kv_cache) {
    kv = embrope::KvCache::combined(view(*kv_cache, op, "kv_cache"), kv_layout, k_scale, v_scale);
  } else if (k_cache && v_cache) {
    kv.k = view(*k_cache, op, "k_cache");
    kv.v = view(*v_cache, op, "v_cache");
    kv.layout = kv_layout;
    kv.k_scale = k_scale;
    kv.v_scale = v_scale;
  } else {
    throw embrope::Error(embrope::ErrorCode::invalid_argument,
                         std::string(op) + ": give k_cache and v_cache, or kv_cache");
  }
  return kv;
}

// Where each token goes: slot_mapping, or cache_offsets (with cu_seqlens for packed inputs).
embrope::KvSlots kv_slots_of(const char* op, const OptionalArray& slot_mapping,
                             const OptionalArray& cache_offsets, const OptionalArray& cu_seqlens) {
  embrope::KvSlots slots;
  slots.slot_mapping = view(slot_mapping, op, "slot_mapping");
  slots.cache_offsets = view(cache_offsets, op, "cache_offsets");
  slots.cu_seqlens = view(cu_seqlens, op, "cu_seqlens");
  return slots;
}

// apply_rope_append_kv and apply_qk_norm_rope_append_kv (Norm: the norm's three arguments
// after the slots).
template <bool Norm>
void bind_append_kv_op(nb::module_& m) {
  static constexpr const char* op = Norm ? "apply_qk_norm_rope_append_kv" : "apply_rope_append_kv";
  auto body = [](const Array& q, const Array& k, const Array& v, const Array& positions,
                 const embrope::KvCache& kv, const embrope::KvSlots& slots,
                 const OptionalArray& q_nope, const OptionalArray& q_nope_out,
                 const embrope::QkNorm* norm, const embrope::RopeCache* cache,
                 const OptionalArray& cos, const OptionalArray& sin,
                 const OptionalArray& cos_sin_cache, const embrope::RopeOptions& settings,
                 const OptionalArray& q_out, const OptionalArray& k_out,
                 embrope::DeferredStatus* deferred, std::uintptr_t stream,
                 const OptionalArray& q_out_head_scales, const OptionalArray& k_out_head_scales) {
    const Tensor q_view = view(q, op, "q"), k_view = view(k, op, "k"), v_view = view(v, op, "v");
    const Tensor positions_view = view(positions, op, "positions");
    embrope::RopeOptions options = rope_options(op, settings, q_out, k_out, deferred, stream,
                                                q_out_head_scales, k_out_head_scales);
    options.q_nope = view(q_nope, op, "q_nope");  // with a float8 q_out
    options.q_nope_out = view(q_nope_out, op, "q_nope_out");
    rope_table(op, cache, cos, sin, cos_sin_cache).call([&](const auto&... table) {
      if (norm != nullptr) {
        embrope::apply_qk_norm_rope_append_kv(q_view, k_view, v_view, positions_view, table..., kv,
                                              slots, *norm, options);
      } else {
        embrope::apply_rope_append_kv(q_view, k_view, v_view, positions_view, table..., kv, slots,
                                      options);
      }
    });
  };
  auto cache_arguments =
      std::make_tuple("q"_a, "k"_a, "v"_a, "positions"_a, nb::kw_only(),
                      "k_cache"_a.none() = nb::none(), "v_cache"_a.none() = nb::none(),
                      "kv_cache"_a.none() = nb::none(), "kv_layout"_a = embrope::KvCacheLayout::nhd,
                      "k_scale"_a = 1.0f, "v_scale"_a = 1.0f, "slot_mapping"_a.none() = nb::none(),
                      "cache_offsets"_a.none() = nb::none(), "cu_seqlens"_a.none() = nb::none(),
                      "q_nope"_a.none() = nb::none(), "q_nope_out"_a.none() = nb::none());
  auto define = [&](auto&& f, auto&&... norm_arguments) {
    std::apply([&](auto&&... leading) { def_rope_op(m, op, f, leading..., norm_arguments...); },
               cache_arguments);
  };
  if constexpr (Norm) {
    define(
        [body](const Array& q, const Array& k, const Array& v, const Array& positions,
               const OptionalArray& k_cache, const OptionalArray& v_cache,
               const OptionalArray& kv_cache, embrope::KvCacheLayout kv_layout, float k_scale,
               float v_scale, const OptionalArray& slot_mapping, const OptionalArray& cache_offsets,
               const OptionalArray& cu_seqlens, const OptionalArray& q_nope,
               const OptionalArray& q_nope_out, const embrope::QkNorm& norm_settings,
               const OptionalArray& q_weight, const OptionalArray& k_weight,
               const embrope::RopeCache* cache, const OptionalArray& cos, const OptionalArray& sin,
               const OptionalArray& cos_sin_cache, const embrope::RopeOptions& settings,
               const OptionalArray& q_out, const OptionalArray& k_out,
               embrope::DeferredStatus* deferred, std::uintptr_t stream,
               const OptionalArray& q_out_head_scales, const OptionalArray& k_out_head_scales) {
          const embrope::QkNorm norm = qk_norm(op, norm_settings, q_weight, k_weight);
          body(q, k, v, positions,
               kv_cache_of(op, k_cache, v_cache, kv_cache, kv_layout, k_scale, v_scale),
               kv_slots_of(op, slot_mapping, cache_offsets, cu_seqlens), q_nope, q_nope_out, &norm,
               cache, cos, sin, cos_sin_cache, settings, q_out, k_out, deferred, stream,
               q_out_head_scales, k_out_head_scales);
        },
        "norm"_a = embrope::QkNorm{}, "q_weight"_a.none() = nb::none(),
        "k_weight"_a.none() = nb::none());
  } else {
    define([body](const Array& q, const Array& k, const Array& v, const Array& positions,
                  const OptionalArray& k_cache, const OptionalArray& v_cache,
                  const OptionalArray& kv_cache, embrope::KvCacheLayout kv_layout, float k_scale,
                  float v_scale, const OptionalArray& slot_mapping,
                  const OptionalArray& cache_offsets, const OptionalArray& cu_seqlens,
                  const OptionalArray& q_nope, const OptionalArray& q_nope_out,
                  const embrope::RopeCache* cache, const OptionalArray& cos,
                  const OptionalArray& sin, const OptionalArray& cos_sin_cache,
                  const embrope::RopeOptions& settings, const OptionalArray& q_out,
                  const OptionalArray& k_out, embrope::DeferredStatus* deferred,
                  std::uintptr_t stream, const OptionalArray& q_out_head_scales,
                  const OptionalArray& k_out_head_scales) {
      body(q, k, v, positions,
           kv_cache_of(op, k_cache, v_cache, kv_cache, kv_layout, k_scale, v_scale),
           kv_slots_of(op, slot_mapping, cache_offsets, cu_seqlens), q_nope, q_nope_out, nullptr,
           cache, cos, sin, cos_sin_cache, settings, q_out, k_out, deferred, stream,
           q_out_head_scales, k_out_head_scales);
    });
  }
}

// --------------------------------------------------------------------- embed family ----

// embed's options with the optional arrays of a call (every embed binding takes them).
embrope::EmbedOptions embed_options(
    const char* op, const embrope::EmbedOptions& settings, const OptionalArray& position_table,
    const OptionalArray& position_ids, const OptionalArray& position_offsets,
    const OptionalArray& type_table, const OptionalArray& type_ids,
    const OptionalArray& norm_weight, const OptionalArray& norm_bias,
    const OptionalArray& pre_norm_out, embrope::DeferredStatus* deferred, std::uintptr_t stream) {
  embrope::EmbedOptions o = settings;
  o.position_table = view(position_table, op, "position_table");
  o.position_ids = view(position_ids, op, "position_ids");
  o.position_offsets = view(position_offsets, op, "position_offsets");
  o.type_table = view(type_table, op, "type_table");
  o.type_ids = view(type_ids, op, "type_ids");
  o.norm_weight = view(norm_weight, op, "norm_weight");
  o.norm_bias = view(norm_bias, op, "norm_bias");
  o.pre_norm_out = view(pre_norm_out, op, "pre_norm_out");
  o.deferred = deferred;
  o.stream = stream_of(stream);
  return o;
}

// The keyword arguments of embed_options, after a binding's own.
auto embed_option_arguments() {
  return std::make_tuple(
      nb::kw_only(), "options"_a = embrope::EmbedOptions{}, "position_table"_a.none() = nb::none(),
      "position_ids"_a.none() = nb::none(), "position_offsets"_a.none() = nb::none(),
      "type_table"_a.none() = nb::none(), "type_ids"_a.none() = nb::none(),
      "norm_weight"_a.none() = nb::none(), "norm_bias"_a.none() = nb::none(),
      "pre_norm_out"_a.none() = nb::none(), "deferred"_a.none() = nb::none(),
      "stream"_a = std::uintptr_t{0});
}

template <typename... Options>
void bind_embed_ops(nb::module_& m, const Options&... options) {
  m.def(
      "embed",
      [](const Array& table, const Array& ids, const Array& out,
         const embrope::EmbedOptions& settings, const OptionalArray& position_table,
         const OptionalArray& position_ids, const OptionalArray& position_offsets,
         const OptionalArray& type_table, const OptionalArray& type_ids,
         const OptionalArray& norm_weight, const OptionalArray& norm_bias,
         const OptionalArray& pre_norm_out, embrope::DeferredStatus* deferred,
         std::uintptr_t stream) {
        const char* op = "embed";
        const Tensor table_view = view(table, op, "table");
        const Tensor ids_view = view(ids, op, "ids");
        const Tensor out_view = view(out, op, "out");
        const embrope::EmbedOptions o =
            embed_options(op, settings, position_table, position_ids, position_offsets, type_table,
                          type_ids, norm_weight, norm_bias, pre_norm_out, deferred, stream);
        nb::gil_scoped_release nogil;
        embrope::embed(table_view, ids_view, out_view, o);
      },
      "table"_a, "ids"_a, "out"_a, options...);
  // embed from a quantized table: its format, D and arrays (QuantizedTable), then embed's.
  m.def(
      "embed_quantized",
      [](embrope::QuantFormat format, const Array& data, std::int64_t dim,
         const OptionalArray& scales, const OptionalArray& zero_points, const Array& ids,
         const Array& out, const embrope::EmbedOptions& settings,
         const OptionalArray& position_table, const OptionalArray& position_ids,
         const OptionalArray& position_offsets, const OptionalArray& type_table,
         const OptionalArray& type_ids, const OptionalArray& norm_weight,
         const OptionalArray& norm_bias, const OptionalArray& pre_norm_out,
         embrope::DeferredStatus* deferred, std::uintptr_t stream) {
        const char* op = "embed";
        embrope::QuantizedTable table;
        table.format = format;
        table.data = view(data, op, "table.data");
        table.dim = dim;
        table.scales = view(scales, op, "table.scales");
        table.zero_points = view(zero_points, op, "table.zero_points");
        const Tensor ids_view = view(ids, op, "ids");
        const Tensor out_view = view(out, op, "out");
        const embrope::EmbedOptions o =
            embed_options(op, settings, position_table, position_ids, position_offsets, type_table,
                          type_ids, norm_weight, norm_bias, pre_norm_out, deferred, stream);
        nb::gil_scoped_release nogil;
        embrope::embed(table, ids_view, out_view, o);
      },
      "format"_a, "data"_a, "dim"_a, "scales"_a.none(), "zero_points"_a.none(), "ids"_a, "out"_a,
      options...);
}

void bind_embed(nb::module_& m) {
  std::apply([&](auto&&... options) { bind_embed_ops(m, options...); }, embed_option_arguments());
}

// embed_backward and its workspace query: the same arguments, the query without the
// workspace, status and stream (it reads no data).
struct EmbedBackwardCall {
  Tensor grad_out, ids;
  std::optional<Tensor> grad_table;
  embrope::EmbedBackwardOptions options;
};

EmbedBackwardCall embed_backward_call(
    const Array& grad_out, const Array& ids, const OptionalArray& grad_table,
    const embrope::EmbedBackwardOptions& settings, const OptionalArray& grad_position_table,
    const OptionalArray& position_ids, const OptionalArray& position_offsets,
    const OptionalArray& grad_type_table, const OptionalArray& type_ids,
    const OptionalArray& pre_norm, const OptionalArray& norm_weight,
    const OptionalArray& grad_pre_norm, const OptionalArray& grad_norm_weight,
    const OptionalArray& grad_norm_bias) {
  const char* op = "embed_backward";
  EmbedBackwardCall c{view(grad_out, op, "grad_out"), view(ids, op, "ids"),
                      view(grad_table, op, "grad_table"), settings};
  embrope::EmbedBackwardOptions& o = c.options;
  o.grad_position_table = view(grad_position_table, op, "grad_position_table");
  o.position_ids = view(position_ids, op, "position_ids");
  o.position_offsets = view(position_offsets, op, "position_offsets");
  o.grad_type_table = view(grad_type_table, op, "grad_type_table");
  o.type_ids = view(type_ids, op, "type_ids");
  o.pre_norm = view(pre_norm, op, "pre_norm");
  o.norm_weight = view(norm_weight, op, "norm_weight");
  o.grad_pre_norm = view(grad_pre_norm, op, "grad_pre_norm");
  o.grad_norm_weight = view(grad_norm_weight, op, "grad_norm_weight");
  o.grad_norm_bias = view(grad_norm_bias, op, "grad_norm_bias");
  return c;
}

auto embed_backward_arguments() {
  return std::make_tuple(
      "grad_out"_a, "ids"_a, "grad_table"_a.none() = nb::none(), nb::kw_only(),
      "options"_a = embrope::EmbedBackwardOptions{}, "grad_position_table"_a.none() = nb::none(),
      "position_ids"_a.none() = nb::none(), "position_offsets"_a.none() = nb::none(),
      "grad_type_table"_a.none() = nb::none(), "type_ids"_a.none() = nb::none(),
      "pre_norm"_a.none() = nb::none(), "norm_weight"_a.none() = nb::none(),
      "grad_pre_norm"_a.none() = nb::none(), "grad_norm_weight"_a.none() = nb::none(),
      "grad_norm_bias"_a.none() = nb::none());
}

void bind_embed_backward(nb::module_& m) {
  std::apply(
      [&](auto&&... arguments) {
        m.def(
            "embed_backward",
            [](const Array& grad_out, const Array& ids, const OptionalArray& grad_table,
               const embrope::EmbedBackwardOptions& settings,
               const OptionalArray& grad_position_table, const OptionalArray& position_ids,
               const OptionalArray& position_offsets, const OptionalArray& grad_type_table,
               const OptionalArray& type_ids, const OptionalArray& pre_norm,
               const OptionalArray& norm_weight, const OptionalArray& grad_pre_norm,
               const OptionalArray& grad_norm_weight, const OptionalArray& grad_norm_bias,
               const OptionalArray& workspace, embrope::DeferredStatus* deferred,
               std::uintptr_t stream) {
              EmbedBackwardCall c = embed_backward_call(
                  grad_out, ids, grad_table, settings, grad_position_table, position_ids,
                  position_offsets, grad_type_table, type_ids, pre_norm, norm_weight, grad_pre_norm,
                  grad_norm_weight, grad_norm_bias);
              std::tie(c.options.workspace, c.options.workspace_bytes) = workspace_of(workspace);
              c.options.deferred = deferred;
              c.options.stream = stream_of(stream);
              nb::gil_scoped_release nogil;
              embrope::embed_backward(c.grad_out, c.ids, c.grad_table, c.options);
            },
            arguments..., "workspace"_a.none() = nb::none(), "deferred"_a.none() = nb::none(),
            "stream"_a = std::uintptr_t{0});
        m.def(
            "embed_backward_workspace_size",
            [](const Array& grad_out, const Array& ids, const OptionalArray& grad_table,
               const embrope::EmbedBackwardOptions& settings,
               const OptionalArray& grad_position_table, const OptionalArray& position_ids,
               const OptionalArray& position_offsets, const OptionalArray& grad_type_table,
               const OptionalArray& type_ids, const OptionalArray& pre_norm,
               const OptionalArray& norm_weight, const OptionalArray& grad_pre_norm,
               const OptionalArray& grad_norm_weight, const OptionalArray& grad_norm_bias) {
              const EmbedBackwardCall c = embed_backward_call(
                  grad_out, ids, grad_table, settings, grad_position_table, position_ids,
                  position_offsets, grad_type_table, type_ids, pre_norm, norm_weight, grad_pre_norm,
                  grad_norm_weight, grad_norm_bias);
              return embrope::embed_backward_workspace_size(c.grad_out, c.ids, c.grad_table,
                                                            c.options);
            },
            arguments...);
      },
      embed_backward_arguments());
}

// packed_positions and its workspace query.
embrope::PackedPositionsOptions packed_positions_options(const OptionalArray& start_offsets) {
  embrope::PackedPositionsOptions o;
  o.start_offsets = view(start_offsets, "packed_positions", "start_offsets");
  return o;
}

void bind_packed_positions(nb::module_& m) {
  m.def(
      "packed_positions",
      [](const Array& cu_seqlens, const Array& positions, const OptionalArray& start_offsets,
         const OptionalArray& workspace, embrope::DeferredStatus* deferred, std::uintptr_t stream) {
        const Tensor cu_seqlens_view = view(cu_seqlens, "packed_positions", "cu_seqlens");
        const Tensor positions_view = view(positions, "packed_positions", "positions");
        embrope::PackedPositionsOptions o = packed_positions_options(start_offsets);
        std::tie(o.workspace, o.workspace_bytes) = workspace_of(workspace);
        o.deferred = deferred;
        o.stream = stream_of(stream);
        nb::gil_scoped_release nogil;
        embrope::packed_positions(cu_seqlens_view, positions_view, o);
      },
      "cu_seqlens"_a, "positions"_a, nb::kw_only(), "start_offsets"_a.none() = nb::none(),
      "workspace"_a.none() = nb::none(), "deferred"_a.none() = nb::none(),
      "stream"_a = std::uintptr_t{0});
  m.def(
      "packed_positions_workspace_size",
      [](const Array& cu_seqlens, const Array& positions, const OptionalArray& start_offsets) {
        return embrope::packed_positions_workspace_size(
            view(cu_seqlens, "packed_positions", "cu_seqlens"),
            view(positions, "packed_positions", "positions"),
            packed_positions_options(start_offsets));
      },
      "cu_seqlens"_a, "positions"_a, nb::kw_only(), "start_offsets"_a.none() = nb::none());
}

}  // namespace

NB_MODULE(_embrope, m) {
  m.doc() = "embrope's native module; use the `embrope` package.";
  m.attr("__version__") = EMBROPE_VERSION_STRING;
  // Arrays exported to PyTorch keep their RopeCache alive through DLPack deleters that may
  // run after this module is torn down at interpreter exit: not leaks worth a warning.
  nb::set_leak_warnings(false);
  register_errors(m);
  bind_enums(m);
  bind_options(m);
  bind_rope_config(m);
  bind_rope_cache(m);
  bind_deferred_status(m);
  bind_model_config(m);
  bind_apply_rope(m);
  bind_apply_qk_norm_rope(m);
  bind_append_kv_op<false>(m);
  bind_append_kv_op<true>(m);
  bind_embed(m);
  bind_embed_backward(m);
  bind_packed_positions(m);
  // The bytes of a uint16 (uint8) NumPy array (any strides) seen as bfloat16 (float8): NumPy
  // has no such dtype of its own that DLPack can export. For ml_dtypes' arrays (viewed as
  // unsigned integers), and host memory for outputs of frameworks whose arrays are immutable.
  m.def("bfloat16_view", [](nb::handle array) {
    return bits_view<std::uint16_t>(array, {static_cast<std::uint8_t>(kDLBfloat), 16, 1});
  });
  m.def("float8_view", [](nb::handle array, bool e5m2) {
    // DLPack 1.1's kDLFloat8_e5m2 and kDLFloat8_e4m3fn (src/dlpack.cpp reads them).
    return bits_view<std::uint8_t>(array, {static_cast<std::uint8_t>(e5m2 ? 12 : 10), 8, 1});
  });
  // Whether `array` imports as a writable array: false where its DLPack export marks it
  // read-only (a read-only NumPy array behind another object's __dlpack__, say), which the
  // ops' read-only import (Array) does not look at.
  m.def("dlpack_writable", [](nb::handle array) {
    nb::ndarray<> writable;
    return nb::try_cast(array, writable, /*convert=*/false);
  });
  m.def("cpu_isa", [] { return std::string(embrope::cpu_isa()); });
  m.def("cuda_device_count", [] {
    nb::gil_scoped_release nogil;
    return embrope::cuda_device_count();
  });
}
