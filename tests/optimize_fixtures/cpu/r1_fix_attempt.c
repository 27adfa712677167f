/* Round 1, fix attempt (scripted): declares `gate` but misspells expf. Still does not compile. */
cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden,
                               int dtype, cudaStream_t stream) {
  (void)stream;
  if (dtype != 0) return cudaErrorInvalidValue;
  const float* x = (const float*)input;
  float* o = (float*)out;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * 2 * hidden;
    for (int64_t i = 0; i < hidden; ++i) {
      const float gate = row[i];
      o[t * hidden + i] = gate / (1.0f + expff(-gate)) * row[hidden + i];
    }
  }
  return cudaSuccess;
}
