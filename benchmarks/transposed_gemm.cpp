/* The figure behind blas::transposed_copy_pays (include/anvil/core/blas.hpp): one layer's
 * forward product y = x W^T (x [batch, in], W [out, in], row-major) through the BLAS's
 * sgemm_ as it is (column-major "TN"), against copying W^T out first with anvil's
 * simd::transpose, as MlpTape does, and multiplying by it ("NN"), the copy timed with the
 * product. Best of 5 repeats each; one JSON line per shape. simd.hpp is a light header.
 *
 *   g++ -O3 -std=c++20 -Iinclude -o transposed_gemm benchmarks/transposed_gemm.cpp \
 *       /usr/lib/x86_64-linux-gnu/libblas.so.3
 *   env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=1 taskset -c 0 ./transposed_gemm
 */
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <anvil/core/simd.hpp>

extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void plain(int batch, int out, int in, const float* x, const float* w, float* wt, float* y) {
  const float one = 1, zero = 0;
  (void)wt;
  sgemm_("T", "N", &out, &batch, &in, &one, w, &in, x, &in, &zero, y, &out);
}

static void copied(int batch, int out, int in, const float* x, const float* w, float* wt, float* y) {
  const float one = 1, zero = 0;
  anvil::simd::transpose(wt, w, out, in);
  sgemm_("N", "N", &out, &batch, &in, &one, wt, &out, x, &in, &zero, y, &out);
}

typedef void (*product)(int, int, int, const float*, const float*, float*, float*);

static double best_us(product f, int batch, int out, int in, const float* x, const float* w, float* wt, float* y) {
  const long iters = 2000000L / ((long)batch * out * in / 1000 + 10) + 1;
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const double t = now();
    for (long i = 0; i < iters; ++i) f(batch, out, in, x, w, wt, y);
    const double us = (now() - t) / (double)iters * 1e6;
    if (us < best) best = us;
  }
  return best;
}

int main(void) {
  static const int shapes[][3] = {/* batch, out, in */
                                  {100, 64, 64}, {100, 64, 3},  {256, 64, 64}, {256, 64, 4},  {64, 64, 64},
                                  {32, 64, 64},  {16, 64, 64},  {1, 64, 3},    {1, 64, 17},   {256, 256, 256}};
  const size_t big = 1024 * 1024;
  float *x = static_cast<float*>(std::malloc(big * sizeof *x)), *w = static_cast<float*>(std::malloc(big * sizeof *w)),
        *wt = static_cast<float*>(std::malloc(big * sizeof *wt)), *y = static_cast<float*>(std::malloc(big * sizeof *y));
  if (!x || !w || !wt || !y) return 1;
  for (size_t i = 0; i < big; ++i) {
    x[i] = (float)rand() / (float)RAND_MAX;
    w[i] = (float)rand() / (float)RAND_MAX;
  }
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
    const int batch = shapes[s][0], out = shapes[s][1], in = shapes[s][2];
    const double a = best_us(plain, batch, out, in, x, w, wt, y), b = best_us(copied, batch, out, in, x, w, wt, y);
    printf("{\"bench\": \"transposed_gemm\", \"batch\": %d, \"out\": %d, \"in\": %d, \"tn_us\": %.2f, "
           "\"copy_nn_us\": %.2f, \"speedup\": %.2f}\n",
           batch, out, in, a, b, a / b);
  }
  free(x);
  free(w);
  free(wt);
  free(y);
  return 0;
}
