// Shared helpers of the mixers CUDA kernels. Prepended by the host to every kernel source
// (NVRTC gets one translation unit, no system headers).

template <typename T> struct Lim;
template <> struct Lim<float> {
    __device__ static float neg_inf() { return __int_as_float(0xff800000); }
};
template <> struct Lim<double> {
    __device__ static double neg_inf() { return __longlong_as_double(0xfff0000000000000ULL); }
};

__device__ inline float mx_exp(float x) { return expf(x); }
__device__ inline double mx_exp(double x) { return exp(x); }

// Interleaved complex numbers, layout-compatible with cuFFT's float2 / double2.
template <typename T> struct alignas(2 * sizeof(T)) Cplx {  // aligned as cuFFT's complex types (one 8- or 16-byte access)
    T re, im;
};

// Global thread index of a 1-D launch.
__device__ inline long long gtid() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }

// Whether p is aligned to `bytes` (a power of two), e.g. for 16-byte vector loads.
__device__ __forceinline__ bool mx_aligned(const void* p, unsigned bytes) {
    return ((unsigned long long)p & (bytes - 1)) == 0;
}

// A bf16 value as its 16 bits.
typedef unsigned short mx_bf16;

// f32 rounded to bf16 (nearest even).
__device__ __forceinline__ mx_bf16 mx_f32_bf16(float x) {
    mx_bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
}

// bf16 (its 16 bits) to f32, exact; four at once from 8 bytes (element 0 in the low half of .x).
__device__ __forceinline__ float mx_bf16_f32(mx_bf16 b) { return __uint_as_float((unsigned)b << 16); }
__device__ __forceinline__ float4 mx_bf16x4_f32(uint2 u) {
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

// f32 rounded to tf32 (round to nearest, ties away), as the bits the tensor cores take.
__device__ __forceinline__ unsigned mx_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// One mma.sync tile, c += a·b with f32 accumulators (asm ASM: `asm` or `asm volatile`; SHAPE: the
// instruction's shape and types after "mma.sync.aligned.", e.g. "m16n8k8.row.col.f32.tf32.tf32.f32").
#define MX_MMA_SYNC(ASM, SHAPE, c, a0, a1, a2, a3, b0, b1)                                                    \
    ASM("mma.sync.aligned." SHAPE " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                 \
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                     \
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
// c += a·b on tensor cores, tf32 inputs, f32 accumulation: one m16n8k8 tile per warp. Fragments
// (g = lane / 4, i = lane % 4): a = A[g][i], A[g+8][i], A[g][i+4], A[g+8][i+4];
// b = B[i][g], B[i+4][g]; c = C[g][2i], C[g][2i+1], C[g+8][2i], C[g+8][2i+1].
__device__ __forceinline__ void mx_mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    MX_MMA_SYNC(asm volatile, "m16n8k8.row.col.f32.tf32.tf32.f32", c, a0, a1, a2, a3, b0, b1);
}

// Two floats rounded to bf16 (nearest even) and packed as an mma operand register: lo in the
// low half.
__device__ __forceinline__ unsigned mx_pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// c += a·b on tensor cores, bf16 inputs, f32 accumulation: one m16n8k16 tile per warp. Fragments
// (g = lane / 4, i = lane % 4; each register two bf16, the lower k first): a = A[g][2i..2i+1],
// A[g+8][2i..2i+1], A[g][2i+8..2i+9], A[g+8][2i+8..2i+9]; b = B[2i..2i+1][g], B[2i+8..2i+9][g];
// c as mx_mma_tf32's.
__device__ __forceinline__ void mx_mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    MX_MMA_SYNC(asm volatile, "m16n8k16.row.col.f32.bf16.bf16.f32", c, a0, a1, a2, a3, b0, b1);
}

// Four 8 × 8 b16 matrices from shared memory (ldmatrix): lanes 8i .. 8i + 7 give the addresses
// (shared-window, 16-byte aligned) of matrix i's rows 0..7; register i of lane l holds matrix i's
// row l / 4, entries 2(l % 4) and 2(l % 4) + 1 (the lower one in the low half). With trans, the
// same of the transposed matrices: entries (2(l % 4), l / 4) and (2(l % 4) + 1, l / 4).
__device__ __forceinline__ void mx_ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void mx_ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// The transpose of an 8 × 8 b16 matrix held as ldmatrix leaves it (lane l: row l / 4, entries
// 2(l % 4), 2(l % 4) + 1), in the same layout.
__device__ __forceinline__ unsigned mx_movm_t(unsigned x) {
    unsigned r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

// The shared-window address of a pointer into shared memory (for ldmatrix and cp.async).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
// 16 bytes from global memory to shared memory (cp.async, L2 only); bytes past src_bytes are zeros.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// Ends a group of cp.async copies; cp_wait<N> waits until at most N groups are in flight.
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// 2^x by the special-function unit (ex2.approx.ftz: relative error about 2^-22, subnormals flushed).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
