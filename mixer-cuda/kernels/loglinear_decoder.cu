// The log-linear family's decoder step, one launch per token for every member (docs/math.md
// §2.5). Layouts: q, k [BH,Dk] (the token's rows); v, y [BH,Dv]; g, beta [BH]; lam [BH,L];
// st [BH][NL][Dv][Dk] (row r of level l's state contiguous).

// Decoder step, row-parallel (docs/math.md §2.5): one warp per (b·h, value row r) does, for its row
// of every level state S^(l) [Dv×Dk]: the merge (levels 0..m into m + 1, when t ≥ 1 and lifted),
// the transition (Mamba-2 S ← e^g S; gated DeltaNet S ← e^g (S − β (S k) kᵀ)), the insert at
// level 0 (β v_r kᵀ), and the read y_r = σ Σ_l λ^(l) S^(l)_r · q. Grid (⌈Dv/4⌉, BH), 128 threads.
// g, beta and lam are read only when the mixer has them.
template <typename T>
__device__ void llc_step(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* lam, T* st, T* y,
                         int BH, int Dk, int Dv, int NL, int L, int base, int lifted, int t, int m, unsigned occ,
                         double scale) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int bh = blockIdx.y;
    if (r >= Dv) return;
    const long long DD = (long long)Dk * Dv;
    T* S = st + (long long)bh * NL * DD + (long long)r * Dk;
    const T* qq = q + (long long)bh * Dk;
    const T* kk = k + (long long)bh * Dk;
    const T e = base >= 1 ? mx_exp(g[bh]) : (T)1;
    const T bt = base == 2 ? beta[bh] : (T)1;
    const T vr = v[(long long)bh * Dv + r];
    const int merged = lifted && t >= 1;
    T out = (T)0;
    // Descending, so that level m + 1 sums levels 0..m before level 0 is rewritten.
    for (int l = NL - 1; l >= 0; --l) {
        if (!((occ >> l) & 1u)) continue;
        T* Sl = S + l * DD;
        // Entry c of the row before the transition: the merged sum at level m + 1, zero at level
        // 0 of a lift.
        auto before = [&](int c) {
            T s;
            if (merged && l == m + 1) {
                s = (T)0;
                for (int l2 = 0; l2 <= m; ++l2) s += S[l2 * DD + c];
            } else if (lifted && l == 0) {
                s = (T)0;
            } else {
                s = Sl[c];
            }
            return s;
        };
        // u = S_r · k (gated DeltaNet).
        T u = (T)0;
        if (base == 2) {
            for (int c = lane; c < Dk; c += 32) u += before(c) * kk[c];
            for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
        }
        T rd = (T)0;
        for (int c = lane; c < Dk; c += 32) {
            T s = before(c);
            if (base == 2)
                s = e * (s - bt * u * kk[c]);
            else
                s *= e;
            if (l == 0) s += bt * vr * kk[c];
            Sl[c] = s;
            rd += s * qq[c];
        }
        for (int o = 16; o > 0; o >>= 1) rd += __shfl_xor_sync(0xffffffffu, rd, o);
        out += (lifted ? lam[(long long)bh * L + l] : (T)1) * rd;
    }
    // Levels 1..m were merged away: clear them (level 0 was rewritten above).
    if (merged)
        for (int l = 1; l <= m; ++l)
            for (int c = lane; c < Dk; c += 32) S[l * DD + c] = (T)0;
    if (lane == 0) y[(long long)bh * Dv + r] = (T)scale * out;
}

#define LLS_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void llc_step_##S(const T* q, const T* k, const T* v, const T* g, const T* beta,         \
                                            const T* lam, T* st, T* y, int BH, int Dk, int Dv, int NL, int L,     \
                                            int base, int lifted, int t, int m, unsigned occ, double scale) {     \
        llc_step<T>(q, k, v, g, beta, lam, st, y, BH, Dk, Dv, NL, L, base, lifted, t, m, occ, scale);             \
    }

LLS_EXPORT(float, f32)
LLS_EXPORT(double, f64)
