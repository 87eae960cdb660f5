// The machine's issue rate of the instruction the tiled kernels spend their time in: `vpdpbusd`
// on 512-bit registers with a broadcast 4-byte memory operand (the form tiled.h's dot4 emits),
// 16 independent accumulators per thread, on 1 and on 2 threads. It bounds what any product of
// int8 activations with 4-bit or 8-bit weights can reach here: one instruction is 64 multiply-
// adds, so a forward of k rows over M weights needs at least k * M / 64 of them.
//
//     g++ -O2 -march=native -pthread benchmarks/vnni_rate.cpp -o /tmp/vnni_rate && /tmp/vnni_rate
//
// Prints, per thread count, instructions a second in all and the int8 operations a second
// (2 per multiply-add). Needs a CPU with AVX-512 VNNI.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

static double rate(int64_t iters) {
  alignas(64) int32_t x[16] = {1};
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
          a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  const __m512i w = _mm512_set1_epi8(3);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
#define DOT(a, o) asm volatile("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(a) : "v"(w), "m"(x[o]));
    DOT(a0, 0) DOT(a1, 1) DOT(a2, 2) DOT(a3, 3) DOT(a4, 4) DOT(a5, 5) DOT(a6, 6) DOT(a7, 7)
    DOT(a8, 8) DOT(a9, 9) DOT(a10, 10) DOT(a11, 11) DOT(a12, 12) DOT(a13, 13) DOT(a14, 14) DOT(a15, 15)
#undef DOT
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m512i s = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
  s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
  s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
  s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a12, a13), _mm512_add_epi32(a14, a15)));
  volatile int sink = _mm512_reduce_add_epi32(s);
  (void)sink;
  return 16.0 * double(iters) / seconds;
}

int main() {
  const int64_t iters = 100000000;
  for (int threads : {1, 2}) {
    std::vector<double> per(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&per, t, iters] { per[t] = rate(iters); });
    for (auto& t : pool) t.join();
    double total = 0;
    for (double r : per) total += r;
    std::printf("threads %d: %.2f G vpdpbusd/s (%.0f G int8 operations/s)\n", threads, total / 1e9,
                total * 64 * 2 / 1e9);
  }
}
