// Log-linear family, generic quadratic form (docs/math.md §2.1, §2.3). The host prepends the level
// mask's device function `int mixers_level(long long t, long long s)` and the λ scheme's
// `double mixers_lambda(double raw, double param)`, so a plugin mask or scheme runs here
// with no kernel of its own.
//
// Per (b, t, h): y_t = Σ_{s ≤ t} w_{t,s} v_s with
//   w_{t,s} = σ · β_s · k_s · u_s · [lifted: mixers_lambda(λraw[t, ℓ(t,s)], 1)],
//   u_t = q_t,  u_{s−1} = M_s u_s,
//   M_s = I (linear attention), e^{g_s} I (Mamba-2), e^{g_s}(I − β_s k_s k_sᵀ) (gated DeltaNet),
// so that k_s · u_s = k_sᵀ Φ_{s+1..t} q_t with Φ the ordered product of docs/math.md §2.1; for Mamba-2
// this is (q_t·k_s) e^{G_t − G_s}, accumulated as a product of factors e^{g_r} ≤ 1 (no
// exponential of a difference is ever formed). β_s = 1 except for gated DeltaNet.
// Layouts: q, k [B,T,H,Dk]; v, y [B,T,H,Dv]; g, beta [B,T,H]; lambda [B,T,H,L].
// err: set to 1 when the mask gives a level outside [0, L), 2 when λ maps to a non-finite or
// negative weight.
//
// ll_map_lambda maps raw λ [.., H, L] to weights with the scheme's device function and the
// parameter lambda_param [H, L] (1 when absent), for the Fenwick-structured forms; its flag
// ends as n − i for the first raw value i mapped to a non-finite or negative weight.
//
// With the scheme's derivative `void mixers_lambda_grad(double raw, double param, double* d_raw,
// double* d_param)` spliced in (MIXERS_LAMBDA_GRAD defined), the λ map's backward: from the
// gradient dλ of the weights, ll_lambda_vjp writes d_raw = dλ · ∂map/∂raw per entry, and
// ll_lambda_vjp_param / ll_lambda_param_sum d_param[h, l] = Σ_rows dλ · ∂map/∂param: block
// (h·L + l, part) sums the rows part, part + P, part + 2P, … in a fixed order, the parts are then
// added in order (no atomics: the result does not depend on the schedule).

template <typename T>
__device__ void ll_quadratic(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* lam, T* y,
                             long long* err, int B, int Tn, int H, int Dk, int Dv, int L, int base, int lifted,
                             double scale) {
    extern __shared__ unsigned char smem_raw[];
    T* u = reinterpret_cast<T*>(smem_raw) + (long long)threadIdx.x * (Dk + Dv);
    T* acc = u + Dk;
    long long i = gtid();
    if (i >= (long long)B * Tn * H) return;
    const int h = (int)(i % H);
    const long long bt = i / H;
    const int t = (int)(bt % Tn), b = (int)(bt / Tn);
    for (int d = 0; d < Dk; ++d) u[d] = q[i * Dk + d];
    for (int d = 0; d < Dv; ++d) acc[d] = (T)0;
    for (int s = t; s >= 0; --s) {
        const long long js = ((long long)b * Tn + s) * H + h;
        const T* ks = k + js * Dk;
        T ku = 0;
        for (int d = 0; d < Dk; ++d) ku += ks[d] * u[d];
        const T bs = base == 2 ? beta[js] : (T)1;
        T w = (T)scale * bs * ku;
        if (lifted) {
            const int l = mixers_level((long long)t, (long long)s);
            if (l < 0 || l >= L) {
                atomicExch((unsigned long long*)err, 1ULL);
                return;
            }
            const double lw = mixers_lambda((double)lam[i * L + l], 1.0);
            if (!(isfinite(lw) && lw >= 0.0)) {
                atomicExch((unsigned long long*)err, 2ULL);
                return;
            }
            w *= (T)lw;
        }
        const T* vs = v + js * Dv;
        for (int d = 0; d < Dv; ++d) acc[d] += w * vs[d];
        if (base >= 1 && s > 0) {
            const T e = mx_exp(g[js]);
            if (base == 2) {
                const T c = bs * ku;
                for (int d = 0; d < Dk; ++d) u[d] = e * (u[d] - c * ks[d]);
            } else {
                for (int d = 0; d < Dk; ++d) u[d] *= e;
            }
        }
    }
    for (int d = 0; d < Dv; ++d) y[i * Dv + d] = acc[d];
}

template <typename T>
__device__ void ll_map_lambda(const T* raw, const T* param, int has_param, T* out, long long n, int H, int L,
                              long long* flag) {
    for (long long i = gtid(); i < n; i += (long long)gridDim.x * blockDim.x) {
        const int l = (int)(i % L), h = (int)((i / L) % H);
        const double p = has_param ? (double)param[h * L + l] : 1.0;
        const double w = mixers_lambda((double)raw[i], p);
        if (!(isfinite(w) && w >= 0.0)) atomicMax((unsigned long long*)flag, (unsigned long long)(n - i));
        out[i] = (T)w;
    }
}

#ifdef MIXERS_LAMBDA_GRAD
template <typename T>
__device__ void ll_lambda_vjp(const T* raw, const T* param, int has_param, const T* dlam, T* draw, long long n,
                              int H, int L) {
    for (long long i = gtid(); i < n; i += (long long)gridDim.x * blockDim.x) {
        const int l = (int)(i % L), h = (int)((i / L) % H);
        const double p = has_param ? (double)param[h * L + l] : 1.0;
        double dr, dp;
        mixers_lambda_grad((double)raw[i], p, &dr, &dp);
        draw[i] = (T)((double)dlam[i] * dr);
    }
}

// blockDim.x = 256; grid (H·L, P); partial [P][H·L].
template <typename T>
__device__ void ll_lambda_vjp_param(const T* raw, const T* param, const T* dlam, double* partial, long long rows,
                                    int HL) {
    __shared__ double acc[256];
    const int hl = blockIdx.x, part = blockIdx.y, P = gridDim.y;
    const double p = (double)param[hl];
    double a = 0.0;
    for (long long r = part + (long long)P * threadIdx.x; r < rows; r += (long long)P * blockDim.x) {
        const long long i = r * HL + hl;
        double dr, dp;
        mixers_lambda_grad((double)raw[i], p, &dr, &dp);
        a += (double)dlam[i] * dp;
    }
    acc[threadIdx.x] = a;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[(long long)part * HL + hl] = acc[0];
}

template <typename T>
__device__ void ll_lambda_param_sum(const double* partial, T* dparam, int P, int HL) {
    const long long hl = gtid();
    if (hl >= HL) return;
    double a = 0.0;
    for (int part = 0; part < P; ++part) a += partial[(long long)part * HL + hl];
    dparam[hl] = (T)a;
}

#define LL_GRAD_EXPORT(T, S)                                                                                     \
    extern "C" __global__ void ll_lambda_vjp_##S(const T* raw, const T* param, int has_param, const T* dlam,    \
                                                 T* draw, long long n, int H, int L) {                           \
        ll_lambda_vjp<T>(raw, param, has_param, dlam, draw, n, H, L);                                            \
    }                                                                                                            \
    extern "C" __global__ void ll_lambda_vjp_param_##S(const T* raw, const T* param, const T* dlam,             \
                                                       double* partial, long long rows, int HL) {               \
        ll_lambda_vjp_param<T>(raw, param, dlam, partial, rows, HL);                                             \
    }                                                                                                            \
    extern "C" __global__ void ll_lambda_param_sum_##S(const double* partial, T* dparam, int P, int HL) {       \
        ll_lambda_param_sum<T>(partial, dparam, P, HL);                                                          \
    }
LL_GRAD_EXPORT(float, f32)
LL_GRAD_EXPORT(double, f64)
#endif

#define LL_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void ll_quadratic_##S(const T* q, const T* k, const T* v, const T* g, const T* beta,   \
                                                const T* lam, T* y, long long* err, int B, int Tn, int H, int Dk,      \
                                                int Dv, int L, int base, int lifted, double scale) {             \
        ll_quadratic<T>(q, k, v, g, beta, lam, y, err, B, Tn, H, Dk, Dv, L, base, lifted, scale);               \
    }                                                                                                            \
    extern "C" __global__ void ll_map_lambda_##S(const T* raw, const T* param, int has_param, T* out,            \
                                                 long long n, int H, int L, long long* flag) {                   \
        ll_map_lambda<T>(raw, param, has_param, out, n, H, L, flag);                                             \
    }

LL_EXPORT(float, f32)
LL_EXPORT(double, f64)
