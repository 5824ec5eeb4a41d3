// What the generated CUDA needs to compile and run on the host (tests/test_cuda_host.py).
//
// * CUDA's execution-space keywords are empty; a kernel's grid is one thread (blockIdx 0,
//   blockDim 1, gridDim 1), so its grid-stride loop runs every element in turn.
// * CUDA's math names are the C++ standard library's, float overloads included (CUDA's
//   exp(float) is expf, as std::exp(float) is), plus rsqrt, which C++ lacks.
// * math_constants.h: CUDART_INF(_F) and CUDART_NAN(_F).
// * cupy/float16.cuh: float16 is a real IEEE half (_Float16, GCC >= 12) converted from float
//   with round-to-nearest-even, as CuPy's __float2half_rn; arithmetic happens in float (the
//   generated code converts every float16 operand to float).
// * flush-to-zero: set_ftz(true) sets the x86 FTZ and DAZ bits, as CuPy's -ftz=true does for
//   float32 on the GPU (float32 denormal operands read as 0, denormal results become 0).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict

struct HostDim3 { long long x; };
static const HostDim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};

#define CUDART_INF_F __builtin_huge_valf()
#define CUDART_NAN_F __builtin_nanf("")
#define CUDART_INF __builtin_huge_val()
#define CUDART_NAN __builtin_nan("")

using std::ceil;
using std::copysign;
using std::cos;
using std::erf;
using std::exp;
using std::expm1;
using std::fabs;
using std::floor;
using std::fmod;
using std::log;
using std::log1p;
using std::pow;
using std::rint;
using std::sin;
using std::sqrt;
using std::tanh;
using std::tan;
using std::sinh;
using std::cosh;
using std::asin;
using std::acos;
using std::atan;
using std::atan2;
using std::asinh;
using std::acosh;
using std::atanh;
using std::log2;
using std::log10;
using std::signbit;
using std::hypot;
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

class float16 {
  _Float16 data_;
 public:
  float16() = default;
  float16(float v) : data_(static_cast<_Float16>(v)) {}
  explicit float16(double v) : data_(static_cast<_Float16>(static_cast<float>(v))) {}
  explicit float16(bool v) : data_(static_cast<_Float16>(static_cast<float>(v))) {}
  explicit float16(int v) : data_(static_cast<_Float16>(static_cast<float>(v))) {}
  explicit float16(long long v) : data_(static_cast<_Float16>(static_cast<float>(v))) {}
  operator float() const { return static_cast<float>(data_); }
};
static_assert(sizeof(float16) == 2, "float16 must be two bytes, as NumPy's");

inline void set_ftz(bool on) {
#if defined(__SSE__)
  const unsigned bits = 0x8040;  // FTZ | DAZ
  _mm_setcsr(on ? (_mm_getcsr() | bits) : (_mm_getcsr() & ~bits));
#else
  (void)on;
#endif
}

template <typename T> T* load(FILE* f, long long n) {
  T* p = static_cast<T*>(std::malloc(sizeof(T) * (n ? n : 1)));
  if (std::fread(p, sizeof(T), n, f) != static_cast<size_t>(n)) std::abort();
  return p;
}
