// Weight formats the native kernels read in place: GGUF's block layouts, row by row.
//
// A weight matrix is N rows (output features) of K values; each row is a run of blocks. The
// kernels see every quantised format the same way, as groups of 32 consecutive values:
// 32 small integers q and, for each half of 16, a scale and an offset, so that
//     w[i] = scale[i / 16] * q[i] + offset[i / 16].
// `decode_group` is the scalar reference of that view; the AVX2 kernels decode the same groups
// with vector instructions and are tested against it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace rs {

enum Format : int {
  F32 = 0, F16 = 1, BF16 = 2,          // plain values
  Q4_0 = 3, Q4_1 = 4, Q8_0 = 5,        // blocks of 32
  Q4_K = 6, Q5_K = 7, Q6_K = 8,        // super-blocks of 256
  Q5_0 = 9, Q5_1 = 10,                 // blocks of 32
};

constexpr int block_elems(int fmt) {
  switch (fmt) {
    case F32: case F16: case BF16: return 1;
    case Q4_0: case Q4_1: case Q8_0: case Q5_0: case Q5_1: return 32;
    default: return 256;
  }
}

constexpr int block_bytes(int fmt) {
  switch (fmt) {
    case F32: return 4;
    case F16: case BF16: return 2;
    case Q4_0: return 18;   // fp16 d, 16 bytes of nibbles
    case Q4_1: return 20;   // fp16 d, fp16 m, 16 bytes of nibbles
    case Q8_0: return 34;   // fp16 d, 32 int8
    case Q4_K: return 144;  // fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles
    case Q5_K: return 176;  // as Q4_K plus 32 bytes of fifth bits
    case Q6_K: return 210;  // 128 bytes low nibbles, 64 of high pairs, 16 int8 scales, fp16 d
    case Q5_0: return 22;   // fp16 d, 32 fifth bits, 16 bytes of nibbles
    case Q5_1: return 24;   // fp16 d, fp16 m, 32 fifth bits, 16 bytes of nibbles
    default: return 0;
  }
}

inline bool is_quantised(int fmt) { return fmt >= Q4_0 && fmt <= Q5_1; }

// How many consecutive activation values share one scale when they meet weights of `fmt`: 256
// (a whole block, as llama.cpp's Q8_K) for Q4_K and Q5_K, whose eight sub-block scales and mins
// then apply to integer sums under one scale (tiled.h), 32 for the rest.
constexpr int scale_span(int fmt) { return fmt == Q4_K || fmt == Q5_K ? 256 : 32; }

// What a tiled weight's group of 32 unsigned quants stands above its signed values, when one
// number does for the whole group (Q4_0: 8, Q5_0: 16, Q8_0 stored plus 128), else 0: a dot
// product with int8 activations is then the unsigned one minus this times the activations' sum.
constexpr int32_t group_offset(int fmt) { return fmt == Q4_0 ? 8 : fmt == Q5_0 ? 16 : fmt == Q8_0 ? 128 : 0; }

// Q8_0's values are signed; every other quantised format's q is unsigned (0..63).
inline bool signed_q(int fmt) { return fmt == Q8_0; }

inline int64_t row_bytes(int fmt, int64_t k) { return k / block_elems(fmt) * block_bytes(fmt); }

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(man & 0x400u)) { man <<= 1; --exp; }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_to_f32(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K / Q5_K super-block.
inline void k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

struct Group {
  uint8_t q[32];  // unsigned 0..63, or int8 bits for Q8_0
  float scale[2];
  float offset[2];
};

// Group g (values 32g .. 32g+31) of a row of a quantised format.
inline void decode_group(int fmt, const uint8_t* row, int64_t g, Group& out) {
  const int per_block = block_elems(fmt) / 32;
  const uint8_t* b = row + (g / per_block) * block_bytes(fmt);
  const int j = int(g % per_block);
  switch (fmt) {
    case Q4_0: {
      const float d = f16_to_f32(load_u16(b));
      for (int i = 0; i < 16; ++i) {
        out.q[i] = b[2 + i] & 0x0f;
        out.q[i + 16] = b[2 + i] >> 4;
      }
      out.scale[0] = out.scale[1] = d;
      out.offset[0] = out.offset[1] = -8.0f * d;
      return;
    }
    case Q4_1: {
      const float d = f16_to_f32(load_u16(b)), m = f16_to_f32(load_u16(b + 2));
      for (int i = 0; i < 16; ++i) {
        out.q[i] = b[4 + i] & 0x0f;
        out.q[i + 16] = b[4 + i] >> 4;
      }
      out.scale[0] = out.scale[1] = d;
      out.offset[0] = out.offset[1] = m;
      return;
    }
    case Q5_0:
    case Q5_1: {
      const int at = fmt == Q5_0 ? 2 : 4;
      const float d = f16_to_f32(load_u16(b));
      uint32_t high;
      std::memcpy(&high, b + at, 4);
      for (int i = 0; i < 16; ++i) {
        out.q[i] = uint8_t((b[at + 4 + i] & 0x0f) | (((high >> i) & 1) << 4));
        out.q[i + 16] = uint8_t((b[at + 4 + i] >> 4) | (((high >> (i + 16)) & 1) << 4));
      }
      out.scale[0] = out.scale[1] = d;
      out.offset[0] = out.offset[1] = fmt == Q5_0 ? -16.0f * d : f16_to_f32(load_u16(b + 2));
      return;
    }
    case Q8_0: {
      const float d = f16_to_f32(load_u16(b));
      std::memcpy(out.q, b + 2, 32);
      out.scale[0] = out.scale[1] = d;
      out.offset[0] = out.offset[1] = 0.0f;
      return;
    }
    case Q4_K:
    case Q5_K: {
      const float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
      int sc, m;
      k_scale_min(b + 4, j, sc, m);
      const uint8_t* qs = b + (fmt == Q4_K ? 16 : 48) + (j / 2) * 32;
      const int shift = (j & 1) ? 4 : 0;
      for (int i = 0; i < 32; ++i) {
        int q = (qs[i] >> shift) & 0x0f;
        if (fmt == Q5_K) q |= ((b[16 + i] >> j) & 1) << 4;
        out.q[i] = uint8_t(q);
      }
      out.scale[0] = out.scale[1] = d * float(sc);
      out.offset[0] = out.offset[1] = -(dmin * float(m));
      return;
    }
    case Q6_K: {
      const int n = j / 4, t = j % 4;
      const uint8_t* ql = b + 64 * n + 32 * (t & 1);
      const uint8_t* qh = b + 128 + 32 * n;
      const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
      const float d = f16_to_f32(load_u16(b + 208));
      const int nshift = (t >= 2) ? 4 : 0;
      for (int i = 0; i < 32; ++i) {
        out.q[i] = uint8_t(((ql[i] >> nshift) & 0x0f) | (((qh[i] >> (2 * t)) & 3) << 4));
      }
      for (int h = 0; h < 2; ++h) {
        out.scale[h] = d * float(scales[2 * j + h]);
        out.offset[h] = -32.0f * out.scale[h];
      }
      return;
    }
    default:
      return;
  }
}

// One weight value, computed as GGUF's own de-quantisation does (fp32, the same operations).
inline float group_value(int fmt, const Group& grp, int i) {
  const int h = i / 16;
  if (fmt == Q8_0) return grp.scale[h] * float(int8_t(grp.q[i]));
  if (fmt == Q4_0) return grp.scale[h] * float(int(grp.q[i]) - 8);
  if (fmt == Q5_0) return grp.scale[h] * float(int(grp.q[i]) - 16);
  if (fmt == Q4_1 || fmt == Q5_1) return grp.scale[h] * float(grp.q[i]) + grp.offset[h];
  if (fmt == Q6_K) return grp.scale[h] * float(int(grp.q[i]) - 32);
  return grp.scale[h] * float(grp.q[i]) + grp.offset[h];  // K-quants: d·sc·q − dmin·m
}

}  // namespace rs
