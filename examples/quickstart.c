/* The same from C: rotate q and k [T=2, H, D=4] in place with a cos/sin cache. */
#include <embrope/embrope.h>
#include <stdio.h>

int main(void) {
  float q[2][2][4] = {{{1, 0, 0, 0}, {0, 1, 0, 0}}, {{1, 0, 0, 0}, {0, 1, 0, 0}}};
  float k[2][1][4] = {{{1, 1, 1, 1}}, {{1, 1, 1, 1}}};
  int64_t positions[2] = {0, 5};
  int64_t q_shape[3] = {2, 2, 4}, k_shape[3] = {2, 1, 4}, p_shape[1] = {2};
  DLDevice cpu = {kDLCPU, 0};
  DLDataType f32 = {kDLFloat, 32, 1}, i64 = {kDLInt, 64, 1};
  DLTensor tq = {q, cpu, 3, f32, q_shape, NULL, 0};
  DLTensor tk = {k, cpu, 3, f32, k_shape, NULL, 0};
  DLTensor tp = {positions, cpu, 1, i64, p_shape, NULL, 0};

  embrope_rope_config_t config;
  embrope_rope_config_init(&config);
  config.rotary_dim = 4;
  config.max_positions = 4096;
  embrope_rope_cache_t* cache = NULL;
  if (embrope_rope_cache_create(&config, cpu, NULL, &cache) != EMBROPE_OK ||
      embrope_apply_rope(&tq, &tk, &tp, cache, NULL, NULL) != EMBROPE_OK) {
    fprintf(stderr, "embrope: %s\n", embrope_last_error());
    embrope_rope_cache_destroy(cache);
    return 1;
  }
  printf("q[1][0] = %.4f %.4f %.4f %.4f\n", q[1][0][0], q[1][0][1], q[1][0][2], q[1][0][3]);
  embrope_rope_cache_destroy(cache);
  return 0;
}
