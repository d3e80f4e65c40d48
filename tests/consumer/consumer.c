/* Links the installed embrope from C and looks up one embedding row. */
#include <embrope/embrope.h>
#include <stdio.h>

/* embrope.h gives the ABI version to the preprocessor (embrope/version.h). */
#if !defined(EMBROPE_ABI_VERSION) || EMBROPE_ABI_VERSION < 1
#error "embrope.h does not define EMBROPE_ABI_VERSION"
#endif

/* Globals of the names a user picks: the header's inline helpers must not shadow them
 * (this file is compiled with -Wshadow -Werror). */
int options, config, table, norm, kv, grads;

int main(void) {
  float rows[3][2] = {{1, 2}, {3, 4}, {5, 6}};
  int64_t ids[1] = {2};
  float out[2] = {0, 0};
  int64_t table_shape[2] = {3, 2}, ids_shape[1] = {1}, out_shape[2] = {1, 2};
  DLDevice cpu = {kDLCPU, 0};
  DLDataType f32 = {kDLFloat, 32, 1}, i64 = {kDLInt, 64, 1};
  DLTensor t = {rows, cpu, 2, f32, table_shape, NULL, 0};
  DLTensor i = {ids, cpu, 1, i64, ids_shape, NULL, 0};
  DLTensor o = {out, cpu, 2, f32, out_shape, NULL, 0};
  embrope_embed_options_t embed_options;
  embrope_embed_options_init(&embed_options);
  embed_options.scale = 2.0f;
  if (embrope_embed(&t, &i, &o, &embed_options, NULL) != EMBROPE_OK) {
    printf("error: %s\n", embrope_last_error());
    return 1;
  }
  printf("embrope %s (C): %g %g\n", embrope_version(), out[0], out[1]);
  return out[0] == 10.0f && out[1] == 12.0f ? 0 : 1;
}
