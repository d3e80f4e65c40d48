// apply_rope: validate once and fill RopeParams (prepare), then run the CPU or CUDA kernel.
#include "apply_rope.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "backend.hpp"
#include "validate.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

using internal::CosSinTable;
using internal::RopeNames;
using validate::fail;

void fill_heads(const Tensor& in, const Tensor& out, internal::RopeHeads& heads) {
  const int n = in.ndim();
  heads.in = in.data();
  heads.out = out.data();
  heads.heads = in.shape(n - 2);
  heads.in_stride_h = in.stride(n - 2);
  heads.out_stride_h = out.stride(n - 2);
  heads.in_stride_s = in.stride(n - 3);
  heads.out_stride_s = out.stride(n - 3);
  heads.in_stride_b = n == 4 ? in.stride(0) : 0;
  heads.out_stride_b = n == 4 ? out.stride(0) : 0;
}

// Whether the output of side q (is_q) or k may be float8.
bool float8_allowed(const RopeNames& names, bool is_q) {
  return names.float8_outputs == internal::RopeFloat8::q_and_k ||
         (names.float8_outputs == internal::RopeFloat8::q_only && is_q);
}

// The reason a float8 output (or its scale) of side q (is_q) or k is refused.
const char* float8_refusal(const RopeNames& names, bool is_q) {
  if (names.float8_outputs == internal::RopeFloat8::q_only && !is_q) {
    return "k's float8 form is the cache's (a float8 k_cache with k_scale), k_out keeps k's dtype";
  }
  return "float8 outputs are apply_rope's and the cache-append ops' q_out";
}

void check_output(const RopeNames& names, bool is_q, const Tensor& out, const Tensor& in) {
  const char* name = is_q ? names.q_out : names.k_out;
  const char* in_name = is_q ? names.q : names.k;
  validate::check_view(names.op, name, out, in.ndim(), in.ndim());
  validate::check_same_device(names.op, name, out, in_name, in.device());
  if (is_float8_dtype(out.dtype()) && !float8_allowed(names, is_q)) {
    fail(names.op, "{} has dtype {}; {} writes it in the dtype of {} ({}): {}", name,
         dtype_name(out.dtype()), names.op, in_name, dtype_name(in.dtype()),
         float8_refusal(names, is_q));
  }
  if (!is_float8_dtype(out.dtype())) {
    validate::check_same_dtype(names.op, name, out, in_name, in.dtype());
  }
  for (int d = 0; d < in.ndim(); ++d) {
    if (out.shape(d) != in.shape(d)) {
      fail(names.op, "{} has shape {} but {} has {}; they must match", name,
           validate::shape_string(out), in_name, validate::shape_string(in));
    }
  }
  validate::check_last_contiguous(names.op, name, out);
}

// The float8 scales of q's or k's output (RopeOptions): a positive finite scale and optional
// head scales [heads] for a float8 output; 1 and none for any other.
void fill_out_scales(const RopeNames& names, bool is_q, const char* out_name, const Tensor* out,
                     const char* scale_name, float scale, const char* head_scales_name,
                     const std::optional<Tensor>& head_scales, const char* in_name,
                     std::int64_t heads, Device device, internal::RopeHeads& x) {
  if (out == nullptr || !is_float8_dtype(out->dtype())) {
    if (scale != 1.0f || head_scales) {
      const char* what = scale != 1.0f ? scale_name : head_scales_name;
      if (!float8_allowed(names, is_q)) {
        fail(names.op, "{} is set; {}", what, float8_refusal(names, is_q));
      }
      if (out == nullptr) fail(names.op, "{} is set but {} is not given", what, in_name);
      fail(names.op, "{} applies to float8 outputs only; {} has dtype {}", what, out_name,
           dtype_name(out->dtype()));
    }
    return;
  }
  if (!(scale > 0.0f) || scale == INFINITY) {
    fail(names.op, "{} {} must be positive and finite", scale_name, scale);
  }
  x.out_scale = scale;
  if (head_scales) {
    const Tensor& h = *head_scales;
    validate::check_view(names.op, head_scales_name, h, 1, 1);
    if (h.dtype() != DType::float32) {
      fail(names.op, "{} has dtype {}, expected float32", head_scales_name, dtype_name(h.dtype()));
    }
    validate::check_same_device(names.op, head_scales_name, h, names.q, device);
    validate::check_dim(names.op, head_scales_name, h, 0, heads, "the heads of the output");
    validate::check_last_contiguous(names.op, head_scales_name, h);
    x.out_head_scales = static_cast<const float*>(h.data());
  }
}

// The non-rotary part `nope_name` of q or k (`side`, its rotated part, shaped [T, H, D]) and
// its float8 output: side's dtype, token dims and heads, any last dim; the output of nope's
// shape and the outputs' float8 dtype. Fills x and dim.
void fill_nope(const RopeNames& names, bool is_q, const char* nope_name,
               const std::optional<Tensor>& nope, const char* out_name,
               const std::optional<Tensor>& out, const char* side_name, const Tensor* side,
               DType out_dtype, internal::RopeHeads& x, std::int64_t& dim) {
  if (!nope && !out) return;
  if (!nope || !out) {
    fail(names.op, "{} is given but {} is not; give both or neither", nope ? nope_name : out_name,
         nope ? out_name : nope_name);
  }
  if (!float8_allowed(names, is_q)) {
    fail(names.op, "{} is given; {}", nope_name, float8_refusal(names, is_q));
  }
  if (!is_float8_dtype(out_dtype)) {
    fail(names.op,
         "{} is for float8 outputs (RoPE + quantization, rope_quantize_fp8); the outputs have "
         "dtype {}",
         nope_name, dtype_name(out_dtype));
  }
  if (side == nullptr) fail(names.op, "{} is given but {} is not", nope_name, side_name);
  const int n = side->ndim();
  validate::check_view(names.op, nope_name, *nope, n, n);
  validate::check_same_device(names.op, nope_name, *nope, side_name, side->device());
  validate::check_same_dtype(names.op, nope_name, *nope, side_name, side->dtype());
  validate::check_last_contiguous(names.op, nope_name, *nope);
  for (int d = 0; d < n - 1; ++d) {
    validate::check_dim(names.op, nope_name, *nope, d, side->shape(d),
                        d == n - 2 ? "the heads of its rotated part" : names.q_token_dims);
  }
  validate::check_view(names.op, out_name, *out, n, n);
  validate::check_same_device(names.op, out_name, *out, side_name, side->device());
  validate::check_same_dtype(names.op, out_name, *out, "the float8 outputs", out_dtype);
  for (int d = 0; d < n; ++d) {
    if (out->shape(d) != nope->shape(d)) {
      fail(names.op, "{} has shape {} but {} has {}; they must match", out_name,
           validate::shape_string(*out), nope_name, validate::shape_string(*nope));
    }
  }
  validate::check_last_contiguous(names.op, out_name, *out);
  fill_heads(*nope, *out, x);
  dim = nope->shape(n - 1);
}

// An axial call's axes: how many (0: not axial), the pairs of each, and axes_dim as text.
struct AxialSections {
  int axes = 0;
  std::int64_t pairs[detail::kMaxPositionStreams] = {};
  std::string text;
};

// The axes of a call: options.axes_dim, or the axial cache's when that is all zero (both given
// must agree). Each is a positive even number of features, the unused ones trailing zeros, and
// together they are the table's rotary dim.
AxialSections axial_sections(const RopeNames& names, const RopeOptions& options,
                             const CosSinTable& table, bool mrope) {
  const auto is_zero = [](const auto& dims) {
    return std::all_of(dims.begin(), dims.end(), [](std::int64_t d) { return d == 0; });
  };
  const auto text = [](const auto& dims) { return fmt::format("[{}]", fmt::join(dims, ", ")); };
  const bool from_options = !is_zero(options.axes_dim);
  if (from_options && !is_zero(table.axes_dim) && options.axes_dim != table.axes_dim) {
    fail(names.op, "axes_dim {} differs from the axes {} of {}", text(options.axes_dim),
         text(table.axes_dim), table.name);
  }
  const auto& dims = from_options ? options.axes_dim : table.axes_dim;
  AxialSections axial;
  if (is_zero(dims)) return axial;
  if (mrope) {
    fail(names.op, "axes_dim {} and mrope_section are given; a call has one or the other",
         text(dims));
  }
  if (options.mrope_interleaved) {
    fail(names.op, "mrope_interleaved is set with axes_dim {}; axes are contiguous", text(dims));
  }
  std::int64_t sum = 0;
  for (std::size_t a = 0; a < dims.size(); ++a) {
    const bool trailing_zeros = std::all_of(dims.begin() + static_cast<std::ptrdiff_t>(a),
                                            dims.end(), [](std::int64_t d) { return d == 0; });
    if (dims[a] == 0 && trailing_zeros) break;
    if (dims[a] <= 0 || dims[a] % 2 != 0) {
      fail(names.op,
           "axes_dim {}: axis {} has {} features; each axis has a positive even number, unused "
           "axes trailing zeros",
           text(dims), a, dims[a]);
    }
    // Past the table's rotary dim the sum can only be wrong (and adding could overflow).
    if (dims[a] > table.rotary_dim - sum) {
      fail(names.op, "axes_dim {} sums to more than the rotary dim {} of {}", text(dims),
           table.rotary_dim, table.name);
    }
    axial.pairs[a] = dims[a] / 2;
    axial.axes = static_cast<int>(a) + 1;
    sum += dims[a];
  }
  axial.text = text(std::vector<std::int64_t>(dims.begin(), dims.begin() + axial.axes));
  if (sum != table.rotary_dim) {
    fail(names.op, "axes_dim {} sums to {}, but the rotary dim of {} is {}", axial.text, sum,
         table.name, table.rotary_dim);
  }
  return axial;
}

}  // namespace

EMBROPE_END_NAMESPACE

namespace embrope::internal {

void check_apart_from_table(const char* op, const char* name, const Tensor& out,
                            const CosSinTable& table) {
  validate::check_no_overlap(op, name, out, table.name, table.cos_view);
  // A RopeCache's cos and sin are one table; a caller's may be two.
  if (table.sin_view.data() != table.cos_view.data()) {
    validate::check_no_overlap(op, name, out, "sin", table.sin_view);
  }
}

// Validates every argument and fills the parameters of the call.
RopeParams prepare_rope(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
                        const Tensor& positions, const CosSinTable& table,
                        const RopeOptions& options) {
  validate::check_view(names.op, names.q, q, 3, 4);
  validate::check_value_dtype(names.op, names.q, q);
  validate::check_last_contiguous(names.op, names.q, q);
  const Device device = q.device();
  validate::check_device_usable(names.op, device);
  const int n = q.ndim();
  const std::int64_t head_dim = q.shape(n - 1);
  const bool batched = n == 4;
  const std::int64_t batch = batched ? q.shape(0) : 1;
  const std::int64_t seq = q.shape(n - 3);

  const auto& section = options.mrope_section;
  const bool mrope = section[0] != 0 || section[1] != 0 || section[2] != 0;
  const AxialSections axial = axial_sections(names, options, table, mrope);
  // With mrope or axes, positions gain a leading stream dimension (3, or one per axis).
  const int streams = mrope ? 3 : axial.axes > 0 ? axial.axes : 1;
  const int lead = streams > 1 || axial.axes > 0 ? 1 : 0;
  validate::check_view(names.op, "positions", positions, n - 2 + lead, n - 2 + lead);
  validate::check_index_dtype(names.op, "positions", positions);
  validate::check_same_device(names.op, "positions", positions, names.q, device);
  if (mrope) validate::check_dim(names.op, "positions", positions, 0, 3, "the 3 mrope streams");
  if (axial.axes > 0) {
    validate::check_dim(names.op, "positions", positions, 0, axial.axes,
                        fmt::format("its {} axes (axes_dim {})", axial.axes, axial.text).c_str());
  }
  for (int d = 0; d < n - 2; ++d) {
    validate::check_dim(names.op, "positions", positions, d + lead, q.shape(d), names.q_token_dims);
  }

  if (table.device != device) {
    fail(names.op, "{} is on another device than {}; all tensors of a call must be on one device",
         table.name, names.q);
  }
  const std::int64_t rotary_dim = table.rotary_dim;
  if (options.rotary_dim != 0 && options.rotary_dim != rotary_dim) {
    fail(names.op, "rotary_dim {} does not match the rotary dim {} of {}", options.rotary_dim,
         rotary_dim, table.name);
  }
  if (rotary_dim > head_dim)
    fail(names.op, "rotary_dim {} exceeds head_dim {}", rotary_dim, head_dim);
  if (options.layout != RopeLayout::neox && options.layout != RopeLayout::interleaved) {
    fail(names.op, "layout {} is not a RopeLayout (neox or interleaved)",
         static_cast<int>(options.layout));
  }
  if (mrope) {
    // Each section is checked against R / 2 before the sum, which could otherwise wrap.
    const auto fits = [&](std::int64_t s) { return s >= 0 && s <= rotary_dim / 2; };
    if (!fits(section[0]) || !fits(section[1]) || !fits(section[2]) ||
        section[0] + section[1] + section[2] != rotary_dim / 2) {
      fail(names.op,
           "mrope_section [{}, {}, {}] must be non-negative and sum to rotary_dim / 2 = {}",
           section[0], section[1], section[2], rotary_dim / 2);
    }
    // Interleaved, height takes i = 1, 4, ... below 3 section[1] and width i = 2, 5, ... below
    // 3 section[2]: each stream gets its section's count only if those lie below R / 2.
    if (options.mrope_interleaved && ((section[1] > 0 && 3 * section[1] - 2 >= rotary_dim / 2) ||
                                      (section[2] > 0 && 3 * section[2] - 1 >= rotary_dim / 2))) {
      fail(names.op,
           "interleaved mrope_section [{}, {}, {}] does not fit rotary_dim / 2 = {}: 3 * "
           "section[1] - 2 and 3 * section[2] - 1 must be below it",
           section[0], section[1], section[2], rotary_dim / 2);
    }
  } else if (options.mrope_interleaved) {
    fail(names.op, "mrope_interleaved is set but mrope_section is all zero (mrope off)");
  }

  internal::RopeParams p;
  p.dtype = q.dtype();
  p.batch = batch;
  p.seq = seq;
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  p.positions = positions.data();
  p.position_dtype = positions.dtype();
  p.position_stride_b = batched ? positions.stride(lead) : 0;
  p.position_stride_s = positions.stride(positions.ndim() - 1);
  p.mrope = mrope || axial.axes > 0;
  p.streams = streams;
  if (mrope) {
    for (int j = 0; j < 3; ++j) p.mrope_section[j] = section[j];
    p.mrope_interleaved = options.mrope_interleaved;
  } else {
    for (int j = 0; j < axial.axes; ++j) p.mrope_section[j] = axial.pairs[j];
  }
  if (p.mrope) p.position_stride_stream = positions.stride(0);
  detail::section_ends(p.mrope_section, p.section_end);
  p.cos = table.cos;
  p.sin = table.sin;
  p.table_dtype = table.dtype;
  p.cos_stride = table.cos_stride;
  p.sin_stride = table.sin_stride;
  p.table_rows = table.rows;
  p.layout = options.layout;
  p.inverse = options.inverse;
  p.bad_op = names.bad_op;

  const Tensor& q_out = options.q_out ? *options.q_out : q;
  if (options.q_out) check_output(names, true, q_out, q);
  fill_heads(q, q_out, p.q);

  if (options.k_out && !k) fail(names.op, "{} is given but {} is not", names.k_out, names.k);
  if (k) {
    validate::check_view(names.op, names.k, *k, n, n);
    validate::check_same_device(names.op, names.k, *k, names.q, device);
    validate::check_same_dtype(names.op, names.k, *k, names.q, q.dtype());
    validate::check_last_contiguous(names.op, names.k, *k);
    for (int d = 0; d < n - 2; ++d) {
      validate::check_dim(names.op, names.k, *k, d, q.shape(d), names.q_token_dims);
    }
    validate::check_dim(names.op, names.k, *k, n - 1, head_dim, names.q_head_dim);
    const Tensor& k_out = options.k_out ? *options.k_out : *k;
    if (options.k_out) check_output(names, false, k_out, *k);
    fill_heads(*k, k_out, p.k);
    p.has_k = true;
  }

  // Float8 outputs: both or neither, of one dtype, out of place (k_out given with k); the
  // cache-append ops' float8 q_out alone (k_out, if given, has k's dtype: checked above).
  p.out_dtype = q_out.dtype();
  if (k && names.float8_outputs == internal::RopeFloat8::q_and_k) {
    const DType k_out_dtype = options.k_out ? options.k_out->dtype() : k->dtype();
    if (is_float8_dtype(p.out_dtype) && !options.k_out) {
      fail(names.op,
           "{} has dtype {} but {} is not given; with float8 outputs {} is quantized too: give "
           "{} of dtype {}",
           names.q_out, dtype_name(p.out_dtype), names.k_out, names.k, names.k_out,
           dtype_name(p.out_dtype));
    }
    if ((is_float8_dtype(p.out_dtype) || is_float8_dtype(k_out_dtype)) &&
        k_out_dtype != p.out_dtype) {
      fail(names.op,
           "{} has dtype {} but {} has {}; float8 outputs are both or neither, of one dtype",
           names.k_out, dtype_name(k_out_dtype), options.q_out ? names.q_out : names.q,
           dtype_name(p.out_dtype));
    }
  }
  fill_out_scales(names, true, options.q_out ? names.q_out : names.q, &q_out, "q_out_scale",
                  options.q_out_scale, "q_out_head_scales", options.q_out_head_scales, names.q,
                  p.q.heads, device, p.q);
  const Tensor* k_out_tensor = !k ? nullptr : options.k_out ? &*options.k_out : &*k;
  fill_out_scales(names, false, options.k_out ? names.k_out : names.k, k_out_tensor, "k_out_scale",
                  options.k_out_scale, "k_out_head_scales", options.k_out_head_scales, names.k,
                  p.has_k ? p.k.heads : 0, device, p.k);

  // Float8 outputs' non-rotary parts, each quantized with its side's scales.
  fill_nope(names, true, "q_nope", options.q_nope, "q_nope_out", options.q_nope_out, names.q, &q,
            p.out_dtype, p.q_nope, p.q_nope_dim);
  fill_nope(names, false, "k_nope", options.k_nope, "k_nope_out", options.k_nope_out, names.k,
            k ? &*k : nullptr, p.out_dtype, p.k_nope, p.k_nope_dim);
  if (options.q_nope || options.k_nope) {
    // Each nope output shares no byte with itself, another output or any input.
    struct Named {
      const char* name;
      const Tensor* t;
    };
    const Tensor* k_out_view = !k ? nullptr : options.k_out ? &*options.k_out : &*k;
    const Named nope_outputs[] = {
        {"q_nope_out", options.q_nope_out ? &*options.q_nope_out : nullptr},
        {"k_nope_out", options.k_nope_out ? &*options.k_nope_out : nullptr}};
    const Named others[] = {
        {names.q, &q},
        {names.k, k ? &*k : nullptr},
        {"q_nope", options.q_nope ? &*options.q_nope : nullptr},
        {"k_nope", options.k_nope ? &*options.k_nope : nullptr},
        {options.q_out ? names.q_out : names.q, &q_out},
        {options.k_out ? names.k_out : names.k, k_out_view},
        {"positions", &positions},
        {table.name, &table.cos_view},
        {"sin", &table.sin_view},
        {"q_out_head_scales", options.q_out_head_scales ? &*options.q_out_head_scales : nullptr},
        {"k_out_head_scales", options.k_out_head_scales ? &*options.k_out_head_scales : nullptr}};
    for (const Named& out : nope_outputs) {
      if (out.t == nullptr) continue;
      validate::check_no_self_overlap(names.op, out.name, *out.t);
      for (const Named& other : others) {
        if (other.t != nullptr)
          validate::check_no_overlap(names.op, out.name, *out.t, other.name, *other.t);
      }
    }
    if (options.q_nope_out && options.k_nope_out) {
      validate::check_no_overlap(names.op, "q_nope_out", *options.q_nope_out, "k_nope_out",
                                 *options.k_nope_out);
    }
    // And the rotated outputs share none with the nope inputs.
    for (const Named& in : {others[2], others[3]}) {
      if (in.t == nullptr) continue;
      validate::check_no_overlap(names.op, others[4].name, q_out, in.name, *in.t);
      if (k_out_view != nullptr) {
        validate::check_no_overlap(names.op, others[5].name, *k_out_view, in.name, *in.t);
      }
    }
  }

  // Outputs share no memory with themselves, with each other or with any input; an output
  // given for q (k) may be q (k) itself, the exact same view, which is the in-place case.
  const char* q_out_name = options.q_out ? names.q_out : names.q;
  validate::check_no_self_overlap(names.op, q_out_name, q_out);
  if (options.q_out) validate::check_no_overlap(names.op, names.q_out, q_out, names.q, q, true);
  const Tensor* outputs[2] = {&q_out, nullptr};
  const char* output_names[2] = {q_out_name, nullptr};
  if (k) validate::check_no_overlap(names.op, q_out_name, q_out, names.k, *k);
  if (k && (options.k_out || names.k_in_place)) {
    const Tensor& k_out = options.k_out ? *options.k_out : *k;
    const char* k_out_name = options.k_out ? names.k_out : names.k;
    validate::check_no_self_overlap(names.op, k_out_name, k_out);
    if (options.k_out) validate::check_no_overlap(names.op, names.k_out, k_out, names.k, *k, true);
    validate::check_no_overlap(names.op, k_out_name, k_out, names.q, q);
    if (options.k_out) validate::check_no_overlap(names.op, q_out_name, q_out, names.k_out, k_out);
    outputs[1] = &k_out;
    output_names[1] = k_out_name;
  }
  for (int i = 0; i < 2 && outputs[i] != nullptr; ++i) {
    validate::check_no_overlap(names.op, output_names[i], *outputs[i], "positions", positions);
    if (options.q_out_head_scales) {
      validate::check_no_overlap(names.op, output_names[i], *outputs[i], "q_out_head_scales",
                                 *options.q_out_head_scales);
    }
    if (options.k_out_head_scales) {
      validate::check_no_overlap(names.op, output_names[i], *outputs[i], "k_out_head_scales",
                                 *options.k_out_head_scales);
    }
    check_apart_from_table(names.op, output_names[i], *outputs[i], table);
  }

  return p;
}

}  // namespace embrope::internal

EMBROPE_BEGIN_NAMESPACE

namespace {

void apply(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
           const Tensor& positions, const CosSinTable& table, const RopeOptions& options) {
  internal::RopeParams p = internal::prepare_rope(names, q, k, positions, table, options);
  // No rows (no tokens, or no heads in q and k): nothing is rotated and no position is read,
  // on either backend.
  if (p.batch * p.seq == 0 || p.q.heads + (p.has_k ? p.k.heads : 0) == 0) return;
  run_kernel(names.op, q.device(), options.stream, options.deferred, p, p.bad, cpu::apply_rope,
             gpu::apply_rope);
}

}  // namespace

EMBROPE_END_NAMESPACE

namespace embrope::internal {

CosSinTable cos_sin_table(const char* op, const RopeCache& cache) {
  if (cache.data() == nullptr) fail(op, "the cache was moved from");
  const std::int64_t r = cache.rotary_dim();
  const Tensor view = cache.table();
  std::array<std::int64_t, detail::kMaxPositionStreams> axes_dim{};
  const std::vector<std::int64_t> dims = cache.axes_dim();
  std::copy(dims.begin(), dims.end(), axes_dim.begin());
  return {
      cache.data(),   cache.data() + r / 2, DType::float32, r,    r,       cache.max_positions(), r,
      cache.device(), "the cache",          view,           view, axes_dim};
}

CosSinTable cos_sin_table(const RopeNames& names, const Tensor& cos, const Tensor& sin) {
  validate::check_view(names.op, "cos", cos, 2, 2);
  validate::check_view(names.op, "sin", sin, 2, 2);
  validate::check_value_dtype(names.op, "cos", cos);
  validate::check_same_dtype(names.op, "sin", sin, "cos", cos.dtype());
  validate::check_same_device(names.op, "sin", sin, "cos", cos.device());
  validate::check_last_contiguous(names.op, "cos", cos);
  validate::check_last_contiguous(names.op, "sin", sin);
  if (sin.shape(0) != cos.shape(0) || sin.shape(1) != cos.shape(1)) {
    fail(names.op, "sin has shape {} but cos has {}; they must match", validate::shape_string(sin),
         validate::shape_string(cos));
  }
  if (cos.shape(1) == 0)
    fail(names.op, "cos has shape {}: rotary_dim 0 must be positive", validate::shape_string(cos));
  return {cos.data(),       sin.data(),   cos.dtype(), cos.stride(0), sin.stride(0), cos.shape(0),
          2 * cos.shape(1), cos.device(), "cos",       cos,           sin,           {}};
}

void apply_rope_named(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
                      const Tensor& positions, const RopeCache& cache, const RopeOptions& options) {
  apply(names, q, k, positions, cos_sin_table(names.op, cache), options);
}

void apply_rope_named(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
                      const Tensor& positions, const Tensor& cos, const Tensor& sin,
                      const RopeOptions& options) {
  apply(names, q, k, positions, cos_sin_table(names, cos, sin), options);
}

}  // namespace embrope::internal

EMBROPE_BEGIN_NAMESPACE

void apply_rope(const Tensor& q, const std::optional<Tensor>& k, const Tensor& positions,
                const RopeCache& cache, const RopeOptions& options) {
  internal::apply_rope_named(internal::kRopeForwardNames, q, k, positions, cache, options);
}

void apply_rope(const Tensor& q, const std::optional<Tensor>& k, const Tensor& positions,
                const Tensor& cos, const Tensor& sin, const RopeOptions& options) {
  internal::apply_rope_named(internal::kRopeForwardNames, q, k, positions, cos, sin, options);
}

EMBROPE_END_NAMESPACE
