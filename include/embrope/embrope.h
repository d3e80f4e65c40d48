/* embrope C API: token embeddings, absolute positions and rotary position embedding on CPUs
 * and NVIDIA GPUs, over DLPack tensors (DLTensor from dlpack/dlpack.h).
 *
 * Conventions
 * - Every function returns an embrope_status_t; EMBROPE_OK is 0. On failure,
 *   embrope_last_error() gives a message for the calling thread that starts with the
 *   function's name and names the argument, the value and the rule; after a success it is
 *   "". No C++ exception crosses this interface. A call that fails with INVALID_ARGUMENT or
 *   NOT_IMPLEMENTED has written nothing. Options structs hold enum fields as a C caller
 *   stores them: a value outside the enum is an INVALID_ARGUMENT error.
 * - Outputs share no memory with inputs, with each other or with themselves, except that
 *   q_out (k_out) may be exactly q (k) (in place); see embrope.hpp.
 * - Tensors are non-owning DLTensor views. A null `strides` means row-major contiguous;
 *   `byte_offset` is honoured. dtypes: float32, float16, bfloat16 values; int32, int64 ids
 *   and positions; lanes must be 1. Devices: kDLCPU, kDLCUDA (and kDLCUDAHost/
 *   kDLCUDAManaged memory is not accepted: pass it as the device it is read on). All
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
 */
#ifndef EMBROPE_EMBROPE_H_
#define EMBROPE_EMBROPE_H_

#include <dlpack/dlpack.h>
#include <stdint.h>

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
  EMBROPE_ERROR_INVALID_ARGUMENT = 1,   /* a shape, stride, dtype, device or option is wrong */
  EMBROPE_ERROR_INDEX_OUT_OF_RANGE = 2, /* an id, position or type id outside its table */
  EMBROPE_ERROR_NOT_IMPLEMENTED = 3,    /* e.g. CUDA tensors in a build without CUDA */
  EMBROPE_ERROR_CUDA = 4,               /* the CUDA runtime reported an error */
  EMBROPE_ERROR_OUT_OF_MEMORY = 5,      /* an allocation failed */
  EMBROPE_ERROR_INTERNAL = 6            /* a bug in embrope */
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
typedef struct embrope_rope_config_t {
  int64_t rotary_dim;    /* even, > 0 */
  double base;           /* finite, > 0; default 10000 */
  int64_t max_positions; /* positions [0, max_positions) are valid; > 0 */
} embrope_rope_config_t;

/* Sets the defaults: rotary_dim 0, base 10000, max_positions 0. */
EMBROPE_API void embrope_rope_config_init(embrope_rope_config_t* config);

/* An immutable cos/sin table on one device (layout: see embrope_rope_cache_copy_to_host). */
typedef struct embrope_rope_cache embrope_rope_cache_t;

/* Builds a cache on `device` (on `stream` for CUDA) and stores its handle in *cache.
 * Errors: INVALID_ARGUMENT for a bad config or null pointer, NOT_IMPLEMENTED for a CUDA
 * device without CUDA, OUT_OF_MEMORY. */
EMBROPE_API embrope_status_t embrope_rope_cache_create(const embrope_rope_config_t* config,
                                                       DLDevice device, void* stream,
                                                       embrope_rope_cache_t** cache);

/* Frees a cache. A null handle is accepted and does nothing. */
EMBROPE_API embrope_status_t embrope_rope_cache_destroy(embrope_rope_cache_t* cache);

/* The cache's configuration and device. */
EMBROPE_API embrope_status_t embrope_rope_cache_info(const embrope_rope_cache_t* cache,
                                                     embrope_rope_config_t* config,
                                                     DLDevice* device);

/* Copies the table (from any device) into host arrays cos and sin of
 * max_positions * rotary_dim / 2 floats each, row-major [position][i]:
 * cos[p][i] = cos(p * inv_freq_i) * attention_factor, likewise sin. */
EMBROPE_API embrope_status_t embrope_rope_cache_copy_to_host(const embrope_rope_cache_t* cache,
                                                             float* cos, float* sin);

/* ----------------------------------------------------------------------- RoPE ------ */

typedef enum embrope_rope_layout_t {
  EMBROPE_ROPE_NEOX = 0,       /* pairs (x[i], x[i + R/2]): GPT-NeoX, HF Llama */
  EMBROPE_ROPE_INTERLEAVED = 1 /* pairs (x[2i], x[2i + 1]): GPT-J, RoFormer */
} embrope_rope_layout_t;

typedef struct embrope_rope_options_t {
  embrope_rope_layout_t layout; /* default NEOX */
  int32_t inverse;              /* nonzero: rotate by -angle (backward); default 0 */
  int64_t rotary_dim;           /* 0: the table's; else must equal it. Default 0 */
  DLTensor* q_out;              /* NULL: rotate q in place (default) */
  DLTensor* k_out;              /* NULL: rotate k in place (default) */
} embrope_rope_options_t;

EMBROPE_API void embrope_rope_options_init(embrope_rope_options_t* options);

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

typedef struct embrope_embed_options_t {
  float scale;         /* multiplies the token row; default 1 */
  int64_t vocab_start; /* the table holds ids [vocab_start, vocab_start + V); default 0 */
  int32_t vocab_shard; /* nonzero: ids outside the shard give zero token rows; default 0 */
  embrope_position_encoding_t positions;     /* default NONE */
  const DLTensor* position_table;            /* learned: [max_positions, D] */
  double sinusoid_base;                      /* default 10000 */
  embrope_sinusoid_layout_t sinusoid_layout; /* default INTERLEAVED */
  const DLTensor* position_ids;              /* explicit positions shaped like ids, or NULL */
  const DLTensor* position_offsets; /* implicit offset_b + s: [B] for ids [B, S], or NULL */
  const DLTensor* type_table;       /* [num_types, D], or NULL */
  const DLTensor* type_ids;         /* shaped like ids, or NULL */
} embrope_embed_options_t;

EMBROPE_API void embrope_embed_options_init(embrope_embed_options_t* options);

/* out[n] = scale * table[ids[n] - vocab_start] (+ positional row) (+ type row), in float32
 * with one rounding. table [V, D] and out [ids.shape..., D] share a value dtype. options
 * may be NULL. A bad id, position or type id zero-fills its row and fails with
 * INDEX_OUT_OF_RANGE naming the first such row (flat row-major index into ids). */
EMBROPE_API embrope_status_t embrope_embed(const DLTensor* table, const DLTensor* ids,
                                           const DLTensor* out,
                                           const embrope_embed_options_t* options, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* EMBROPE_EMBROPE_H_ */
