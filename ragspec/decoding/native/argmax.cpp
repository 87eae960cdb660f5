// The greedy pick: each row's index of its largest value, as torch.argmax gives it (the first
// index holding the maximum; where a row holds a NaN, the first NaN), in one call that returns
// plain integers.
//
// A greedy step picks one token out of a vocabulary of 50k-250k logits per row. torch.argmax runs
// one scalar pass per row (about 40-60 us a row at 49,152 logits here), and reading the result
// back plus comparing it with the draft costs several more dispatched ops; this makes it two
// vector passes over a row that is still in cache from the output product: the maximum, then its
// first position. No arithmetic is involved (comparisons only), so the result is exactly
// torch.argmax's on every row.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace rs {
namespace {

// first NaN's index, or -1
int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i])) return i;
  return -1;
}

int64_t argmax_row(const float* x, int64_t n) {
  if (n <= 0) return 0;
  int64_t i = 0;
  float best = x[0];
  bool nan = false;
#if defined(__AVX512F__)
  if (n >= 16) {
    __m512 m = _mm512_loadu_ps(x);
    __mmask16 unordered = 0;
    for (i = 0; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_max_ps(m, v);
    }
    nan = unordered != 0;
    best = _mm512_reduce_max_ps(m);
  }
#endif
  for (; i < n; ++i) {  // the tail (or the whole row without AVX-512)
    nan |= std::isnan(x[i]);
    best = x[i] > best ? x[i] : best;
  }
  if (nan || std::isnan(best)) return first_nan(x, n);
  i = 0;
#if defined(__AVX512F__)
  const __m512 target = _mm512_set1_ps(best);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), target, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(unsigned(hit));
  }
#endif
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // not reached: best is one of the values
}

}  // namespace

std::vector<int64_t> argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              "argmax_rows takes a 2-D float32 CPU tensor");
  const at::Tensor c = x.contiguous();
  const int64_t rows = c.size(0), n = c.size(1);
  const float* p = c.data_ptr<float>();
  std::vector<int64_t> out(rows);
  for (int64_t r = 0; r < rows; ++r) out[r] = argmax_row(p + r * n, n);
  return out;
}

}  // namespace rs

TORCH_LIBRARY_FRAGMENT(ragspec, m) {
  m.def("argmax_rows(Tensor x) -> int[]", &rs::argmax_rows);
}
