// A libFuzzer target for the C API on the CPU: the input bytes are decoded into one call of
// embrope_embed (or embrope_embed_quantized), embrope_apply_rope (multimodal sections included),
// embrope_apply_rope_cos_sin, embrope_apply_rope_backward, embrope_packed_positions,
// embrope_embed_backward, embrope_apply_qk_norm_rope (and its backward),
// embrope_apply_rope_append_kv (paged and contiguous caches, float8; with the qk-norm first,
// embrope_apply_qk_norm_rope_append_kv) or the cos/sin cache
// functions (every scaling variant), with embed's norm options (and embed_backward's), and
// arbitrary shapes, strides, dtypes, byte offsets, devices, options and contents (NaN,
// infinity, ids and positions at the int32/int64 limits), tensors that may alias one another,
// and deferred bad-index statuses.
//
// Every tensor lies inside a heap block allocated with exactly the extent the tensor
// describes (or, for a view the library must reject before touching memory, a small block),
// so AddressSanitizer reports any read or write the library makes outside a tensor. After the
// call the target checks the error model (embrope.h): the status is a known one and never
// INTERNAL or OUT_OF_MEMORY (no input here asks for much memory); on failure the message is
// non-empty and starts with the function's name, on success it is empty; a call rejected
// as an invalid argument (or not implemented) wrote nothing; and whatever its status, a call
// wrote nothing outside the elements of its outputs (no input, no byte between or around an
// output's elements in a block it shares).
//
// Built with -fsanitize=fuzzer (EMBROPE_BUILD_FUZZERS) it is the fuzzer; linked with
// replay_main.cpp it replays saved inputs (fuzz/regressions, fuzz/corpus) in every build.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "embrope/embrope.h"

static_assert(sizeof(DLDeviceType) == sizeof(int), "DLDeviceType is stored as an int");

namespace {

// Whether this machine has a GPU the library can use (then a CUDA rope cache is created for
// real, and a kDLCUDA label on the harness's host memory would break the contract).
bool gpu_usable() {
  static const bool usable = embrope_cuda_device_count() > 0;
  return usable;
}

// Reads the input front to back; past its end every read is zero.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return at_ < size_ ? data_[at_++] : 0; }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(u8()) << (8 * i);
    return v;
  }
  bool chance(int in_256) { return u8() < in_256; }
  // One of a few interesting 64-bit values, or raw bytes.
  std::int64_t extreme() {
    constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    const std::int64_t picks[] = {0,
                                  -1,
                                  1,
                                  kMin,
                                  kMax,
                                  std::numeric_limits<std::int32_t>::min(),
                                  std::numeric_limits<std::int32_t>::max(),
                                  std::int64_t{1} << 31,
                                  std::int64_t{1} << 32,
                                  kMax / 8,
                                  kMax / 2 + 1};
    const std::uint8_t k = u8();
    if (k < sizeof picks / sizeof picks[0]) return picks[k];
    return static_cast<std::int64_t>(u64());
  }
  double real() {
    const double picks[] = {10000.0,
                            0.0,
                            -1.0,
                            1e-300,
                            1e300,
                            std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            500000.0,
                            1.0};
    const std::uint8_t k = u8();
    if (k < sizeof picks / sizeof picks[0]) return picks[k];
    const std::uint64_t bits = u64();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

// A heap block of exactly the bytes a tensor spans.
struct Block {
  std::unique_ptr<unsigned char[]> bytes;
  std::size_t size = 0;
};

constexpr std::size_t kMaxBytes = 1 << 20;  // a valid view never spans more than this

struct Described {
  std::vector<std::int64_t> shape, strides;
  DLTensor t{};
  bool null_tensor = false;  // passed as a NULL DLTensor*
  // The largest element size it may be read with (Call::retype): its own where its block backs
  // the view; any where the library must refuse the view whatever its dtype, or where the
  // data is null (refused, or an empty view never touched); 0 where only its dtype makes the
  // library refuse it (the view then got a small block).
  std::size_t retype_bytes = 0;
};

// The element size of a dtype the library accepts for some argument (the DLPack dtypes of
// src/dlpack.cpp's to_dtype), or 0.
std::size_t library_dtype_bytes(DLDataType t) {
  if (t.lanes != 1) return 0;
  if ((t.code == kDLFloat && (t.bits == 32 || t.bits == 16)) ||
      (t.code == kDLBfloat && t.bits == 16) || (t.code == kDLInt && t.bits == 32) ||
      (t.code == kDLInt && t.bits == 64)) {
    return t.bits / 8;
  }
  const bool float8 = t.code == 10 || t.code == 12;  // kDLFloat8_e4m3fn, kDLFloat8_e5m2
  const bool byte = t.code == kDLUInt || t.code == kDLInt;
  return t.bits == 8 && (float8 || byte) ? 1 : 0;
}

// The furthest element of a view and its element count, exactly (128-bit).
struct Extent {
  bool empty = false;
  std::int64_t elements = 0;  // furthest offset + 1, when not empty
};

// Row-major strides where the tensor has none (as DLPack says), saturated like the library.
void fill_contiguous(Described& d, const DLTensor& t) {
  if (t.strides != nullptr) return;
  std::int64_t stride = 1;
  for (std::size_t i = d.shape.size(); i-- > 0;) {
    d.strides[i] = stride;
    const std::int64_t n = d.shape[i] > 0 ? d.shape[i] : 1;
    stride = stride > INT64_MAX / n ? INT64_MAX : stride * n;
  }
}

Extent extent(const Described& d) {
  Extent e;
  __int128 furthest = 0;
  for (std::size_t i = 0; i < d.shape.size(); ++i) {
    if (d.shape[i] == 0) e.empty = true;
    furthest += static_cast<__int128>(d.shape[i] - 1) * d.strides[i];
  }
  const __int128 cap = static_cast<__int128>(1) << 62;
  e.elements = static_cast<std::int64_t>(furthest + 1 > cap ? cap : furthest + 1);
  return e;
}

// Views the library rejects from their numbers alone: a negative size or stride, more than
// 2^61 elements, or elements past 2^61 (the library's limit is 2^60; the margin keeps this
// decision clear of the boundary).
bool view_rejected(Described& d, const DLTensor& t) {
  for (std::size_t i = 0; i < d.shape.size(); ++i) {
    if (d.shape[i] < 0) return true;
    if (t.strides != nullptr && d.strides[i] < 0) return true;
  }
  for (std::int64_t n : d.shape) {
    if (n == 0) return false;  // empty: never touched, any strides accepted
  }
  fill_contiguous(d, t);
  __int128 count = 1;
  for (std::int64_t n : d.shape) {
    count *= n;
    if (count > (static_cast<__int128>(1) << 61)) return true;
  }
  const Extent e = extent(d);
  return e.elements > (std::int64_t{1} << 61);
}

// All tensors and blocks of one call.
class Call {
 public:
  explicit Call(Bytes& in) : in_(in) {}

  // A tensor of `ndim` dimensions (hostile variations decoded from the input). `value`
  // chooses the usual dtype family; contents come from the input.
  DLTensor* tensor(int ndim, bool value, std::int64_t index_limit) {
    auto d = std::make_unique<Described>();
    DLTensor& t = d->t;
    // dtype
    const std::uint8_t dt = in_.u8();
    const DLDataType valid[] = {
        {kDLFloat, 32, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLInt, 32, 1}, {kDLInt, 64, 1}};
    if (dt < 232) {
      t.dtype = value ? valid[dt % 3] : valid[3 + dt % 2];
    } else if (dt < 240) {
      t.dtype = valid[dt % 5];
    } else {
      t.dtype = DLDataType{static_cast<std::uint8_t>(in_.u8() % 8), in_.u8(),
                           static_cast<std::uint16_t>(in_.u8() % 4)};
    }
    const bool known = library_dtype_bytes(t.dtype) != 0;
    const std::size_t es = known ? library_dtype_bytes(t.dtype) : 1;
    // rank
    if (in_.chance(4)) ndim = static_cast<int>(in_.u8() % 11) - 1;  // -1 .. 9
    t.ndim = ndim;
    const std::size_t dims = ndim > 0 && ndim <= 8 ? static_cast<std::size_t>(ndim) : 0;
    d->shape.resize(dims);
    d->strides.resize(dims);
    for (std::size_t i = 0; i < dims; ++i) {
      d->shape[i] = in_.chance(3) ? in_.extreme() : in_.u8() % 6;
    }
    const std::uint8_t layout = in_.u8();
    const bool explicit_strides = layout >= 96;
    for (std::size_t i = 0; i < dims; ++i) {
      // The last stride is 1 unless the input says otherwise.
      d->strides[i] = i + 1 == dims && layout < 224 ? 1 : in_.u8() % 40;
      if (in_.chance(3)) d->strides[i] = in_.extreme();
    }
    t.shape = dims > 0 ? d->shape.data() : nullptr;
    t.strides = explicit_strides && dims > 0 ? d->strides.data() : nullptr;
    bool null_shape = false;
    if (dims > 0 && in_.chance(2)) t.shape = nullptr, null_shape = true;
    t.device = DLDevice{kDLCPU, 0};
    if (in_.chance(4)) {
      // Any int, as a C caller may store it (not only DLDeviceType's enumerators).
      int type = in_.chance(32) ? static_cast<int>(in_.u64()) : in_.u8() % 14;
      // Host memory labelled kDLCUDA is outside the C API's contract when a GPU exists (the
      // library cannot tell host from device pointers, as no DLPack consumer can); there the
      // label becomes kDLCUDAHost, which the library refuses as it refuses every other type.
      if (type == kDLCUDA && gpu_usable()) type = kDLCUDAHost;
      std::memcpy(&t.device.device_type, &type, sizeof type);
      t.device.device_id = in_.u8() % 3;
    }

    // Does the library have to reject this view before touching memory? Then it gets a
    // small block. Otherwise it gets a block of exactly its extent, after shrinking any size
    // that would make the extent too large to allocate.
    int device_type;
    std::memcpy(&device_type, &t.device.device_type, sizeof device_type);
    const bool view_refused =
        ndim < 0 || ndim > 8 || null_shape || device_type != kDLCPU || view_rejected(*d, t);
    const bool rejected_early = !known || view_refused;
    std::size_t bytes = 16;
    if (!rejected_early) {
      for (;;) {
        fill_contiguous(*d, t);
        const Extent e = extent(*d);
        if (e.empty || e.elements * es <= kMaxBytes) {
          bytes = e.empty ? 0 : static_cast<std::size_t>(e.elements) * es;
          break;
        }
        // Too large to back: make it small, one step at a time (sizes and strides of any
        // size first, then sizes of 1), so that the loop ends.
        bool changed = false;
        for (std::size_t i = 0; i < dims; ++i) {
          if (d->shape[i] > 5) d->shape[i] = d->shape[i] % 6, changed = true;
          if (t.strides != nullptr && d->strides[i] > 40) {
            d->strides[i] = d->strides[i] % 40, changed = true;
          }
        }
        for (std::size_t i = 0; i < dims && !changed; ++i) {
          if (d->shape[i] > 1) d->shape[i] = 1, changed = true;
        }
      }
    }
    const std::size_t offset_elements = in_.chance(32) ? in_.u8() % 4 : 0;
    if (!rejected_early) bytes += offset_elements * es;

    // Data: an alias into an earlier block (when the view fits there), its own block, or null.
    const std::uint8_t where = in_.u8();
    unsigned char* base = nullptr;
    if (where < 40 && !blocks_.empty() && !rejected_early) {
      Block& other = *blocks_[in_.u8() % blocks_.size()];
      const std::size_t shift = es * (in_.u8() % 8);
      if (shift + bytes <= other.size) base = other.bytes.get() + shift;
    }
    if (base == nullptr && where >= 8) {
      blocks_.push_back(std::make_unique<Block>());
      Block& own = *blocks_.back();
      own.size = bytes;
      own.bytes.reset(new unsigned char[bytes]);
      base = own.bytes.get();
      fill(base, bytes, t.dtype, es, known && t.dtype.code == kDLInt, index_limit);
    }
    t.data = base;
    t.byte_offset = offset_elements * es;
    if (in_.chance(3)) {
      // Only offsets the library must refuse: misaligned, or wrapping the address space.
      const std::uint64_t wild = in_.chance(128) ? 1 : ~std::uint64_t{0} - in_.u8();
      const auto at = reinterpret_cast<std::uintptr_t>(base);
      if (wild % es != 0 || base == nullptr || wild > UINTPTR_MAX - at) t.byte_offset = wild;
    }
    if (in_.chance(3)) d->null_tensor = true;
    d->retype_bytes = view_refused || base == nullptr ? SIZE_MAX : rejected_early ? 0 : es;
    described_.push_back(std::move(d));
    return described_.back()->null_tensor ? nullptr : &described_.back()->t;
  }

  // Reads `t` (one of this call's tensors) as `dtype` where that is safe (Described's
  // retype_bytes): where its block backs the view with elements at least that large, or where
  // the library must refuse the view whatever its dtype; never where only its dtype made it a
  // view to refuse (given a small block). Reads no input.
  void retype(DLTensor* t, DLDataType dtype) {
    if (t == nullptr) return;
    for (const auto& d : described_) {
      if (&d->t != t) continue;
      const std::size_t bytes = library_dtype_bytes(dtype);
      if (bytes != 0 && bytes <= d->retype_bytes) t->dtype = dtype;
      return;
    }
  }

  // The blocks' bytes before a call: all of them (a rejected call writes nothing), and those
  // outside the elements of `written`, the tensors the call may write (any call writes its
  // outputs' elements and nothing else: no input, no byte between or around an output's
  // elements in a block it shares).
  struct Snapshot {
    std::vector<unsigned char> all, outside;
    std::vector<const DLTensor*> written;
  };
  Snapshot snapshot(std::initializer_list<const DLTensor*> written = {}) const {
    Snapshot s;
    for (const auto& b : blocks_)
      s.all.insert(s.all.end(), b->bytes.get(), b->bytes.get() + b->size);
    s.written.assign(written.begin(), written.end());
    s.outside = outside(s.written);
    return s;
  }

  // The bytes of every block outside the elements of `written` (null entries ignored).
  std::vector<unsigned char> outside(const std::vector<const DLTensor*>& written) const {
    std::vector<std::vector<bool>> in_output(blocks_.size());
    for (std::size_t b = 0; b < blocks_.size(); ++b) in_output[b].assign(blocks_[b]->size, false);
    for (const DLTensor* t : written) {
      for (const auto& d : described_) {
        if (t != nullptr && &d->t == t) mark_elements(*d, in_output);
      }
    }
    std::vector<unsigned char> bytes;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      for (std::size_t i = 0; i < blocks_[b]->size; ++i) {
        if (!in_output[b][i]) bytes.push_back(blocks_[b]->bytes[i]);
      }
    }
    return bytes;
  }

 private:
  // Contents: indices mostly inside [0, index_limit), sometimes anything; values raw bytes
  // (NaN, infinity and subnormals included).
  void fill(unsigned char* p, std::size_t bytes, DLDataType dtype, std::size_t es, bool index,
            std::int64_t index_limit) {
    if (!index || es < 4) {
      for (std::size_t i = 0; i < bytes; ++i) p[i] = in_.u8();
      return;
    }
    for (std::size_t i = 0; i + es <= bytes; i += es) {
      std::int64_t v =
          in_.chance(16) ? in_.extreme() : static_cast<std::int64_t>(in_.u8()) % (index_limit + 1);
      if (dtype.bits == 32) {
        const auto v32 = static_cast<std::int32_t>(v);
        std::memcpy(p + i, &v32, 4);
      } else {
        std::memcpy(p + i, &v, 8);
      }
    }
  }

  // Marks in `in_output` the bytes of the blocks that hold an element of `d`'s view, as its
  // dtype now reads it. A view the library must refuse (no shape, a negative size or stride, a
  // dtype it does not know, an address outside every block) marks nothing: a call given it
  // fails and writes nothing.
  void mark_elements(const Described& d, std::vector<std::vector<bool>>& in_output) const {
    const DLTensor& t = d.t;
    const std::size_t es = library_dtype_bytes(t.dtype);
    if (es == 0 || t.data == nullptr || t.shape == nullptr || t.ndim <= 0 ||
        static_cast<std::size_t>(t.ndim) != d.shape.size()) {
      return;
    }
    const std::size_t dims = d.shape.size();
    std::vector<std::int64_t> strides(dims);
    __int128 count = 1;
    for (std::size_t i = dims; i-- > 0;) {
      if (d.shape[i] <= 0) return;  // empty (or refused): no element
      strides[i] = t.strides != nullptr ? t.strides[i]
                   : i + 1 == dims      ? 1
                                        : strides[i + 1] * d.shape[i + 1];
      if (strides[i] < 0) return;
      count *= d.shape[i];
      if (count > (1 << 22)) return;  // never the case of a view a call accepts here
    }
    const auto start = reinterpret_cast<std::uintptr_t>(t.data) + t.byte_offset;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const auto base = reinterpret_cast<std::uintptr_t>(blocks_[b]->bytes.get());
      const std::size_t size = blocks_[b]->size;
      if (start < base || start >= base + size) continue;
      std::vector<std::int64_t> index(dims, 0);
      for (;;) {
        __int128 offset = 0;
        for (std::size_t i = 0; i < dims; ++i)
          offset += static_cast<__int128>(index[i]) * strides[i];
        const __int128 first = static_cast<__int128>(start - base) + offset * es;
        for (std::size_t k = 0; k < es; ++k) {
          if (first + k < size) in_output[b][static_cast<std::size_t>(first + k)] = true;
        }
        std::size_t i = dims;
        while (i-- > 0 && ++index[i] == d.shape[i]) index[i] = 0;
        if (i == SIZE_MAX) break;
      }
    }
  }

  Bytes& in_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::unique_ptr<Described>> described_;
};

[[noreturn]] void broken(const char* function, const char* what, int status) {
  std::fprintf(stderr, "fuzz invariant broken: %s: %s (status %d, message \"%s\")\n", function,
               what, status, embrope_last_error());
  std::abort();
}

// The error model of embrope.h, after one call. deferred_given: the call's options carried a
// deferred status, so a bad id or position is recorded there, never returned.
void check(const char* function, embrope_status_t status, const Call::Snapshot& before,
           const Call& call, bool deferred_given = false) {
  const int s = static_cast<int>(status);
  const std::string message = embrope_last_error();
  if (s < EMBROPE_OK || s > EMBROPE_ERROR_INTERNAL) broken(function, "unknown status", s);
  if (status == EMBROPE_ERROR_INTERNAL) broken(function, "internal error", s);
  if (status == EMBROPE_ERROR_OUT_OF_MEMORY) broken(function, "out of memory", s);
  if (call.outside(before.written) != before.outside) {
    broken(function, "a call wrote outside its outputs' elements", s);
  }
  if (status == EMBROPE_OK) {
    if (!message.empty()) broken(function, "a message after success", s);
    return;
  }
  if (status == EMBROPE_ERROR_INDEX_OUT_OF_RANGE && deferred_given) {
    broken(function, "index out of range returned where a deferred status was given", s);
  }
  if (message.rfind(std::string(function) + ": ", 0) != 0) {
    broken(function, "the message does not start with the function's name", s);
  }
  if ((status == EMBROPE_ERROR_INVALID_ARGUMENT || status == EMBROPE_ERROR_NOT_IMPLEMENTED) &&
      call.snapshot().all != before.all) {
    broken(function, "a rejected call wrote to a tensor", s);
  }
}

// Stores a C enum field as the raw integer a C caller may put there.
template <typename Enum>
void set_enum(Enum& field, int value) {
  std::memcpy(&field, &value, sizeof value < sizeof field ? sizeof value : sizeof field);
}

embrope_rope_cache_t* make_cache(Bytes& in, std::int64_t* rotary_dim, std::int64_t* positions) {
  embrope_rope_config_t config;
  embrope_rope_config_init(&config);
  config.rotary_dim = 2 * (in.u8() % 17);
  if (in.chance(16)) config.rotary_dim = in.chance(128) ? in.u8() % 40 : in.extreme();
  config.max_positions = in.u8() % 64;
  // Large only where the library must refuse (negative, or a table size past int64).
  if (in.chance(8)) config.max_positions = in.chance(128) ? -in.u8() : in.extreme();
  if (config.max_positions > 4096 && config.max_positions < (std::int64_t{1} << 59)) {
    config.max_positions = 4096;
  }
  // A huge rotary dim only where the table size is refused: one the checks accept (max_positions
  // 1 and R near 2^60, say) asks for that much memory, an out_of_memory error this target does
  // not expect (tests/test_rope_cache.cpp checks that one).
  const bool size_refused =
      config.max_positions <= 0 ||
      (config.rotary_dim > 0 && config.max_positions > (INT64_MAX / 8) / config.rotary_dim);
  if (config.rotary_dim > 64 && !size_refused) config.rotary_dim = 64;
  config.base = in.chance(16) ? in.real() : 10000.0;
  // A scaling variant with arbitrary parameters (the factor arrays exactly as long as said).
  std::vector<double> short_factor, long_factor;
  if (in.chance(64)) {
    set_enum(config.scaling, in.chance(16) ? static_cast<int>(in.u64()) : in.u8() % 6);
    config.factor = in.chance(64) ? in.real() : 1.0 + in.u8() % 40;
    config.original_max_positions = in.chance(32) ? in.extreme() : in.u8() % 64;
    config.sequence_length = in.chance(32) ? in.extreme() : in.u8() % 128;
    if (in.chance(32)) config.beta_fast = in.real();
    if (in.chance(32)) config.beta_slow = in.real();
    config.truncate = in.u8() % 2;
    if (in.chance(32)) config.mscale = in.real();
    if (in.chance(32)) config.mscale_all_dim = in.real();
    if (in.chance(32)) config.low_freq_factor = in.real();
    if (in.chance(32)) config.high_freq_factor = in.real();
    if (in.chance(32)) config.attention_factor = in.real();
    if (in.chance(64)) {
      const std::size_t n = in.u8() % 40;
      for (std::size_t i = 0; i < n; ++i) {
        short_factor.push_back(in.chance(16) ? in.real() : 1.0 + (in.u8() % 16));
        long_factor.push_back(in.chance(16) ? in.real() : 1.0 + (in.u8() % 64));
      }
      config.short_factor = short_factor.data();
      config.long_factor = long_factor.data();
      config.num_factors = in.chance(16) ? in.extreme() : static_cast<std::int64_t>(n);
      if (config.num_factors > static_cast<std::int64_t>(n)) {
        config.num_factors = static_cast<std::int64_t>(n);  // never read past the arrays
      }
    }
  }
  DLDevice device{kDLCPU, 0};
  if (in.chance(4)) {
    const int type = in.chance(32) ? static_cast<int>(in.u64()) : in.u8() % 14;
    std::memcpy(&device.device_type, &type, sizeof type);
  }
  embrope_rope_cache_t* cache = reinterpret_cast<embrope_rope_cache_t*>(&config);  // not a handle
  const embrope_status_t status =
      embrope_rope_cache_create(&config, device, nullptr, in.chance(2) ? nullptr : &cache);
  Bytes none(nullptr, 0);
  Call empty(none);
  check("embrope_rope_cache_create", status, empty.snapshot(), empty);
  if (status != EMBROPE_OK) {
    if (cache != reinterpret_cast<embrope_rope_cache_t*>(&config) && cache != nullptr) {
      broken("embrope_rope_cache_create", "a handle after failure", status);
    }
    return nullptr;
  }
  *rotary_dim = config.rotary_dim;
  *positions = config.max_positions;
  // info and copy_to_host agree with the configuration.
  embrope_rope_config_t info;
  embrope_rope_config_init(&info);
  DLDevice where;
  if (embrope_rope_cache_info(cache, &info, &where) != EMBROPE_OK ||
      info.rotary_dim != config.rotary_dim || info.max_positions != config.max_positions ||
      std::memcmp(&where.device_type, &device.device_type, sizeof device.device_type) != 0 ||
      where.device_id != device.device_id) {
    broken("embrope_rope_cache_info", "disagrees with the configuration", 0);
  }
  const auto half = static_cast<std::size_t>(config.rotary_dim / 2 * config.max_positions);
  std::unique_ptr<float[]> c(new float[half]), s(new float[half]);
  const embrope_status_t copied =
      embrope_rope_cache_copy_to_host(cache, in.chance(4) ? nullptr : c.get(), s.get());
  check("embrope_rope_cache_copy_to_host", copied, empty.snapshot(), empty);
  // The frequencies agree with the cache (its row 1), and cos^2 + sin^2 is the squared
  // attention factor, up to float32 rounding.
  std::vector<double> inv(static_cast<std::size_t>(config.rotary_dim / 2));
  double m = 0.0;
  if (embrope_rope_frequencies(&config, inv.data(), static_cast<std::int64_t>(inv.size()), &m) !=
      EMBROPE_OK) {
    broken("embrope_rope_frequencies", "fails for a configuration that built a cache", 0);
  }
  if (copied == EMBROPE_OK && config.max_positions > 1) {
    // Row 1 holds the angles 1 * inv[i] themselves: m cos(inv[i]) and m sin(inv[i]), each
    // rounded once to float32 from the exact value.
    const std::size_t pairs = inv.size();
    for (std::size_t i = 0; i < pairs; ++i) {
      const double want_cos = m * std::cos(inv[i]), want_sin = m * std::sin(inv[i]);
      if (!(std::fabs(c[pairs + i] - want_cos) <= 1e-6 * m &&
            std::fabs(s[pairs + i] - want_sin) <= 1e-6 * m)) {
        std::fprintf(stderr, "pair %zu: cos %g sin %g, frequency %g, attention factor %g\n", i,
                     static_cast<double>(c[pairs + i]), static_cast<double>(s[pairs + i]), inv[i],
                     m);
        broken("embrope_rope_frequencies", "disagrees with the cache's row 1", 0);
      }
    }
  }
  if (copied == EMBROPE_OK) {
    for (std::size_t i = 0; i < half; ++i) {
      const double r = static_cast<double>(c[i]) * c[i] + static_cast<double>(s[i]) * s[i];
      if (!(std::fabs(r - m * m) <= 1e-6 * m * m)) {
        std::fprintf(stderr, "value %zu: cos %g sin %g, attention factor %g, scaling %d\n", i,
                     static_cast<double>(c[i]), static_cast<double>(s[i]), m,
                     static_cast<int>(config.scaling));
        broken("embrope_rope_cache_copy_to_host", "cos^2+sin^2 != attention factor^2", 0);
      }
    }
  }
  return cache;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  // First byte: 0-223 keep the four original ops (so older corpus inputs still decode as they
  // did), 224-247 pick the next three, 248-254 qk-norm + RoPE and its backward, 255 RoPE +
  // KV-cache append.
  const std::uint8_t first = in.u8();
  const std::uint8_t op = first == 255   ? 9
                          : first >= 248 ? 7 + (first - 248) % 2
                          : first >= 224 ? 4 + (first - 224) % 3
                                         : first % 4;
  Call call(in);
  // Sometimes the ops record bad rows in a deferred status instead of failing; it is checked
  // (and must then report through embrope_deferred_status_check) after the call.
  embrope_deferred_status_t* deferred = nullptr;
  if (in.chance(48)) {
    if (embrope_deferred_status_create(DLDevice{kDLCPU, 0}, &deferred) != EMBROPE_OK) {
      broken("embrope_deferred_status_create", "fails on the CPU", 0);
    }
  }
  struct ReleaseDeferred {
    embrope_deferred_status_t* status;
    ~ReleaseDeferred() {
      if (status != nullptr) {
        const embrope_status_t s = embrope_deferred_status_check(status, nullptr);
        if (s != EMBROPE_OK && s != EMBROPE_ERROR_INDEX_OUT_OF_RANGE) {
          broken("embrope_deferred_status_check", "an unexpected status", s);
        }
        embrope_deferred_status_destroy(status);
      }
    }
  } release_deferred{deferred};

  if (op == 0) {
    const int ids_rank = in.u8() % 4;
    const std::int64_t vocab_hint = 8;
    const DLTensor* table = call.tensor(2, true, 0);
    const DLTensor* ids = call.tensor(ids_rank, false, vocab_hint);
    const DLTensor* out = call.tensor(ids_rank + 1, true, 0);
    embrope_embed_options_t o;
    embrope_embed_options_init(&o);
    const bool with_options = !in.chance(16);
    if (in.chance(64)) {
      std::uint32_t bits = static_cast<std::uint32_t>(in.u64());
      std::memcpy(&o.scale, &bits, 4);
    }
    if (in.chance(32)) o.vocab_start = in.chance(128) ? in.u8() % 8 : in.extreme();
    o.vocab_shard = in.chance(64) ? 1 : 0;
    set_enum(o.positions, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 3);
    if (in.chance(128)) o.position_table = call.tensor(2, true, 0);
    if (in.chance(32)) o.sinusoid_base = in.real();
    set_enum(o.sinusoid_layout, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 2);
    const std::uint8_t positions = in.u8();
    if (positions < 80) o.position_ids = call.tensor(ids_rank, false, 16);
    if (positions >= 80 && positions < 160) o.position_offsets = call.tensor(1, false, 8);
    if (in.chance(64)) {
      o.type_table = call.tensor(2, true, 0);
      o.type_ids = call.tensor(ids_rank, false, 3);
    }
    // The norm, read last so that older inputs (whose bytes end before it) keep decoding to no
    // norm: a zero byte past the end selects none.
    const std::uint8_t norm = in.u8();
    if (norm >= 160) {
      set_enum(o.norm, norm >= 250 ? static_cast<int>(in.u64()) : 1 + norm % 2);
      if (in.u8() >= 64) o.norm_weight = call.tensor(1, true, 0);
      if (in.u8() >= 96) o.norm_bias = call.tensor(1, true, 0);
      if (in.u8() >= 224) {
        std::uint32_t bits = static_cast<std::uint32_t>(in.u64());
        std::memcpy(&o.norm_eps, &bits, 4);
      }
      o.norm_unit_offset = in.u8() >= 192 ? 1 : 0;
      if (in.u8() >= 128) o.pre_norm_out = call.tensor(ids_rank + 1, true, 0);
    }
    o.deferred = deferred;
    // A quantized table (embrope_embed_quantized) instead: decided by a byte read after all the
    // others, 0 (an input that ends before it) meaning the float table, so that older inputs
    // decode as they did. Its data is a block read with 1-byte elements (a smaller extent),
    // mostly in its format's dtype; D mostly what the data's columns hold; scales and zero
    // points of any rank and dtype (zero points now and then int8).
    if (in.u8() >= 192) {
      embrope_quantized_table_t q;
      embrope_quantized_table_init(&q);
      const std::uint8_t f = in.u8();
      const int format = f >= 250 ? static_cast<int>(in.u64()) : f % 8;
      set_enum(q.format, format);
      DLTensor* data = call.tensor(2, true, 0);
      if (data != nullptr && in.chance(224)) {
        call.retype(data, format == EMBROPE_QUANT_INT8            ? DLDataType{kDLInt, 8, 1}
                          : format == EMBROPE_QUANT_FLOAT8_E4M3FN ? DLDataType{10, 8, 1}
                          : format == EMBROPE_QUANT_FLOAT8_E5M2   ? DLDataType{12, 8, 1}
                                                                  : DLDataType{kDLUInt, 8, 1});
      }
      q.data = data;
      q.dim = in.chance(32) ? in.extreme() : in.u8() % 12;
      if (data != nullptr && data->ndim == 2 && data->shape != nullptr && in.chance(160)) {
        const std::int64_t columns = data->shape[1];  // any value: doubled only where it fits
        const bool doubles =
            columns > -(std::int64_t{1} << 61) && columns < (std::int64_t{1} << 61);
        q.dim = format == EMBROPE_QUANT_INT4 && doubles ? 2 * columns : columns;
      }
      q.scales = in.chance(200) ? call.tensor(in.u8() % 3, true, 0) : nullptr;
      DLTensor* zero_points = in.chance(96) ? call.tensor(in.u8() % 3, true, 0) : nullptr;
      if (zero_points != nullptr && in.chance(128)) call.retype(zero_points, {kDLInt, 8, 1});
      q.zero_points = zero_points;
      const Call::Snapshot before = call.snapshot({out, with_options ? o.pre_norm_out : nullptr});
      const embrope_status_t s = embrope_embed_quantized(in.chance(8) ? nullptr : &q, ids, out,
                                                         with_options ? &o : nullptr, nullptr);
      check("embrope_embed_quantized", s, before, call, with_options && deferred != nullptr);
      return 0;
    }
    const Call::Snapshot before = call.snapshot({out, with_options ? o.pre_norm_out : nullptr});
    const embrope_status_t s = embrope_embed(table, ids, out, with_options ? &o : nullptr, nullptr);
    check("embrope_embed", s, before, call, with_options && deferred != nullptr);
    return 0;
  }

  if (op == 1 || op == 2) {
    std::int64_t rotary_dim = 0, max_positions = 0;
    embrope_rope_cache_t* cache = op == 1 ? make_cache(in, &rotary_dim, &max_positions) : nullptr;
    const int rank = 3 + in.u8() % 2;
    const DLTensor* q = call.tensor(rank, true, 0);
    const DLTensor* k = in.chance(200) ? call.tensor(rank, true, 0) : nullptr;
    const DLTensor* positions = call.tensor(rank - 2, false, max_positions > 0 ? max_positions : 8);
    const DLTensor* cos = op == 2 ? call.tensor(2, true, 0) : nullptr;
    const DLTensor* sin = op == 2 ? (in.chance(16) ? cos : call.tensor(2, true, 0)) : nullptr;
    embrope_rope_options_t o;
    embrope_rope_options_init(&o);
    const bool with_options = !in.chance(16);
    set_enum(o.layout, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 2);
    o.inverse = in.u8() % 2;
    if (in.chance(32)) o.rotary_dim = in.chance(128) ? in.u8() % 40 : in.extreme();
    const std::uint8_t outputs = in.u8();
    // Out of place, in place by passing q itself, or in place by omission.
    if (outputs < 64) o.q_out = call.tensor(rank, true, 0);
    if (outputs >= 64 && outputs < 96) o.q_out = const_cast<DLTensor*>(q);
    if (in.chance(64)) o.k_out = call.tensor(rank, true, 0);
    if (in.chance(32)) {
      for (std::int64_t& section : o.mrope_section) {
        section = in.chance(32) ? in.extreme() : in.u8() % 40;
      }
    }
    // Float8 outputs: the output blocks read with 1-byte elements (a smaller extent), scales
    // (any bits now and then) and per-head scales of any shape and dtype.
    if (in.u8() >= 128) {
      const auto code = static_cast<std::uint8_t>(in.u8() % 2 ? 10 : 12);
      if (o.q_out != nullptr && o.q_out != q) call.retype(o.q_out, {code, 8, 1});
      if (o.k_out != nullptr && in.chance(224)) call.retype(o.k_out, {code, 8, 1});
      for (float* scale : {&o.q_out_scale, &o.k_out_scale}) {
        if (in.chance(32)) {
          const auto bits = static_cast<std::uint32_t>(in.u64());
          std::memcpy(scale, &bits, 4);
        } else {
          *scale = static_cast<float>(1 + in.u8() % 8) / 4.0f;
        }
      }
      if (in.chance(96)) o.q_out_head_scales = call.tensor(1, true, 0);
      if (in.chance(96)) o.k_out_head_scales = call.tensor(1, true, 0);
    }
    o.deferred = deferred;
    const embrope_rope_cache_t* table = op == 1 && in.chance(4) ? nullptr : cache;
    // Float8 outputs' non-rotary tensors (q_nope, k_nope and their outputs, mostly of q_out's
    // dtype): decided by a byte read after all the others, 0 (an input that ends before it)
    // meaning none, so that older inputs decode as they did.
    if (in.u8() >= 176) {
      const DLDataType out_dtype =
          o.q_out != nullptr ? o.q_out->dtype : DLDataType{static_cast<std::uint8_t>(10), 8, 1};
      const auto pair = [&](const DLTensor*& nope, DLTensor*& out) {
        nope = call.tensor(rank, true, 0);
        out = call.tensor(rank, true, 0);
        if (out != nullptr && in.chance(224)) call.retype(out, out_dtype);
      };
      if (in.u8() >= 48) pair(o.q_nope, o.q_nope_out);
      if (in.u8() >= 96) pair(o.k_nope, o.k_nope_out);
    }
    // Axial RoPE, decided by the bytes after those (none in an older input): axes_dim (any
    // values now and then), and an axial cache of 0 to 5 axes in place of the table.
    embrope_rope_cache_t* axial_cache = nullptr;
    const std::uint8_t axial = in.u8();
    if (axial >= 160) {
      for (std::int64_t& dim : o.axes_dim) dim = in.chance(32) ? in.extreme() : (in.u8() % 5) * 8;
    }
    if (op == 1 && axial >= 208) {
      embrope_rope_config_t axes[5];
      const embrope_rope_config_t* axis_pointers[5];
      const std::size_t n = in.u8() % 6;
      const std::int64_t rows = in.u8() % 40;
      for (std::size_t a = 0; a < 5; ++a) {
        embrope_rope_config_init(&axes[a]);
        axes[a].rotary_dim = (in.u8() % 5) * 8 + (in.chance(16) ? 1 : 0);
        axes[a].base = in.chance(16) ? in.real() : 10000.0;
        axes[a].max_positions = in.chance(16) ? in.extreme() : rows;
        // Large only where the library must refuse (as make_cache): a table the checks accept
        // at 2^31 rows asks for gigabytes, an out_of_memory error this target does not expect.
        if (axes[a].max_positions > 4096 && axes[a].max_positions < (std::int64_t{1} << 59)) {
          axes[a].max_positions = 4096;
        }
        axis_pointers[a] = &axes[a];
      }
      const embrope_status_t created = embrope_rope_cache_create_axial(
          in.chance(8) ? nullptr : axis_pointers, n, DLDevice{kDLCPU, 0}, nullptr, &axial_cache);
      Bytes none(nullptr, 0);
      Call empty(none);
      check("embrope_rope_cache_create_axial", created, empty.snapshot(), empty);
      if (created == EMBROPE_OK) {
        std::int64_t dims[4] = {};
        if (embrope_rope_cache_axes_dim(axial_cache, dims) != EMBROPE_OK) {
          broken("embrope_rope_cache_axes_dim", "an axial cache's axes", created);
        }
        table = axial_cache;
      } else if (axial_cache != nullptr) {
        broken("embrope_rope_cache_create_axial", "a handle after failure", created);
      }
    }
    // In place where no output is given (all of the options ignored without them).
    const Call::Snapshot before =
        with_options ? call.snapshot({o.q_out != nullptr ? o.q_out : q,
                                      o.k_out != nullptr ? o.k_out : k, o.q_nope_out, o.k_nope_out})
                     : call.snapshot({q, k});
    const embrope_status_t s =
        op == 1 ? embrope_apply_rope(q, k, positions, table, with_options ? &o : nullptr, nullptr)
                : embrope_apply_rope_cos_sin(q, k, positions, cos, sin, with_options ? &o : nullptr,
                                             nullptr);
    check(op == 1 ? "embrope_apply_rope" : "embrope_apply_rope_cos_sin", s, before, call,
          with_options && deferred != nullptr);
    embrope_rope_cache_destroy(cache);
    embrope_rope_cache_destroy(axial_cache);
    return 0;
  }

  if (op == 4) {
    // cu_seqlens [B + 1], optional start_offsets [B], positions [T]: shapes and contents
    // arbitrary (mostly invalid contents, which must be reported, never followed).
    const DLTensor* cu_seqlens = call.tensor(1, false, 64);
    const DLTensor* start_offsets = in.chance(128) ? call.tensor(1, false, 1000) : nullptr;
    const DLTensor* positions =
        in.chance(16) ? cu_seqlens : call.tensor(1 + (in.chance(16) ? 1 : 0), false, 64);
    const Call::Snapshot before = call.snapshot({positions});
    check("embrope_packed_positions",
          embrope_packed_positions(cu_seqlens, start_offsets, positions, deferred, nullptr), before,
          call, deferred != nullptr);
    return 0;
  }

  if (op == 5) {
    const int ids_rank = in.u8() % 3;
    const DLTensor* grad_out = call.tensor(ids_rank + 1, true, 0);
    const DLTensor* ids = call.tensor(ids_rank, false, 8);
    const DLTensor* grad_table = in.chance(224) ? call.tensor(2, true, 0) : nullptr;
    embrope_embed_backward_options_t o;
    embrope_embed_backward_options_init(&o);
    if (in.chance(32)) {
      std::uint32_t bits = static_cast<std::uint32_t>(in.u64());
      std::memcpy(&o.scale, &bits, 4);
    }
    if (in.chance(32)) o.vocab_start = in.chance(128) ? in.u8() % 8 : in.extreme();
    o.vocab_shard = in.chance(64) ? 1 : 0;
    o.has_padding_idx = in.chance(64) ? 1 : 0;
    o.padding_idx = in.chance(32) ? in.extreme() : in.u8() % 8;
    if (in.chance(96)) o.grad_position_table = call.tensor(2, true, 0);
    const std::uint8_t positions = in.u8();
    if (positions < 64) o.position_ids = call.tensor(ids_rank, false, 16);
    if (positions >= 64 && positions < 96) o.position_offsets = call.tensor(1, false, 8);
    if (in.chance(48)) {
      o.grad_type_table = call.tensor(2, true, 0);
      o.type_ids = call.tensor(ids_rank, false, 3);
    }
    set_enum(o.mode, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 2);
    o.deferred = deferred;
    // embed's norm: read after every older decision, so that older inputs (whose bytes have
    // run out here: 0) decode as they did, without a norm.
    if (in.u8() >= 160) {
      set_enum(o.norm, in.chance(8) ? static_cast<int>(in.u64()) : 1 + in.u8() % 2);
      if (in.chance(240)) o.pre_norm = call.tensor(ids_rank + 1, true, 0);
      if (in.chance(128)) o.norm_weight = call.tensor(1, true, 0);
      if (in.chance(32)) {
        std::uint32_t bits = static_cast<std::uint32_t>(in.u64());
        std::memcpy(&o.norm_eps, &bits, 4);
      }
      o.norm_unit_offset = in.chance(32) ? 1 : 0;
      if (in.chance(96)) o.grad_pre_norm = call.tensor(ids_rank + 1, true, 0);
      if (in.chance(160)) o.grad_norm_weight = call.tensor(1, true, 0);
      if (in.chance(96)) o.grad_norm_bias = call.tensor(1, true, 0);
    }
    const bool with_options = !in.chance(16);
    const Call::Snapshot before =
        with_options ? call.snapshot({grad_table, o.grad_position_table, o.grad_type_table,
                                      o.grad_norm_weight, o.grad_norm_bias})
                     : call.snapshot({grad_table});
    check("embrope_embed_backward",
          embrope_embed_backward(grad_out, ids, grad_table, with_options ? &o : nullptr, nullptr),
          before, call, with_options && deferred != nullptr);
    return 0;
  }

  if (op == 6) {
    std::int64_t rotary_dim = 0, max_positions = 0;
    embrope_rope_cache_t* cache = make_cache(in, &rotary_dim, &max_positions);
    const int rank = 3 + in.u8() % 2;
    const DLTensor* dq = call.tensor(rank, true, 0);
    const DLTensor* dk = in.chance(128) ? call.tensor(rank, true, 0) : nullptr;
    const DLTensor* positions = call.tensor(rank - 2, false, max_positions > 0 ? max_positions : 8);
    embrope_rope_options_t o;
    embrope_rope_options_init(&o);
    set_enum(o.layout, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 2);
    o.deferred = deferred;
    const Call::Snapshot before = call.snapshot({dq, dk});
    check("embrope_apply_rope_backward",
          embrope_apply_rope_backward(dq, dk, positions, cache, &o, nullptr), before, call,
          deferred != nullptr);
    embrope_rope_cache_destroy(cache);
    return 0;
  }

  if (op == 7 || op == 8) {
    // qk-norm + RoPE: the RoPE arguments, the norm's weights and eps; the backward adds the
    // output gradients (the tensors written) and the weight gradients.
    std::int64_t rotary_dim = 0, max_positions = 0;
    embrope_rope_cache_t* cache = make_cache(in, &rotary_dim, &max_positions);
    const int rank = 3 + in.u8() % 2;
    const DLTensor* q = call.tensor(rank, true, 0);
    const DLTensor* k = in.chance(160) ? call.tensor(rank, true, 0) : nullptr;
    const DLTensor* positions = call.tensor(rank - 2, false, max_positions > 0 ? max_positions : 8);
    embrope_qk_norm_t n;
    embrope_qk_norm_init(&n);
    if (in.chance(160)) n.q_weight = call.tensor(1, true, 0);
    if (in.chance(128)) n.k_weight = call.tensor(1, true, 0);
    if (in.chance(32)) {
      std::uint32_t bits = static_cast<std::uint32_t>(in.u64());
      std::memcpy(&n.eps, &bits, 4);
    }
    n.unit_offset = in.chance(64) ? 1 : 0;
    embrope_rope_options_t o;
    embrope_rope_options_init(&o);
    set_enum(o.layout, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 2);
    o.inverse = in.u8() % 2;
    if (in.chance(32)) {
      for (std::int64_t& section : o.mrope_section) section = in.u8() % 40;
      o.mrope_interleaved = in.u8() % 2;
    }
    if (in.chance(64)) o.q_out = call.tensor(rank, true, 0);
    if (in.chance(48)) o.k_out = call.tensor(rank, true, 0);
    o.deferred = deferred;
    const embrope_qk_norm_t* norm = in.chance(16) ? nullptr : &n;
    const embrope_rope_cache_t* table = in.chance(4) ? nullptr : cache;
    if (op == 7) {
      const Call::Snapshot before =
          call.snapshot({o.q_out != nullptr ? o.q_out : q, o.k_out != nullptr ? o.k_out : k});
      check("embrope_apply_qk_norm_rope",
            embrope_apply_qk_norm_rope(q, k, positions, table, norm, &o, nullptr), before, call,
            deferred != nullptr);
    } else {
      const DLTensor* dq = call.tensor(rank, true, 0);
      const DLTensor* dk = k != nullptr && in.chance(224) ? call.tensor(rank, true, 0) : nullptr;
      embrope_qk_norm_gradients_t g;
      embrope_qk_norm_gradients_init(&g);
      if (in.chance(128)) g.q_weight = call.tensor(1, true, 0);
      if (in.chance(96)) g.k_weight = call.tensor(1, true, 0);
      const embrope_qk_norm_gradients_t* grads = in.chance(16) ? nullptr : &g;
      const Call::Snapshot before = call.snapshot(
          {o.q_out != nullptr ? o.q_out : dq, o.k_out != nullptr ? o.k_out : dk,
           grads != nullptr ? g.q_weight : nullptr, grads != nullptr ? g.k_weight : nullptr});
      check("embrope_apply_qk_norm_rope_backward",
            embrope_apply_qk_norm_rope_backward(dq, dk, q, k, positions, table, norm, grads, &o,
                                                nullptr),
            before, call, deferred != nullptr);
    }
    embrope_rope_cache_destroy(cache);
    return 0;
  }

  if (op == 9) {
    // RoPE + KV-cache append: q, k, v and positions, and a cache written through slot_mapping
    // (paged; -1 skips) or cache_offsets (contiguous; cu_seqlens for packed inputs), separate
    // or combined [pages, 2, ...], NHD or HND, in a value dtype or float8 with scales.
    std::int64_t rotary_dim = 0, max_positions = 0;
    embrope_rope_cache_t* cache = make_cache(in, &rotary_dim, &max_positions);
    const int rank = 3 + in.u8() % 2;
    const DLTensor* q = call.tensor(rank, true, 0);
    DLTensor* k = call.tensor(rank, true, 0);
    const DLTensor* v = call.tensor(rank, true, 0);
    const DLTensor* positions = call.tensor(rank - 2, false, max_positions > 0 ? max_positions : 8);
    embrope_kv_cache_t kv;
    embrope_kv_cache_init(&kv);
    // A float8 cache: the same block read with 1-byte elements (a smaller extent); a tensor
    // may be null (a hostile variation).
    const auto maybe_float8 = [&](DLTensor* t) {
      if (in.u8() >= 160 && t != nullptr)
        call.retype(t, {static_cast<std::uint8_t>(in.u8() % 2 ? 10 : 12), 8, 1});
      return t;
    };
    if (in.u8() >= 48) {
      kv.k_cache = maybe_float8(call.tensor(4, true, 0));
      kv.v_cache = in.chance(16) ? kv.k_cache : maybe_float8(call.tensor(4, true, 0));
    } else {
      kv.kv_cache = maybe_float8(call.tensor(5, true, 0));
    }
    set_enum(kv.layout, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 2);
    for (float* scale : {&kv.k_scale, &kv.v_scale}) {
      if (in.chance(64)) {
        std::uint32_t bits = static_cast<std::uint32_t>(in.u64());
        std::memcpy(scale, &bits, 4);
      }
    }
    const std::uint8_t slots = in.u8();
    if (slots < 160) kv.slot_mapping = call.tensor(rank - 2, false, 24);
    if (slots >= 160 && slots < 240) kv.cache_offsets = call.tensor(1, false, 8);
    if (slots >= 200) kv.cu_seqlens = call.tensor(1, false, 8);
    embrope_rope_options_t o;
    embrope_rope_options_init(&o);
    set_enum(o.layout, in.chance(8) ? static_cast<int>(in.u64()) : in.u8() % 2);
    if (in.chance(32)) o.rotary_dim = in.chance(128) ? in.u8() % 40 : in.extreme();
    if (in.chance(32)) {
      for (std::int64_t& section : o.mrope_section) section = in.u8() % 40;
      o.mrope_interleaved = in.u8() % 2;
    }
    if (in.chance(48)) o.q_out = call.tensor(rank, true, 0);
    if (in.chance(64)) o.k_out = in.chance(32) ? k : call.tensor(rank, true, 0);
    o.deferred = deferred;
    const embrope_rope_cache_t* table = in.chance(4) ? nullptr : cache;
    const embrope_kv_cache_t* kv_arg = in.chance(4) ? nullptr : &kv;
    // qk-norm first (embrope_apply_qk_norm_rope_append_kv): decided by a byte read after all
    // the others, 0 (an input that ends before it) meaning no norm, so that older inputs
    // decode as they did.
    embrope_qk_norm_t n;
    embrope_qk_norm_init(&n);
    const bool normed = in.u8() >= 160;
    if (normed) {
      if (in.u8() >= 64) n.q_weight = call.tensor(1, true, 0);
      if (in.u8() >= 96) n.k_weight = call.tensor(1, true, 0);
      if (in.u8() >= 224) {
        std::uint32_t bits = static_cast<std::uint32_t>(in.u64());
        std::memcpy(&n.eps, &bits, 4);
      }
      n.unit_offset = in.u8() >= 192 ? 1 : 0;
    }
    // A float8 q_out (and k_out, which is refused), its scales and q_nope: decided after all
    // the bytes above, 0 meaning none, so that older inputs decode as they did.
    if (in.u8() >= 128) {
      const auto code = static_cast<std::uint8_t>(in.u8() % 2 ? 10 : 12);
      if (o.q_out != nullptr) call.retype(o.q_out, {code, 8, 1});
      if (o.k_out != nullptr && o.k_out != k && in.chance(32)) call.retype(o.k_out, {code, 8, 1});
      if (in.chance(32)) {
        const auto bits = static_cast<std::uint32_t>(in.u64());
        std::memcpy(&o.q_out_scale, &bits, 4);
      } else {
        o.q_out_scale = static_cast<float>(1 + in.u8() % 8) / 4.0f;
      }
      if (in.chance(16)) o.k_out_scale = 2.0f;
      if (in.chance(96)) o.q_out_head_scales = call.tensor(1, true, 0);
      if (in.u8() >= 128) {
        o.q_nope = call.tensor(rank, true, 0);
        o.q_nope_out = call.tensor(rank, true, 0);
        if (o.q_nope_out != nullptr && in.chance(224)) call.retype(o.q_nope_out, {code, 8, 1});
      }
    }
    // q in place where no q_out is given; k written only into k_out.
    const Call::Snapshot before =
        call.snapshot({o.q_out != nullptr ? o.q_out : q, o.k_out, o.q_nope_out, kv.k_cache,
                       kv.v_cache, kv.kv_cache});
    if (normed) {
      check("embrope_apply_qk_norm_rope_append_kv",
            embrope_apply_qk_norm_rope_append_kv(q, k, v, positions, table, kv_arg,
                                                 in.chance(16) ? nullptr : &n, &o, nullptr),
            before, call, deferred != nullptr);
    } else {
      check("embrope_apply_rope_append_kv",
            embrope_apply_rope_append_kv(q, k, v, positions, table, kv_arg, &o, nullptr), before,
            call, deferred != nullptr);
    }
    embrope_rope_cache_destroy(cache);
    return 0;
  }

  std::int64_t rotary_dim = 0, max_positions = 0;
  embrope_rope_cache_destroy(make_cache(in, &rotary_dim, &max_positions));
  return 0;
}
