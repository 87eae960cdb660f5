// The AMX int8 product of many rows with tiled weights (amx.h has the contract).
//
// How a tile of 16 weight columns is multiplied:
// - The tile is decoded once per chunk of rows into signed int8 in the tile unit's "B" layout:
//   for each sum of S values (S = 32, a group; 16 for Q6_K, whose scales cover half groups),
//   S/4 rows of 64 bytes, row i holding values 4i..4i+3 of the 16 columns side by side. This is
//   the order tiled.h keeps the quants in, so decoding is the VNNI kernel's, plus the shift that
//   makes the values signed (q − 8, q − 16, q − 32, Q8_0's stored +128 undone). Scales and
//   offsets are decoded into 16-lane fp32 vectors beside it.
// - 16 activation rows at a time (the "A" tile: 16 rows of S int8 values; the rows are first
//   packed so that each such tile is 16·S consecutive bytes), `tdpbssd` gives the 16 × 16 exact integer sums of one group. They are stored
//   and each row's accumulator takes them with the VNNI kernel's own fp32 steps:
//   acc = fma(float(sum), w_scale · x_scale, acc), then for formats with an offset
//   acc = fma(w_offset, x_scale · Σx, acc). Four sums are in flight at once (tiles 0-3 sums,
//   4-5 activations, 6-7 weights).
// - Rows past the last multiple of 16 are padded with zeros; the padding rows are never stored.
// Rows are taken in chunks small enough that a chunk's int8 activations stay in the L2 cache
// while every column tile of the task passes over them (a tile is decoded once per chunk).
//
// Built only where the compiler targets AMX (-march=native on a CPU with AMX-TILE and
// AMX-INT8); elsewhere `ready()` is false and the VNNI/AVX2 kernels run. At run time the CPU's
// CPUID bits are checked and Linux is asked for the tile state (arch_prctl
// ARCH_REQ_XCOMP_PERM), once per process; if either says no, the unit is not used.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
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

#if defined(RS_AVX512) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__) && \
    defined(__x86_64__)
#define RS_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rs {
namespace amx {

namespace {

// -1: not yet read from RAGSPEC_AMX (1: on); 0 off; 1 on (when the machine allows it).
std::atomic<int> g_switch{-1};

bool switched_on() {
  int s = g_switch.load();
  if (s < 0) {
    const char* env = std::getenv("RAGSPEC_AMX");
    // Off unless asked for: on the one AMX machine measured, the VNNI kernel with torch's
    // de-quantised prompt path read prompts faster at three of four shapes and formats.
    s = env && (std::strcmp(env, "1") == 0 || std::strcmp(env, "on") == 0) ? 1 : 0;
    int expected = -1;
    g_switch.compare_exchange_strong(expected, s);
    s = g_switch.load();
  }
  return s == 1;
}

bool machine_allows() {
#ifdef RS_AMX
  static std::once_flag once;
  static bool granted = false;
  std::call_once(once, [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return;  // AMX-TILE, AMX-INT8
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    granted = syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  });
  return granted;
#else
  return false;
#endif
}

}  // namespace

bool ready() { return switched_on() && machine_allows(); }

bool wanted(int64_t m, int fmt) { return m >= kMinRows && tileable(fmt) && scale_span(fmt) == 32 && ready(); }

#ifdef RS_AMX

namespace {

// GCC's tile intrinsics are asm statements that do not tell the compiler which memory they read
// or write: this barrier orders ordinary loads and stores against them.
#define RS_TILE_FENCE() __asm__ __volatile__("" ::: "memory")

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: 16 x 16 int32 sums; 4-5: 16 activation rows of S bytes; 6-7: S/4 rows of 64 weight bytes.
void configure(int S) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = uint16_t(S);
    c.rows[t + 2] = uint8_t(S / 4);
    c.colsb[t + 2] = 64;
  }
  RS_TILE_FENCE();
  _tile_loadconfig(&c);
  RS_TILE_FENCE();
}

struct Scratch {
  std::vector<int8_t> w, pad_q;
  std::vector<float> scale, offset, pad_d, pad_s;
  alignas(64) int32_t sums[4][256];
};

template <int FMT>
constexpr int sum_len() { return FMT == Q6_K ? 16 : 32; }

// One tile of 16 columns, all its groups: signed int8 weights (512 bytes a group), the scale
// of each sum and the offset of each group, 16 lanes each.
template <int FMT>
void decode_tile(const uint8_t* t, int64_t row_bytes, int8_t* wb, float* scale, float* offset) {
  using namespace tiled;
  constexpr int BB = block_bytes(FMT), PB = block_elems(FMT) / 32;
  constexpr bool Q5 = FMT == Q5_0 || FMT == Q5_1;
  const int64_t blocks = row_bytes / BB;
  __m512 sc[16];
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* tb = t + b * kTileRows * BB;
    if (FMT == Q6_K) q6_scales(tb, sc);
    for (int j = 0; j < PB; ++j) {
      const int64_t g = b * PB + j;
      __m512i w[8];
      if (FMT == Q4_0 || FMT == Q4_1) {
        const uint8_t* q = tb + kTileRows * (FMT == Q4_0 ? 2 : 4);
        for (int i = 0; i < 4; ++i) {
          const __m512i v = ld(q + 64 * i);
          w[i] = lo4(v);
          w[i + 4] = hi4(v);
        }
        _mm512_storeu_ps(scale + 16 * g, halves16(tb));
        if (FMT == Q4_1) _mm512_storeu_ps(offset + 16 * g, halves16(tb + 32));
        if (FMT == Q4_0)
          for (int i = 0; i < 8; ++i) w[i] = _mm512_sub_epi8(w[i], _mm512_set1_epi8(8));
      } else if (Q5) {
        const int at = FMT == Q5_0 ? 2 : 4;
        const __m512i qh = ld(tb + kTileRows * at);
        const uint8_t* q = tb + kTileRows * (at + 4);
        for (int i = 0; i < 4; ++i) {
          const __m512i v = ld(q + 64 * i);
          w[i] = _mm512_or_si512(lo4(v), fifth_bits(qh, i));
          w[i + 4] = _mm512_or_si512(hi4(v), fifth_bits(qh, i + 4));
        }
        _mm512_storeu_ps(scale + 16 * g, halves16(tb));
        if (FMT == Q5_1) _mm512_storeu_ps(offset + 16 * g, halves16(tb + 32));
        if (FMT == Q5_0)
          for (int i = 0; i < 8; ++i) w[i] = _mm512_sub_epi8(w[i], _mm512_set1_epi8(16));
      } else if (FMT == Q8_0) {
        for (int i = 0; i < 8; ++i) w[i] = _mm512_xor_si512(ld(tb + kTileRows * 2 + 64 * i), _mm512_set1_epi8(char(0x80)));
        _mm512_storeu_ps(scale + 16 * g, halves16(tb));
      } else {  // Q6_K: two sums of 16 a group, values q - 32
        const int n = j / 4, t4 = j % 4;
        const uint8_t* ql = tb + kTileRows * (64 * n + 32 * (t4 & 1));
        const uint8_t* qh = tb + kTileRows * (128 + 32 * n);
        for (int i = 0; i < 8; ++i) {
          const __m512i l = t4 >= 2 ? hi4(ld(ql + 64 * i)) : lo4(ld(ql + 64 * i));
          const __m512i h = _mm512_and_si512(_mm512_srli_epi16(ld(qh + 64 * i), 2 * t4), _mm512_set1_epi8(3));
          w[i] = _mm512_sub_epi8(_mm512_or_si512(l, _mm512_slli_epi16(h, 4)), _mm512_set1_epi8(32));
        }
        _mm512_storeu_ps(scale + 16 * (2 * g), sc[2 * j]);
        _mm512_storeu_ps(scale + 16 * (2 * g + 1), sc[2 * j + 1]);
      }
      for (int i = 0; i < 8; ++i) _mm512_storeu_si512(wb + 512 * g + 64 * i, w[i]);
    }
  }
}

// Sums `u` (16 x 16, in `c`) into the 16 row accumulators.
template <int FMT>
inline void take(__m512* acc, const int32_t* c, int64_t u, const float* scale, const float* offset,
                 const float* xd, const float* xs, int64_t G) {
  constexpr int U = 32 / sum_len<FMT>();
  constexpr bool OFFSET = FMT == Q4_1 || FMT == Q5_1;
  const int64_t g = u / U;
  const __m512 s = _mm512_loadu_ps(scale + 16 * u);
  __m512 o = _mm512_setzero_ps();
  if (OFFSET) o = _mm512_loadu_ps(offset + 16 * g);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r));
    acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s, _mm512_set1_ps(xd[r * G + g])), acc[r]);
    if (OFFSET) acc[r] = _mm512_fmadd_ps(o, _mm512_set1_ps(xs[r * G + g]), acc[r]);
  }
}

// One sum of S values for 16 rows into tile `C` (activations into tile A, weights into tile B).
#define RS_SUM(C, A, B, u)                       \
  do {                                           \
    _tile_zero(C);                               \
    _tile_loadd(A, a + (u) * S * 16, S);         \
    _tile_loadd(B, wb + (u) * S * 16, 64);       \
    _tile_dpbssd(C, A, B);                       \
  } while (0)

// 16 activation rows (a: int8, packed by sums: 16 rows of S values, then the next sum; xd, xs: their group scales and d·Σq, stride G)
// against one decoded tile; the first `rows` rows' columns `cols` stored at y (stride ldy).
// Four sums are in flight at once (tiles 0-3), their activations and weights in tiles 4-7.
template <int FMT>
void block16(const int8_t* a, int64_t k, const float* xd, const float* xs, const Scratch& sc_in,
             int32_t (*sums)[256], float* y, int64_t ldy, int rows, __mmask16 cols) {
  constexpr int S = sum_len<FMT>();
  const int64_t G = k / 32, units = k / S;
  const int8_t* wb = sc_in.w.data();
  const float* scale = sc_in.scale.data();
  const float* offset = sc_in.offset.data();
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  int64_t u = 0;
  for (; u + 4 <= units; u += 4) {
    RS_SUM(0, 4, 6, u);
    RS_SUM(1, 5, 7, u + 1);
    RS_SUM(2, 4, 6, u + 2);
    RS_SUM(3, 5, 7, u + 3);
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    _tile_stored(2, sums[2], 64);
    _tile_stored(3, sums[3], 64);
    RS_TILE_FENCE();
    for (int i = 0; i < 4; ++i) take<FMT>(acc, sums[i], u + i, scale, offset, xd, xs, G);
    RS_TILE_FENCE();
  }
  for (; u < units; ++u) {
    RS_SUM(0, 4, 6, u);
    _tile_stored(0, sums[0], 64);
    RS_TILE_FENCE();
    take<FMT>(acc, sums[0], u, scale, offset, xd, xs, G);
    RS_TILE_FENCE();
  }
  for (int r = 0; r < rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, cols, acc[r]);
}

#undef RS_SUM

template <int FMT>
void columns(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int S = sum_len<FMT>();
  const int64_t k = x.k, G = k / 32, m = x.m;
  static thread_local Scratch s;
  s.w.resize(size_t(G) * 512);
  s.scale.resize(size_t(k / S) * 16);
  s.offset.resize(size_t(G) * 16);
  // the rows' int8 values packed 16 rows at a time, sum by sum (each tile load reads 16·S
  // consecutive bytes); the last rows zero-padded to 16
  const int64_t blocks16 = (m + 15) / 16, tail = m / 16 * 16, units = k / S;
  s.pad_q.resize(size_t(blocks16 * 16 * k));
  for (int64_t r = 0; r < blocks16 * 16; ++r) {
    int8_t* dst = s.pad_q.data() + (r / 16) * 16 * k + (r % 16) * S;
    if (r >= m) {
      for (int64_t u = 0; u < units; ++u) std::memset(dst + u * 16 * S, 0, S);
      continue;
    }
    const int8_t* src = x.q.data() + r * k;
    for (int64_t u = 0; u < units; ++u) std::memcpy(dst + u * 16 * S, src + u * S, S);
  }
  if (tail < m) {  // their scales, zero-padded
    const int64_t extra = m - tail;
    s.pad_d.assign(size_t(16 * G), 0.0f);
    s.pad_s.assign(size_t(16 * G), 0.0f);
    std::memcpy(s.pad_d.data(), x.d.data() + tail * G, size_t(extra * G) * 4);
    std::memcpy(s.pad_s.data(), x.dsum.data() + tail * G, size_t(extra * G) * 4);
  }
  // rows per chunk: about 512 KiB of int8 activations, a multiple of 16
  const int64_t chunk = std::max<int64_t>(16, std::min<int64_t>(256, (int64_t(1) << 19) / k / 16 * 16));
  configure(S);  // (a fence: the padded rows are written before the tiles read them)
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t r1 = std::min(m, r0 + chunk);
    for (int64_t t = n0 / kTileRows; t * kTileRows < n1; ++t) {
      const int64_t c0 = t * kTileRows;
      const int lo = int(std::max(n0, c0) - c0), hi = int(std::min(n1, c0 + kTileRows) - c0);
      const __mmask16 cols = __mmask16(((1u << hi) - 1) & ~((1u << lo) - 1));
      decode_tile<FMT>(w.data + c0 * w.row_bytes, w.row_bytes, s.w.data(), s.scale.data(), s.offset.data());
      RS_TILE_FENCE();
      for (int64_t r = r0; r < r1; r += 16) {
        float* yc = y + r * ldy + c0;
        const int8_t* a = s.pad_q.data() + r * k;
        if (r + 16 <= m) {
          block16<FMT>(a, k, x.d.data() + r * G, x.dsum.data() + r * G, s, s.sums, yc, ldy, 16, cols);
        } else {
          block16<FMT>(a, k, s.pad_d.data(), s.pad_s.data(), s, s.sums, yc, ldy, int(m - r), cols);
        }
      }
    }
  }
  RS_TILE_FENCE();
  _tile_release();
}

}  // namespace

void tiled_columns(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (w.fmt) {
    case Q4_0: columns<Q4_0>(x, w, n0, n1, y, ldy); break;
    case Q4_1: columns<Q4_1>(x, w, n0, n1, y, ldy); break;
    case Q5_0: columns<Q5_0>(x, w, n0, n1, y, ldy); break;
    case Q5_1: columns<Q5_1>(x, w, n0, n1, y, ldy); break;
    case Q8_0: columns<Q8_0>(x, w, n0, n1, y, ldy); break;
    default: columns<Q6_K>(x, w, n0, n1, y, ldy); break;
  }
}

#else  // no AMX in this build: never wanted

void tiled_columns(const Activations&, const WeightView&, int64_t, int64_t, float*, int64_t) {
  TORCH_CHECK(false, "the kernels were built without AMX");
}

#endif

// The ops: whether AMX runs here, and a switch (returns the previous setting) for tests and
// side-by-side measurements in one process.
static bool amx_available() { return ready(); }
static bool set_amx(bool on) {
  const bool before = switched_on();
  g_switch.store(on ? 1 : 0);
  return before;
}

}  // namespace amx
}  // namespace rs

TORCH_LIBRARY_FRAGMENT(ragspec, m) {
  m.def("amx_available() -> bool", &rs::amx::amx_available);
  m.def("set_amx(bool on) -> bool", &rs::amx::set_amx);
}
