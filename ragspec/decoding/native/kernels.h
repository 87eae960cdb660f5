// The C++ interface of ragspec's kernels, for code that calls them without going through torch
// (a whole decode step in one native call): products with packed weights and row attention.
//
// Contract: every function here is row-invariant (a row's result never depends on the other
// rows passed with it) and single-threaded; callers split the work between threads themselves
// (by columns for products, by rows and heads for attention), which keeps each output element
// the work of one thread whatever the split. `prepare` turns activations into the form a weight
// format multiplies (int8 groups for quantised formats, fp32 for plain ones); several weights of
// one format can share one prepared input (q, k and v of a layer).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <vector>

namespace rs {

// n rows (output features) of k values (input features) in format `fmt` (formats.h), row_bytes each;
// `tiled`: the rows are stored in tiles of 16 (tiled.h), the format's code plus kTiledBit.
struct WeightView {
  const uint8_t* data = nullptr;
  int fmt = 0;
  int64_t n = 0, k = 0, row_bytes = 0;
  bool tiled = false;
};

// The view of a packed weight tensor as Python holds it (PackedWeight.data, .code, .in_features);
// checks the tensor's type and shape (a TORCH_CHECK error otherwise). Code that is handed packed
// weights builds its views with this, so a change of layout stays inside the kernels.
WeightView weight_view(const at::Tensor& data, int64_t fmt, int64_t k);

// m rows of k activations, prepared for the weight format `fmt`.
struct Activations {
  int fmt = 0;
  int64_t m = 0, k = 0;
  const float* x = nullptr;  // the fp32 rows (m, k), used directly by plain formats
  std::vector<int8_t> q;     // quantised formats: (m, k) int8
  std::vector<float> d;      // (m, k/32) scale of each group of 32 (one per block of 256, repeated,
                             // for the K formats: scale_span)
  std::vector<float> dsum;   // (m, k/32) d · Σq of each group (for weight offsets)
  std::vector<int32_t> qsum16;  // (m, k/16) Σq of each half group (integer weight offsets)
  std::vector<int32_t> start32;  // (m, k/32) −group_offset(fmt) · Σq of each group, for the
                                 // formats with one (where a tiled group's integer dot starts)
  std::vector<int32_t> start16;  // (m, k/16) −32 · Σq of each half group, for Q6_K (the same)
  std::vector<int32_t> qpair;    // (m, k/64) Σq of groups 2p and 2p + 1 as two int16 (low, high),
                                 // for Q4_K / Q5_K (their blocks' offsets as integer sums)
  // A prompt's rows (m >= 64) for the tiled kernel of the formats with groups of 32 (filled by
  // the quantiser where tiled.h's interleavable says, empty otherwise): the whole blocks of 8
  // rows, each group's 8 rows side by side, so that a block of rows is one pointer with fixed
  // offsets. q8 (m/8, k/32, 256): row r's 4 bytes 4i..4i+3 at
  // 32i + 4r; d8, dsum8, start8 (m/8, k/32, 8): d, dsum, start32 of the block's rows.
  std::vector<int8_t> q8;
  std::vector<float> d8, dsum8;
  std::vector<int32_t> start8;
};

// Prepares x (m, k), row-major, for weights of format fmt (a tiled code is accepted). `x` must outlive `out` (plain
// formats keep the pointer). Single-threaded.
void prepare(const float* x, int64_t m, int64_t k, int fmt, Activations& out);

// Columns n0 <= c < n1 of y = x · Wᵀ for every prepared row: y[r * ldy + c]. Single-threaded.
void matmul_columns(const Activations& a, const WeightView& w, int64_t n0, int64_t n1, float* y,
                    int64_t ldy);

// A column count per task that keeps the cost of handing out work small, for m rows (a multiple
// of 16 for tiled weights: a split inside a tile is correct but computes that tile twice).
int64_t column_grain(const WeightView& w, int64_t m);

// One query row (d values) against the keys lo..hi of k/v (rows kstride / vstride floats apart):
// softmax(q · k · scale, soft-capped by `softcap` when > 0) · v into out (d values).
// `scratch` is reused between calls (resized as needed).
// k/v are fp32, or fp16 (IEEE half bits) widened to fp32 as they are read; the arithmetic is
// the same for both.
void attend_row(const float* q, const float* k, const float* v, int64_t kstride, int64_t vstride,
                int64_t lo, int64_t hi, int64_t d, float scale, float softcap, float* out,
                std::vector<float>& scratch);
void attend_row(const float* q, const uint16_t* k, const uint16_t* v, int64_t kstride, int64_t vstride,
                int64_t lo, int64_t hi, int64_t d, float scale, float softcap, float* out,
                std::vector<float>& scratch);

// Queries q[0..n) (d values each) against keys 0..hi[a] each, hi ascending: for every query
// exactly what attend_row gives it with lo = 0 and no soft-capping, bit for bit, computed with
// the loads of the keys and values they all see shared between them (a prompt's rows, and the
// query heads that read one key head). out[a] gets query a's d values. `stream`: the keys and
// values are likely in memory, not in a cache (a verify's few rows read them once), so they are
// requested ahead of their use; a prompt read's many tasks over the same key head find them
// cached, and the requests would only cost.
void attend_rows_shared(const float* const* q, const int64_t* hi, int n, const float* k, const float* v,
                        int64_t kstride, int64_t vstride, int64_t d, float scale, float* const* out,
                        std::vector<float>& scratch, bool stream);
void attend_rows_shared(const float* const* q, const int64_t* hi, int n, const uint16_t* k, const uint16_t* v,
                        int64_t kstride, int64_t vstride, int64_t d, float scale, float* const* out,
                        std::vector<float>& scratch, bool stream);

// One thread's reusable buffers for gathering attend_rows_shared's queries, outputs and key
// ranges, and its scratch.
struct SharedRowsScratch {
  std::vector<float> s;
  std::vector<const float*> qs;
  std::vector<float*> outs;
  std::vector<int64_t> his;
};

// Runs body(worker_state, i) for every task 0 <= i < cost.size() on torch's threads, each thread
// taking the dearest task not yet taken (tasks handed out one at a time, dearest first), so
// unequal tasks (prompt rows late in a prompt see more keys) end together instead of the thread
// with the long rows finishing last. Which thread runs a task never changes its result.
template <typename State, typename Body>
void run_dearest_first(const std::vector<int64_t>& cost, const Body& body) {
  const int64_t n = int64_t(cost.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    State state;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) body(state, order[i]);
  });
}

// n values into a KV cache buffer of fp32 (copied) or fp16 (rounded to nearest even, as torch's
// conversion rounds, so either writer leaves the same bits).
void store_kv(const float* x, int64_t n, float* out);
void store_kv(const float* x, int64_t n, uint16_t* out);

}  // namespace rs
