// shim_math.h: the metal:: math, integer, relational and geometric functions.
//
// Float functions are glibc's, reached through g++ builtins so that no C
// math function is declared in the global namespace (Metal has none there, and
// sources define their own, e.g. PyTorch's expm1f); within an ulp or two,
// where Metal's safe-math bounds allow several; half and bfloat versions compute in float and round
// once. Vector versions apply the scalar function per element. min/max on
// floats ignore a NaN operand as Metal's fmin/fmax do. fast:: and precise::
// name the same functions (the emulator has one math mode: safe).
#pragma once

#include "shim_vec.h"

namespace metal {

constexpr double kEmuPi = 3.14159265358979323846;

// ---- per-element lifting ---------------------------------------------------------
#define MUSER_EMU_LIFT1(name)                                                                    \
  template <class T, int N> inline auto name(const vec<T, N>& v) {                               \
    return emu_map(v, [](T x) { return name(x); });                                              \
  }                                                                                              \
  template <class T, int S, int... I> inline auto name(const emu_swz<T, S, I...>& v) { return name(v.get()); }
#define MUSER_EMU_LIFT2(name)                                                                    \
  template <class T, int N> inline vec<T, N> name(const vec<T, N>& a, const vec<T, N>& b) {      \
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = name(a.e[i], b.e[i]); return r;            \
  }                                                                                              \
  template <class T, int N> inline vec<T, N> name(const vec<T, N>& a, T b) { return name(a, vec<T, N>(b)); }
#define MUSER_EMU_LIFT3(name)                                                                    \
  template <class T, int N>                                                                      \
  inline vec<T, N> name(const vec<T, N>& a, const vec<T, N>& b, const vec<T, N>& c) {            \
    vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = name(a.e[i], b.e[i], c.e[i]); return r;    \
  }                                                                                              \
  template <class T, int N> inline vec<T, N> name(const vec<T, N>& a, T b, T c) {               \
    return name(a, vec<T, N>(b), vec<T, N>(c));                                                  \
  }

// ---- float functions -------------------------------------------------------------------
#define MUSER_EMU_F1(name, expr)                                                                 \
  inline float name(float x) { return expr; }                                                    \
  inline half name(half x) { return half(name(float(x))); }                                      \
  inline bfloat name(bfloat x) { return bfloat(name(float(x))); }                                \
  MUSER_EMU_LIFT1(name)
MUSER_EMU_F1(acos, __builtin_acosf(x)) MUSER_EMU_F1(acosh, __builtin_acoshf(x)) MUSER_EMU_F1(asin, __builtin_asinf(x))
MUSER_EMU_F1(asinh, __builtin_asinhf(x)) MUSER_EMU_F1(atan, __builtin_atanf(x)) MUSER_EMU_F1(atanh, __builtin_atanhf(x))
MUSER_EMU_F1(ceil, __builtin_ceilf(x)) MUSER_EMU_F1(cos, __builtin_cosf(x)) MUSER_EMU_F1(cosh, __builtin_coshf(x))
MUSER_EMU_F1(cospi, float(__builtin_cos(double(x) * kEmuPi))) MUSER_EMU_F1(exp, __builtin_expf(x))
MUSER_EMU_F1(exp2, __builtin_exp2f(x)) MUSER_EMU_F1(exp10, float(__builtin_pow(10.0, double(x))))
MUSER_EMU_F1(fabs, __builtin_fabsf(x)) MUSER_EMU_F1(floor, __builtin_floorf(x))
MUSER_EMU_F1(fract, __builtin_fminf(x - __builtin_floorf(x), 0x1.fffffep-1f)) MUSER_EMU_F1(log, __builtin_logf(x))
MUSER_EMU_F1(log2, __builtin_log2f(x)) MUSER_EMU_F1(log10, __builtin_log10f(x))
MUSER_EMU_F1(rint, __builtin_nearbyintf(x))
MUSER_EMU_F1(round, __builtin_roundf(x)) MUSER_EMU_F1(rsqrt, float(1.0 / __builtin_sqrt(double(x))))
MUSER_EMU_F1(sin, __builtin_sinf(x)) MUSER_EMU_F1(sinh, __builtin_sinhf(x))
MUSER_EMU_F1(sinpi, float(__builtin_sin(double(x) * kEmuPi)))
MUSER_EMU_F1(sqrt, __builtin_sqrtf(x)) MUSER_EMU_F1(tan, __builtin_tanf(x)) MUSER_EMU_F1(tanh, __builtin_tanhf(x))
MUSER_EMU_F1(tanpi, float(__builtin_tan(double(x) * kEmuPi))) MUSER_EMU_F1(trunc, __builtin_truncf(x))
MUSER_EMU_F1(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))
MUSER_EMU_F1(sign, __builtin_isnan(x) ? 0.0f : x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x)
#undef MUSER_EMU_F1

#define MUSER_EMU_F2(name, expr)                                                                 \
  inline float name(float x, float y) { return expr; }                                           \
  inline half name(half x, half y) { return half(name(float(x), float(y))); }                    \
  inline bfloat name(bfloat x, bfloat y) { return bfloat(name(float(x), float(y))); }            \
  MUSER_EMU_LIFT2(name)
MUSER_EMU_F2(atan2, __builtin_atan2f(x, y)) MUSER_EMU_F2(copysign, __builtin_copysignf(x, y))
MUSER_EMU_F2(fdim, __builtin_fdimf(x, y)) MUSER_EMU_F2(fmax, __builtin_fmaxf(x, y))
MUSER_EMU_F2(fmin, __builtin_fminf(x, y)) MUSER_EMU_F2(fmod, __builtin_fmodf(x, y))
MUSER_EMU_F2(pow, __builtin_powf(x, y)) MUSER_EMU_F2(powr, __builtin_powf(x, y))
MUSER_EMU_F2(step, y < x ? 0.0f : 1.0f) MUSER_EMU_F2(nextafter, __builtin_nextafterf(x, y))
#undef MUSER_EMU_F2

#define MUSER_EMU_F3(name, expr)                                                                 \
  inline float name(float x, float y, float z) { return expr; }                                  \
  inline half name(half x, half y, half z) { return half(name(float(x), float(y), float(z))); }  \
  inline bfloat name(bfloat x, bfloat y, bfloat z) { return bfloat(name(float(x), float(y), float(z))); } \
  MUSER_EMU_LIFT3(name)
MUSER_EMU_F3(fma, __builtin_fmaf(x, y, z)) MUSER_EMU_F3(mix, x + (y - x) * z)
inline float emu_smoothstep(float e0, float e1, float x) {
  const float t = __builtin_fminf(__builtin_fmaxf((x - e0) / (e1 - e0), 0.0f), 1.0f);
  return t * t * (3.0f - 2.0f * t);
}
MUSER_EMU_F3(smoothstep, emu_smoothstep(x, y, z))
#undef MUSER_EMU_F3

inline float ldexp(float x, int k) { return __builtin_ldexpf(x, k); }
inline half ldexp(half x, int k) { return half(__builtin_ldexpf(float(x), k)); }
inline float frexp(float x, int& k) { return __builtin_frexpf(x, &k); }
inline float modf(float x, float& ip) { return __builtin_modff(x, &ip); }
inline float sincos(float x, float& c) { c = __builtin_cosf(x); return __builtin_sinf(x); }
inline half sincos(half x, half& c) { c = half(__builtin_cosf(float(x))); return half(__builtin_sinf(float(x))); }

// ---- min / max / clamp / abs (floats and integers) ------------------------------------------
template <class T> inline T emu_min(T a, T b) {
  if constexpr (is_float_scalar_v<T>) return T(__builtin_fminf(float(a), float(b)));
  else return b < a ? b : a;
}
template <class T> inline T emu_max(T a, T b) {
  if constexpr (is_float_scalar_v<T>) return T(__builtin_fmaxf(float(a), float(b)));
  else return a < b ? b : a;
}
template <class T, std::enable_if_t<is_scalar_v<T>, int> = 0> inline T min(T a, T b) { return emu_min(a, b); }
template <class T, std::enable_if_t<is_scalar_v<T>, int> = 0> inline T max(T a, T b) { return emu_max(a, b); }
template <class T, std::enable_if_t<is_scalar_v<T>, int> = 0> inline T clamp(T x, T lo, T hi) {
  return emu_min(emu_max(x, lo), hi);
}
template <class T, std::enable_if_t<is_scalar_v<T>, int> = 0> inline T min3(T a, T b, T c) { return min(min(a, b), c); }
template <class T, std::enable_if_t<is_scalar_v<T>, int> = 0> inline T max3(T a, T b, T c) { return max(max(a, b), c); }
template <class T, std::enable_if_t<is_scalar_v<T>, int> = 0> inline T median3(T a, T b, T c) {
  return max(min(a, b), min(max(a, b), c));
}
MUSER_EMU_LIFT2(min) MUSER_EMU_LIFT2(max) MUSER_EMU_LIFT3(clamp)
template <class T> inline T abs(T x) {
  if constexpr (emu_is_vec<T>) return emu_map(emu_as_vec(x), [](auto v) { return abs(v); });
  else if constexpr (is_float_scalar_v<T>) return T(__builtin_fabsf(float(x)));
  else if constexpr (std::is_signed_v<T>) return x < 0 ? T(-x) : x;
  else return x;
}

// ---- integer functions ------------------------------------------------------------------------
template <class T> using emu_int_only = std::enable_if_t<std::is_integral_v<T>, int>;
template <class T, emu_int_only<T> = 0> inline T popcount(T x) {
  return T(__builtin_popcountll(static_cast<unsigned long long>(std::make_unsigned_t<T>(x))));
}
template <class T, emu_int_only<T> = 0> inline T clz(T x) {
  const auto u = static_cast<unsigned long long>(std::make_unsigned_t<T>(x));
  return T(u ? __builtin_clzll(u) - (64 - 8 * int(sizeof(T))) : 8 * int(sizeof(T)));
}
template <class T, emu_int_only<T> = 0> inline T ctz(T x) {
  const auto u = static_cast<unsigned long long>(std::make_unsigned_t<T>(x));
  return T(u ? __builtin_ctzll(u) : 8 * int(sizeof(T)));
}
template <class T, emu_int_only<T> = 0> inline std::make_unsigned_t<T> absdiff(T a, T b) {
  return std::make_unsigned_t<T>(a > b ? a - b : b - a);
}
template <class T, emu_int_only<T> = 0> inline T addsat(T a, T b) {
  T r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? std::numeric_limits<T>::max() : std::numeric_limits<T>::min()) : r;
}
template <class T, emu_int_only<T> = 0> inline T subsat(T a, T b) {
  T r;
  return __builtin_sub_overflow(a, b, &r) ? (b < 0 ? std::numeric_limits<T>::max() : std::numeric_limits<T>::min()) : r;
}
template <class T, emu_int_only<T> = 0> inline T hadd(T a, T b) { return T((__int128(a) + b) >> 1); }
template <class T, emu_int_only<T> = 0> inline T rhadd(T a, T b) { return T((__int128(a) + b + 1) >> 1); }
template <class T, emu_int_only<T> = 0> inline T mulhi(T a, T b) {
  return T((__int128(a) * __int128(b)) >> (8 * sizeof(T)));
}
template <class T, emu_int_only<T> = 0> inline T rotate(T v, T k) {
  typedef std::make_unsigned_t<T> U;
  const int bits = 8 * sizeof(T), s = int(U(k) % bits);
  return s ? T((U(v) << s) | (U(v) >> (bits - s))) : v;
}
template <class T, emu_int_only<T> = 0> inline T reverse_bits(T x) {
  typedef std::make_unsigned_t<T> U;
  U u = U(x), r = 0;
  for (int i = 0; i < int(8 * sizeof(T)); ++i) r = U((r << 1) | ((u >> i) & 1));
  return T(r);
}
template <class T, emu_int_only<T> = 0> inline T extract_bits(T x, uint offset, uint bits) {
  typedef std::make_unsigned_t<T> U;
  if (bits == 0) return T(0);
  const U u = U(U(x) << (8 * sizeof(T) - offset - bits));
  if constexpr (std::is_signed_v<T>) return T(T(u) >> (8 * sizeof(T) - bits));
  else return T(u >> (8 * sizeof(T) - bits));
}
template <class T, emu_int_only<T> = 0> inline T insert_bits(T base, T ins, uint offset, uint bits) {
  typedef std::make_unsigned_t<T> U;
  const U mask = bits >= 8 * sizeof(T) ? U(~U(0)) : U(((U(1) << bits) - 1) << offset);
  return T((U(base) & ~mask) | ((U(ins) << offset) & mask));
}
template <class T, emu_int_only<T> = 0> inline T mul24(T a, T b) { return T(a * b); }
template <class T, emu_int_only<T> = 0> inline T mad24(T a, T b, T c) { return T(a * b + c); }
MUSER_EMU_LIFT1(popcount) MUSER_EMU_LIFT1(clz) MUSER_EMU_LIFT1(ctz) MUSER_EMU_LIFT1(reverse_bits)

// ---- relational ----------------------------------------------------------------------------------
#define MUSER_EMU_PRED(name, expr)                                                               \
  inline bool name(float x) { return expr; }                                                     \
  inline bool name(half x) { return name(float(x)); }                                            \
  inline bool name(bfloat x) { return name(float(x)); }                                          \
  MUSER_EMU_LIFT1(name)
MUSER_EMU_PRED(isnan, __builtin_isnan(x)) MUSER_EMU_PRED(isinf, __builtin_isinf(x))
MUSER_EMU_PRED(isfinite, __builtin_isfinite(x)) MUSER_EMU_PRED(isnormal, __builtin_isnormal(x))
MUSER_EMU_PRED(signbit, __builtin_signbit(x))
#undef MUSER_EMU_PRED
inline bool isordered(float a, float b) { return !__builtin_isnan(a) && !__builtin_isnan(b); }
inline bool isunordered(float a, float b) { return __builtin_isnan(a) || __builtin_isnan(b); }

inline bool all(bool b) { return b; }
inline bool any(bool b) { return b; }
template <class A, std::enable_if_t<emu_is_vec<A>, int> = 0> inline bool all(const A& a) {
  const auto v = emu_as_vec(a);
  for (int i = 0; i < emu_ncomp<A>; ++i) if (!v.e[i]) return false;
  return true;
}
template <class A, std::enable_if_t<emu_is_vec<A>, int> = 0> inline bool any(const A& a) {
  const auto v = emu_as_vec(a);
  for (int i = 0; i < emu_ncomp<A>; ++i) if (v.e[i]) return true;
  return false;
}
// select(a, b, c): b where c, else a.
template <class T, std::enable_if_t<is_scalar_v<T>, int> = 0> inline T select(T a, T b, bool c) { return c ? b : a; }
template <class T, int N> inline vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, const vec<bool, N>& c) {
  vec<T, N> r; for (int i = 0; i < N; ++i) r.e[i] = c.e[i] ? b.e[i] : a.e[i]; return r;
}
template <class T, int N> inline vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, bool c) { return c ? b : a; }

// ---- geometric ------------------------------------------------------------------------------------
template <class A, class B, std::enable_if_t<emu_is_vec<A> && emu_is_vec<B>, int> = 0>
inline auto dot(const A& a, const B& b) {
  const auto x = emu_as_vec(a), y = emu_as_vec(b);
  static_assert(emu_ncomp<A> == emu_ncomp<B>, "dot of vectors of different lengths");
  auto s = x.e[0] * y.e[0];
  for (int i = 1; i < emu_ncomp<A>; ++i) s += x.e[i] * y.e[i];
  return s;
}
template <class A, std::enable_if_t<emu_is_vec<A>, int> = 0>
inline auto length_squared(const A& a) { return dot(a, a); }
template <class A, std::enable_if_t<emu_is_vec<A>, int> = 0> inline auto length(const A& a) { return sqrt(dot(a, a)); }
template <class A, class B, std::enable_if_t<emu_is_vec<A>, int> = 0>
inline auto distance(const A& a, const B& b) { return length(emu_as_vec(a) - emu_as_vec(b)); }
template <class A, class B, std::enable_if_t<emu_is_vec<A>, int> = 0>
inline auto distance_squared(const A& a, const B& b) { return length_squared(emu_as_vec(a) - emu_as_vec(b)); }
template <class A, std::enable_if_t<emu_is_vec<A>, int> = 0>
inline auto normalize(const A& a) { const auto v = emu_as_vec(a); return v * rsqrt(dot(v, v)); }
template <class T> inline vec<T, 3> cross(const vec<T, 3>& a, const vec<T, 3>& b) {
  return vec<T, 3>(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}

#undef MUSER_EMU_LIFT1
#undef MUSER_EMU_LIFT2
#undef MUSER_EMU_LIFT3

namespace fast { using namespace ::metal; }
namespace precise { using namespace ::metal; }

}  // namespace metal
