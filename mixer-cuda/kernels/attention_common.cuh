// What the attention forward kernels share (prepended to attention.cu and attention_fused.cu):
// the overflow-free weights of docs/math.md §1.3 in double, and the rows computed again in double
// where a kernel's f32 dot products are not finite.

// w(key, max) = e^{|σ|(key − max)} (1 where |σ| = 0 or key = max; key ≤ max, so never above 1).
__device__ inline double attn_weight(double abs_scale, double key, double max_key) {
    return (abs_scale == 0.0 || key == max_key) ? 1.0 : exp(abs_scale * (key - max_key));
}

template <typename T>
__device__ inline double attn_dot(const T* a, const T* b, int n) {
    double s = 0.0;
    for (int d = 0; d < n; ++d) s += (double)a[d] * (double)b[d];
    return s;
}

// Query row t of one (batch, head), read from the inputs in global memory (rows of q, k at stride
// tk, of v and y at stride tv), with the overflow-free keys u_s = sign(σ)·q_t·k_s and their
// maximum M in double: y_t = Σ_s w(u_s, M) v_s / Σ_s w(u_s, M) over s ∈ [max(0, a − window + 1), a]
// (window ≤ 0: [0, a]), a = P + t the query's position among the keys (P: the keys before the
// first query, a KV cache's; 0 without one). Two passes over the keys: M, then the weighted sums, accumulated in y_t.
// The fallback of the forward kernels for rows where some f32 product q·k is not finite, or where
// |σ|·log₂e is not a normal f32; slow (one thread a row), taken only there.
template <typename T>
__device__ void attn_row_f64(const T* qb, const T* kb, const T* vb, T* yb, long long tk, long long tv, int dk, int dv,
                             int t, int P, int window, double scale) {
    const double asc = fabs(scale), sg = scale < 0.0 ? -1.0 : 1.0;
    const T* qr = qb + (long long)t * tk;
    T* yr = yb + (long long)t * tv;
    const int a = P + t, lo = window > 0 ? max(0, a - window + 1) : 0;
    double m = Lim<double>::neg_inf();
    for (int s = lo; s <= a; ++s) m = fmax(m, sg * attn_dot(qr, kb + (long long)s * tk, dk));
    for (int d = 0; d < dv; ++d) yr[d] = (T)0;
    double l = 0.0;
    for (int s = lo; s <= a; ++s) {
        const double p = attn_weight(asc, sg * attn_dot(qr, kb + (long long)s * tk, dk), m);
        l += p;
        const T* vr = vb + (long long)s * tv;
        for (int d = 0; d < dv; ++d) yr[d] += (T)p * vr[d];
    }
    for (int d = 0; d < dv; ++d) yr[d] = (T)((double)yr[d] / l);
}
