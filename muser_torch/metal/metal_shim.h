// metal_shim.h: lets an unmodified .metal source compile with g++ (C++17)
// and run on the fiber runtime in emu_runtime.cpp.
//
// Contract with the driver (emulator.py): the driver preprocesses the source
// with this header force-included, finds every `kernel void name(...)` by the
// __emu_kernel__ marker, and appends one extern "C" wrapper per kernel that
// binds [[buffer(i)]] to the i-th argument and the builtin attributes to the
// current lane. Everything the wrapper and the runtime share is declared here.
//
// Address spaces vanish (`constant` becomes `const`), `half` is _Float16
// (g++ may keep excess float precision inside a half expression; the kernels
// here convert halfs to float before any arithmetic), and every simd_*, barrier and
// simdgroup-matrix builtin is a collective: the lane parks, and the runtime
// resolves the collective once every live lane of its scope has arrived at
// the same call site (file:line), or reports divergence.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace metal {

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
static_assert(sizeof(long) == 8, "Metal's long is 64-bit");

// Vector types with Metal's sizes and alignment (a 3-vector occupies four
// elements), named components and indexing; no arithmetic, which the kernels
// here do not use on vectors.
template <class T>
struct alignas(sizeof(T) * 2) vec2 {
  T x, y;
  vec2() : x(0), y(0) {}
  explicit vec2(T s) : x(s), y(s) {}
  vec2(T a, T b) : x(a), y(b) {}
  template <class U> explicit vec2(const vec2<U>& o) : x(T(o.x)), y(T(o.y)) {}
  T& operator[](int i) { return i ? y : x; }
  T operator[](int i) const { return i ? y : x; }
  static constexpr int size = 2;
};
template <class T>
struct alignas(sizeof(T) * 4) vec3 {
  T x, y, z;
  vec3() : x(0), y(0), z(0) {}
  explicit vec3(T s) : x(s), y(s), z(s) {}
  vec3(T a, T b, T c) : x(a), y(b), z(c) {}
  template <class U> explicit vec3(const vec3<U>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)) {}
  T& operator[](int i) { return i == 0 ? x : i == 1 ? y : z; }
  T operator[](int i) const { return i == 0 ? x : i == 1 ? y : z; }
  static constexpr int size = 3;
};
template <class T>
struct alignas(sizeof(T) * 4) vec4 {
  T x, y, z, w;
  vec4() : x(0), y(0), z(0), w(0) {}
  explicit vec4(T s) : x(s), y(s), z(s), w(s) {}
  vec4(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  template <class U> explicit vec4(const vec4<U>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)), w(T(o.w)) {}
  T& operator[](int i) { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
  T operator[](int i) const { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
  static constexpr int size = 4;
};
#define MUSER_EMU_VECS(T, base) \
  typedef vec2<T> base##2; typedef vec3<T> base##3; typedef vec4<T> base##4;
MUSER_EMU_VECS(float, float) MUSER_EMU_VECS(half, half) MUSER_EMU_VECS(int, int)
MUSER_EMU_VECS(uint, uint) MUSER_EMU_VECS(short, short) MUSER_EMU_VECS(ushort, ushort)
MUSER_EMU_VECS(char, char) MUSER_EMU_VECS(uchar, uchar) MUSER_EMU_VECS(long, long)
MUSER_EMU_VECS(ulong, ulong)
#undef MUSER_EMU_VECS
static_assert(sizeof(uint3) == 16 && sizeof(float3) == 16 && sizeof(half2) == 4, "Metal vector sizes");

template <class T, class U>
inline T as_type(U u) {
  static_assert(sizeof(T) == sizeof(U), "as_type needs equal sizes");
  T t;
  std::memcpy(&t, &u, sizeof(T));
  return t;
}

using std::abs; using std::exp; using std::exp2; using std::fabs; using std::floor;
using std::log; using std::sqrt; using std::ldexp; using std::isnan; using std::isinf;
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
template <class T> inline T min(T a, T b) { return a < b ? a : b; }
template <class T> inline T max(T a, T b) { return a > b ? a : b; }
template <class T> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }

enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

}  // namespace metal

// ---------------------------------------------------------------- runtime ABI
struct EmuLane;
typedef void (*EmuResolve)(EmuLane** lanes, int n);

enum EmuScope { EMU_SIMD = 0, EMU_THREADGROUP = 1 };

// What a parked lane is waiting on. Lanes of one scope must agree on
// (resolve, file, line); `key` must also agree where the op needs uniform
// arguments (simdgroup matrix loads and stores).
struct EmuCollective {
  const char* name;
  const char* file;
  int line;
  int scope;
  EmuResolve resolve;
  bool uniform;
  uint64_t key;
  int64_t arg;                          // source lane / delta for shuffles
  const void* src;                      // simdgroup_load / store operands
  void* dst;
  uint64_t stride, ox, oy;
  bool transpose;
  alignas(16) unsigned char in[16];
  alignas(16) unsigned char out[16];
};

struct EmuLane {
  metal::uint3 tpig, tgpig, tptg, tptg_dims, groups, grid;
  unsigned tid, simd_lane, simd_index, simds;
  int state;            // 0 ready, 1 parked, 2 done
  void* sp;
  void* stack;
  unsigned tg_allocs;   // threadgroup arrays this lane has declared so far
  EmuCollective coll;
};

extern "C" {
EmuLane* emu_current_lane();
void emu_park(EmuCollective* c);  // fills the lane's slot and yields
void* emu_tg_alloc(size_t bytes, size_t align, const char* file, int line);
[[noreturn]] void emu_fail(const char* fmt, ...);
}

// Builtin attribute value -> the kernel's declared parameter type.
template <class T>
inline T emu_attr(metal::uint3 v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return T(v.x);
  } else {
    T r;
    for (int i = 0; i < T::size; ++i) r[i] = std::remove_reference_t<decltype(r[0])>(v[i]);
    return r;
  }
}

// [[buffer(i)]] -> pointer or reference parameter.
template <class T>
inline T emu_bind(void* p) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(p);
  } else {
    return *reinterpret_cast<std::remove_reference_t<T>*>(p);
  }
}

// ---------------------------------------------------------------- collectives
namespace metal {

namespace emu_detail {
template <class T> inline void put(EmuCollective& c, T v) {
  static_assert(sizeof(T) <= sizeof(c.in), "collective operand too large");
  std::memcpy(c.in, &v, sizeof(T));
}
template <class T> inline T get_in(const EmuLane* l) { T v; std::memcpy(&v, l->coll.in, sizeof(T)); return v; }
template <class T> inline void set_out(EmuLane* l, T v) { std::memcpy(l->coll.out, &v, sizeof(T)); }

// Pairwise tree over the simdgroup's lanes in lane order; every lane gets the
// same value. This fixes the reduction order the kernels document.
template <class T, class Op>
void resolve_tree(EmuLane** lanes, int n) {
  T v[32];
  for (int i = 0; i < n; ++i) v[i] = get_in<T>(lanes[i]);
  int m = n;
  while (m > 1) {
    int h = m / 2;
    for (int i = 0; i < h; ++i) v[i] = Op()(v[2 * i], v[2 * i + 1]);
    if (m & 1) v[h] = v[m - 1];
    m = h + (m & 1);
  }
  for (int i = 0; i < n; ++i) set_out<T>(lanes[i], v[0]);
}
struct Add { template <class T> T operator()(T a, T b) const { return a + b; } };
struct Max { template <class T> T operator()(T a, T b) const { return a > b ? a : b; } };
struct Min { template <class T> T operator()(T a, T b) const { return a < b ? a : b; } };

EmuLane* find_lane(EmuLane** lanes, int n, int64_t simd_lane);

template <class T>
void resolve_shuffle(EmuLane** lanes, int n) {
  for (int i = 0; i < n; ++i) {
    EmuLane* src = find_lane(lanes, n, lanes[i]->coll.arg);
    if (!src)
      emu_fail("%s:%d: %s reads lane %lld, which is not active", lanes[i]->coll.file,
               lanes[i]->coll.line, lanes[i]->coll.name, (long long)lanes[i]->coll.arg);
    set_out<T>(lanes[i], get_in<T>(src));
  }
}

inline void resolve_nothing(EmuLane**, int) {}

template <class T>
inline T collective(const char* name, T v, EmuResolve r, int64_t arg, const char* file, int line) {
  EmuCollective c{};
  c.name = name; c.file = file; c.line = line; c.scope = EMU_SIMD; c.resolve = r; c.arg = arg;
  put(c, v);
  emu_park(&c);
  T out;
  std::memcpy(&out, emu_current_lane()->coll.out, sizeof(T));
  return out;
}
}  // namespace emu_detail

#define MUSER_EMU_SITE const char* file = __builtin_FILE(), int line = __builtin_LINE()

template <class T> inline T simd_sum(T v, MUSER_EMU_SITE) {
  return emu_detail::collective("simd_sum", v, emu_detail::resolve_tree<T, emu_detail::Add>, 0, file, line);
}
template <class T> inline T simd_max(T v, MUSER_EMU_SITE) {
  return emu_detail::collective("simd_max", v, emu_detail::resolve_tree<T, emu_detail::Max>, 0, file, line);
}
template <class T> inline T simd_min(T v, MUSER_EMU_SITE) {
  return emu_detail::collective("simd_min", v, emu_detail::resolve_tree<T, emu_detail::Min>, 0, file, line);
}
template <class T> inline T simd_shuffle(T v, ushort src, MUSER_EMU_SITE) {
  return emu_detail::collective("simd_shuffle", v, emu_detail::resolve_shuffle<T>, src, file, line);
}
template <class T> inline T simd_broadcast(T v, ushort src, MUSER_EMU_SITE) {
  return emu_detail::collective("simd_broadcast", v, emu_detail::resolve_shuffle<T>, src, file, line);
}
template <class T> inline T simd_shuffle_xor(T v, ushort mask, MUSER_EMU_SITE) {
  int64_t src = int64_t(emu_current_lane()->simd_lane ^ mask);
  return emu_detail::collective("simd_shuffle_xor", v, emu_detail::resolve_shuffle<T>, src, file, line);
}
template <class T> inline T simd_shuffle_down(T v, ushort delta, MUSER_EMU_SITE) {
  // Metal leaves lanes whose source is past the simdgroup with their own value.
  int64_t src = int64_t(emu_current_lane()->simd_lane) + delta;
  if (src > 31) src = emu_current_lane()->simd_lane;
  return emu_detail::collective("simd_shuffle_down", v, emu_detail::resolve_shuffle<T>, src, file, line);
}

inline void simdgroup_barrier(mem_flags, MUSER_EMU_SITE) {
  emu_detail::collective("simdgroup_barrier", 0, emu_detail::resolve_nothing, 0, file, line);
}

inline void threadgroup_barrier(mem_flags, MUSER_EMU_SITE) {
  EmuCollective c{};
  c.name = "threadgroup_barrier"; c.file = file; c.line = line; c.scope = EMU_THREADGROUP;
  c.resolve = emu_detail::resolve_nothing;
  emu_park(&c);
}

// ------------------------------------------------------- simdgroup matrices
// Each lane holds the whole matrix (Metal spreads it over the 32 lanes); the
// loads and stores happen inside the collective, for every lane at once, and
// must have the same address and stride on every lane.
template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  T e[Rows][Cols];
  simdgroup_matrix() { for (auto& r : e) for (auto& x : r) x = T(NAN); }
  explicit simdgroup_matrix(T diag) {
    for (int i = 0; i < Rows; ++i) for (int j = 0; j < Cols; ++j) e[i][j] = i == j ? diag : T(0);
  }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int Cols, int Rows = Cols>
inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, Cols, Rows> m;
  for (auto& r : m.e) for (auto& x : r) x = v;
  return m;
}

namespace emu_detail {
template <class M, class T, bool Store>
void resolve_matrix_io(EmuLane** lanes, int n) {
  if (n != 32)
    emu_fail("%s:%d: %s with %d active lanes (needs a full simdgroup)", lanes[0]->coll.file,
             lanes[0]->coll.line, lanes[0]->coll.name, n);
  // Every lane passed the same address, stride, origin and transpose (the
  // runtime checked the key), so one lane's transfer stands for all.
  const EmuCollective& c = lanes[0]->coll;
  M& m = *static_cast<M*>(c.dst);
  if (Store) {
    for (int i = 1; i < n; ++i)
      if (std::memcmp(lanes[i]->coll.dst, &m, sizeof(M)) != 0)
        emu_fail("%s:%d: simdgroup_store of a matrix that differs between lanes 0 and %u", c.file,
                 c.line, lanes[i]->simd_lane);
  }
  const int rows = sizeof(m.e) / sizeof(m.e[0]), cols = sizeof(m.e[0]) / sizeof(m.e[0][0]);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k) {
      // (r, k) of the matrix is element (row, col) of memory, counted from the origin.
      uint64_t row = c.transpose ? k : r, col = c.transpose ? r : k;
      T* p = (T*)c.src + (c.oy + row) * c.stride + c.ox + col;
      if (Store) *p = m.e[r][k]; else m.e[r][k] = *p;
    }
  if (!Store)
    for (int i = 1; i < n; ++i) *static_cast<M*>(lanes[i]->coll.dst) = m;
}
template <class M, class T, bool Store>
inline void matrix_io(const char* name, M& m, const T* p, ulong stride, ulong2 origin, bool transpose,
                      const char* file, int line) {
  EmuCollective c{};
  c.name = name; c.file = file; c.line = line; c.scope = EMU_SIMD;
  c.resolve = resolve_matrix_io<M, T, Store>;
  c.src = p; c.dst = &m; c.stride = stride; c.ox = origin[0]; c.oy = origin[1]; c.transpose = transpose;
  c.uniform = true;
  c.key = uint64_t(reinterpret_cast<uintptr_t>(p)) * 1000003u ^ stride * 7919u ^ origin[0] * 31u ^
          origin[1] * 131u ^ uint64_t(transpose);
  emu_park(&c);
}
}  // namespace emu_detail

template <class T, int C, int R>
inline void simdgroup_load(simdgroup_matrix<T, C, R>& m, const T* src, ulong elements_per_row = C,
                           ulong2 origin = ulong2(0, 0), bool transpose = false, MUSER_EMU_SITE) {
  emu_detail::matrix_io<simdgroup_matrix<T, C, R>, T, false>("simdgroup_load", m, src, elements_per_row,
                                                             origin, transpose, file, line);
}
template <class T, int C, int R>
inline void simdgroup_store(const simdgroup_matrix<T, C, R>& m, T* dst, ulong elements_per_row = C,
                            ulong2 origin = ulong2(0, 0), bool transpose = false, MUSER_EMU_SITE) {
  emu_detail::matrix_io<simdgroup_matrix<T, C, R>, T, true>(
      "simdgroup_store", const_cast<simdgroup_matrix<T, C, R>&>(m), dst, elements_per_row, origin,
      transpose, file, line);
}
namespace emu_detail {
// Operands live in each lane's copy; they must agree (they do when every load
// was uniform), so the product is computed once and copied to every lane.
template <class M, int N>
void resolve_mma(EmuLane** lanes, int n) {
  if (n != 32)
    emu_fail("%s:%d: simdgroup_multiply_accumulate with %d active lanes (needs a full simdgroup)",
             lanes[0]->coll.file, lanes[0]->coll.line, n);
  const M* const* ops0 = static_cast<const M* const*>(lanes[0]->coll.src);
  for (int i = 1; i < n; ++i) {
    const M* const* ops = static_cast<const M* const*>(lanes[i]->coll.src);
    for (int k = 0; k < 3; ++k)
      if (std::memcmp(ops[k], ops0[k], sizeof(M)) != 0)
        emu_fail("%s:%d: simdgroup_multiply_accumulate operand %d differs between lanes 0 and %u",
                 lanes[0]->coll.file, lanes[0]->coll.line, k, lanes[i]->simd_lane);
  }
  const M &a = *ops0[0], &b = *ops0[1], &c = *ops0[2];
  M r;
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) {
      auto acc = c.e[i][j];
      for (int k = 0; k < N; ++k) acc += a.e[i][k] * b.e[k][j];
      r.e[i][j] = acc;
    }
  for (int i = 0; i < n; ++i) *static_cast<M*>(lanes[i]->coll.dst) = r;
}
}  // namespace emu_detail

// d = a * b + c; per element, c plus the products summed over k in order.
template <class T, int N>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<T, N, N>& d, const simdgroup_matrix<T, N, N>& a,
                                          const simdgroup_matrix<T, N, N>& b,
                                          const simdgroup_matrix<T, N, N>& c, MUSER_EMU_SITE) {
  typedef simdgroup_matrix<T, N, N> M;
  const M* ops[3] = {&a, &b, &c};
  EmuCollective coll{};
  coll.name = "simdgroup_multiply_accumulate"; coll.file = file; coll.line = line; coll.scope = EMU_SIMD;
  coll.resolve = emu_detail::resolve_mma<M, N>;
  coll.src = ops; coll.dst = &d;
  emu_park(&coll);
}
#undef MUSER_EMU_SITE

}  // namespace metal

using namespace metal;

// ------------------------------------------------- MSL keywords and macros
#ifndef MUSER_EMU_NO_KEYWORDS
#define kernel __emu_kernel__
#define device
#define thread
#define threadgroup
#define constant const
// Threadgroup arrays: one allocation per threadgroup, shared by its lanes,
// filled with NaN bytes, counted against the 32 KiB limit. The .metal
// sources declare them through this macro (its Metal definition lives in
// common.metal); a bare `threadgroup T name[n]` would be per-lane here, so the
// driver rejects sources that declare one.
#define MUSER_TG_ARRAY(T, name, n) \
  T* name = static_cast<T*>(emu_tg_alloc(sizeof(T) * (n), alignof(T), __FILE__, __LINE__))
#endif
