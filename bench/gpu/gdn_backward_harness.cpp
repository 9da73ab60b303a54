// CPU harness for mixer-cuda/kernels/loglinear_backward_chunked.cu (gated DeltaNet's chunked
// backward): the kernel file compiled as plain C++, each block run as 256 std::threads with
// barriers for __syncthreads and per-warp exchanges for the shuffles, against an independent
// reference, the token-by-token reverse recurrence of the delta rule (docs/math.md §2.7's
// recurrent form: per state row, ŝ = a s, u = v_i − ŝ·k, s = ŝ + β u k, y_i = σ s·q, reversed),
// and central finite differences of the token-by-token forward for a few entries. W, U and T⁻¹
// (llc_wy's outputs) come from plain loops here. No GPU and no CUDA headers. Run from the
// repository root:
//   sed -e 's/extern __shared__ __align__(16) unsigned char lgb_smem\[\];/unsigned char* lgb_smem = g_dyn;/' \
//     -e 's/asm volatile(.*);/;/' mixer-cuda/kernels/loglinear_backward_common.cuh \
//     mixer-cuda/kernels/loglinear_backward_chunked.cu > /tmp/lgb.cu &&
//   g++ -std=c++20 -O1 -pthread -I/tmp bench/gpu/gdn_backward_harness.cpp -o /tmp/gdn_harness && /tmp/gdn_harness
// It exits non-zero on a failure.
#include "cpu_cuda.h"
#include "lgb.cu"
#include "gdn_case.h"

// The token-by-token forward in f64: y [B,T,H,Dv].
template <typename T> std::vector<double> forward(const Case<T>& c) {
    std::vector<double> y((size_t)c.B * c.Tn * c.H * c.Dv);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
            for (int i = 0; i < c.Dv; ++i) {
                std::vector<double> s(c.Dk, 0.0);
                for (int t = 0; t < c.Tn; ++t) {
                    const ll r = c.row(b, t, h);
                    const double a = exp((double)c.g[r]), bt = c.beta[r];
                    double p = 0;
                    for (int d = 0; d < c.Dk; ++d) p += a * s[d] * c.k[r * c.Dk + d];
                    const double u = c.v[r * c.Dv + i] - p;
                    double o = 0;
                    for (int d = 0; d < c.Dk; ++d) {
                        s[d] = a * s[d] + bt * u * c.k[r * c.Dk + d];
                        o += s[d] * c.q[r * c.Dk + d];
                    }
                    y[r * c.Dv + i] = c.sigma * o;
                }
            }
    return y;
}

// The reverse recurrence in f64: dq, dk, dv, dβ, dg.
template <typename T> std::vector<std::vector<double>> reference(const Case<T>& c) {
    const size_t nk = (size_t)c.B * c.Tn * c.H * c.Dk, nv = (size_t)c.B * c.Tn * c.H * c.Dv, nt = nv / c.Dv;
    std::vector<std::vector<double>> out{std::vector<double>(nk), std::vector<double>(nk), std::vector<double>(nv),
                                         std::vector<double>(nt), std::vector<double>(nt)};
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
            for (int i = 0; i < c.Dv; ++i) {
                std::vector<std::vector<double>> prev(c.Tn, std::vector<double>(c.Dk));
                std::vector<double> s(c.Dk, 0.0);
                for (int t = 0; t < c.Tn; ++t) {
                    const ll r = c.row(b, t, h);
                    prev[t] = s;
                    const double a = exp((double)c.g[r]), bt = c.beta[r];
                    double p = 0;
                    for (int d = 0; d < c.Dk; ++d) p += a * s[d] * c.k[r * c.Dk + d];
                    const double u = c.v[r * c.Dv + i] - p;
                    for (int d = 0; d < c.Dk; ++d) s[d] = a * s[d] + bt * u * c.k[r * c.Dk + d];
                }
                std::vector<double> ds(c.Dk, 0.0), sh(c.Dk), st(c.Dk);
                for (int t = c.Tn - 1; t >= 0; --t) {
                    const ll r = c.row(b, t, h);
                    const double a = exp((double)c.g[r]), bt = c.beta[r], dyi = c.sigma * c.dy[r * c.Dv + i];
                    double p = 0;
                    for (int d = 0; d < c.Dk; ++d) {
                        sh[d] = a * prev[t][d];
                        p += sh[d] * c.k[r * c.Dk + d];
                    }
                    const double u = c.v[r * c.Dv + i] - p;
                    double cc = 0;
                    for (int d = 0; d < c.Dk; ++d) {
                        st[d] = sh[d] + bt * u * c.k[r * c.Dk + d];
                        out[0][r * c.Dk + d] += dyi * st[d];
                        ds[d] += dyi * c.q[r * c.Dk + d];
                        cc += ds[d] * c.k[r * c.Dk + d];
                    }
                    const double du = bt * cc;
                    out[3][r] += cc * u;
                    out[2][r * c.Dv + i] = du;
                    double gg = 0;
                    for (int d = 0; d < c.Dk; ++d) {
                        out[1][r * c.Dk + d] += bt * u * ds[d] - du * sh[d];
                        const double dsh = ds[d] - du * c.k[r * c.Dk + d];
                        gg += dsh * sh[d];
                        ds[d] = a * dsh;
                    }
                    out[4][r] += gg;
                }
            }
    return out;
}

// The kernels' launches as src/loglinear/backward_chunked.rs makes them (W, U, T⁻¹ by loops).
// With pre (f32): the tf32 and bf16 modes' kernels, the mma emulated: lgb_pre_tc_f32 and, with
// Dv > 32, the state products (lgb_state_tc_f32) and then every gradient on tensor cores
// (lgb_grad_tc_f32).
template <typename T> std::vector<std::vector<double>> kernels(const Case<T>& c, int stages, bool pre = false) {
    constexpr int CH = Llc<T>::CH;
    const int B = c.B, Tn = c.Tn, H = c.H, Dk = c.Dk, Dv = c.Dv, BH = B * H, NC = (Tn + CH - 1) / CH;
    std::vector<T> W, U, Ti;
    wy_loops(c, W, U, Ti);
    std::vector<T> zs((size_t)BH * NC * Dk * Dv), xs(zs.size()), du(U.size());
    std::vector<T> dq(W.size()), dk(W.size()), dv(U.size()), db((size_t)B * Tn * H), dg(db.size());
    const T scale = (T)c.sigma;
    const int ncol_blocks = (Dv + LGB_NCOL - 1) / LGB_NCOL;
    launch(BH, ncol_blocks, [&] { lgb_pass<T, false>(c.k.data(), c.g.data(), W.data(), U.data(), zs.data(), nullptr, 0, nullptr, 0, Tn, H, Dk, Dv, NC, stages); });
    bool pre_tc = false;
    if constexpr (sizeof(T) == 4) {
        if (pre) {
            pre_tc = true;
            launch(NC, BH, [&] {
                lgb_pre_tc_f32(c.q.data(), c.k.data(), c.g.data(), c.dy.data(), du.data(), xs.data(), Tn, H, Dk, Dv,
                               NC, scale);
            });
        }
    }
    if (!pre_tc)
        launch(NC, BH, [&] { lgb_pre<T>(c.q.data(), c.k.data(), c.g.data(), c.dy.data(), du.data(), xs.data(), Tn, H, Dk, Dv, NC, scale); });
    launch(BH, ncol_blocks, [&] { lgb_pass<T, true>(c.k.data(), c.g.data(), W.data(), du.data(), xs.data(), nullptr, 0, nullptr, 0, Tn, H, Dk, Dv, NC, stages); });
    // As the host plans it: with Dv > 32 the state products and lgb_grad_tc_f32; else lgb_grad.
    bool products = false;
    if constexpr (sizeof(T) == 4) {
        if (pre && Dv > 32) {
            products = true;
            std::vector<float> a1(W.size()), a2(W.size()), a3(W.size());
            std::vector<double> xz((size_t)BH * NC * ((Dk + 63) / 64));
            launch(NC, BH, (Dk + 63) / 64, [&] {
                lgb_state_tc_f32(c.dy.data(), U.data(), du.data(), zs.data(), xs.data(), a1.data(), a2.data(),
                                 a3.data(), xz.data(), Tn, H, Dk, Dv, NC);
            });
            // lgb_grad_tc_f32 stays within its shared memory (five [64][LGS_LD] tiles): the bytes
            // after it keep a mark.
            const size_t used = 5 * 64 * LGS_LD * sizeof(float);
            std::memset(g_dyn + used, 0xA5, sizeof(g_dyn) - used);
            launch(NC, BH, [&] {
                lgb_grad_tc_f32(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.dy.data(),
                                U.data(), Ti.data(), du.data(), a1.data(), a2.data(), a3.data(), xz.data(),
                                dq.data(), dk.data(), dv.data(), db.data(), dg.data(), Tn, H, Dk, Dv, NC, scale);
            });
            for (size_t i = used; i < sizeof(g_dyn); ++i)
                if (g_dyn[i] != 0xA5) {
                    std::printf("FAIL lgb_grad_tc_f32 wrote shared memory at byte %zu, past its %zu\n", i, used);
                    std::exit(1);
                }
        }
    }
    if (!products)
        launch(NC, BH, [&] {
            lgb_grad<T>(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.dy.data(), Ti.data(),
                        zs.data(), xs.data(), U.data(), du.data(), dq.data(), dk.data(), dv.data(), db.data(),
                        dg.data(), Tn, H, Dk, Dv, NC, scale);
        });
    auto d = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
    return {d(dq), d(dk), d(dv), d(db), d(dg)};
}

template <typename T>
int run(int B, int Tn, int H, int Dk, int Dv, bool strong, double tol, int stages = 2, bool pre = false,
        double gscale = 1) {
    Case<T> c = make<T>(B, Tn, H, Dk, Dv, 1000u + Tn * 7 + Dk, strong);
    for (auto& g : c.g) g = (T)(gscale * g);  // gscale < 1: decays that keep the states' terms visible
    const auto want = reference(c);
    const auto got = kernels(c, stages, pre);
    const char* names[] = {"dq", "dk", "dv", "dbeta", "dg"};
    int fails = 0;
    for (int i = 0; i < 5; ++i) {
        const double e = rel(got[i], want[i]);
        bool finite = true;
        for (double x : got[i]) finite = finite && std::isfinite(x);
        const bool ok = finite && e <= tol;
        fails += !ok;
        std::printf("%s %s (B,T,H,Dk,Dv)=(%d,%d,%d,%d,%d)%s%s %s rel=%.2e\n", ok ? "ok  " : "FAIL",
                    sizeof(T) == 8 ? "f64" : "f32", B, Tn, H, Dk, Dv, strong ? " strong" : "",
                    pre ? " tensor cores" : "", names[i], e);
    }
    // Central differences of L = Σ dy·y for a few entries of q, k, v, g, β (f64 only).
    if (sizeof(T) == 8 && !strong) {
        std::vector<T>* xs[] = {&c.q, &c.k, &c.v, &c.beta, &c.g};
        const int gi[] = {0, 1, 2, 3, 4};
        for (int w = 0; w < 5; ++w)
            for (size_t idx : {(size_t)0, xs[w]->size() / 2, xs[w]->size() - 1}) {
                const T keep = (*xs[w])[idx];
                const double hstep = 1e-5;
                auto loss = [&] {
                    const auto y = forward(c);
                    double l = 0;
                    for (size_t i = 0; i < y.size(); ++i) l += y[i] * c.dy[i];
                    return l;
                };
                (*xs[w])[idx] = keep + hstep;
                const double lp = loss();
                (*xs[w])[idx] = keep - hstep;
                const double lm = loss();
                (*xs[w])[idx] = keep;
                const double fd = (lp - lm) / (2 * hstep), an = got[gi[w]][idx];
                const bool ok = std::fabs(fd - an) <= 1e-6 * (1 + std::fabs(fd));
                fails += !ok;
                if (!ok) std::printf("FAIL finite difference %s[%zu]: %.9e vs %.9e\n", names[gi[w]], idx, fd, an);
            }
    }
    return fails;
}

int main() {
    int fails = 0;
    fails += run<double>(1, 1, 1, 5, 16, false, 1e-10);
    fails += run<double>(2, 70, 1, 5, 12, false, 1e-10);
    fails += run<double>(1, 65, 2, 16, 5, false, 1e-10);
    fails += run<double>(1, 97, 1, 70, 20, false, 1e-10);
    fails += run<double>(1, 40, 1, 6, 7, true, 1e-10);
    fails += run<double>(1, 33, 1, 8, 70, false, 1e-10);
    fails += run<float>(1, 70, 1, 130, 66, false, 1e-4);
    fails += run<float>(1, 20, 1, 256, 16, false, 1e-4, 1);
    fails += run<double>(2, 70, 1, 5, 12, false, 1e-10, 1);
    fails += run<float>(1, 130, 1, 16, 24, false, 1e-4);
    fails += run<float>(2, 63, 1, 5, 17, false, 1e-4);
    fails += run<float>(1, 200, 1, 24, 20, true, 1e-4);
    // The tf32 and bf16 modes' state products on tensor cores (the tf32 tolerance).
    fails += run<float>(1, 130, 2, 70, 66, false, 5e-3, 2, true);
    fails += run<float>(2, 150, 1, 130, 17, false, 5e-3, 2, true);
    fails += run<float>(1, 200, 1, 24, 80, true, 5e-3, 2, true);
    fails += run<float>(2, 130, 1, 64, 64, false, 5e-3, 2, true);
    // Two key tiles and two value tiles (the second partial) in lgb_grad_tc_f32.
    fails += run<float>(1, 100, 2, 130, 96, false, 5e-3, 2, true);
    // Weak decays (e^γ over a chunk near 1): the ⟨X, Z⟩ term of dg is not lost in the tf32 rounding.
    fails += run<float>(1, 260, 1, 70, 66, false, 5e-3, 2, true, 0.01);
    std::printf(fails ? "%d FAILED\n" : "all passed\n", fails);
    return fails != 0;
}
