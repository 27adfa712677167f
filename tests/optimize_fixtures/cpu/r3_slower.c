/* Round 3 (scripted): correct, but evaluates the baseline's tanh-form SiLU 32 times per
   element (the volatile counter keeps the compiler from merging the repeats): slower, by a margin
   that holds on a loaded 2-core machine (8 repeats against the baseline's malloc + two passes
   ranked it faster once under load on the test shapes). */
cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden,
                               int dtype, cudaStream_t stream) {
  (void)stream;
  if (dtype != 0) return cudaErrorInvalidValue;
  const float* x = (const float*)input;
  float* o = (float*)out;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * 2 * hidden;
    for (int64_t i = 0; i < hidden; ++i) {
      double acc = 0.0;
      for (volatile int rep = 0; rep < 32; ++rep) {
        double g = (double)row[i] + 0.0 * rep;
        acc = g * 0.5 * (1.0 + tanh(0.5 * g));
      }
      o[t * hidden + i] = (float)(acc * (double)row[hidden + i]);
    }
  }
  return cudaSuccess;
}
