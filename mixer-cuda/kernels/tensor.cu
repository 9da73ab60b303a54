// Element-wise helpers of device tensors: bfloat16 conversions, the input value checks, and the
// row copies and sums of packed batches.
//
// bf16 is handled as its 16 bits (unsigned short): f32 → bf16 rounds to nearest, ties to
// even, NaN kept quiet (the same rule as the host's round_bf16), bf16 → f32 is exact.

__device__ inline unsigned short f32_to_bf16_bits(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// The element loops below take four elements per access where the pointers allow (a view into a
// larger tensor may start anywhere: 8 bytes of bf16, 16 of f32, so that a warp's loads and its
// stores each cover one contiguous span) over the first n − n mod 4 elements, then one at a time.

extern "C" __global__ void bf16_to_f32(const unsigned short* a, float* out, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (mx_aligned(a, 8) && mx_aligned(out, 16)) {
        done = n / 4 * 4;
        for (long long v = gtid(); v < n / 4; v += stride) {
            reinterpret_cast<float4*>(out)[v] = mx_bf16x4_f32(reinterpret_cast<const uint2*>(a)[v]);
        }
    }
    for (long long i = done + gtid(); i < n; i += stride) out[i] = mx_bf16_f32(a[i]);
}

extern "C" __global__ void f32_to_bf16(const float* a, unsigned short* out, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (mx_aligned(a, 16) && mx_aligned(out, 8)) {
        done = n / 4 * 4;
        for (long long v = gtid(); v < n / 4; v += stride) {
            const float4 x = reinterpret_cast<const float4*>(a)[v];
            reinterpret_cast<uint2*>(out)[v] =
                make_uint2((unsigned)f32_to_bf16_bits(x.x) | ((unsigned)f32_to_bf16_bits(x.y) << 16),
                           (unsigned)f32_to_bf16_bits(x.z) | ((unsigned)f32_to_bf16_bits(x.w) << 16));
        }
    }
    for (long long i = done + gtid(); i < n; i += stride) out[i] = f32_to_bf16_bits(a[i]);
}

// Value constraints (mixer_core::spec::Constraint): 0 finite, 1 finite and ≤ 0, 2 finite and
// in [0, 1], 3 finite and ≥ 0. The flag ends as n − i for the first violating flat index i
// (0 when none): atomicMax keeps the smallest i.
__device__ inline bool value_ok(double x, int c) {
    if (!isfinite(x)) return false;
    switch (c) {
        case 1: return x <= 0.0;
        case 2: return x >= 0.0 && x <= 1.0;
        case 3: return x >= 0.0;
        default: return true;
    }
}

__device__ inline double check_value(float x) { return x; }
__device__ inline double check_value(double x) { return x; }
__device__ inline double check_value(unsigned short b) { return mx_bf16_f32(b); }

template <typename T>
__device__ inline void check_one(const T* a, long long i, long long n, int c, long long* flag) {
    if (!value_ok(check_value(a[i]), c)) atomicMax((unsigned long long*)flag, (unsigned long long)(n - i));
}

// W = 16 / sizeof(T) elements per 16-byte load; an element that fails is reported alone.
template <typename T>
__device__ void check_values(const T* a, long long n, int c, long long* flag) {
    constexpr int W = 16 / sizeof(T);
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (mx_aligned(a, 16)) {
        done = n / W * W;
        for (long long v = gtid(); v < n / W; v += stride) {
            const uint4 x = reinterpret_cast<const uint4*>(a)[v];
            const T* e = reinterpret_cast<const T*>(&x);
            bool ok = true;
#pragma unroll
            for (int w = 0; w < W; ++w) ok &= value_ok(check_value(e[w]), c);
            if (!ok)
                for (int w = 0; w < W; ++w) check_one(a, v * W + w, n, c, flag);
        }
    }
    for (long long i = done + gtid(); i < n; i += stride) check_one(a, i, n, c, flag);
}

extern "C" __global__ void check_values_f32(const float* a, long long n, int c, long long* flag) {
    check_values<float>(a, n, c, flag);
}
extern "C" __global__ void check_values_f64(const double* a, long long n, int c, long long* flag) {
    check_values<double>(a, n, c, flag);
}
extern "C" __global__ void check_values_bf16(const unsigned short* a, long long n, int c, long long* flag) {
    check_values<unsigned short>(a, n, c, flag);
}

// Packed batches (device_packed.rs): `rows` runs of `width` elements, run r read from
// src[r · src_pitch …] and written to dst[r · dst_pitch …] (a sequence's slots cut out of the
// packed buffer's slot axis, or its slots' gradients placed back into it).
template <typename T>
__device__ void copy_rows(const T* src, long long src_pitch, T* dst, long long dst_pitch, long long width,
                          long long rows) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < rows * width; i += stride) {
        const long long r = i / width, c = i - r * width;
        dst[r * dst_pitch + c] = src[r * src_pitch + c];
    }
}

extern "C" __global__ void copy_rows_f32(const float* src, long long sp, float* dst, long long dp, long long w,
                                         long long rows) {
    copy_rows<float>(src, sp, dst, dp, w, rows);
}
extern "C" __global__ void copy_rows_f64(const double* src, long long sp, double* dst, long long dp, long long w,
                                         long long rows) {
    copy_rows<double>(src, sp, dst, dp, w, rows);
}
extern "C" __global__ void copy_rows_bf16(const unsigned short* src, long long sp, unsigned short* dst,
                                          long long dp, long long w, long long rows) {
    copy_rows<unsigned short>(src, sp, dst, dp, w, rows);
}

// out[i] += a[i]: the gradients of a packed batch's inputs taken whole (Toeplitz taps, λ
// parameters), summed over the sequences in their order (as the host path sums them).
extern "C" __global__ void add_into_f32(const float* a, float* out, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < n; i += stride) out[i] = out[i] + a[i];
}
extern "C" __global__ void add_into_f64(const double* a, double* out, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < n; i += stride) out[i] = out[i] + a[i];
}

