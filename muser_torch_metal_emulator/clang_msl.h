// clang_msl.h: declarations that let clang type-check Metal Shading Language
// source with distinct address spaces (static_check.py; not used to run anything).
//
// The source is compiled as C++ for OpenCL (clang -x cl -cl-std=clc++), whose
// address spaces have Metal's rules: a pointer into one space does not convert
// to another, and threadgroup (local) variables live only in kernel functions.
// g++, which the emulator uses, has one address space and cannot see such
// mistakes. Vector types and their swizzles are OpenCL's own. Only
// declarations: nothing here is evaluated.
#pragma OPENCL EXTENSION cl_khr_fp16 : enable

#include "msl_matrix_types.h"

#define device __global
#define constant __constant
#define threadgroup __local
#define thread __private
#define kernel __kernel

// NAN, INFINITY, MAXFLOAT and M_*_F come from clang's opencl-c-base.h.
#define __METAL__ 1
#define __METAL_VERSION__ 310

typedef unsigned long size_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;

// OpenCL declares `dot` as a builtin, which a source's own `dot` (llama.cpp's common.h has one)
// would clash with; every `dot`, the declaration below included, is renamed.
#define dot msl_dot

namespace metal {

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

template <class T, class U> T as_type(U);

// simd and quad functions
template <class T> T simd_sum(T);
template <class T> T simd_product(T);
template <class T> T simd_max(T);
template <class T> T simd_min(T);
template <class T> T simd_and(T);
template <class T> T simd_or(T);
template <class T> T simd_xor(T);
template <class T> T simd_prefix_inclusive_sum(T);
template <class T> T simd_prefix_exclusive_sum(T);
template <class T> T simd_shuffle(T, ushort);
template <class T> T simd_shuffle_down(T, ushort);
template <class T> T simd_shuffle_up(T, ushort);
template <class T> T simd_shuffle_xor(T, ushort);
template <class T> T simd_shuffle_rotate_down(T, ushort);
template <class T> T simd_shuffle_rotate_up(T, ushort);
template <class T> T simd_broadcast(T, ushort);
template <class T> T simd_broadcast_first(T);
template <class T> T quad_sum(T);
template <class T> T quad_shuffle(T, ushort);
template <class T> T quad_shuffle_xor(T, ushort);
template <class T> T quad_broadcast(T, ushort);
bool simd_all(bool);
bool simd_any(bool);
bool simd_is_first();

// math (type-checked loosely: one template per name)
template <class T> T abs(T);
template <class T> T fabs(T);
template <class T> T sqrt(T);
template <class T> T rsqrt(T);
template <class T> T exp(T);
template <class T> T exp2(T);
template <class T> T log(T);
template <class T> T log2(T);
template <class T> T floor(T);
template <class T> T ceil(T);
template <class T> T round(T);
template <class T> T trunc(T);
template <class T> T tanh(T);
template <class T> T sin(T);
template <class T> T cos(T);
template <class T> T fma(T, T, T);
template <class T> T min(T, T);
template <class T> T max(T, T);
template <class T> T clamp(T, T, T);
template <class T> T select(T, T, bool);
template <class T> bool isnan(T);
template <class T> bool isinf(T);
template <class T> auto dot(T, T) -> decltype(T().x);

// simdgroup matrices
template <class T, int Cols, int Rows = Cols>
struct simdgroup_matrix {
  simdgroup_matrix();
  explicit simdgroup_matrix(T);
  typedef T elements __attribute__((ext_vector_type(2)));
  elements& thread_elements();
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

// matrix<T, C, R>: C columns of R-vectors (floatCxR, halfCxR).
template <class T, int C, int R = C>
struct matrix {
  typedef T column __attribute__((ext_vector_type(R)));
  column columns[C];
  matrix();
  explicit matrix(T);
  template <class U> explicit matrix(const matrix<U, C, R>&);
  column& operator[](int);
  const column& operator[](int) const;
  matrix operator*(T) const;
};
MUSER_MSL_MATRIX_TYPES(float)
MUSER_MSL_MATRIX_TYPES(half)
template <class T, int C, int R = C> simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T);
template <class T, int C, int R>
void simdgroup_load(thread simdgroup_matrix<T, C, R>&, const threadgroup T*, ulong = C, ulong2 = 0, bool = false);
template <class T, int C, int R>
void simdgroup_load(thread simdgroup_matrix<T, C, R>&, const device T*, ulong = C, ulong2 = 0, bool = false);
template <class T, int C, int R>
void simdgroup_store(thread const simdgroup_matrix<T, C, R>&, threadgroup T*, ulong = C, ulong2 = 0, bool = false);
template <class T, int C, int R>
void simdgroup_store(thread const simdgroup_matrix<T, C, R>&, device T*, ulong = C, ulong2 = 0, bool = false);
template <class TD, class TA, class TB, class TC>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, 8, 8>&, thread const simdgroup_matrix<TA, 8, 8>&,
                                   thread const simdgroup_matrix<TB, 8, 8>&, thread const simdgroup_matrix<TC, 8, 8>&);

}  // namespace metal
