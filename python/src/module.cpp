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

// The RopeOptions of a RoPE-family call from its Python arguments.
embrope::RopeOptions rope_options(const char* op, embrope::RopeLayout layout, bool inverse,
                                  std::int64_t rotary_dim, std::array<std::int64_t, 4> mrope,
                                  const OptionalArray& q_out, const OptionalArray& k_out,
                                  embrope::DeferredStatus* deferred, std::uintptr_t stream) {
  embrope::RopeOptions options;
  options.layout = layout;
  options.inverse = inverse;
  options.rotary_dim = rotary_dim;
  options.q_out = view(q_out, op, "q_out");
  options.k_out = view(k_out, op, "k_out");
  // mrope: (temporal, height, width, interleaved), as python/embrope/_rope.py forms it.
  options.mrope_section = {mrope[0], mrope[1], mrope[2]};
  options.mrope_interleaved = mrope[3] != 0;
  options.deferred = deferred;
  options.stream = stream_of(stream);
  return options;
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
  nb::class_<RopeConfig>(m, "RopeConfig")
      .def(nb::init<>())
      .def_rw("rotary_dim", &RopeConfig::rotary_dim)
      .def_rw("base", &RopeConfig::base)
      .def_rw("max_positions", &RopeConfig::max_positions)
      .def_rw("scaling", &RopeConfig::scaling)
      .def_rw("factor", &RopeConfig::factor)
      .def_rw("original_max_positions", &RopeConfig::original_max_positions)
      .def_rw("sequence_length", &RopeConfig::sequence_length)
      .def_rw("beta_fast", &RopeConfig::beta_fast)
      .def_rw("beta_slow", &RopeConfig::beta_slow)
      .def_rw("truncate", &RopeConfig::truncate)
      .def_rw("mscale", &RopeConfig::mscale)
      .def_rw("mscale_all_dim", &RopeConfig::mscale_all_dim)
      .def_rw("low_freq_factor", &RopeConfig::low_freq_factor)
      .def_rw("high_freq_factor", &RopeConfig::high_freq_factor)
      .def_rw("short_factor", &RopeConfig::short_factor)
      .def_rw("long_factor", &RopeConfig::long_factor)
      .def_rw("attention_factor", &RopeConfig::attention_factor);

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
      .def_prop_ro("config", &RopeCache::config)
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
  m.def("model_config_from_hf_json",
        [](const std::string& text) { return embrope::model_config_from_hf_json(text); });
  m.def("model_config_from_hf_file", &embrope::model_config_from_hf_file);
}

void bind_apply_rope(nb::module_& m) {
  // backward = false: apply_rope(q, k, ...); true: apply_rope_backward(dq, dk, ...). The table
  // is `cache`, or cos and sin [max_positions, R/2].
  m.def(
      "apply_rope",
      [](const Array& q, const OptionalArray& k, const Array& positions,
         const embrope::RopeCache* cache, const OptionalArray& cos, const OptionalArray& sin,
         const OptionalArray& q_out, const OptionalArray& k_out, embrope::RopeLayout layout,
         bool inverse, std::int64_t rotary_dim, std::array<std::int64_t, 4> mrope,
         embrope::DeferredStatus* deferred, std::uintptr_t stream, bool backward) {
        const char* op = backward ? "apply_rope_backward" : "apply_rope";
        const Tensor q_view = view(q, op, backward ? "dq" : "q");
        const std::optional<Tensor> k_view = view(k, op, backward ? "dk" : "k");
        const Tensor positions_view = view(positions, op, "positions");
        const embrope::RopeOptions options =
            rope_options(op, layout, inverse, rotary_dim, mrope, q_out, k_out, deferred, stream);
        if (cache != nullptr) {
          nb::gil_scoped_release nogil;
          if (backward) {
            embrope::apply_rope_backward(q_view, k_view, positions_view, *cache, options);
          } else {
            embrope::apply_rope(q_view, k_view, positions_view, *cache, options);
          }
        } else {
          const Tensor cos_view = view(cos.value(), op, "cos");
          const Tensor sin_view = view(sin.value(), op, "sin");
          nb::gil_scoped_release nogil;
          if (backward) {
            embrope::apply_rope_backward(q_view, k_view, positions_view, cos_view, sin_view,
                                         options);
          } else {
            embrope::apply_rope(q_view, k_view, positions_view, cos_view, sin_view, options);
          }
        }
      },
      "q"_a, "k"_a.none(), "positions"_a, "cache"_a.none(), "cos"_a.none(), "sin"_a.none(),
      "q_out"_a.none(), "k_out"_a.none(), "layout"_a, "inverse"_a, "rotary_dim"_a, "mrope"_a,
      "deferred"_a.none(), "stream"_a, "backward"_a);
}

void bind_apply_qk_norm_rope(nb::module_& m) {
  // backward = false: apply_qk_norm_rope(q, k, ...); true: apply_qk_norm_rope_backward(dq, dk,
  // saved_q, saved_k, ...) with the weight gradients into grad_q_weight / grad_k_weight.
  m.def(
      "apply_qk_norm_rope",
      [](const Array& q, const OptionalArray& k, const Array& positions,
         const embrope::RopeCache* cache, const OptionalArray& cos, const OptionalArray& sin,
         const OptionalArray& q_out, const OptionalArray& k_out, embrope::RopeLayout layout,
         bool inverse, std::int64_t rotary_dim, std::array<std::int64_t, 4> mrope,
         const OptionalArray& q_weight, const OptionalArray& k_weight, float eps, bool unit_offset,
         embrope::DeferredStatus* deferred, std::uintptr_t stream, bool backward,
         const OptionalArray& saved_q, const OptionalArray& saved_k,
         const OptionalArray& grad_q_weight, const OptionalArray& grad_k_weight) {
        const char* op = backward ? "apply_qk_norm_rope_backward" : "apply_qk_norm_rope";
        const Tensor q_view = view(q, op, backward ? "dq" : "q");
        const std::optional<Tensor> k_view = view(k, op, backward ? "dk" : "k");
        const Tensor positions_view = view(positions, op, "positions");
        const embrope::RopeOptions options =
            rope_options(op, layout, inverse, rotary_dim, mrope, q_out, k_out, deferred, stream);
        embrope::QkNorm norm;
        norm.q_weight = view(q_weight, op, "q_weight");
        norm.k_weight = view(k_weight, op, "k_weight");
        norm.eps = eps;
        norm.unit_offset = unit_offset;
        embrope::QkNormGradients grads;
        std::optional<Tensor> saved_q_view, saved_k_view;
        if (backward) {
          saved_q_view = view(saved_q, op, "q");
          saved_k_view = view(saved_k, op, "k");
          if (!saved_q_view)
            throw embrope::Error(embrope::ErrorCode::invalid_argument,
                                 std::string(op) + ": q (the forward's input) is required");
          grads.q_weight = view(grad_q_weight, op, "grads.q_weight");
          grads.k_weight = view(grad_k_weight, op, "grads.k_weight");
        }
        std::optional<Tensor> cos_view, sin_view;
        if (cache == nullptr) {
          cos_view = view(cos.value(), op, "cos");
          sin_view = view(sin.value(), op, "sin");
        }
        nb::gil_scoped_release nogil;
        if (backward && cache != nullptr) {
          embrope::apply_qk_norm_rope_backward(q_view, k_view, *saved_q_view, saved_k_view,
                                               positions_view, *cache, norm, grads, options);
        } else if (backward) {
          embrope::apply_qk_norm_rope_backward(q_view, k_view, *saved_q_view, saved_k_view,
                                               positions_view, *cos_view, *sin_view, norm, grads,
                                               options);
        } else if (cache != nullptr) {
          embrope::apply_qk_norm_rope(q_view, k_view, positions_view, *cache, norm, options);
        } else {
          embrope::apply_qk_norm_rope(q_view, k_view, positions_view, *cos_view, *sin_view, norm,
                                      options);
        }
      },
      "q"_a, "k"_a.none(), "positions"_a, "cache"_a.none(), "cos"_a.none(), "sin"_a.none(),
      "q_out"_a.none(), "k_out"_a.none(), "layout"_a, "inverse"_a, "rotary_dim"_a, "mrope"_a,
      "q_weight"_a.none(), "k_weight"_a.none(), "eps"_a, "unit_offset"_a, "deferred"_a.none(),
      "stream"_a, "backward"_a, "saved_q"_a.none(), "saved_k"_a.none(), "grad_q_weight"_a.none(),
      "grad_k_weight"_a.none());
}

void bind_apply_rope_append_kv(nb::module_& m) {
  // The cache is k_cache and v_cache, or kv_cache [pages, 2, ...]; slots are slot_mapping, or
  // cache_offsets (with cu_seqlens for packed inputs).
  m.def(
      "apply_rope_append_kv",
      [](const Array& q, const Array& k, const Array& v, const Array& positions,
         const embrope::RopeCache* cache, const OptionalArray& cos, const OptionalArray& sin,
         const OptionalArray& k_cache, const OptionalArray& v_cache, const OptionalArray& kv_cache,
         embrope::KvCacheLayout kv_layout, float k_scale, float v_scale,
         const OptionalArray& slot_mapping, const OptionalArray& cache_offsets,
         const OptionalArray& cu_seqlens, const OptionalArray& q_out, const OptionalArray& k_out,
         embrope::RopeLayout layout, std::int64_t rotary_dim, std::array<std::int64_t, 4> mrope,
         embrope::DeferredStatus* deferred, std::uintptr_t stream) {
        const char* op = "apply_rope_append_kv";
        embrope::KvCache kv;
        if (kv_cache) {
          kv = embrope::KvCache::combined(view(*kv_cache, op, "kv_cache"), kv_layout, k_scale,
                                          v_scale);
        } else {
          kv.k = view(k_cache.value(), op, "k_cache");
          kv.v = view(v_cache.value(), op, "v_cache");
          kv.layout = kv_layout;
          kv.k_scale = k_scale;
          kv.v_scale = v_scale;
        }
        embrope::KvSlots slots;
        slots.slot_mapping = view(slot_mapping, op, "slot_mapping");
        slots.cache_offsets = view(cache_offsets, op, "cache_offsets");
        slots.cu_seqlens = view(cu_seqlens, op, "cu_seqlens");
        const embrope::RopeOptions options =
            rope_options(op, layout, false, rotary_dim, mrope, q_out, k_out, deferred, stream);
        const Tensor q_view = view(q, op, "q"), k_view = view(k, op, "k"),
                     v_view = view(v, op, "v");
        const Tensor positions_view = view(positions, op, "positions");
        if (cache != nullptr) {
          nb::gil_scoped_release nogil;
          embrope::apply_rope_append_kv(q_view, k_view, v_view, positions_view, *cache, kv, slots,
                                        options);
        } else {
          const Tensor cos_view = view(cos.value(), op, "cos");
          const Tensor sin_view = view(sin.value(), op, "sin");
          nb::gil_scoped_release nogil;
          embrope::apply_rope_append_kv(q_view, k_view, v_view, positions_view, cos_view, sin_view,
                                        kv, slots, options);
        }
      },
      "q"_a, "k"_a, "v"_a, "positions"_a, "cache"_a.none(), "cos"_a.none(), "sin"_a.none(),
      "k_cache"_a.none(), "v_cache"_a.none(), "kv_cache"_a.none(), "kv_layout"_a, "k_scale"_a,
      "v_scale"_a, "slot_mapping"_a.none(), "cache_offsets"_a.none(), "cu_seqlens"_a.none(),
      "q_out"_a.none(), "k_out"_a.none(), "layout"_a, "rotary_dim"_a, "mrope"_a,
      "deferred"_a.none(), "stream"_a);
}

embrope::EmbedOptions embed_options(
    float scale, std::int64_t vocab_start, bool vocab_shard, embrope::PositionEncoding positions,
    const OptionalArray& position_table, double sinusoid_base,
    embrope::SinusoidLayout sinusoid_layout, const OptionalArray& position_ids,
    const OptionalArray& position_offsets, const OptionalArray& type_table,
    const OptionalArray& type_ids, embrope::Normalization norm, const OptionalArray& norm_weight,
    const OptionalArray& norm_bias, float norm_eps, bool norm_unit_offset,
    const OptionalArray& pre_norm_out, embrope::DeferredStatus* deferred, std::uintptr_t stream) {
  embrope::EmbedOptions o;
  o.scale = scale;
  o.vocab_start = vocab_start;
  o.vocab_shard = vocab_shard;
  o.positions = positions;
  o.position_table = view(position_table, "embed", "position_table");
  o.sinusoid_base = sinusoid_base;
  o.sinusoid_layout = sinusoid_layout;
  o.position_ids = view(position_ids, "embed", "position_ids");
  o.position_offsets = view(position_offsets, "embed", "position_offsets");
  o.type_table = view(type_table, "embed", "type_table");
  o.type_ids = view(type_ids, "embed", "type_ids");
  o.norm = norm;
  o.norm_weight = view(norm_weight, "embed", "norm_weight");
  o.norm_bias = view(norm_bias, "embed", "norm_bias");
  o.norm_eps = norm_eps;
  o.norm_unit_offset = norm_unit_offset;
  o.pre_norm_out = view(pre_norm_out, "embed", "pre_norm_out");
  o.deferred = deferred;
  o.stream = stream_of(stream);
  return o;
}

void bind_embed(nb::module_& m) {
  m.def(
      "embed",
      [](const Array& table, const Array& ids, const Array& out, float scale,
         std::int64_t vocab_start, bool vocab_shard, embrope::PositionEncoding positions,
         const OptionalArray& position_table, double sinusoid_base,
         embrope::SinusoidLayout sinusoid_layout, const OptionalArray& position_ids,
         const OptionalArray& position_offsets, const OptionalArray& type_table,
         const OptionalArray& type_ids, embrope::Normalization norm,
         const OptionalArray& norm_weight, const OptionalArray& norm_bias, float norm_eps,
         bool norm_unit_offset, const OptionalArray& pre_norm_out,
         embrope::DeferredStatus* deferred, std::uintptr_t stream) {
        const Tensor table_view = view(table, "embed", "table");
        const Tensor ids_view = view(ids, "embed", "ids");
        const Tensor out_view = view(out, "embed", "out");
        const embrope::EmbedOptions options = embed_options(
            scale, vocab_start, vocab_shard, positions, position_table, sinusoid_base,
            sinusoid_layout, position_ids, position_offsets, type_table, type_ids, norm,
            norm_weight, norm_bias, norm_eps, norm_unit_offset, pre_norm_out, deferred, stream);
        nb::gil_scoped_release nogil;
        embrope::embed(table_view, ids_view, out_view, options);
      },
      "table"_a, "ids"_a, "out"_a, "scale"_a, "vocab_start"_a, "vocab_shard"_a, "positions"_a,
      "position_table"_a.none(), "sinusoid_base"_a, "sinusoid_layout"_a, "position_ids"_a.none(),
      "position_offsets"_a.none(), "type_table"_a.none(), "type_ids"_a.none(), "norm"_a,
      "norm_weight"_a.none(), "norm_bias"_a.none(), "norm_eps"_a, "norm_unit_offset"_a,
      "pre_norm_out"_a.none(), "deferred"_a.none(), "stream"_a);
}

// embed_backward and its workspace query share one argument list.
struct EmbedBackwardCall {
  Tensor grad_out, ids;
  std::optional<Tensor> grad_table;
  embrope::EmbedBackwardOptions options;
};

EmbedBackwardCall embed_backward_call(
    const Array& grad_out, const Array& ids, const OptionalArray& grad_table, float scale,
    std::int64_t vocab_start, bool vocab_shard, std::optional<std::int64_t> padding_idx,
    const OptionalArray& grad_position_table, const OptionalArray& position_ids,
    const OptionalArray& position_offsets, const OptionalArray& grad_type_table,
    const OptionalArray& type_ids, embrope::BackwardMode mode, const OptionalArray& workspace,
    embrope::DeferredStatus* deferred, std::uintptr_t stream) {
  const char* op = "embed_backward";
  EmbedBackwardCall c{
      view(grad_out, op, "grad_out"), view(ids, op, "ids"), view(grad_table, op, "grad_table"), {}};
  embrope::EmbedBackwardOptions& o = c.options;
  o.scale = scale;
  o.vocab_start = vocab_start;
  o.vocab_shard = vocab_shard;
  o.padding_idx = padding_idx;
  o.grad_position_table = view(grad_position_table, op, "grad_position_table");
  o.position_ids = view(position_ids, op, "position_ids");
  o.position_offsets = view(position_offsets, op, "position_offsets");
  o.grad_type_table = view(grad_type_table, op, "grad_type_table");
  o.type_ids = view(type_ids, op, "type_ids");
  o.mode = mode;
  std::tie(o.workspace, o.workspace_bytes) = workspace_of(workspace);
  o.deferred = deferred;
  o.stream = stream_of(stream);
  return c;
}

void bind_embed_backward(nb::module_& m) {
  auto run = [](bool size_only, const Array& grad_out, const Array& ids,
                const OptionalArray& grad_table, float scale, std::int64_t vocab_start,
                bool vocab_shard, std::optional<std::int64_t> padding_idx,
                const OptionalArray& grad_position_table, const OptionalArray& position_ids,
                const OptionalArray& position_offsets, const OptionalArray& grad_type_table,
                const OptionalArray& type_ids, embrope::BackwardMode mode,
                const OptionalArray& workspace, embrope::DeferredStatus* deferred,
                std::uintptr_t stream) -> std::size_t {
    const EmbedBackwardCall c =
        embed_backward_call(grad_out, ids, grad_table, scale, vocab_start, vocab_shard, padding_idx,
                            grad_position_table, position_ids, position_offsets, grad_type_table,
                            type_ids, mode, workspace, deferred, stream);
    nb::gil_scoped_release nogil;
    if (size_only) {
      return embrope::embed_backward_workspace_size(c.grad_out, c.ids, c.grad_table, c.options);
    }
    embrope::embed_backward(c.grad_out, c.ids, c.grad_table, c.options);
    return 0;
  };
  m.def("embed_backward", run, "size_only"_a, "grad_out"_a, "ids"_a, "grad_table"_a.none(),
        "scale"_a, "vocab_start"_a, "vocab_shard"_a, "padding_idx"_a.none(),
        "grad_position_table"_a.none(), "position_ids"_a.none(), "position_offsets"_a.none(),
        "grad_type_table"_a.none(), "type_ids"_a.none(), "mode"_a, "workspace"_a.none(),
        "deferred"_a.none(), "stream"_a);
}

void bind_packed_positions(nb::module_& m) {
  m.def(
      "packed_positions",
      [](bool size_only, const Array& cu_seqlens, const Array& positions,
         const OptionalArray& start_offsets, const OptionalArray& workspace,
         embrope::DeferredStatus* deferred, std::uintptr_t stream) -> std::size_t {
        const char* op = "packed_positions";
        const Tensor cu_seqlens_view = view(cu_seqlens, op, "cu_seqlens");
        const Tensor positions_view = view(positions, op, "positions");
        embrope::PackedPositionsOptions o;
        o.start_offsets = view(start_offsets, op, "start_offsets");
        std::tie(o.workspace, o.workspace_bytes) = workspace_of(workspace);
        o.deferred = deferred;
        o.stream = stream_of(stream);
        nb::gil_scoped_release nogil;
        if (size_only) {
          return embrope::packed_positions_workspace_size(cu_seqlens_view, positions_view, o);
        }
        embrope::packed_positions(cu_seqlens_view, positions_view, o);
        return 0;
      },
      "size_only"_a, "cu_seqlens"_a, "positions"_a, "start_offsets"_a.none(), "workspace"_a.none(),
      "deferred"_a.none(), "stream"_a);
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
  bind_rope_config(m);
  bind_rope_cache(m);
  bind_deferred_status(m);
  bind_model_config(m);
  bind_apply_rope(m);
  bind_apply_qk_norm_rope(m);
  bind_apply_rope_append_kv(m);
  bind_embed(m);
  bind_embed_backward(m);
  bind_packed_positions(m);
  // The bytes of a C-contiguous uint16 NumPy array seen as bfloat16 (NumPy has no bfloat16 of
  // its own that DLPack can export): host memory for outputs of frameworks whose arrays are
  // immutable. The view keeps the array alive.
  m.def("bfloat16_view", [](nb::handle array) {
    const auto bits = nb::cast<nb::ndarray<nb::numpy, std::uint16_t, nb::c_contig>>(array);
    std::vector<std::size_t> shape(bits.ndim());
    for (std::size_t i = 0; i < bits.ndim(); ++i) shape[i] = bits.shape(i);
    return nb::ndarray<nb::array_api>(
        bits.data(), bits.ndim(), shape.data(), array, nullptr,
        nb::dlpack::dtype{static_cast<std::uint8_t>(kDLBfloat), 16, 1}, nb::device::cpu::value);
  });
  m.def("cpu_isa", [] { return std::string(embrope::cpu_isa()); });
  m.def("cuda_device_count", [] {
    nb::gil_scoped_release nogil;
    return embrope::cuda_device_count();
  });
}
