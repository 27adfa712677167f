/* A deliberately wrong candidate the check cannot see: correct for its first calls on a buffer,
   then it returns at once when called again and again on the same pointers (the timing loop), as a
   kernel caching its result by pointer would. Only an impossible timing gives it away. */
cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden,
                               int dtype, cudaStream_t stream) {
  static const void* last_in;
  static void* last_out;
  static long repeats;
  (void)stream;
  if (dtype != 0) return cudaErrorInvalidValue;
  if (input == last_in && out == last_out) {
    if (++repeats > 16) return cudaSuccess;
  } else {
    last_in = input, last_out = out, repeats = 0;
  }
  const float* restrict x = (const float*)input;
  float* restrict o = (float*)out;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* restrict gate = x + t * 2 * hidden;
    const float* restrict up = gate + hidden;
    float* restrict orow = o + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) {
      const float g = gate[i];
      orow[i] = g * (1.0f / (1.0f + expf(-g))) * up[i];
    }
  }
  return cudaSuccess;
}
