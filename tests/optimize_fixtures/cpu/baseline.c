/* CPU stand-in "production" silu_and_mul: out[t, i] = silu(x[t, i]) * x[t, d + i].
   Two passes through a scratch buffer, SiLU as g * (1 + tanh(g / 2)) / 2 in double precision:
   correct and deliberately unhurried, so a candidate has something to win. */
cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden,
                               int dtype, cudaStream_t stream) {
  (void)stream;
  if (dtype != 0) return cudaErrorInvalidValue;
  const float* x = (const float*)input;
  float* o = (float*)out;
  double* act = (double*)malloc(sizeof(double) * (size_t)(hidden > 0 ? hidden : 1));
  if (!act) return cudaErrorInvalidValue;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * 2 * hidden;
    for (int64_t i = 0; i < hidden; ++i) {
      double g = row[i];
      act[i] = g * 0.5 * (1.0 + tanh(0.5 * g));
    }
    for (int64_t i = 0; i < hidden; ++i) o[t * hidden + i] = (float)(act[i] * (double)row[hidden + i]);
  }
  free(act);
  return cudaSuccess;
}
