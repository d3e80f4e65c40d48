// Hostile inputs to RopeCache, AdaptiveRopeCache and the C cache functions (docs/ops.md,
// docs/errors.md): bad configurations on both surfaces, indices outside the table, a moved-from
// cache, NULL handles and out-parameters, unknown devices; then the scaling configurations through
// the C API, rope_frequencies and AdaptiveRopeCache lengths. The harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "rope_cache";
constexpr const char* kScalingGroup = "rope_cache scaling";

std::vector<CallCase> rope_cache_cases() {
  std::vector<CallCase> cases;
  const std::int64_t huge_positions = std::int64_t{1} << 46;  // 2^49 bytes: never allocatable
  struct Config {
    std::string name;
    std::int64_t rotary_dim;
    double base;
    std::int64_t max_positions;
    Expect expect;
  };
  const std::vector<Config> configs = {
      {"rotary_dim 0", 0, 10000.0, 16, invalid({"rotary_dim", "even"})},
      {"rotary_dim 7 (odd)", 7, 10000.0, 16, invalid({"rotary_dim", "7", "even"})},
      {"rotary_dim -2", -2, 10000.0, 16, invalid({"rotary_dim", "-2"})},
      {"rotary_dim INT64_MIN", kI64Min, 10000.0, 16, invalid({"rotary_dim"})},
      {"base 0", 8, 0.0, 16, invalid({"base", "positive"})},
      {"base -1", 8, -1.0, 16, invalid({"base", "positive"})},
      {"base NaN", 8, kNaN, 16, invalid({"base", "finite"})},
      {"base infinity", 8, kInf, 16, invalid({"base", "finite"})},
      {"max_positions 0", 8, 10000.0, 0, invalid({"max_positions", "positive"})},
      {"max_positions -1", 8, 10000.0, -1, invalid({"max_positions", "positive"})},
      {"max_positions INT64_MIN", 8, 10000.0, kI64Min, invalid({"max_positions"})},
      {"max_positions * rotary_dim overflows", 1 << 20, 10000.0, kI64Max / 4,
       invalid({"max_positions", "overflows"})},
      {"a table too large to allocate", 2, 10000.0, huge_positions,
       Expect{{ErrorCode::out_of_memory}, {"allocate"}}},
  };
  for (const Config& c : configs) {
    cases.push_back({"RopeCache " + c.name, "RopeCache", c.expect,
                     [c] {
                       return run_cpp([&] {
                         embrope::RopeCache cache({c.rotary_dim, c.base, c.max_positions});
                       });
                     },
                     Surface::cpp});
    cases.push_back({"embrope_rope_cache_create " + c.name, "embrope_rope_cache_create", c.expect,
                     [c] {
                       embrope_rope_config_t config;
                       embrope_rope_config_init(&config);
                       config.rotary_dim = c.rotary_dim;
                       config.base = c.base;
                       config.max_positions = c.max_positions;
                       embrope_rope_cache_t* cache = reinterpret_cast<embrope_rope_cache_t*>(1);
                       const Outcome o = from_status(embrope_rope_cache_create(
                           &config, DLDevice{kDLCPU, 0}, nullptr, &cache));
                       CHECK(cache == nullptr);  // no handle on failure
                       return o;
                     },
                     Surface::c});
  }
  const auto cpu_cache = [] {
    return std::make_shared<embrope::RopeCache>(embrope::RopeConfig{8, 10000.0, 4});
  };
  cases.push_back(
      {"RopeCache on an unknown device kind", "RopeCache", invalid({}),
       [] {
         return run_cpp([] {
           embrope::RopeCache c({8, 10000.0, 4}, Device{static_cast<embrope::DeviceKind>(3), 0});
         });
       },
       Surface::cpp});
  for (auto [pos, i] : {std::pair<std::int64_t, std::int64_t>{-1, 0},
                        {4, 0},
                        {0, -1},
                        {0, 4},
                        {kI64Min, 0},
                        {0, kI64Max}}) {
    cases.push_back({"RopeCache::cos(" + std::to_string(pos) + ", " + std::to_string(i) + ")",
                     "RopeCache", invalid({"outside"}),
                     [=] { return run_cpp([&] { (void)cpu_cache()->cos(pos, i); }); },
                     Surface::cpp});
    cases.push_back({"RopeCache::sin(" + std::to_string(pos) + ", " + std::to_string(i) + ")",
                     "RopeCache", invalid({"outside"}),
                     [=] { return run_cpp([&] { (void)cpu_cache()->sin(pos, i); }); },
                     Surface::cpp});
  }
  for (std::int64_t i : {std::int64_t{-1}, std::int64_t{4}, kI64Max}) {
    cases.push_back({"RopeCache::inv_freq(" + std::to_string(i) + ")", "RopeCache",
                     invalid({"frequency", "outside"}),
                     [=] { return run_cpp([&] { (void)cpu_cache()->inv_freq(i); }); },
                     Surface::cpp});
  }
  cases.push_back({"RopeCache::copy_to_host with null buffers", "RopeCache",
                   invalid({"copy_to_host"}),
                   [=] { return run_cpp([&] { cpu_cache()->copy_to_host(nullptr, nullptr); }); },
                   Surface::cpp});
  cases.push_back({"RopeCache::cos of a moved-from cache", "RopeCache", invalid({"moved"}),
                   [=] {
                     return run_cpp([&] {
                       auto c = cpu_cache();
                       embrope::RopeCache taken(std::move(*c));
                       (void)c->cos(0, 0);
                     });
                   },
                   Surface::cpp});

  // The C cache functions.
  auto make_c_cache = [] {
    embrope_rope_config_t config;
    embrope_rope_config_init(&config);
    config.rotary_dim = 8;
    config.max_positions = 4;
    embrope_rope_cache_t* cache = nullptr;
    REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
    return std::shared_ptr<embrope_rope_cache_t>(cache, embrope_rope_cache_destroy);
  };
  cases.push_back({"embrope_rope_cache_create with a NULL out-param", "embrope_rope_cache_create",
                   invalid({"cache", "null"}),
                   [] {
                     embrope_rope_config_t config;
                     embrope_rope_config_init(&config);
                     config.rotary_dim = 8;
                     config.max_positions = 4;
                     return from_status(
                         embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, nullptr));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_create with a NULL config", "embrope_rope_cache_create",
                   invalid({"config", "null"}),
                   [] {
                     embrope_rope_cache_t* cache = nullptr;
                     return from_status(
                         embrope_rope_cache_create(nullptr, DLDevice{kDLCPU, 0}, nullptr, &cache));
                   },
                   Surface::c});
  // Device types as a C caller may store them: -5 is no enumerator of DLDeviceType.
  for (int dev : {static_cast<int>(kDLCUDAHost), static_cast<int>(kDLOpenCL),
                  static_cast<int>(kDLVulkan), -5}) {
    cases.push_back({"embrope_rope_cache_create on DLPack device " + std::to_string(dev),
                     "embrope_rope_cache_create", invalid({"device"}),
                     [=] {
                       embrope_rope_config_t config;
                       embrope_rope_config_init(&config);
                       config.rotary_dim = 8;
                       config.max_positions = 4;
                       embrope_rope_cache_t* cache = nullptr;
                       DLDevice device{kDLCPU, 0};
                       std::memcpy(&device.device_type, &dev, sizeof dev);
                       return from_status(
                           embrope_rope_cache_create(&config, device, nullptr, &cache));
                     },
                     Surface::c});
  }
  if (embrope_cuda_device_count() == 0) {
    cases.push_back({"embrope_rope_cache_create on CUDA without a GPU", "embrope_rope_cache_create",
                     Expect{{ErrorCode::not_implemented}, {"CUDA"}},
                     [] {
                       embrope_rope_config_t config;
                       embrope_rope_config_init(&config);
                       config.rotary_dim = 8;
                       config.max_positions = 4;
                       embrope_rope_cache_t* cache = nullptr;
                       return from_status(embrope_rope_cache_create(&config, DLDevice{kDLCUDA, 0},
                                                                    nullptr, &cache));
                     },
                     Surface::c});
  }
  cases.push_back({"embrope_rope_cache_info with a NULL cache", "embrope_rope_cache_info",
                   invalid({"cache", "null"}),
                   [] {
                     embrope_rope_config_t config;
                     embrope_rope_config_init(&config);
                     DLDevice device;
                     return from_status(embrope_rope_cache_info(nullptr, &config, &device));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_info with NULL out-params is fine",
                   "embrope_rope_cache_info", ok(),
                   [=] {
                     auto cache = make_c_cache();
                     return from_status(embrope_rope_cache_info(cache.get(), nullptr, nullptr));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_copy_to_host with a NULL cache",
                   "embrope_rope_cache_copy_to_host", invalid({"cache", "null"}),
                   [] {
                     float cos[16], sin[16];
                     return from_status(embrope_rope_cache_copy_to_host(nullptr, cos, sin));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_copy_to_host with a NULL cos",
                   "embrope_rope_cache_copy_to_host", invalid({"cos", "null"}),
                   [=] {
                     auto cache = make_c_cache();
                     float sin[16];
                     return from_status(embrope_rope_cache_copy_to_host(cache.get(), nullptr, sin));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_copy_to_host with a NULL sin",
                   "embrope_rope_cache_copy_to_host", invalid({"sin", "null"}),
                   [=] {
                     auto cache = make_c_cache();
                     float cos[16];
                     return from_status(embrope_rope_cache_copy_to_host(cache.get(), cos, nullptr));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_destroy(NULL) does nothing", "embrope_rope_cache_destroy",
                   ok(), [] { return from_status(embrope_rope_cache_destroy(nullptr)); },
                   Surface::c});
  return cases;
}

// Scaling configurations through the C API, rope_frequencies and AdaptiveRopeCache lengths.
std::vector<ArenaCase> rope_scaling_cases() {
  std::vector<ArenaCase> cases;
  struct Scaling {
    std::string name;
    std::function<void(embrope_rope_config_t&)> edit;
    Expect expect;
  };
  static const double factors[4] = {1.0, 1.0, 1.0, 1.0};
  const std::vector<Scaling> scaling = {
      {"scaling 99",
       [](embrope_rope_config_t& c) {
         const int v = 99;
         std::memcpy(&c.scaling, &v, sizeof v);
       },
       invalid({"scaling", "99"})},
      {"linear factor NaN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LINEAR;
         c.factor = kNaN;
       },
       invalid({"factor", "finite"})},
      {"yarn factor infinity",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_YARN;
         c.factor = kInf;
         c.original_max_positions = 4;
       },
       invalid({"factor", "finite"})},
      {"yarn beta_fast NaN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_YARN;
         c.factor = 2.0;
         c.original_max_positions = 4;
         c.beta_fast = kNaN;
       },
       invalid({"beta_fast"})},
      {"llama3 original INT64_MIN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LLAMA3;
         c.factor = 8.0;
         c.original_max_positions = kI64Min;
       },
       invalid({"original_max_positions"})},
      {"longrope num_factors -1",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
         c.original_max_positions = 4;
         c.num_factors = -1;
       },
       invalid({"num_factors", "-1"})},
      {"longrope arrays NULL with num_factors 4",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
         c.original_max_positions = 4;
         c.num_factors = 4;
       },
       invalid({"num_factors", "null"})},
      {"longrope with 4 of 8 factors",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
         c.original_max_positions = 4;
         c.short_factor = factors;
         c.long_factor = factors;
         c.num_factors = 4;
       },
       invalid({"short_factor", "rotary_dim / 2"})},
      {"dynamic sequence_length INT64_MIN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_DYNAMIC;
         c.factor = 2.0;
         c.original_max_positions = 4;
         c.sequence_length = kI64Min;
       },
       invalid({"sequence_length"})},
  };
  for (const Scaling& k : scaling) {
    cases.push_back({"embrope_rope_cache_create " + k.name, "embrope_rope_cache_create", k.expect,
                     Surface::c, [k](Arena& arena) {
                       arena.seal();
                       embrope_rope_config_t c;
                       embrope_rope_config_init(&c);
                       c.rotary_dim = 16;
                       c.max_positions = 8;
                       k.edit(c);
                       embrope_rope_cache_t* handle = nullptr;
                       const Outcome o = from_status(
                           embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &handle));
                       CHECK(handle == nullptr);
                       return o;
                     }});
  }
  cases.push_back({"embrope_rope_frequencies capacity 0", "embrope_rope_frequencies",
                   invalid({"capacity"}), Surface::c, [](Arena& arena) {
                     arena.seal();
                     embrope_rope_config_t c;
                     embrope_rope_config_init(&c);
                     c.rotary_dim = 16;
                     c.max_positions = 8;
                     double f[8];
                     return from_status(embrope_rope_frequencies(&c, f, 0, nullptr));
                   }});

  // ---- AdaptiveRopeCache lengths.
  for (const std::int64_t length : {std::int64_t{0}, std::int64_t{-1}, kI64Min}) {
    cases.push_back({"AdaptiveRopeCache::get " + std::to_string(length), "AdaptiveRopeCache",
                     invalid({"sequence_length", "positive"}), Surface::cpp,
                     [length](Arena& arena) {
                       arena.seal();
                       embrope::AdaptiveRopeCache adaptive(embrope::RopeConfig{16, 10000.0, 8});
                       return run_cpp([&] { adaptive.get(length); });
                     }});
  }
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> rope_cache_hostile_case_names() {
  std::vector<hostile::CaseName> names = names_of(kGroup, rope_cache_cases());
  for (hostile::CaseName& n : names_of(kScalingGroup, rope_scaling_cases())) names.push_back(n);
  return names;
}

TEST_CASE("hostile inputs: RopeCache and the C cache functions", "[hostile][rope_cache]") {
  run_call_cases(kGroup, rope_cache_cases());
  // The init function takes NULL without crashing.
  embrope_rope_config_init(nullptr);
}

TEST_CASE("hostile inputs: scaling configurations, rope_frequencies, AdaptiveRopeCache lengths",
          "[hostile][rope_cache][scaling]") {
  run_arena_cases(kScalingGroup, rope_scaling_cases());
}
