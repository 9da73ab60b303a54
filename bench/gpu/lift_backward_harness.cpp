// CPU harness for mixer-cuda/kernels/loglinear_backward_lift.cu (the scalar-decay lifts' backward:
// llbl_pass, llbl_kv, llbl_dlam) through cpu_cuda.h, against the pairwise sums of docs/math.md
// §2.8 in f64 over every (t, s ≤ t): w = σ λ_t^(ℓ) e^{G_t − G_s}, dv_s += w (q_t·k_s) dy_t,
// dk_s += w (dy_t·v_s) q_t, dλ_t^(ℓ) += σ e^{G_t − G_s} (q_t·k_s)(dy_t·v_s). The forward's tree of
// chunk states (llc_states and llc_tree of loglinear_ssd.cu) comes from plain loops here. Run from
// the repository root:
//   g++ -std=c++20 -O1 -pthread bench/gpu/lift_backward_harness.cpp -o /tmp/lift_harness && /tmp/lift_harness
// It exits non-zero on a failure.
#define __launch_bounds__(...)
#include "cpu_cuda.h"
#include "../../mixer-cuda/kernels/loglinear_backward_lift.cu"

typedef long long ll;

static int bitlen(ll x) { return x == 0 ? 0 : 64 - __builtin_clzll((unsigned long long)x); }

template <typename T> struct Case {
    int B, Tn, H, Dk, Dv, L;
    bool decay;
    double sigma;
    std::vector<T> q, k, v, g, lam, dy;
    ll row(int b, int t, int h) const { return ((ll)b * Tn + t) * H + h; }
};

template <typename T> Case<T> make(int B, int Tn, int H, int Dk, int Dv, int extra, bool decay, unsigned seed) {
    Case<T> c{B, Tn, H, Dk, Dv, bitlen(Tn - 1) + 1 + extra, decay, 0.7};
    std::mt19937 rng(seed);
    std::normal_distribution<double> n(0.0, 1.0);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const size_t rows = (size_t)B * Tn * H;
    for (size_t i = 0; i < rows * Dk; ++i) c.q.push_back((T)(n(rng) / 3)), c.k.push_back((T)(n(rng) / 3));
    for (size_t i = 0; i < rows * Dv; ++i) c.v.push_back((T)n(rng)), c.dy.push_back((T)n(rng));
    for (size_t i = 0; i < rows; ++i) c.g.push_back(decay ? (T)(-0.2 * u(rng)) : (T)0);
    for (size_t i = 0; i < rows * c.L; ++i) c.lam.push_back((T)(0.2 + u(rng)));
    return c;
}

// dk, dv, dλ by the pairwise sums, f64.
template <typename T> std::vector<std::vector<double>> reference(const Case<T>& c) {
    std::vector<std::vector<double>> out{std::vector<double>(c.k.size()), std::vector<double>(c.v.size()),
                                         std::vector<double>(c.lam.size())};
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h) {
            std::vector<double> G(c.Tn);
            double acc = 0;
            for (int t = 0; t < c.Tn; ++t) G[t] = acc += (double)c.g[c.row(b, t, h)];
            for (int t = 0; t < c.Tn; ++t)
                for (int s = 0; s <= t; ++s) {
                    const ll rt = c.row(b, t, h), rs = c.row(b, s, h);
                    const int l = bitlen((ll)t ^ s);
                    double qk = 0, dyv = 0;
                    for (int d = 0; d < c.Dk; ++d) qk += (double)c.q[rt * c.Dk + d] * c.k[rs * c.Dk + d];
                    for (int d = 0; d < c.Dv; ++d) dyv += (double)c.dy[rt * c.Dv + d] * c.v[rs * c.Dv + d];
                    const double e = c.sigma * exp(G[t] - G[s]), w = e * c.lam[rt * c.L + l];
                    for (int d = 0; d < c.Dv; ++d) out[1][rs * c.Dv + d] += w * qk * c.dy[rt * c.Dv + d];
                    for (int d = 0; d < c.Dk; ++d) out[0][rs * c.Dk + d] += w * dyv * c.q[rt * c.Dk + d];
                    out[2][rt * c.L + l] += e * qk * dyv;
                }
        }
    return out;
}

// The kernels, with the tree of chunk states from loops in the layout of loglinear_ssd.cu.
template <typename T> std::vector<std::vector<double>> kernels(const Case<T>& c) {
    constexpr int CH = Llc<T>::CH;
    const int B = c.B, Tn = c.Tn, H = c.H, Dk = c.Dk, Dv = c.Dv, L = c.L, BH = B * H, NC = (Tn + CH - 1) / CH;
    const ll DD = (ll)Dk * Dv;
    ll entries = 0;
    for (int e = 0; (NC >> e) > 0; ++e) entries += NC >> e;
    std::vector<T> F((size_t)(BH * entries * DD));
    std::vector<double> A((size_t)(BH * entries));
    auto ent = [&](int e, int bh, int m) {
        ll s = 0;
        for (int l = 0; l < e; ++l) s += NC >> l;
        return s * BH + (ll)bh * (NC >> e) + m;
    };
    for (int bh = 0; bh < BH; ++bh) {
        const int b = bh / H, h = bh % H;
        for (int j = 0; j < NC; ++j) {
            const int i0 = j * CH, n = std::min(CH, Tn - i0);
            std::vector<double> gam(n);
            double acc = 0;
            for (int r = 0; r < n; ++r) gam[r] = acc += (double)c.g[c.row(b, i0 + r, h)];
            const ll e0 = ent(0, bh, j);
            A[e0] = gam[n - 1];
            for (int a = 0; a < Dk; ++a)
                for (int d = 0; d < Dv; ++d) {
                    double z = 0;
                    for (int r = 0; r < n; ++r) {
                        const ll rw = c.row(b, i0 + r, h);
                        z += exp(gam[n - 1] - gam[r]) * c.k[rw * Dk + a] * c.v[rw * Dv + d];
                    }
                    F[e0 * DD + a * Dv + d] = (T)z;
                }
        }
        for (int e = 1; (NC >> e) > 0; ++e)
            for (int m = 0; m < (NC >> e); ++m) {
                const ll lo = ent(e - 1, bh, 2 * m), hi = ent(e - 1, bh, 2 * m + 1), me = ent(e, bh, m);
                A[me] = A[lo] + A[hi];
                for (ll x = 0; x < DD; ++x) F[me * DD + x] = (T)(exp(A[hi]) * F[lo * DD + x]) + F[hi * DD + x];
            }
    }
    std::vector<T> dk(c.k.size()), dv(c.v.size()), dl(c.lam.size(), (T)0);
    const int has_g = c.decay ? 1 : 0;
    ll slots = 0, nu = 0;
    for (int j = 0; j < NC; ++j) slots += __builtin_popcount(j);
    for (int e = 1; e < 32; ++e) nu += llbl_ucount(e, NC);
    std::vector<T> R((size_t)std::max<ll>(1, BH * slots * DD)), U((size_t)std::max<ll>(1, BH * nu * DD));
    launch(NC, BH, ((Dk + 63) / 64) * ((Dv + 63) / 64), [&] {
        llbl_src<T>(c.q.data(), c.dy.data(), c.g.data(), has_g, c.lam.data(), R.data(), Tn, H, Dk, Dv, L, NC, c.sigma);
    });
    if (nu > 0) launch((int)nu, BH, (int)((DD + 255) / 256), [&] { llbl_join<T>(R.data(), A.data(), U.data(), Dk, Dv, NC); });
    launch(NC, BH, (Dv + 63) / 64 + (Dk + 63) / 64, [&] {
        llbl_kv<T>(c.q.data(), c.k.data(), c.v.data(), c.dy.data(), c.g.data(), has_g, c.lam.data(), U.data(), A.data(),
                   dk.data(), dv.data(), dl.data(), Tn, H, Dk, Dv, L, NC, c.sigma);
    });
    launch(NC, BH, [&] {
        llbl_dlam<T>(c.q.data(), c.dy.data(), c.g.data(), has_g, F.data(), A.data(), dl.data(), Tn, H, Dk, Dv, L, NC,
                     c.sigma);
    });
    auto d = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
    return {d(dk), d(dv), d(dl)};
}

static bool close(const char* what, const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const char* label) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
    const double rel = sqrt(num / std::max(den, 1e-300));
    const bool ok = rel <= tol;
    std::printf("%s %s %s rel=%.2e\n", ok ? "ok  " : "FAIL", label, what, rel);
    return ok;
}

template <typename T> bool run(int B, int Tn, int H, int Dk, int Dv, int extra, bool decay, double tol) {
    const Case<T> c = make<T>(B, Tn, H, Dk, Dv, extra, decay, (unsigned)(Tn * 31 + Dk));
    const auto want = reference(c);
    const auto got = kernels(c);
    char label[128];
    std::snprintf(label, sizeof label, "%s (B,T,H,Dk,Dv)=(%d,%d,%d,%d,%d) L=%d %s", sizeof(T) == 4 ? "f32" : "f64", B,
                  Tn, H, Dk, Dv, c.L, decay ? "decay" : "no decay");
    bool ok = close("dk", got[0], want[0], tol, label);
    ok &= close("dv", got[1], want[1], tol, label);
    ok &= close("dlam", got[2], want[2], tol, label);
    return ok;
}

int main() {
    bool ok = true;
    ok &= run<float>(1, 1, 1, 5, 3, 0, true, 1e-5);
    ok &= run<float>(2, 200, 2, 24, 20, 1, true, 1e-5);
    ok &= run<float>(1, 1000, 1, 16, 16, 0, true, 1e-5);
    ok &= run<float>(1, 300, 1, 70, 66, 0, false, 1e-5);
    ok &= run<double>(1, 333, 2, 7, 9, 2, true, 1e-12);
    ok &= run<double>(1, 64, 1, 3, 5, 0, true, 1e-12);
    ok &= run<float>(1, 64 * 37 + 5, 1, 4, 3, 0, true, 1e-5);  // 38 chunks: incomplete halves at several levels
    ok &= run<double>(1, 32 * 64, 1, 2, 3, 0, true, 1e-12);   // a power of two of chunks
    std::printf(ok ? "all passed\n" : "FAILED\n");
    return ok ? 0 : 1;
}
