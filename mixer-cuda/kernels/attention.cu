// Softmax attention (docs/math.md §1.3): y_t = Σ_{s ≤ t, t−s < window} softmax_s(scale · q_t·k_s) v_s.
// Layouts: q, k [B,T,H,Dk]; v, y [B,T,H,Dv]. window ≤ 0 means full causal attention.

// Tiled online-softmax forward. Grid (⌈T/BQ⌉, B·H); block BQ threads, one query row each.
// Dynamic shared memory: q tile [BQ,Dk], accumulators [BQ,Dv], key tile [BK,Dk], value tile
// [BK,Dv]. For every key tile: the tile's running maximum m', rescale (l, acc) by e^{m−m'},
// add e^{score−m'}·v. Scores are masked before exponentiating.
//
// Overflow-free logits (the CPU's `Logits`): the dot product q·k is accumulated in double and
// kept as the key u = sign(scale)·(q·k); maxima are over keys, and weights are
// e^{|scale|·(u − max u)} ≤ 1, so neither a huge scale (1e308, passed as a double) nor f32 inputs
// with q·k beyond 3.4e38 produce ∞ − ∞.
__device__ inline double attn_weight(double abs_scale, double key, double max_key) {
    return (abs_scale == 0.0 || key == max_key) ? 1.0 : exp(abs_scale * (key - max_key));
}

template <typename T>
__device__ inline double attn_dot(const T* a, const T* b, int n) {
    double s = 0.0;
    for (int d = 0; d < n; ++d) s += (double)a[d] * (double)b[d];
    return s;
}

template <typename T>
__device__ void attn_fwd(const T* q, const T* k, const T* v, T* y, int B, int Tn, int H, int Dk, int Dv, int window,
                         double scale, int BK) {
    const double asc = fabs(scale), sg = scale < 0.0 ? -1.0 : 1.0;
    extern __shared__ unsigned char smem_raw[];
    T* sm = reinterpret_cast<T*>(smem_raw);
    const int BQ = blockDim.x;
    T* qs = sm;
    T* acc = qs + BQ * Dk;
    T* ks = acc + BQ * Dv;
    T* vs = ks + BK * Dk;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int t0 = blockIdx.x * BQ, i = threadIdx.x, t = t0 + i;
    const bool active = t < Tn;
    if (active) {
        for (int d = 0; d < Dk; ++d) qs[i * Dk + d] = q[(((long long)b * Tn + t) * H + h) * Dk + d];
        for (int d = 0; d < Dv; ++d) acc[i * Dv + d] = (T)0;
    }
    double m = Lim<double>::neg_inf();
    T l = (T)0;
    const int t_last = min(t0 + BQ, Tn) - 1;
    const int s_begin = window > 0 ? max(0, t0 - window + 1) : 0;
    for (int s0 = s_begin; s0 <= t_last; s0 += BK) {
        __syncthreads();
        for (int idx = i; idx < BK * Dk; idx += BQ) {
            int j = idx / Dk, d = idx % Dk, s = s0 + j;
            ks[idx] = s <= t_last ? k[(((long long)b * Tn + s) * H + h) * Dk + d] : (T)0;
        }
        for (int idx = i; idx < BK * Dv; idx += BQ) {
            int j = idx / Dv, d = idx % Dv, s = s0 + j;
            vs[idx] = s <= t_last ? v[(((long long)b * Tn + s) * H + h) * Dv + d] : (T)0;
        }
        __syncthreads();
        if (!active) continue;
        const int lo = window > 0 ? max(s0, t - window + 1) : s0;
        const int hi = min(s0 + BK - 1, t);
        if (lo > hi) continue;
        double mt = m;
        for (int s = lo; s <= hi; ++s) mt = fmax(mt, sg * attn_dot(qs + i * Dk, ks + (s - s0) * Dk, Dk));
        const T corr = (T)attn_weight(asc, m, mt);
        l *= corr;
        for (int d = 0; d < Dv; ++d) acc[i * Dv + d] *= corr;
        for (int s = lo; s <= hi; ++s) {
            const T p = (T)attn_weight(asc, sg * attn_dot(qs + i * Dk, ks + (s - s0) * Dk, Dk), mt);
            l += p;
            const T* vr = vs + (s - s0) * Dv;
            for (int d = 0; d < Dv; ++d) acc[i * Dv + d] += p * vr[d];
        }
        m = mt;
    }
    if (active) {
        for (int d = 0; d < Dv; ++d) y[(((long long)b * Tn + t) * H + h) * Dv + d] = acc[i * Dv + d] / l;
    }
}

// Decode step over a device KV cache of n entries (ring buffer rows [cap, B, H, D]; the
// order of entries does not matter to softmax). One block per (b, h); scratch [B·H, cap]
// holds the weights (keys are recomputed in double for the second pass, so no score is ever
// stored in T).
template <typename T>
__device__ void attn_step(const T* q, const T* kc, const T* vc, T* scratch, T* y, int B, int H, int Dk, int Dv,
                          int cap, int n, double scale) {
    __shared__ double red[256];
    const double asc = fabs(scale), sg = scale < 0.0 ? -1.0 : 1.0;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, tid = threadIdx.x, nt = blockDim.x;
    const T* qr = q + ((long long)b * H + h) * Dk;
    T* sc = scratch + (long long)bh * cap;
    double mloc = Lim<double>::neg_inf();
    for (int j = tid; j < n; j += nt) {
        mloc = fmax(mloc, sg * attn_dot(qr, kc + (((long long)j * B + b) * H + h) * Dk, Dk));
    }
    red[tid] = mloc;
    __syncthreads();
    for (int w = nt / 2; w > 0; w >>= 1) {
        if (tid < w) red[tid] = fmax(red[tid], red[tid + w]);
        __syncthreads();
    }
    const double mx = red[0];
    __syncthreads();
    double lsum = 0;
    for (int j = tid; j < n; j += nt) {
        const double p = attn_weight(asc, sg * attn_dot(qr, kc + (((long long)j * B + b) * H + h) * Dk, Dk), mx);
        sc[j] = (T)p;
        lsum += p;
    }
    red[tid] = lsum;
    __syncthreads();
    for (int w = nt / 2; w > 0; w >>= 1) {
        if (tid < w) red[tid] += red[tid + w];
        __syncthreads();
    }
    const T tot = (T)red[0];
    for (int d = tid; d < Dv; d += nt) {
        T a = 0;
        for (int j = 0; j < n; ++j) a += sc[j] * vc[(((long long)j * B + b) * H + h) * Dv + d];
        y[((long long)b * H + h) * Dv + d] = a / tot;
    }
}

#define ATTN_EXPORT(T, S)                                                                                        \
    extern "C" __global__ void attn_fwd_##S(const T* q, const T* k, const T* v, T* y, int B, int Tn, int H,      \
                                            int Dk, int Dv, int window, double scale, int BK) {                  \
        attn_fwd<T>(q, k, v, y, B, Tn, H, Dk, Dv, window, scale, BK);                                            \
    }                                                                                                            \
    extern "C" __global__ void attn_step_##S(const T* q, const T* kc, const T* vc, T* scratch, T* y, int B,      \
                                             int H, int Dk, int Dv, int cap, int n, double scale) {              \
        attn_step<T>(q, kc, vc, scratch, y, B, H, Dk, Dv, cap, n, scale);                                        \
    }

ATTN_EXPORT(float, f32)
ATTN_EXPORT(double, f64)
