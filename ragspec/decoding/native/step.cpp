// A whole decode or verify step of a Llama-family model with packed weights, in one native call.
//
// StepModel holds the model's weights (packed linears through kernels.h, fp32 norms, biases and
// rotary frequencies) and `forward` runs T new rows through every layer: RMSNorm, the q/k/v
// products, optional per-head q/k norms, rotary positions, the new keys and values written into
// the caller's cache buffers, attention over the cache (attend_row, the kernel of attention.cpp),
// the output product, the gated MLP, the residuals, the final norm and the LM head. The family
// differences are parameters, never separate code paths: biases are optional on every product,
// q/k norms optional, rotary positions on or off per layer, and the residual, embedding and
// logit multipliers and the norm weight offset are numbers (1, 1, 1, 0 for Llama).
//
// Row invariance: every operation computes a row from that row alone, in a fixed order (norms,
// rotary and activations are per-row loops; products and attention are kernels.h's row-invariant
// kernels, split across threads by columns or by heads), so a row's result is the same whether
// it is computed alone or with the rows of a draft after it — what keeps greedy speculation exact.
//
// The cache buffers are (1, kv_heads, capacity, head_dim) fp32 tensors with room for start + T
// positions (the Python side reserves it); rows 0..start-1 hold earlier positions. Row t is at
// position start + t and attends to positions 0..start + t.
//
// `forward_many` runs the rows of several sequences (blocks) in one call, each block against
// its own cache buffers at its own positions: the products read each weight once for all the
// blocks' rows, while norms, rotary positions, cache writes and attention stay per row and per
// block — so each block gets, bit for bit, what `forward` gives it alone (row invariance again).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace rs {
namespace {

using simd::F16;
using simd::map16;
using simd::part;

using Clock = std::chrono::steady_clock;

int64_t since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

struct Linear {
  at::Tensor data, bias;  // bias: an empty tensor when the product has none
  WeightView w;
  bool has_bias() const { return bias.numel() > 0; }
};

struct Layer {
  at::Tensor attn_norm, mlp_norm, q_norm, k_norm;  // q/k norms empty when the family has none
  Linear q, k, v, o, gate, up, down;
  bool rotary = true;  // false: the layer's q and k take no rotary positions (SmolLM3's NoPE layers)
};

// One product to run: y[r * ldy + c] for the columns of w, from prepared activations.
struct Job {
  Activations* a;
  const Linear* lin;
  float* y;
};

// y = x / sqrt(mean(x²) + eps) · (w + offset) for m rows of n values (row strides sx, sy; y may
// be x).
void rms_norm(const float* x, int64_t sx, int64_t m, int64_t n, const float* w, float eps, float offset,
              float* y, int64_t sy) {
  const F16 off = F16::set(offset);
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * sx;
    const F16 inv = F16::set(1.0f / std::sqrt(simd::sum_squares(xr, n) / float(n) + eps));
    map16(n, y + r * sy, [&](int64_t i, int64_t c) { return (part(w, i, c) + off) * (part(xr, i, c) * inv); });
  }
}

// x[i] *= s for n values.
void scale(float* x, int64_t n, float s) {
  const F16 f = F16::set(s);
  map16(n, x, [&](int64_t i, int64_t c) { return part(x, i, c) * f; });
}

// h[i] += d[i] · s for n values (the residual).
void add_scaled(float* h, const float* d, int64_t n, float s) {
  const F16 f = F16::set(s);
  map16(n, h, [&](int64_t i, int64_t c) { return part(h, i, c) + part(d, i, c) * f; });
}

// g[i] = SiLU(g[i]) · u[i] = g / (1 + e^−g) · u for n values.
void silu_mul(float* g, const float* u, int64_t n) {
  const F16 one = F16::set(1.0f), zero = F16::set(0.0f);
  map16(n, g, [&](int64_t i, int64_t c) {
    const F16 x = part(g, i, c);
    return x / (one + simd::exp(zero - x)) * part(u, i, c);
  });
}

// fn(r0, r1) over rows 0..T, in parallel for a prompt's many rows (each row's values never
// depend on the others', so how rows are split changes no bits), on this thread for a step's.
template <typename F>
void by_rows(int64_t T, F fn) {
  if (T < 64) {
    fn(int64_t(0), T);
    return;
  }
  at::parallel_for(0, T, 16, fn);
}

}  // namespace

class StepModel : public torch::CustomClassHolder {
 public:
  // tensors: inv_freq, final_norm, head, head_bias, then per layer kSlots tensors (see slot order
  // in native_step.py); ints: layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, then
  // per layer the formats of q, k, v, o, gate, up, down and whether it takes rotary positions
  // (1) or none (0), then the head's format; floats: eps,
  // attention scale, rotary scaling, residual multiplier, embedding multiplier, logit
  // multiplier, norm weight offset.
  static constexpr int64_t kSlots = 18, kLayerInts = 8;

  StepModel(std::vector<at::Tensor> t, std::vector<int64_t> ints, std::vector<double> floats) {
    TORCH_CHECK(ints.size() >= 7 && floats.size() == 7, "StepModel: bad header");
    layers_ = ints[0], hidden_ = ints[1], heads_ = ints[2], kv_heads_ = ints[3], head_dim_ = ints[4];
    inter_ = ints[5], vocab_ = ints[6];
    TORCH_CHECK(int64_t(ints.size()) == 7 + kLayerInts * layers_ + 1, "StepModel: expected ",
                7 + kLayerInts * layers_ + 1, " ints");
    TORCH_CHECK(int64_t(t.size()) == 4 + kSlots * layers_, "StepModel: expected ", 4 + kSlots * layers_, " tensors");
    TORCH_CHECK(heads_ % kv_heads_ == 0 && head_dim_ % 2 == 0, "StepModel: bad head layout");
    eps_ = float(floats[0]), scale_ = float(floats[1]), rope_scale_ = float(floats[2]);
    resid_mult_ = float(floats[3]), embed_mult_ = float(floats[4]), logit_mult_ = float(floats[5]);
    norm_offset_ = float(floats[6]);
    inv_freq_ = fp32(t[0], head_dim_ / 2, "inv_freq");
    final_norm_ = fp32(t[1], hidden_, "final norm");
    head_ = linear(t[2], t[3], ints[7 + kLayerInts * layers_], hidden_, vocab_);
    const int64_t qd = heads_ * head_dim_, kvd = kv_heads_ * head_dim_;
    for (int64_t l = 0; l < layers_; ++l) {
      const at::Tensor* s = t.data() + 4 + kSlots * l;
      const int64_t* f = ints.data() + 7 + kLayerInts * l;
      Layer L;
      L.attn_norm = fp32(s[0], hidden_, "attention norm");
      L.q = linear(s[1], s[2], f[0], hidden_, qd);
      L.k = linear(s[3], s[4], f[1], hidden_, kvd);
      L.v = linear(s[5], s[6], f[2], hidden_, kvd);
      L.o = linear(s[7], s[8], f[3], qd, hidden_);
      L.mlp_norm = fp32(s[9], hidden_, "MLP norm");
      L.gate = linear(s[10], s[11], f[4], hidden_, inter_);
      L.up = linear(s[12], s[13], f[5], hidden_, inter_);
      L.down = linear(s[14], s[15], f[6], inter_, hidden_);
      L.q_norm = s[16].numel() ? fp32(s[16], head_dim_, "q norm") : s[16];
      L.k_norm = s[17].numel() ? fp32(s[17], head_dim_, "k norm") : s[17];
      TORCH_CHECK(f[7] == 0 || f[7] == 1, "StepModel: layer ", l, "'s rotary flag must be 0 or 1");
      L.rotary = f[7] == 1;
      layers.push_back(std::move(L));
    }
  }

  // x: (T, hidden) fp32 embeddings of the new rows; keys/values: each layer's cache buffer;
  // start: positions already cached; keep: how many of the last rows get logits.
  // Returns logits (keep, vocab). One sequence: forward_many with one block.
  at::Tensor forward(at::Tensor x_in, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                     int64_t start, int64_t keep) {
    TORCH_CHECK(x_in.dim() == 2, "forward takes (rows, hidden) embeddings");
    return forward_many(x_in, keys, values, {start}, {x_in.size(0)}, {keep});
  }

  // Several sequences' new rows in one call. x: (T, hidden), the blocks' rows one after the
  // other (block s has rows[s] rows, T = Σ rows); keys/values: layers buffers per block, block
  // after block (keys[s * layers + l] is block s's layer l); starts[s]: the positions block s's
  // cache already holds; keeps[s]: how many of block s's last rows get logits (0: none).
  // Products run over all T rows at once (the weights are read once for every block); norms,
  // rotary positions, the cache writes and attention run each row against its own block's
  // positions and cache. Every row's arithmetic is the one it gets alone (row invariance), so a
  // block's logits and cache rows are bit-identical to forward() on that block by itself.
  // Returns logits (Σ keeps, vocab), block after block.
  at::Tensor forward_many(at::Tensor x_in, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                          std::vector<int64_t> starts, std::vector<int64_t> rows, std::vector<int64_t> keeps) {
    const auto t0 = Clock::now();
    TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == hidden_, "forward takes (rows, ", hidden_, ") embeddings");
    const int64_t S = int64_t(rows.size());
    TORCH_CHECK(S > 0 && int64_t(starts.size()) == S && int64_t(keeps.size()) == S,
                "one start, row count and keep per block");
    TORCH_CHECK(int64_t(keys.size()) == S * layers_ && int64_t(values.size()) == S * layers_,
                "one cache buffer per layer per block");
    std::vector<int64_t> offset(S + 1, 0);
    int64_t kept = 0;
    for (int64_t s = 0; s < S; ++s) {
      TORCH_CHECK(rows[s] > 0 && 0 <= keeps[s] && keeps[s] <= rows[s] && starts[s] >= 0, "bad row counts");
      offset[s + 1] = offset[s] + rows[s];
      kept += keeps[s];
    }
    const int64_t T = offset[S];
    TORCH_CHECK(x_in.size(0) == T, "the embeddings have ", x_in.size(0), " rows, the blocks ", T);
    const at::ScalarType kv_type = keys[0].scalar_type();
    TORCH_CHECK(kv_type == at::kFloat || kv_type == at::kHalf, "the cache buffers must be fp32 or fp16");
    for (int64_t s = 0; s < S; ++s)
      for (int64_t l = 0; l < layers_; ++l)
        for (const at::Tensor* b : {&keys[s * layers_ + l], &values[s * layers_ + l]}) {
          TORCH_CHECK(b->scalar_type() == kv_type && b->dim() == 4 && b->is_contiguous() &&
                          b->size(1) == kv_heads_ && b->size(3) == head_dim_ && b->size(2) >= starts[s] + rows[s],
                      "block ", s, " layer ", l, ": the cache buffer must be a contiguous (1, ", kv_heads_,
                      ", >= ", starts[s] + rows[s], ", ", head_dim_, ") tensor of the first buffer's type");
        }
    if (kv_type == at::kHalf) return run<uint16_t>(x_in, keys, values, starts, rows, keeps, offset, t0);
    return run<float>(x_in, keys, values, starts, rows, keeps, offset, t0);
  }

  // [forwards, total ns, ns in products (with preparing their inputs), ns in attention]
  std::vector<int64_t> stats() const { return {calls_, total_ns_, matmul_ns_, attend_ns_}; }

  void reset_stats() { calls_ = total_ns_ = matmul_ns_ = attend_ns_ = 0; }

 private:
  // forward_many after its checks, for cache buffers of element type KV (float or fp16 bits)
  template <typename KV>
  at::Tensor run(const at::Tensor& x_in, const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                 const std::vector<int64_t>& starts, const std::vector<int64_t>& rows,
                 const std::vector<int64_t>& keeps, const std::vector<int64_t>& offset, Clock::time_point t0) {
    const int64_t S = int64_t(rows.size()), T = offset[S];
    int64_t kept = 0;
    for (int64_t s = 0; s < S; ++s) kept += keeps[s];
    const int64_t qd = heads_ * head_dim_, kvd = kv_heads_ * head_dim_, half = head_dim_ / 2;
    // each row's block and position
    std::vector<int64_t> block(T), pos(T);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t r = offset[s]; r < offset[s + 1]; ++r) block[r] = s, pos[r] = starts[s] + (r - offset[s]);
    at::Tensor h = x_in.to(at::kFloat).contiguous().clone();
    float* hp = h.data_ptr<float>();
    if (embed_mult_ != 1.0f) scale(hp, T * hidden_, embed_mult_);
    const int64_t wide = std::max({hidden_, qd, inter_});
    std::vector<float> n(T * wide), q(T * qd), k(T * kvd), v(T * kvd), att(T * qd), g(T * inter_),
        u(T * inter_), out(T * hidden_);
    // cos/sin of every row's position, shared by all layers and heads
    std::vector<float> cs(T * half), sn(T * half);
    const float* invf = inv_freq_.data_ptr<float>();
    for (int64_t r = 0; r < T; ++r)
      for (int64_t i = 0; i < half; ++i) {
        const float f = float(pos[r]) * invf[i];
        cs[r * half + i] = std::cos(f) * rope_scale_;
        sn[r * half + i] = std::sin(f) * rope_scale_;
      }
    std::vector<KV*> kbs(S), vbs(S);
    std::vector<int64_t> caps(S);
    Activations a1, a2, a3;
    for (int64_t l = 0; l < layers_; ++l) {
      const Layer& L = layers[l];
      const float* attn_norm = L.attn_norm.data_ptr<float>();
      by_rows(T, [&](int64_t r0, int64_t r1) {
        rms_norm(hp + r0 * hidden_, hidden_, r1 - r0, hidden_, attn_norm, eps_, norm_offset_, n.data() + r0 * hidden_,
                 hidden_);
      });
      products(n.data(), T, {{&a1, &L.q, q.data()}, {&a2, &L.k, k.data()}, {&a3, &L.v, v.data()}});
      if (L.q_norm.numel()) {
        rms_norm(q.data(), head_dim_, T * heads_, head_dim_, L.q_norm.data_ptr<float>(), eps_, norm_offset_, q.data(), head_dim_);
        rms_norm(k.data(), head_dim_, T * kv_heads_, head_dim_, L.k_norm.data_ptr<float>(), eps_, norm_offset_, k.data(), head_dim_);
      }
      if (L.rotary)
        by_rows(T, [&](int64_t r0, int64_t r1) {
          rotate(q.data(), r0, r1, heads_, cs, sn);
          rotate(k.data(), r0, r1, kv_heads_, cs, sn);
        });
      for (int64_t s = 0; s < S; ++s) {
        kbs[s] = static_cast<KV*>(keys[s * layers_ + l].data_ptr());
        vbs[s] = static_cast<KV*>(values[s * layers_ + l].data_ptr());
        caps[s] = keys[s * layers_ + l].size(2);
      }
      by_rows(T, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t s = block[r], cap = caps[s];
          for (int64_t gh = 0; gh < kv_heads_; ++gh) {
            store_kv(k.data() + r * kvd + gh * head_dim_, head_dim_, kbs[s] + (gh * cap + pos[r]) * head_dim_);
            store_kv(v.data() + r * kvd + gh * head_dim_, head_dim_, vbs[s] + (gh * cap + pos[r]) * head_dim_);
          }
        }
      });
      attend(q.data(), kbs, vbs, caps, block, pos, att.data());
      products(att.data(), T, {{&a1, &L.o, out.data()}});
      const float* mlp_norm = L.mlp_norm.data_ptr<float>();
      by_rows(T, [&](int64_t r0, int64_t r1) {
        add_scaled(hp + r0 * hidden_, out.data() + r0 * hidden_, (r1 - r0) * hidden_, resid_mult_);
        rms_norm(hp + r0 * hidden_, hidden_, r1 - r0, hidden_, mlp_norm, eps_, norm_offset_, n.data() + r0 * hidden_,
                 hidden_);
      });
      products(n.data(), T, {{&a1, &L.gate, g.data()}, {&a2, &L.up, u.data()}});
      by_rows(T, [&](int64_t r0, int64_t r1) {
        silu_mul(g.data() + r0 * inter_, u.data() + r0 * inter_, (r1 - r0) * inter_);
      });
      products(g.data(), T, {{&a1, &L.down, out.data()}});
      by_rows(T, [&](int64_t r0, int64_t r1) {
        add_scaled(hp + r0 * hidden_, out.data() + r0 * hidden_, (r1 - r0) * hidden_, resid_mult_);
      });
    }
    at::Tensor logits = at::empty({kept, vocab_}, h.options());
    if (kept > 0) {
      // the kept rows of every block, gathered in order, through the final norm and the head
      int64_t at_row = 0;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t first = offset[s + 1] - keeps[s];
        rms_norm(hp + first * hidden_, hidden_, keeps[s], hidden_, final_norm_.data_ptr<float>(), eps_, norm_offset_,
                 n.data() + at_row * hidden_, hidden_);
        at_row += keeps[s];
      }
      float* lp = logits.data_ptr<float>();
      products(n.data(), kept, {{&a1, &head_, lp}});
      if (logit_mult_ != 1.0f) scale(lp, kept * vocab_, logit_mult_);
    }
    calls_ += 1;
    total_ns_ += since(t0);
    return logits;
  }

  std::vector<Layer> layers;
  int64_t layers_, hidden_, heads_, kv_heads_, head_dim_, inter_, vocab_;
  float eps_, scale_, rope_scale_, resid_mult_, embed_mult_, logit_mult_, norm_offset_;
  at::Tensor inv_freq_, final_norm_;
  Linear head_;
  int64_t calls_ = 0, total_ns_ = 0, matmul_ns_ = 0, attend_ns_ = 0;

  static at::Tensor fp32(const at::Tensor& t, int64_t size, const char* what) {
    TORCH_CHECK(t.numel() == size, "StepModel: ", what, " has ", t.numel(), " values, expected ", size);
    return t.to(at::kFloat).contiguous();
  }

  static Linear linear(const at::Tensor& data, const at::Tensor& bias, int64_t fmt, int64_t k, int64_t n) {
    Linear lin;
    lin.data = data;
    lin.w = weight_view(data, fmt, k);
    TORCH_CHECK(lin.w.n == n, "StepModel: a product has ", lin.w.n, " outputs, expected ", n);
    lin.bias = bias.numel() ? fp32(bias, n, "bias") : bias;
    return lin;
  }

  // The products that share input x (m rows): each job's activations are prepared for its
  // weight's format (re-used when the previous job has the same), then all their columns are
  // shared out between the threads in one parallel region, and biases added.
  void products(const float* x, int64_t m, std::vector<Job> jobs) {
    const auto t0 = Clock::now();
    const int64_t k = jobs[0].lin->w.k;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (j > 0 && jobs[j].lin->w.fmt == jobs[j - 1].lin->w.fmt) {
        jobs[j].a = jobs[j - 1].a;
      } else {
        prepare(x, m, k, jobs[j].lin->w.fmt, *jobs[j].a);
      }
    }
    // units of column_grain columns, numbered across the jobs
    std::vector<int64_t> first(jobs.size() + 1, 0), grain(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) {
      grain[j] = std::max<int64_t>(1, column_grain(jobs[j].lin->w, m));
      first[j + 1] = first[j] + (jobs[j].lin->w.n + grain[j] - 1) / grain[j];
    }
    at::parallel_for(0, first.back(), 1, [&](int64_t b, int64_t e) {
      for (size_t j = 0; j < jobs.size(); ++j) {
        const int64_t lo = std::max(b, first[j]), hi = std::min(e, first[j + 1]);
        if (lo >= hi) continue;
        const WeightView& w = jobs[j].lin->w;
        matmul_columns(*jobs[j].a, w, (lo - first[j]) * grain[j], std::min(w.n, (hi - first[j]) * grain[j]),
                       jobs[j].y, w.n);
      }
    });
    for (const Job& job : jobs) {
      if (!job.lin->has_bias()) continue;
      const float* bp = job.lin->bias.data_ptr<float>();
      const int64_t n = job.lin->w.n;
      for (int64_t r = 0; r < m; ++r) add_scaled(job.y + r * n, bp, n, 1.0f);
    }
    matmul_ns_ += since(t0);
  }

  // Rotary positions, rotate-half layout: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
  void rotate(float* x, int64_t r0, int64_t r1, int64_t heads, const std::vector<float>& cs,
              const std::vector<float>& sn) const {
    const int64_t half = head_dim_ / 2;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t hh = 0; hh < heads; ++hh) {
        float* p = x + (r * heads + hh) * head_dim_;
        const float* c = cs.data() + r * half;
        const float* s = sn.data() + r * half;
        for (int64_t i = 0; i < half; i += 16) {
          const int64_t n = std::min<int64_t>(16, half - i);
          const F16 x1 = part(p, i, n), x2 = part(p + half, i, n), ci = part(c, i, n), si = part(s, i, n);
          simd::put(x1 * ci - x2 * si, p, i, n);
          simd::put(x2 * ci + x1 * si, p + half, i, n);
        }
      }
  }

  // Row r of every query head against positions 0..pos[r] of its key head in its block's cache
  // (kb[block[r]], vb[block[r]], capacity caps[block[r]]); all blocks' rows in one parallel region.
  // A block of at least kSharedRows rows (a prompt read) goes in tasks of one key head and a run
  // of kRun rows with the query heads that read it, sharing their key and value loads
  // (attend_rows_shared). A verify's block (2 to kSharedRows - 1 rows) goes in tasks of one key
  // head and a run of its rows as long as that makes enough tasks (verify_run): the cache of a
  // model larger than the last cache then streams from memory once per key head, not once per
  // row. One-row blocks (a decode step), and verifies of models with too few key heads, go in
  // tasks of one row and key head (its query heads sharing the loads) or of one row and query
  // head (see by_key_head). Every way, each row and head gets attend_row's arithmetic, bit for bit.
  static constexpr int64_t kSharedRows = 16, kRun = 4;

  // Rows per task for a verify's block of n rows: the whole block, halved until the key heads
  // make 4 tasks a thread; 0 (not by runs) for one row, or when runs of 2 still make fewer than
  // 2 tasks a thread.
  int64_t verify_run(int64_t n, int64_t threads) const {
    if (n < 2) return 0;
    int64_t run = n;
    while (run > 2 && kv_heads_ * ((n + run - 1) / run) < 4 * threads) run = (run + 1) / 2;
    return kv_heads_ * ((n + run - 1) / run) >= 2 * threads ? run : 0;
  }

  template <typename KV>
  void attend(const float* q, const std::vector<KV*>& kb, const std::vector<KV*>& vb,
              const std::vector<int64_t>& caps, const std::vector<int64_t>& block, const std::vector<int64_t>& pos,
              float* out) {
    const auto t0 = Clock::now();
    const int64_t group = heads_ / kv_heads_, T = int64_t(block.size());
    struct Task {
      int64_t r0, rows, head;  // rows r0..r0+rows-1 of one block; head: a query head, or -1 for
                               // every query head of key head `key`
      int64_t key;
      bool stream;  // a verify's run: its cache streams from memory (attend_rows_shared)
    };
    std::vector<Task> tasks;
    // Rows that go one per task (steps, and verifies not in runs) go with the query heads of
    // their key head when that still makes two tasks a thread; else one task per query head
    // (one row of a 3-key-head model would leave a thread idle for a third of the time).
    // each block's rows r..end-1, and its rows per task in runs (0: one row per task)
    std::vector<std::tuple<int64_t, int64_t, int64_t>> blocks;
    const int64_t threads = at::get_num_threads();
    int64_t step_rows = 0;  // rows that go one per task
    for (int64_t r = 0, end; r < T; r = end) {
      for (end = r; end < T && block[end] == block[r];) ++end;
      const int64_t run = end - r >= kSharedRows ? kRun : verify_run(end - r, threads);
      blocks.emplace_back(r, end, run);
      if (run == 0) step_rows += end - r;
    }
    const bool by_key_head = group > 1 && step_rows * kv_heads_ >= 2 * threads;
    for (const auto& [r, end, run] : blocks) {
      if (run > 0) {
        for (int64_t g = 0; g < kv_heads_; ++g)
          for (int64_t a = r; a < end; a += run)
            tasks.push_back({a, std::min(run, end - a), -1, g, end - r < kSharedRows});
      } else if (by_key_head) {  // one row with the query heads of one key head
        for (int64_t g = 0; g < kv_heads_; ++g)
          for (int64_t a = r; a < end; ++a) tasks.push_back({a, 1, -1, g, false});
      } else {
        for (int64_t hh = 0; hh < heads_; ++hh)
          for (int64_t a = r; a < end; ++a) tasks.push_back({a, 1, hh, hh / group, false});
      }
    }
    std::vector<int64_t> cost(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i)  // keys read, times the query rows reading them
      cost[i] = (pos[tasks[i].r0 + tasks[i].rows - 1] + 1) * tasks[i].rows * (tasks[i].head >= 0 ? 1 : group);
    run_dearest_first<SharedRowsScratch>(cost, [&](SharedRowsScratch& w, int64_t i) {
      const Task& t = tasks[i];
      const int64_t s = block[t.r0], cap = caps[s], g = t.key;
      const KV* kg = kb[s] + g * cap * head_dim_;
      const KV* vg = vb[s] + g * cap * head_dim_;
      if (t.head >= 0) {
        attend_row(q + (t.r0 * heads_ + t.head) * head_dim_, kg, vg, head_dim_, head_dim_, 0, pos[t.r0], head_dim_,
                   scale_, 0.0f, out + (t.r0 * heads_ + t.head) * head_dim_, w.s);
        return;
      }
      w.qs.clear(), w.outs.clear(), w.his.clear();
      for (int64_t r = t.r0; r < t.r0 + t.rows; ++r)
        for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
          w.qs.push_back(q + (r * heads_ + hh) * head_dim_);
          w.outs.push_back(out + (r * heads_ + hh) * head_dim_);
          w.his.push_back(pos[r]);
        }
      attend_rows_shared(w.qs.data(), w.his.data(), int(w.qs.size()), kg, vg, head_dim_, head_dim_, head_dim_,
                         scale_, w.outs.data(), w.s, t.stream);
    });
    attend_ns_ += since(t0);
  }
};

}  // namespace rs

TORCH_LIBRARY_FRAGMENT(ragspec, m) {
  m.class_<rs::StepModel>("StepModel")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<double>>())
      .def("forward", &rs::StepModel::forward)
      .def("forward_many", &rs::StepModel::forward_many)
      .def("stats", &rs::StepModel::stats)
      .def("reset_stats", &rs::StepModel::reset_stats);
}
