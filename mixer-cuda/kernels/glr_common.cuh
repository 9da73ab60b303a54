// What the GLR kernel sources share (prepended by the host to kernels/glr.cu and
// kernels/glr_backward.cu). The pattern reaches the GPU as a table computed on the host:
// offsets f(k) and lattice strides a_k (k < K).

// Position d_k(t) of an active tap (f(k) ≤ t < 2³¹, hence a_k ≤ f(k) ≤ t: 32-bit arithmetic):
// translation-invariant d = t − f(k); cache-efficient d = a_k·⌈(t + 1 − f(k)) / a_k⌉ − 1.
__device__ __forceinline__ int glr_dep(int t, int fk, int ak, int ce) {
    if (!ce || ak == 1) return t - fk;
    return ((t - fk + ak) / ak) * ak - 1;
}
