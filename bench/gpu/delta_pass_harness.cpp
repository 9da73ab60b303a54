// CPU harness of gated DeltaNet's register pass over chunks on tensor cores
// (kernels/loglinear_state_pass.cu): the forward pass llc_delta_h_rg_f32 and the backward's
// reverse pass llc_delta_h_rg_rev_f32 (the same body run from the last chunk with W and K
// exchanged), with mma.sync and the shuffles emulated per warp (bench/gpu/cpu_cuda.h), against the
// two recurrences in f64 written out here as plain loops (docs/math.md §2.7):
//   forward, per chunk j:  Hs_j = S, U' = U − W S, S ← e^{a_j} S + Kᵀ diag(τ) U';
//   reverse, from the last: dU' = A + diag(τ) K X, Xs_j = X (B_j read there first),
//                           X ← e^{a_j} X + B_j − Wᵀ dU';
// with τ_s = e^{a_j − γ_s}, S and X Dk × Dv, S_0 and S̄_T given as [BH][Dv][Dk]. Sizes off the
// tiles: a partial last chunk, Dk = 70 (DKP = 80) next to 64 and 128, Dv not a multiple of the
// block's columns. W arrives tf32-rounded as the WY step writes it. Run from the repository root
// (DKP = 64, 80 or 128; the kernel's key tiles are fixed at compile time):
//   for d in 64 80 128; do
//     sed -e 's/extern __shared__ unsigned char llc_dyn\[\];/unsigned char* llc_dyn = g_dyn;/' \
//         -e 's/asm volatile(.*);/;/' mixer-cuda/kernels/loglinear_state_pass.cu > /tmp/llc_pass.cu &&
//     sed -e 's/void llc_cp_async\(16\)*(/void llc_cp_async\1_device(/' \
//         mixer-cuda/kernels/loglinear_common.cuh > /tmp/llc_common.cuh &&
//     g++ -std=c++20 -O2 -pthread -DDH_DKP=$d -I/tmp bench/gpu/delta_pass_harness.cpp -o /tmp/dp_harness &&
//     /tmp/dp_harness || break; done
// It exits non-zero on a failure.
#define LLC_COMMON_SED
#define DHR_WARPS 2
#define DHR_ST 3
#include "cpu_cuda.h"
#include "llc_pass.cu"

#include <cstdlib>

struct Case {
    int B, Tn, H, Dk, Dv;
};

static double rel_rms(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

static void run(const Case& c) {
    const int CH = 64, nc = (c.Tn + CH - 1) / CH, bh = c.B * c.H;
    const size_t nk = (size_t)c.B * c.Tn * c.H * c.Dk, nv = (size_t)c.B * c.Tn * c.H * c.Dv, dd = (size_t)c.Dk * c.Dv;
    std::vector<float> k(nk), W(nk), U(nv), g((size_t)c.B * c.Tn * c.H), Bs(bh * nc * dd), S0(bh * dd);
    std::mt19937 rng(11 + c.Tn + c.Dk);
    std::uniform_real_distribution<float> R(-1.f, 1.f);
    const float ks = 1.f / std::sqrt((float)c.Dk);
    for (auto& x : k) x = ks * R(rng);
    for (auto& x : W) x = __uint_as_float(mx_tf32(ks * R(rng)));
    for (auto& x : U) x = R(rng);
    for (auto& x : g) x = -0.05f * (1.f + R(rng));
    for (auto& x : Bs) x = R(rng);
    for (auto& x : S0) x = R(rng);
    auto row = [&](int b, int t, int h) { return ((size_t)b * c.Tn + t) * c.H + h; };
    const int smem = DHR_ST * CH * (((DH_DKP + 31) / 32 * 32 + 8) + ((DH_DKP + 31) / 32 * 32 + 4) + 16 * DHR_WARPS + 4 + 1) * 4;
    if (smem > (int)sizeof(g_dyn)) {
        std::printf("shared memory %d over the harness's window\n", smem);
        std::exit(2);
    }
    const int gy = (c.Dv + 16 * DHR_WARPS - 1) / (16 * DHR_WARPS), nt = 32 * DHR_WARPS;
    for (int rev = 0; rev < 2; ++rev) {
        // The reference in f64.
        std::vector<double> vn(nv, 0.0), hs(bh * nc * dd, 0.0), fin(bh * dd, 0.0);
        for (int b = 0; b < c.B; ++b)
            for (int h = 0; h < c.H; ++h) {
                const int q = b * c.H + h;
                std::vector<double> S(dd);
                for (int kc = 0; kc < c.Dk; ++kc)
                    for (int d = 0; d < c.Dv; ++d) S[(size_t)kc * c.Dv + d] = S0[q * dd + (size_t)d * c.Dk + kc];
                for (int step = 0; step < nc; ++step) {
                    const int j = rev ? nc - 1 - step : step, i0 = j * CH, n = std::min(CH, c.Tn - i0);
                    std::vector<double> gam(n);
                    double acc = 0;
                    for (int s = 0; s < n; ++s) gam[s] = acc += g[row(b, i0 + s, h)];
                    const double a = gam[n - 1];
                    std::vector<double> N((size_t)n * c.Dv);
                    for (int s = 0; s < n; ++s) {
                        const size_t r = row(b, i0 + s, h);
                        const double tau = std::exp(a - gam[s]);
                        for (int d = 0; d < c.Dv; ++d) {
                            double p = 0;
                            for (int kc = 0; kc < c.Dk; ++kc)
                                p += (double)(rev ? k : W)[r * c.Dk + kc] * S[(size_t)kc * c.Dv + d];
                            const double x = rev ? U[r * c.Dv + d] + tau * p : U[r * c.Dv + d] - p;
                            vn[r * c.Dv + d] = x;
                            N[(size_t)s * c.Dv + d] = rev ? x : tau * x;
                        }
                    }
                    double* hj = &hs[((size_t)q * nc + j) * dd];
                    for (size_t e = 0; e < dd; ++e) hj[e] = S[e];
                    for (int kc = 0; kc < c.Dk; ++kc)
                        for (int d = 0; d < c.Dv; ++d) {
                            double p = 0;
                            for (int s = 0; s < n; ++s)
                                p += (double)(rev ? W : k)[row(b, i0 + s, h) * c.Dk + kc] * N[(size_t)s * c.Dv + d];
                            const size_t e = (size_t)kc * c.Dv + d;
                            S[e] = rev ? std::exp(a) * S[e] + Bs[((size_t)q * nc + j) * dd + e] - p
                                       : std::exp(a) * S[e] + p;
                        }
                }
                for (int kc = 0; kc < c.Dk; ++kc)
                    for (int d = 0; d < c.Dv; ++d) fin[q * dd + (size_t)d * c.Dk + kc] = S[(size_t)kc * c.Dv + d];
            }
        // The kernel.
        std::vector<float> Vn(nv, 0.f), Hs = rev ? Bs : std::vector<float>(bh * nc * dd, 0.f), ST(bh * dd, 0.f);
        if (rev)
            launch(bh, gy, 1, [&] {
                llc_delta_h_rg_rev_f32(k.data(), g.data(), W.data(), U.data(), Vn.data(), Hs.data(), c.Tn, c.H, c.Dk,
                                       c.Dv, nc, S0.data(), 1, ST.data(), 1);
            }, nt);
        else
            launch(bh, gy, 1, [&] {
                llc_delta_h_rg_f32(k.data(), g.data(), 1, W.data(), U.data(), Vn.data(), Hs.data(), c.Tn, c.H, c.Dk,
                                   c.Dv, nc, S0.data(), 1, ST.data(), 1, nullptr, 0);
            }, nt);
        char what[160];
        const char* names[3] = {rev ? "dU'" : "U'", rev ? "X per chunk" : "S per chunk", rev ? "S̄_0" : "S_T"};
        const std::vector<float>* got[3] = {&Vn, &Hs, &ST};
        const std::vector<double>* want[3] = {&vn, &hs, &fin};
        for (int i = 0; i < 3; ++i) {
            std::snprintf(what, sizeof what, "%s %s B%d T%d H%d Dk%d Dv%d", rev ? "reverse" : "forward", names[i], c.B,
                          c.Tn, c.H, c.Dk, c.Dv);
            check(what, rel_rms(*got[i], *want[i]), 2e-3);
        }
    }
}

int main() {
    const int dk = DH_DKP == 80 ? 70 : DH_DKP;
    run({1, 200, 2, dk, 40});
    run({2, 64, 1, dk, 16});
    run({1, 131, 1, dk, 70});
    return harness_end();
}
