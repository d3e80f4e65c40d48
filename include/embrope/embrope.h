/* embrope C API: token embeddings, absolute positions and rotary position embedding on CPUs
 * and NVIDIA GPUs, over DLPack tensors (DLTensor from dlpack/dlpack.h).
 *
 * Conventions
 * - Every function returns an embrope_status_t; EMBROPE_OK is 0. On failure,
 *   embrope_last_error() gives a message for the calling thread that starts with the
 *   function's name and names the argument, the value and the rule; after a success it is
 *   "". No C++ exception crosses this interface. A call that fails with INVALID_ARGUMENT or
 *   NOT_IMPLEMENTED has written no tensor (a create function sets its output handle, and
 *   embrope_deferred_status_create its status, to NULL first). Options structs hold enum
 *   fields as a C caller stores them: a value outside the enum is an INVALID_ARGUMENT error.
 * - Outputs share no memory with inputs, with each other or with themselves, except that
 *   q_out (k_out) may be exactly q (k) (in place); see embrope.hpp.
 * - Tensors are non-owning DLTensor views. A null `strides` means row-major contiguous;
 *   `byte_offset` is honoured. dtypes: float32, float16, bfloat16 values; int32, int64 ids
 *   and positions; float8_e4m3fn, float8_e5m2 (float8 outputs and caches), uint8 and int8
 *   (quantized tables, float8 tables as bytes); lanes must be 1. Devices: kDLCPU, kDLCUDA (and
 * kDLCUDAHost/ kDLCUDAManaged memory is not accepted: pass it as the device it is read on). All
 *   tensors of one call live on one device.
 * - The last dimension of every value tensor has stride 1; other strides are free (>= 0).
 * - `stream` is a cudaStream_t (NULL: the default stream); ignored for CPU tensors.
 * - Thread safety: functions may be called concurrently from any threads, as long as no two
 *   concurrent calls write the same tensor and none writes a tensor another one reads. Input
 *   tensors may be shared. A cache handle is immutable after creation and may be shared by
 *   threads, streams and layers; destroy it only when no call that uses it is running or
 *   queued. embrope_last_error() is per thread: another thread's calls never change it.
 * - Options structs are initialised with their *_init function before fields are set, so
 *   that new fields get their defaults.
 * - Binary compatibility (docs/abi.md): every options / config struct starts with
 *   struct_size, which *_init sets to the sizeof the caller was compiled with (an inline
 *   function over the exported *_init_size). The library reads only the bytes the caller's
 *   struct holds and gives the fields past them their defaults, so a program built against
 *   an older header of the same SONAME runs with a newer library. New fields are only ever
 *   appended, past the previous sizeof. A struct larger than the library's (a newer header)
 *   is accepted when the fields the library does not know are zero, and is an
 *   INVALID_ARGUMENT error otherwise; a struct_size that no header gives (0, not a multiple
 *   of 8, or past 4096: a struct never initialised) is an error.
 *   Structs the library writes (embrope_rope_cache_info) are written up to struct_size.
 */
#ifndef EMBROPE_EMBROPE_H_
#define EMBROPE_EMBROPE_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#include "embrope/version.h" /* EMBROPE_VERSION_*, EMBROPE_ABI_VERSION */

#if defined(_WIN32)
#define EMBROPE_API
#else
#define EMBROPE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum embrope_status_t {
  EMBROPE_OK = 0,
  EMBROPE_ERROR_INVALID_ARGUMENT = 1, /* a shape, stride, dtype, device or option is wrong */
  EMBROPE_ERROR_INDEX_OUT_OF_RANGE =
      2, /* an id, position, type id or cu_seqlens entry outside its range */
  EMBROPE_ERROR_NOT_IMPLEMENTED = 3, /* e.g. CUDA tensors in a build without CUDA */
  EMBROPE_ERROR_CUDA = 4,            /* the CUDA runtime reported an error */
  EMBROPE_ERROR_OUT_OF_MEMORY = 5,   /* an allocation failed */
  EMBROPE_ERROR_INTERNAL = 6         /* a bug in embrope */
} embrope_status_t;

/* The library's version, "MAJOR.MINOR.PATCH". Never fails. */
EMBROPE_API const char* embrope_version(void);

/* The message of the last failed call on this thread ("" if none). Valid until the next
 * embrope call on this thread. */
EMBROPE_API const char* embrope_last_error(void);

/* The number of usable CUDA devices: 0 when built without CUDA, or without a driver or a
 * device at run time. Never fails. */
EMBROPE_API int embrope_cuda_device_count(void);

/* ---------------------------------------------------------------- cos/sin cache ---- */

/* inv_freq_i = base^(-2i / rotary_dim), angle = position * inv_freq_i (float64). */
/* RoPE scaling variants (see RopeScaling in types.hpp and docs/ops.md). */
typedef enum embrope_rope_scaling_t {
  EMBROPE_ROPE_SCALING_NONE = 0,
  EMBROPE_ROPE_SCALING_LINEAR = 1,
  EMBROPE_ROPE_SCALING_DYNAMIC = 2, /* NTK-aware, by sequence length */
  EMBROPE_ROPE_SCALING_YARN = 3,
  EMBROPE_ROPE_SCALING_LLAMA3 = 4,
  EMBROPE_ROPE_SCALING_LONGROPE = 5
} embrope_rope_scaling_t;

/* Fields a variant does not use must keep the defaults set by embrope_rope_config_init. */
typedef struct embrope_rope_config_t {
  size_t struct_size;    /* sizeof the struct the caller was compiled with: set by the init */
  int64_t rotary_dim;    /* even, > 0 */
  double base;           /* finite, > 0; default 10000 */
  int64_t max_positions; /* positions [0, max_positions) are valid; > 0 */
  embrope_rope_scaling_t scaling; /* default NONE */
  double factor;                  /* context extension factor; default 1 */
  int64_t original_max_positions; /* pretrained context (dynamic, yarn, llama3, longrope) */
  int64_t sequence_length;        /* dynamic, longrope: 0 means max_positions */
  double beta_fast, beta_slow;    /* yarn; defaults 32 and 1 */
  int32_t truncate;               /* yarn: round the ramp ends; default 1 */
  double mscale, mscale_all_dim;  /* yarn (DeepSeek); 0 = unset */
  double low_freq_factor, high_freq_factor; /* llama3; defaults 1 and 4 */
  /* longrope: rotary_dim / 2 values each (copied at creation); NULL otherwise. From
   * embrope_rope_cache_info they point into the cache and live as long as it. */
  const double* short_factor;
  const double* long_factor;
  int64_t num_factors;     /* the length of each of short_factor and long_factor */
  double attention_factor; /* yarn, longrope: 0 derives it; > 0 overrides */
} embrope_rope_config_t;

/* Sets the defaults: rotary_dim 0, base 10000, max_positions 0, scaling NONE, factor 1,
 * beta_fast 32, beta_slow 1, truncate 1, low/high_freq_factor 1 and 4, the rest 0/NULL. */
EMBROPE_API void embrope_rope_config_init_size(embrope_rope_config_t* config, size_t struct_size);
static inline void embrope_rope_config_init(embrope_rope_config_t* config_) {
  embrope_rope_config_init_size(config_, sizeof(*config_));
}

/* The frequencies (rotary_dim / 2 doubles into inv_freq) and attention factor that a
 * configuration gives, computed in float64 without building a table. The configuration is
 * checked as for a cache (max_positions > 0 included). */
EMBROPE_API embrope_status_t embrope_rope_frequencies(const embrope_rope_config_t* config,
                                                      double* inv_freq, int64_t capacity,
                                                      double* attention_factor);

/* An immutable cos/sin table on one device (layout: see embrope_rope_cache_copy_to_host). */
typedef struct embrope_rope_cache embrope_rope_cache_t;

/* Builds a cache on `device` (on `stream` for CUDA) and stores its handle in *cache.
 * Errors: INVALID_ARGUMENT for a bad config or null pointer, NOT_IMPLEMENTED for a CUDA
 * device without CUDA, OUT_OF_MEMORY. */
EMBROPE_API embrope_status_t embrope_rope_cache_create(const embrope_rope_config_t* config,
                                                       DLDevice device, void* stream,
                                                       embrope_rope_cache_t** cache);

/* Axial RoPE: one cache for num_axes = 1 to 4 axes, axis a configured by *axes[a] as a
 * one-axis cache would be (its rotary_dim the axis's share of the features, base its theta,
 * its own scaling); the table's columns are the axes' frequencies one after another. Every
 * axis has the same max_positions and attention factor. apply_rope then takes positions
 * [num_axes, T] or [num_axes, B, S]. Errors as embrope_rope_cache_create's, naming the axis. */
EMBROPE_API embrope_status_t
embrope_rope_cache_create_axial(const embrope_rope_config_t* const* axes, size_t num_axes,
                                DLDevice device, void* stream, embrope_rope_cache_t** cache);

/* The axes' rotary dims of an axial cache into axes_dim[0..3] (unused axes 0; all 0 for a
 * one-axis cache). */
EMBROPE_API embrope_status_t embrope_rope_cache_axes_dim(const embrope_rope_cache_t* cache,
                                                         int64_t axes_dim[4]);

/* Frees a cache. A null handle is accepted and does nothing. */
EMBROPE_API embrope_status_t embrope_rope_cache_destroy(embrope_rope_cache_t* cache);

/* The cache's configuration (into config, which must have been initialised with
 * embrope_rope_config_init: it is written up to its struct_size) and device. Either output
 * may be NULL. */
EMBROPE_API embrope_status_t embrope_rope_cache_info(const embrope_rope_cache_t* cache,
                                                     embrope_rope_config_t* config,
                                                     DLDevice* device);

/* Copies the table (from any device) into host arrays cos and sin of
 * max_positions * rotary_dim / 2 floats each, row-major [position][i]:
 * cos[p][i] = cos(p * inv_freq_i) * attention_factor, likewise sin. */
EMBROPE_API embrope_status_t embrope_rope_cache_copy_to_host(const embrope_rope_cache_t* cache,
                                                             float* cos, float* sin);

/* -------------------------------------------------------- deferred bad-index status ---- */

/* By default an op that meets a bad id or position (or cu_seqlens entry) fails with
 * INDEX_OUT_OF_RANGE, which on a GPU costs one synchronisation of the stream per call. A
 * caller that cannot afford it (a decode loop, a CUDA graph capture) puts a deferred status in
 * the op's options: the op then only enqueues kernels, which record the first bad row there,
 * and the caller checks when it chooses. Lives on one device; give each thread or stream its
 * own (it is not thread-safe). */
typedef struct embrope_deferred_status embrope_deferred_status_t;

EMBROPE_API embrope_status_t embrope_deferred_status_create(DLDevice device,
                                                            embrope_deferred_status_t** status);
/* A null handle is accepted and does nothing. */
EMBROPE_API embrope_status_t embrope_deferred_status_destroy(embrope_deferred_status_t* status);
/* OK when nothing was recorded since the last check; otherwise INDEX_OUT_OF_RANGE, with the
 * first bad row described by embrope_last_error(). Clears the record either way. On a GPU,
 * synchronises `stream` first. */
EMBROPE_API embrope_status_t embrope_deferred_status_check(embrope_deferred_status_t* status,
                                                           void* stream);

/* ----------------------------------------------------------------------- RoPE ------ */

typedef enum embrope_rope_layout_t {
  EMBROPE_ROPE_NEOX = 0,       /* pairs (x[i], x[i + R/2]): GPT-NeoX, HF Llama */
  EMBROPE_ROPE_INTERLEAVED = 1 /* pairs (x[2i], x[2i + 1]): GPT-J, RoFormer */
} embrope_rope_layout_t;

typedef struct embrope_rope_options_t {
  size_t struct_size; /* sizeof the struct the caller was compiled with: set by the init */
  embrope_rope_layout_t layout; /* default NEOX */
  int32_t inverse;              /* nonzero: rotate by -angle (backward); default 0 */
  int64_t rotary_dim;           /* 0: the table's; else must equal it. Default 0 */
  DLTensor* q_out;              /* NULL: rotate q in place (default) */
  DLTensor* k_out;              /* NULL: rotate k in place (default) */
  /* Multimodal RoPE (Qwen2-VL): all 0 = off (default). Otherwise three section sizes summing
   * to rotary_dim / 2; positions are then [3, T] or [3, B, S] (temporal, height, width) and
   * frequency i takes its angle from the stream of the section holding i. */
  int64_t mrope_section[3];
  /* NULL (default): a bad position fails the call. Otherwise it is recorded there. */
  embrope_deferred_status_t* deferred;
  /* Nonzero, with mrope_section: the streams interleaved over the frequencies (Qwen3-VL,
   * mrope_interleaved) rather than in contiguous sections. Default 0. */
  int32_t mrope_interleaved;
  /* Float8 outputs (embrope_apply_rope[_cos_sin], and the q_out of the KV appends): q_out of dtype
   * float8_e4m3fn or float8_e5m2 (DLPack codes 10 and 12), and k_out of the same dtype when k
   * is given, store every element as float8(value * scale), rounded once to nearest even and
   * saturated to the finite range (FlashInfer's rope_quantize_fp8: the scale multiplies).
   * q's scale is q_out_scale times q_out_head_scales[h] when given (float32 [Hq]); k's alike
   * ([Hk]). NULL (default): no head scales. A scale of 0 (default) is 1; other outputs take 1. */
  const DLTensor* q_out_head_scales;
  const DLTensor* k_out_head_scales;
  float q_out_scale;
  float k_out_scale;
  /* With float8 outputs: the non-rotary parts of q and k in tensors of their own (FlashInfer's
   * rope_quantize_fp8 q_nope / k_nope; DeepSeek MLA's q_nope and kv_c as one head), quantized
   * in the same pass with q's (k's) scales into q_nope_out (k_nope_out): q's dtype, token
   * dims and heads (k's for k_nope), their own last dim; the outputs of their shape and the
   * float8 dtype. Both of a pair or neither; NULL (default): none. */
  const DLTensor* q_nope;
  DLTensor* q_nope_out;
  const DLTensor* k_nope;
  DLTensor* k_nope_out;
  /* Axial RoPE (vision encoders, diffusion transformers): all 0 = off (default). Otherwise
   * N = 1 to 4 leading positive even sizes, then zeros, summing to rotary_dim: axis a owns the
   * next axes_dim[a] rotary features (diffusers' axes_dim, Flux.1's {16, 56, 56}); positions
   * are [N, T] or [N, B, S], one coordinate per axis, and each pair takes its angle from its
   * axis. With a cache from embrope_rope_cache_create_axial it may stay 0 (the cache's axes)
   * or must equal them. Not together with mrope_section. */
  int64_t axes_dim[4];
} embrope_rope_options_t;

EMBROPE_API void embrope_rope_options_init_size(embrope_rope_options_t* options,
                                                size_t struct_size);
static inline void embrope_rope_options_init(embrope_rope_options_t* options_) {
  embrope_rope_options_init_size(options_, sizeof(*options_));
}

/* Rotates q [T, Hq, D] or [B, S, Hq, D] and, unless k is NULL, k [T, Hk, D] or
 * [B, S, Hk, D] by positions [T] or [B, S] (int32/int64), with the cache's cos/sin.
 * options may be NULL (defaults). Elements at and past rotary_dim pass through (copied when
 * out of place). A position outside the cache zero-fills its token's rows and fails with
 * INDEX_OUT_OF_RANGE naming the first such token (on a GPU this synchronises the stream). */
EMBROPE_API embrope_status_t embrope_apply_rope(const DLTensor* q, const DLTensor* k,
                                                const DLTensor* positions,
                                                const embrope_rope_cache_t* cache,
                                                const embrope_rope_options_t* options,
                                                void* stream);

/* The same with caller-supplied cos and sin tables [max_positions, rotary_dim / 2] (any
 * value dtype, both the same), used as given (vLLM / ONNX style). */
EMBROPE_API embrope_status_t embrope_apply_rope_cos_sin(const DLTensor* q, const DLTensor* k,
                                                        const DLTensor* positions,
                                                        const DLTensor* cos, const DLTensor* sin,
                                                        const embrope_rope_options_t* options,
                                                        void* stream);

/* ------------------------------------------------------ RoPE + KV-cache append ---- */

typedef enum embrope_kv_layout_t {
  EMBROPE_KV_NHD = 0, /* [pages, page_size, kv_heads, head_dim]: vLLM, FlashInfer */
  EMBROPE_KV_HND = 1  /* [pages, kv_heads, page_size, head_dim]: TensorRT-LLM */
} embrope_kv_layout_t;

/* The KV cache a call writes and where each token goes (apply_rope_append_kv.hpp). */
typedef struct embrope_kv_cache_t {
  size_t struct_size; /* sizeof the struct the caller was compiled with: set by the init */
  /* Separate caches, or NULL for both and kv_cache [pages, 2, ...] (k at 0, v at 1). A
   * contiguous cache [B, max_len, kv_heads, head_dim] is NHD with one page per sequence. Any
   * value dtype, or float8_e4m3fn / float8_e5m2 (DLPack codes 10 and 12). */
  const DLTensor* k_cache;
  const DLTensor* v_cache;
  const DLTensor* kv_cache;
  embrope_kv_layout_t layout; /* default NHD */
  float k_scale, v_scale;     /* float8 caches store value / scale; default 1 */
  /* Exactly one of: slot_mapping [T] or [B, S] (page * page_size + offset; -1 skips), or
   * cache_offsets [B] (contiguous cache; token s of sequence b goes to row offsets[b] + s),
   * with cu_seqlens [B + 1] for packed [T, H, D] inputs. int32 or int64. */
  const DLTensor* slot_mapping;
  const DLTensor* cache_offsets;
  const DLTensor* cu_seqlens;
} embrope_kv_cache_t;

EMBROPE_API void embrope_kv_cache_init_size(embrope_kv_cache_t* kv, size_t struct_size);
static inline void embrope_kv_cache_init(embrope_kv_cache_t* kv_) {
  embrope_kv_cache_init_size(kv_, sizeof(*kv_));
}

/* RoPE of q (in place or options->q_out) and k, fused with the write of rotated k and of v
 * [T, Hk, Dv] or [B, S, Hk, Dv] into the KV cache, in one launch. k is only read unless
 * options->k_out is given (it may be k itself; k's dtype). q_out may be float8 (DLPack codes
 * 10 and 12), quantized as embrope_apply_rope quantizes, with q_out_scale, q_out_head_scales
 * and q_nope / q_nope_out (FlashInfer's rope_quantize_fp8_append_paged_kv_cache); k's float8
 * form is the cache's (k_scale). The cache gets the bytes apply_rope followed by a copy would
 * give. A slot outside the cache, like a position outside the table, fails
 * with INDEX_OUT_OF_RANGE naming the first such token (or is recorded in options->deferred);
 * its cache rows are not written. */
EMBROPE_API embrope_status_t embrope_apply_rope_append_kv(
    const DLTensor* q, const DLTensor* k, const DLTensor* v, const DLTensor* positions,
    const embrope_rope_cache_t* cache, const embrope_kv_cache_t* kv,
    const embrope_rope_options_t* options, void* stream);

/* The same with caller-supplied cos and sin tables [max_positions, rotary_dim / 2]. */
EMBROPE_API embrope_status_t embrope_apply_rope_append_kv_cos_sin(
    const DLTensor* q, const DLTensor* k, const DLTensor* v, const DLTensor* positions,
    const DLTensor* cos, const DLTensor* sin, const embrope_kv_cache_t* kv,
    const embrope_rope_options_t* options, void* stream);

/* Positions of a packed variable-length batch: sequence b holds tokens
 * [cu_seqlens[b], cu_seqlens[b + 1]) of positions [T], and its token t gets
 * start_offsets[b] + (t - cu_seqlens[b]) (start_offsets [B] may be NULL: 0). cu_seqlens
 * [B + 1] must be non-decreasing from 0 to T; a violation fails with INDEX_OUT_OF_RANGE
 * naming the first bad entry (on a GPU this synchronises the stream; deferred, if not NULL,
 * records it instead) and positions are -1. */
EMBROPE_API embrope_status_t embrope_packed_positions(const DLTensor* cu_seqlens,
                                                      const DLTensor* start_offsets,
                                                      const DLTensor* positions,
                                                      embrope_deferred_status_t* deferred,
                                                      void* stream);

/* ------------------------------------------------------------------ embeddings ----- */

typedef enum embrope_position_encoding_t {
  EMBROPE_POSITIONS_NONE = 0,
  EMBROPE_POSITIONS_LEARNED = 1,   /* + position_table[p] */
  EMBROPE_POSITIONS_SINUSOIDAL = 2 /* + sinusoid(p), Vaswani et al. 2017 */
} embrope_position_encoding_t;

typedef enum embrope_sinusoid_layout_t {
  EMBROPE_SINUSOID_INTERLEAVED = 0, /* P[2i] = sin(p w_i), P[2i+1] = cos(p w_i) */
  EMBROPE_SINUSOID_SPLIT = 1        /* P[i] = sin(p w_i), P[D/2+i] = cos(p w_i) */
} embrope_sinusoid_layout_t;

typedef enum embrope_normalization_t {
  EMBROPE_NORM_NONE = 0,
  EMBROPE_NORM_LAYER_NORM = 1, /* (x - mean) / sqrt(var + eps) * weight + bias */
  EMBROPE_NORM_RMS_NORM = 2    /* x / sqrt(mean(x^2) + eps) * weight */
} embrope_normalization_t;

typedef struct embrope_embed_options_t {
  size_t struct_size;  /* sizeof the struct the caller was compiled with: set by the init */
  float scale;         /* multiplies the token row; default 1 */
  int64_t vocab_start; /* the table holds ids [vocab_start, vocab_start + V); default 0 */
  int32_t vocab_shard; /* nonzero: ids outside the shard give zero token rows; default 0 */
  embrope_position_encoding_t positions;     /* default NONE */
  const DLTensor* position_table;            /* learned: [max_positions, D] */
  double sinusoid_base;                      /* finite, >= 1; default 10000 */
  embrope_sinusoid_layout_t sinusoid_layout; /* default INTERLEAVED */
  const DLTensor* position_ids;              /* explicit positions shaped like ids, or NULL */
  const DLTensor* position_offsets;    /* implicit offset_b + s: [B] for ids [B, S], or NULL */
  const DLTensor* type_table;          /* [num_types, D], or NULL */
  const DLTensor* type_ids;            /* shaped like ids, or NULL */
  embrope_deferred_status_t* deferred; /* NULL (default): a bad row fails the call */
  /* Normalisation of the summed row, in float32 before the one rounding (embed.hpp). */
  embrope_normalization_t norm; /* default NONE */
  const DLTensor* norm_weight;  /* [D], float32 or the table's dtype; NULL: 1 */
  const DLTensor* norm_bias;    /* [D] (layer_norm only); NULL: 0 */
  float norm_eps;               /* finite, >= 0; default 1e-5 */
  int32_t norm_unit_offset;     /* nonzero: the weight applied is 1 + w (Gemma); default 0 */
  const DLTensor* pre_norm_out; /* the row before the norm, like out (or float32), or NULL */
} embrope_embed_options_t;

EMBROPE_API void embrope_embed_options_init_size(embrope_embed_options_t* options,
                                                 size_t struct_size);
static inline void embrope_embed_options_init(embrope_embed_options_t* options_) {
  embrope_embed_options_init_size(options_, sizeof(*options_));
}

/* out[n] = scale * table[ids[n] - vocab_start] (+ positional row) (+ type row), normalised
 * when options->norm says so, in float32 with one rounding. table [V, D] and out [ids.shape..., D]
 * share a value dtype. options may be NULL. A bad id, position or type id zero-fills its row and
 * fails with INDEX_OUT_OF_RANGE naming the first such row (flat row-major index into ids). */
EMBROPE_API embrope_status_t embrope_embed(const DLTensor* table, const DLTensor* ids,
                                           const DLTensor* out,
                                           const embrope_embed_options_t* options, void* stream);

/* How a quantized token table stores its rows (embed.hpp, QuantFormat; docs/ops.md). */
typedef enum embrope_quant_format_t {
  EMBROPE_QUANT_INT8 = 0,          /* int8 [V, D]: (q - zero_point) * scale */
  EMBROPE_QUANT_INT4 = 1,          /* uint8 [V, D/2], ExecuTorch's embedding_4bit packing */
  EMBROPE_QUANT_FLOAT8_E4M3FN = 2, /* float8_e4m3fn [V, D]: q * scale */
  EMBROPE_QUANT_FLOAT8_E5M2 = 3,   /* float8_e5m2 [V, D]: q * scale */
  EMBROPE_QUANT_GGUF_Q8_0 = 4,     /* uint8 [V, D/32 * 34], llama.cpp's blocks */
  EMBROPE_QUANT_GGUF_Q4_0 = 5,     /* uint8 [V, D/32 * 18] */
  EMBROPE_QUANT_GGUF_Q4_K = 6,     /* uint8 [V, D/256 * 144] */
  EMBROPE_QUANT_GGUF_Q6_K = 7      /* uint8 [V, D/256 * 210] */
} embrope_quant_format_t;

/* A quantized token table (embed.hpp, QuantizedTable): data [V, C] in the format's dtype
 * (DLPack uint8, int8 or float8), dim values per row; scales (int8, int4, float8: one element,
 * [V], [V, 1] or [V, G]; float32, float16 or bfloat16) and zero points (int8, int4: like scales;
 * float32, float16, bfloat16, int8 or int32), NULL where absent. */
typedef struct embrope_quantized_table_t {
  size_t struct_size; /* sizeof the struct the caller was compiled with: set by the init */
  embrope_quant_format_t format; /* default INT8 */
  const DLTensor* data;          /* the rows; NULL by default (required) */
  int64_t dim;                   /* D; default 0 */
  const DLTensor* scales;        /* NULL by default */
  const DLTensor* zero_points;   /* NULL by default (zero) */
} embrope_quantized_table_t;

EMBROPE_API void embrope_quantized_table_init_size(embrope_quantized_table_t* table,
                                                   size_t struct_size);
static inline void embrope_quantized_table_init(embrope_quantized_table_t* table_) {
  embrope_quantized_table_init_size(table_, sizeof(*table_));
}

/* embrope_embed from a quantized token table, each looked-up row dequantized in the same pass;
 * out (float32, float16 or bfloat16) chooses the value dtype of the call's other tables. CPU or
 * CUDA tensors. */
EMBROPE_API embrope_status_t embrope_embed_quantized(const embrope_quantized_table_t* table,
                                                     const DLTensor* ids, const DLTensor* out,
                                                     const embrope_embed_options_t* options,
                                                     void* stream);

/* ------------------------------------------------------------ backward passes ----- */

typedef enum embrope_backward_mode_t {
  /* GPU: sort ids (CUB radix sort), sum each id's rows in a fixed order, write each row
   * once; bitwise reproducible run to run. Needs a workspace. */
  EMBROPE_BACKWARD_DETERMINISTIC = 0,
  /* GPU: float32 atomicAdd; faster, not reproducible bit for bit. Used when every gradient is
   * float32 (otherwise the call runs deterministic). The CPU is always deterministic. */
  EMBROPE_BACKWARD_ATOMIC = 1
} embrope_backward_mode_t;

typedef struct embrope_embed_backward_options_t {
  size_t struct_size;      /* sizeof the struct the caller was compiled with: set by the init */
  float scale;             /* the forward's scale, applied to grad_table only; default 1 */
  int64_t vocab_start;     /* as embrope_embed_options_t; default 0 */
  int32_t vocab_shard;     /* nonzero: ids outside the shard give no gradient; default 0 */
  int32_t has_padding_idx; /* nonzero: rows whose id is padding_idx give grad_table nothing */
  int64_t padding_idx;     /* in the ids' numbering; default 0 (unused unless has_padding_idx) */
  const DLTensor* grad_position_table; /* learned positions: [max_positions, D], or NULL */
  const DLTensor* position_ids;        /* explicit positions shaped like ids, or NULL */
  const DLTensor* position_offsets;    /* implicit offset_b + s: [B], or NULL */
  const DLTensor* grad_type_table;     /* [num_types, D], or NULL */
  const DLTensor* type_ids;            /* shaped like ids, or NULL */
  embrope_backward_mode_t mode;        /* default DETERMINISTIC */
  void* workspace;        /* GPU: NULL (default) takes it from embrope's pool, stream-ordered */
  size_t workspace_bytes; /* at least embrope_embed_backward_workspace_size() when given */
  embrope_deferred_status_t* deferred; /* NULL (default): a bad row fails the call */
  /* embed's norm, differentiated before the tables (embed.hpp, EmbedBackwardOptions): grad_out
   * is the normalised output's gradient; each table receives the norm's backward at pre_norm
   * plus grad_pre_norm. */
  embrope_normalization_t norm;     /* the forward's; default NONE */
  const DLTensor* pre_norm;         /* the forward's pre_norm_out (needed with a norm) */
  const DLTensor* norm_weight;      /* the forward's [D] weight; NULL: 1 */
  float norm_eps;                   /* the forward's; default 1e-5 */
  int32_t norm_unit_offset;         /* the forward's; default 0 */
  const DLTensor* grad_pre_norm;    /* the gradient of pre_norm_out, like grad_out, or NULL */
  const DLTensor* grad_norm_weight; /* [D] float32, overwritten, or NULL */
  const DLTensor* grad_norm_bias;   /* [D] float32, overwritten (layer_norm), or NULL */
} embrope_embed_backward_options_t;

EMBROPE_API void embrope_embed_backward_options_init_size(embrope_embed_backward_options_t* options,
                                                          size_t struct_size);
static inline void embrope_embed_backward_options_init(embrope_embed_backward_options_t* options_) {
  embrope_embed_backward_options_init_size(options_, sizeof(*options_));
}

/* The backward of embrope_embed (with options->norm, of its norm first: see above):
 * grad_table[ids[n] - vocab_start] += scale * grad_out[n],
 * grad_position_table[pos_n] += grad_out[n], grad_type_table[type_ids[n]] += grad_out[n]
 * for the gradients given (grad_table may be NULL when another one is given). grad_out
 * [ids.shape..., D] is float32, float16 or bfloat16; each gradient is float32 or grad_out's
 * dtype and is accumulated into (sums in float32, one rounding). A bad id, position or type
 * id gives no gradient and fails with INDEX_OUT_OF_RANGE naming the first such row. */
EMBROPE_API embrope_status_t embrope_embed_backward(const DLTensor* grad_out, const DLTensor* ids,
                                                    const DLTensor* grad_table,
                                                    const embrope_embed_backward_options_t* options,
                                                    void* stream);

/* Bytes of workspace embrope_embed_backward needs for the same arguments (0 on the CPU). */
EMBROPE_API embrope_status_t embrope_embed_backward_workspace_size(
    const DLTensor* grad_out, const DLTensor* ids, const DLTensor* grad_table,
    const embrope_embed_backward_options_t* options, size_t* bytes);

/* The gradient of embrope_apply_rope with respect to q and k: dq and dk (k may be NULL) are
 * rotated by the transposed rotation, m R(-theta) (the forward with -sin; options->inverse
 * names the forward's direction). In place unless options->q_out / k_out are given. */
EMBROPE_API embrope_status_t embrope_apply_rope_backward(const DLTensor* dq, const DLTensor* dk,
                                                         const DLTensor* positions,
                                                         const embrope_rope_cache_t* cache,
                                                         const embrope_rope_options_t* options,
                                                         void* stream);

/* The same with caller-supplied cos and sin tables, as embrope_apply_rope_cos_sin. */
EMBROPE_API embrope_status_t embrope_apply_rope_backward_cos_sin(
    const DLTensor* dq, const DLTensor* dk, const DLTensor* positions, const DLTensor* cos,
    const DLTensor* sin, const embrope_rope_options_t* options, void* stream);

/* ------------------------------------------------------------- qk-norm + RoPE ------ */

/* The per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3): each head row x becomes
 * x / sqrt(mean(x^2) + eps) * w in float32. */
typedef struct embrope_qk_norm_t {
  size_t struct_size;       /* sizeof the struct the caller was compiled with: set by the init */
  const DLTensor* q_weight; /* [head_dim], float32 or q's dtype; NULL: 1 (default) */
  const DLTensor* k_weight; /* the same for k; needs k */
  float eps;                /* finite, >= 0; default 1e-6 */
  int32_t unit_offset;      /* nonzero: the weight applied is 1 + w (Gemma); default 0 */
} embrope_qk_norm_t;

EMBROPE_API void embrope_qk_norm_init_size(embrope_qk_norm_t* norm, size_t struct_size);
static inline void embrope_qk_norm_init(embrope_qk_norm_t* norm_) {
  embrope_qk_norm_init_size(norm_, sizeof(*norm_));
}

/* Normalises every head row of q (and k, unless NULL) with norm (NULL: no weights, eps 1e-6),
 * then rotates it as embrope_apply_rope does, in one pass (options as there: in place unless
 * q_out / k_out, partial rotary, mrope, the bad-position policy). */
EMBROPE_API embrope_status_t embrope_apply_qk_norm_rope(const DLTensor* q, const DLTensor* k,
                                                        const DLTensor* positions,
                                                        const embrope_rope_cache_t* cache,
                                                        const embrope_qk_norm_t* norm,
                                                        const embrope_rope_options_t* options,
                                                        void* stream);

/* The same with caller-supplied cos and sin tables [max_positions, rotary_dim / 2]. */
EMBROPE_API embrope_status_t embrope_apply_qk_norm_rope_cos_sin(
    const DLTensor* q, const DLTensor* k, const DLTensor* positions, const DLTensor* cos,
    const DLTensor* sin, const embrope_qk_norm_t* norm, const embrope_rope_options_t* options,
    void* stream);

/* qk-norm + RoPE + KV-cache append (Qwen3 serving) in one launch: every head row of q and k is
 * normalised with norm (NULL: no weights, eps 1e-6) and rotated as embrope_apply_qk_norm_rope
 * does it, q in place or into options->q_out (float8 as in embrope_apply_rope_append_kv, but
 * no q_nope: the norm covers whole rows); the normalised, rotated k (also into
 * options->k_out when given) and v are written into the KV cache as
 * embrope_apply_rope_append_kv writes them (the same slots, layouts, dtypes and bad-index
 * policy). */
EMBROPE_API embrope_status_t embrope_apply_qk_norm_rope_append_kv(
    const DLTensor* q, const DLTensor* k, const DLTensor* v, const DLTensor* positions,
    const embrope_rope_cache_t* cache, const embrope_kv_cache_t* kv, const embrope_qk_norm_t* norm,
    const embrope_rope_options_t* options, void* stream);

/* The same with caller-supplied cos and sin tables [max_positions, rotary_dim / 2]. */
EMBROPE_API embrope_status_t embrope_apply_qk_norm_rope_append_kv_cos_sin(
    const DLTensor* q, const DLTensor* k, const DLTensor* v, const DLTensor* positions,
    const DLTensor* cos, const DLTensor* sin, const embrope_kv_cache_t* kv,
    const embrope_qk_norm_t* norm, const embrope_rope_options_t* options, void* stream);

/* Where the backward's weight gradients go ([head_dim] float32, overwritten), or NULL. */
typedef struct embrope_qk_norm_gradients_t {
  size_t struct_size; /* sizeof the struct the caller was compiled with: set by the init */
  const DLTensor* q_weight;
  const DLTensor* k_weight;
  void* workspace;        /* CUDA: NULL (default) allocates on the stream */
  size_t workspace_bytes; /* at least embrope_apply_qk_norm_rope_backward_workspace_size() */
} embrope_qk_norm_gradients_t;

EMBROPE_API void embrope_qk_norm_gradients_init_size(embrope_qk_norm_gradients_t* grads,
                                                     size_t struct_size);
static inline void embrope_qk_norm_gradients_init(embrope_qk_norm_gradients_t* grads_) {
  embrope_qk_norm_gradients_init_size(grads_, sizeof(*grads_));
}

/* The gradient of embrope_apply_qk_norm_rope: dq and dk (the outputs' gradients) become the
 * inputs' gradients (or go to options->q_out / k_out); q and k are the forward's inputs; the
 * weight gradients are sums over every row in a fixed order, the same on CPU and GPU. grads
 * may be NULL (no weight gradients). */
EMBROPE_API embrope_status_t embrope_apply_qk_norm_rope_backward(
    const DLTensor* dq, const DLTensor* dk, const DLTensor* q, const DLTensor* k,
    const DLTensor* positions, const embrope_rope_cache_t* cache, const embrope_qk_norm_t* norm,
    const embrope_qk_norm_gradients_t* grads, const embrope_rope_options_t* options, void* stream);

/* The same with caller-supplied cos and sin tables. */
EMBROPE_API embrope_status_t embrope_apply_qk_norm_rope_backward_cos_sin(
    const DLTensor* dq, const DLTensor* dk, const DLTensor* q, const DLTensor* k,
    const DLTensor* positions, const DLTensor* cos, const DLTensor* sin,
    const embrope_qk_norm_t* norm, const embrope_qk_norm_gradients_t* grads,
    const embrope_rope_options_t* options, void* stream);

/* Bytes of workspace the backward needs for these gradients (0 on the CPU). */
EMBROPE_API embrope_status_t embrope_apply_qk_norm_rope_backward_workspace_size(
    const DLTensor* dq, const DLTensor* dk, const embrope_qk_norm_gradients_t* grads,
    size_t* bytes);

#ifdef __cplusplus
}
#endif

#endif /* EMBROPE_EMBROPE_H_ */
