// CPU harness for mixer-cuda/kernels/loglinear_backward_lift_delta.cu (the lifted gated DeltaNet's
// chunked backward: lgl_fwd, lgl_qt, lgl_rev, lgl_levels, lgl_grad) through cpu_cuda.h, against central
// finite differences of an independent forward in f64, the pairwise form of docs/math.md §2.6:
//   y_t = σ Σ_{s ≤ t} λ_t^(bitlen(t ⊕ s)) β_s (k_sᵀ A_{s+1} ⋯ A_t q_t) v_s,
//   A_r = e^{g_r} (I − β_r k_r k_rᵀ),
// for every entry of q, k, v, g, β and λ (f64; every 11th entry in f32). W, U and T⁻¹ (llc_wy's
// outputs, gdn_case.h) come from plain loops here, and lgl_fwd's level states are checked against
// plain loops too; the passes run with their states in shared memory and in global memory, with
// one and two stage buffers. Run from the repository root:
//   sed -e 's/extern __shared__ __align__(16) unsigned char lgl_smem\[\];/unsigned char* lgl_smem = g_dyn;/' \
//     -e 's/asm volatile(.*);/;/' mixer-cuda/kernels/loglinear_backward_common.cuh \
//     mixer-cuda/kernels/loglinear_backward_lift_delta.cu > /tmp/lgl.cu &&
//   g++ -std=c++20 -O2 -pthread -I/tmp bench/gpu/lift_delta_backward_harness.cpp -o /tmp/lgl_harness && /tmp/lgl_harness
// It exits non-zero on a failure.
#include "cpu_cuda.h"
#include "lgl.cu"
#include "gdn_case.h"

static int bitlen(ll x) { return x == 0 ? 0 : 64 - __builtin_clzll((unsigned long long)x); }

// The pairwise forward in f64 (inputs as doubles): y [B,T,H,Dv].
template <typename T> std::vector<double> forward(const Case<T>& c) {
    std::vector<double> y((size_t)c.B * c.Tn * c.H * c.Dv, 0.0);
    std::vector<double> u(c.Dk);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
            for (int t = 0; t < c.Tn; ++t) {
                const ll rt = c.row(b, t, h);
                for (int d = 0; d < c.Dk; ++d) u[d] = c.q[rt * c.Dk + d];
                for (int s = t; s >= 0; --s) {
                    const ll rs = c.row(b, s, h);
                    double ku = 0;
                    for (int d = 0; d < c.Dk; ++d) ku += (double)c.k[rs * c.Dk + d] * u[d];
                    const double w = c.sigma * (double)c.lam[rt * c.L + bitlen((ll)t ^ s)] * (double)c.beta[rs] * ku;
                    for (int d = 0; d < c.Dv; ++d) y[rt * c.Dv + d] += w * (double)c.v[rs * c.Dv + d];
                    // u ← A_s u
                    const double a = exp((double)c.g[rs]), bk = (double)c.beta[rs] * ku;
                    for (int d = 0; d < c.Dk; ++d) u[d] = a * (u[d] - bk * (double)c.k[rs * c.Dk + d]);
                }
            }
    return y;
}

// The kernels' launches as src/loglinear/backward_lift_delta.rs makes them.
template <typename T>
std::vector<std::vector<double>> kernels(const Case<T>& c, bool global, int stages, int& fails) {
    constexpr int CH = Llc<T>::CH;
    const int B = c.B, Tn = c.Tn, H = c.H, Dk = c.Dk, Dv = c.Dv, BH = B * H, NC = (Tn + CH - 1) / CH, L = c.L;
    const int E = bitlen(NC - 1) + 1;
    std::vector<T> W, U, Ti;
    wy_loops(c, W, U, Ti);
    // The level states entering each chunk (f64 loops): merge 0..m into m + 1, store the present
    // levels, take them through the chunk, insert K̂ᵀ U at level 0.
    ll pop = 0;
    for (int j = 0; j < NC; ++j) pop += __builtin_popcount(j);
    const ll DD = (ll)Dk * Dv;
    std::vector<double> zl(std::max<ll>(1, BH * pop * DD));
    for (int bh = 0; bh < BH; ++bh) {
        const int b = bh / H, h = bh % H;
        std::vector<std::vector<double>> S(E, std::vector<double>(DD, 0.0));
        ll slot = 0;
        for (int j = 0; j < NC; ++j) {
            const int i0 = j * CH, n = min(CH, Tn - i0);
            if (j >= 1) {
                const int m = __builtin_ctz(j);
                for (ll i = 0; i < DD; ++i) {
                    double x = 0;
                    for (int e = 0; e <= m; ++e) x += S[e][i], S[e][i] = 0;
                    S[m + 1][i] = x;
                }
            }
            std::vector<double> gam(n), tau(n);
            double acc = 0;
            for (int r = 0; r < n; ++r) gam[r] = acc += (double)c.g[c.row(b, i0 + r, h)];
            for (int r = 0; r < n; ++r) tau[r] = exp(gam[n - 1] - gam[r]);
            auto kh = [&](int r, int d) { return tau[r] * (double)c.k[c.row(b, i0 + r, h) * Dk + d]; };
            for (int e = 1; e < E; ++e) {
                if (!((j >> (e - 1)) & 1)) continue;
                for (ll i = 0; i < DD; ++i) zl[(bh * pop + slot) * DD + i] = S[e][i];
                ++slot;
                // S ← e^a S − K̂ᵀ (W S)
                std::vector<double> ws((size_t)n * Dv, 0.0), ns(DD);
                for (int r = 0; r < n; ++r)
                    for (int cc = 0; cc < Dv; ++cc)
                        for (int d = 0; d < Dk; ++d)
                            ws[r * Dv + cc] += (double)W[c.row(b, i0 + r, h) * Dk + d] * S[e][d * Dv + cc];
                for (int d = 0; d < Dk; ++d)
                    for (int cc = 0; cc < Dv; ++cc) {
                        double x = exp(gam[n - 1]) * S[e][d * Dv + cc];
                        for (int r = 0; r < n; ++r) x -= kh(r, d) * ws[r * Dv + cc];
                        ns[d * Dv + cc] = x;
                    }
                S[e] = ns;
            }
            for (int d = 0; d < Dk; ++d)
                for (int cc = 0; cc < Dv; ++cc) {
                    double x = 0;
                    for (int r = 0; r < n; ++r) x += kh(r, d) * (double)U[c.row(b, i0 + r, h) * Dv + cc];
                    S[0][d * Dv + cc] = x;
                }
        }
    }
    const size_t nk = W.size(), nv = U.size(), nt = (size_t)B * Tn * H;
    std::vector<T> qt(nk), dqt(nk), xs(std::max<ll>(1, BH * (pop + NC) * DD)), hxz((size_t)BH * NC * Dk * Dk);
    std::vector<T> dq(nk), dk(nk), dv(nv), db(nt), dg(nt), dlam(nt * L, (T)0);
    const T scale = (T)c.sigma;
    const int ncb = (Dv + LGL_NCOL - 1) / LGL_NCOL;
    std::vector<T> gst(global ? (size_t)BH * ncb * E * Dk * LGL_NCOL : 0), zs(zl.size());
    T* gp = global ? gst.data() : nullptr;
    launch(BH, ncb, [&] { lgl_pass<T, false>(c.k.data(), c.g.data(), W.data(), nullptr, U.data(), nullptr, zs.data(), gp, global, Tn, H, Dk, Dv, 0, NC, E, stages); });
    {
        const double e = rel(std::vector<double>(zs.begin(), zs.end()), zl);
        const bool ok = e <= (sizeof(T) == 8 ? 1e-10 : 1e-5);
        fails += !ok;
        std::printf("%s level states of lgl_fwd (%s memory, %d stages) rel=%.2e\n", ok ? "ok  " : "FAIL",
                    global ? "global" : "shared", stages, e);
    }
    launch(NC, BH, [&] { lgl_qt<T>(c.q.data(), c.k.data(), c.g.data(), W.data(), qt.data(), Tn, H, Dk, Dv, scale); });
    launch(BH, ncb, [&] {
        lgl_pass<T, true>(c.k.data(), c.g.data(), W.data(), qt.data(), c.dy.data(), c.lam.data(), xs.data(), gp, global, Tn, H,
                          Dk, Dv, L, NC, E, stages);
    });
    {
        // The transition form of the reverse pass (lgl_src + lgl_rev_t) gives the same adjoints.
        const int DKP = (Dk + 15) / 16 * 16;
        std::vector<T> mt((size_t)BH * NC * DKP * DKP), ea((size_t)BH * NC), rs(zs.size());
        launch(NC, BH, [&] {
            lgl_src<T>(c.k.data(), c.g.data(), W.data(), qt.data(), c.dy.data(), c.lam.data(), mt.data(), ea.data(),
                       rs.data(), Tn, H, Dk, Dv, L, NC, E);
        });
        // The same recurrence in f64 loops on lgl_src's maps and sources: X^e ← e^a X^e + Mᵀ X^e + R^e
        // for the present levels from the last chunk down, the merge's adjoint, the slots written
        // before each chunk's step (its product, of relative size about 10⁻⁴ here, is checked
        // apart from the sources' rounding).
        std::vector<double> want(xs.size(), 0.0);
        for (int bh = 0; bh < BH; ++bh) {
            std::vector<std::vector<double>> X(E, std::vector<double>(DD, 0.0));
            for (int j = NC - 1; j >= 0; --j) {
                ll slot = bh * (pop + NC) + j;
                for (int j2 = 0; j2 < j; ++j2) slot += __builtin_popcount(j2);
                for (int e = 0; e < E; ++e)
                    if (e == 0 || ((j >> (e - 1)) & 1)) std::copy(X[e].begin(), X[e].end(), want.begin() + slot++ * DD);
                if (j == 0) break;
                const int m = __builtin_ctz(j);
                const T* M = mt.data() + ((ll)bh * NC + j) * DKP * DKP;
                const double a = ea[(ll)bh * NC + j];
                ll r0 = (ll)bh * pop;
                for (int j2 = 0; j2 < j; ++j2) r0 += __builtin_popcount(j2);
                int rank = 0;
                for (int e = m + 1; e < E; ++e) {
                    if (!((j >> (e - 1)) & 1)) continue;
                    const T* R = rs.data() + (r0 + rank++) * DD;
                    std::vector<double> y(DD);
                    for (int d = 0; d < Dk; ++d)
                        for (int cc = 0; cc < Dv; ++cc) {
                            double v = a * X[e][d * Dv + cc] + R[d * Dv + cc];
                            for (int d2 = 0; d2 < Dk; ++d2) v += (double)M[d * DKP + d2] * X[e][d2 * Dv + cc];
                            y[d * Dv + cc] = v;
                        }
                    if (e == m + 1) {
                        for (int e2 = 0; e2 <= m; ++e2) X[e2] = y;
                        std::fill(X[e].begin(), X[e].end(), 0.0);
                    } else {
                        X[e] = y;
                    }
                }
            }
        }
        for (int st = 1; st <= 2; ++st) {
            std::vector<T> xs2(xs.size(), (T)7);  // every adjoint slot is written
            launch(BH, ncb, [&] { lgl_rev_t<T>(mt.data(), ea.data(), rs.data(), xs2.data(), Dk, Dv, NC, E, st); });
            const std::vector<double> got(xs2.begin(), xs2.end());
            const double e = rel(got, std::vector<double>(xs.begin(), xs.end())), e2 = rel(got, want);
            const double f32_tol = 1e-5, f32_loops = 2e-6;
            const bool ok = e <= (sizeof(T) == 8 ? 1e-10 : f32_tol) && e2 <= (sizeof(T) == 8 ? 1e-12 : f32_loops);
            fails += !ok;
            std::printf("%s adjoints of lgl_rev_t (%d stage buffers) against lgl_rev rel=%.2e, against loops on its maps "
                        "rel=%.2e\n", ok ? "ok  " : "FAIL", st, e, e2);
        }
    }
    launch(NC, BH, [&] {
        lgl_levels<T>(c.dy.data(), qt.data(), c.lam.data(), zs.data(), xs.data(), dqt.data(), dlam.data(), hxz.data(),
                      Tn, H, Dk, Dv, L, NC, E);
    });
    launch(NC, BH, [&] {
        lgl_grad<T>(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.dy.data(), c.lam.data(),
                    Ti.data(), W.data(), U.data(), dqt.data(), hxz.data(), xs.data(), dq.data(), dk.data(), dv.data(),
                    db.data(), dg.data(), dlam.data(), Tn, H, Dk, Dv, L, NC, scale);
    });
    auto d = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
    return {d(dq), d(dk), d(dv), d(dg), d(db), d(dlam)};
}

template <typename T>
int run(int B, int Tn, int H, int Dk, int Dv, bool strong, double tol, int every, bool global, int stages,
        double gscale = 1.0) {
    Case<T> c = make<T>(B, Tn, H, Dk, Dv, 2000u + Tn * 7 + Dk, strong);
    for (auto& g : c.g) g = (T)(gscale * g);  // weak decays (gscale < 1): the reverse pass's maps matter
    c.L = bitlen(Tn - 1) + 2;  // one level more than T tokens read (never read: its gradient is 0)
    std::mt19937_64 rng(77 + Tn);
    std::uniform_real_distribution<double> u01(0, 1);
    for (size_t i = 0; i < (size_t)B * Tn * H * c.L; ++i) c.lam.push_back((T)(strong && i % 5 == 3 ? 0.0 : 0.2 + u01(rng)));
    int fails = 0;
    const auto got = kernels(c, global, stages, fails);
    // The finite differences on the inputs as doubles (steps below f32's spacing in f32 runs).
    auto dbl = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
    Case<double> cd{B, Tn, H, Dk, Dv, c.sigma, dbl(c.q), dbl(c.k), dbl(c.v), dbl(c.g), dbl(c.beta), dbl(c.dy), c.L,
                    dbl(c.lam)};
    std::vector<double>* ins[] = {&cd.q, &cd.k, &cd.v, &cd.g, &cd.beta, &cd.lam};
    const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dlambda"};
    auto loss = [&] {
        const auto y = forward(cd);
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += y[i] * cd.dy[i];
        return l;
    };
    for (int w = 0; w < 6; ++w) {
        std::vector<double> fd, an;
        bool finite = true;
        for (size_t idx = 0; idx < ins[w]->size(); ++idx) {
            finite = finite && std::isfinite(got[w][idx]);
            if (idx % every) continue;
            // No step across a wiping decay (the strong case's g = −10⁴ stays put).
            if (w == 3 && (*ins[w])[idx] < -100) continue;
            const double keep = (*ins[w])[idx];
            const double hstep = 1e-5 * std::max(1.0, std::fabs(keep));
            (*ins[w])[idx] = keep + hstep;
            const double lp = loss();
            (*ins[w])[idx] = keep - hstep;
            const double lm = loss();
            (*ins[w])[idx] = keep;
            fd.push_back((lp - lm) / (2 * hstep));
            an.push_back(got[w][idx]);
        }
        const double e = rel(an, fd);
        const bool ok = finite && e <= tol;
        fails += !ok;
        std::printf("%s %s (B,T,H,Dk,Dv)=(%d,%d,%d,%d,%d)%s %s rel=%.2e over %zu entries\n", ok ? "ok  " : "FAIL",
                    sizeof(T) == 8 ? "f64" : "f32", B, Tn, H, Dk, Dv, strong ? " strong" : "", names[w], e, fd.size());
    }
    return fails;
}

int main() {
    int fails = 0;
    fails += run<double>(1, 1, 1, 3, 4, false, 1e-7, 1, false, 2);
    fails += run<double>(1, 150, 1, 5, 6, false, 1e-7, 1, true, 2);
    fails += run<double>(2, 97, 2, 4, 3, false, 1e-7, 1, false, 1);
    fails += run<double>(1, 161, 1, 6, 5, true, 1e-7, 1, true, 1);
    fails += run<double>(1, 75, 1, 70, 17, false, 1e-7, 3, false, 2);
    // 22 chunks: chunk levels up to 5, merges of several levels at once.
    fails += run<double>(1, 700, 1, 4, 3, false, 1e-7, 29, false, 2);
    // f32 kernels against finite differences of the f64 forward on the same (f32) inputs.
    fails += run<float>(1, 300, 1, 8, 6, false, 1e-4, 11, true, 2);
    fails += run<float>(1, 200, 1, 66, 20, false, 1e-4, 11, false, 1);
    // Weak decays: the reverse pass's maps Mᵀ_j carry weight (a dropped product fails lgl_rev_t's check).
    fails += run<float>(1, 400, 1, 48, 40, false, 1e-4, 97, false, 2, 0.01);
    std::printf(fails ? "%d FAILED\n" : "all passed\n", fails);
    return fails != 0;
}
