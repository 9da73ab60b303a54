// Generalized linear recurrence (docs/math.md §1.2), any offset pattern:
//   y[t] = α[t,0]·x[t] + Σ_{k: f(k) ≤ t} ( α[t,k+1]·x[d_k(t)] + β[t,k]·y[d_k(t)] )   per (b, c),
// with the α-terms on x present for on = a | both and the β-terms for on = b | both.
// The pattern reaches the GPU as a table computed on the host: offsets f(k) and lattice
// strides a_k (k < K). Positions: translation-invariant d = t − f(k); cache-efficient
// d = a_k·⌈(t + 1 − f(k)) / a_k⌉ − 1. Layouts: x, y [B,T,C]; α [B,T,NA,C] (NA = 1 or K+1);
// β [B,T,K,C].

__device__ inline long long glr_dep(long long t, long long fk, long long ak, int ce) {
    if (!ce) return t - fk;
    long long u = t + 1 - fk;
    return ((u + ak - 1) / ak) * ak - 1;
}

// One thread per (b, c), sequential over t; reads of y are the thread's own earlier writes.
template <typename T>
__device__ void glr_scan(const T* x, const T* alpha, const T* beta, const long long* off, const long long* stride,
                         T* y, int B, int Tn, int C, int K, int NA, int has_a, int has_b, int ce) {
    long long i = gtid();
    if (i >= (long long)B * C) return;
    int c = (int)(i % C), b = (int)(i / C);
    const T* xb = x + (long long)b * Tn * C + c;
    T* yb = y + (long long)b * Tn * C + c;
    for (int t = 0; t < Tn; ++t) {
        long long bt = (long long)b * Tn + t;
        T acc = alpha[bt * NA * C + c] * xb[(long long)t * C];
        for (int k = 0; k < K; ++k) {
            long long fk = off[k];
            if (fk > t) break;
            long long d = glr_dep(t, fk, stride[k], ce);
            if (has_a) acc += alpha[(bt * NA + k + 1) * C + c] * xb[d * C];
            if (has_b) acc += beta[(bt * K + k) * C + c] * yb[d * C];
        }
        yb[(long long)t * C] = acc;
    }
}

// Decoder step: one thread per (b, c). slot[k] is the cache slot of d_k(t) (−1: inactive);
// cache rows [cap, B, C] hold x (cx) and y (cy) of kept positions; the new x_t, y_t are
// written to slot `out` (−1: not kept). A slot freed at this step may be `out`: each thread
// reads all its dependencies before writing its own column.
template <typename T>
__device__ void glr_step(const T* xt, const T* at, const T* bt_, const int* slot, T* cx, T* cy, T* yt, int B, int C,
                         int K, int NA, int has_a, int has_b, int out) {
    long long i = gtid();
    if (i >= (long long)B * C) return;
    int c = (int)(i % C), b = (int)(i / C);
    T xv = xt[i];
    T acc = at[(long long)b * NA * C + c] * xv;
    for (int k = 0; k < K; ++k) {
        int s = slot[k];
        if (s < 0) continue;
        long long ci = ((long long)s * B + b) * C + c;
        if (has_a) acc += at[((long long)b * NA + k + 1) * C + c] * cx[ci];
        if (has_b) acc += bt_[((long long)b * K + k) * C + c] * cy[ci];
    }
    yt[i] = acc;
    if (out >= 0) {
        long long ci = ((long long)out * B + b) * C + c;
        if (has_a) cx[ci] = xv;
        if (has_b) cy[ci] = acc;
    }
}

#define GLR_EXPORT(T, S)                                                                                         \
    extern "C" __global__ void glr_scan_##S(const T* x, const T* alpha, const T* beta, const long long* off,     \
                                            const long long* stride, T* y, int B, int Tn, int C, int K, int NA,  \
                                            int has_a, int has_b, int ce) {                                      \
        glr_scan<T>(x, alpha, beta, off, stride, y, B, Tn, C, K, NA, has_a, has_b, ce);                          \
    }                                                                                                            \
    extern "C" __global__ void glr_step_##S(const T* xt, const T* at, const T* bt, const int* slot, T* cx, T* cy, \
                                            T* yt, int B, int C, int K, int NA, int has_a, int has_b, int out) { \
        glr_step<T>(xt, at, bt, slot, cx, cy, yt, B, C, K, NA, has_a, has_b, out);                               \
    }

GLR_EXPORT(float, f32)
GLR_EXPORT(double, f64)
