// What the log-linear family's chunked backward kernels share (loglinear_backward_chunked.cu,
// loglinear_backward_lift_delta.cu), after loglinear_common.cuh in their prelude: the FMA chunk
// products of a 16 × 16 thread grid over shared-memory tiles, a half warp's row sum, the staging
// of a chunk's rows into tiles, and the cp.async group waits.

// acc[i][j] += Σ_κ X[κ·xk + (ty + 16 i)·xr] · Y[κ·yk + (tx + 16 j)·yr] for κ < K: both operands
// read as they are or transposed (X and Y in shared memory).
template <typename T, int RI, int RJ>
__device__ inline void lgb_gemm2(T (&acc)[RI][RJ], const T* X, int xk, int xr, const T* Y, int yk, int yr, int K,
                                 int ty, int tx) {
#pragma unroll 4
    for (int kk = 0; kk < K; ++kk) {
        T xv[RI], yv[RJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) xv[i] = X[kk * xk + (ty + 16 * i) * xr];
#pragma unroll
        for (int j = 0; j < RJ; ++j) yv[j] = Y[kk * yk + (tx + 16 * j) * yr];
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
            for (int j = 0; j < RJ; ++j) acc[i][j] = fma(xv[i], yv[j], acc[i][j]);
    }
}

// acc[i][j] += Σ_κ X(κ, ty + 16 i) · Y[κ·yk + tx + 16 j] for κ < K, X(κ, r) = X[κ·xk + r·xr]
// (a tile read as it is or transposed), X and Y in shared memory.
template <typename T, int RI, int RJ>
__device__ inline void lgb_gemm(T (&acc)[RI][RJ], const T* X, int xk, int xr, const T* Y, int yk, int K, int ty,
                                int tx) {
    lgb_gemm2<T, RI, RJ>(acc, X, xk, xr, Y, yk, 1, K, ty, tx);
}

// The sum of x over the 16 threads of a row of the 16 × 16 thread grid (a half warp), in a fixed
// order; every thread of the half warp gets it.
template <typename T> __device__ inline T lgb_row_sum(T x) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// A chunk product out[i][j] = Σ_κ X(κ, ty + 16 i) · Y[κ·yk + tx + 16 j] accumulated by add() over
// reduction pieces (lgb_gemm) and read by get(). 256 threads.
template <typename T, int RI, int RJ> struct LgbAcc {
    T a[RI][RJ] = {};
    __device__ void add(const T* X, int xk, int xr, const T* Y, int yk, int K) {
        lgb_gemm<T, RI, RJ>(a, X, xk, xr, Y, yk, K, threadIdx.x / 16, threadIdx.x % 16);
    }
    __device__ void get(T (&out)[RI][RJ]) const {
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
            for (int j = 0; j < RJ; ++j) out[i][j] = a[i][j];
    }
};

// Rows r < n, columns c0 + kk (kk < LLC_KT, below D) of x (row r at (row0 + r·H)·D) into
// dst[kk·LLC_LD + r]; zero elsewhere (rows up to CH). 256 threads.
template <typename T, int CH>
__device__ inline void lgb_slice(T* dst, const T* x, long long row0, int H, int D, int c0, int n) {
    for (int idx = threadIdx.x; idx < LLC_KT * CH; idx += 256) {
        const int r = idx / LLC_KT, kk = idx % LLC_KT, c = c0 + kk;
        dst[kk * LLC_LD + r] = (r < n && c < D) ? x[(row0 + (long long)r * H) * D + c] : (T)0;
    }
}

// Rows r < n, columns c0 .. c0 + 63 (below D) of x into dst[r·LLC_LD + c − c0], times w(r); zero
// elsewhere (rows up to CH). 256 threads.
template <typename T, int CH, typename Wt>
__device__ inline void lgb_tile(T* dst, const T* x, long long row0, int H, int D, int c0, int n, Wt w) {
    for (int idx = threadIdx.x; idx < CH * LLC_NT; idx += 256) {
        const int r = idx / LLC_NT, c = c0 + idx % LLC_NT;
        dst[r * LLC_LD + idx % LLC_NT] = (r < n && c < D) ? w(r) * x[(row0 + (long long)r * H) * D + c] : (T)0;
    }
}

// cp.async groups: commit, and wait until at most one (or none) is pending.
__device__ __forceinline__ void lgb_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void lgb_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void lgb_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }


// acc[u] = Σ_{d < Dk} L[(r0 + 16 u)·ld + d] · S[d·ncol + c]: rows r0 + 16 u of a chunk's rows L
// (rows of ld entries) times column c of a state slice S [Dk][ncol], as the passes' threads hold
// them.
template <typename T, int NU>
__device__ inline void lgb_rows_state(T (&acc)[NU], const T* L, int ld, const T* S, int ncol, int Dk, int r0, int c) {
#pragma unroll
    for (int u = 0; u < NU; ++u) acc[u] = (T)0;
    for (int d = 0; d < Dk; ++d) {
        const T sv = S[d * ncol + c];
#pragma unroll
        for (int u = 0; u < NU; ++u) acc[u] = fma(L[(r0 + 16 * u) * ld + d], sv, acc[u]);
    }
}
