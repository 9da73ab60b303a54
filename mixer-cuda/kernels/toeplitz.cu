// Toeplitz mixer (docs/math.md §3): y[t,e] = Σ_i Σ_{s≤t} w[i,h(e),t−s] · x[s, e+i−(Kw−1)] + bias[h(e),t],
// where head h(e) = e / (C/H) and a channel index outside the head's range contributes 0.
// Layouts: x, y [B,T,C]; w [Kw,H,Lw]; bias [H,Lb], with rows of Lw, Lb ≥ T entries of which the
// first T are read (longer kernels are truncated to T).

// tz_src (the source channel of a tap) comes from toeplitz_common.cuh, prepended by the host.

// x → X [B·C, p], zero-padded rows (one row per (b, c)) of the Tn tokens at x[b·sb + t·st + c]
// (sb = Tn·C, st = C for x [B,T,C]; sb = C, st = B·C for a block of the decoder's history
// [T,B,C]): a transpose through a 32 × 33 shared tile, so that both the reads (along c) and the
// writes (along t) are coalesced. Block (32, 8), grid (⌈p/32⌉, ⌈C/32⌉, B).
template <typename T>
__device__ void tz_pack_x(const T* x, T* X, int B, int Tn, int C, int p, long long sb, long long st) {
    __shared__ T tile[32][33];
    const int t0 = blockIdx.x * 32, c0 = blockIdx.y * 32, b = blockIdx.z;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int j = ty; j < 32; j += 8) {
        const int t = t0 + j, c = c0 + tx;
        tile[j][tx] = (t < Tn && c < C) ? x[b * sb + t * st + c] : T{};
    }
    __syncthreads();
    for (int j = ty; j < 32; j += 8) {
        const int c = c0 + j, t = t0 + tx;
        if (c < C && t < p) X[((long long)b * C + c) * p + t] = tile[tx][j];
    }
}

// w [R,Lw] → W [R,p]: the first T taps of each row, zero-padded.
template <typename T>
__device__ void tz_pack_w(const T* w, T* W, int R, int Tn, int Lw, int p) {
    long long i = gtid();
    if (i >= (long long)R * p) return;
    int t = (int)(i % p);
    long long r = i / p;
    W[i] = t < Tn ? w[r * Lw + t] : (T)0;
}

// Spectra: Yh[b,e,f] = Σ_i Wh[i,h(e),f] · Xh[b, src(e,i), f]; with adj ≠ 0 the adjoint (the
// backward's d_x, a correlation): Yh[b,c,f] = Σ_i conj(Wh[i,h(c),f]) · Xh[b, src_adj(c,i), f]. Grid (⌈F/1024⌉, ≤ 65535) of 256
// threads, each taking the bins f0 + 256·j, j < 4 (four loads of each operand in flight per
// thread, coalesced over the block); block row y takes the rows be = b·C + e ≡ y (mod gridDim.y),
// so a thread's row indices are uniform over its block and no thread divides per element (B·C
// fits in an int: the caller checks B·C·p).
template <typename T>
__device__ void tz_mul(const Cplx<T>* Xh, const Cplx<T>* Wh, Cplx<T>* Yh, int B, int C, int H, int Kw, int F,
                       int adj) {
    constexpr int PER = 4, BLK = 256;
    const int f0 = blockIdx.x * (BLK * PER) + threadIdx.x;
    const int CH = C / H, rows = B * C;
    for (int be = blockIdx.y; be < rows; be += gridDim.y) {
        const int e = be % C, b = be / C, h = e / CH;
        T re[PER] = {}, im[PER] = {};
        for (int k = 0; k < Kw; ++k) {
            const int c = adj ? tz_src_adj(e, k, Kw, CH) : tz_src(e, k, Kw, CH);
            if (c < 0) continue;
            const Cplx<T>* wr = Wh + ((long long)k * H + h) * F;
            const Cplx<T>* xr = Xh + ((long long)b * C + c) * F;
            Cplx<T> a[PER], x[PER];
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                const int f = f0 + j * BLK;
                a[j] = f < F ? wr[f] : Cplx<T>{0, 0};
                if (adj) a[j].im = -a[j].im;
                x[j] = f < F ? xr[f] : Cplx<T>{0, 0};
            }
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                re[j] += a[j].re * x[j].re - a[j].im * x[j].im;
                im[j] += a[j].re * x[j].im + a[j].im * x[j].re;
            }
        }
        Cplx<T>* yr = Yh + (long long)be * F;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int f = f0 + j * BLK;
            if (f < F) yr[f] = Cplx<T>{re[j], im[j]};
        }
    }
}

// Yr [B·C, p] (unnormalized inverse) → y [B,T,C] = Yr·(1/p) + bias: the transpose of
// tz_pack_x, through the same shared tile. Block (32, 8), grid (⌈T/32⌉, ⌈C/32⌉, B).
template <typename T>
__device__ void tz_unpack(const T* Yr, const T* bias, int has_bias, T* y, int B, int Tn, int C, int H, int p,
                          int Lb) {
    __shared__ T tile[32][33];
    const int t0 = blockIdx.x * 32, e0 = blockIdx.y * 32, b = blockIdx.z;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int j = ty; j < 32; j += 8) {
        const int e = e0 + j, t = t0 + tx;
        tile[j][tx] = (e < C && t < Tn) ? Yr[((long long)b * C + e) * p + t] : (T)0;
    }
    __syncthreads();
    const T inv_p = (T)1 / (T)p;
    const int e = e0 + tx;
    const T* brow = bias + (long long)(e / (C / H)) * Lb;  // read only where has_bias and e < C
    for (int j = ty; j < 32; j += 8) {
        const int t = t0 + j;
        if (t < Tn && e < C) {
            T v = tile[tx][j] * inv_p;
            if (has_bias) v += brow[t];
            y[((long long)b * Tn + t) * C + e] = v;
        }
    }
}

// The paired path (Kw = 1, an even number of channels per head): channels 2j and 2j + 1 of
// x travel as one complex signal z_j = x_{2j} + i·x_{2j+1} (tz_pack_x with T = Cplx, reading x
// as [B,T,C/2] pairs), one complex FFT of length p per pair, the product with the head's kernel
// spectrum — the same real kernel for both channels, so ŷ_j = ŵ·ẑ_j needs no separation — and
// the inverse gives y_{2j} + i·y_{2j+1}. ŵ is stored as its p/2 + 1 non-negative bins (real
// transform); the others are ŵ_{p−f} conjugated.
// Yz[be, f] = ŵ[h(2j), f]·Z[be, f] in place, be = b·(C/2) + j; grid and bins as tz_mul.
template <typename T>
__device__ void tz_mul_pairs(Cplx<T>* Z, const Cplx<T>* Wh, int B, int C, int H, int p) {
    constexpr int PER = 4, BLK = 256;
    const int f0 = blockIdx.x * (BLK * PER) + threadIdx.x;
    const int CP = C / 2, CH = C / H, rows = B * CP, F = p / 2 + 1;
    for (int be = blockIdx.y; be < rows; be += gridDim.y) {
        const int h = (2 * (be % CP)) / CH;
        const Cplx<T>* wr = Wh + (long long)h * F;
        Cplx<T>* zr = Z + (long long)be * p;
        Cplx<T> a[PER], z[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int f = f0 + j * BLK;
            if (f < p) {
                const Cplx<T> w = f < F ? wr[f] : wr[p - f];
                a[j] = f < F ? w : Cplx<T>{w.re, -w.im};
                z[j] = zr[f];
            }
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int f = f0 + j * BLK;
            if (f < p) zr[f] = Cplx<T>{a[j].re * z[j].re - a[j].im * z[j].im, a[j].re * z[j].im + a[j].im * z[j].re};
        }
    }
}

// Zr [B·C/2, p] (unnormalized inverse of the pairs) → y [B,T,C]: y_{2j} = Re·(1/p) + bias,
// y_{2j+1} = Im·(1/p) + bias, through a 32 × 33 tile of pairs as tz_unpack. Block (32, 8),
// grid (⌈T/32⌉, ⌈C/64⌉, B).
template <typename T>
__device__ void tz_unpack_pairs(const Cplx<T>* Zr, const T* bias, int has_bias, T* y, int B, int Tn, int C, int H,
                                int p, int Lb) {
    __shared__ Cplx<T> tile[32][33];
    const int CP = C / 2;
    const int t0 = blockIdx.x * 32, j0 = blockIdx.y * 32, b = blockIdx.z;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int jj = ty; jj < 32; jj += 8) {
        const int j = j0 + jj, t = t0 + tx;
        tile[jj][tx] = (j < CP && t < Tn) ? Zr[((long long)b * CP + j) * p + t] : Cplx<T>{};
    }
    __syncthreads();
    const T inv_p = (T)1 / (T)p;
    const int j = j0 + tx;
    const T* brow = bias + (long long)((2 * j) / (C / H)) * Lb;  // read only where has_bias and j < CP
    for (int tt = ty; tt < 32; tt += 8) {
        const int t = t0 + tt;
        if (t < Tn && j < CP) {
            const Cplx<T> z = tile[tx][tt];
            const T bb = has_bias ? brow[t] : (T)0;
            T* yr = y + ((long long)b * Tn + t) * C + 2 * j;
            yr[0] = z.re * inv_p + bb;
            yr[1] = z.im * inv_p + bb;
        }
    }
}

// y_{t,e} = Σ_i Σ_{s ≤ t} w[i, h(e), t − s] · x_s[src(e, i)] (+ bias[h(e), t]), x_s[c] = x_at(s, c):
// the direct form's and the naive decoder's sum.
template <typename T, typename At>
__device__ __forceinline__ T tz_conv(At x_at, const T* w, const T* bias, int has_bias, int e, int t, int C, int H,
                                     int Kw, int Lw, int Lb) {
    int CH = C / H, h = e / CH;
    T acc = 0;
    for (int k = 0; k < Kw; ++k) {
        int c = tz_src(e, k, Kw, CH);
        if (c < 0) continue;
        const T* wr = w + ((long long)k * H + h) * Lw;
        for (int s = 0; s <= t; ++s) acc += wr[t - s] * x_at(s, c);
    }
    if (has_bias) acc += bias[(long long)h * Lb + t];
    return acc;
}

// Direct O(T²) form: one thread per (b, t, e).
template <typename T>
__device__ void tz_direct(const T* x, const T* w, const T* bias, int has_bias, T* y, int B, int Tn, int C, int H,
                          int Kw, int Lw, int Lb) {
    long long i = gtid();
    if (i >= (long long)B * Tn * C) return;
    int e = (int)(i % C);
    long long bt = i / C;
    int t = (int)(bt % Tn), b = (int)(bt / Tn);
    y[i] = tz_conv([&](int s, int c) { return (x + (long long)b * Tn * C + c)[(long long)s * C]; }, w, bias, has_bias,
                   e, t, C, H, Kw, Lw, Lb);
}

// Decoder step at position t: hist [Tmax, B, C] holds x_0..x_t; one thread per (b, e).
template <typename T>
__device__ void tz_step(const T* hist, const T* w, const T* bias, int has_bias, T* y, int B, int Tn, int C, int H,
                        int Kw, int t, int Lw, int Lb) {
    long long i = gtid();
    if (i >= (long long)B * C) return;
    int e = (int)(i % C), b = (int)(i / C);
    y[i] = tz_conv([&](int s, int c) { return hist[((long long)s * B + b) * C + c]; }, w, bias, has_bias, e, t, C, H,
                   Kw, Lw, Lb);
}

// Online (relaxed) decoder, docs/math.md §3. After token n − 1 the tile of the k = lowbit(n)
// inputs [n − k, n) adds its part to the outputs [n, n + k):
//   pending[n + r] += Σ_i Σ_{j<k} w[i, h(e), k + r − j] · hist[n − k + j, src(e, i)],  r < k,
// and the output of token t is y_t = pending[t] + Σ_i w[i,h(e),0]·x_t[src(e,i)] + bias[h(e), t].
// Every pair s < t' falls in exactly one tile (the one of the highest bit in which s and t'
// differ), fired at n ≤ t'. Layouts: hist, pending [Tmax, B, C]; w [Kw, H, Lw]; bias [H, Lb].

// The output of token t: one thread per (b, e).
template <typename T>
__device__ void tz_online_out(const T* hist, const T* pending, const T* w, const T* bias, int has_bias, T* y, int B,
                              int C, int H, int Kw, int t, int Lw, int Lb) {
    long long i = gtid();
    if (i >= (long long)B * C) return;
    int e = (int)(i % C), b = (int)(i / C);
    int CH = C / H, h = e / CH;
    const long long rowt = (long long)t * B * C + (long long)b * C;
    T acc = pending[rowt + e];
    for (int k = 0; k < Kw; ++k) {
        int c = tz_src(e, k, Kw, CH);
        if (c >= 0) acc += w[((long long)k * H + h) * Lw] * hist[rowt + c];
    }
    if (has_bias) acc += bias[(long long)h * Lb + t];
    y[i] = acc;
}

// A small tile computed directly: one thread per (r, b, e), r < min(k, Tmax − n).
template <typename T>
__device__ void tz_online_direct(const T* hist, T* pending, const T* w, int B, int C, int H, int Kw, int n, int k,
                                 int rows, int Lw) {
    long long i = gtid();
    const long long bc = (long long)B * C;
    if (i >= (long long)rows * bc) return;
    int r = (int)(i / bc);
    long long be = i % bc;
    int e = (int)(be % C), b = (int)(be / C);
    int CH = C / H, h = e / CH;
    T acc = 0;
    for (int kk = 0; kk < Kw; ++kk) {
        int c = tz_src(e, kk, Kw, CH);
        if (c < 0) continue;
        const T* wr = w + ((long long)kk * H + h) * Lw + k + r;
        const T* xr = hist + (long long)(n - k) * bc + (long long)b * C + c;
        for (int j = 0; j < k; ++j) acc += wr[-j] * xr[j * bc];
    }
    pending[(long long)(n + r) * bc + be] += acc;
}

// A large tile's inverse transform Yr [B·C, m = 2k] (unnormalized) into pending: outputs k..2k
// of the circular convolution are the linear ones (no wrap-around there). One thread per
// (r, b, e), r < rows.
template <typename T>
__device__ void tz_online_acc(const T* Yr, T* pending, int B, int C, int n, int k, int rows) {
    long long i = gtid();
    const long long bc = (long long)B * C;
    if (i >= (long long)rows * bc) return;
    int r = (int)(i / bc);
    long long be = i % bc;
    pending[(long long)(n + r) * bc + be] += Yr[be * 2 * k + k + r] / (T)(2 * k);
}

#define TZ_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void toeplitz_pack_x_##S(const T* x, T* X, int B, int Tn, int C, int p, long long sb,  \
                                                   long long st) {                                               \
        tz_pack_x<T>(x, X, B, Tn, C, p, sb, st);                                                                 \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_online_out_##S(const T* hist, const T* pending, const T* w,              \
                                                       const T* bias, int has_bias, T* y, int B, int C, int H,   \
                                                       int Kw, int t, int Lw, int Lb) {                          \
        tz_online_out<T>(hist, pending, w, bias, has_bias, y, B, C, H, Kw, t, Lw, Lb);                           \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_online_direct_##S(const T* hist, T* pending, const T* w, int B, int C,    \
                                                          int H, int Kw, int n, int k, int rows, int Lw) {       \
        tz_online_direct<T>(hist, pending, w, B, C, H, Kw, n, k, rows, Lw);                                      \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_online_acc_##S(const T* Yr, T* pending, int B, int C, int n, int k,      \
                                                       int rows) {                                               \
        tz_online_acc<T>(Yr, pending, B, C, n, k, rows);                                                         \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_pack_w_##S(const T* w, T* W, int R, int Tn, int Lw, int p) {            \
        tz_pack_w<T>(w, W, R, Tn, Lw, p);                                                                        \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_mul_##S(const Cplx<T>* Xh, const Cplx<T>* Wh, Cplx<T>* Yh, int B, int C, \
                                                int H, int Kw, int F, int adj) {                                 \
        tz_mul<T>(Xh, Wh, Yh, B, C, H, Kw, F, adj);                                                              \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_unpack_##S(const T* Yr, const T* bias, int has_bias, T* y, int B, int Tn, \
                                                   int C, int H, int p, int Lb) {                                \
        tz_unpack<T>(Yr, bias, has_bias, y, B, Tn, C, H, p, Lb);                                                 \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_pack_pairs_##S(const Cplx<T>* x, Cplx<T>* Z, int B, int Tn, int CP, int p,   \
                                                       long long sb, long long st) {                             \
        tz_pack_x<Cplx<T>>(x, Z, B, Tn, CP, p, sb, st);                                                          \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_mul_pairs_##S(Cplx<T>* Z, const Cplx<T>* Wh, int B, int C, int H, int p) {  \
        tz_mul_pairs<T>(Z, Wh, B, C, H, p);                                                                      \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_unpack_pairs_##S(const Cplx<T>* Zr, const T* bias, int has_bias, T* y,      \
                                                         int B, int Tn, int C, int H, int p, int Lb) {           \
        tz_unpack_pairs<T>(Zr, bias, has_bias, y, B, Tn, C, H, p, Lb);                                           \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_direct_##S(const T* x, const T* w, const T* bias, int has_bias, T* y,    \
                                                   int B, int Tn, int C, int H, int Kw, int Lw, int Lb) {        \
        tz_direct<T>(x, w, bias, has_bias, y, B, Tn, C, H, Kw, Lw, Lb);                                          \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_step_##S(const T* hist, const T* w, const T* bias, int has_bias, T* y,   \
                                                 int B, int Tn, int C, int H, int Kw, int t, int Lw, int Lb) {   \
        tz_step<T>(hist, w, bias, has_bias, y, B, Tn, C, H, Kw, t, Lw, Lb);                                      \
    }

TZ_EXPORT(float, f32)
TZ_EXPORT(double, f64)
