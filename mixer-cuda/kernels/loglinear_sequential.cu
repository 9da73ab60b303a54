// Gated DeltaNet and its Fenwick lift (docs/math.md §2.2, §2.6): the chunked form, one block per
// (batch, head), for states too large for the shared memory of the chunk-parallel state pass
// (loglinear_state_pass.cu; the host's rule: loglinear/state_pass.rs). Launched by
// loglinear/sequential.rs. (The scalar-decay mixers: loglinear_ssd.cu; every decoder step:
// loglinear_decoder.cu.)
// λ arrives mapped (weights ≥ 0).
// Layouts: q, k [B,T,H,Dk]; v, y [B,T,H,Dv]; g, beta [B,T,H]; lambda [B,T,H,L].
// base: 0 linear attention, 1 Mamba-2, 2 gated DeltaNet.

// bitlen(x) = ⌊log₂ x⌋ + 1 (0 for x = 0): the Fenwick level of r ≠ s inside a chunk is bitlen(r ⊕ s).
__device__ inline int ll_bitlen(unsigned x) { return x == 0u ? 0 : 32 - __clz((int)x); }

// Chunked form, one block per (b, h), walking the chunks of size C (last one partial) in order.
// Per chunk (rows r, s < n, chunk-local γ_r = Σ_{r' ≤ r} g, masked Γ_{r,s} = e^{γ_r − γ_s}, s ≤ r):
//   P = σ QKᵀ ⊙ Γ; gated DeltaNet (WY/UT form): Lm = strict(diag(β) KKᵀ ⊙ Γ),
//   X = (I + Lm)⁻¹ [I | diag(β e^γ) K | diag(β) V] = [T⁻¹ | W | U] by forward substitution,
//   A = P T⁻¹ diag(β), Q̃ = σ diag(e^γ) Q − P W; otherwise A = P, Q̃ = σ diag(e^γ) Q.
//   Intra: y_r = Σ_{s ≤ r} λ_r^{(bitlen(r⊕s))} A_{r,s} v_s (levels 0..c).
//   Between chunks: chunk-level states H^{(e)} (Dk×Dv) merge at chunk i ≥ 1 (m = ctz i: levels
//   0..m → m+1), are read as y_r += λ_r^{(c+e)} Q̃_r H^{(e)}, then take the chunk transition
//   H ← e^{γ_{n−1}} H − K̂ᵀ (W H) (gated DeltaNet), H ← e^{γ_{n−1}} H (Mamba-2), and the chunk's
//   own state K̂ᵀ U (or K̂ᵀ V), K̂ = diag(e^{γ_{n−1} − γ}) K, is added at level 0.
// Base mixers (lifted = 0) keep one state (E = 1) read with weight 1. A base mixer may run from a
// state (docs/math.md §7): with has_s0 its state starts as H_0 = S_0ᵀ, read from S0 [BH][Dv][Dk],
// instead of zero; with has_st the state after the last chunk (taken through its n tokens, so
// after token T − 1), H_T = S_Tᵀ, is written to ST [BH][Dv][Dk]. The host passes
// has_s0 = has_st = 0 with the lift.
// Workspace per block: P, A [nmax²], X [nmax·(nmax+Dk+Dv)], Q̃ [nmax·Dk], WH [nmax·Dv] (T);
// γ [nmax] (double). States st [B·H·E·Dk·Dv], zero on entry.
template <typename T>
__device__ void ll_chunked(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* lam, T* y,
                           T* ws, double* gws, T* st, int Tn, int H, int Dk, int Dv, int L, int C, int cbits,
                           int base, int lifted, int E, int nmax, double scale, const T* S0, int has_s0, T* ST,
                           int has_st) {
    const int bh = blockIdx.x;
    const int b = bh / H, h = bh % H;
    const int tid = threadIdx.x, nth = blockDim.x;
    const int W = nmax + Dk + Dv;
    const long long wsz = 2LL * nmax * nmax + (long long)nmax * W + (long long)nmax * (Dk + Dv);
    T* P = ws + (long long)bh * wsz;
    T* A = P + (long long)nmax * nmax;
    T* X = A + (long long)nmax * nmax;
    T* Qt = X + (long long)nmax * W;
    T* WH = Qt + (long long)nmax * Dk;
    double* gam = gws + (long long)bh * nmax;
    const long long DD = (long long)Dk * Dv;
    T* S = st + (long long)bh * E * DD;
    const T sc = (T)scale;
    const int gdn = base == 2;
    unsigned present = 0u;
    const int nch = (Tn + C - 1) / C;
    if (has_s0 && !lifted) {  // H_0 = S_0ᵀ: entry (c, d) of H is entry (d, c) of S_0
        for (long long idx = tid; idx < DD; idx += nth) {
            const int c = (int)(idx / Dv), d = (int)(idx % Dv);
            S[idx] = S0[(long long)bh * DD + (long long)d * Dk + c];
        }
        present = 1u;
        __syncthreads();
    }
#define ROW(t) (((long long)b * Tn + (t)) * H + h)
    for (int ci = 0; ci < nch; ++ci) {
        const int i0 = ci * C;
        const int n = min(C, Tn - i0);
        if (tid == 0) {
            double acc = 0.0;
            for (int r = 0; r < n; ++r) {
                if (base >= 1) acc += (double)g[ROW(i0 + r)];
                gam[r] = acc;
            }
        }
        __syncthreads();
        const double glast = gam[n - 1];
        // P and (gated DeltaNet) Lm, kept in A for now.
        for (int idx = tid; idx < n * n; idx += nth) {
            const int r = idx / n, s = idx % n;
            T p = (T)0, lm = (T)0;
            if (s <= r) {
                const T* qr = q + ROW(i0 + r) * Dk;
                const T* kr = k + ROW(i0 + r) * Dk;
                const T* ks = k + ROW(i0 + s) * Dk;
                const T dec = (T)exp(gam[r] - gam[s]);
                T qk = (T)0;
                for (int d = 0; d < Dk; ++d) qk += qr[d] * ks[d];
                p = sc * qk * dec;
                if (gdn && s < r) {
                    T kk = (T)0;
                    for (int d = 0; d < Dk; ++d) kk += kr[d] * ks[d];
                    lm = beta[ROW(i0 + r)] * kk * dec;
                }
            }
            P[r * nmax + s] = p;
            A[r * nmax + s] = lm;
        }
        __syncthreads();
        if (gdn) {
            // Forward substitution, one right-hand-side column per thread.
            for (int j = tid; j < n + Dk + Dv; j += nth) {
                for (int r = 0; r < n; ++r) {
                    const long long rr = ROW(i0 + r);
                    T x;
                    if (j < n)
                        x = (T)(j == r ? 1 : 0);
                    else if (j < n + Dk)
                        x = beta[rr] * (T)exp(gam[r]) * k[rr * Dk + (j - n)];
                    else
                        x = beta[rr] * v[rr * Dv + (j - n - Dk)];
                    for (int s = 0; s < r; ++s) x -= A[r * nmax + s] * X[(long long)s * W + j];
                    X[(long long)r * W + j] = x;
                }
            }
            __syncthreads();
            for (int idx = tid; idx < n * n; idx += nth) {
                const int r = idx / n, s = idx % n;
                T a = (T)0;
                if (s <= r) {
                    for (int j = s; j <= r; ++j) a += P[r * nmax + j] * X[(long long)j * W + s];
                    a *= beta[ROW(i0 + s)];
                    if (lifted) a *= lam[ROW(i0 + r) * L + (r == s ? 0 : ll_bitlen((unsigned)(r ^ s)))];
                }
                A[r * nmax + s] = a;
            }
            for (int idx = tid; idx < n * Dk; idx += nth) {
                const int r = idx / Dk, d = idx % Dk;
                T x = sc * (T)exp(gam[r]) * q[ROW(i0 + r) * Dk + d];
                for (int j = 0; j <= r; ++j) x -= P[r * nmax + j] * X[(long long)j * W + n + d];
                Qt[r * Dk + d] = x;
            }
        } else {
            for (int idx = tid; idx < n * n; idx += nth) {
                const int r = idx / n, s = idx % n;
                T a = P[r * nmax + s];
                if (lifted && s <= r) a *= lam[ROW(i0 + r) * L + (r == s ? 0 : ll_bitlen((unsigned)(r ^ s)))];
                A[r * nmax + s] = a;
            }
            for (int idx = tid; idx < n * Dk; idx += nth) {
                const int r = idx / Dk, d = idx % Dk;
                Qt[r * Dk + d] = sc * (T)exp(gam[r]) * q[ROW(i0 + r) * Dk + d];
            }
        }
        // Chunk-granular Fenwick merge: levels 0..m into m + 1 (which is empty).
        if (lifted && ci >= 1) {
            const int m = __ffs(ci) - 1;
            for (long long idx = tid; idx < DD; idx += nth) {
                T sum = (T)0;
                for (int e = 0; e <= m; ++e) {
                    sum += S[e * DD + idx];
                    S[e * DD + idx] = (T)0;
                }
                S[(m + 1) * DD + idx] += sum;
            }
            present = (present & ~((2u << m) - 1u)) | (1u << (m + 1));
        }
        __syncthreads();
        // Outputs: intra-chunk part plus every present level read with Q̃.
        for (int idx = tid; idx < n * Dv; idx += nth) {
            const int r = idx / Dv, d = idx % Dv;
            T acc = (T)0;
            for (int s = 0; s <= r; ++s) acc += A[r * nmax + s] * v[ROW(i0 + s) * Dv + d];
            for (int e = 0; e < E; ++e) {
                if (!((present >> e) & 1u)) continue;
                const T w = lifted ? lam[ROW(i0 + r) * L + cbits + e] : (T)1;
                T rd = (T)0;
                for (int c = 0; c < Dk; ++c) rd += Qt[r * Dk + c] * S[e * DD + (long long)c * Dv + d];
                acc += w * rd;
            }
            y[ROW(i0 + r) * Dv + d] = acc;
        }
        __syncthreads();
        // Transition every present state through the chunk.
        const T tot = (T)exp(glast);
        if (gdn) {
            for (int e = 0; e < E; ++e) {
                if (!((present >> e) & 1u)) continue;
                T* Se = S + e * DD;
                for (int idx = tid; idx < n * Dv; idx += nth) {
                    const int j = idx / Dv, d = idx % Dv;
                    T x = (T)0;
                    for (int c = 0; c < Dk; ++c) x += X[(long long)j * W + n + c] * Se[(long long)c * Dv + d];
                    WH[j * Dv + d] = x;
                }
                __syncthreads();
                for (long long idx = tid; idx < DD; idx += nth) {
                    const int c = (int)(idx / Dv), d = (int)(idx % Dv);
                    T x = tot * Se[idx];
                    for (int j = 0; j < n; ++j)
                        x -= (T)exp(glast - gam[j]) * k[ROW(i0 + j) * Dk + c] * WH[j * Dv + d];
                    Se[idx] = x;
                }
                __syncthreads();
            }
        } else if (base == 1) {
            for (int e = 0; e < E; ++e) {
                if (!((present >> e) & 1u)) continue;
                for (long long idx = tid; idx < DD; idx += nth) S[e * DD + idx] *= tot;
            }
        }
        // Insert the chunk's own state K̂ᵀ U (gated DeltaNet) or K̂ᵀ V at level 0 (same thread
        // mapping as the Mamba-2 scaling above).
        for (long long idx = tid; idx < DD; idx += nth) {
            const int c = (int)(idx / Dv), d = (int)(idx % Dv);
            T x = (T)0;
            for (int j = 0; j < n; ++j) {
                const T val = gdn ? X[(long long)j * W + n + Dk + d] : v[ROW(i0 + j) * Dv + d];
                x += (T)exp(glast - gam[j]) * k[ROW(i0 + j) * Dk + c] * val;
            }
            S[idx] += x;
        }
        present |= 1u;
        __syncthreads();
    }
#undef ROW
    if (has_st && !lifted)  // S_T = H_Tᵀ (the last chunk ended with a barrier)
        for (long long idx = tid; idx < DD; idx += nth) {
            const int c = (int)(idx / Dv), d = (int)(idx % Dv);
            ST[(long long)bh * DD + (long long)d * Dk + c] = S[idx];
        }
}

#define LLF_EXPORT(T, S)                                                                                         \
    extern "C" __global__ void ll_chunked_##S(const T* q, const T* k, const T* v, const T* g, const T* beta,     \
                                              const T* lam, T* y, T* ws, double* gws, T* st, int Tn, int H,      \
                                              int Dk, int Dv, int L, int C, int cbits, int base, int lifted,     \
                                              int E, int nmax, double scale, const T* S0, int has_s0, T* ST,     \
                                              int has_st) {                                                      \
        ll_chunked<T>(q, k, v, g, beta, lam, y, ws, gws, st, Tn, H, Dk, Dv, L, C, cbits, base, lifted, E, nmax, \
                      scale, S0, has_s0, ST, has_st);                                                            \
    }

LLF_EXPORT(float, f32)
LLF_EXPORT(double, f64)
