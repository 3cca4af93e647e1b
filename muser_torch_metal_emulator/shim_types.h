// shim_types.h: Metal's scalar types for the CPU emulator.
//
// half is _Float16: g++ rounds every half operation to half, as Metal's
// native half arithmetic does. bfloat is a class that stores the 16 bits and
// computes in float, rounding each result to nearest even. double does not
// exist on Metal; the driver refuses sources that use it.
#pragma once

#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <array>
#include <initializer_list>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

namespace metal {

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
using std::int8_t; using std::int16_t; using std::int32_t; using std::int64_t;
using std::uint8_t; using std::uint16_t; using std::uint32_t; using std::uint64_t;
using std::size_t; using std::ptrdiff_t;
static_assert(sizeof(long) == 8, "Metal's long is 64-bit");

// ---- bfloat --------------------------------------------------------------------
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(float f) : bits(from_float(f)) {}
  template <class U, std::enable_if_t<std::is_integral_v<U>, int> = 0>
  bfloat(U u) : bfloat(float(u)) {}
  bfloat(half h) : bfloat(float(h)) {}
  // Implicitly a float only (a template, so no standard conversion may follow it), and
  // explicitly an integer: `c ? bf : 0` then has one reading (bfloat), as in Metal, where
  // g++ would otherwise find bfloat -> int and int -> bfloat both implicit.
  template <class F, std::enable_if_t<std::is_same_v<F, float>, int> = 0>
  operator F() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  explicit operator I() const { return I(float(*this)); }
  explicit operator half() const { return half(float(*this)); }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7FFFu + ((u >> 16) & 1u);                                           // nearest even
    return uint16_t(u >> 16);
  }
};
static_assert(sizeof(bfloat) == 2, "bfloat is 16 bits");

#define MUSER_EMU_BF_OP(op)                                                                   \
  inline bfloat operator op(bfloat a, bfloat b) { return bfloat(float(a) op float(b)); }      \
  inline float operator op(bfloat a, float b) { return float(a) op b; }                       \
  inline float operator op(float a, bfloat b) { return a op float(b); }                       \
  template <class U, std::enable_if_t<std::is_integral_v<U>, int> = 0>                        \
  inline bfloat operator op(bfloat a, U b) { return a op bfloat(b); }                         \
  template <class U, std::enable_if_t<std::is_integral_v<U>, int> = 0>                        \
  inline bfloat operator op(U a, bfloat b) { return bfloat(a) op b; }                         \
  inline bfloat& operator op##=(bfloat& a, bfloat b) { return a = a op b; }                   \
  inline bfloat& operator op##=(bfloat& a, float b) { return a = bfloat(float(a) op b); }
MUSER_EMU_BF_OP(+) MUSER_EMU_BF_OP(-) MUSER_EMU_BF_OP(*) MUSER_EMU_BF_OP(/)
#undef MUSER_EMU_BF_OP
inline bfloat operator-(bfloat a) { bfloat r; r.bits = uint16_t(a.bits ^ 0x8000u); return r; }
inline bfloat operator+(bfloat a) { return a; }
#define MUSER_EMU_BF_CMP(op)                                                                  \
  inline bool operator op(bfloat a, bfloat b) { return float(a) op float(b); }                \
  inline bool operator op(bfloat a, float b) { return float(a) op b; }                        \
  inline bool operator op(float a, bfloat b) { return a op float(b); }                        \
  template <class U, std::enable_if_t<std::is_integral_v<U>, int> = 0>                        \
  inline bool operator op(bfloat a, U b) { return float(a) op float(b); }
MUSER_EMU_BF_CMP(<) MUSER_EMU_BF_CMP(>) MUSER_EMU_BF_CMP(<=) MUSER_EMU_BF_CMP(>=)
MUSER_EMU_BF_CMP(==) MUSER_EMU_BF_CMP(!=)
#undef MUSER_EMU_BF_CMP

enum class mem_flags : int {
  mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8,
  mem_object_data = 16
};
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

// ---- traits ---------------------------------------------------------------------
// Metal's scalar types (std::is_arithmetic does not know _Float16 or bfloat).
template <class T> struct is_scalar_type
    : std::bool_constant<std::is_arithmetic_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat>> {};
template <class T> inline constexpr bool is_scalar_v = is_scalar_type<std::remove_cv_t<T>>::value;
template <class T> inline constexpr bool is_float_scalar_v =
    std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat>;

using std::conditional; using std::conditional_t; using std::enable_if; using std::enable_if_t;
using std::is_same; using std::is_same_v; using std::integral_constant; using std::bool_constant;
using std::is_signed; using std::is_unsigned; using std::is_integral; using std::is_const;
using std::remove_cv; using std::remove_cv_t; using std::remove_reference; using std::remove_reference_t;
using std::remove_pointer; using std::remove_pointer_t; using std::decay; using std::decay_t;
using std::true_type; using std::false_type; using std::is_pointer; using std::is_void;
using std::make_unsigned; using std::make_unsigned_t; using std::make_signed; using std::make_signed_t;
using std::is_integral_v; using std::is_signed_v; using std::is_unsigned_v; using std::is_pointer_v;
using std::is_void_v;
using std::is_const_v; using std::is_convertible; using std::is_convertible_v; using std::is_base_of;
using std::is_base_of_v; using std::declval; using std::void_t; using std::remove_const; using std::remove_const_t;
using std::remove_volatile; using std::remove_volatile_t; using std::is_reference; using std::is_reference_v;
using std::is_scalar; using std::is_trivially_copyable; using std::underlying_type; using std::underlying_type_t;
using std::common_type; using std::common_type_t; using std::forward; using std::move; using std::swap;
using std::integer_sequence; using std::make_integer_sequence;
template <class T, size_t N> using array = std::array<T, N>;
template <class T> struct is_floating_point : std::bool_constant<is_float_scalar_v<std::remove_cv_t<T>>> {};
template <class T> inline constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T> struct is_arithmetic : std::bool_constant<is_scalar_v<T>> {};
template <class T> inline constexpr bool is_arithmetic_v = is_arithmetic<T>::value;

// ---- numeric_limits ----------------------------------------------------------------
template <class T> struct numeric_limits : std::numeric_limits<T> {};
template <> struct numeric_limits<half> {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true;
  static constexpr int digits = 11, radix = 2;
  static constexpr half min() { return half(6.103515625e-05f); }
  static constexpr half max() { return half(65504.0f); }
  static constexpr half lowest() { return half(-65504.0f); }
  static constexpr half epsilon() { return half(0.0009765625f); }
  static constexpr half infinity() { return half(__builtin_inff()); }
  static constexpr half quiet_NaN() { return half(__builtin_nanf("")); }
  static constexpr half denorm_min() { return half(5.9604644775390625e-08f); }
};
template <> struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true;
  static constexpr int digits = 8, radix = 2;
  static bfloat bits(uint16_t b) { bfloat r; r.bits = b; return r; }
  static bfloat min() { return bits(0x0080); }
  static bfloat max() { return bits(0x7F7F); }
  static bfloat lowest() { return bits(0xFF7F); }
  static bfloat epsilon() { return bits(0x3C00); }
  static bfloat infinity() { return bits(0x7F80); }
  static bfloat quiet_NaN() { return bits(0x7FC0); }
  static bfloat denorm_min() { return bits(0x0001); }
};

}  // namespace metal

// Half literals (1.0h); the driver compiles with -Wno-literal-suffix.
constexpr metal::half operator""h(long double v) { return metal::half(v); }
constexpr metal::half operator""h(unsigned long long v) { return metal::half(v); }
constexpr metal::half operator""H(long double v) { return metal::half(v); }

// ---- Metal's constants (metal_math / metal_limits) -----------------------------------
#define NAN __builtin_nanf("")
#define INFINITY __builtin_inff()
#define HUGE_VALF __builtin_huge_valf()
#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif
#define HALF_MAX 65504.0h
#define HALF_MIN 6.103515625e-05h
#define HALF_EPSILON 0.0009765625h
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
#define M_PI_H 3.14159265358979323846h
#define M_E_H 2.71828182845904523536h
#define M_SQRT2_H 1.41421356237309504880h
