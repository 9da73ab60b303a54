// CPU harness for mixer-cuda/kernels/glr_backward.cu: each CUDA thread is one loop iteration
// (neither kernel has a __syncthreads; a thread of glrb_reverse touches only its own column of g,
// x̄ and of the shared-memory rings, which are one static array here), checked
// against a dense reference: g = (I − B)^{-T} ȳ by back substitution over the dense T×T B,
// (and, for translation-invariant patterns, the path through the reversed forward recurrence, as a
// plain loop, and glrb_grads reading g reversed and gathering x̄),
// x̄ = Aᵀ g, ᾱ/β̄ from g, x, y; and central finite differences of the forward for a few entries.
// Run from the repository root: g++ -std=c++17 -O1 bench/gpu/glr_backward_harness.cpp -o /tmp/glr_harness && /tmp/glr_harness
// (no GPU, no CUDA headers: the kernel file is compiled as plain C++; it exits non-zero on a failure).
#include <cstdio>
#include <cmath>
#include <vector>
#include <random>
#include <string>
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
static long long g_tid;
inline long long gtid() { return g_tid; }
static struct { int x; } threadIdx;
#include "../../mixer-cuda/kernels/glr_common.cuh"
#include "../../mixer-cuda/kernels/glr_backward.cu"
using namespace std;
typedef long long ll;
struct Pat { vector<ll> f, a; };
Pat make(const string& name, int T, int order) {
    Pat p; ll fa = 1, fb = 2;
    for (int k = 0;; ++k) {
        ll f;
        if (name == "pow2") f = 1LL << k; else if (name == "sq1") f = (ll)k * k + 1;
        else if (name == "linear") f = k + 1; else { f = fa; ll c = fa + fb; fa = fb; fb = c; }
        if (f > T - 1 || (order > 0 && k >= order)) break;
        p.f.push_back(f);
    }
    ll a = 1;
    for (size_t k = 0; k < p.f.size(); ++k) {
        if (k > 0) { ll gap = max(1LL, p.f[k] - p.f[k - 1]); a = a * ((gap + a - 1) / a); }
        p.a.push_back(a);
    }
    return p;
}
int main() {
    mt19937_64 rng(1);
    uniform_real_distribution<double> U(-1, 1);
    struct Case { const char* pat; int order, ce, on, T, B, C; };  // on: 0 b, 1 a, 2 both
    vector<Case> cases;
    for (const char* pat : {"pow2", "sq1", "fib", "linear"})
        for (int ce = 0; ce < 2; ++ce)
            for (int on = 0; on < 3; ++on)
                for (int T : {1, 2, 3, 18, 37, 70})
                    cases.push_back({pat, string(pat) == "linear" ? 3 : 0, ce, on, T, 2, 3});
    cases.push_back({"linear", 0, 0, 2, 40, 1, 2});  // dense: K = T − 1, more than one batch
    cases.push_back({"sq1", 0, 1, 0, 300, 1, 2});
    double worst = 0, worstfd = 0;
    int nfail = 0;
    for (auto& cs : cases) {
        const int T = cs.T, B = cs.B, C = cs.C;
        Pat p = make(cs.pat, T, cs.order);
        const int K = p.f.size(), has_a = cs.on >= 1, has_b = cs.on != 1, NA = has_a ? K + 1 : 1, ce = cs.ce;
        if (ce && p.f.size() && p.f[0] != 1) continue;
        vector<double> x(B * T * C), al(B * T * NA * C), be(B * T * max(K, 0) * C), dy(B * T * C);
        for (auto& v : x) v = U(rng);
        for (auto& v : al) v = U(rng);
        for (auto& v : be) v = U(rng) * 0.9 / max(K, 1);
        for (auto& v : dy) v = U(rng);
        auto dep = [&](int t, int k) { return glr_dep(t, (int)p.f[k], (int)p.a[k], ce); };
        auto forward = [&](const vector<double>& x_, const vector<double>& al_, const vector<double>& be_) {
            vector<double> y(B * T * C);
            for (int b = 0; b < B; ++b) for (int c = 0; c < C; ++c) for (int t = 0; t < T; ++t) {
                ll bt = (ll)b * T + t;
                double acc = al_[bt * NA * C + c] * x_[bt * C + c];
                for (int k = 0; k < K && p.f[k] <= t; ++k) {
                    int d = dep(t, k);
                    if (has_a) acc += al_[(bt * NA + k + 1) * C + c] * x_[((ll)b * T + d) * C + c];
                    if (has_b) acc += be_[(bt * K + k) * C + c] * y[((ll)b * T + d) * C + c];
                }
                y[bt * C + c] = acc;
            }
            return y;
        };
        vector<double> y = forward(x, al, be);
        // Kernels.
        vector<double> g(B * T * C), dx(B * T * C), da(B * T * NA * C), db(max(1, B * T * K * C));
        const vector<long long> off(p.f.begin(), p.f.end()), str(p.a.begin(), p.a.end());
        for (g_tid = 0; g_tid < (ll)B * C + 5; ++g_tid)
            threadIdx.x = (int)(g_tid % GLRB_NT), glrb_reverse<double>(dy.data(), al.data(), be.data(), off.data(), str.data(), g.data(), dx.data(), B, T, C,
                                 K, NA, has_b, has_a, ce);
        const double* gp = has_b ? g.data() : dy.data();
        for (g_tid = 0; g_tid < (ll)B * T * C + 5; ++g_tid)
            glrb_grads<double>(x.data(), al.data(), y.data(), gp, off.data(), str.data(), dx.data(), da.data(), db.data(),
                               B, T, C, K, NA, has_a, has_b, 1, 1, 1, ce, 0, 0);
        // The translation-invariant path: the forward recurrence as glr.cu computes it with GLR_REV
        // (here a plain loop: token s takes ȳ[T − 1 − s] and tap k's β of token T − 1 − s + f(k)),
        // then glrb_grads reading g reversed and gathering x̄'s taps on A.
        vector<double> dx2(B * T * C), da2(B * T * NA * C), db2(max(1, B * T * K * C));
        if (!ce) {
            vector<double> h(B * T * C);
            if (has_b)
                for (int b = 0; b < B; ++b) for (int c = 0; c < C; ++c) for (int s = 0; s < T; ++s) {
                    const ll row = (ll)b * T, t = T - 1 - s;
                    double acc = dy[(row + t) * C + c];
                    for (int k = 0; k < K && p.f[k] <= s; ++k)
                        acc += be[((row + t + p.f[k]) * K + k) * C + c] * h[(row + s - p.f[k]) * C + c];
                    h[(row + s) * C + c] = acc;
                }
            const double* gp2 = has_b ? h.data() : dy.data();
            for (g_tid = 0; g_tid < (ll)B * T * C + 5; ++g_tid)
                glrb_grads<double>(x.data(), al.data(), y.data(), gp2, off.data(), str.data(), dx2.data(), da2.data(),
                                   db2.data(), B, T, C, K, NA, has_a, has_b, 1, 1, 1, ce, has_b, 1);
        }
        // Dense reference per (b, c).
        vector<double> rdx(B * T * C), rda(B * T * NA * C, 0), rdb(max(1, B * T * K * C), 0);
        for (int b = 0; b < B; ++b) for (int c = 0; c < C; ++c) {
            vector<double> Am(T * T, 0), Bm(T * T, 0), gg(T);
            for (int t = 0; t < T; ++t) {
                ll bt = (ll)b * T + t;
                Am[t * T + t] += al[bt * NA * C + c];
                for (int k = 0; k < K && p.f[k] <= t; ++k) {
                    int d = dep(t, k);
                    if (has_a) Am[t * T + d] += al[(bt * NA + k + 1) * C + c];
                    if (has_b) Bm[t * T + d] += be[(bt * K + k) * C + c];
                }
            }
            for (int t = T - 1; t >= 0; --t) {  // (I − B)ᵀ g = ȳ: g_t = ȳ_t + Σ_{t'>t} B[t', t] g_t'
                double s = dy[((ll)b * T + t) * C + c];
                for (int u = t + 1; u < T; ++u) s += Bm[u * T + t] * gg[u];
                gg[t] = s;
            }
            for (int s = 0; s < T; ++s) {
                double acc = 0;
                for (int t = s; t < T; ++t) acc += Am[t * T + s] * gg[t];
                rdx[((ll)b * T + s) * C + c] = acc;
            }
            for (int t = 0; t < T; ++t) {
                ll bt = (ll)b * T + t;
                rda[bt * NA * C + c] = gg[t] * x[bt * C + c];
                for (int k = 0; k < K && p.f[k] <= t; ++k) {
                    int d = dep(t, k);
                    if (has_a) rda[(bt * NA + k + 1) * C + c] = gg[t] * x[((ll)b * T + d) * C + c];
                    if (has_b) rdb[(bt * K + k) * C + c] = gg[t] * y[((ll)b * T + d) * C + c];
                }
            }
        }
        auto cmp = [&](const vector<double>& a, const vector<double>& r, size_t n) {
            double e = 0, s = 0;
            for (size_t i = 0; i < n; ++i) e += (a[i] - r[i]) * (a[i] - r[i]), s += r[i] * r[i];
            return sqrt(e / max(s, 1e-300));
        };
        double e1 = cmp(dx, rdx, dx.size()), e2 = cmp(da, rda, da.size()), e3 = has_b ? cmp(db, rdb, B * T * K * C) : 0;
        if (!ce) {  // the translation-invariant path against the same references
            e1 = max(e1, cmp(dx2, rdx, dx.size())), e2 = max(e2, cmp(da2, rda, da.size()));
            if (has_b) e3 = max(e3, cmp(db2, rdb, B * T * K * C));
        }
        // Finite differences of L = Σ ȳ·y for a few entries of each input.
        auto loss = [&](const vector<double>& x_, const vector<double>& al_, const vector<double>& be_) {
            auto yy = forward(x_, al_, be_); double L = 0;
            for (size_t i = 0; i < yy.size(); ++i) L += dy[i] * yy[i];
            return L;
        };
        double efd = 0;
        for (int rep = 0; rep < 6; ++rep) {
            const double h = 1e-5;
            int which = rep % 3;
            if (which == 2 && (!has_b || K == 0)) continue;
            vector<double>* v = which == 0 ? &x : which == 1 ? &al : &be;
            const vector<double>& grad = which == 0 ? dx : which == 1 ? da : db;
            size_t i = rng() % v->size();
            double o = (*v)[i];
            (*v)[i] = o + h; double lp = loss(x, al, be);
            (*v)[i] = o - h; double lm = loss(x, al, be);
            (*v)[i] = o;
            double fd = (lp - lm) / (2 * h);
            efd = max(efd, fabs(fd - grad[i]) / max(1.0, fabs(fd)));
        }
        double e = max(e1, max(e2, e3));
        worst = max(worst, e); worstfd = max(worstfd, efd);
        if (e > 1e-12 || efd > 1e-7) {
            ++nfail;
            printf("FAIL %s order=%d ce=%d on=%d T=%d K=%d: dx %.2e da %.2e db %.2e fd %.2e\n", cs.pat, cs.order, ce, cs.on, T, K, e1, e2, e3, efd);
        }
    }
    printf("%zu cases, %d failures; worst dense rel %.2e, worst fd %.2e\n", cases.size(), nfail, worst, worstfd);
    return nfail != 0;
}
