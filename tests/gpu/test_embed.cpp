// embed on the GPU against the CPU: every dtype, position encoding and head size, explicit
// arguments and the deferred status; bad ids; vocab shards, split sinusoids, a strided out;
// every 16-bit pattern through the conversions, bit for bit.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gpu_support.hpp"

using namespace gpu_test;

TEST_CASE("GPU embed equals CPU embed", "[gpu][embed]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (auto positions : {embrope::PositionEncoding::none, embrope::PositionEncoding::learned,
                           embrope::PositionEncoding::sinusoidal}) {
      // 8..128: sub-warp groups of 4, 8, 16 lanes on the 16-byte path; 100: the scalar path
      // for 16-bit values; 102: the scalar path for every dtype.
      for (std::int64_t dim : {8, 16, 32, 64, 100, 102, 128, 4096}) {
        // explicit: ids strided (every other element), int32 type ids, explicit position ids
        // (instead of per-row offsets), and a DeferredStatus instead of the checked call.
        for (bool explicit_args : {false, true}) {
          INFO("dtype " << embrope::dtype_name(dtype) << " positions "
                        << static_cast<int>(positions) << " D " << dim << " explicit "
                        << explicit_args);
          const std::int64_t vocab = 1000, batch = 3, seq = 37, max_pos = 512, types = 2;
          const int es = embrope::dtype_size(dtype);
          const std::int64_t id_step = explicit_args ? 2 : 1;
          const DType type_dtype = explicit_args ? DType::int32 : DType::int64;
          const int ts = embrope::dtype_size(type_dtype);
          Buffer table(vocab * dim * es), ptable(max_pos * dim * es), ttable(types * dim * es);
          Buffer ids(batch * seq * id_step * 4), tids(batch * seq * ts), offsets(batch * 8);
          Buffer pids(batch * seq * 8), out(batch * seq * dim * es);
          fill_random(table, dtype, vocab * dim, 1);
          fill_random(ptable, dtype, max_pos * dim, 2);
          fill_random(ttable, dtype, types * dim, 3);
          std::mt19937_64 rng(4);
          for (std::int64_t n = 0; n < batch * seq; ++n) {
            const std::int32_t id = static_cast<std::int32_t>(rng() % vocab);
            const std::int64_t tid = static_cast<std::int64_t>(rng() % types);
            const std::int32_t tid32 = static_cast<std::int32_t>(tid);
            const std::int64_t pid = static_cast<std::int64_t>(rng() % max_pos);
            std::memcpy(ids.host.data() + 4 * n * id_step, &id, 4);
            if (explicit_args) {
              std::memcpy(ids.host.data() + 4 * (n * id_step + 1), &id, 4);  // not read
              std::memcpy(tids.host.data() + 4 * n, &tid32, 4);
            } else {
              std::memcpy(tids.host.data() + 8 * n, &tid, 8);
            }
            std::memcpy(pids.host.data() + 8 * n, &pid, 8);
          }
          for (std::int64_t b = 0; b < batch; ++b) {
            const std::int64_t o = 100 * b;
            std::memcpy(offsets.host.data() + 8 * b, &o, 8);
          }
          for (Buffer* b : {&table, &ptable, &ttable, &ids, &tids, &offsets, &pids}) b->upload();
          out.poison_both(0xff);
          auto run = [&](bool gpu) {
            const Device d = gpu ? Device::cuda(0) : Device::cpu();
            auto ptr = [&](Buffer& b) -> void* { return gpu ? b.device : b.host.data(); };
            embrope::DeferredStatus status(d);
            embrope::EmbedOptions o;
            o.scale = 1.5f;
            o.positions = positions;
            if (positions == embrope::PositionEncoding::learned) {
              o.position_table = Tensor(ptr(ptable), dtype, {max_pos, dim}, d);
            }
            if (positions != embrope::PositionEncoding::none) {
              if (explicit_args) {
                o.position_ids = Tensor(ptr(pids), DType::int64, {batch, seq}, d);
              } else {
                o.position_offsets = Tensor(ptr(offsets), DType::int64, {batch}, d);
              }
            }
            o.type_table = Tensor(ptr(ttable), dtype, {types, dim}, d);
            o.type_ids = Tensor(ptr(tids), type_dtype, {batch, seq}, d);
            if (explicit_args) o.deferred = &status;
            embrope::embed(
                Tensor(ptr(table), dtype, {vocab, dim}, d),
                Tensor(ptr(ids), DType::int32, {batch, seq}, {seq * id_step, id_step}, d),
                Tensor(ptr(out), dtype, {batch, seq, dim}, d), o);
            CHECK(status.ok());
          };
          run(false);
          run(true);
          cuda_check(cudaDeviceSynchronize());
          compare_rows(out.download(), out.host, dtype, batch * seq * dim, dim);
        }
      }
    }
  }
}

TEST_CASE("GPU embed: every float16 and bfloat16 bit pattern rounds as on the CPU",
          "[gpu][embed][numerics]") {
  // The token table holds each of the 65,536 16-bit patterns (NaNs with payloads, infinities,
  // subnormals, both zeros), the learned position table the same in another order. A plain
  // lookup copies them; scaled, or summed with a position row, they give every case of the
  // rounding to 16 bits: ties (two 16-bit values add exactly in float32), subnormal results,
  // overflow to infinity, inf - inf, NaN inputs. The GPU rounds with its cvt instructions,
  // the CPU with bit routines: the bits must agree. A NaN must stay a NaN, with its sign and
  // payload where the lookup copies rows (scale 1, no positions); after arithmetic the GPU's
  // float32 NaN is the canonical one (docs/numerics.md), the CPU's keeps its operand's bits.
  for (DType dtype : {DType::float16, DType::bfloat16}) {
    // 64: the 16-byte path; 66: the scalar one.
    for (std::int64_t dim : {64, 66}) {
      const std::int64_t vocab = (65536 + dim - 1) / dim, max_pos = vocab;
      Buffer table(vocab * dim * 2), ptable(max_pos * dim * 2), ids(vocab * 8), pids(vocab * 8),
          out(vocab * dim * 2);
      for (std::int64_t i = 0; i < vocab * dim; ++i) {
        const auto token_bits = static_cast<std::uint16_t>(i);
        const auto position_bits = static_cast<std::uint16_t>(i * 40503);  // odd: a permutation
        std::memcpy(table.host.data() + 2 * i, &token_bits, 2);
        std::memcpy(ptable.host.data() + 2 * i, &position_bits, 2);
      }
      for (std::int64_t n = 0; n < vocab; ++n) {
        const std::int64_t id = (n * 5) % vocab, pid = (n * 7 + 3) % max_pos;
        std::memcpy(ids.host.data() + 8 * n, &id, 8);
        std::memcpy(pids.host.data() + 8 * n, &pid, 8);
      }
      for (Buffer* b : {&table, &ptable, &ids, &pids}) b->upload();
      // 1 + 2^-11 and 1 + 2^-8 put products next to ties of float16 and bfloat16; 2^-20 makes
      // subnormals, 2^17 overflows.
      const float scales[] = {1.0f, 1.00048828125f, 1.00390625f, -3.0f, 0x1p-20f, 0x1p17f};
      for (bool learned : {false, true}) {
        for (float scale : scales) {
          INFO("dtype " << embrope::dtype_name(dtype) << " D " << dim << " learned " << learned
                        << " scale " << scale);
          out.poison_both(0xa5);
          auto run = [&](bool gpu) {
            const Device d = gpu ? Device::cuda(0) : Device::cpu();
            auto ptr = [&](Buffer& b) -> void* { return gpu ? b.device : b.host.data(); };
            embrope::EmbedOptions o;
            o.scale = scale;
            if (learned) {
              o.positions = embrope::PositionEncoding::learned;
              o.position_table = Tensor(ptr(ptable), dtype, {max_pos, dim}, d);
              o.position_ids = Tensor(ptr(pids), DType::int64, {vocab}, d);
            }
            embrope::embed(Tensor(ptr(table), dtype, {vocab, dim}, d),
                           Tensor(ptr(ids), DType::int64, {vocab}, d),
                           Tensor(ptr(out), dtype, {vocab, dim}, d), o);
          };
          run(false);
          run(true);
          cuda_check(cudaDeviceSynchronize());
          const std::vector<unsigned char> gpu = out.download();
          const bool copies = scale == 1.0f && !learned;
          const std::uint16_t nan_above = dtype == DType::float16 ? 0x7c00 : 0x7f80;
          std::int64_t differ = 0, nans = 0, first = -1;
          for (std::int64_t i = 0; i < vocab * dim; ++i) {
            std::uint16_t g, c;
            std::memcpy(&g, gpu.data() + 2 * i, 2);
            std::memcpy(&c, out.host.data() + 2 * i, 2);
            const bool c_nan = (c & 0x7fff) > nan_above;
            nans += c_nan;
            const bool same = c_nan && !copies ? (g & 0x7fff) > nan_above : g == c;
            if (!same) {
              if (first < 0) first = i;
              ++differ;
            }
          }
          CHECK(nans > 0);  // the patterns' NaNs reach the output
          if (first >= 0) {
            std::uint16_t g, c;
            std::memcpy(&g, gpu.data() + 2 * first, 2);
            std::memcpy(&c, out.host.data() + 2 * first, 2);
            UNSCOPED_INFO(differ << " elements differ; the first, element " << first << ": gpu 0x"
                                 << std::hex << g << " cpu 0x" << c);
          }
          CHECK(differ == 0);
        }
      }
    }
  }
}

TEST_CASE("GPU embed: bad ids zero their rows, the error names the first, context usable",
          "[gpu][embed][errors]") {
  const std::int64_t vocab = 50, dim = 64, rows = 1000;
  Buffer table(vocab * dim * 4), ids(rows * 8), out(rows * dim * 4);
  fill_random(table, DType::float32, vocab * dim, 11);
  for (std::int64_t n = 0; n < rows; ++n) {
    const std::int64_t id = n == 611 ? -3 : (n == 900 ? vocab : n % vocab);
    std::memcpy(ids.host.data() + 8 * n, &id, 8);
  }
  table.upload();
  ids.upload();
  out.poison_both(0xff);
  const Device gpu = Device::cuda(0);
  const Tensor tt(table.device, DType::float32, {vocab, dim}, gpu);
  const Tensor ti(ids.device, DType::int64, {rows}, gpu);
  const Tensor to(out.device, DType::float32, {rows, dim}, gpu);
  REQUIRE_THROWS_WITH(embrope::embed(tt, ti, to), Catch::Contains("ids[611] = -3"));
  embrope::embed(Tensor(table.host.data(), DType::float32, {vocab, dim}),
                 Tensor(ids.host.data(), DType::int64, {rows}),
                 Tensor(out.host.data(), DType::float32, {rows, dim}), [] {
                   embrope::EmbedOptions o;
                   o.vocab_shard = true;  // CPU oracle for the good rows; bad rows are zero
                   return o;
                 }());
  compare_rows(out.download(), out.host, DType::float32, rows * dim, dim);
  // Vocab-parallel shard on the GPU: the same ids are no error.
  embrope::EmbedOptions shard;
  shard.vocab_shard = true;
  embrope::embed(tt, ti, to, shard);
  compare_rows(out.download(), out.host, DType::float32, rows * dim, dim);
}

TEST_CASE("GPU embed: vocab shards, explicit positions, split sinusoids, strided out",
          "[gpu][embed]") {
  // D 96: each 16-byte chunk of a split row within one half (48 pairs); D 40: for bfloat16
  // the chunk at element 16 straddles the halves (20 pairs), for float32 it does not.
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (bool split : {false, true}) {
      for (std::int64_t dim : {96, 40}) {
        INFO("dtype " << embrope::dtype_name(dtype) << " split " << split << " D " << dim);
        const std::int64_t vocab = 500, vocab_start = 1000, n = 77, pad = 8;
        const int es = embrope::dtype_size(dtype);
        Buffer table(vocab * dim * es), ids(n * 8), pids(n * 8), out(n * (dim + pad) * es);
        fill_random(table, dtype, vocab * dim, 31);
        std::mt19937_64 rng(32);
        for (std::int64_t i = 0; i < n; ++i) {
          // About a third of the ids fall outside the shard [1000, 1500): zero token rows.
          const std::int64_t id = 800 + static_cast<std::int64_t>(rng() % 900);
          const std::int64_t p = static_cast<std::int64_t>(rng() % 100000);
          std::memcpy(ids.host.data() + 8 * i, &id, 8);
          std::memcpy(pids.host.data() + 8 * i, &p, 8);
        }
        for (Buffer* x : {&table, &ids, &pids}) x->upload();
        out.poison_both(0x3c);  // small finite values in every dtype
        auto run = [&](bool gpu) {
          const Device dev = gpu ? Device::cuda(0) : Device::cpu();
          auto ptr = [&](Buffer& x) -> void* { return gpu ? x.device : x.host.data(); };
          embrope::EmbedOptions o;
          o.vocab_start = vocab_start;
          o.vocab_shard = true;
          o.scale = 0.5f;
          o.positions = embrope::PositionEncoding::sinusoidal;
          o.sinusoid_layout =
              split ? embrope::SinusoidLayout::split : embrope::SinusoidLayout::interleaved;
          o.position_ids = Tensor(ptr(pids), DType::int64, {n}, dev);
          embrope::embed(Tensor(ptr(table), dtype, {vocab, dim}, dev),
                         Tensor(ptr(ids), DType::int64, {n}, dev),
                         Tensor(ptr(out), dtype, {n, dim}, {dim + pad, 1}, dev), o);
        };
        run(false);
        run(true);
        cuda_check(cudaDeviceSynchronize());
        // Rows of dim + pad: the padding must still hold the poison on both sides.
        compare_rows(out.download(), out.host, dtype, n * (dim + pad), dim + pad);
      }
    }
  }
}

TEST_CASE("GPU embed + layer_norm / rms_norm equals the CPU", "[gpu][embed][norm]") {
  // 19 rows: blocks of 2 rows with an idle slot in the last. D 64 and 384: the 16-byte path
  // (one and two lane steps); 1000: the 16-byte path with a partial last step; 100 (not a
  // multiple of 8): the scalar path, with a partial last step. With learned positions the
  // 16-byte path holds the row in 4 (D 64-1000), 8 (1800) or 16 (4000) steps of 256, some
  // lanes with a step fewer; 4360 (17 steps) re-reads it. Row 5 has a bad id (zero rows,
  // reported).
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (auto norm : {embrope::Normalization::layer_norm, embrope::Normalization::rms_norm}) {
      for (auto positions :
           {embrope::PositionEncoding::learned, embrope::PositionEncoding::sinusoidal}) {
        for (std::int64_t dim : {64, 100, 384, 1000, 1800, 4000, 4360}) {
          if (dim > 1000 && positions != embrope::PositionEncoding::learned) continue;
          for (bool pre_f32 : {false, true}) {
            INFO("dtype " << embrope::dtype_name(dtype) << " norm " << static_cast<int>(norm)
                          << " positions " << static_cast<int>(positions) << " D " << dim
                          << " pre_norm_out " << (pre_f32 ? "float32" : "table dtype"));
            const std::int64_t vocab = 50, rows = 19, max_pos = 64;
            const int es = embrope::dtype_size(dtype);
            const DType pre_dtype = pre_f32 ? DType::float32 : dtype;
            const DType weight_dtype = pre_f32 ? dtype : DType::float32;
            const int ps = embrope::dtype_size(pre_dtype), ws = embrope::dtype_size(weight_dtype);
            Buffer table(vocab * dim * es), ptable(max_pos * dim * es), ttable(2 * dim * es);
            Buffer weight(dim * ws), bias(dim * ws), ids(rows * 8), pids(rows * 8), tids(rows * 8);
            Buffer out(rows * dim * es), pre(rows * dim * ps);
            fill_random(table, dtype, vocab * dim, 41);
            fill_random(ptable, dtype, max_pos * dim, 42);
            fill_random(ttable, dtype, 2 * dim, 43);
            fill_random(weight, weight_dtype, dim, 44);
            fill_random(bias, weight_dtype, dim, 45);
            std::mt19937_64 rng(46);
            for (std::int64_t n = 0; n < rows; ++n) {
              const std::int64_t id = n == 5 ? vocab + 1 : static_cast<std::int64_t>(rng() % vocab);
              const std::int64_t pid = static_cast<std::int64_t>(rng() % max_pos);
              const std::int64_t tid = n % 2;
              std::memcpy(ids.host.data() + 8 * n, &id, 8);
              std::memcpy(pids.host.data() + 8 * n, &pid, 8);
              std::memcpy(tids.host.data() + 8 * n, &tid, 8);
            }
            for (Buffer* b : {&table, &ptable, &ttable, &weight, &bias, &ids, &pids, &tids}) {
              b->upload();
            }
            out.poison_both(0x7f);
            pre.poison_both(0x7f);
            auto run = [&](bool gpu) {
              const Device d = gpu ? Device::cuda(0) : Device::cpu();
              auto ptr = [&](Buffer& b) -> void* { return gpu ? b.device : b.host.data(); };
              embrope::DeferredStatus status(d);
              embrope::EmbedOptions o;
              o.scale = 1.5f;
              o.positions = positions;
              if (positions == embrope::PositionEncoding::learned) {
                o.position_table = Tensor(ptr(ptable), dtype, {max_pos, dim}, d);
              }
              o.position_ids = Tensor(ptr(pids), DType::int64, {rows}, d);
              o.type_table = Tensor(ptr(ttable), dtype, {2, dim}, d);
              o.type_ids = Tensor(ptr(tids), DType::int64, {rows}, d);
              o.norm = norm;
              o.norm_eps = 1e-6f;
              o.norm_unit_offset = pre_f32;
              o.norm_weight = Tensor(ptr(weight), weight_dtype, {dim}, d);
              if (norm == embrope::Normalization::layer_norm) {
                o.norm_bias = Tensor(ptr(bias), weight_dtype, {dim}, d);
              }
              o.pre_norm_out = Tensor(ptr(pre), pre_dtype, {rows, dim}, d);
              o.deferred = &status;
              embrope::embed(Tensor(ptr(table), dtype, {vocab, dim}, d),
                             Tensor(ptr(ids), DType::int64, {rows}, d),
                             Tensor(ptr(out), dtype, {rows, dim}, d), o);
              REQUIRE_THROWS_WITH(status.check(), Catch::Contains("ids[5] = 51"));
            };
            run(false);
            run(true);
            cuda_check(cudaDeviceSynchronize());
            if (positions == embrope::PositionEncoding::learned) {
              // The same arithmetic in the same order: the same bits.
              REQUIRE(out.download() == out.host);
              REQUIRE(pre.download() == pre.host);
            } else {
              compare_rows(out.download(), out.host, dtype, rows * dim, dim);
              compare_rows(pre.download(), pre.host, pre_dtype, rows * dim, dim);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("GPU embed from quantized tables equals the CPU", "[gpu][embed][quant]") {
  // Every format, D 512 (two Q4_K / Q6_K blocks, sixteen Q8_0 / Q4_0 blocks per row), rows
  // padded by 16 bytes (every row on the format's load granule: the chunked path, several chunks
  // in flight per lane) and by 3 (rows anywhere: one value per lane), scales per group of 64
  // (int8) or 4 (int4), and of 96 (int8 and int4 of D 384: a group size no shift finds, the
  // kernels divide), with int8 zero points, or per row (float8); 13 ids, the sixth past the table
  // (a zero row, reported). Data bytes are random, GGUF's float16 scale fields finite, float8 codes
  // NaN-free; options: the plain lookup, scale with learned positions and types, then layer_norm
  // and rms_norm with sinusoidal positions; and the plain lookup and layer_norm again into an
  // output one element off its 16-byte alignment (the kernels' one-value-per-lane paths; the others
  // take chunks of 16 bytes). The same arithmetic in the same order: the same bits, but where
  // sinusoids enter (within compare_rows's bounds, as the float tables).
  using embrope::QuantFormat;
  const std::int64_t vocab = 20, rows = 13, max_pos = 32;
  struct Format {
    QuantFormat format;
    DType dtype;
    std::int64_t columns;  // bytes (elements) of a row
    bool scales, zero_points;
    std::int64_t groups = 8;  // scales per row
    std::int64_t dim = 512;
  };
  const Format formats[] = {
      {QuantFormat::int8, DType::int8, 512, true, true},
      // Groups of 4: chunks of 4 float32 values fit them, of 8 16-bit values do not (one value
      // per lane).
      {QuantFormat::int4, DType::uint8, 512 / 2, true, true, 128},
      {QuantFormat::int8, DType::int8, 384, true, true, 4, 384},  // groups of 96
      {QuantFormat::int4, DType::uint8, 384 / 2, true, true, 4, 384},
      {QuantFormat::float8_e4m3fn, DType::float8_e4m3fn, 512, true, false},
      {QuantFormat::float8_e5m2, DType::float8_e5m2, 512, true, false},
      {QuantFormat::gguf_q8_0, DType::uint8, 512 / 32 * 34, false, false},
      {QuantFormat::gguf_q4_0, DType::uint8, 512 / 32 * 18, false, false},
      {QuantFormat::gguf_q4_k, DType::uint8, 512 / 256 * 144, false, false},
      {QuantFormat::gguf_q6_k, DType::uint8, 512 / 256 * 210, false, false},
  };
  std::mt19937_64 rng(2027);
  for (const Format& f : formats)
    for (const std::int64_t pad : {std::int64_t{16}, std::int64_t{3}}) {
      const std::int64_t dim = f.dim;
      const std::int64_t stride = f.columns + pad;
      const std::int64_t groups = f.groups;
      Buffer data(vocab * stride), scales(vocab * groups * 4), zps(vocab * groups);
      for (auto& byte : data.host) byte = static_cast<unsigned char>(rng());
      auto half_at = [&](std::int64_t at) {  // a finite float16 in [-0.5, 0.5)
        const float v = static_cast<float>(static_cast<std::int64_t>(rng() % 1000) - 500) / 1000.0f;
        const std::uint16_t h = embrope::detail::float_to_half(v);
        std::memcpy(data.host.data() + at, &h, 2);
      };
      for (std::int64_t r = 0; r < vocab; ++r) {
        unsigned char* row = data.host.data() + r * stride;
        if (f.format == QuantFormat::gguf_q8_0 || f.format == QuantFormat::gguf_q4_0) {
          for (std::int64_t b = 0; b < dim / 32; ++b)
            half_at(r * stride + b * (f.columns / (dim / 32)));
        } else if (f.format == QuantFormat::gguf_q4_k) {
          for (std::int64_t b = 0; b < 2; ++b) {
            half_at(r * stride + b * 144);
            half_at(r * stride + b * 144 + 2);
          }
        } else if (f.format == QuantFormat::gguf_q6_k) {
          for (std::int64_t b = 0; b < 2; ++b) half_at(r * stride + b * 210 + 208);
        } else if (f.format == QuantFormat::float8_e4m3fn || f.format == QuantFormat::float8_e5m2) {
          for (std::int64_t j = 0; j < dim; ++j) row[j] &= 0x3f;  // exponents far from NaN codes
        }
      }
      fill_random(scales, DType::float32, vocab * groups, rng());
      for (auto& z : zps.host)
        z = static_cast<unsigned char>(static_cast<std::int8_t>(rng() % 9) - 4);
      Buffer ids(rows * 8), pids(rows * 8), tids(rows * 8);
      for (std::int64_t n = 0; n < rows; ++n) {
        const std::int64_t id = n == 5 ? vocab : static_cast<std::int64_t>(rng() % vocab);
        const std::int64_t pid = static_cast<std::int64_t>(rng() % max_pos), tid = n % 2;
        std::memcpy(ids.host.data() + 8 * n, &id, 8);
        std::memcpy(pids.host.data() + 8 * n, &pid, 8);
        std::memcpy(tids.host.data() + 8 * n, &tid, 8);
      }
      for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
        const int es = embrope::dtype_size(dtype);
        Buffer ptable(max_pos * dim * es), ttable(2 * dim * es), weight(dim * 4), bias(dim * 4);
        fill_random(ptable, dtype, max_pos * dim, 51);
        fill_random(ttable, dtype, 2 * dim, 52);
        fill_random(weight, DType::float32, dim, 53);
        fill_random(bias, DType::float32, dim, 54);
        for (Buffer* b :
             {&data, &scales, &zps, &ids, &pids, &tids, &ptable, &ttable, &weight, &bias}) {
          b->upload();
        }
        for (int run_index = 0; run_index < 6; ++run_index) {
          const bool shifted = run_index >= 4;  // out one element past 16-byte alignment
          const int variant = shifted ? 2 * (run_index - 4) : run_index;
          INFO("format " << static_cast<int>(f.format) << " D " << dim << " rows padded by " << pad
                         << " out " << embrope::dtype_name(dtype) << " variant " << variant
                         << (shifted ? " shifted" : ""));
          Buffer out((rows * dim + 1) * es);
          out.poison_both(0x7f);
          auto run = [&](bool gpu) {
            const Device d = gpu ? Device::cuda(0) : Device::cpu();
            auto ptr = [&](Buffer& b) -> void* { return gpu ? b.device : b.host.data(); };
            embrope::QuantizedTable table;
            table.format = f.format;
            table.dim = dim;
            table.data = Tensor(ptr(data), f.dtype, {vocab, f.columns}, {stride, 1}, d);
            const bool per_row =
                f.format == QuantFormat::float8_e4m3fn || f.format == QuantFormat::float8_e5m2;
            if (f.scales) {
              table.scales = per_row ? Tensor(ptr(scales), DType::float32, {vocab}, d)
                                     : Tensor(ptr(scales), DType::float32, {vocab, groups}, d);
            }
            if (f.zero_points)
              table.zero_points = Tensor(ptr(zps), DType::int8, {vocab, groups}, d);
            embrope::DeferredStatus status(d);
            embrope::EmbedOptions o;
            o.deferred = &status;
            if (variant >= 1) {
              o.scale = 0.75f;
              o.positions = variant == 1 ? embrope::PositionEncoding::learned
                                         : embrope::PositionEncoding::sinusoidal;
              if (variant == 1) o.position_table = Tensor(ptr(ptable), dtype, {max_pos, dim}, d);
              o.position_ids = Tensor(ptr(pids), DType::int64, {rows}, d);
              o.type_table = Tensor(ptr(ttable), dtype, {2, dim}, d);
              o.type_ids = Tensor(ptr(tids), DType::int64, {rows}, d);
            }
            if (variant >= 2) {
              o.norm = variant == 2 ? embrope::Normalization::layer_norm
                                    : embrope::Normalization::rms_norm;
              o.norm_weight = Tensor(ptr(weight), DType::float32, {dim}, d);
              if (variant == 2) o.norm_bias = Tensor(ptr(bias), DType::float32, {dim}, d);
            }
            embrope::embed(
                table, Tensor(ptr(ids), DType::int64, {rows}, d),
                Tensor(static_cast<char*>(ptr(out)) + (shifted ? es : 0), dtype, {rows, dim}, d),
                o);
            REQUIRE_THROWS_WITH(status.check(), Catch::Contains("ids[5] = 20"));
          };
          run(false);
          run(true);
          cuda_check(cudaDeviceSynchronize());
          const std::vector<unsigned char> gpu_out = out.download();
          if (variant <= 1) {
            REQUIRE(gpu_out == out.host);
          } else {  // the rows themselves (past the skipped element)
            const auto rows_of = [&](const std::vector<unsigned char>& all) {
              const auto first = all.begin() + (shifted ? es : 0);
              return std::vector<unsigned char>(first, first + rows * dim * es);
            };
            compare_rows(rows_of(gpu_out), rows_of(out.host), dtype, rows * dim, dim);
          }
        }
      }
    }
}

#if __has_include(<simt/simt.h>)
// The emulated device's memory model (its coalescing profiler): compiled only against the
// emulator, which counts the 32-byte sectors each launch touches (see test_apply_rope.cpp's
// axial case). On a GPU this case does not exist.
#include <simt/simt.h>

#include <set>

TEST_CASE("GPU quantized lookup reads each quantized byte once (emulated memory model)",
          "[gpu][embed][quant][model]") {
  // The benchmark's formats (benchmarks/bench.cpp, embed_quantized): D 4096 into bfloat16,
  // 2,048 distinct ids of a 4,096-row table (the model cases' embed shape). Loads: the launch's
  // distinct sectors are those of the rows, scales, zero points and ids it must read, no more.
  // And the sectors its warps' requests touch, summed, against those: L1 sectors per DRAM
  // sector, 1 when each request reads whole sectors that no other request reads. A lane that
  // read its chunk a byte at a time made a request per byte, each touching every sector of the
  // warp's span: 6.5 (int4) to 10.3 (Q8_0). The bounds are this kernel's figures with 2% to
  // spare: the affine and float8 rows with 8-byte loads, their scale read again per chunk (an
  // L1 hit); Q8_0's and Q6_K's blocks (34 and 210 bytes) allow 2-byte loads only; each GGUF
  // chunk reads its block's factors too (Q8_0's d in one load; Q4_K's and Q6_K's a byte at a
  // time). Q6_K's chunks took 4- and 8-byte loads in the blocks whose address allowed them
  // (3.67), chosen per chunk; a granule fixed per format (internal::quant_chunk_granule), so
  // that several chunks' loads issue before the first is used, puts it at 5.09, and took the
  // lookup on an H200 from 180 to 120 us all the same.
  using embrope::QuantFormat;
  simt_coalesce_enable();
  const std::int64_t vocab = 4096, dim = 4096, rows = 2048;
  struct Case {
    const char* name;
    QuantFormat format;
    DType dtype;
    std::int64_t columns, groups;  // bytes of a row; scales per row (0: none)
    bool zero_points;
    double max_l1_per_dram;
  };
  const Case cases[] = {
      {"int8", QuantFormat::int8, DType::int8, dim, 1, false, 1.15},
      {"int4", QuantFormat::int4, DType::uint8, dim / 2, dim / 32, true, 1.17},
      {"float8_e4m3fn", QuantFormat::float8_e4m3fn, DType::float8_e4m3fn, dim, 1, false, 1.15},
      {"q8_0", QuantFormat::gguf_q8_0, DType::uint8, dim / 32 * 34, 0, false, 5.28},
      {"q4_k", QuantFormat::gguf_q4_k, DType::uint8, dim / 256 * 144, 0, false, 3.07},
      {"q6_k", QuantFormat::gguf_q6_k, DType::uint8, dim / 256 * 210, 0, false, 5.20},
  };
  std::vector<std::int64_t> id_values(static_cast<std::size_t>(vocab));
  for (std::int64_t i = 0; i < vocab; ++i) id_values[static_cast<std::size_t>(i)] = i;
  std::shuffle(id_values.begin(), id_values.end(), std::mt19937_64(17));
  id_values.resize(static_cast<std::size_t>(rows));
  for (const Case& c : cases) {
    INFO(c.name);
    Buffer data(static_cast<std::size_t>(vocab * c.columns)),
        scales(static_cast<std::size_t>(vocab * c.groups * 4)),
        zps(static_cast<std::size_t>(vocab * c.groups)), ids(rows * 8),
        out(static_cast<std::size_t>(rows * dim * 2));
    std::memset(data.host.data(), 0x11, data.host.size());  // finite GGUF half scales
    fill_random(scales, DType::float32, vocab * c.groups, 3);
    std::memcpy(ids.host.data(), id_values.data(), rows * 8);
    for (Buffer* b : {&data, &scales, &zps, &ids}) b->upload();
    const Device g = Device::cuda(0);
    embrope::QuantizedTable table;
    table.format = c.format;
    table.dim = dim;
    table.data = Tensor(data.device, c.dtype, {vocab, c.columns}, g);
    if (c.groups == 1) table.scales = Tensor(scales.device, DType::float32, {vocab}, g);
    if (c.groups > 1) table.scales = Tensor(scales.device, DType::float32, {vocab, c.groups}, g);
    if (c.zero_points) table.zero_points = Tensor(zps.device, DType::int8, {vocab, c.groups}, g);
    embrope::embed(table, Tensor(ids.device, DType::int64, {rows}, g),
                   Tensor(out.device, DType::bfloat16, {rows, dim}, g));
    cuda_check(cudaDeviceSynchronize());
    simt_coalesce_stats loads{}, stores{};
    REQUIRE(simt_coalesce_last(0, &loads) == 1);
    REQUIRE(simt_coalesce_last(1, &stores) == 1);
    // The sectors of the bytes the lookup must read.
    std::set<std::uintptr_t> needed;
    const auto add = [&](const void* base, std::int64_t from, std::int64_t bytes) {
      const auto first = reinterpret_cast<std::uintptr_t>(base) + static_cast<std::uintptr_t>(from);
      for (std::uintptr_t s = first / 32; s <= (first + bytes - 1) / 32; ++s) needed.insert(s);
    };
    add(ids.device, 0, rows * 8);
    for (const std::int64_t id : id_values) {
      add(data.device, id * c.columns, c.columns);
      if (c.groups > 0) add(scales.device, id * c.groups * 4, c.groups * 4);
      if (c.zero_points) add(zps.device, id * c.groups, c.groups);
    }
    const double l1_per_dram =
        static_cast<double>(loads.sectors) / static_cast<double>(loads.footprint_sectors);
    INFO("load sectors " << loads.footprint_sectors << " (needed " << needed.size()
                         << "), summed over requests " << loads.sectors << " (" << loads.requests
                         << " requests): " << l1_per_dram
                         << " L1 sectors per DRAM sector; store sectors "
                         << stores.footprint_sectors << " for " << rows * dim * 2 << " bytes");
    CHECK(loads.footprint_sectors == static_cast<long long>(needed.size()));
    CHECK(stores.footprint_sectors * 32 >= rows * dim * 2);
    CHECK(stores.footprint_sectors * 32 <= rows * dim * 2 + 32);  // and the status word's
    CHECK(stores.full_requests >= stores.requests - 1);           // the status word's is not whole
    CHECK(l1_per_dram <= c.max_l1_per_dram);
  }
}
#endif

#if defined(CUDART_VERSION)
// A CUDA runtime's case (the emulated device has no memory pools): a call's own workspace comes
// from embrope's pool, which keeps it reserved across synchronisations (its release threshold),
// not from the device's current pool, cudaMallocAsync's, which with its default threshold of 0
// returned it at every synchronisation, so that the next call mapped it again (on an H200,
// 110 us and more per call); and that pool is left as the application set it.
TEST_CASE("GPU workspaces come from embrope's pool, not the device's", "[gpu][embed][workspace]") {
  // A float32 sinusoidal lookup of one token at D 65536: its table of the call's sinusoids takes
  // 132 D = 8.65 MB of workspace.
  constexpr std::int64_t dim = 65536;
  Buffer table(2 * dim * 4), ids(8), out(dim * 4);
  fill_random(table, DType::float32, 2 * dim, 41);
  std::memset(ids.host.data(), 0, 8);
  table.upload();
  ids.upload();
  const auto lookup = [&] {
    embrope::EmbedOptions o;
    o.positions = embrope::PositionEncoding::sinusoidal;
    embrope::embed(Tensor(table.device, DType::float32, {2, dim}, Device::cuda(0)),
                   Tensor(ids.device, DType::int64, {1}, Device::cuda(0)),
                   Tensor(out.device, DType::float32, {1, dim}, Device::cuda(0)), o);
    cuda_check(cudaDeviceSynchronize());
  };
  int device = 0;
  cuda_check(cudaGetDevice(&device));
  cudaMemPool_t device_pool = nullptr;
  cuda_check(cudaDeviceGetMemPool(&device_pool, device));
  // The device pool's high-water mark of memory in use, reset (to zero, or to what is in use
  // now): a workspace taken from that pool would raise it past what is in use now.
  std::uint64_t in_use = 0, high = 0;
  cuda_check(cudaMemPoolGetAttribute(device_pool, cudaMemPoolAttrUsedMemCurrent, &in_use));
  cuda_check(cudaMemPoolSetAttribute(device_pool, cudaMemPoolAttrUsedMemHigh, &high));
  lookup();
  std::size_t free_first = 0, free_second = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free_first, &total));
  lookup();  // the workspace reused: nothing more taken, nothing leaked
  cuda_check(cudaMemGetInfo(&free_second, &total));
  cuda_check(cudaMemPoolGetAttribute(device_pool, cudaMemPoolAttrUsedMemHigh, &high));
  INFO("the device pool's high-water mark " << high << " bytes, in use before " << in_use
                                            << " bytes; device memory free after the "
                                               "first call "
                                            << free_first << ", the second " << free_second);
  CHECK(high <= in_use);
  CHECK(free_second >= free_first);
  std::uint64_t threshold = 1;
  cuda_check(cudaMemPoolGetAttribute(device_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  CHECK(threshold == 0);
}
#endif
