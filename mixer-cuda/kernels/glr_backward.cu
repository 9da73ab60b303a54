// The GLR's backward (vector–Jacobian product) of the fast form, docs/gradients.md, for
//   y[t] = α[t,0]·x[t] + Σ_{k: f(k) ≤ t} ( α[t,k+1]·x[d_k(t)] + β[t,k]·y[d_k(t)] )   per (b, c)
// (glr_dep and the pattern table: glr_common.cuh). With ȳ the output's cotangent, the total
// cotangent of y[t] gathers the reads of y[t] by later tokens:
//   g[t] = ȳ[t] + Σ_{t' > t, k: d_k(t') = t} β[t',k]·g[t'],
// and then
//   ᾱ[t,0] = g[t]·x[t],  ᾱ[t,k+1] = g[t]·x[d_k(t)],  β̄[t,k] = g[t]·y[d_k(t)]  (0 for inactive taps),
//   x̄[t] = α[t,0]·g[t] + Σ_{t' > t, k: d_k(t') = t} α[t',k+1]·g[t'].
// g comes from one of two paths (the host picks): for translation-invariant patterns the reverse
// recurrence is a forward recurrence in reversed time, which the forward's kernel compiled with
// GLR_REV (glr.cu) runs, and glrb_grads reads g reversed and gathers x̄'s taps on A; for
// cache-efficient lattices:
//  * glrb_reverse, one thread per (b, c) (consecutive threads on consecutive channels, so every
//    access of a warp is one coalesced row): tokens from T − 1 down to 0; when token t is reached
//    every token that reads it (t' > t) has been processed, so g[t] is final, and the thread
//    scatters β[t,k]·g[t] into g[d_k(t)] (and, for on = a | both, α[t,k+1]·g[t] into the
//    accumulator of x̄[d_k(t)]). The scatter targets lie before t in the thread's own column: a
//    plain read-modify-write by one thread, in a fixed order (t descending, k ascending), so
//    there is no race and the result is the same bits every run. Scatters to the last GLRB_W
//    positions add into a ring in shared memory; farther ones are read-modify-writes of global
//    memory, GLRB_BATCH taps at a time with all their loads in flight before the near work and
//    the first store; two taps of one token may share a position (cache-efficient lattices), so
//    a tap takes the value just written by an earlier tap of its batch at the same position
//    instead of its own load. g lives in global scratch [B,T,C] (initialised to ȳ by the thread,
//    column by column); the x̄ accumulator is the d_x output itself, zeroed first.
//  * glrb_grads, one thread per (b, t, c): ᾱ, β̄ and x̄[t] (accumulator + α[t,0]·g[t]) from g, x
//    and the recomputed y, every element written once.
// Layouts: x, y, ȳ, g, x̄ [B,T,C]; α, ᾱ [B,T,NA,C] (NA = 1 or K+1); β, β̄ [B,T,K,C].

#ifndef GLRB_BATCH
#define GLRB_BATCH 8
#endif
// Threads per block of glrb_reverse (the host's launch) and rows of its shared-memory rings (a power
// of two, at least 2).
#ifndef GLRB_NT
#define GLRB_NT 64
#endif
#ifndef GLRB_W
#define GLRB_W 32
#endif
#if GLRB_W < 2 || (GLRB_W & (GLRB_W - 1)) != 0
#error "GLRB_W must be a power of two, at least 2"
#endif

// Scatters w[u]·gt into a[row + d[u]] (channel c) for the active taps u of one batch (d[u] ≥ 0),
// in tap order; v[u] holds the value of a at d[u] loaded before the batch's first store, replaced by
// the value an earlier tap of the batch wrote at the same position.
template <typename T>
__device__ __forceinline__ void glrb_scatter(T* a, const int (&d)[GLRB_BATCH], const T (&w)[GLRB_BATCH],
                                             T (&v)[GLRB_BATCH], T gt, long long row, int C, int c) {
#pragma unroll
    for (int u = 0; u < GLRB_BATCH; ++u) {
        if (d[u] < 0) continue;
#pragma unroll
        for (int j = 0; j < u; ++j)
            if (d[j] == d[u]) v[u] = v[j];
        v[u] += w[u] * gt;
        a[(row + d[u]) * C + c] = v[u];
    }
}

// The reverse sweep: g (has_b: the total cotangents, from ȳ) and, when scatter_x, the scattered part
// of x̄ (Σ α[t',k+1]·g[t'] over the readers t' of each position). Without has_b, g is ȳ (read only).
// A scatter from token t to a position d ≥ t − GLRB_W ("near") goes to a ring of GLRB_W rows in
// shared memory (row d mod GLRB_W, the thread's own column); one to d < t − GLRB_W ("far") is a
// read-modify-write of global memory, whose loads are issued before the near work. Position p then
// holds its far part in global memory, final once token p + GLRB_W is done, and its near part in the
// ring, final once token p + 1 is done: at token t, g[t] = global + ring (the row is then zeroed for
// position t − GLRB_W) and is written back as the final g[t]; the global part of token t − 1 is loaded
// one token ahead. Block: GLRB_NT threads (the launch's block size).
template <typename T>
__device__ void glrb_reverse(const T* __restrict__ dy, const T* __restrict__ alpha, const T* __restrict__ beta,
                             const long long* __restrict__ off, const long long* __restrict__ stride, T* g, T* dx,
                             int B, int Tn, int C, int K, int NA, int has_b, int scatter_x, int ce) {
    __shared__ __align__(16) unsigned char glrb_smem[2 * GLRB_W * GLRB_NT * sizeof(T)];
    const long long i = gtid();
    if (i >= (long long)B * C) return;
    const int b = (int)(i / C), c = (int)(i % C);
    const long long row = (long long)b * Tn;
    // The thread's two ring columns (g's, x̄'s): row p at rg[(p & (W − 1)) · NT].
    T* rg = (T*)glrb_smem + threadIdx.x;
    T* rx = rg + GLRB_W * GLRB_NT;
    for (int p = 0; p < GLRB_W; ++p) rg[p * GLRB_NT] = rx[p * GLRB_NT] = (T)0;
    for (int t = 0; t < Tn; ++t) {
        const long long r = (row + t) * C + c;
        if (has_b) g[r] = dy[r];
        if (scatter_x) dx[r] = (T)0;
    }
    // The global parts of token t (gf, xf), loaded one token ahead. g is written by this kernel:
    // never read through the read-only path that dy may take.
    const long long last = (row + Tn - 1) * C + c;
    T gf = has_b ? g[last] : dy[last], xf = scatter_x ? dx[last] : (T)0;
    for (int t = Tn - 1; t >= 0; --t) {
        const long long bt = row + t;
        const int rt = (t & (GLRB_W - 1)) * GLRB_NT;
        T gt = gf;
        if (has_b) {
            gt += rg[rt];
            rg[rt] = (T)0;
            g[bt * C + c] = gt;
        }
        if (scatter_x) {
            dx[bt * C + c] = xf + rx[rt];
            rx[rt] = (T)0;
        }
        if (t > 0) {
            // Final: far scatters into t − 1 come from tokens ≥ t − 1 + GLRB_W, all done.
            gf = has_b ? g[(bt - 1) * C + c] : dy[(bt - 1) * C + c];
            if (scatter_x) xf = dx[(bt - 1) * C + c];
        }
        // Active taps are a prefix (f is increasing).
        for (int k0 = 0; k0 < K && off[k0] <= t; k0 += GLRB_BATCH) {
            int d[GLRB_BATCH], df[GLRB_BATCH];
#pragma unroll
            for (int u = 0; u < GLRB_BATCH; ++u) {
                const int k = k0 + u;
                d[u] = k < K && off[k] <= t ? glr_dep(t, (int)off[k], (int)stride[k], ce) : -1;
                df[u] = d[u] >= 0 && d[u] < t - GLRB_W ? d[u] : -1;
            }
            T wg[GLRB_BATCH], vg[GLRB_BATCH], wx[GLRB_BATCH], vx[GLRB_BATCH];
#pragma unroll
            for (int u = 0; u < GLRB_BATCH; ++u) {
                wg[u] = has_b && d[u] >= 0 ? beta[(bt * K + k0 + u) * C + c] : (T)0;
                vg[u] = has_b && df[u] >= 0 ? g[(row + df[u]) * C + c] : (T)0;
                wx[u] = scatter_x && d[u] >= 0 ? alpha[(bt * NA + k0 + u + 1) * C + c] : (T)0;
                vx[u] = scatter_x && df[u] >= 0 ? dx[(row + df[u]) * C + c] : (T)0;
            }
            // Near taps in the ring, in tap order (taps sharing a position add up in order).
#pragma unroll
            for (int u = 0; u < GLRB_BATCH; ++u) {
                if (d[u] < 0 || df[u] >= 0) continue;
                const int rd = (d[u] & (GLRB_W - 1)) * GLRB_NT;
                if (has_b) rg[rd] += wg[u] * gt;
                if (scatter_x) rx[rd] += wx[u] * gt;
            }
            if (has_b) glrb_scatter(g, df, wg, vg, gt, row, C, c);
            if (scatter_x) glrb_scatter(dx, df, wx, vx, gt, row, C, c);
        }
    }
}

// The gradients of one (b, t, c) from its final g[t] (rev: g is stored reversed in time, g[t] at row
// Tn − 1 − t, as the forward's kernel compiled with GLR_REV leaves it): x̄[t] = α[t,0]·g[t] + the part
// of the taps on A when has_a — gathered here (gather: Σ_k α[t + f(k), k+1]·g[t + f(k)] over the
// readers inside the sequence, translation-invariant patterns only) or the scattered part glrb_reverse
// left in dx —, ᾱ[t,·] and β̄[t,·] (0 at inactive taps). want_*: which outputs to write (pointers of
// the others are not touched).
template <typename T>
__device__ void glrb_grads(const T* __restrict__ x, const T* __restrict__ alpha, const T* __restrict__ y,
                           const T* __restrict__ g, const long long* __restrict__ off,
                           const long long* __restrict__ stride, T* dx, T* dalpha, T* dbeta, int B, int Tn, int C,
                           int K, int NA, int has_a, int has_b, int want_x, int want_a, int want_b, int ce, int rev,
                           int gather) {
    const long long i = gtid();
    if (i >= (long long)B * Tn * C) return;
    const int c = (int)(i % C);
    const long long bt = i / C;
    const int t = (int)(bt % Tn);
    const long long row = bt - t;
    auto g_at = [&](int u) { return g[(row + (rev ? Tn - 1 - u : u)) * C + c]; };
    const T gt = g_at(t);
    if (want_x) {
        T acc = (T)0;
        if (has_a && gather) {
            for (int k = 0; k < NA - 1; ++k) {
                const long long r = t + off[k];  // the reader of position t through tap k
                if (r < Tn) acc += alpha[((row + r) * NA + k + 1) * C + c] * g_at((int)r);
            }
        } else if (has_a) {
            acc = dx[i];
        }
        dx[i] = acc + alpha[bt * NA * C + c] * gt;
    }
    if (want_a) {
        dalpha[bt * NA * C + c] = gt * x[i];
        if (has_a)
            for (int k = 0; k < NA - 1; ++k) {
                const bool act = off[k] <= t;
                const int d = act ? glr_dep(t, (int)off[k], (int)stride[k], ce) : 0;
                dalpha[(bt * NA + k + 1) * C + c] = act ? gt * x[(row + d) * C + c] : (T)0;
            }
    }
    if (want_b && has_b)
        for (int k = 0; k < K; ++k) {
            const bool act = off[k] <= t;
            const int d = act ? glr_dep(t, (int)off[k], (int)stride[k], ce) : 0;
            dbeta[(bt * K + k) * C + c] = act ? gt * y[(row + d) * C + c] : (T)0;
        }
}

#define GLRB_EXPORT(T, S)                                                                                        \
    extern "C" __global__ void glrb_reverse_##S(const T* dy, const T* alpha, const T* beta, const long long* off,  \
                                                const long long* stride, T* g, T* dx, int B, int Tn, int C, int K, \
                                                int NA, int has_b, int scatter_x, int ce) {                        \
        glrb_reverse<T>(dy, alpha, beta, off, stride, g, dx, B, Tn, C, K, NA, has_b, scatter_x, ce);             \
    }                                                                                                            \
    extern "C" __global__ void glrb_grads_##S(const T* x, const T* alpha, const T* y, const T* g,                 \
                                              const long long* off, const long long* stride, T* dx, T* dalpha,    \
                                              T* dbeta, int B, int Tn, int C, int K, int NA, int has_a, int has_b, \
                                              int want_x, int want_a, int want_b, int ce, int rev, int gather) {  \
        glrb_grads<T>(x, alpha, y, g, off, stride, dx, dalpha, dbeta, B, Tn, C, K, NA, has_a, has_b, want_x,    \
                      want_a, want_b, ce, rev, gather);                                                           \
    }

GLRB_EXPORT(float, f32)
GLRB_EXPORT(double, f64)
