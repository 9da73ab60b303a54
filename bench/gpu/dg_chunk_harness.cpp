// CPU harness for mixer-cuda/kernels/loglinear_backward.cu: the decay gradient from the chunk
// boundaries (llb_dg_chunk) and the padded reversal (llb_reverse, llb_reverse_g) of linear
// attention's and Mamba-2's backward (docs/math.md §2.7), the kernel file compiled as plain C++
// (each block as 256 std::threads, cpu_cuda.h). Independent reference: dg_i as the sum over the
// pairs that straddle i, s < i ≤ t, of σ e^(G_t − G_s) (q_t·k_s)(dy_t·v_s), plus the terms of the
// initial state S_0 and of the final state's cotangent S̄_T, in f64 loops. The kernel's inputs
// (dq, dk, the states entering the chunks of the dq run and of the padded reversed dk run) are
// formed here from their definitions, so a wrong chunk index, boundary decay or tail fails. Also the
// lifts' decay gradient (llb_dg_dot and the tiled suffix scan), which shares the per-token dot
// llb_row_dg with llb_dg_chunk. No GPU and no CUDA headers. Run from the repository root:
//   g++ -std=c++20 -O1 -pthread bench/gpu/dg_chunk_harness.cpp -o /tmp/dg_harness && /tmp/dg_harness
// It exits non-zero on a failure.
#include <tuple>

#include "cpu_cuda.h"
#include "../../mixer-cuda/kernels/loglinear_backward.cu"

using ll = long long;

struct Case {
    int B, Tn, H, Dk, Dv, C;
    bool s0, df;
    double sigma = 0.7;
    std::vector<double> q, k, v, dy, g, S0, Sb;  // S0, Sb: [B·H][Dv][Dk]
    ll row(int b, int t, int h) const { return ((ll)b * Tn + t) * H + h; }
};

static Case make(int B, int Tn, int H, int Dk, int Dv, int C, bool s0, bool df, unsigned seed) {
    Case c{B, Tn, H, Dk, Dv, C, s0, df};
    std::mt19937 rng(seed);
    std::normal_distribution<double> n(0.0, 1.0);
    std::uniform_real_distribution<double> u(-0.4, -0.01);
    auto fill = [&](std::vector<double>& a, size_t len) {
        a.resize(len);
        for (auto& x : a) x = 0.5 * n(rng);
    };
    const size_t rows = (size_t)B * Tn * H;
    fill(c.q, rows * Dk), fill(c.k, rows * Dk), fill(c.v, rows * Dv), fill(c.dy, rows * Dv);
    c.g.resize(rows);
    for (auto& x : c.g) x = u(rng);
    fill(c.S0, (size_t)B * H * Dv * Dk), fill(c.Sb, (size_t)B * H * Dv * Dk);
    if (!s0) std::fill(c.S0.begin(), c.S0.end(), 0.0);
    if (!df) std::fill(c.Sb.begin(), c.Sb.end(), 0.0);
    return c;
}

// G_t = Σ_{r ≤ t} g_r of (b, h); G(−1) = 0.
static std::vector<double> cumsum(const Case& c, int b, int h) {
    std::vector<double> G(c.Tn);
    double a = 0;
    for (int t = 0; t < c.Tn; ++t) G[t] = a += c.g[c.row(b, t, h)];
    return G;
}

static double dot(const double* a, const double* b, int n) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

// w_ᵀ S x for S [Dv][Dk] (w of Dv, x of Dk).
static double bilinear(const double* S, const double* w, const double* x, int Dv, int Dk) {
    double s = 0;
    for (int i = 0; i < Dv; ++i) s += w[i] * dot(S + (size_t)i * Dk, x, Dk);
    return s;
}

// The reference dg [B,T,H]: the straddling pairs, S_0's terms (it enters every y_t with e^(G_t),
// so every i ≤ t) and S̄_T's (⟨S̄_T, S_T⟩: the tokens s < i ≤ T − 1 and S_0 for every i).
static std::vector<double> reference(const Case& c) {
    std::vector<double> dg((size_t)c.B * c.Tn * c.H, 0.0);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h) {
            const auto G = cumsum(c, b, h);
            const size_t sh = ((size_t)b * c.H + h) * c.Dv * c.Dk;
            const double* S0 = &c.S0[sh];
            const double* Sb = &c.Sb[sh];
            for (int i = 0; i < c.Tn; ++i) {
                double x = 0;
                for (int t = i; t < c.Tn; ++t) {
                    const ll rt = c.row(b, t, h);
                    for (int s = 0; s < i; ++s) {
                        const ll rs = c.row(b, s, h);
                        x += c.sigma * exp(G[t] - G[s]) * dot(&c.q[rt * c.Dk], &c.k[rs * c.Dk], c.Dk) *
                             dot(&c.dy[rt * c.Dv], &c.v[rs * c.Dv], c.Dv);
                    }
                    x += c.sigma * exp(G[t]) * bilinear(S0, &c.dy[rt * c.Dv], &c.q[rt * c.Dk], c.Dv, c.Dk);
                }
                for (int s = 0; s < i; ++s) {
                    const ll rs = c.row(b, s, h);
                    x += exp(G[c.Tn - 1] - G[s]) * bilinear(Sb, &c.v[rs * c.Dv], &c.k[rs * c.Dk], c.Dv, c.Dk);
                }
                x += exp(G[c.Tn - 1]) * dot(Sb, S0, c.Dv * c.Dk);
                dg[c.row(b, i, h)] = x;
            }
        }
    return dg;
}

// The kernel's inputs from their definitions, as T.
template <typename T> struct Inputs {
    std::vector<T> q, dq, k, dk, g, hq, hk, df, ft;
    int NC;
};

template <typename T> static Inputs<T> inputs(const Case& c) {
    const int NC = (c.Tn + c.C - 1) / c.C, DD = c.Dv * c.Dk;
    const size_t rows = (size_t)c.B * c.Tn * c.H;
    std::vector<double> dq(rows * c.Dk, 0.0), dk(rows * c.Dk, 0.0);
    std::vector<double> hq((size_t)c.B * c.H * NC * DD), hk(hq.size()), ft((size_t)c.B * c.H * DD);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h) {
            const auto G = cumsum(c, b, h);
            auto Gm = [&](int t) { return t < 0 ? 0.0 : G[std::min(t, c.Tn - 1)]; };
            const size_t sh = ((size_t)b * c.H + h) * DD;
            for (int t = 0; t < c.Tn; ++t) {
                const ll rt = c.row(b, t, h);
                for (int d = 0; d < c.Dk; ++d) {
                    double a = 0, z = 0;
                    for (int s = 0; s <= t; ++s) {
                        const ll rs = c.row(b, s, h);
                        a += c.sigma * exp(G[t] - G[s]) * dot(&c.dy[rt * c.Dv], &c.v[rs * c.Dv], c.Dv) * c.k[rs * c.Dk + d];
                    }
                    for (int i = 0; i < c.Dv; ++i) a += c.sigma * exp(G[t]) * c.S0[sh + (size_t)i * c.Dk + d] * c.dy[rt * c.Dv + i];
                    for (int s = t; s < c.Tn; ++s) {
                        const ll rs = c.row(b, s, h);
                        z += c.sigma * exp(G[s] - G[t]) * dot(&c.v[rt * c.Dv], &c.dy[rs * c.Dv], c.Dv) * c.q[rs * c.Dk + d];
                    }
                    for (int i = 0; i < c.Dv; ++i)
                        z += exp(G[c.Tn - 1] - G[t]) * c.Sb[sh + (size_t)i * c.Dk + d] * c.v[rt * c.Dv + i];
                    dq[rt * c.Dk + d] = a, dk[rt * c.Dk + d] = z;
                }
            }
            // hq[m] = S_{mC−1}; hk[NC − m] = Σ_{t ≥ mC} e^(G_t − G_{mC}) σ dy_t q_tᵀ + e^(G_{T−1} − G_{mC}) S̄_T.
            for (int m = 0; m < NC; ++m)
                for (int i = 0; i < c.Dv; ++i)
                    for (int d = 0; d < c.Dk; ++d) {
                        const int bnd = m * c.C;
                        double a = exp(Gm(bnd - 1)) * c.S0[sh + (size_t)i * c.Dk + d];
                        for (int s = 0; s < bnd; ++s) {
                            const ll rs = c.row(b, s, h);
                            a += exp(Gm(bnd - 1) - G[s]) * c.v[rs * c.Dv + i] * c.k[rs * c.Dk + d];
                        }
                        double z = exp(G[c.Tn - 1] - Gm(bnd)) * c.Sb[sh + (size_t)i * c.Dk + d];
                        for (int t = bnd; t < c.Tn; ++t) {
                            const ll rt = c.row(b, t, h);
                            z += exp(G[t] - Gm(bnd)) * c.sigma * c.dy[rt * c.Dv + i] * c.q[rt * c.Dk + d];
                        }
                        const size_t e = (((size_t)b * c.H + h) * NC) * DD + (size_t)i * c.Dk + d;
                        hq[e + (size_t)m * DD] = a;
                        if (m > 0) hk[e + (size_t)(NC - m) * DD] = z;
                    }
            // S_T transposed, [Dk][Dv].
            for (int i = 0; i < c.Dv; ++i)
                for (int d = 0; d < c.Dk; ++d) {
                    double a = exp(G[c.Tn - 1]) * c.S0[sh + (size_t)i * c.Dk + d];
                    for (int s = 0; s < c.Tn; ++s) {
                        const ll rs = c.row(b, s, h);
                        a += exp(G[c.Tn - 1] - G[s]) * c.v[rs * c.Dv + i] * c.k[rs * c.Dk + d];
                    }
                    ft[sh + (size_t)d * c.Dv + i] = a;
                }
        }
    auto as = [](const std::vector<double>& a) { return std::vector<T>(a.begin(), a.end()); };
    return {as(c.q), as(dq), as(c.k), as(dk), as(c.g), as(hq), as(hk), as(c.Sb), as(ft), NC};
}

// max |got − want| / max(1, max |want|).
template <typename T> static double rel_err(const std::vector<T>& got, const std::vector<double>& want) {
    double e = 0, m = 1;
    for (size_t i = 0; i < want.size(); ++i) {
        e = std::max(e, std::fabs((double)got[i] - want[i]));
        m = std::max(m, std::fabs(want[i]));
    }
    return e / m;
}

template <typename T> static void run_dg(const Case& c, const char* name, double tol) {
    auto in = inputs<T>(c);
    std::vector<T> dg((size_t)c.B * c.Tn * c.H, (T)NAN);
    const int has_tail = c.df;
    launch(in.NC, c.B * c.H, [&] {
        llb_dg_chunk<T, T>(in.q.data(), in.dq.data(), in.k.data(), in.dk.data(), in.g.data(), in.hq.data(),
                        in.hk.data(), in.df.data(), in.ft.data(), has_tail, dg.data(), c.Tn, c.H, c.Dk, c.Dv, c.C,
                        in.NC);
    });
    char what[160];
    std::snprintf(what, sizeof what, "llb_dg_chunk %s B%d T%d H%d Dk%d Dv%d C%d S0 %d S̄T %d", name, c.B, c.Tn, c.H,
                  c.Dk, c.Dv, c.C, c.s0, c.df);
    check(what, rel_err(dg, reference(c)), tol);
}

// The lifts' decay gradient, llb_dg_dot then the tiled suffix scan (llb_dg_tile, llb_dg_scan,
// llb_dg_out), against dg_i = Σ_{t ≥ i} (q_t·dq_t − k_t·dk_t) in f64 loops (dq, dk any values here).
static void run_dg_suffix(int B, int Tn, int H, int Dk, int L) {
    const size_t rows = (size_t)B * Tn * H;
    std::mt19937 rng(5u + Tn);
    std::normal_distribution<double> n(0.0, 1.0);
    std::vector<double> q(rows * Dk), dq(rows * Dk), k(rows * Dk), dk(rows * Dk);
    for (auto* a : {&q, &dq, &k, &dk})
        for (auto& x : *a) x = n(rng);
    const int NT = (Tn + L - 1) / L, BH = B * H;
    std::vector<double> a((size_t)BH * Tn), s((size_t)BH * NT), dg(rows, NAN), want(rows);
    launch(4, 1, [&] { llb_dg_dot<double>(q.data(), dq.data(), k.data(), dk.data(), a.data(), B, Tn, H, Dk); });
    launch(1, 1, [&] { llb_dg_tile_sums(a.data(), s.data(), BH, Tn, L, NT); });
    launch(1, 1, [&] { llb_dg_scan_tiles(s.data(), BH, NT); });
    launch(1, 1, [&] { llb_dg_out<double>(a.data(), s.data(), dg.data(), BH, Tn, H, L, NT); });
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
            double acc = 0;
            for (int t = Tn - 1; t >= 0; --t) {
                const size_t r = ((size_t)b * Tn + t) * H + h;
                acc += dot(&q[r * Dk], &dq[r * Dk], Dk) - dot(&k[r * Dk], &dk[r * Dk], Dk);
                want[r] = acc;
            }
        }
    char what[120];
    std::snprintf(what, sizeof what, "llb_dg_dot + tiled suffix scan B%d T%d H%d Dk%d L%d", B, Tn, H, Dk, L);
    check(what, rel_err(dg, want), 1e-12);
}

// The bf16 mode's llb_dg_chunk (bf16 q, dq, k, dk; f32 g and states) against the f64 kernel on the
// same bf16 values widened: the same sums, so they differ by the f32 states and g only.
static void run_dg_bf16(const Case& c) {
    auto in = inputs<double>(c);
    auto round = [](std::vector<double>& a, std::vector<mx_bf16>& b) {
        b.resize(a.size());
        for (size_t i = 0; i < a.size(); ++i) a[i] = mx_bf16_f32(b[i] = mx_f32_bf16((float)a[i]));
    };
    std::vector<mx_bf16> qb, dqb, kb, dkb;
    round(in.q, qb), round(in.dq, dqb), round(in.k, kb), round(in.dk, dkb);
    auto f32 = [](const std::vector<double>& a) { return std::vector<float>(a.begin(), a.end()); };
    const auto [g, hq, hk, df, ft] = std::tuple{f32(in.g), f32(in.hq), f32(in.hk), f32(in.df), f32(in.ft)};
    const size_t n = (size_t)c.B * c.Tn * c.H;
    std::vector<double> want(n, NAN);
    std::vector<float> got(n, NAN);
    const int has_tail = c.df;
    launch(in.NC, c.B * c.H, [&] {
        llb_dg_chunk<double, double>(in.q.data(), in.dq.data(), in.k.data(), in.dk.data(), in.g.data(),
                                     in.hq.data(), in.hk.data(), in.df.data(), in.ft.data(), has_tail, want.data(),
                                     c.Tn, c.H, c.Dk, c.Dv, c.C, in.NC);
    });
    launch(in.NC, c.B * c.H, [&] {
        llb_dg_chunk<mx_bf16, float>(qb.data(), dqb.data(), kb.data(), dkb.data(), g.data(), hq.data(), hk.data(),
                                     df.data(), ft.data(), has_tail, got.data(), c.Tn, c.H, c.Dk, c.Dv, c.C,
                                     in.NC);
    });
    char what[160];
    std::snprintf(what, sizeof what, "llb_dg_chunk bf16 B%d T%d H%d Dk%d Dv%d C%d S0 %d S̄T %d", c.B, c.Tn, c.H,
                  c.Dk, c.Dv, c.C, c.s0, c.df);
    check(what, rel_err(got, want), 2e-5);
}

// Whether llb_reverse moves these rows as 16-byte vectors (its condition).
template <typename T> static bool vectors(const T* x, const T* out, int hd) {
    return hd % (16 / sizeof(T)) == 0 && ((unsigned long long)x | (unsigned long long)out) % 16 == 0;
}

// llb_reverse on bf16 rows: a copy at c = 1, a scaling by 1/2 (exact in bf16), and σ = 0.7 rounded
// to bf16 from f32 as the kernel does.
static void run_reverse_bf16(int B, int Tn, int H, int D, int C, int shift = 0) {
    const int Tp = (Tn + C - 1) / C * C;
    // `shift` entries into an aligned buffer (shift 1: a source 2 bytes off 16-byte alignment,
    // which takes the entry-by-entry path whatever the row's length).
    std::vector<mx_bf16> buf((size_t)B * Tn * H * D + 8);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = mx_f32_bf16(0.37f * (float)i - 3.0f);
    const mx_bf16* x = buf.data() + shift;
    for (auto [M, N, c] : {std::tuple{Tp, Tp, 1.0f}, std::tuple{Tn, Tn, 0.5f}, std::tuple{Tp, Tp, 0.7f}}) {
        std::vector<mx_bf16> out((size_t)B * N * H * D, 0xffffu);
        launch(B * N, 1, [&] { llb_reverse<mx_bf16, float>(x, out.data(), B, Tn, H, D, M, N, c); });
        int bad = 0;
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < N; ++t)
                for (int e = 0; e < H * D; ++e) {
                    const int src = M - 1 - t;
                    const mx_bf16 want =
                        src < Tn ? (c == 1.0f ? x[((size_t)b * Tn + src) * H * D + e]
                                              : mx_f32_bf16(c * mx_bf16_f32(x[((size_t)b * Tn + src) * H * D + e])))
                                 : (mx_bf16)0;
                    bad += out[((size_t)b * N + t) * H * D + e] != want;
                }
        char what[120];
        std::snprintf(what, sizeof what, "llb_reverse bf16 B%d T%d H%d D%d M%d N%d c %.1f%s (entries wrong)", B, Tn,
                      H, D, M, N, c, vectors(x, out.data(), H * D) ? ", vectors" : "");
        check(what, bad, 0.0);
    }
}

// llb_reverse and llb_reverse_g against their definitions at (M, N) = (T, T), (T', T') and (T', T).
static void run_reverse(int B, int Tn, int H, int D, int C) {
    const int Tp = (Tn + C - 1) / C * C;
    std::vector<float> x((size_t)B * Tn * H * D), g((size_t)B * Tn * H);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (float)i + 0.5f;
    for (size_t i = 0; i < g.size(); ++i) g[i] = -(float)i - 1.0f;
    for (auto [M, N, c] : {std::tuple{Tn, Tn, 2.0f}, std::tuple{Tp, Tp, 1.0f}, std::tuple{Tp, Tn, 0.5f}}) {
        std::vector<float> out((size_t)B * N * H * D, NAN), go((size_t)B * N * H, NAN);
        launch(B * N, 1, [&] { llb_reverse<float, float>(x.data(), out.data(), B, Tn, H, D, M, N, c); });
        double err = 0;
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < N; ++t)
                for (int e = 0; e < H * D; ++e) {
                    const int src = M - 1 - t;
                    const double want = src < Tn ? c * x[((size_t)b * Tn + src) * H * D + e] : 0.0;
                    err = std::max(err, std::fabs(out[((size_t)b * N + t) * H * D + e] - want));
                }
        char what[120];
        std::snprintf(what, sizeof what, "llb_reverse B%d T%d H%d D%d M%d N%d%s", B, Tn, H, D, M, N,
                      vectors(x.data(), out.data(), H * D) ? ", vectors" : "");
        check(what, err, 0.0);
        if (M == N) {
            launch(1, 1, [&] { llb_reverse_g<float>(g.data(), go.data(), B, Tn, H, N); });
            double e2 = 0;
            for (int b = 0; b < B; ++b)
                for (int j = 0; j < N; ++j)
                    for (int h = 0; h < H; ++h) {
                        const double want = j == 0 || N - j >= Tn ? 0.0 : g[((size_t)b * Tn + N - j) * H + h];
                        e2 = std::max(e2, std::fabs(go[((size_t)b * N + j) * H + h] - want));
                    }
            std::snprintf(what, sizeof what, "llb_reverse_g B%d T%d H%d N%d", B, Tn, H, N);
            check(what, e2, 0.0);
        }
    }
}

int main() {
    // Chunks of 8 and 16 tokens, T past a whole number of chunks, one chunk, exactly two; with and
    // without the states.
    for (auto [B, Tn, H, Dk, Dv, C, s0, df] :
         {std::tuple{1, 37, 2, 5, 3, 8, false, false}, std::tuple{2, 37, 1, 4, 6, 8, true, true},
          std::tuple{1, 32, 1, 3, 2, 16, true, false}, std::tuple{1, 7, 1, 3, 4, 8, false, true},
          std::tuple{1, 70, 1, 33, 9, 16, true, true}}) {
        const Case c = make(B, Tn, H, Dk, Dv, C, s0, df, 11u + Tn + Dk);
        run_dg<double>(c, "f64", 1e-12);
        run_dg<float>(c, "f32", 2e-5);
        run_dg_bf16(c);
    }
    run_dg_suffix(2, 37, 3, 40, 8);
    run_dg_suffix(1, 130, 1, 5, 12);
    // Rows of 15 and 8 entries (entry by entry), 12 f32 and 16 bf16 entries (16-byte vectors).
    run_reverse(2, 37, 3, 5, 8);
    run_reverse(1, 16, 2, 4, 8);
    run_reverse(2, 21, 3, 4, 8);
    run_reverse_bf16(2, 37, 3, 5, 8);
    run_reverse_bf16(2, 21, 2, 8, 8);
    run_reverse_bf16(2, 21, 2, 8, 8, 1);
    return harness_end();
}
