// Attention for decode and verify forwards whose rows do not depend on each other's presence.
//
// out[t, h] = Σ_j softmax_j(q[t, h] · k[j] · scale) v[j] over the keys row t may see: the
// contiguous range lo[t] .. hi[t] of the cache (causal, sliding windows: whatever the mask says,
// as long as it is one range per row). The loops over keys start at lo[t] and visit the keys in
// order, so a row sees the same arithmetic whether it is computed alone (a one-token step) or
// with the draft rows after it (a verify forward): bit-identical results, which is what keeps
// greedy speculation exact. Optional logit soft-capping (cap · tanh(s / cap)) as Gemma 2 uses.
//
// Keys and values are fp32 or fp16 (IEEE half, the KV cache's storage on the CPU: half the bytes
// a step reads from the cache). fp16 elements are widened to fp32 as they are loaded; all the
// arithmetic is fp32 and the same for both storages.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define RS_AVX2 1
#endif

namespace rs {

// Element loads: fp32 as it is, fp16 widened (exact).
static inline float ld1(const float* p) { return *p; }
static inline float ld1(const uint16_t* p) { return c10::detail::fp16_ieee_to_fp32_value(*p); }

// e^x for x <= 0 (softmax inputs after subtracting the maximum): 2^n · p(r), n = round(x / ln 2),
// r = x − n ln 2 split in two parts, p a degree-6 Taylor polynomial (|r| ≤ ln 2 / 2: relative
// error below 2e-7). The scalar and vector forms do the same operations.
static constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f,
                       kLn2Lo = 1.42860682030941723e-6f, kLow = -87.0f;

static inline float exp_neg(float x) {
  x = std::max(x, kLow);
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  float p = 1.0f / 720.0f;
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return std::ldexp(p, int(n));
}

#ifdef RS_AVX2
static inline __m256 exp_neg8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kLow));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fmadd_ps(_mm256_sub_ps(_mm256_setzero_ps(), n), _mm256_set1_ps(kLn2Lo),
                                   _mm256_fmadd_ps(_mm256_sub_ps(_mm256_setzero_ps(), n),
                                                   _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n: n in [-126, 0] here, so it fits the exponent field.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline __m256 ld8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 ld8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Requests the cache lines of n elements at p into the cache `hint` names (a request never
// faults, so one past the end of the cache is harmless).
template <typename T, _mm_hint HINT>
static inline void request_lines(const T* p, int64_t n) {
  const char* b = reinterpret_cast<const char*>(p);
  for (int64_t o = 0; o < n * int64_t(sizeof(T)); o += 64) _mm_prefetch(b + o, HINT);
}

static inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

// With AVX-512 the loops below run 16 lanes where they ran 8 (dot8, the shared scores and
// value sums, the softmax's exponentials, a row's weighted values), each lane seeing the same
// operations in the same order as in the 8-lane form: two keys' 8-lane accumulators share one
// register, the horizontal sums take the same pairs, value sums are per lane anyway. So the
// results are the same bits either way (tests/test_attention_kernel.py compares the two with
// `set_wide_attention`), and a prompt read takes about half the multiply-add instructions.
#if defined(RS_AVX2) && defined(__AVX512F__)
#define RS_WIDE 1
static bool g_wide = true;

static inline __m512 ld16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 ld16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// 8 elements at a in the low half, 8 at b in the high half.
static inline __m512 ld8x2(const float* a, const float* b) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(a))),
                                             _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}
static inline __m512 ld8x2(const uint16_t* a, const uint16_t* b) {
  const __m256i h = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_cvtph_ps(h);
}
// The 8 floats at p in both halves.
static inline __m512 dup8(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}
// _mm256_hadd_ps's pairs in each 256-bit half: in each 128-bit lane a0+a1, a2+a3, b0+b1, b2+b3.
static inline __m512 hadd16(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

static inline __m512 exp_neg16(__m512 x) {  // exp_neg8's operations, 16 lanes
  x = _mm512_max_ps(x, _mm512_set1_ps(kLow));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), n), _mm512_set1_ps(kLn2Lo),
                                   _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), n),
                                                   _mm512_set1_ps(kLn2Hi), x));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// dot8 (below) of QN queries against the same eight keys, 16 lanes: acc[a][i] holds key i's
// 8-lane sums in its low half and key i + 4's in its high half, and the tree of hadd16 and one
// lane swap makes dot8's sums from them (the same pairs added in the same order).
template <typename T, int QN>
static inline void dot8_wide(const float* const* q, const T* k, int64_t stride, int64_t d, __m256 scale,
                             float* const* s, int64_t j) {
  __m512 acc[QN][4];
  for (int a = 0; a < QN; ++a)
    for (int i = 0; i < 4; ++i) acc[a][i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    __m512 qv[QN];
    for (int a = 0; a < QN; ++a) qv[a] = dup8(q[a] + c);
    for (int i = 0; i < 4; ++i) {
      const __m512 kv = ld8x2(k + i * stride + c, k + (i + 4) * stride + c);
      for (int a = 0; a < QN; ++a) acc[a][i] = _mm512_fmadd_ps(qv[a], kv, acc[a][i]);
    }
  }
  for (int a = 0; a < QN; ++a) {
    const __m512 z = hadd16(hadd16(acc[a][0], acc[a][1]), hadd16(acc[a][2], acc[a][3]));  // [s0123 | s4567]
    const __m256 lo = _mm512_castps512_ps256(_mm512_shuffle_f32x4(z, z, 0x08));  // 128-bit lanes 0, 2
    const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(z, z, 0x0D));  // lanes 1, 3
    _mm256_storeu_ps(s[a] + j, _mm256_mul_ps(_mm256_add_ps(lo, hi), scale));
  }
}

// values32_shared (below), 16 lanes: dimensions c..c+31 as two registers a query, for up to
// six queries (kWideGroup) at once.
template <typename T, int QN>
static inline void values32_wide(const float* const* s, const T* v, int64_t vstride, int64_t j0, int64_t j1,
                                 int64_t c, __m512 (*o)[2]) {
  __m512 a[QN][2];
#pragma GCC unroll 6
  for (int b = 0; b < QN; ++b) a[b][0] = o[b][0], a[b][1] = o[b][1];
  for (int64_t j = j0; j < j1; ++j) {
    const T* vj = v + j * vstride + c;
    const __m512 v0 = ld16(vj), v1 = ld16(vj + 16);
#pragma GCC unroll 6
    for (int b = 0; b < QN; ++b) {
      const __m512 p = _mm512_set1_ps(s[b][j]);
      a[b][0] = _mm512_fmadd_ps(p, v0, a[b][0]), a[b][1] = _mm512_fmadd_ps(p, v1, a[b][1]);
    }
  }
#pragma GCC unroll 6
  for (int b = 0; b < QN; ++b) o[b][0] = a[b][0], o[b][1] = a[b][1];
}

// Up to six queries share a block's loads in the 16-lane loops (their sums fit the 32
// registers), as evenly as group_size splits them.
static constexpr int kWideGroup = 6;
static inline int wide_group_size(int Q, int a0) {
  const int groups = (Q + kWideGroup - 1) / kWideGroup, base = Q / groups, extra = Q % groups;
  return a0 < extra * (base + 1) ? base + 1 : base;
}

template <typename T, int QN = 1>
static inline void dot8_wide_n(int qn, const float* const* q, const T* k, int64_t stride, int64_t d, __m256 scale,
                               float* const* s, int64_t j) {
  if constexpr (QN < kWideGroup)
    if (qn != QN) return dot8_wide_n<T, QN + 1>(qn, q, k, stride, d, scale, s, j);
  dot8_wide<T, QN>(q, k, stride, d, scale, s, j);
}

template <typename T, int QN = 1>
static inline void values32_wide_n(int qn, const float* const* s, const T* v, int64_t vstride, int64_t j0,
                                   int64_t j1, int64_t c, __m512 (*o)[2]) {
  if constexpr (QN < kWideGroup)
    if (qn != QN) return values32_wide_n<T, QN + 1>(qn, s, v, vstride, j0, j1, c, o);
  values32_wide<T, QN>(s, v, vstride, j0, j1, c, o);
}
#endif

template <typename T>
static inline float dot(const float* a, const T* b, int64_t d) {
#ifdef RS_AVX2
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), ld8(b + i), acc);
  float s = hsum8(acc);
#else
  float s = 0.0f;
  int64_t i = 0;
#endif
  for (; i < d; ++i) s = std::fma(a[i], ld1(b + i), s);
  return s;
}

#ifdef RS_AVX2
// Eight keys' dot products with q at once: acc[i] collects key i's products 8 lanes at a time,
// then one transpose-and-add tree turns the eight accumulators into the eight sums. Every key
// is reduced by the same tree (lane pairs in the same order), whichever block it is in.
template <typename T>
static inline __m256 dot8(const float* q, const T* k, int64_t stride, int64_t d) {
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    const __m256 qv = _mm256_loadu_ps(q + c);
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, ld8(k + i * stride + c), acc[i]);
  }
  const __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  // lanes: [k0 k1 k2 k3 | k0 k1 k2 k3] halves of the sums for keys 0-3, and the same for 4-7
  const __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
  return _mm256_add_ps(lo, hi);
}
#endif

// The three parts of one query row's attention, each with its own fixed order of operations:
// the scores of keys lo..hi (dot8 for each whole block of eight keys from lo, then dot for the
// rest), the softmax of those scores in place (returns 1 / the sum), and the weighted sum of
// values (keys in order, 64 dimensions at a time in registers). attend_row runs them for one
// row; attend_rows_shared runs the same operations for several rows at once.
template <typename T>
static void row_scores(const float* q, const T* k, int64_t kstride, int64_t lo, int64_t n, int64_t d,
                       float scale, int64_t from, float* s) {
  // keys from `from` (a multiple of 8, or 0) on; the blocks before it were scored elsewhere
  int64_t j = from;
#ifdef RS_AVX2
  if (d % 8 == 0) {
    const __m256 vs = _mm256_set1_ps(scale);
#ifdef RS_WIDE
    if (g_wide)
      for (; j + 8 <= n; j += 8) dot8_wide<T, 1>(&q, k + (lo + j) * kstride, kstride, d, vs, &s, j);
#endif
    for (; j + 8 <= n; j += 8)
      _mm256_storeu_ps(s + j, _mm256_mul_ps(dot8(q, k + (lo + j) * kstride, kstride, d), vs));
  }
#endif
  for (; j < n; ++j) s[j] = dot(q, k + (lo + j) * kstride, d) * scale;
}

static float row_softmax(float* s, int64_t n, float softcap) {
  if (softcap > 0.0f)
    for (int64_t j = 0; j < n; ++j) s[j] = softcap * std::tanh(s[j] / softcap);
  // The maximum is exact in any order; lanes first, as std::max would skip a NaN score.
  float mx = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
#ifdef RS_AVX2
  __m256 m8 = _mm256_set1_ps(mx);
  for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(s + j), m8);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  for (const float x : lanes) mx = std::max(mx, x);
#endif
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  float total;
  j = 0;
#ifdef RS_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 vmx = _mm256_set1_ps(mx);
#ifdef RS_WIDE
  if (g_wide) {  // sixteen exponentials at once, added to the 8 lanes low half first, as below
    const __m512 wmx = _mm512_set1_ps(mx);
    for (; j + 16 <= n; j += 16) {
      const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + j), wmx));
      _mm512_storeu_ps(s + j, e);
      acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
      acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
  }
#endif
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  total = hsum8(acc);
#else
  total = 0.0f;
#endif
  for (; j < n; ++j) {
    s[j] = exp_neg(s[j] - mx);
    total += s[j];
  }
  return 1.0f / total;
}

// Dimensions c0.. of Σ_j s[j] v[j] · inv into out; `c0` is where the 64-wide part stopped (the
// scalar remainder), or 0 without AVX2.
template <typename T>
static void row_values(const float* s, const T* v, int64_t vstride, int64_t lo, int64_t n, int64_t d, float inv,
                       float* out) {
  int64_t c = 0;
#ifdef RS_WIDE
  if (g_wide)
    for (; c + 64 <= d; c += 64) {  // the loop below, 16 lanes
      __m512 o[4];
      for (int i = 0; i < 4; ++i) o[i] = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; ++j) {
        const __m512 p = _mm512_set1_ps(s[j]);
        const T* vj = v + (lo + j) * vstride + c;
        for (int i = 0; i < 4; ++i) o[i] = _mm512_fmadd_ps(p, ld16(vj + 16 * i), o[i]);
      }
      const __m512 vi = _mm512_set1_ps(inv);
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + c + 16 * i, _mm512_mul_ps(o[i], vi));
    }
#endif
#ifdef RS_AVX2
  // Σ_j p_j v_j, 64 dimensions at a time held in registers, keys in order
  for (; c + 64 <= d; c += 64) {
    __m256 o[8];
    for (int i = 0; i < 8; ++i) o[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const __m256 p = _mm256_set1_ps(s[j]);
      const T* vj = v + (lo + j) * vstride + c;
      for (int i = 0; i < 8; ++i) o[i] = _mm256_fmadd_ps(p, ld8(vj + 8 * i), o[i]);
    }
    const __m256 vi = _mm256_set1_ps(inv);
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + c + 8 * i, _mm256_mul_ps(o[i], vi));
  }
#endif
  for (int64_t i = c; i < d; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n && c < d; ++j) {
    const T* vj = v + (lo + j) * vstride;
    for (int64_t i = c; i < d; ++i) out[i] = std::fma(s[j], ld1(vj + i), out[i]);
  }
  for (int64_t i = c; i < d; ++i) out[i] *= inv;
}

// One query row against keys lo..hi: scores -> probabilities -> weighted sum of values.
template <typename T>
static void attend_row_of(const float* q, const T* k, const T* v, int64_t kstride, int64_t vstride,
                          int64_t lo, int64_t hi, int64_t d, float scale, float softcap, float* out,
                          std::vector<float>& s) {
  const int64_t n = hi - lo + 1;
  s.resize(n);
  row_scores(q, k, kstride, lo, n, d, scale, 0, s.data());
  const float inv = row_softmax(s.data(), n, softcap);
  row_values(s.data(), v, vstride, lo, n, d, inv, out);
}

#ifdef RS_AVX2
// dot8 of QN queries against the same eight keys, each key's 8 values loaded once for all of
// them; every query's accumulators see dot8's operations in dot8's order (bit-identical).
template <typename T, int QN>
static inline void dot8_shared(const float* const* q, const T* k, int64_t stride, int64_t d, __m256 scale,
                               float* const* s, int64_t j) {
  __m256 acc[QN][8];
  for (int a = 0; a < QN; ++a)
    for (int i = 0; i < 8; ++i) acc[a][i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    __m256 qv[QN];
    for (int a = 0; a < QN; ++a) qv[a] = _mm256_loadu_ps(q[a] + c);
    for (int i = 0; i < 8; ++i) {
      const __m256 kv = ld8(k + i * stride + c);
      for (int a = 0; a < QN; ++a) acc[a][i] = _mm256_fmadd_ps(qv[a], kv, acc[a][i]);
    }
  }
  for (int a = 0; a < QN; ++a) {
    const __m256 s01 = _mm256_hadd_ps(acc[a][0], acc[a][1]), s23 = _mm256_hadd_ps(acc[a][2], acc[a][3]);
    const __m256 s45 = _mm256_hadd_ps(acc[a][4], acc[a][5]), s67 = _mm256_hadd_ps(acc[a][6], acc[a][7]);
    const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    const __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
    const __m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    _mm256_storeu_ps(s[a] + j, _mm256_mul_ps(_mm256_add_ps(lo, hi), scale));
  }
}

// Keys whose values a shared task weighs before moving on (64 keys: 8 KiB of fp16 values).
static constexpr int64_t kValueChunk = 64;
// How far ahead of the block being scored its keys are requested.
static constexpr int64_t kKeysAhead = 32;

// Values: dimensions c..c+31 of QN (1-3) queries over keys j0..j1-1, added to the running sums in
// o, each value's 32 dimensions loaded once for all of them (row_values' sums per lane, in its
// order of keys: keys in chunks, the sums carried from one chunk to the next, are the same
// operations). The sums live in named registers: as an array indexed by query the compiler kept
// them in memory, and every key's multiply-add waited on a store and a reload (twice as slow).
template <typename T, int QN>
static inline void values32_shared(const float* const* s, const T* v, int64_t vstride, int64_t j0, int64_t j1,
                                   int64_t c, __m256 (*o)[4]) {
  static_assert(QN >= 1 && QN <= 3, "one to three queries");
  __m256 a0 = o[0][0], a1 = o[0][1], a2 = o[0][2], a3 = o[0][3], b0 = a0, b1 = a0, b2 = a0, b3 = a0, c0 = a0,
         c1 = a0, c2 = a0, c3 = a0;
  if constexpr (QN > 1) b0 = o[1][0], b1 = o[1][1], b2 = o[1][2], b3 = o[1][3];
  if constexpr (QN > 2) c0 = o[2][0], c1 = o[2][1], c2 = o[2][2], c3 = o[2][3];
  const float* s0 = s[0];
  const float* s1 = s[QN > 1 ? 1 : 0];
  const float* s2 = s[QN > 2 ? 2 : 0];
  for (int64_t j = j0; j < j1; ++j) {
    const T* vj = v + j * vstride + c;
    const __m256 v0 = ld8(vj), v1 = ld8(vj + 8), v2 = ld8(vj + 16), v3 = ld8(vj + 24);
    __m256 p = _mm256_broadcast_ss(s0 + j);
    a0 = _mm256_fmadd_ps(p, v0, a0), a1 = _mm256_fmadd_ps(p, v1, a1);
    a2 = _mm256_fmadd_ps(p, v2, a2), a3 = _mm256_fmadd_ps(p, v3, a3);
    if constexpr (QN > 1) {
      p = _mm256_broadcast_ss(s1 + j);
      b0 = _mm256_fmadd_ps(p, v0, b0), b1 = _mm256_fmadd_ps(p, v1, b1);
      b2 = _mm256_fmadd_ps(p, v2, b2), b3 = _mm256_fmadd_ps(p, v3, b3);
    }
    if constexpr (QN > 2) {
      p = _mm256_broadcast_ss(s2 + j);
      c0 = _mm256_fmadd_ps(p, v0, c0), c1 = _mm256_fmadd_ps(p, v1, c1);
      c2 = _mm256_fmadd_ps(p, v2, c2), c3 = _mm256_fmadd_ps(p, v3, c3);
    }
  }
  o[0][0] = a0, o[0][1] = a1, o[0][2] = a2, o[0][3] = a3;
  if constexpr (QN > 1) o[1][0] = b0, o[1][1] = b1, o[1][2] = b2, o[1][3] = b3;
  if constexpr (QN > 2) o[2][0] = c0, o[2][1] = c1, o[2][2] = c2, o[2][3] = c3;
}
#endif

// The size of the group that starts at query a0 when Q queries go in groups of up to three, as
// even as they go (4 queries as 2 + 2, 7 as 3 + 2 + 2): a group of one sums the values in four
// chains of multiply-adds that wait on their own latency, so 3 + 1 took longer than 2 + 2.
// Which group a query is in changes none of its operations.
static inline int group_size(int Q, int a0) {
  const int groups = (Q + 2) / 3, base = Q / groups, extra = Q % groups;
  return a0 < extra * (base + 1) ? base + 1 : base;  // the first `extra` groups hold one more
}

// Queries q[0..Q) against keys 0..hi[a] each (ascending hi): what attend_row gives each of
// them (lo = 0, no soft-capping), bit for bit, with the key and value loads of the keys they
// all see shared between them, up to three at a time (group_size).
template <typename T>
static void attend_rows_shared_of(const float* const* q, const int64_t* hi, int Q, const T* k, const T* v,
                                  int64_t kstride, int64_t vstride, int64_t d, float scale, float* const* out,
                                  std::vector<float>& scratch, bool stream) {
#ifdef RS_AVX2
  if (d % 64 == 0) {
    const int64_t nmax = hi[Q - 1] + 1;
    scratch.resize(size_t(Q) * (nmax + d));  // the scores, then the value sums (below)
    std::vector<float*> s(Q);
    for (int a = 0; a < Q; ++a) s[a] = scratch.data() + a * nmax;
    const __m256 vs = _mm256_set1_ps(scale);
    const int64_t common = (hi[0] + 1) / 8 * 8;  // whole blocks every query scores
    // Each block of eight keys for every group in turn: the block comes from memory once and
    // from the first cache for the other groups. Streaming, the keys kKeysAhead on are requested
    // meanwhile into the first cache and the block's values into the second, where the weighted
    // sums below find them: their loads waited on memory otherwise, a fifth of this function's
    // time.
    for (int64_t j = 0; j < common; j += 8) {
      const T* kj = k + j * kstride;
      for (int i = 0; i < 8 && stream; ++i) {
        request_lines<T, _MM_HINT_T0>(k + (j + kKeysAhead + i) * kstride, d);
        request_lines<T, _MM_HINT_T1>(v + (j + i) * vstride, d);
      }
      for (int a0 = 0, qn; a0 < Q; a0 += qn) {
#ifdef RS_WIDE
        if (g_wide) {
          qn = wide_group_size(Q, a0);
          dot8_wide_n<T>(qn, q + a0, kj, kstride, d, vs, s.data() + a0, j);
          continue;
        }
#endif
        qn = group_size(Q, a0);
        if (qn == 3) dot8_shared<T, 3>(q + a0, kj, kstride, d, vs, s.data() + a0, j);
        else if (qn == 2) dot8_shared<T, 2>(q + a0, kj, kstride, d, vs, s.data() + a0, j);
        else dot8_shared<T, 1>(q + a0, kj, kstride, d, vs, s.data() + a0, j);
      }
    }
    std::vector<float> inv(Q);
    for (int a = 0; a < Q; ++a) {
      const int64_t n = hi[a] + 1;
      row_scores(q[a], k, kstride, 0, n, d, scale, common, s[a]);
      inv[a] = row_softmax(s[a], n, 0.0f);
    }
    // The values of the keys every query weighs. Streaming, a chunk of keys at a time for every
    // group and 32 dimensions (the chunk's values come from the second cache once), each query's
    // sums kept between chunks in `sums` (d floats a query); else all keys in one chunk.
    const int64_t shared = hi[0] + 1, chunk = stream ? kValueChunk : shared;
    float* sums = scratch.data() + size_t(Q) * nmax;
    std::fill_n(sums, size_t(Q) * d, 0.0f);
    for (int64_t j0 = 0; j0 < shared; j0 += chunk) {
      const int64_t j1 = std::min(shared, j0 + chunk);
      for (int64_t c = 0; c < d; c += 32)
        for (int a0 = 0, qn; a0 < Q; a0 += qn) {
#ifdef RS_WIDE
          if (g_wide) {
            qn = wide_group_size(Q, a0);
            __m512 o[kWideGroup][2];
            for (int b = 0; b < qn; ++b)
              for (int i = 0; i < 2; ++i) o[b][i] = _mm512_loadu_ps(&sums[(a0 + b) * d + c + 16 * i]);
            values32_wide_n<T>(qn, s.data() + a0, v, vstride, j0, j1, c, o);
            for (int b = 0; b < qn; ++b)
              for (int i = 0; i < 2; ++i) _mm512_storeu_ps(&sums[(a0 + b) * d + c + 16 * i], o[b][i]);
            continue;
          }
#endif
          qn = group_size(Q, a0);
          __m256 o[3][4];
          for (int b = 0; b < qn; ++b)
            for (int i = 0; i < 4; ++i) o[b][i] = _mm256_loadu_ps(&sums[(a0 + b) * d + c + 8 * i]);
          if (qn == 3) values32_shared<T, 3>(s.data() + a0, v, vstride, j0, j1, c, o);
          else if (qn == 2) values32_shared<T, 2>(s.data() + a0, v, vstride, j0, j1, c, o);
          else values32_shared<T, 1>(s.data() + a0, v, vstride, j0, j1, c, o);
          for (int b = 0; b < qn; ++b)
            for (int i = 0; i < 4; ++i) _mm256_storeu_ps(&sums[(a0 + b) * d + c + 8 * i], o[b][i]);
        }
    }
    for (int a = 0; a < Q; ++a)
      for (int64_t c = 0; c < d; c += 32) {
#ifdef RS_WIDE
        if (g_wide) {
          __m512 o[2];
          for (int i = 0; i < 2; ++i) o[i] = _mm512_loadu_ps(&sums[a * d + c + 16 * i]);
          for (int64_t j = shared; j <= hi[a]; ++j) {
            const __m512 p = _mm512_set1_ps(s[a][j]);
            const T* vj = v + j * vstride + c;
            for (int i = 0; i < 2; ++i) o[i] = _mm512_fmadd_ps(p, ld16(vj + 16 * i), o[i]);
          }
          const __m512 vi = _mm512_set1_ps(inv[a]);
          for (int i = 0; i < 2; ++i) _mm512_storeu_ps(out[a] + c + 16 * i, _mm512_mul_ps(o[i], vi));
          continue;
        }
#endif
        __m256 o[4];
        for (int i = 0; i < 4; ++i) o[i] = _mm256_loadu_ps(&sums[a * d + c + 8 * i]);
        for (int64_t j = shared; j <= hi[a]; ++j) {  // the keys only this query sees, in order
          const __m256 p = _mm256_set1_ps(s[a][j]);
          const T* vj = v + j * vstride + c;
          for (int i = 0; i < 4; ++i) o[i] = _mm256_fmadd_ps(p, ld8(vj + 8 * i), o[i]);
        }
        const __m256 vi = _mm256_set1_ps(inv[a]);
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out[a] + c + 8 * i, _mm256_mul_ps(o[i], vi));
      }
    return;
  }
#endif
  for (int a = 0; a < Q; ++a)
    attend_row_of(q[a], k, v, kstride, vstride, 0, hi[a], d, scale, 0.0f, out[a], scratch);
}

void attend_rows_shared(const float* const* q, const int64_t* hi, int n, const float* k, const float* v,
                        int64_t kstride, int64_t vstride, int64_t d, float scale, float* const* out,
                        std::vector<float>& scratch, bool stream) {
  attend_rows_shared_of(q, hi, n, k, v, kstride, vstride, d, scale, out, scratch, stream);
}

void attend_rows_shared(const float* const* q, const int64_t* hi, int n, const uint16_t* k, const uint16_t* v,
                        int64_t kstride, int64_t vstride, int64_t d, float scale, float* const* out,
                        std::vector<float>& scratch, bool stream) {
  attend_rows_shared_of(q, hi, n, k, v, kstride, vstride, d, scale, out, scratch, stream);
}

void attend_row(const float* q, const float* k, const float* v, int64_t kstride, int64_t vstride,
                int64_t lo, int64_t hi, int64_t d, float scale, float softcap, float* out,
                std::vector<float>& scratch) {
  attend_row_of(q, k, v, kstride, vstride, lo, hi, d, scale, softcap, out, scratch);
}

void attend_row(const float* q, const uint16_t* k, const uint16_t* v, int64_t kstride, int64_t vstride,
                int64_t lo, int64_t hi, int64_t d, float scale, float softcap, float* out,
                std::vector<float>& scratch) {
  attend_row_of(q, k, v, kstride, vstride, lo, hi, d, scale, softcap, out, scratch);
}

void store_kv(const float* x, int64_t n, float* out) { std::copy_n(x, n, out); }

void store_kv(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
#ifdef RS_AVX2
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) out[i] = c10::detail::fp16_ieee_from_fp32_value(x[i]);
}

// q (Hq, T, D), k/v (Hkv, L, D) with any head stride and contiguous rows, lo/hi (T) int64:
// the first and last key each row sees. Returns (T, Hq, D).
at::Tensor attend(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& lo_in, const at::Tensor& hi_in, double scale, double softcap) {
  TORCH_CHECK(q_in.dim() == 3 && k.dim() == 3 && v.dim() == 3, "attend takes (heads, rows, dim) tensors");
  TORCH_CHECK((k.scalar_type() == at::kFloat || k.scalar_type() == at::kHalf) && v.scalar_type() == k.scalar_type(),
              "attend takes fp32 or fp16 keys and values (both the same)");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "key and value rows must be contiguous");
  const at::Tensor q = q_in.to(at::kFloat).contiguous();
  const int64_t hq = q.size(0), t = q.size(1), d = q.size(2), hkv = k.size(0), len = k.size(1);
  TORCH_CHECK(hkv > 0 && hq % hkv == 0, "query heads ", hq, " are not a multiple of key heads ", hkv);
  TORCH_CHECK(k.size(2) == d && v.size(0) == hkv && v.size(1) == len, "key/value shapes do not match");
  const at::Tensor lo = lo_in.to(at::kLong).contiguous(), hi = hi_in.to(at::kLong).contiguous();
  TORCH_CHECK(lo.numel() == t && hi.numel() == t, "lo/hi need one entry per query row");
  const int64_t* lop = lo.data_ptr<int64_t>();
  const int64_t* hip = hi.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(0 <= lop[i] && lop[i] <= hip[i] && hip[i] < len, "row ", i, " sees keys ", lop[i], "..", hip[i],
                " of ", len);
  const int64_t dv = v.size(2);
  at::Tensor out = at::empty({t, hq, dv}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = hq / hkv;
  TORCH_CHECK(dv == d, "value and key head sizes differ");
  // Many rows that all start at key 0 (a prompt read) go in tasks of one key head and a run of
  // four rows with the query heads that read it (attend_rows_shared: the same bits, shared loads).
  bool shared = softcap == 0.0 && t >= 16;
  for (int64_t i = 0; i < t && shared; ++i) shared = lop[i] == 0 && (i == 0 || hip[i] >= hip[i - 1]);
  constexpr int64_t kRun = 4;
  const int64_t runs = (t + kRun - 1) / kRun;
  auto run = [&](const auto* kp, const auto* vp) {
    if (shared) {
      std::vector<int64_t> cost(hkv * runs);
      for (int64_t task = 0; task < hkv * runs; ++task) cost[task] = hip[std::min(t, (task % runs + 1) * kRun) - 1];
      run_dearest_first<SharedRowsScratch>(cost, [&](SharedRowsScratch& w, int64_t task) {
        const int64_t g = task / runs, r0 = (task % runs) * kRun;
        w.qs.clear(), w.outs.clear(), w.his.clear();
        for (int64_t row = r0; row < std::min(t, r0 + kRun); ++row)
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            w.qs.push_back(qp + (h * t + row) * d);
            w.outs.push_back(op + (row * hq + h) * dv);
            w.his.push_back(hip[row]);
          }
        attend_rows_shared(w.qs.data(), w.his.data(), int(w.qs.size()), kp + g * k.stride(0), vp + g * v.stride(0),
                           k.stride(1), v.stride(1), d, float(scale), w.outs.data(), w.s, false);
      });
      return;
    }
    at::parallel_for(0, hq * t, 1, [&](int64_t b, int64_t e) {
      std::vector<float> s;
      for (int64_t task = b; task < e; ++task) {
        const int64_t h = task / t, row = task % t, g = h / group;
        attend_row(qp + (h * t + row) * d, kp + g * k.stride(0), vp + g * v.stride(0), k.stride(1), v.stride(1),
                   lop[row], hip[row], d, float(scale), float(softcap), op + (row * hq + h) * dv, s);
      }
    });
  };
  if (k.scalar_type() == at::kHalf)
    run(reinterpret_cast<const uint16_t*>(k.data_ptr<at::Half>()),
        reinterpret_cast<const uint16_t*>(v.data_ptr<at::Half>()));
  else
    run(k.data_ptr<float>(), v.data_ptr<float>());
  return out;
}

// Whether attention runs its 16-lane loops (the same bits as the 8-lane ones; for tests and
// measurements). Returns the previous setting; always false without AVX-512.
static bool set_wide_attention(bool on) {
#ifdef RS_WIDE
  const bool was = g_wide;
  g_wide = on;
  return was;
#else
  (void)on;
  return false;
#endif
}

}  // namespace rs

TORCH_LIBRARY_FRAGMENT(ragspec, m) {
  m.def("set_wide_attention(bool on) -> bool", &rs::set_wide_attention);
  m.def("attend(Tensor q, Tensor k, Tensor v, Tensor lo, Tensor hi, float scale, float softcap) -> Tensor",
        &rs::attend);
}
