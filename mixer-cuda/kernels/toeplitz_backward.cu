// The Toeplitz mixer's backward (docs/gradients.md): the reductions over the batch and a head's
// channels that give d_w and d_bias. d_x is the forward's spectral product in its adjoint form
// (toeplitz_mul with adj = 1, kernels/toeplitz.cu). Every output element is summed by one
// thread in a fixed order (deterministic, no atomics).
//
// Layouts: G [B·C, p] the cotangent dy packed as zero-padded rows (toeplitz_pack_x); Xh, Gh
// [B·C, F] the spectra of x and dy (F = p/2 + 1 bins); Wh [Kw·H, F]; dw [Kw, H, Lw]; dbias [H, Lb].

// d_bias[h, t] = Σ_b Σ_{e ∈ h} dy[b, t, e] for t < Tn, 0 for Tn ≤ t < Lb, from the packed rows
// (one thread per (h, t), t fastest: reads coalesced along the rows). 1-D grid over H·Lb.
template <typename T>
__device__ void tzb_bias(const T* G, T* db, int B, int Tn, int C, int H, int p, int Lb) {
    const long long i = gtid();
    if (i >= (long long)H * Lb) return;
    const int t = (int)(i % Lb), h = (int)(i / Lb), CH = C / H;
    T acc = (T)0;
    if (t < Tn)
        for (int b = 0; b < B; ++b)
            for (int e = h * CH; e < (h + 1) * CH; ++e) acc += G[((long long)b * C + e) * p + t];
    db[i] = acc;
}

// The spectrum of d_w, a cross-correlation summed over the batch and the head's channels:
// dWh[i, h, f] = Σ_b Σ_{e ∈ h, c = src(e, i) ∈ h} conj(Xh[b, c, f]) · Gh[b, e, f]
// (inverse-transformed, its lags Δ < Tn are d_w[i, h, Δ] = Σ_b Σ_e Σ_t dy[b,t,e]·x[b,t−Δ,c]).
// One thread per (i, h, f), f fastest. 1-D grid over Kw·H·F.
template <typename T>
__device__ void tzb_dw_spec(const Cplx<T>* Xh, const Cplx<T>* Gh, Cplx<T>* dWh, int B, int C, int H, int Kw, int F) {
    const long long idx = gtid();
    if (idx >= (long long)Kw * H * F) return;
    const int f = (int)(idx % F);
    const long long r = idx / F;
    const int h = (int)(r % H), i = (int)(r / H), CH = C / H;
    T re = (T)0, im = (T)0;
    for (int b = 0; b < B; ++b)
        for (int e = h * CH; e < (h + 1) * CH; ++e) {
            const int c = tz_src(e, i, Kw, CH);
            if (c < 0) continue;
            const Cplx<T> x = Xh[((long long)b * C + c) * F + f], g = Gh[((long long)b * C + e) * F + f];
            re += x.re * g.re + x.im * g.im;
            im += x.re * g.im - x.im * g.re;
        }
    dWh[idx] = Cplx<T>{re, im};
}

// Wr [R, p] (unnormalized inverse) → dw [R, Lw]: the first Tn lags scaled by 1/p, zeros beyond.
// 1-D grid over R·Lw.
template <typename T>
__device__ void tzb_unpack_w(const T* Wr, T* dw, int R, int Tn, int Lw, int p) {
    const long long i = gtid();
    if (i >= (long long)R * Lw) return;
    const int d = (int)(i % Lw);
    const long long r = i / Lw;
    dw[i] = d < Tn ? Wr[r * p + d] * ((T)1 / (T)p) : (T)0;
}

#define TZB_EXPORT(T, S)                                                                                         \
    extern "C" __global__ void toeplitz_bias_grad_##S(const T* G, T* db, int B, int Tn, int C, int H, int p,      \
                                                      int Lb) {                                                  \
        tzb_bias<T>(G, db, B, Tn, C, H, p, Lb);                                                                  \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_dw_spec_##S(const Cplx<T>* Xh, const Cplx<T>* Gh, Cplx<T>* dWh, int B,   \
                                                    int C, int H, int Kw, int F) {                               \
        tzb_dw_spec<T>(Xh, Gh, dWh, B, C, H, Kw, F);                                                             \
    }                                                                                                            \
    extern "C" __global__ void toeplitz_unpack_w_##S(const T* Wr, T* dw, int R, int Tn, int Lw, int p) {          \
        tzb_unpack_w<T>(Wr, dw, R, Tn, Lw, p);                                                                   \
    }

TZB_EXPORT(float, f32)
TZB_EXPORT(double, f64)
