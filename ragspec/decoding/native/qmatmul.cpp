// Matrix products on weights kept in GGUF's packed formats, for decode and verify forwards.
//
// y (M, N) = x (M, K) · Wᵀ, W given as N packed rows (formats.h). Quantised weights multiply
// 8-bit activations, as llama.cpp's CPU kernels do: each row of x is cut into groups of 32
// values, each group stored as int8 with one fp32 scale (round(x / d), d = max|x| / 127; for Q4_K
// and Q5_K weights one d per 256 values, as llama.cpp's Q8_K: formats.h's scale_span), and the
// group's dot products with the weights are exact integer sums, scaled afterwards. Plain formats
// (F32/F16/BF16) multiply fp32 activations with fp32 FMAs.
//
// Batch invariance, by construction: the value computed for row m of x never depends on how
// many rows are computed with it, nor on how the work is split between threads. Every output
// y[m][n] is made by one thread, from one accumulator that sees the same operations in the same
// order whatever the tile shape: rows are quantised one by one, groups are visited in order of
// k, and the final horizontal sum has a fixed order. So a verify forward over k tokens gives,
// row for row, bit for bit what k one-token forwards give. Tiles only share the decoding of a
// weight group between rows (the memory traffic), never an arithmetic step.
//
// Layouts: weights as GGUF rows (the kernels below), or tiled, 16 rows interleaved (tiled.h),
// which the AVX-512 VNNI kernel there multiplies 16 columns at a time; on a CPU without it a
// tiled weight is rebuilt as rows tile by tile and runs the row kernel. Either way one column is
// always computed by one kernel, so invariance holds for both layouts.
//
// Build: compiled on the machine that runs it (-march=native); without AVX2/FMA the scalar
// code runs, with the same guarantee.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "formats.h"
#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define RS_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define RS_AVX512 1
#endif
#endif

#include "tiled.h"

namespace rs {

// ---- activations: rows of x as int8 groups ------------------------------------------------

// Activations (kernels.h) hold the rows of x as int8 groups for quantised formats.
using QRows = Activations;

#ifdef RS_AVX2
static inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
#endif

// One row as int8 groups of 32, each span of `span` values (32, or 256 for the K formats: see
// scale_span) under one scale. Every step is exact or one IEEE operation per value (max, a
// division, a product rounded to the nearest integer, ties to even, integer sums), so the vector
// path gives the bytes of the scalar one.
static void quantise_row(const float* x, int64_t k, int span, int8_t* q, float* d, float* dsum,
                         int32_t* qsum16) {
  const int64_t per = span / 32;
  for (int64_t g0 = 0; g0 < k / 32; g0 += per) {
#ifdef RS_AVX2
    __m256 m = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t j = 0; j < 4 * per; ++j)
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 32 * g0 + 8 * j)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float vscale = _mm_cvtss_f32(m4) / 127.0f;
    const __m256 vinv = _mm256_set1_ps(vscale > 0.0f ? 1.0f / vscale : 0.0f);
    for (int64_t g = g0; g < g0 + per; ++g) {
      __m256i iv[4];
      for (int j = 0; j < 4; ++j) {  // nearest, ties to even
        const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * j), vinv));
        iv[j] = _mm256_min_epi32(_mm256_max_epi32(r, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
      }
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * g),
                          _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      const int32_t h0 = hsum_epi32(_mm256_add_epi32(iv[0], iv[1])), h1 = hsum_epi32(_mm256_add_epi32(iv[2], iv[3]));
      d[g] = vscale;
      dsum[g] = vscale * float(h0 + h1);
      qsum16[2 * g] = h0;
      qsum16[2 * g + 1] = h1;
    }
    continue;
#endif
    float amax = 0.0f;
    for (int64_t i = 32 * g0; i < 32 * (g0 + per); ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t g = g0; g < g0 + per; ++g) {
      int half[2] = {0, 0};
      for (int i = 0; i < 32; ++i) {
        const int v = int(std::nearbyint(x[32 * g + i] * inv));
        q[32 * g + i] = int8_t(std::max(-127, std::min(127, v)));
        half[i / 16] += q[32 * g + i];
      }
      d[g] = scale;
      dsum[g] = scale * float(half[0] + half[1]);
      qsum16[2 * g] = half[0];
      qsum16[2 * g + 1] = half[1];
    }
  }
}

// Whether a prompt's rows are also kept interleaved by 8 for the tiled kernel (Activations::q8;
// the same bits either way, tiled.h; switched off by tests and measurements).
static bool g_interleave = true;

// Rows kept interleaved by 8 (Activations::q8): the whole blocks of 8 of a prompt's rows (64 or
// more) for the tiled kernel of the formats with groups of 32 and one scale a group; none for a
// step's few rows, other formats or without AVX-512.
static int64_t interleaved_rows(int64_t m, int fmt) {
#ifdef RS_AVX512
  return g_interleave && interleavable(fmt) && m >= 64 ? m / 8 * 8 : 0;
#else
  (void)m, (void)fmt;
  return 0;
#endif
}

static void size_rows(int64_t m, int64_t k, Activations& r) {
  r.q.resize(m * k);
  r.d.resize(m * (k / 32));
  r.dsum.resize(m * (k / 32));
  r.qsum16.resize(m * (k / 16));
  r.start32.resize(group_offset(r.fmt) ? m * (k / 32) : 0);
  r.start16.resize(r.fmt == Q6_K ? m * (k / 16) : 0);
  r.qpair.resize(r.fmt == Q4_K || r.fmt == Q5_K ? m * (k / 64) : 0);
  const int64_t il = interleaved_rows(m, r.fmt);
  r.q8.resize(il * k);
  r.d8.resize(il * (k / 32));
  r.dsum8.resize(il * (k / 32));
  r.start8.resize(r.start32.empty() ? 0 : il * (k / 32));
}

static void quantise_one(const float* x, int64_t i, int64_t k, Activations& r) {
  const int64_t G = k / 32;
  int32_t* qs = r.qsum16.data() + i * 2 * G;
  quantise_row(x + i * k, k, scale_span(r.fmt), r.q.data() + i * k, r.d.data() + i * G,
               r.dsum.data() + i * G, qs);
  if (!r.qpair.empty())  // |Σq| <= 32 * 127 fits 16 bits
    for (int64_t p = 0; p < G / 2; ++p)
      r.qpair[i * (G / 2) + p] = int32_t(uint32_t(uint16_t(int16_t(qs[4 * p] + qs[4 * p + 1]))) |
                                         (uint32_t(uint16_t(int16_t(qs[4 * p + 2] + qs[4 * p + 3]))) << 16));
  if (const int32_t c = group_offset(r.fmt))
    for (int64_t g = 0; g < G; ++g) r.start32[i * G + g] = -c * (qs[2 * g] + qs[2 * g + 1]);
  if (r.fmt == Q6_K)
    for (int64_t h = 0; h < 2 * G; ++h) r.start16[i * 2 * G + h] = -32 * qs[h];
  if (i * k < int64_t(r.q8.size())) {  // also interleaved: row i % 8 of its block's groups
    const int64_t b = i / 8, rr = i % 8;
    const int8_t* q = r.q.data() + i * k;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = (b * G + g) * 8;
      int8_t* dst = r.q8.data() + at * 32 + 4 * rr;
      for (int w = 0; w < 8; ++w) std::memcpy(dst + 32 * w, q + 32 * g + 4 * w, 4);
      r.d8[at + rr] = r.d[i * G + g];
      r.dsum8[at + rr] = r.dsum[i * G + g];
      if (!r.start8.empty()) r.start8[at + rr] = r.start32[i * G + g];
    }
  }
}

// Switches the interleaved rows on or off; returns the previous setting.
static bool set_interleaved_rows(bool on) {
  const bool was = g_interleave;
  g_interleave = on;
  return was;
}

void prepare(const float* x, int64_t m, int64_t k, int fmt, Activations& r) {
  fmt &= ~kTiledBit;
  r.fmt = fmt;
  r.m = m;
  r.k = k;
  r.x = x;
  if (!is_quantised(fmt)) return;
  size_rows(m, k, r);
  if (m < 64) {  // a step's rows: on this thread
    for (int64_t i = 0; i < m; ++i) quantise_one(x, i, k, r);
    return;
  }
  at::parallel_for(0, m, 16, [&](int64_t lo, int64_t hi) {  // a prompt's: one row's bytes never
    for (int64_t i = lo; i < hi; ++i) quantise_one(x, i, k, r);  // depend on another's
  });
}

// Rows quantised in parallel (the torch op's path; one row's bytes never depend on another's).
static void quantise_rows(const float* x, int64_t m, int64_t k, int fmt, Activations& r) {
  r.fmt = fmt & ~kTiledBit;
  r.m = m;
  r.k = k;
  r.x = x;
  size_rows(m, k, r);
  at::parallel_for(0, m, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) quantise_one(x, i, k, r);
  });
}

// ---- quantised weights × int8 activations --------------------------------------------------

struct QArgs {
  int fmt;
  int64_t k, n, groups, row_bytes;  // n: the row stride of y
  const uint8_t* w;
  const QRows* x;
  float* y;
};

#ifdef RS_AVX2

// A weight group as the AVX2 kernel uses it: q as 32 bytes (unsigned; for signed formats the
// absolute values, with `sign` holding q itself), the per-half scales as 8 lanes, one offset.
struct VGroup {
  __m256i q, sign;
  __m256 scale;
  float offset;
};

// A super-block's scales and offsets (K-quants), decoded once for its eight groups: per group
// (Q4_K, Q5_K) or per half group (Q6_K, whose offsets are 0: its values are signed).
struct KScales {
  float scale[16], offset[8];
};

// Groups of 32 per block of the format.
template <int fmt>
constexpr int groups_per_block() { return fmt == Q4_K || fmt == Q5_K || fmt == Q6_K ? 8 : 1; }

static inline __m256i low_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
static inline __m256i high_nibbles(__m256i v) {
  return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
}

static inline __m256i nibbles16(const uint8_t* p) {  // 16 bytes -> 32 values (low nibbles first)
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m), _mm_and_si128(raw, m));
}

static inline float f16(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }

template <int fmt>
static inline void block_scales(const uint8_t* b, KScales& ks) {
  if (fmt == Q4_K || fmt == Q5_K) {  // the 12 bytes of 6-bit scales and minimums, four at a time
    uint32_t w[3];
    std::memcpy(w, b + 4, 12);
    const uint32_t packed[4] = {
        w[0] & 0x3f3f3f3fu,                                         // scales 0-3
        (w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u),         // scales 4-7
        w[1] & 0x3f3f3f3fu,                                         // minimums 0-3
        ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u),  // minimums 4-7
    };
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    _mm256_storeu_ps(ks.scale, _mm256_mul_ps(_mm256_set1_ps(f16(b)), sc));
    _mm256_storeu_ps(ks.offset, _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_set1_ps(f16(b + 2)), mn)));
  } else if (fmt == Q6_K) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const __m256 d = _mm256_set1_ps(f16(b + 208));
    _mm256_storeu_ps(ks.scale, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw))));
    _mm256_storeu_ps(ks.scale + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8)))));
  }
}

// Group j (of groups_per_block) of the block at b; ks holds block_scales(b).
template <int fmt>
static inline void vdecode(const uint8_t* b, int j, VGroup& v, const KScales& ks) {
  switch (fmt) {
    case Q4_0: {
      const float d = f16(b);
      v.q = nibbles16(b + 2);
      v.scale = _mm256_set1_ps(d);
      v.offset = -8.0f * d;
      return;
    }
    case Q4_1: {
      v.q = nibbles16(b + 4);
      v.scale = _mm256_set1_ps(f16(b));
      v.offset = f16(b + 2);
      return;
    }
    case Q5_0:
    case Q5_1: {
      const int at = fmt == Q5_0 ? 2 : 4;
      const float d = f16(b);
      uint32_t high;
      std::memcpy(&high, b + at, 4);
      // bit i of `high` -> 0x10 in byte i: spread the four bytes over their eight lanes each,
      // keep each lane's own bit, and turn a set bit into 16.
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(int(high)),
          _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
      const __m256i bits = _mm256_set1_epi64x(int64_t(0x8040201008040201ULL));
      const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
      v.q = _mm256_or_si256(nibbles16(b + at + 4), _mm256_and_si256(on, _mm256_set1_epi8(0x10)));
      v.scale = _mm256_set1_ps(d);
      v.offset = fmt == Q5_0 ? -16.0f * d : f16(b + 2);
      return;
    }
    case Q8_0: {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
      v.q = _mm256_sign_epi8(q, q);  // |q|
      v.sign = q;
      v.scale = _mm256_set1_ps(f16(b));
      v.offset = 0.0f;
      return;
    }
    case Q4_K:
    case Q5_K: {
      const __m256i raw = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(b + (fmt == Q4_K ? 16 : 48) + (j / 2) * 32));
      __m256i q = (j & 1) ? high_nibbles(raw) : low_nibbles(raw);
      if (fmt == Q5_K) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
      }
      v.q = q;
      v.scale = _mm256_set1_ps(ks.scale[j]);
      v.offset = ks.offset[j];
      return;
    }
    case Q6_K: {
      const int n = j / 4, t = j % 4;
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n + 32 * (t & 1)));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * n));
      const __m256i two = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), _mm256_set1_epi8(3));
      const __m256i q = _mm256_sub_epi8(
          _mm256_or_si256(t >= 2 ? high_nibbles(raw) : low_nibbles(raw), _mm256_slli_epi16(two, 4)),
          _mm256_set1_epi8(32));
      v.q = _mm256_sign_epi8(q, q);
      v.sign = q;
      v.scale = _mm256_set_m128(_mm_set1_ps(ks.scale[2 * j + 1]), _mm_set1_ps(ks.scale[2 * j]));
      v.offset = 0.0f;
      return;
    }
    default:
      return;
  }
}

// Σ over each 4 consecutive products q[i]·x[i] (unsigned × signed bytes): 8 int32 lanes,
// lanes 0-3 covering values 0-15 and lanes 4-7 values 16-31. Exact: no pair of products
// exceeds the int16 range (|q| ≤ 128, |x| ≤ 127).
static inline __m256i dot_u8s8(__m256i q, __m256i x) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q, x);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
#endif
}

static inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// Σ_g a[g]·b[g] in a fixed order (8 lanes, then the lanes, then the tail).
static inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

constexpr int kPrefetch = 1024;  // bytes ahead of the block being decoded

// Columns n0..n0+C, rows r0..r0+R. Every (row, column) pair owns one accumulator, which sees
// the same sequence of operations for every choice of C and R. Weight offsets (the groups'
// minimums) are collected per column in `offs` (C × groups floats) and applied at the end, as
// one dot product with the row's group sums.
template <int FMT, int C, int R>
static void qtile(const QArgs& a, int64_t n0, int64_t r0, float* offs) {
  constexpr bool SIGNED = FMT == Q8_0 || FMT == Q6_K, OFFSET = !SIGNED;
  __m256 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm256_setzero_ps();
  const QRows& x = *a.x;
  const int64_t G = a.groups;
  constexpr int PB = groups_per_block<FMT>();
  for (int64_t bi = 0; bi < G / PB; ++bi) {
    const uint8_t* bp[C];
    KScales ks[C];
    for (int c = 0; c < C; ++c) {
      bp[c] = a.w + (n0 + c) * a.row_bytes + bi * block_bytes(FMT);
      // the weights stream from memory once: ask for them a few hundred bytes ahead
      _mm_prefetch(reinterpret_cast<const char*>(bp[c]) + kPrefetch, _MM_HINT_T0);
      block_scales<FMT>(bp[c], ks[c]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < PB; ++j) {
      const int64_t g = bi * PB + j;
      VGroup v[C];
      for (int c = 0; c < C; ++c) {
        vdecode<FMT>(bp[c], j, v[c], ks[c]);
        if (OFFSET) offs[c * G + g] = v[c].offset;
      }
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r;
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + row * a.k + 32 * g));
        const __m256 xd = _mm256_set1_ps(x.d[row * G + g]);
        for (int c = 0; c < C; ++c) {
          const __m256i xs = SIGNED ? _mm256_sign_epi8(xq, v[c].sign) : xq;
          const __m256 f = _mm256_cvtepi32_ps(dot_u8s8(v[c].q, xs));
          acc[c][r] = _mm256_fmadd_ps(f, _mm256_mul_ps(v[c].scale, xd), acc[c][r]);
        }
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) {
      const float off = OFFSET ? dot_f32(offs + c * G, x.dsum.data() + (r0 + r) * G, G) : 0.0f;
      a.y[(r0 + r) * a.n + n0 + c] = hsum(acc[c][r]) + off;
    }
}

#ifdef RS_AVX512

// The same tile with 512-bit registers (CPUs that have AVX-512 VNNI): two consecutive groups
// per instruction. Used for every row count alike when the row has an even number of groups, so
// the invariance argument is unchanged: each (row, column) accumulator sees the same
// operations whatever C and R are.
template <int FMT, int C, int R>
static void qtile512(const QArgs& a, int64_t n0, int64_t r0, float* offs) {
  constexpr bool SIGNED = FMT == Q8_0 || FMT == Q6_K, OFFSET = !SIGNED;
  constexpr int PB = groups_per_block<FMT>();
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  const QRows& x = *a.x;
  const int64_t G = a.groups;
  const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  KScales ks[C];
  for (int64_t g = 0; g < G; g += 2) {
    __m512i q[C];
    __m512 scale[C];
    __mmask64 negative[C];
    for (int c = 0; c < C; ++c) {
      const uint8_t* b = a.w + (n0 + c) * a.row_bytes + (g / PB) * block_bytes(FMT);
      const int j = int(g % PB);
      _mm_prefetch(reinterpret_cast<const char*>(b) + kPrefetch, _MM_HINT_T1);
      if (j == 0) block_scales<FMT>(b, ks[c]);
      VGroup v0, v1;
      vdecode<FMT>(b, j, v0, ks[c]);
      vdecode<FMT>(PB == 1 ? b + block_bytes(FMT) : b, PB == 1 ? 0 : j + 1, v1, ks[c]);
      if (SIGNED) {
        const __m512i s = _mm512_inserti64x4(_mm512_castsi256_si512(v0.sign), v1.sign, 1);
        q[c] = _mm512_abs_epi8(s);
        negative[c] = _mm512_movepi8_mask(s);
      } else {
        q[c] = _mm512_inserti64x4(_mm512_castsi256_si512(v0.q), v1.q, 1);
      }
      scale[c] = _mm512_insertf32x8(_mm512_castps256_ps512(v0.scale), v1.scale, 1);
      if (OFFSET) {
        offs[c * G + g] = v0.offset;
        offs[c * G + g + 1] = v1.offset;
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const __m512i xq = _mm512_loadu_si512(x.q.data() + row * a.k + 32 * g);
      const __m128 d2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x.d.data() + row * G + g)));
      const __m512 xd = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(d2));
      for (int c = 0; c < C; ++c) {
        const __m512i xs = SIGNED ? _mm512_mask_sub_epi8(xq, negative[c], _mm512_setzero_si512(), xq) : xq;
        const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], xs));
        acc[c][r] = _mm512_fmadd_ps(f, _mm512_mul_ps(scale[c], xd), acc[c][r]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) {
      const float off = OFFSET ? dot_f32(offs + c * G, x.dsum.data() + (r0 + r) * G, G) : 0.0f;
      a.y[(r0 + r) * a.n + n0 + c] = _mm512_reduce_add_ps(acc[c][r]) + off;
    }
}
#endif

#else  // portable scalar code: the same arithmetic one lane at a time

template <int FMT, int C, int R>
static void qtile(const QArgs& a, int64_t n0, int64_t r0, float*) {
  constexpr bool SIGNED = FMT == Q8_0 || FMT == Q6_K, OFFSET = !SIGNED;
  float acc[C][R], off[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = off[c][r] = 0.0f;
  const QRows& x = *a.x;
  const int64_t G = a.groups;
  for (int64_t g = 0; g < G; ++g) {
    Group v[C];
    for (int c = 0; c < C; ++c) decode_group(a.fmt, a.w + (n0 + c) * a.row_bytes, g, v[c]);
    if (a.fmt == Q6_K)
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < 32; ++i) v[c].q[i] = uint8_t(int8_t(int(v[c].q[i]) - 32));
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* xq = x.q.data() + row * a.k + 32 * g;
      const float xd = x.d[row * G + g];
      for (int c = 0; c < C; ++c) {
        for (int h = 0; h < 2; ++h) {
          int s = 0;
          for (int i = 16 * h; i < 16 * h + 16; ++i)
            s += (SIGNED ? int(int8_t(v[c].q[i])) : int(v[c].q[i])) * int(xq[i]);
          acc[c][r] = std::fma(float(s), v[c].scale[h] * xd, acc[c][r]);
        }
        if (OFFSET) off[c][r] = std::fma(v[c].offset[0], x.dsum[row * G + g], off[c][r]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) a.y[(r0 + r) * a.n + n0 + c] = acc[c][r] + off[c][r];
}

#endif

// Rows in tiles of 4 (then 3, 2 or 1), columns in pairs (one at the edge). (Four columns for a
// single row measured 2.5x slower than pairs: register pressure.)
// `tile(n, r, pair, rows)` computes one tile; `rows` is a std::integral_constant with the row count.
template <typename Tile>
static void sweep(int64_t n0, int64_t n1, int64_t m, bool pairs, Tile tile) {
  for (int64_t n = n0; n < n1;) {
    const bool pair = pairs && n + 2 <= n1;
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) tile(n, r, pair, std::integral_constant<int, 4>{});
    switch (m - r) {
      case 3: tile(n, r, pair, std::integral_constant<int, 3>{}); break;
      case 2: tile(n, r, pair, std::integral_constant<int, 2>{}); break;
      case 1: tile(n, r, pair, std::integral_constant<int, 1>{}); break;
      default: break;
    }
    n += pair ? 2 : 1;
  }
}

template <int F>
static void qcolumns(const QArgs& a, int64_t n0, int64_t n1, int64_t m) {
  std::vector<float> offs(4 * a.groups);
  float* o = offs.data();
#ifdef RS_AVX512
  if (a.groups % 2 == 0) {
    sweep(n0, n1, m, m > 1, [&](int64_t n, int64_t r, bool pair, auto rows) {
      constexpr int R = decltype(rows)::value;
      pair ? qtile512<F, 2, R>(a, n, r, o) : qtile512<F, 1, R>(a, n, r, o);
    });
    return;
  }
#endif
  sweep(n0, n1, m, true, [&](int64_t n, int64_t r, bool pair, auto rows) {
    constexpr int R = decltype(rows)::value;
    pair ? qtile<F, 2, R>(a, n, r, o) : qtile<F, 1, R>(a, n, r, o);
  });
}

// ---- plain weights (F32/F16/BF16) × fp32 activations ---------------------------------------

struct FArgs {
  int fmt;
  int64_t k, n, row_bytes;
  const uint8_t* w;
  const float* x;
  float* y;
};

#ifdef RS_AVX2
static inline __m256 load_w8(int fmt, const uint8_t* p) {
  if (fmt == F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (fmt == F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

static inline float plain_value(int fmt, const uint8_t* row, int64_t i) {
  if (fmt == F32) {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  }
  const uint16_t h = load_u16(row + 2 * i);
  return fmt == F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

template <int R>
static void ftile(const FArgs& a, int64_t n, int64_t r0) {
  const uint8_t* row = a.w + n * a.row_bytes;
  const int esize = a.fmt == F32 ? 4 : 2;
#ifdef RS_AVX2
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= a.k; i += 8) {
    const __m256 w = load_w8(a.fmt, row + i * esize);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(a.x + (r0 + r) * a.k + i), acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(acc[r]);
    for (int64_t t = i; t < a.k; ++t) s = std::fma(plain_value(a.fmt, row, t), a.x[(r0 + r) * a.k + t], s);
    a.y[(r0 + r) * a.n + n] = s;
  }
#else
  (void)esize;
  for (int r = 0; r < R; ++r) {
    float s = 0.0f;
    for (int64_t t = 0; t < a.k; ++t) s = std::fma(plain_value(a.fmt, row, t), a.x[(r0 + r) * a.k + t], s);
    a.y[(r0 + r) * a.n + n] = s;
  }
#endif
}

static void fcolumns(const FArgs& a, int64_t n0, int64_t n1, int64_t m) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) ftile<4>(a, n, r);
    switch (m - r) {
      case 3: ftile<3>(a, n, r); break;
      case 2: ftile<2>(a, n, r); break;
      case 1: ftile<1>(a, n, r); break;
      default: break;
    }
  }
}

// ---- the ops --------------------------------------------------------------------------------

static void check_weight(const at::Tensor& w, int64_t code, int64_t k) {
  const bool tiled = code & kTiledBit;
  const int64_t fmt = code & ~int64_t(kTiledBit);
  TORCH_CHECK(fmt >= F32 && fmt <= Q5_1 && (!tiled || tileable(int(fmt))), "unknown weight format ", code);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() && w.device().is_cpu(),
              "packed weights must be a contiguous CPU uint8 matrix (rows, bytes per row)");
  TORCH_CHECK(k % block_elems(int(fmt)) == 0 && (!is_quantised(int(fmt)) || k % 32 == 0),
              "in_features ", k, " is not a whole number of blocks");
  TORCH_CHECK(w.size(1) == row_bytes(int(fmt), k), "packed rows hold ", w.size(1),
              " bytes; format ", fmt, " with in_features ", k, " needs ", row_bytes(int(fmt), k));
}

// Columns per parallel task: enough work per task that scheduling costs little (about 128K
// multiply-accumulates), and enough tasks that two threads get even shares of the
// small products of a one-token step (576 x 576 at 135M is three tiled tasks).
static int64_t grain(int64_t k, int64_t m) { return std::max<int64_t>(4, (1 << 14) / std::max<int64_t>(1, k * m / 8)); }

int64_t column_grain(const WeightView& w, int64_t m) {
  const int64_t g = grain(w.k, m);
  return w.tiled ? (g + kTileRows - 1) / kTileRows * kTileRows : g;
}

WeightView weight_view(const at::Tensor& w, int64_t code, int64_t k) {
  check_weight(w, code, k);
  return WeightView{w.data_ptr<uint8_t>(), int(code & ~int64_t(kTiledBit)), w.size(0), k, w.size(1),
                    bool(code & kTiledBit)};
}

static void row_columns(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y,
                        int64_t ldy);

// Tiled weights: full tiles by the tiled kernel, the rows after them (stored as rows) by the
// row kernel. Without AVX-512 VNNI, each tile is first rebuilt as rows (one kernel per column,
// whatever the rows: the invariance holds on every machine).
static void tiled_or_rows(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y,
                          int64_t ldy) {
  const int64_t full = w.n / kTileRows * kTileRows;
  if (n1 > full) row_columns(x, w, std::max(n0, full), n1, y, ldy);
  if (n0 >= full) return;
  n1 = std::min(n1, full);
#ifdef RS_AVX512
  if (amx::wanted(x.m, w.fmt)) {  // prompt reads: the same values from the AMX tile unit (amx.h)
    amx::tiled_columns(x, w, n0, n1, y, ldy);
    return;
  }
  tiled_columns(x, w, n0, n1, y, ldy);
#else
  std::vector<uint8_t> rows(kTileRows * w.row_bytes);
  for (int64_t t = n0 / kTileRows; t * kTileRows < n1; ++t) {
    const int64_t c0 = t * kTileRows;
    for (int r = 0; r < kTileRows; ++r)
      untile_row(w.fmt, w.data + c0 * w.row_bytes, w.row_bytes, r, rows.data() + r * w.row_bytes);
    const WeightView plain{rows.data(), w.fmt, kTileRows, w.k, w.row_bytes, false};
    row_columns(x, plain, std::max(n0, c0) - c0, std::min(n1, c0 + kTileRows) - c0, y + c0, ldy);
  }
#endif
}

void matmul_columns(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (x.m == 0 || n1 <= n0) return;
  if (w.tiled) {
    tiled_or_rows(x, w, n0, n1, y, ldy);
  } else {
    row_columns(x, w, n0, n1, y, ldy);
  }
}

static void row_columns(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  const int64_t m = x.m, k = w.k;
  if (is_quantised(w.fmt)) {
    const QArgs a{w.fmt, k, ldy, k / 32, w.row_bytes, w.data, &x, y};
    switch (w.fmt) {
      case Q4_0: qcolumns<Q4_0>(a, n0, n1, m); break;
      case Q4_1: qcolumns<Q4_1>(a, n0, n1, m); break;
      case Q5_0: qcolumns<Q5_0>(a, n0, n1, m); break;
      case Q5_1: qcolumns<Q5_1>(a, n0, n1, m); break;
      case Q8_0: qcolumns<Q8_0>(a, n0, n1, m); break;
      case Q4_K: qcolumns<Q4_K>(a, n0, n1, m); break;
      case Q5_K: qcolumns<Q5_K>(a, n0, n1, m); break;
      default: qcolumns<Q6_K>(a, n0, n1, m); break;
    }
  } else {
    const FArgs a{w.fmt, k, ldy, w.row_bytes, w.data, x.x, y};
    fcolumns(a, n0, n1, m);
  }
}

at::Tensor qmatmul(const at::Tensor& x_in, const at::Tensor& w, int64_t fmt, int64_t k) {
  const WeightView view = weight_view(w, fmt, k);
  TORCH_CHECK(x_in.size(-1) == k, "input has ", x_in.size(-1), " features, the weight ", k);
  const at::Tensor x = x_in.reshape({-1, k}).to(at::kFloat).contiguous();
  const int64_t m = x.size(0), n = view.n;
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;
  Activations rows;
  if (is_quantised(view.fmt)) {
    quantise_rows(x.data_ptr<float>(), m, k, view.fmt, rows);
  } else {
    prepare(x.data_ptr<float>(), m, k, view.fmt, rows);
  }
  float* yp = y.data_ptr<float>();
  // split at multiples of `unit` columns (a tile for tiled weights: no tile computed twice)
  const int64_t unit = view.tiled ? kTileRows : 1, units = (n + unit - 1) / unit;
  at::parallel_for(0, units, std::max<int64_t>(1, column_grain(view, m) / unit), [&](int64_t lo, int64_t hi) {
    matmul_columns(rows, view, lo * unit, std::min(n, hi * unit), yp, n);
  });
  auto shape = x_in.sizes().vec();
  shape.back() = n;
  return y.view(shape);
}

#ifdef RS_AVX2
// One row de-quantised with the vector decoder, value by value the same operations as
// decode_group + group_value (and so as GGUF's own de-quantisation): d·(q − 8) for Q4_0,
// d·(q − 16) for Q5_0, d·q for Q8_0 and Q6_K (q signed), scale·q + offset for the others.
template <int FMT>
static void dequant_row(const uint8_t* row, int64_t k, float* dst) {
  constexpr int PB = groups_per_block<FMT>();
  KScales ks;
  for (int64_t g = 0; g < k / 32; ++g) {
    const uint8_t* b = row + (g / PB) * block_bytes(FMT);
    const int j = int(g % PB);
    if (j == 0) block_scales<FMT>(b, ks);
    VGroup v;
    vdecode<FMT>(b, j, v, ks);
    __m256i q = v.q;
    if (FMT == Q8_0 || FMT == Q6_K) q = v.sign;
    if (FMT == Q4_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    if (FMT == Q5_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    const bool offset = !(FMT == Q4_0 || FMT == Q5_0 || FMT == Q8_0 || FMT == Q6_K);
    for (int part = 0; part < 4; ++part) {
      const __m128i bytes = part < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part % 2 ? _mm_srli_si128(bytes, 8) : bytes));
      // lanes of v.scale: 0-3 first half, 4-7 second half of the group
      const __m256 s = _mm256_permutevar8x32_ps(v.scale, _mm256_set1_epi32(part < 2 ? 0 : 4));
      __m256 w = _mm256_mul_ps(s, f);
      if (offset) w = _mm256_add_ps(w, _mm256_set1_ps(v.offset));
      _mm256_storeu_ps(dst + 32 * g + 8 * part, w);
    }
  }
}
#endif

// Rows `ids` of W as fp32 (rows, K), computed as GGUF's own de-quantisation computes them.
at::Tensor dequantize_rows(const at::Tensor& w, int64_t code, int64_t k, const at::Tensor& ids_in) {
  check_weight(w, code, k);
  const bool tiled = code & kTiledBit;
  const int64_t fmt = code & ~int64_t(kTiledBit);
  const at::Tensor ids = ids_in.reshape({-1}).to(at::kLong).contiguous();
  const int64_t count = ids.size(0), nrows = w.size(0), rb = w.size(1);
  const int64_t* idp = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i)
    TORCH_CHECK(idp[i] >= 0 && idp[i] < nrows, "row ", idp[i], " out of range for ", nrows, " rows");
  at::Tensor out = at::empty({count, k}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const uint8_t* base = w.data_ptr<uint8_t>();
  at::parallel_for(0, count, std::max<int64_t>(1, (1 << 15) / k), [&](int64_t lo, int64_t hi) {
    std::vector<uint8_t> rebuilt(tiled ? rb : 0);
    for (int64_t i = lo; i < hi; ++i) {
      const uint8_t* row = base + idp[i] * rb;
      if (tiled) {
        tiled_row(int(fmt), base, nrows, rb, idp[i], rebuilt.data());
        row = rebuilt.data();
      }
      float* dst = o + i * k;
      if (!is_quantised(int(fmt))) {
        for (int64_t t = 0; t < k; ++t) dst[t] = plain_value(int(fmt), row, t);
        continue;
      }
#ifdef RS_AVX2
      switch (fmt) {
        case Q4_0: dequant_row<Q4_0>(row, k, dst); break;
        case Q4_1: dequant_row<Q4_1>(row, k, dst); break;
        case Q5_0: dequant_row<Q5_0>(row, k, dst); break;
        case Q5_1: dequant_row<Q5_1>(row, k, dst); break;
        case Q8_0: dequant_row<Q8_0>(row, k, dst); break;
        case Q4_K: dequant_row<Q4_K>(row, k, dst); break;
        case Q5_K: dequant_row<Q5_K>(row, k, dst); break;
        default: dequant_row<Q6_K>(row, k, dst); break;
      }
#else
      Group grp;
      for (int64_t g = 0; g < k / 32; ++g) {
        decode_group(int(fmt), row, g, grp);
        for (int t = 0; t < 32; ++t) dst[32 * g + t] = group_value(int(fmt), grp, t);
      }
#endif
    }
  });
  return out;
}

// The int8 form of activations the quantised kernels multiply with weights of format `fmt`
// (for tests): (q, d, d·Σq), d and d·Σq per group of 32 (a K block's d repeated: scale_span).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x_in, int64_t fmt) {
  const int64_t k = x_in.size(-1);
  TORCH_CHECK(is_quantised(int(fmt) & ~kTiledBit), "format ", fmt, " takes fp32 activations");
  TORCH_CHECK(k % scale_span(int(fmt) & ~kTiledBit) == 0, "features must be a multiple of ",
              scale_span(int(fmt) & ~kTiledBit));
  const at::Tensor x = x_in.reshape({-1, k}).to(at::kFloat).contiguous();
  const int64_t m = x.size(0);
  Activations r;
  quantise_rows(x.data_ptr<float>(), m, k, int(fmt), r);
  at::Tensor q = at::empty({m, k}, at::TensorOptions().dtype(at::kChar));
  at::Tensor d = at::empty({m, k / 32}, x.options()), s = at::empty({m, k / 32}, x.options());
  std::memcpy(q.data_ptr<int8_t>(), r.q.data(), r.q.size());
  std::memcpy(d.data_ptr<float>(), r.d.data(), r.d.size() * 4);
  std::memcpy(s.data_ptr<float>(), r.dsum.data(), r.dsum.size() * 4);
  return {q, d, s};
}

// True when tiled weights run the tiled kernel here (else they are rebuilt as rows per call).
bool has_tiled_kernel() {
#ifdef RS_AVX512
  return true;
#else
  return false;
#endif
}

bool has_avx2() {
#ifdef RS_AVX2
  return true;
#else
  return false;
#endif
}

}  // namespace rs

TORCH_LIBRARY_FRAGMENT(ragspec, m) {
  m.def("qmatmul(Tensor x, Tensor w, int fmt, int k) -> Tensor", &rs::qmatmul);
  m.def("dequantize_rows(Tensor w, int fmt, int k, Tensor ids) -> Tensor", &rs::dequantize_rows);
  m.def("quantize_activations(Tensor x, int fmt) -> (Tensor, Tensor, Tensor)", &rs::quantize_activations);
  m.def("has_avx2() -> bool", &rs::has_avx2);
  m.def("has_tiled_kernel() -> bool", &rs::has_tiled_kernel);
  m.def("set_interleaved_rows(bool on) -> bool", &rs::set_interleaved_rows);
}
