// Attention for decode and verify forwards whose rows do not depend on each other's presence.
//
// out[t, h] = Σ_j softmax_j(q[t, h] · k[j] · scale) v[j] over the keys row t may see: the
// contiguous range lo[t] .. hi[t] of the cache (causal, sliding windows: whatever the mask says,
// as long as it is one range per row). The loops over keys start at lo[t] and visit the keys in
// order, so a row sees the same arithmetic whether it is computed alone (a one-token step) or
// with the draft rows after it (a verify forward): bit-identical results, which is what keeps
// greedy speculation exact. Optional logit soft-capping (cap · tanh(s / cap)) as Gemma 2 uses.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RS_AVX2 1
#if defined(__AVX512F__)
#define RS_AVX512 1  // 16-lane forms of the key dot products and the weighted sum of values
#endif
#endif

namespace rs {

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

static inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

static inline float dot(const float* a, const float* b, int64_t d) {
#ifdef RS_AVX2
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum8(acc);
#else
  float s = 0.0f;
  int64_t i = 0;
#endif
  for (; i < d; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

#ifdef RS_AVX2
// Eight keys' dot products with q at once: acc[i] collects key i's products 8 lanes at a time,
// then one transpose-and-add tree turns the eight accumulators into the eight sums. Every key
// is reduced by the same tree (lane pairs in the same order), whichever block it is in.
static inline __m256 dot8(const float* q, const float* k, int64_t stride, int64_t d) {
  __m256 acc[8];
#ifdef RS_AVX512
  if (d % 16 == 0) {  // 16 lanes a key, folded to 8 (the same fold for every key)
    __m512 wide[8];
    for (int i = 0; i < 8; ++i) wide[i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) {
      const __m512 qv = _mm512_loadu_ps(q + c);
      for (int i = 0; i < 8; ++i) wide[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + i * stride + c), wide[i]);
    }
    for (int i = 0; i < 8; ++i)
      acc[i] = _mm256_add_ps(_mm512_castps512_ps256(wide[i]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wide[i]), 1)));
  } else
#endif
  {
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + i * stride + c), acc[i]);
    }
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

// Scores of one row's keys lo + j for j0 <= j < n (8 at a time, then one by one), times scale.
static void scores(const float* q, const float* k, int64_t kstride, int64_t lo, int64_t j0, int64_t n,
                   int64_t d, float scale, float* s) {
  int64_t j = j0;
#ifdef RS_AVX2
  if (d % 8 == 0) {
    const __m256 vs = _mm256_set1_ps(scale);
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(dot8(q, k + (lo + j) * kstride, kstride, d), vs));
  }
#endif
  for (; j < n; ++j) s[j] = dot(q, k + (lo + j) * kstride, d) * scale;
}

// Scores (n of them) -> unnormalised probabilities in place (soft-capped first when softcap > 0);
// returns 1 / their sum.
static float probabilities(float* s, int64_t n, float softcap) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t j;
  for (j = 0; j < n; ++j) {
    if (softcap > 0.0f) s[j] = softcap * std::tanh(s[j] / softcap);
    mx = std::max(mx, s[j]);
  }
  float total;
  j = 0;
#ifdef RS_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 vmx = _mm256_set1_ps(mx);
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

// One query row against keys lo..hi: scores -> probabilities -> weighted sum of values.
// Every output value is Σ_j p_j v_j[i] accumulated over the keys in order, then times 1/Σp: how
// the dimensions are grouped in registers changes nothing (attend_rows relies on it).
void attend_row(const float* q, const float* k, const float* v, int64_t kstride, int64_t vstride,
                int64_t lo, int64_t hi, int64_t d, float scale, float softcap, float* out,
                std::vector<float>& s) {
  const int64_t n = hi - lo + 1;
  s.resize(n);
  scores(q, k, kstride, lo, 0, n, d, scale, s.data());
  const float inv = probabilities(s.data(), n, softcap);
  int64_t j, c = 0;
#ifdef RS_AVX512
  // Σ_j p_j v_j, 128 dimensions at a time held in registers (then 64), keys in order
  for (; c + 128 <= d; c += 128) {
    __m512 o[8];
    for (int i = 0; i < 8; ++i) o[i] = _mm512_setzero_ps();
    for (j = 0; j < n; ++j) {
      const __m512 p = _mm512_set1_ps(s[j]);
      const float* vj = v + (lo + j) * vstride + c;
      for (int i = 0; i < 8; ++i) o[i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16 * i), o[i]);
    }
    const __m512 vi = _mm512_set1_ps(inv);
    for (int i = 0; i < 8; ++i) _mm512_storeu_ps(out + c + 16 * i, _mm512_mul_ps(o[i], vi));
  }
  for (; c + 64 <= d; c += 64) {
    __m512 o[4];
    for (int i = 0; i < 4; ++i) o[i] = _mm512_setzero_ps();
    for (j = 0; j < n; ++j) {
      const __m512 p = _mm512_set1_ps(s[j]);
      const float* vj = v + (lo + j) * vstride + c;
      for (int i = 0; i < 4; ++i) o[i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16 * i), o[i]);
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
    for (j = 0; j < n; ++j) {
      const __m256 p = _mm256_set1_ps(s[j]);
      const float* vj = v + (lo + j) * vstride + c;
      for (int i = 0; i < 8; ++i) o[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * i), o[i]);
    }
    const __m256 vi = _mm256_set1_ps(inv);
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + c + 8 * i, _mm256_mul_ps(o[i], vi));
  }
#endif
  for (int64_t i = c; i < d; ++i) out[i] = 0.0f;
  for (j = 0; j < n && c < d; ++j) {
    const float* vj = v + (lo + j) * vstride;
    for (int64_t i = c; i < d; ++i) out[i] = std::fma(s[j], vj[i], out[i]);
  }
  for (int64_t i = c; i < d; ++i) out[i] *= inv;
}


#ifdef RS_AVX512
// Up to 4 rows of one head against the same keys from lo (row r sees lo..hi[r]): each row's
// scores, probabilities and weighted sums are attend_row's, operation for operation, so a row's
// result does not depend on the rows it is computed with; the rows share each key and value
// read (from L1 rather than L2) and the value sums run 4 rows x 64 dimensions in registers.
static void attend_rows4(int R, const float* const* q, const float* k, const float* v, int64_t kstride,
                         int64_t vstride, int64_t lo, const int64_t* hi, int64_t d, float scale, float softcap,
                         float* const* out, std::vector<float>* s) {
  int64_t n[4], common = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < R; ++r) {
    n[r] = hi[r] - lo + 1;
    s[r].resize(n[r]);
    common = std::min(common, n[r]);
  }
  const int64_t shared = common / 8 * 8;  // key blocks every row has in full
  const __m256 vs = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < shared; j += 8)
    for (int r = 0; r < R; ++r)
      _mm256_storeu_ps(s[r].data() + j, _mm256_mul_ps(dot8(q[r], k + (lo + j) * kstride, kstride, d), vs));
  float inv[4];
  for (int r = 0; r < R; ++r) {
    scores(q[r], k, kstride, lo, shared, n[r], d, scale, s[r].data());
    inv[r] = probabilities(s[r].data(), n[r], softcap);
  }
  for (int64_t c = 0; c < d; c += 64) {
    __m512 o[4][4];
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 4; ++i) o[r][i] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j < common; ++j) {
      const float* vj = v + (lo + j) * vstride + c;
      const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16), v2 = _mm512_loadu_ps(vj + 32),
                   v3 = _mm512_loadu_ps(vj + 48);
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(s[r][j]);
        o[r][0] = _mm512_fmadd_ps(p, v0, o[r][0]);
        o[r][1] = _mm512_fmadd_ps(p, v1, o[r][1]);
        o[r][2] = _mm512_fmadd_ps(p, v2, o[r][2]);
        o[r][3] = _mm512_fmadd_ps(p, v3, o[r][3]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int64_t jj = j; jj < n[r]; ++jj) {
        const __m512 p = _mm512_set1_ps(s[r][jj]);
        const float* vj = v + (lo + jj) * vstride + c;
        for (int i = 0; i < 4; ++i) o[r][i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16 * i), o[r][i]);
      }
      const __m512 vi = _mm512_set1_ps(inv[r]);
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out[r] + c + 16 * i, _mm512_mul_ps(o[r][i], vi));
    }
  }
}
#endif

void attend_rows(int R, const float* const* q, const float* k, const float* v, int64_t kstride, int64_t vstride,
                 int64_t lo, const int64_t* hi, int64_t d, float scale, float softcap, float* const* out,
                 std::vector<float>* scratch) {
#ifdef RS_AVX512
  if (d % 64 == 0 && R > 1) {
    for (int r0 = 0; r0 < R; r0 += 4)
      attend_rows4(std::min(4, R - r0), q + r0, k, v, kstride, vstride, lo, hi + r0, d, scale, softcap, out + r0,
                   scratch + r0);
    return;
  }
#endif
  for (int r = 0; r < R; ++r) attend_row(q[r], k, v, kstride, vstride, lo, hi[r], d, scale, softcap, out[r], scratch[r]);
}

// q (Hq, T, D), k/v (Hkv, L, D) with any head stride and contiguous rows, lo/hi (T) int64:
// the first and last key each row sees. Returns (T, Hq, D).
at::Tensor attend(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& lo_in, const at::Tensor& hi_in, double scale, double softcap) {
  TORCH_CHECK(q_in.dim() == 3 && k.dim() == 3 && v.dim() == 3, "attend takes (heads, rows, dim) tensors");
  TORCH_CHECK(k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat, "attend takes fp32 keys and values");
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
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = hq / hkv;
  TORCH_CHECK(dv == d, "value and key head sizes differ");
  // tasks: a head and up to 4 consecutive rows with the same first key (they share key reads)
  constexpr int64_t kRows = 4;
  std::vector<int64_t> first;  // the row each row group starts at
  for (int64_t r = 0; r < t; ++r)
    if (first.empty() || r - first.back() == kRows || lop[r] != lop[first.back()]) first.push_back(r);
  const int64_t groups = int64_t(first.size());
  first.push_back(t);
  at::parallel_for(0, hq * groups, 1, [&](int64_t b, int64_t e) {
    std::vector<float> s[kRows];
    const float* qs[kRows];
    float* outs[kRows];
    for (int64_t task = b; task < e; ++task) {
      const int64_t h = task / groups, r0 = first[task % groups], R = first[task % groups + 1] - r0, g = h / group;
      for (int64_t r = 0; r < R; ++r) {
        qs[r] = qp + (h * t + r0 + r) * d;
        outs[r] = op + ((r0 + r) * hq + h) * dv;
      }
      attend_rows(int(R), qs, kp + g * k.stride(0), vp + g * v.stride(0), k.stride(1), v.stride(1), lop[r0],
                  hip + r0, d, float(scale), float(softcap), outs, s);
    }
  });
  return out;
}

}  // namespace rs

TORCH_LIBRARY_FRAGMENT(ragspec, m) {
  m.def("attend(Tensor q, Tensor k, Tensor v, Tensor lo, Tensor hi, float scale, float softcap) -> Tensor",
        &rs::attend);
}
