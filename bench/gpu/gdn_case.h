// What the CPU harnesses of gated DeltaNet's backward kernels share (gdn_backward_harness.cpp,
// lift_delta_backward_harness.cpp): a case (inputs and cotangent, [B,T,H,·] rows; λ weights
// [B,T,H,L] for the lift), its random inputs, the forward's WY step (W, U and T⁻¹ per chunk,
// what llc_wy computes) by plain loops in f64, and the relative error.
#pragma once
typedef long long ll;

template <typename T> struct Case {
    int B, Tn, H, Dk, Dv;
    double sigma;
    std::vector<T> q, k, v, g, beta, dy;
    int L = 0;
    std::vector<T> lam;
    ll row(int b, int t, int h) const { return ((ll)b * Tn + t) * H + h; }
};

// W = T⁻¹ diag(β e^γ) K, U = T⁻¹ diag(β) V and T⁻¹ ([B·H][NC][CH][CH]) per chunk, in f64, stored as T.
template <typename T>
void wy_loops(const Case<T>& c, std::vector<T>& W, std::vector<T>& U, std::vector<T>& Ti) {
    constexpr int CH = Llc<T>::CH;
    const int B = c.B, Tn = c.Tn, H = c.H, Dk = c.Dk, Dv = c.Dv, BH = B * H, NC = (Tn + CH - 1) / CH;
    W.assign((size_t)B * Tn * H * Dk, 0), U.assign((size_t)B * Tn * H * Dv, 0), Ti.assign((size_t)BH * NC * CH * CH, 0);
    for (int bh = 0; bh < BH; ++bh)
        for (int j = 0; j < NC; ++j) {
            const int b = bh / H, h = bh % H, i0 = j * CH, n = min(CH, Tn - i0);
            std::vector<double> gam(n), ti(CH * CH, 0.0);
            double acc = 0;
            for (int r = 0; r < n; ++r) gam[r] = acc += (double)c.g[c.row(b, i0 + r, h)];
            for (int r = 0; r < CH; ++r) ti[r * CH + r] = 1;
            auto kk = [&](int r, int s) {
                double x = 0;
                for (int d = 0; d < Dk; ++d) x += (double)c.k[c.row(b, i0 + r, h) * Dk + d] * c.k[c.row(b, i0 + s, h) * Dk + d];
                return x;
            };
            for (int col = 0; col < n; ++col)
                for (int r = col + 1; r < n; ++r) {
                    double x = 0;
                    for (int s = col; s < r; ++s)
                        x += c.beta[c.row(b, i0 + r, h)] * kk(r, s) * exp(gam[r] - gam[s]) * ti[s * CH + col];
                    ti[r * CH + col] = -x;
                }
            for (int e = 0; e < CH * CH; ++e) Ti[((ll)bh * NC + j) * CH * CH + e] = (T)ti[e];
            for (int r = 0; r < n; ++r) {
                const ll rr = c.row(b, i0 + r, h);
                for (int d = 0; d < Dk; ++d) {
                    double x = 0;
                    for (int s = 0; s <= r; ++s) {
                        const ll rs = c.row(b, i0 + s, h);
                        x += ti[r * CH + s] * c.beta[rs] * exp(gam[s]) * c.k[rs * Dk + d];
                    }
                    W[rr * Dk + d] = (T)x;
                }
                for (int d = 0; d < Dv; ++d) {
                    double x = 0;
                    for (int s = 0; s <= r; ++s) {
                        const ll rs = c.row(b, i0 + s, h);
                        x += ti[r * CH + s] * c.beta[rs] * c.v[rs * Dv + d];
                    }
                    U[rr * Dv + d] = (T)x;
                }
            }
        }
}

template <typename T> Case<T> make(int B, int Tn, int H, int Dk, int Dv, unsigned seed, bool strong) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> U(-1, 1);
    Case<T> c{B, Tn, H, Dk, Dv, 0.7, {}, {}, {}, {}, {}, {}, 0, {}};
    const size_t nk = (size_t)B * Tn * H * Dk, nv = (size_t)B * Tn * H * Dv, nt = nv / Dv;
    auto fill = [&](std::vector<T>& x, size_t n, double s) {
        for (size_t i = 0; i < n; ++i) x.push_back((T)(s * U(rng)));
    };
    fill(c.q, nk, 1), fill(c.v, nv, 1), fill(c.dy, nv, 1);
    // Keys of norm ≤ 1 (as an L2-normalised gated DeltaNet), decays in (−0.5, 0], gates in (0, 1).
    for (size_t r = 0; r < nt; ++r) {
        double n2 = 0;
        std::vector<double> kv(Dk);
        for (auto& x : kv) n2 += (x = U(rng)) * x;
        for (auto x : kv) c.k.push_back((T)(x / std::sqrt(n2 + 1e-9)));
        c.g.push_back((T)(strong && r % 3 == 1 ? -1e4 : -0.25 * (U(rng) + 1)));
        c.beta.push_back((T)(strong ? (double)(r % 2) : 0.5 * (U(rng) + 1)));
    }
    return c;
}

static double rel(const std::vector<double>& a, const std::vector<double>& b) {
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
    return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

