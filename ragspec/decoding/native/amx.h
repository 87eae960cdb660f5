// Products of many activation rows with tiled weights on Intel AMX (the int8 tile unit), for
// prompt reads.
//
// Contract: `amx::wanted(m, fmt)` is true when this CPU has AMX-TILE and AMX-INT8, Linux granted
// the process the tile state, the kernels were built with AMX (`-march=native` on such a CPU),
// the unit is switched on (`RAGSPEC_AMX=1`, or the `set_amx` op; off by default), the format is one the
// kernel reads (every tileable one but Q4_K and Q5_K, whose activations have one scale per block
// of 256 and stay on the VNNI kernel), and there are at least `kMinRows` rows. Then `amx::tiled_columns` computes what
// the AVX-512 VNNI tiled kernel (tiled.h) computes, bit for bit: for each output, the same exact
// integer dot product per group (per half group for Q6_K), then the same fp32 multiply and
// fused multiply-adds in the same order of k. Only the integer sums move to the tile unit, and
// integer sums are exact, so a prompt read on AMX and a verify on VNNI agree row for row.
// Single-threaded, like every kernel of kernels.h; callers split columns between threads.
#pragma once

#include <cstdint>

#include "kernels.h"

namespace rs {
namespace amx {

// Fewer rows than this keep the VNNI kernel (decode and verify steps are at most 64 rows).
constexpr int64_t kMinRows = 65;

// AMX usable here and switched on (see above), whatever the rows and format.
bool ready();
// ready(), the format is read by the AMX kernel (tiled form), and m >= kMinRows.
bool wanted(int64_t m, int fmt);
// Columns n0 <= c < n1 of the full tiles of a tiled weight (as tiled.h's tiled_columns).
void tiled_columns(const Activations& x, const WeightView& w, int64_t n0, int64_t n1, float* y, int64_t ldy);

}  // namespace amx
}  // namespace rs
