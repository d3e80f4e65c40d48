#include "validate.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "device_runtime.hpp"

namespace embrope::validate {

std::string shape_string(const Tensor& t) {
  return fmt::format("[{}]", fmt::join(t.shape(), t.shape() + t.ndim(), ", "));
}

namespace {
std::string device_string(Device d) {
  if (d.kind == DeviceKind::cpu) return "cpu";
  if (d.kind == DeviceKind::cuda) return fmt::format("cuda:{}", d.index);
  return fmt::format("device kind {}", static_cast<int>(d.kind));
}

}  // namespace

void check_view(const char* op, const char* name, const Tensor& t, int min_ndim, int max_ndim) {
  if (t.ndim() < min_ndim || t.ndim() > max_ndim) {
    if (min_ndim == max_ndim)
      fail(op, "{} has {} dimensions, expected {}", name, t.ndim(), min_ndim);
    fail(op, "{} has {} dimensions, expected {} to {}", name, t.ndim(), min_ndim, max_ndim);
  }
  constexpr std::int64_t limit = INT64_MAX / 8;  // offsets stay valid after scaling by bytes
  std::int64_t count = 1;
  std::int64_t furthest = 0;
  bool empty = false;
  for (int d = 0; d < t.ndim(); ++d) {
    const std::int64_t size = t.shape(d);
    const std::int64_t stride = t.stride(d);
    if (size < 0) fail(op, "{} has negative size {} in dimension {}", name, size, d);
    if (stride < 0) fail(op, "{} has negative stride {} in dimension {}", name, stride, d);
    // Even in an empty view: sizes feed other arithmetic (rotary_dim = 2 * cos columns).
    if (size > limit) fail(op, "{} has size {} in dimension {}, more than 2^60", name, size, d);
    if (size == 0) empty = true;
  }
  if (empty) return;
  for (int d = 0; d < t.ndim(); ++d) {
    const std::int64_t size = t.shape(d);
    const std::int64_t stride = t.stride(d);
    if (count > limit / size)
      fail(op, "{} of shape {} has more than 2^60 elements", name, shape_string(t));
    count *= size;
    if (stride != 0 && size - 1 > (limit - furthest) / stride) {
      fail(op, "{} of shape {} reaches past 2^60 elements from its data pointer", name,
           shape_string(t));
    }
    furthest += (size - 1) * stride;
  }
  if (t.data() == nullptr) fail(op, "{} has null data but {} elements", name, count);
  const auto base = reinterpret_cast<std::uintptr_t>(t.data());
  // A misaligned element is undefined behaviour in C++ and a sticky fault on a GPU, one that
  // would leave the CUDA context unusable.
  if (base % static_cast<std::uintptr_t>(dtype_size(t.dtype())) != 0) {
    fail(op, "{} has data pointer {:#x}, not a multiple of its element size ({} bytes for {})",
         name, base, dtype_size(t.dtype()), dtype_name(t.dtype()));
  }
  const auto bytes = static_cast<std::uintptr_t>(furthest + 1) *
                     static_cast<std::uintptr_t>(dtype_size(t.dtype()));
  if (bytes - 1 > UINTPTR_MAX - base) {
    fail(op, "{} of shape {} reaches past the end of the address space", name, shape_string(t));
  }
}

void check_value_dtype(const char* op, const char* name, const Tensor& t) {
  if (!is_value_dtype(t.dtype())) {
    fail(op, "{} has dtype {}, expected float32, float16 or bfloat16", name, dtype_name(t.dtype()));
  }
}

void check_index_dtype(const char* op, const char* name, const Tensor& t) {
  if (!is_index_dtype(t.dtype())) {
    fail(op, "{} has dtype {}, expected int32 or int64", name, dtype_name(t.dtype()));
  }
}

void check_last_contiguous(const char* op, const char* name, const Tensor& t) {
  if (t.ndim() == 0) return;
  const int last = t.ndim() - 1;
  if (t.shape(last) > 1 && t.stride(last) != 1) {
    fail(op, "{} has stride {} in its last dimension, which must be 1", name, t.stride(last));
  }
}

void check_same_device(const char* op, const char* name, const Tensor& t, const char* other_name,
                       Device other) {
  if (t.device() != other) {
    fail(op, "{} is on {} but {} is on {}; all tensors of a call must be on one device", name,
         device_string(t.device()), other_name, device_string(other));
  }
}

void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* other_name,
                      DType other) {
  if (t.dtype() != other) {
    fail(op, "{} has dtype {} but {} has {}; they must match", name, dtype_name(t.dtype()),
         other_name, dtype_name(other));
  }
}

void check_float32_or_dtype(const char* op, const char* name, const Tensor& t,
                            const char* other_name, DType other) {
  if (t.dtype() != DType::float32 && t.dtype() != other) {
    fail(op, "{} has dtype {}, expected float32 or the dtype of {} ({})", name,
         dtype_name(t.dtype()), other_name, dtype_name(other));
  }
}

void check_dim(const char* op, const char* name, const Tensor& t, int dim, std::int64_t expected,
               const char* what) {
  if (t.shape(dim) != expected) {
    fail(op, "{} of shape {} has size {} in dimension {}, expected {} ({})", name, shape_string(t),
         t.shape(dim), dim, expected, what);
  }
}

void check_device_usable(const char* op, Device device) {
  if (device.kind == DeviceKind::cpu) return;
  if (device.kind != DeviceKind::cuda) {
    fail(op, "tensors are on {}, which is neither cpu nor cuda", device_string(device));
  }
  const int count = gpu::device_count();
  if (count == 0) {
    throw Error(ErrorCode::not_implemented,
                fmt::format("{}: tensors are on {} but no CUDA device is usable ({})", op,
                            device_string(device),
                            "built without CUDA, or no driver or device at run time"));
  }
  if (device.index < 0 || device.index >= count) {
    fail(op, "tensors are on {} but only {} CUDA devices exist", device_string(device), count);
  }
}

}  // namespace embrope::validate

namespace embrope::validate {
namespace {

// Byte arithmetic in 128 bits: an address difference and a sum of two views' extents each
// need up to 64 bits plus a sign.
using Wide = __int128;

// One term of the equation sum_j k_j * stride_j == delta, with k_j in [lo, hi].
struct Term {
  Wide stride, lo, hi;
  bool is_element;  // a dimension of the view (not the bytes within one element)
};

// The equation's terms: two views' dimensions and the bytes within an element, held in place
// (no allocation: an op checks two dozen pairs of views per call, and at decode a few of them are
// views side by side in one buffer, which need the search).
struct Terms {
  static constexpr int kCapacity = 2 * kMaxDims + 1;
  Term term[kCapacity];
  int count = 0;
  void push(const Term& t) { term[count++] = t; }
  Term* begin() { return term; }
  Term* end() { return term + count; }
};

Wide floor_div(Wide a, Wide b) {  // b > 0
  Wide q = a / b;
  if (a % b != 0 && a < 0) --q;
  return q;
}

// Exhaustive search for a solution, pruned by the range the remaining terms can still
// reach. Layouts in use (nested strides, views side by side in one buffer) leave at most a
// few candidates per term; a pathological one that exhausts the budget counts as sharing.
class LatticeSearch {
 public:
  LatticeSearch(const Terms& terms, bool need_element) : need_element_(need_element) {
    for (int j = 0; j < terms.count; ++j) terms_.push(terms.term[j]);
    std::sort(terms_.begin(), terms_.end(),
              [](const Term& x, const Term& y) { return x.stride > y.stride; });
    const int n = terms_.count;
    rest_lo_[n] = rest_hi_[n] = 0;
    for (int j = n; j-- > 0;) {
      rest_lo_[j] = rest_lo_[j + 1] + terms_.term[j].lo * terms_.term[j].stride;
      rest_hi_[j] = rest_hi_[j + 1] + terms_.term[j].hi * terms_.term[j].stride;
    }
  }
  // True when a solution exists (or the budget ran out).
  bool solvable(Wide delta) { return search(0, delta, false); }

 private:
  bool search(int j, Wide delta, bool element_moved) {
    if (++visited_ > kBudget) return true;
    if (delta < rest_lo_[j] || delta > rest_hi_[j]) return false;
    if (j == terms_.count) return delta == 0 && (element_moved || !need_element_);
    const Term& t = terms_.term[j];
    const Wide first = std::max(t.lo, -floor_div(-(delta - rest_hi_[j + 1]), t.stride));
    const Wide last = std::min(t.hi, floor_div(delta - rest_lo_[j + 1], t.stride));
    for (Wide k = first; k <= last; ++k) {
      if (search(j + 1, delta - k * t.stride, element_moved || (t.is_element && k != 0))) {
        return true;
      }
    }
    return false;
  }

  static constexpr long kBudget = 1 << 16;
  Terms terms_;
  Wide rest_lo_[Terms::kCapacity + 1], rest_hi_[Terms::kCapacity + 1];
  bool need_element_;
  long visited_ = 0;
};

bool is_empty(const Tensor& t) {
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.shape(d) == 0) return true;
  }
  return false;
}

Wide address(const Tensor& t) {
  return static_cast<Wide>(reinterpret_cast<std::uintptr_t>(t.data()));
}

// Adds the dimensions of t, each coefficient range scaled by `sign` (+1 or -1), merging
// dimensions of equal byte stride (k1 s + k2 s ranges over (k1 + k2) s).
void add_dims(Terms& terms, const Tensor& t, int sign) {
  const Wide size = dtype_size(t.dtype());
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.shape(d) <= 1 || t.stride(d) == 0) continue;
    const Wide stride = static_cast<Wide>(t.stride(d)) * size;
    const Wide reach = t.shape(d) - 1;
    const Wide lo = sign > 0 ? 0 : -reach;
    const Wide hi = sign > 0 ? reach : 0;
    auto same =
        std::find_if(terms.begin(), terms.end(), [&](const Term& x) { return x.stride == stride; });
    if (same != terms.end()) {
      same->lo += lo;
      same->hi += hi;
    } else {
      terms.push({stride, lo, hi, true});
    }
  }
}

// The address of the last byte of a non-empty view that passed check_view: its strides are
// non-negative, its reach at most 2^60 elements and its last byte within the address space,
// so the sum cannot wrap. In machine words: overlap() asks it of every pair of views an op
// checks (two dozen for a cache append), most of them separate buffers.
std::uintptr_t last_byte(const Tensor& t) {
  const auto size = static_cast<std::uintptr_t>(dtype_size(t.dtype()));
  std::uintptr_t reach = size - 1;
  for (int d = 0; d < t.ndim(); ++d) {
    reach += static_cast<std::uintptr_t>(t.shape(d) - 1) *
             static_cast<std::uintptr_t>(t.stride(d)) * size;
  }
  return reinterpret_cast<std::uintptr_t>(t.data()) + reach;
}

// True when t's dimensions, ordered by stride, each step over the whole extent of the ones
// below it (a row-major layout, padded or permuted): then no two elements share a byte. The
// cheap sufficient test before the exact search.
bool plainly_distinct(const Tensor& t) {
  int order[kMaxDims];
  int n = 0;
  for (int d = 0; d < t.ndim() && d < kMaxDims; ++d) {
    if (t.shape(d) <= 1) continue;
    int i = n++;  // insertion by stride: at most kMaxDims entries
    for (; i > 0 && t.stride(order[i - 1]) > t.stride(d); --i) order[i] = order[i - 1];
    order[i] = d;
  }
  Wide extent = 1;  // in elements: the reach of the dimensions so far, plus one
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    if (t.stride(d) < 0 || static_cast<Wide>(t.stride(d)) < extent) return false;
    extent = static_cast<Wide>(t.stride(d)) * (t.shape(d) - 1) + extent;
  }
  return true;
}

bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data() != b.data() || a.dtype() != b.dtype() || a.ndim() != b.ndim()) return false;
  for (int d = 0; d < a.ndim(); ++d) {
    if (a.shape(d) != b.shape(d)) return false;
    if (a.shape(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

}  // namespace

Overlap overlap(const Tensor& a, const Tensor& b) {
  if (is_empty(a) || is_empty(b)) return Overlap::none;
  // Disjoint byte ranges cannot share a byte (the usual case: separate buffers).
  if (last_byte(a) < reinterpret_cast<std::uintptr_t>(b.data()) ||
      last_byte(b) < reinterpret_cast<std::uintptr_t>(a.data())) {
    return Overlap::none;
  }
  if (same_view(a, b)) return Overlap::same_view;
  // A byte of a at address(a) + sum i_d sa_d + x equals one of b at address(b) +
  // sum j_d sb_d + y (x, y within an element) exactly when
  // sum i_d sa_d - sum j_d sb_d + (x - y) == address(b) - address(a).
  Terms terms;
  add_dims(terms, a, +1);
  add_dims(terms, b, -1);
  terms.push({1, -(dtype_size(b.dtype()) - 1), dtype_size(a.dtype()) - 1, false});
  LatticeSearch search(terms, false);
  return search.solvable(address(b) - address(a)) ? Overlap::partial : Overlap::none;
}

void check_no_overlap(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                      const Tensor& in, bool in_place) {
  const Overlap o = overlap(out, in);
  if (o == Overlap::none || (o == Overlap::same_view && in_place)) return;
  if (in_place) {
    fail(op,
         "{} overlaps {} without being the same view; an in-place output must be exactly its "
         "input (same data, shape and strides) or not share memory with it",
         out_name, in_name);
  }
  fail(op, "{} overlaps {}; an output must not share memory with another input or output", out_name,
       in_name);
}

void check_no_self_overlap(const char* op, const char* name, const Tensor& t) {
  if (is_empty(t) || plainly_distinct(t)) return;
  Terms terms;
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.shape(d) <= 1) continue;
    const Wide stride = static_cast<Wide>(t.stride(d)) * dtype_size(t.dtype());
    const bool repeated =
        std::any_of(terms.begin(), terms.end(), [&](const Term& x) { return x.stride == stride; });
    if (stride == 0 || repeated) {
      fail(op,
           "{} overlaps itself (stride {} in dimension {}); an output needs one address per "
           "element",
           name, t.stride(d), d);
    }
    terms.push({stride, -(t.shape(d) - 1), t.shape(d) - 1, true});
  }
  const Wide size = dtype_size(t.dtype());
  terms.push({1, -(size - 1), size - 1, false});
  // Two distinct elements share a byte: a nonzero index difference lands within one
  // element's bytes.
  LatticeSearch search(terms, true);
  if (search.solvable(0)) {
    fail(op,
         "{} of shape {} overlaps itself (its strides map two elements to one address); an "
         "output needs one address per element",
         name, shape_string(t));
  }
}

}  // namespace embrope::validate
