// CPU harness of the bf16 mode's output kernel (kernels/loglinear_output.cu), with the tensor cores
// and ldmatrix emulated per warp (bench/gpu/cpu_cuda.h): llc_out_direct_tc_hb (the entering states
// stored in bf16, copied as they are) against llc_out_direct_tc_bf16 (f32 states rounded to bf16
// as they are staged) — the same y bit for bit — and both against y in f64 on the bf16 values
// (within the scores' rounding to bf16), at Dk ≤ 64 and ≤ 128, with and without the first chunk's
// state (read0), a partial chunk and value dims off the tile; and the tf32 mode's
// llc_out_direct_tc_f32 against y in f64. Run from the repository root:
//   sed -e 's/extern __shared__ \(__align__(16) \)*unsigned char \([a-z_]*\)\[\];/unsigned char* \2 = g_dyn;/' \
//       -e 's/asm volatile(.*);/;/' mixer-cuda/kernels/loglinear_output.cu > /tmp/llc_out.cu &&
//   sed -e 's/void llc_cp_async\(16\)*(/void llc_cp_async\1_device(/' \
//       mixer-cuda/kernels/loglinear_common.cuh > /tmp/llc_common.cuh &&
//   g++ -std=c++20 -O2 -pthread -I/tmp bench/gpu/out_harness.cpp -o /tmp/out_harness && /tmp/out_harness
// It exits non-zero on a failure.
#define LLC_COMMON_SED
#include "cpu_cuda.h"
#include "llc_out.cu"

#include <cstring>

// The relative RMS of the output kernel's y against y in f64 on the same values (q, k, v, y and
// the entering states F [H][NC][Dk][Dv] as stored: f32 or bf16, widened by llc_f; B = 1):
//   y_r = σ e^{γ_r} q_r·F_i (chunk 0 only with read0) + Σ_{s ≤ r} σ e^{γ_r − γ_s} (q_r·k_s) v_s.
template <typename T, typename S>
static double rms_vs_f64(const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                         const std::vector<S>& F, const std::vector<float>& g, const std::vector<T>& y, int Tn,
                         int H, int Dk, int Dv, double scale, int read0) {
    const int CH = 64, nc = (Tn + CH - 1) / CH;
    auto f = [](auto x) { return (double)llc_f(x); };
    double num = 0, den = 0;
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < nc; ++i) {
            const int i0 = i * CH, n = std::min(CH, Tn - i0);
            std::vector<double> gam(n);
            double acc = 0;
            for (int r = 0; r < n; ++r) gam[r] = acc += g[(size_t)(i0 + r) * H + h];
            for (int r = 0; r < n; ++r) {
                const size_t rr = (size_t)(i0 + r) * H + h;
                for (int d = 0; d < Dv; ++d) {
                    double want = 0;
                    if (i > 0 || read0)
                        for (int c = 0; c < Dk; ++c)
                            want += scale * std::exp(gam[r]) * f(q[rr * Dk + c]) *
                                    f(F[(((size_t)h * nc + i) * Dk + c) * Dv + d]);
                    for (int s = 0; s <= r; ++s) {
                        const size_t ss = (size_t)(i0 + s) * H + h;
                        double qk = 0;
                        for (int c = 0; c < Dk; ++c) qk += f(q[rr * Dk + c]) * f(k[ss * Dk + c]);
                        want += scale * std::exp(gam[r] - gam[s]) * qk * f(v[ss * Dv + d]);
                    }
                    const double e = f(y[rr * Dv + d]) - want;
                    num += e * e, den += want * want;
                }
            }
        }
    return std::sqrt(num / den);
}

static void run(int Tn, int H, int Dk, int Dv, int read0) {
    const int nc = (Tn + 63) / 64, bh = H;
    const double scale = 0.7;
    std::mt19937 rng(11 + Tn + Dk + Dv);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    auto bf = [&](size_t n) {
        std::vector<mx_bf16> x(n);
        for (auto& e : x) e = mx_f32_bf16(U(rng));
        return x;
    };
    const auto q = bf((size_t)Tn * H * Dk), k = bf((size_t)Tn * H * Dk), v = bf((size_t)Tn * H * Dv);
    std::vector<float> g((size_t)Tn * H), F((size_t)bh * nc * Dk * Dv);
    for (auto& e : g) e = -0.1f * (1.f + U(rng));
    for (auto& e : F) e = 3.f * U(rng);
    std::vector<mx_bf16> Fb(F.size());
    for (size_t i = 0; i < F.size(); ++i) Fb[i] = mx_f32_bf16(F[i]);
    std::vector<mx_bf16> y1((size_t)Tn * H * Dv, 0xffffu), y2 = y1;
    auto f32run = Dk > 64 ? llc_out_direct_tc_bf16_k128 : llc_out_direct_tc_bf16;
    auto hbrun = Dk > 64 ? llc_out_direct_tc_hb_k128 : llc_out_direct_tc_hb;
    const int tiles = (Dv + 63) / 64;
    launch(nc, bh, tiles, [&] {
        f32run(q.data(), k.data(), v.data(), g.data(), 1, F.data(), y1.data(), Tn, H, Dk, Dv, nc, scale, read0, nullptr, 0);
    }, 128);
    launch(nc, bh, tiles, [&] {
        hbrun(q.data(), k.data(), v.data(), g.data(), 1, Fb.data(), y2.data(), Tn, H, Dk, Dv, nc, scale, read0, nullptr, 0);
    }, 128);
    char what[160];
    size_t bad = 0;
    for (size_t i = 0; i < y1.size(); ++i) bad += y1[i] != y2[i];
    std::snprintf(what, sizeof what, "llc_out_direct_tc_hb%s = _bf16 T%d H%d Dk%d Dv%d read0 %d (entries differing)",
                  Dk > 64 ? "_k128" : "", Tn, H, Dk, Dv, read0);
    check(what, (double)bad, 0);
    // y in f64 on the bf16 values (the state rounded to bf16, the scores not).
    const double rms = rms_vs_f64(q, k, v, Fb, g, y2, Tn, H, Dk, Dv, scale, read0);
    std::snprintf(what, sizeof what, "llc_out_direct_tc_hb%s vs f64 T%d H%d Dk%d Dv%d read0 %d (relative RMS)",
                  Dk > 64 ? "_k128" : "", Tn, H, Dk, Dv, read0);
    check(what, rms, 1e-2);
}

// The tf32 mode's llc_out_direct_tc_f32 (_k128) on f32 values against y in f64 (the operands
// truncated to tf32 by the emulation, as the tensor cores read them).
static void run_f32(int Tn, int H, int Dk, int Dv, int read0) {
    const int nc = (Tn + 63) / 64;
    const double scale = 0.7;
    std::mt19937 rng(5 + Tn + Dk + Dv);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    auto vec = [&](size_t n, float a) {
        std::vector<float> x(n);
        for (auto& e : x) e = a * U(rng);
        return x;
    };
    const auto q = vec((size_t)Tn * H * Dk, 1), k = vec((size_t)Tn * H * Dk, 1), v = vec((size_t)Tn * H * Dv, 1);
    const auto F = vec((size_t)H * nc * Dk * Dv, 3);
    std::vector<float> g = vec((size_t)Tn * H, 0.1f);
    for (auto& e : g) e = -0.1f - std::fabs(e);
    std::vector<float> y((size_t)Tn * H * Dv, NAN);
    auto fn = Dk > 64 ? llc_out_direct_tc_f32_k128 : llc_out_direct_tc_f32;
    launch(nc, H, (Dv + 63) / 64, [&] {
        fn(q.data(), k.data(), v.data(), g.data(), 1, F.data(), y.data(), Tn, H, Dk, Dv, nc, scale, read0, nullptr, 0);
    }, 128);
    const double rms = rms_vs_f64(q, k, v, F, g, y, Tn, H, Dk, Dv, scale, read0);
    char what[160];
    std::snprintf(what, sizeof what, "llc_out_direct_tc_f32%s vs f64 T%d H%d Dk%d Dv%d read0 %d (relative RMS)",
                  Dk > 64 ? "_k128" : "", Tn, H, Dk, Dv, read0);
    check(what, rms, 5e-3);
}

int main() {
    run_f32(150, 2, 40, 70, 1);
    run_f32(100, 1, 100, 40, 0);
    run(150, 2, 40, 70, 0);
    run(150, 2, 40, 70, 1);
    run(100, 1, 100, 40, 1);
    run(64, 1, 128, 64, 0);
    return harness_end();
}
