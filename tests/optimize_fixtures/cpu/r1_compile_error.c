/* Round 1 (scripted): a fused single pass, but `gate` is used before it is declared. */
cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden,
                               int dtype, cudaStream_t stream) {
  (void)stream;
  if (dtype != 0) return cudaErrorInvalidValue;
  const float* x = (const float*)input;
  float* o = (float*)out;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * 2 * hidden;
    for (int64_t i = 0; i < hidden; ++i) {
      o[t * hidden + i] = gate / (1.0f + expf(-gate)) * row[hidden + i];
    }
  }
  return cudaSuccess;
}
