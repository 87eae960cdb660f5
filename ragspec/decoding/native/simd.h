// Sixteen fp32 lanes with one meaning on every machine, for the element-wise loops of a step
// (norms, rotary, SiLU, residuals).
//
// `F16` is one AVX-512 register, two AVX2 registers, or sixteen floats, and each of its
// operations is the same IEEE operation lane by lane on all three (a fused multiply-add only
// where `fma` is written; the kernels are built with -ffp-contract=off), so a loop written once
// over F16 gives the same bits with AVX-512, with AVX2 and without either. Reductions
// (`sum_squares`) keep sixteen partial sums, lane j taking the values j, j + 16, j + 32, ..., and
// add them in one fixed tree: a row's result depends only on that row and its length.
// `exp` is a polynomial (Cephes' expf: |error| about 1 ulp on the range used), computed with
// the same operations on every path.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace rs {
namespace simd {

#if defined(__AVX512F__)
struct F16 {
  __m512 v;
  static F16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static F16 set(float x) { return {_mm512_set1_ps(x)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  friend F16 operator+(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
  friend F16 operator-(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
  friend F16 operator*(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
  friend F16 operator/(F16 a, F16 b) { return {_mm512_div_ps(a.v, b.v)}; }
  friend F16 fma(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  friend F16 min(F16 a, F16 b) { return {_mm512_min_ps(a.v, b.v)}; }
  friend F16 max(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
  // nearest integer (ties to even), as a float
  friend F16 round(F16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
  // 2^n for integral n in -126..127
  friend F16 pow2(F16 n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
  }
};
#elif defined(__AVX2__) && defined(__FMA__)
struct F16 {
  __m256 a, b;
  static F16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static F16 set(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  void store(float* p) const {
    _mm256_storeu_ps(p, a);
    _mm256_storeu_ps(p + 8, b);
  }
  friend F16 operator+(F16 x, F16 y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
  friend F16 operator-(F16 x, F16 y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
  friend F16 operator*(F16 x, F16 y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
  friend F16 operator/(F16 x, F16 y) { return {_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)}; }
  friend F16 fma(F16 x, F16 y, F16 z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
  friend F16 min(F16 x, F16 y) { return {_mm256_min_ps(x.a, y.a), _mm256_min_ps(x.b, y.b)}; }
  friend F16 max(F16 x, F16 y) { return {_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)}; }
  friend F16 round(F16 x) {
    constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return {_mm256_round_ps(x.a, mode), _mm256_round_ps(x.b, mode)};
  }
  friend F16 pow2(F16 n) {
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256i ea = _mm256_add_epi32(_mm256_cvtps_epi32(n.a), bias), eb = _mm256_add_epi32(_mm256_cvtps_epi32(n.b), bias);
    return {_mm256_castsi256_ps(_mm256_slli_epi32(ea, 23)), _mm256_castsi256_ps(_mm256_slli_epi32(eb, 23))};
  }
};
#else
struct F16 {
  float v[16];
  template <typename Op>
  static F16 each(Op op) {
    F16 r;
    for (int i = 0; i < 16; ++i) r.v[i] = op(i);
    return r;
  }
  static F16 load(const float* p) { return each([&](int i) { return p[i]; }); }
  static F16 set(float x) { return each([&](int) { return x; }); }
  void store(float* p) const { std::memcpy(p, v, sizeof v); }
  friend F16 operator+(F16 x, F16 y) { return each([&](int i) { return x.v[i] + y.v[i]; }); }
  friend F16 operator-(F16 x, F16 y) { return each([&](int i) { return x.v[i] - y.v[i]; }); }
  friend F16 operator*(F16 x, F16 y) { return each([&](int i) { return x.v[i] * y.v[i]; }); }
  friend F16 operator/(F16 x, F16 y) { return each([&](int i) { return x.v[i] / y.v[i]; }); }
  friend F16 fma(F16 x, F16 y, F16 z) { return each([&](int i) { return std::fma(x.v[i], y.v[i], z.v[i]); }); }
  // the vector min/max: the second operand when either is NaN
  friend F16 min(F16 x, F16 y) { return each([&](int i) { return x.v[i] < y.v[i] ? x.v[i] : y.v[i]; }); }
  friend F16 max(F16 x, F16 y) { return each([&](int i) { return x.v[i] > y.v[i] ? x.v[i] : y.v[i]; }); }
  friend F16 round(F16 x) { return each([&](int i) { return std::nearbyint(x.v[i]); }); }
  friend F16 pow2(F16 n) {
    return each([&](int i) {
      const uint32_t bits = uint32_t(int32_t(n.v[i]) + 127) << 23;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    });
  }
};
#endif

// e^x, lane by lane (x clamped to [-87, 88], where the result is a normal float).
inline F16 exp(F16 x) {
  x = min(max(x, F16::set(-87.0f)), F16::set(88.0f));
  const F16 n = round(x * F16::set(1.44269504088896341f));
  F16 r = fma(n, F16::set(-0.693359375f), x);
  r = fma(n, F16::set(2.12194440e-4f), r);
  F16 p = F16::set(1.9875691500e-4f);
  p = fma(p, r, F16::set(1.3981999507e-3f));
  p = fma(p, r, F16::set(8.3334519073e-3f));
  p = fma(p, r, F16::set(4.1665795894e-2f));
  p = fma(p, r, F16::set(1.6666665459e-1f));
  p = fma(p, r, F16::set(5.0000001201e-1f));
  const F16 e = fma(p, r * r, r) + F16::set(1.0f);
  return e * pow2(n);
}

// Σ x[i]² over n values: sixteen partial sums (lane i % 16), added in a fixed tree.
inline float sum_squares(const float* x, int64_t n) {
  F16 acc = F16::set(0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const F16 v = F16::load(x + i);
    acc = fma(v, v, acc);
  }
  float lanes[16];
  acc.store(lanes);
  for (int64_t j = i; j < n; ++j) lanes[j - i] = std::fma(x[j], x[j], lanes[j - i]);
  for (int width = 8; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  return lanes[0];
}

// 16 values of x from i (`count` < 16: the first count, the rest zero).
inline F16 part(const float* x, int64_t i, int64_t count) {
  if (count == 16) return F16::load(x + i);
  float tmp[16] = {0};
  std::memcpy(tmp, x + i, sizeof(float) * count);
  return F16::load(tmp);
}

// Stores the first `count` lanes of v at y + i.
inline void put(F16 v, float* y, int64_t i, int64_t count) {
  if (count == 16) return v.store(y + i);
  float tmp[16];
  v.store(tmp);
  std::memcpy(y + i, tmp, sizeof(float) * count);
}

// y[i..i+16) = f(i, count) for i = 0, 16, ... < n (count = 16, or what is left at the end):
// every value sees the same operations, the last ones on a padded copy. y may be one of f's
// inputs (each chunk is read before it is written).
template <typename F>
inline void map16(int64_t n, float* y, F f) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t count = n - i < 16 ? n - i : 16;
    put(f(i, count), y, i, count);
  }
}

}  // namespace simd
}  // namespace rs
