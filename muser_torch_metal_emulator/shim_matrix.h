// shim_matrix.h: simdgroup matrices (8x8 of float, half or bfloat).
//
// Each lane holds the whole matrix (Metal spreads it over the 32 lanes in an
// unspecified layout, so thread_elements() is refused at compile time). Loads
// and stores are collectives that need a full simdgroup and the same address,
// stride, origin and transpose on every lane; the transfer happens once. A
// multiply checks that every lane holds the same operands, then computes each
// element as c + the 8 products in k order, in float, and rounds once to the
// destination type (the hardware's order and intermediate precision are
// unspecified). Supported combinations: all operands of one type, or half or
// bfloat a and b with float c and d.
#pragma once

#include "shim_simd.h"

namespace metal {

template <class T, int Cols, int Rows = Cols>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "Metal's simdgroup matrices are 8x8");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat>,
                "simdgroup matrices hold float, half or bfloat");
  T e[Rows][Cols];
  simdgroup_matrix() { std::memset(static_cast<void*>(e), 0xFF, sizeof e); }
  explicit simdgroup_matrix(T diag) {
    for (int i = 0; i < Rows; ++i)
      for (int j = 0; j < Cols; ++j) e[i][j] = i == j ? diag : T(0);
  }
  // The lane-to-element mapping is not specified by Metal, and each lane here
  // holds the whole matrix: refuse rather than guess.
  vec<T, 2>& thread_elements() __attribute__((error(
      "simdgroup_matrix::thread_elements() is not supported by the Metal emulator (Metal does not specify which "
      "elements a lane holds)")));
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Cols, int Rows = Cols>
inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, Cols, Rows> m;
  for (auto& r : m.e) for (auto& x : r) x = v;
  return m;
}

namespace emu_detail {
template <class M, class T, bool Store>
void resolve_matrix_io(EmuLane** lanes, int n) {
  const EmuCollective& c = lanes[0]->coll;
  if (n != 32) emu_fail("%s:%d: %s with %d active lanes (needs a full simdgroup)", c.file, c.line, c.name, n);
  M& m = *static_cast<M*>(c.dst);
  if (Store) {
    for (int i = 1; i < n; ++i)
      if (std::memcmp(lanes[i]->coll.dst, &m, sizeof(M)) != 0)
        emu_fail("%s:%d: simdgroup_store of a matrix that differs between lanes 0 and %u", c.file, c.line,
                 lanes[i]->simd_lane);
  }
  // (r, k) of the matrix is element (row, col) of memory, counted from the
  // origin (x = column, y = row); transposed, (r, k) comes from (k, r).
  for (int r = 0; r < 8; ++r)
    for (int k = 0; k < 8; ++k) {
      const uint64_t row = c.transpose ? k : r, col = c.transpose ? r : k;
      T* p = (T*)c.src + (c.oy + row) * c.stride + c.ox + col;
      if (Store) *p = m.e[r][k]; else m.e[r][k] = *p;
    }
  if (!Store)
    for (int i = 1; i < n; ++i) std::memcpy(lanes[i]->coll.dst, &m, sizeof(M));
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

// Operands: src points at {&a, &b, &c}; every lane must hold the same values.
template <class TD, class TA, class TB, class TC>
void resolve_mma(EmuLane** lanes, int n) {
  typedef simdgroup_matrix<TA, 8, 8> MA; typedef simdgroup_matrix<TB, 8, 8> MB;
  typedef simdgroup_matrix<TC, 8, 8> MC; typedef simdgroup_matrix<TD, 8, 8> MD;
  const EmuCollective& c0 = lanes[0]->coll;
  if (n != 32) emu_fail("%s:%d: %s with %d active lanes (needs a full simdgroup)", c0.file, c0.line, c0.name, n);
  const void* const* ops0 = static_cast<const void* const*>(c0.src);
  const size_t sizes[3] = {sizeof(MA), sizeof(MB), sizeof(MC)};
  for (int i = 1; i < n; ++i) {
    const void* const* ops = static_cast<const void* const*>(lanes[i]->coll.src);
    for (int k = 0; k < 3; ++k)
      if (ops[k] && std::memcmp(ops[k], ops0[k], sizes[k]) != 0)
        emu_fail("%s:%d: %s operand %c differs between lanes 0 and %u", c0.file, c0.line, c0.name, "abc"[k],
                 lanes[i]->simd_lane);
  }
  const MA& a = *static_cast<const MA*>(ops0[0]);
  const MB& b = *static_cast<const MB*>(ops0[1]);
  const MC* c = static_cast<const MC*>(ops0[2]);
  MD r;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      float acc = c ? float(c->e[i][j]) : 0.0f;
      for (int k = 0; k < 8; ++k) acc += float(a.e[i][k]) * float(b.e[k][j]);
      r.e[i][j] = TD(acc);
    }
  for (int i = 0; i < n; ++i) std::memcpy(lanes[i]->coll.dst, &r, sizeof(MD));
}
template <class TD, class TA, class TB, class TC> constexpr bool mma_types_ok() {
  return std::is_same_v<TA, TB> && std::is_same_v<TC, TD> &&
         (std::is_same_v<TA, TD> || (std::is_same_v<TD, float> && !std::is_same_v<TA, float>));
}
}  // namespace emu_detail

template <class T, int C, int R>
inline void simdgroup_load(simdgroup_matrix<T, C, R>& m, const T* src, ulong elements_per_row = C,
                           ulong2 origin = ulong2(0ul, 0ul), bool transpose = false, MUSER_EMU_SITE) {
  emu_detail::matrix_io<simdgroup_matrix<T, C, R>, T, false>("simdgroup_load", m, src, elements_per_row, origin,
                                                             transpose, file, line);
}
template <class T, int C, int R>
inline void simdgroup_store(const simdgroup_matrix<T, C, R>& m, T* dst, ulong elements_per_row = C,
                            ulong2 origin = ulong2(0ul, 0ul), bool transpose = false, MUSER_EMU_SITE) {
  emu_detail::matrix_io<simdgroup_matrix<T, C, R>, T, true>(
      "simdgroup_store", const_cast<simdgroup_matrix<T, C, R>&>(m), dst, elements_per_row, origin, transpose,
      file, line);
}

// d = a * b + c
template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>& c,
                                          MUSER_EMU_SITE) {
  static_assert(emu_detail::mma_types_ok<TD, TA, TB, TC>(),
                "simdgroup_multiply_accumulate: a and b must share a type, c and d another, which is either the "
                "same or float");
  const void* ops[3] = {&a, &b, &c};
  EmuCollective coll{};
  coll.name = "simdgroup_multiply_accumulate"; coll.file = file; coll.line = line; coll.scope = EMU_SIMD;
  coll.resolve = emu_detail::resolve_mma<TD, TA, TB, TC>;
  coll.src = ops; coll.dst = &d;
  emu_park(&coll);
}
// d = a * b
template <class TD, class TA, class TB>
inline void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                               const simdgroup_matrix<TB, 8, 8>& b, MUSER_EMU_SITE) {
  static_assert(emu_detail::mma_types_ok<TD, TA, TB, TD>(), "simdgroup_multiply: unsupported type combination");
  const void* ops[3] = {&a, &b, nullptr};
  EmuCollective coll{};
  coll.name = "simdgroup_multiply"; coll.file = file; coll.line = line; coll.scope = EMU_SIMD;
  coll.resolve = emu_detail::resolve_mma<TD, TA, TB, TD>;
  coll.src = ops; coll.dst = &d;
  emu_park(&coll);
}

#undef MUSER_EMU_SITE
#undef MUSER_EMU_AT

}  // namespace metal
