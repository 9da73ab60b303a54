// CPU harness for mixer-cuda/kernels/attention_backward_fused.cu: the kernel file compiled as C++,
// each CUDA thread of a block a std::thread (blocks one after another), with the warp-level PTX the
// kernels use emulated from the PTX ISA's fragment layouts (ldmatrix .x4 with and without .trans,
// mma.sync m16n8k16 bf16 and m16n8k8 tf32, shuffles, barriers; cp.async as an immediate copy). It
// runs atc_delta, atc_dkdv and atc_dq on statistics computed here (m_t, log2 ℓ_t of the softmax in
// the kernels' log2 domain) and compares d_q, d_k, d_v with a double-precision reference
// (dS = P (dy·v − D), dv = Pᵀ dy, dk = σ dSᵀ q, dq = σ dS k on the same rounded inputs), relative
// RMS within 2e-2 (bf16) and 5e-3 (tf32); T ∈ {1, 63, 64, 65, 130}, windows none, 1 and 20. It exits
// non-zero on a failure; with two arguments T and window it runs that one case (B = 1, H = 1). Run from
// the repository root, once per head dim and tile:
//
//   for c in "32 64" "64 64" "96 32" "128 32"; do set -- $c; g++ -std=c++20 -O2 -pthread \
//     -DATC_D=$1 -DATC_BN=$2 -DATC_WARPS=8 bench/gpu/attention_backward_harness.cpp -o /tmp/atc_h && /tmp/atc_h || break; done
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(n)
#define __align__(n)
#define __shared__

struct Dim3 {
    int x, y, z;
};
static thread_local Dim3 threadIdx, blockIdx;
static Dim3 gridDim, blockDim;
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __fmul_rn(float a, float b) { return a * b; }
using std::fmaf;
using std::fminf;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// One block's threads and shared memory.
alignas(128) unsigned char atc_smem[1 << 18];
static std::barrier<>* block_bar;
static std::vector<std::barrier<>*> warp_bar;
static unsigned xch[8][32][8];  // per warp, per lane: exchanged words
static int warp_of() { return threadIdx.x >> 5; }
static int lane_of() { return threadIdx.x & 31; }
inline void __syncthreads() { block_bar->arrive_and_wait(); }
static void warp_sync() { warp_bar[warp_of()]->arrive_and_wait(); }
template <typename T>
T __shfl_xor_sync(unsigned, T v, int o) {
    static_assert(sizeof(T) == 4);
    std::memcpy(&xch[warp_of()][lane_of()][0], &v, 4);
    warp_sync();
    T r;
    std::memcpy(&r, &xch[warp_of()][lane_of() ^ o][0], 4);
    warp_sync();
    return r;
}

// Shared-window addresses are offsets into atc_smem.
inline unsigned smem_u32(const void* p) { return (unsigned)((const unsigned char*)p - atc_smem); }
inline void cp_async16(unsigned dst, const void* src, int bytes) {
    std::memset(atc_smem + dst, 0, 16);
    if (bytes) std::memcpy(atc_smem + dst, src, bytes);
}
inline void cp_commit() {}
template <int N>
inline void cp_wait() {}
inline float fast_exp2(float x) { return std::exp2(x); }

typedef unsigned short mx_bf16;
inline float mx_bf16_f32(mx_bf16 b) { return __uint_as_float((unsigned)b << 16); }
static mx_bf16 bf16_rne(float x) {
    unsigned u = __float_as_uint(x);
    return (mx_bf16)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
inline unsigned mx_pack_bf16(float lo, float hi) { return bf16_rne(lo) | ((unsigned)bf16_rne(hi) << 16); }
inline unsigned mx_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }  // nearest, ties away

// ldmatrix .x4: lanes 8i .. 8i + 7 give matrix i's row addresses; register i of lane l holds row
// l / 4, entries 2(l % 4), 2(l % 4) + 1 (trans: entries (2(l % 4), l / 4) and (2(l % 4) + 1, l / 4)).
static void ldsm(unsigned (&r)[4], unsigned addr, bool trans) {
    const int w = warp_of(), l = lane_of();
    xch[w][l][0] = addr;
    warp_sync();
    auto at = [&](int lane, int col) {
        mx_bf16 v;
        std::memcpy(&v, atc_smem + xch[w][lane][0] + 2 * col, 2);
        return (unsigned)v;
    };
    for (int i = 0; i < 4; ++i) {
        if (!trans) r[i] = at(8 * i + l / 4, 2 * (l % 4)) | (at(8 * i + l / 4, 2 * (l % 4) + 1) << 16);
        else r[i] = at(8 * i + 2 * (l % 4), l / 4) | (at(8 * i + 2 * (l % 4) + 1, l / 4) << 16);
    }
    warp_sync();
}
inline void mx_ldsm_x4(unsigned (&r)[4], unsigned addr) { ldsm(r, addr, false); }
inline void mx_ldsm_x4_t(unsigned (&r)[4], unsigned addr) { ldsm(r, addr, true); }

// mma.sync m16n8k16 (bf16) / m16n8k8 (tf32), f32 accumulators, from every lane's fragments
// (g = lane / 4, i = lane % 4). bf16: a = A[g][2i..2i+1], A[g+8][2i..], A[g][2i+8..], A[g+8][2i+8..];
// b = B[2i..2i+1][g], B[2i+8..2i+9][g]. tf32: a = A[g][i], A[g+8][i], A[g][i+4], A[g+8][i+4];
// b = B[i][g], B[i+4][g] (the top 19 bits of each word). c = C[g][2i], C[g][2i+1], C[g+8][2i], C[g+8][2i+1].
static void emu_mma(bool bf16, float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                    unsigned b1) {
    const int w = warp_of(), l = lane_of();
    unsigned* x = xch[w][l];
    x[0] = a0, x[1] = a1, x[2] = a2, x[3] = a3, x[4] = b0, x[5] = b1;
    warp_sync();
    const int K = bf16 ? 16 : 8;
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, i = lane % 4;
        const unsigned* f = xch[w][lane];
        if (bf16) {
            auto lo = [](unsigned u) { return (double)mx_bf16_f32(u & 0xffff); };
            auto hi = [](unsigned u) { return (double)mx_bf16_f32(u >> 16); };
            A[g][2 * i] = lo(f[0]), A[g][2 * i + 1] = hi(f[0]);
            A[g + 8][2 * i] = lo(f[1]), A[g + 8][2 * i + 1] = hi(f[1]);
            A[g][2 * i + 8] = lo(f[2]), A[g][2 * i + 9] = hi(f[2]);
            A[g + 8][2 * i + 8] = lo(f[3]), A[g + 8][2 * i + 9] = hi(f[3]);
            B[2 * i][g] = lo(f[4]), B[2 * i + 1][g] = hi(f[4]);
            B[2 * i + 8][g] = lo(f[5]), B[2 * i + 9][g] = hi(f[5]);
        } else {
            auto t = [](unsigned u) { return (double)__uint_as_float(u & 0xffffe000u); };
            A[g][i] = t(f[0]), A[g + 8][i] = t(f[1]), A[g][i + 4] = t(f[2]), A[g + 8][i + 4] = t(f[3]);
            B[i][g] = t(f[4]), B[i + 4][g] = t(f[5]);
        }
    }
    warp_sync();
    const int g = l / 4, i = l % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * i, 2 * i + 1, 2 * i, 2 * i + 1};
    for (int e = 0; e < 4; ++e) {
        double s = c[e];
        for (int k = 0; k < K; ++k) s += A[rows[e]][k] * B[k][cols[e]];
        c[e] = (float)s;
    }
}
#define MX_MMA_SYNC(ASM, SHAPE, c, a0, a1, a2, a3, b0, b1) \
    emu_mma(std::strstr(SHAPE, "bf16") != nullptr, c, a0, a1, a2, a3, b0, b1)

#include "../../mixer-cuda/kernels/attention_backward_fused.cu"

// Runs `kernel` over the grid, `threads` per block.
static void launch(int gx, int gy, int threads, const std::function<void()>& kernel) {
    gridDim = {gx, gy, 1};
    blockDim = {threads, 1, 1};
    for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            std::memset(atc_smem, 0xff, sizeof atc_smem);  // garbage, as on a device
            std::barrier<> bb(threads);
            block_bar = &bb;
            std::vector<std::barrier<>*> wb;
            for (int w = 0; w < (threads + 31) / 32; ++w) wb.push_back(new std::barrier<>(32));
            warp_bar = wb;
            std::vector<std::thread> ts;
            for (int t = 0; t < threads; ++t)
                ts.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    kernel();
                });
            for (auto& t : ts) t.join();
            for (auto* b : wb) delete b;
        }
}

template <typename E>
static E to_e(float x);
template <>
mx_bf16 to_e<mx_bf16>(float x) { return bf16_rne(x); }
template <>
float to_e<float>(float x) { return x; }
static double of(mx_bf16 x) { return mx_bf16_f32(x); }
static double of(float x) { return x; }

struct Case {
    int B, T, H, window;
};

// One mode: returns the worst relative RMS and prints each.
template <typename E>
static double run_case(const Case& cs, bool bf16, std::mt19937_64& rng) {
    const int B = cs.B, T = cs.T, H = cs.H, D = ATC_D, window = cs.window;
    const long long n = (long long)B * T * H * D, rows = (long long)B * T * H;
    std::normal_distribution<float> N(0.f, 1.f);
    std::vector<E> q(n), k(n), v(n), dy(n), y(n);
    for (auto* a : {&q, &k, &v, &dy})
        for (auto& e : *a) e = to_e<E>(N(rng));
    const double scale = 1.0 / std::sqrt((double)D), lam = scale / std::log(2.0);
    const float sl2 = (float)lam;
    auto at = [&](int b, int t, int h, int d) { return (((long long)b * T + t) * H + h) * D + d; };
    auto vis = [&](int t, int s) { return s <= t && (window <= 0 || t - s < window); };
    // Reference, in double: P, y, D, dS and the gradients; the statistics in the kernels' form.
    std::vector<float4> stats(rows);
    std::vector<double> gq(n, 0), gk(n, 0), gv(n, 0);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
            std::vector<double> P((size_t)T * T, 0), U((size_t)T * T, 0);
            for (int t = 0; t < T; ++t) {
                double m = -INFINITY;
                for (int s = 0; s <= t; ++s) {
                    double u = 0;
                    for (int d = 0; d < D; ++d) u += of(q[at(b, t, h, d)]) * of(k[at(b, s, h, d)]);
                    U[(size_t)t * T + s] = u;
                    if (vis(t, s)) m = std::max(m, (double)(float)((float)u * sl2));
                }
                double l = 0;
                for (int s = 0; s <= t; ++s)
                    if (vis(t, s)) l += std::exp2(U[(size_t)t * T + s] * lam - m);
                for (int s = 0; s <= t; ++s)
                    if (vis(t, s)) P[(size_t)t * T + s] = std::exp2(U[(size_t)t * T + s] * lam - m) / l;
                stats[((long long)b * H + h) * T + t] = make_float4((float)m, (float)std::log2(l), 0.f, 0.f);
                // y as the forward's tensor-core kernel forms it: in tf32, the unnormalised weights
                // rounded to tf32 and v truncated to tf32 by the tensor core; in bf16, the weights
                // rounded to bf16 (v is bf16).
                for (int d = 0; d < D; ++d) {
                    double acc = 0;
                    for (int s = 0; s <= t; ++s) {
                        if (!vis(t, s)) continue;
                        const float w = (float)std::exp2(U[(size_t)t * T + s] * lam - m);
                        const double wr = bf16 ? mx_bf16_f32(bf16_rne(w)) : __uint_as_float(mx_tf32(w));
                        const float vv = (float)of(v[at(b, s, h, d)]);
                        acc += wr * (bf16 ? vv : __uint_as_float(__float_as_uint(vv) & 0xffffe000u));
                    }
                    y[at(b, t, h, d)] = to_e<E>((float)(acc / l));
                }
            }
            for (int t = 0; t < T; ++t) {
                double Dt = 0;
                for (int d = 0; d < D; ++d) Dt += of(dy[at(b, t, h, d)]) * of(y[at(b, t, h, d)]);
                for (int s = 0; s <= t; ++s) {
                    const double p = P[(size_t)t * T + s];
                    if (p == 0) continue;
                    double dp = 0;
                    for (int d = 0; d < D; ++d) dp += of(dy[at(b, t, h, d)]) * of(v[at(b, s, h, d)]);
                    const double ds = p * (dp - Dt);
                    for (int d = 0; d < D; ++d) {
                        gv[at(b, s, h, d)] += p * of(dy[at(b, t, h, d)]);
                        gk[at(b, s, h, d)] += scale * ds * of(q[at(b, t, h, d)]);
                        gq[at(b, t, h, d)] += scale * ds * of(k[at(b, s, h, d)]);
                    }
                }
            }
        }
    std::vector<float> dq(n, NAN), dk(n, NAN), dv(n, NAN);
    float* sp = &stats[0].x;
    launch((int)((rows + 7) / 8), 1, 256, [&] {
        if constexpr (sizeof(E) == 2) atc_delta_bf16(y.data(), dy.data(), sp, T, H, rows);
        else atc_delta_tf32(y.data(), dy.data(), sp, T, H, rows);
    });
    const int tiles = (T + ATC_BM - 1) / ATC_BM;
    launch(tiles, B * H, ATC_THREADS, [&] {
        if constexpr (sizeof(E) == 2)
            atc_dkdv_bf16(q.data(), k.data(), v.data(), dy.data(), stats.data(), dk.data(), dv.data(), T, H, window,
                          sl2, (float)scale, nullptr);
        else
            atc_dkdv_tf32(q.data(), k.data(), v.data(), dy.data(), stats.data(), dk.data(), dv.data(), T, H, window,
                          sl2, (float)scale, nullptr);
    });
    launch(tiles, B * H, ATC_THREADS, [&] {
        if constexpr (sizeof(E) == 2)
            atc_dq_bf16(q.data(), k.data(), v.data(), dy.data(), stats.data(), dq.data(), T, H, window, sl2,
                        (float)scale, nullptr);
        else
            atc_dq_tf32(q.data(), k.data(), v.data(), dy.data(), stats.data(), dq.data(), T, H, window, sl2,
                        (float)scale, nullptr);
    });
    double worst = 0;
    const char* names[3] = {"d_q", "d_k", "d_v"};
    const std::vector<float>* got[3] = {&dq, &dk, &dv};
    const std::vector<double>* want[3] = {&gq, &gk, &gv};
    for (int g = 0; g < 3; ++g) {
        double e2 = 0, w2 = 0;
        for (long long i = 0; i < n; ++i) {
            const double d = (*got[g])[i] - (*want[g])[i];
            e2 += std::isfinite((*got[g])[i]) ? d * d : INFINITY;
            w2 += (*want[g])[i] * (*want[g])[i];
        }
        // d_q, d_k cancel to 0 at a window of 1 (and at T = 1): relative to the size of their summands
        // σ·(dy·v)·(k or q) then, dy·v a dot product of D terms of size √D (entries of size 1), the
        // floor of mixer-cuda/tests/all/backward.rs's tensor-core test.
        const double floor = scale * std::sqrt((double)D) * std::sqrt((double)n);
        const double rel = std::sqrt(e2) / std::max(std::sqrt(w2), g < 2 ? floor : 1e-300);
        worst = std::max(worst, rel);
        std::printf("D=%d BN=%d %s B=%d T=%d H=%d window=%d %s rel_rms=%.3e\n", D, ATC_BN, bf16 ? "bf16" : "tf32", B,
                    T, H, window, names[g], rel);
    }
    return worst;
}

int main(int argc, char** argv) {
    std::mt19937_64 rng(7);
    int fails = 0;
    std::vector<Case> cases = {Case{1, 1, 2, 0},  Case{2, 63, 1, 20},  Case{1, 64, 2, 1},
                               Case{1, 65, 1, 0}, Case{1, 130, 2, 20}, Case{1, 130, 1, 0}};
    if (argc == 3) cases = {Case{1, std::atoi(argv[1]), 1, std::atoi(argv[2])}};  // one case: T, window
    for (Case cs : cases) {
        if (run_case<mx_bf16>(cs, true, rng) > 2e-2) ++fails;
        if (run_case<float>(cs, false, rng) > 5e-3) ++fails;
    }
    std::printf(fails ? "FAILED: %d cases\n" : "all passed\n", fails);
    return fails ? 1 : 0;
}
