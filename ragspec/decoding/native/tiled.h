// Row-interleaved ("tiled") weights and the AVX-512 VNNI kernel that multiplies them.
//
// Layout. A weight of N rows in one of the tileable formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
// Q5_K, Q6_K)
// keeps its bytes and its (N, row_bytes) shape; the first 16·⌊N/16⌋ rows are regrouped in tiles
// of 16 rows. A tile holds its 16 rows block by block, and inside a block each field of the
// format (a 2-byte fp16 scale, or 4 bytes of quants or packed scales) of the 16 rows side by
// side: 16 rows × 4 bytes = one 512-bit register, lane r holding row r. Q8_0's quants are stored
// plus 128 (unsigned), the only change to a value. The rows past the last full tile stay as they
// were. The layout is a permutation of bytes: `tiled_row` rebuilds any row in its GGUF form.
//
// Kernel. With lane r = output column r, `vpdpbusd` multiplies four weight bytes of 16 columns
// by the same four activation bytes (broadcast) and adds them into 16 int32 sums: a group of 32
// values of 16 columns is 8 instructions per activation row, with no horizontal sum at the end.
// Each weight group is decoded once per tile and used for every activation row (up to 16 at a
// time), so a verify of k tokens reads and decodes the weights once.
//
// Q4_K and Q5_K meet activations with one scale per block of 256 (scale_span, as llama.cpp's
// Q8_K), so a block's float work is per block, not per group: its sum starts at −dmin times the
// exact integer Σ_j m_j Σx_j (vpdpwssd, two groups an instruction), takes one FMA per group
// (the integer dot times d·sc_j), and is multiplied into the row's accumulator with the row's
// one scale for the block. A row and group then take two float operations (convert, FMA) where
// they took four (convert, the scales' multiply, the FMA, the offset's FMA).
//
// Batch invariance: the value of y[m][c] is one accumulator, lane c%16 of row m's register,
// seeing for each group (or each block, for Q4_K and Q5_K) in order of k: exact integer dot
// products (the same whatever was computed beside them), their integer corrections, and a fixed
// sequence of multiplies and FMAs. Nothing depends on how many rows are in a chunk, nor on how
// columns are split between threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "formats.h"
#include "kernels.h"

namespace rs {

constexpr int kTileRows = 16;
// Added to a format's code when its weight is stored tiled.
constexpr int kTiledBit = 32;

inline bool tileable(int fmt) {
  return fmt == Q4_0 || fmt == Q4_1 || fmt == Q5_0 || fmt == Q5_1 || fmt == Q8_0 || fmt == Q4_K ||
         fmt == Q5_K || fmt == Q6_K;
}

// The formats with groups of 32 and one scale a group, whose prompt rows the kernel also takes
// kept interleaved by 8 (Activations::q8, rows_block8).
constexpr bool interleavable(int fmt) {
  return fmt == Q4_0 || fmt == Q4_1 || fmt == Q5_0 || fmt == Q5_1 || fmt == Q8_0;
}

// 2-byte fields at the start and the end of a block; every other field is 4 bytes.
inline int head_halves(int fmt) {
  return fmt == Q4_0 || fmt == Q5_0 || fmt == Q8_0 ? 1 : fmt == Q6_K ? 0 : 2;
}
inline int tail_halves(int fmt) { return fmt == Q6_K ? 1 : 0; }

// Calls f(start, width) for each field of a block, in order.
template <typename F>
inline void for_each_field(int fmt, F f) {
  const int bytes = block_bytes(fmt), head = 2 * head_halves(fmt), tail = 2 * tail_halves(fmt);
  for (int o = 0; o < head; o += 2) f(o, 2);
  for (int o = head; o < bytes - tail; o += 4) f(o, 4);
  for (int o = bytes - tail; o < bytes; o += 2) f(o, 2);
}

// Row r (0..15) of a tile, as GGUF stores it (row_bytes bytes) into out.
inline void untile_row(int fmt, const uint8_t* tile, int64_t row_bytes, int r, uint8_t* out) {
  const int bb = block_bytes(fmt);
  const int64_t blocks = row_bytes / bb;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* tb = tile + b * kTileRows * bb;
    uint8_t* ob = out + b * bb;
    for_each_field(fmt, [&](int o, int w) { std::memcpy(ob + o, tb + kTileRows * o + r * w, w); });
    if (fmt == Q8_0)
      for (int i = 2; i < 34; ++i) ob[i] ^= 0x80;
  }
}

// Row `row` of an (n, row_bytes) tiled weight, as GGUF stores it.
inline void tiled_row(int fmt, const uint8_t* data, int64_t n, int64_t row_bytes, int64_t row,
                      uint8_t* out) {
  if (row >= n / kTileRows * kTileRows) {
    std::memcpy(out, data + row * row_bytes, row_bytes);
    return;
  }
  untile_row(fmt, data + (row / kTileRows) * kTileRows * row_bytes, row_bytes,
             int(row % kTileRows), out);
}

#ifdef RS_AVX512

#ifndef RS_LOAD_BROADCAST  // the build sets it from the CPU's maker (dot4)
#define RS_LOAD_BROADCAST 1
#endif

namespace tiled {

// acc + the byte dot products of w's 16 lanes with the 4 bytes at p (the same 4 for every lane).
// Two forms of the same exact integer sums, chosen per CPU maker at build time:
//  - RS_LOAD_BROADCAST 0 (AMD): the instruction broadcasts them from its memory operand
//    ({1to16}); GCC does not fold a separate broadcast into vpdpbusd, and the extra instruction
//    per product took 7-14% of a 16-64-row product's time on a Zen 4 core (Q4_0, Q8_0, Q4_K and
//    Q6_K; 0-3% at 8 rows).
//  - RS_LOAD_BROADCAST 1 (others): a broadcast load, then the register form. On a 2-core Xeon
//    (family 6 model 167: AVX-512 VNNI, AMX) an Intel core's broadcast load is a load alone, and
//    the inline asm's memory operand kept the compiler from keeping the accumulators in
//    registers: a 550-token prompt read of the bundled model (Q4_1) took 0.87-0.94x the time,
//    the two builds run in turn three times, and a step's 1 and 8 rows 0.94-0.96x and
//    0.96-1.01x (twice).
static inline __m512i dot4(__m512i acc, __m512i w, const int8_t* p) {
#if RS_LOAD_BROADCAST
  return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(p)));
#else
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
#endif
}

// acc + the products of w's 16 lanes' two int16 with the two int16 at p (the same for every
// lane), broadcast from memory as dot4's bytes are.
static inline __m512i dot2w(__m512i acc, __m512i w, const int32_t* p) {
  asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
  return acc;
}

static inline __m512i ld(const uint8_t* p) { return _mm512_loadu_si512(p); }
static inline __m512 halves16(const uint8_t* p) {  // 16 fp16 values
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline __m512i lo4(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
static inline __m512i hi4(__m512i v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f)); }

// Byte `i` (0..3) of every 32-bit lane, as 16 int32 (unsigned).
static inline __m512i byte_of(__m512i v, int i) {
  return _mm512_and_si512(_mm512_srli_epi32(v, 8 * i), _mm512_set1_epi32(0xff));
}

// Q5_0 / Q5_1: the fifth bits of values 4i..4i+3 (bits 4i..4i+3 of each lane's 32-bit qh) moved
// to bit 4 of the lane's bytes 0..3. Multiplying the nibble by 1 + 2^7 + 2^14 + 2^21 puts its bit b
// at bit 8b (the four copies do not overlap, so nothing carries).
static inline __m512i fifth_bits(__m512i qh, int i) {
  const __m512i nib = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * i), _mm512_set1_epi32(0x0f));
  const __m512i spread = _mm512_mullo_epi32(nib, _mm512_set1_epi32(0x00204081));
  return _mm512_and_si512(_mm512_slli_epi32(spread, 4), _mm512_set1_epi32(0x10101010));
}

// The scales (d·sc) of the eight groups of a Q4_K / Q5_K block, 16 columns each, their 6-bit
// mins in pairs (mp[i]: group 2i's in the low 16 bits of each lane, 2i + 1's in the high) and
// −dmin.
static inline void k_scales(const uint8_t* tb, __m512* sc, __m512i* mp, __m512* ndmin) {
  const __m512 d = halves16(tb);
  *ndmin = _mm512_sub_ps(_mm512_setzero_ps(), halves16(tb + 32));
  const __m512i w0 = ld(tb + 64), w1 = ld(tb + 128), w2 = ld(tb + 192);
  const __m512i six = _mm512_set1_epi32(63), four = _mm512_set1_epi32(15), two = _mm512_set1_epi32(0x30);
  __m512i mins[8];
  for (int j = 0; j < 4; ++j) {
    const __m512i s = _mm512_and_si512(byte_of(w0, j), six);
    const __m512i s2 = _mm512_or_si512(_mm512_and_si512(byte_of(w2, j), four),
                                       _mm512_and_si512(_mm512_srli_epi32(byte_of(w0, j), 2), two));
    mins[j] = _mm512_and_si512(byte_of(w1, j), six);
    mins[j + 4] = _mm512_or_si512(_mm512_srli_epi32(byte_of(w2, j), 4),
                                  _mm512_and_si512(_mm512_srli_epi32(byte_of(w1, j), 2), two));
    sc[j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s));
    sc[j + 4] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s2));
  }
  for (int i = 0; i < 4; ++i) mp[i] = _mm512_or_si512(mins[2 * i], _mm512_slli_epi32(mins[2 * i + 1], 16));
}

// The sixteen int8 scales (times d) of a Q6_K block, 16 columns each.
static inline void q6_scales(const uint8_t* tb, __m512* sc) {
  const __m512 d = halves16(tb + kTileRows * 208);
  for (int q = 0; q < 4; ++q) {
    const __m512i w = ld(tb + kTileRows * (192 + 4 * q));
    for (int i = 0; i < 4; ++i) {  // sign-extend byte i of each lane
      const __m512i s = _mm512_srai_epi32(_mm512_slli_epi32(w, 24 - 8 * i), 24);
      sc[4 * q + i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s));
    }
  }
}

// One group's decoded weights w (16 columns) against RB consecutive activation rows from r0,
// into their accumulators. The rows' integer dots are independent chains, interleaved, so the
// latency of each vpdpbusd is hidden (one chain per row would wait on every one); a short block
// (a one-row step) splits each row's sum in two chains. Integer sums are exact, so how they are
// split and added changes nothing: the fp32 steps of a row are the same, in the same order, for
// every RB and R (batch invariance).
template <int FMT, int RB>
static inline __attribute__((always_inline)) void rows_block(const __m512i* w, __m512 s0, __m512 s1, __m512 off,
                                                             const Activations& x, int64_t r0, int64_t g,
                                                             __m512* acc) {
  constexpr bool OFFSET = FMT == Q4_1 || FMT == Q5_1;
  // one activation scale per block (scale_span): acc holds the block's sums before it, and the
  // block's offsets are already in it (tile)
  constexpr bool SPAN = scale_span(FMT) > 32;
  const int64_t k = x.k, G = k / 32;
  const int8_t* xq[RB];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) xq[r] = x.q.data() + (r0 + r) * k + 32 * g;
  if (FMT == Q6_K) {  // a scale per 16 values: two sums, each starting at −32 · Σx of its half
    __m512i d0[RB], d1[RB];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const int32_t* st = x.start16.data() + (r0 + r) * 2 * G + 2 * g;
      d0[r] = _mm512_set1_epi32(st[0]);
      d1[r] = _mm512_set1_epi32(st[1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        d0[r] = dot4(d0[r], w[i], xq[r] + 4 * i);
        d1[r] = dot4(d1[r], w[i + 4], xq[r] + 4 * i + 16);
      }
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const __m512 xd = _mm512_set1_ps(x.d[(r0 + r) * G + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0[r]), _mm512_mul_ps(s0, xd), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1[r]), _mm512_mul_ps(s1, xd), acc[r]);
    }
    return;
  }
  constexpr int P = RB < 4 ? 2 : 1;
  // A format with one offset per group starts each row's sum at −offset · Σx (integer sums are
  // exact, so where the correction enters changes nothing): a broadcast load instead of a
  // broadcast from a scalar register and a subtraction.
  constexpr int32_t OFF = group_offset(FMT);
  __m512i dot[RB][P];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p)
      dot[r][p] = OFF && p == 0 ? _mm512_set1_epi32(x.start32[(r0 + r) * G + g]) : _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) dot[r][i % P] = dot4(dot[r][i % P], w[i], xq[r] + 4 * i);
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
    const int64_t row = r0 + r;
    const __m512i d = P == 2 ? _mm512_add_epi32(dot[r][0], dot[r][P - 1]) : dot[r][0];
    if (SPAN) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s0, acc[r]);
      continue;
    }
    const __m512 xd = _mm512_set1_ps(x.d[row * G + g]);
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s0, xd), acc[r]);
    if (OFFSET) acc[r] = _mm512_fmadd_ps(off, _mm512_set1_ps(x.dsum[row * G + g]), acc[r]);
  }
}

// rows_block<FMT, 8> for a block of 8 rows kept interleaved (Activations::q8): the same integer
// sums and the same fp32 steps in the same order, so the same bits; the 8 rows' bytes and scales
// are one pointer with fixed offsets each (eight row pointers and their index arithmetic took
// more general registers than there are, and spilled).
template <int FMT>
static inline __attribute__((always_inline)) void rows_block8(const __m512i* w, __m512 s0, __m512 off,
                                                              const Activations& x, int64_t at,
                                                              __m512* acc) {
  constexpr bool OFFSET = FMT == Q4_1 || FMT == Q5_1;
  constexpr int32_t OFF = group_offset(FMT);
  const int8_t* xq = x.q8.data() + at * 32;
  const float* xd = x.d8.data() + at;
  __m512i dot[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r)
    dot[r] = OFF ? _mm512_set1_epi32(x.start8[at + r]) : _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) dot[r] = dot4(dot[r], w[i], xq + 32 * i + 4 * r);
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(s0, _mm512_set1_ps(xd[r])), acc[r]);
    if (OFFSET) acc[r] = _mm512_fmadd_ps(off, _mm512_set1_ps(x.dsum8[at + r]), acc[r]);
  }
}

// How far ahead of the kernel a tile's bytes are requested, and into which cache. Measured on a
// 2-core Xeon (AVX-512, AMX; benchmarks/kernel_bench.py --copies 24: SmolLM2-1.7B-shaped weights
// streaming from memory): requests into L2 (prefetcht1) 2 KiB ahead made one-row products
// 1.08-1.36x faster than requests into L1 8 KiB ahead (Q8_0 least, Q4_0 most: those fill L1's
// few miss buffers and stall the loads the kernel waits on), two-row products 1.07-1.33x, and
// 4-8 rows 1.02-1.21x, except for Q6_K, whose decoding makes 4 or more rows compute-bound:
// there lines wanted in L1 well ahead were 1.18-1.25x faster, so it keeps them. Weights that fit
// in the last cache (135M-shaped) ran the same either way. On a 2-core AMD EPYC of the Zen 4
// kind (32 MiB last cache, so the bundled model's 96 MB stream from memory) requests into L2
// want to be further ahead: 8 KiB beat 2 KiB in every one of three alternations at 1-8 rows
// (the products of a step 1.1-1.4x faster), 4 and 16 KiB were in between; the build passes
// RS_AHEAD_BYTES=8192 on AMD CPUs (ragspec/decoding/native/__init__.py).
#ifndef RS_AHEAD_BYTES
#define RS_AHEAD_BYTES 2048
#endif
template <int FMT>
constexpr bool into_l1(int64_t rows) { return FMT == Q6_K && rows >= 4; }
template <int FMT>
constexpr int64_t ahead_bytes(int64_t rows) { return into_l1<FMT>(rows) ? 8192 : RS_AHEAD_BYTES; }

// One tile (16 columns), activation rows r0..r0+R, columns lo..hi of the tile written to
// y[row * ldy + c] (y points at the tile's first column).
// `ahead`: the first byte not yet requested (t for the first tile of a run, t + ahead_bytes for
// the tiles after it, whose head the previous tile requested: a thread's tiles are consecutive).
template <int FMT, int R>
static void tile(const uint8_t* t, int64_t row_bytes, const Activations& x, int64_t r0, float* y,
                 int64_t ldy, __mmask16 cols, const uint8_t* ahead) {
  constexpr int BB = block_bytes(FMT), PB = block_elems(FMT) / 32;
  constexpr bool KQ = FMT == Q4_K || FMT == Q5_K, Q5 = FMT == Q5_0 || FMT == Q5_1;
  constexpr int64_t kAhead = ahead_bytes<FMT>(R);
  const int64_t blocks = row_bytes / BB;
  constexpr bool SPAN = scale_span(FMT) > 32;
  static_assert(!SPAN || KQ, "block sums start from k_scales' mins: only Q4_K and Q5_K");
  const int64_t G = x.k / 32;
  const bool interleaved = !x.q8.empty() && r0 % 8 == 0;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  __m512 sc[16], ndmin;
  __m512i mp[4];
  __m512 accb[SPAN ? R : 1];  // one block's sums, before the rows' scales (scale_span)
  __m512* into = SPAN ? accb : acc;
  // A run of tiles is one contiguous stretch of bytes, read once from memory: a cursor keeps
  // every cache line up to `kAhead` bytes past the group being decoded requested, across the end
  // of the tile into the next (a block's fields are not read in address order, which the
  // hardware prefetchers follow poorly on their own; a request past the weight is harmless).
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* tb = t + b * kTileRows * BB;
    if (KQ) k_scales(tb, sc, mp, &ndmin);
    if (FMT == Q6_K) q6_scales(tb, sc);
    if constexpr (SPAN) {
      // the block's offsets start its sums: −dmin · Σ_j m_j Σq_j, an exact integer sum (two
      // groups an instruction) until the one multiply
      for (int r = 0; r < R; ++r) {
        const int32_t* qp = x.qpair.data() + (r0 + r) * (G / 2) + 4 * b;
        __m512i mq = _mm512_setzero_si512();
        for (int i = 0; i < 4; ++i) mq = dot2w(mq, mp[i], qp + i);
        accb[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(mq), ndmin);
      }
    }
    for (int j = 0; j < PB; ++j) {
      const int64_t g = b * PB + j;
      const uint8_t* want = tb + (j + 1) * (kTileRows * BB / PB) + kAhead;
      for (; ahead < want; ahead += 64) {
        if constexpr (into_l1<FMT>(R)) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
        } else {
          _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T1);
        }
      }
      __m512i w[8];
      __m512 s0, s1 = _mm512_setzero_ps(), off = _mm512_setzero_ps();
      if (FMT == Q4_0 || FMT == Q4_1) {
        const uint8_t* q = tb + kTileRows * (FMT == Q4_0 ? 2 : 4);
        for (int i = 0; i < 4; ++i) {
          const __m512i v = ld(q + 64 * i);
          w[i] = lo4(v);
          w[i + 4] = hi4(v);
        }
        s0 = halves16(tb);
        if (FMT == Q4_1) off = halves16(tb + 32);
      } else if (Q5) {  // d, [m], 4 bytes of fifth bits, 16 bytes of nibbles
        const int at = FMT == Q5_0 ? 2 : 4;
        const __m512i qh = ld(tb + kTileRows * at);
        const uint8_t* q = tb + kTileRows * (at + 4);
        for (int i = 0; i < 4; ++i) {
          const __m512i v = ld(q + 64 * i);
          w[i] = _mm512_or_si512(lo4(v), fifth_bits(qh, i));
          w[i + 4] = _mm512_or_si512(hi4(v), fifth_bits(qh, i + 4));
        }
        s0 = halves16(tb);
        if (FMT == Q5_1) off = halves16(tb + 32);
      } else if (FMT == Q8_0) {
        for (int i = 0; i < 8; ++i) w[i] = ld(tb + kTileRows * 2 + 64 * i);
        s0 = halves16(tb);
      } else if (KQ) {
        const uint8_t* q = tb + kTileRows * ((FMT == Q4_K ? 16 : 48) + 32 * (j / 2));
        for (int i = 0; i < 8; ++i) w[i] = (j & 1) ? hi4(ld(q + 64 * i)) : lo4(ld(q + 64 * i));
        if (FMT == Q5_K) {
          const uint8_t* qh = tb + kTileRows * 16;
          for (int i = 0; i < 8; ++i) {
            const __m512i bit = _mm512_and_si512(_mm512_srli_epi16(ld(qh + 64 * i), j), _mm512_set1_epi8(1));
            w[i] = _mm512_or_si512(w[i], _mm512_slli_epi16(bit, 4));
          }
        }
        s0 = sc[j];
      } else {  // Q6_K
        const int n = j / 4, t4 = j % 4;
        const uint8_t* ql = tb + kTileRows * (64 * n + 32 * (t4 & 1));
        const uint8_t* qh = tb + kTileRows * (128 + 32 * n);
        for (int i = 0; i < 8; ++i) {
          const __m512i l = t4 >= 2 ? hi4(ld(ql + 64 * i)) : lo4(ld(ql + 64 * i));
          const __m512i h = _mm512_and_si512(_mm512_srli_epi16(ld(qh + 64 * i), 2 * t4), _mm512_set1_epi8(3));
          w[i] = _mm512_or_si512(l, _mm512_slli_epi16(h, 4));
        }
        s0 = sc[2 * j];
        s1 = sc[2 * j + 1];
      }
      constexpr int FULL = R / 8 * 8;  // rows in blocks of 8, then the rest as one block
      if (interleavable(FMT) && FULL && interleaved)  // r0 is a multiple of 8 (tile_rows' chunks)
        for (int rb = 0; rb < FULL; rb += 8)
          rows_block8<FMT>(w, s0, off, x, ((r0 + rb) / 8 * G + g) * 8, into + rb);
      else
        for (int rb = 0; rb < FULL; rb += 8) rows_block<FMT, 8>(w, s0, s1, off, x, r0 + rb, g, into + rb);
      if (FULL < R) rows_block<FMT, R - FULL>(w, s0, s1, off, x, r0 + FULL, g, into + FULL);
    }
    if constexpr (SPAN)  // the block's sums times each row's one activation scale for it
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(accb[r], _mm512_set1_ps(x.d[(r0 + r) * G + b * PB]), acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy, cols, acc[r]);
}

// Rows a tile is run for at a time. The K formats decode a group with several instructions
// (Q6_K: two loads, shifts and an OR per 4 bytes), so they keep 16 rows per decode; the others
// decode with one or two, and 16 rows' accumulators, weights and sums do not fit the 32
// registers: in chunks of 8 a Q4_0 or Q8_0 product of 16-64 rows took 0.86-0.94x the time of
// chunks of 16 (Q4_K about the same, Q6_K 1.2x) on a Zen 4 core.
template <int FMT>
constexpr int64_t chunk_rows() { return FMT == Q4_K || FMT == Q5_K || FMT == Q6_K ? 16 : 8; }

// Every activation row against one tile: chunks of chunk_rows rows, then the rest in one chunk.
// Only the first chunk requests lines ahead (the later ones find the tile in cache).
template <int FMT>
static void tile_rows(const uint8_t* t, int64_t row_bytes, const Activations& x, float* y,
                      int64_t ldy, __mmask16 cols, bool first) {
  constexpr int64_t C = chunk_rows<FMT>();
  // the first chunk's rows decide how far ahead the previous tile of the run requested
  const int64_t reach = ahead_bytes<FMT>(std::min<int64_t>(x.m, C));
  const uint8_t* ahead = first ? t : t + reach;
  const uint8_t* done = t + kTileRows * row_bytes + reach;  // nothing left to request
  int64_t r = 0;
  for (; r + C <= x.m; r += C, ahead = done) tile<FMT, C>(t, row_bytes, x, r, y, ldy, cols, ahead);
#define RS_ROWS(n) case n: tile<FMT, n>(t, row_bytes, x, r, y, ldy, cols, ahead); break;
  switch (x.m - r) {  // the rest: fewer than C rows
    RS_ROWS(1) RS_ROWS(2) RS_ROWS(3) RS_ROWS(4) RS_ROWS(5) RS_ROWS(6) RS_ROWS(7)
    default: break;
  }
  if constexpr (C == 16) {
    switch (x.m - r) {
      RS_ROWS(8) RS_ROWS(9) RS_ROWS(10) RS_ROWS(11) RS_ROWS(12) RS_ROWS(13) RS_ROWS(14) RS_ROWS(15)
      default: break;
    }
  }
#undef RS_ROWS
}

}  // namespace tiled

// Columns n0 <= c < n1 of the full tiles of a tiled weight (n0, n1 within the tiled rows).
inline void tiled_columns(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y,
                          int64_t ldy) {
  for (int64_t t = n0 / kTileRows; t * kTileRows < n1; ++t) {
    const int64_t c0 = t * kTileRows;
    const int lo = int(std::max(n0, c0) - c0), hi = int(std::min(n1, c0 + kTileRows) - c0);
    const __mmask16 cols = __mmask16(((1u << hi) - 1) & ~((1u << lo) - 1));
    const uint8_t* tp = w.data + c0 * w.row_bytes;
    float* yc = y + c0;
    const bool first = t == n0 / kTileRows;
    switch (w.fmt) {
      case Q4_0: tiled::tile_rows<Q4_0>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
      case Q4_1: tiled::tile_rows<Q4_1>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
      case Q5_0: tiled::tile_rows<Q5_0>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
      case Q5_1: tiled::tile_rows<Q5_1>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
      case Q8_0: tiled::tile_rows<Q8_0>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
      case Q4_K: tiled::tile_rows<Q4_K>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
      case Q5_K: tiled::tile_rows<Q5_K>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
      default: tiled::tile_rows<Q6_K>(tp, w.row_bytes, x, yc, ldy, cols, first); break;
    }
  }
}

#endif  // RS_AVX512

}  // namespace rs
