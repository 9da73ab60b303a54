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
// - llb_dg:        dG_t = q_t·dq_t − k_t·dk_t and dg_i = Σ_{t ≥ i} dG_t, one block per (b, h),
//                  dots and sums in f64.
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

// One block of LLB_DG_THREADS per (b, h): thread r takes tokens [r·n, (r+1)·n) (n = ⌈T/threads⌉),
// writes dG_t there, sums its span; thread 0 turns the span sums into suffix sums in order; then
// each thread walks its span backwards from the sum of the spans after it.
#define LLB_DG_THREADS 256
template <typename T>
__device__ void llb_dg(const T* q, const T* dq, const T* k, const T* dk, T* dg, int Tn, int H, int Dk) {
    __shared__ double span[LLB_DG_THREADS];
    const int bh = blockIdx.x, b = bh / H, h = bh % H, r = threadIdx.x;
    const int n = (Tn + LLB_DG_THREADS - 1) / LLB_DG_THREADS;
    const int t0 = min(Tn, r * n), t1 = min(Tn, t0 + n);
    double sum = 0.0;
    for (int t = t0; t < t1; ++t) {
        const long long base = ((long long)(b * (long long)Tn + t) * H + h) * Dk;
        double a = 0.0;
        for (int d = 0; d < Dk; ++d)
            a += (double)q[base + d] * (double)dq[base + d] - (double)k[base + d] * (double)dk[base + d];
        dg[((long long)b * Tn + t) * H + h] = (T)a;
        sum += a;
    }
    span[r] = sum;
    __syncthreads();
    if (r == 0) {
        double acc = 0.0;
        for (int i = LLB_DG_THREADS - 1; i >= 0; --i) {
            const double s = span[i];
            span[i] = acc;  // the sum of the spans after span i
            acc += s;
        }
    }
    __syncthreads();
    double acc = span[r];
    for (int t = t1 - 1; t >= t0; --t) {
        // Recomputed rather than read back from dg, so that the f32 rounding of dG_t is not summed.
        const long long base = ((long long)(b * (long long)Tn + t) * H + h) * Dk;
        double a = 0.0;
        for (int d = 0; d < Dk; ++d)
            a += (double)q[base + d] * (double)dq[base + d] - (double)k[base + d] * (double)dk[base + d];
        acc += a;
        dg[((long long)b * Tn + t) * H + h] = (T)acc;
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
    extern "C" __global__ void __launch_bounds__(LLB_DG_THREADS)                                             \
        llb_dg_##S(const T* q, const T* dq, const T* k, const T* dk, T* dg, int Tn, int H, int Dk) {         \
        llb_dg<T>(q, dq, k, dk, dg, Tn, H, Dk);                                                              \
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
