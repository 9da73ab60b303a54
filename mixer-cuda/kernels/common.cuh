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
template <typename T> struct Cplx {
    T re, im;
};

// Global thread index of a 1-D launch.
__device__ inline long long gtid() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }
