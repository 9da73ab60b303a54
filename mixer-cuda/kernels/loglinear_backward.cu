// The `fast` backward of the log-linear base mixers (docs/math.md §2.7, docs/gradients.md "GPU"),
// launched from src/loglinear/backward.rs. Tensors are row-major: q, k [B, T, H, Dk], v, dy
// [B, T, H, Dv], g, beta [B, T, H]. Every sum runs in a fixed order (no float atomics), so the
// same inputs give the same bits.
//
// Linear attention and Mamba-2 (transposed operators): the gradients are forward runs on
// reversed sequences, joined by
// - llb_reverse:   out[b, t, h, :] = x[b, T−1−t, h, :];
// - llb_reverse_g: the reversed log-decays g'_0 = 0, g'_j = g_{T−j} (j ≥ 1), so that
//                  G'_{T−1−s} − G'_{T−1−t} = G_t − G_s;
// - llb_dg_*:      dG_t = q_t·dq_t − k_t·dk_t (a warp per token) and dg_i = Σ_{t ≥ i} dG_t
//                  by a tiled suffix scan, dots and sums in f64 (below).
//
// Gated DeltaNet (the recurrent form, rows of the state independent): per row i of S,
//   ŝ_t = e^{g_t} s_{t−1},  u_t = v_t[i] − ŝ_t·k_t,  s_t = ŝ_t + β_t u_t k_t,  y_t[i] = σ s_t·q_t.
// Reverse mode, with ds the cotangent of s_t (from the future), t = T−1 … 0:
//   ds += σ dy_t[i] q_t;                dq_t += σ dy_t[i] s_t;
//   c = ds·k_t;  dβ_t += c u_t;         du = β_t c;  dv_t[i] = du;
//   dk_t += β_t u_t ds − du ŝ_t;        dŝ = ds − du k_t;
//   dg_t += dŝ·ŝ_t;                     ds ← e^{g_t} dŝ  (the cotangent of s_{t−1}).
// - llb_delta_ckpt: the forward sweep, storing each row's state entering every chunk of C tokens
//   (ckpt [B·H, ⌈T/C⌉, Dv, Dk]);
// - llb_delta_bwd: per chunk from the last, each warp (one row) recomputes the chunk's entering
//   states from its checkpoint into shared memory, then runs the reverse recurrence; the block
//   sums its rows' dq, dk, dβ, dg in warp order and writes them as one partial per row block;
// - llb_delta_reduce: sums the row blocks' partials in order into dq, dk, dβ, dg.
// A warp holds a row's Dk entries LLB_KPL to a lane (entry d = lane + 32 j). Computed in T (f32 in
// the tf32 and bf16 modes, whose activations arrive converted to f32).

#ifndef LLB_KPL
#define LLB_KPL 1
#endif

template <typename T> __device__ inline T llb_warp_sum(T x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

template <typename T> __device__ void llb_reverse(const T* x, T* out, int B, int Tn, int H, int D) {
    const long long n = (long long)B * Tn * H * D;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {
        const long long row = e / D;  // (b·T + t)·H + h
        const int d = (int)(e - row * D);
        const int h = (int)(row % H);
        const long long bt = row / H;
        const int t = (int)(bt % Tn);
        const long long b = bt / Tn;
        out[e] = x[((b * Tn + (Tn - 1 - t)) * H + h) * D + d];
    }
}

template <typename T> __device__ void llb_reverse_g(const T* g, T* out, int B, int Tn, int H) {
    const long long n = (long long)B * Tn * H;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {
        const int h = (int)(e % H);
        const long long bt = e / H;
        const int j = (int)(bt % Tn);
        const long long b = bt / Tn;
        out[e] = j == 0 ? T(0) : g[(b * Tn + (Tn - j)) * H + h];
    }
}

// The decay gradient dg_i = Σ_{t ≥ i} dG_t, dG_t = q_t·dq_t − k_t·dk_t, in four token-parallel
// launches, all in f64 and in a fixed order (the same bits every run). The scratch a [B·H, T]
// (f64) holds dG, and s [B·H, NT] the sums of tiles of L tokens (NT = ⌈T/L⌉, L from the host):
// - llb_dg_dot:  a warp per (b, t, h) row, grid-stride: lanes read the row's Dk entries
//                coalesced (d = lane + 32 j), the warp sums them; a[bh, t] = dG_t;
// - llb_dg_tile: a thread per (bh, tile): s[bh, c] = Σ over the tile's tokens, last to first;
// - llb_dg_scan: a thread per bh: s[bh, c] ← Σ_{c' > c} s[bh, c'] (exclusive suffix sums, last
//                tile to first);
// - llb_dg_out:  a thread per (bh, tile): walks its tokens last to first from s[bh, c],
//                dg[b, t, h] = s[bh, c] + Σ_{t ≤ t' < tile end} a[bh, t'] (one rounding to T).
template <typename T>
__device__ void llb_dg_dot(const T* q, const T* dq, const T* k, const T* dk, double* a, int B, int Tn, int H,
                           int Dk) {
    const long long rows = (long long)B * Tn * H;
    const long long warps = (long long)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (long long row = gtid() / 32; row < rows; row += warps) {  // row = (b·T + t)·H + h
        const long long base = row * Dk;
        double x = 0.0;
        for (int d = lane; d < Dk; d += 32)
            x += (double)q[base + d] * (double)dq[base + d] - (double)k[base + d] * (double)dk[base + d];
        x = llb_warp_sum(x);
        if (lane == 0) {
            const int h = (int)(row % H);
            const long long bt = row / H;
            const long long t = bt % Tn, b = bt / Tn;
            a[(b * H + h) * Tn + t] = x;
        }
    }
}

__device__ void llb_dg_tile_sums(const double* a, double* s, int BH, int Tn, int L, int NT) {
    const long long n = (long long)BH * NT;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {  // e = bh·NT + c
        const long long bh = e / NT;
        const int c = (int)(e - bh * NT);
        const int t0 = c * L, t1 = min(Tn, t0 + L);
        double x = 0.0;
        for (int t = t1 - 1; t >= t0; --t) x += a[bh * Tn + t];
        s[e] = x;
    }
}

__device__ void llb_dg_scan_tiles(double* s, int BH, int NT) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long bh = gtid(); bh < BH; bh += stride) {
        double acc = 0.0;
        for (int c = NT - 1; c >= 0; --c) {
            const double x = s[bh * NT + c];
            s[bh * NT + c] = acc;
            acc += x;
        }
    }
}

template <typename T>
__device__ void llb_dg_out(const double* a, const double* s, T* dg, int BH, int Tn, int H, int L, int NT) {
    const long long n = (long long)BH * NT;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {
        const long long bh = e / NT;
        const int c = (int)(e - bh * NT);
        const long long b = bh / H;
        const int h = (int)(bh % H);
        const int t0 = c * L, t1 = min(Tn, t0 + L);
        double acc = s[e];
        for (int t = t1 - 1; t >= t0; --t) {
            acc += a[bh * Tn + t];
            dg[(b * Tn + t) * H + h] = (T)acc;
        }
    }
}

// ---- gated DeltaNet ----

// A row's entries of x[base + d] held by this lane (zero past Dk).
template <typename T>
__device__ inline void llb_load(const T* x, long long base, int Dk, int lane, T (&out)[LLB_KPL]) {
#pragma unroll
    for (int j = 0; j < LLB_KPL; ++j) {
        const int d = lane + 32 * j;
        out[j] = d < Dk ? x[base + d] : T(0);
    }
}

template <typename T>
__device__ void llb_delta_ckpt(const T* k, const T* v, const T* g, const T* beta, T* ckpt, int Tn, int H, int Dk,
                               int Dv, int C, int NC) {
    const int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int i = blockIdx.y * warps + w;
    if (i >= Dv) return;
    T s[LLB_KPL];
#pragma unroll
    for (int j = 0; j < LLB_KPL; ++j) s[j] = T(0);
    for (int t = 0; t < Tn; ++t) {
        const long long row = (long long)b * Tn + t;
        if (t % C == 0) {
            T* out = ckpt + (((long long)bh * NC + t / C) * Dv + i) * Dk;
#pragma unroll
            for (int j = 0; j < LLB_KPL; ++j)
                if (lane + 32 * j < Dk) out[lane + 32 * j] = s[j];
        }
        T kk[LLB_KPL];
        llb_load(k, (row * H + h) * Dk, Dk, lane, kk);
        const T a = mx_exp(g[row * H + h]), bt = beta[row * H + h], vi = v[(row * H + h) * Dv + i];
        T p = T(0);
#pragma unroll
        for (int j = 0; j < LLB_KPL; ++j) {
            s[j] *= a;
            p += s[j] * kk[j];
        }
        const T u = vi - llb_warp_sum(p);
#pragma unroll
        for (int j = 0; j < LLB_KPL; ++j) s[j] += bt * u * kk[j];
    }
}

// Shared memory per block: sb [W][C][Dk] (the entering states, then each row's dk terms), qb
// [W][C][Dk] (each row's dq terms), sc [W][C][2] (dβ, dg terms). Partials pdq, pdk [NRB][B·H][T][Dk],
// pb, pg [NRB][B·H][T]; dv [B, T, H, Dv] written directly (one row's entry per warp).
template <typename T>
__device__ void llb_delta_bwd(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* dy,
                              const T* ckpt, T* dv, T* pdq, T* pdk, T* pb, T* pg, int Tn, int H, int Dk, int Dv,
                              int C, int NC, T scale) {
    extern __shared__ __align__(16) unsigned char llb_smem[];
    const int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, rb = blockIdx.y;
    const int BH = gridDim.x;
    const int i = rb * warps + w;
    const int active = min(warps, Dv - rb * warps);  // rows of this block
    T* sb = reinterpret_cast<T*>(llb_smem);
    T* qb = sb + (long long)warps * C * Dk;
    T* sc = qb + (long long)warps * C * Dk;
    T* mys = sb + (long long)w * C * Dk;
    T* myq = qb + (long long)w * C * Dk;
    T* myc = sc + (long long)w * C * 2;
    T ds[LLB_KPL];
#pragma unroll
    for (int j = 0; j < LLB_KPL; ++j) ds[j] = T(0);
    for (int c = NC - 1; c >= 0; --c) {
        const int t0 = c * C, n = min(C, Tn - t0);
        if (i < Dv) {
            T s[LLB_KPL];
            llb_load(ckpt, (((long long)bh * NC + c) * Dv + i) * Dk, Dk, lane, s);
            // The chunk's entering states s_{t−1}, t = t0 … t0 + n − 1 (each lane its own entries).
            for (int tau = 0; tau < n; ++tau) {
                const long long row = (long long)b * Tn + t0 + tau;
#pragma unroll
                for (int j = 0; j < LLB_KPL; ++j)
                    if (lane + 32 * j < Dk) mys[tau * Dk + lane + 32 * j] = s[j];
                T kk[LLB_KPL];
                llb_load(k, (row * H + h) * Dk, Dk, lane, kk);
                const T a = mx_exp(g[row * H + h]), bt = beta[row * H + h], vi = v[(row * H + h) * Dv + i];
                T p = T(0);
#pragma unroll
                for (int j = 0; j < LLB_KPL; ++j) {
                    s[j] *= a;
                    p += s[j] * kk[j];
                }
                const T u = vi - llb_warp_sum(p);
#pragma unroll
                for (int j = 0; j < LLB_KPL; ++j) s[j] += bt * u * kk[j];
            }
            for (int tau = n - 1; tau >= 0; --tau) {
                const long long row = (long long)b * Tn + t0 + tau;
                T kk[LLB_KPL], qq[LLB_KPL], sh[LLB_KPL];
                llb_load(k, (row * H + h) * Dk, Dk, lane, kk);
                llb_load(q, (row * H + h) * Dk, Dk, lane, qq);
                const T a = mx_exp(g[row * H + h]), bt = beta[row * H + h];
                const T vi = v[(row * H + h) * Dv + i], dyi = scale * dy[(row * H + h) * Dv + i];
                T p = T(0);
#pragma unroll
                for (int j = 0; j < LLB_KPL; ++j) {
                    const int d = lane + 32 * j;
                    sh[j] = d < Dk ? a * mys[tau * Dk + d] : T(0);
                    p += sh[j] * kk[j];
                }
                const T u = vi - llb_warp_sum(p);
                T pc = T(0);
#pragma unroll
                for (int j = 0; j < LLB_KPL; ++j) {
                    const int d = lane + 32 * j;
                    if (d < Dk) myq[tau * Dk + d] = dyi * (sh[j] + bt * u * kk[j]);
                    ds[j] += dyi * qq[j];
                    pc += ds[j] * kk[j];
                }
                const T cc = llb_warp_sum(pc);
                const T du = bt * cc;
                T pg_ = T(0);
#pragma unroll
                for (int j = 0; j < LLB_KPL; ++j) {
                    const int d = lane + 32 * j;
                    if (d < Dk) mys[tau * Dk + d] = bt * u * ds[j] - du * sh[j];
                    const T dsh = ds[j] - du * kk[j];
                    pg_ += dsh * sh[j];
                    ds[j] = a * dsh;
                }
                const T dgc = llb_warp_sum(pg_);
                if (lane == 0) {
                    dv[(row * H + h) * Dv + i] = du;
                    myc[2 * tau] = cc * u;
                    myc[2 * tau + 1] = dgc;
                }
            }
        }
        __syncthreads();
        const long long part = ((long long)rb * BH + bh) * Tn + t0;
        for (int e = threadIdx.x; e < n * Dk; e += blockDim.x) {
            T sk = T(0), sq = T(0);
            for (int ww = 0; ww < active; ++ww) {
                sk += sb[(long long)ww * C * Dk + e];
                sq += qb[(long long)ww * C * Dk + e];
            }
            pdk[part * Dk + e] = sk;
            pdq[part * Dk + e] = sq;
        }
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            T s1 = T(0), s2 = T(0);
            for (int ww = 0; ww < active; ++ww) {
                s1 += sc[(long long)ww * C * 2 + 2 * e];
                s2 += sc[(long long)ww * C * 2 + 2 * e + 1];
            }
            pb[part + e] = s1;
            pg[part + e] = s2;
        }
        __syncthreads();
    }
}

// dq, dk [B, T, H, Dk] and dβ, dg [B, T, H] from the NRB row blocks' partials, summed in order.
template <typename T>
__device__ void llb_delta_reduce(const T* pdq, const T* pdk, const T* pb, const T* pg, T* dq, T* dk, T* db, T* dg,
                                 int B, int Tn, int H, int Dk, int NRB) {
    const long long BH = (long long)B * H;
    const long long n = (long long)B * Tn * H * Dk;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {
        const long long row = e / Dk;  // (b·T + t)·H + h
        const int d = (int)(e - row * Dk);
        const int h = (int)(row % H);
        const long long bt = row / H;
        const long long t = bt % Tn, b = bt / Tn;
        const long long p = ((b * H + h) * Tn + t);
        T sq = T(0), sk = T(0);
        for (int r = 0; r < NRB; ++r) {
            sq += pdq[((long long)r * BH * Tn + p) * Dk + d];
            sk += pdk[((long long)r * BH * Tn + p) * Dk + d];
        }
        dq[e] = sq;
        dk[e] = sk;
        if (d == 0) {
            T s1 = T(0), s2 = T(0);
            for (int r = 0; r < NRB; ++r) {
                s1 += pb[(long long)r * BH * Tn + p];
                s2 += pg[(long long)r * BH * Tn + p];
            }
            db[row] = s1;
            dg[row] = s2;
        }
    }
}

#define LLB_EXPORT(T, S)                                                                                       \
    extern "C" __global__ void llb_reverse_##S(const T* x, T* out, int B, int Tn, int H, int D) {             \
        llb_reverse<T>(x, out, B, Tn, H, D);                                                                 \
    }                                                                                                        \
    extern "C" __global__ void llb_reverse_g_##S(const T* g, T* out, int B, int Tn, int H) {                  \
        llb_reverse_g<T>(g, out, B, Tn, H);                                                                  \
    }                                                                                                        \
    extern "C" __global__ void llb_dg_dot_##S(const T* q, const T* dq, const T* k, const T* dk, double* a,     \
                                              int B, int Tn, int H, int Dk) {                              \
        llb_dg_dot<T>(q, dq, k, dk, a, B, Tn, H, Dk);                                                        \
    }                                                                                                        \
    extern "C" __global__ void llb_dg_out_##S(const double* a, const double* s, T* dg, int BH, int Tn, int H,  \
                                              int L, int NT) {                                             \
        llb_dg_out<T>(a, s, dg, BH, Tn, H, L, NT);                                                              \
    }                                                                                                        \
    extern "C" __global__ void llb_delta_ckpt_##S(const T* k, const T* v, const T* g, const T* beta, T* ckpt, \
                                                  int Tn, int H, int Dk, int Dv, int C, int NC) {            \
        llb_delta_ckpt<T>(k, v, g, beta, ckpt, Tn, H, Dk, Dv, C, NC);                                        \
    }                                                                                                        \
    extern "C" __global__ void llb_delta_bwd_##S(const T* q, const T* k, const T* v, const T* g, const T* beta, \
                                                 const T* dy, const T* ckpt, T* dv, T* pdq, T* pdk, T* pb,    \
                                                 T* pg, int Tn, int H, int Dk, int Dv, int C, int NC,         \
                                                 T scale) {                                                  \
        llb_delta_bwd<T>(q, k, v, g, beta, dy, ckpt, dv, pdq, pdk, pb, pg, Tn, H, Dk, Dv, C, NC, scale);      \
    }                                                                                                        \
    extern "C" __global__ void llb_delta_reduce_##S(const T* pdq, const T* pdk, const T* pb, const T* pg,     \
                                                    T* dq, T* dk, T* db, T* dg, int B, int Tn, int H, int Dk, \
                                                    int NRB) {                                               \
        llb_delta_reduce<T>(pdq, pdk, pb, pg, dq, dk, db, dg, B, Tn, H, Dk, NRB);                            \
    }

LLB_EXPORT(float, f32)
LLB_EXPORT(double, f64)

extern "C" __global__ void llb_dg_tile(const double* a, double* s, int BH, int Tn, int L, int NT) {
    llb_dg_tile_sums(a, s, BH, Tn, L, NT);
}
extern "C" __global__ void llb_dg_scan(double* s, int BH, int NT) { llb_dg_scan_tiles(s, BH, NT); }
