// shim_matrix.h: simdgroup matrices (8x8 of float, half or bfloat).
//
// A simdgroup matrix is spread over the 32 lanes of a simdgroup: lane l holds
// the two elements (row lane_row(l), columns lane_col(l) and lane_col(l)+1),
// which thread_elements() exposes. That is the layout Apple's hardware uses
// (docs/metal.md says where the fact comes from: llama.cpp's mul_mv_mma
// kernels fill and read fragments through thread_elements() with it, and
// MLX's steel GEMM fragments name the same coordinates).
//
// Here each lane keeps a full 8x8 copy. The matrix is what the lanes own:
// loads write every lane's copy; multiplies and stores gather element
// (lane_row(l), lane_col(l)+e) from lane l's copy, so a matrix filled
// lane by lane through thread_elements() is the matrix the hardware would
// see. Loads, stores and multiplies are collectives that need a full
// simdgroup, and loads and stores need the same address, stride, origin and
// transpose on every lane. a, b and c/d may each be float, half or bfloat:
// every element is widened to float (exact), each output element is c plus
// the 8 products added in k order in float, rounded once to d's type (the
// hardware's order and intermediate precision are unspecified).
#pragma once

#include "shim_simd.h"

namespace metal {

namespace emu_detail {
// The lane-to-element layout of an 8x8 simdgroup matrix (see the header comment).
constexpr int lane_row(unsigned l) { return int(((l / 4) & 4) + ((l / 2) % 4)); }
constexpr int lane_col(unsigned l) { return int(((l / 4) & 2) * 2 + (l % 2) * 2); }
}  // namespace emu_detail

template <class T, int Cols, int Rows = Cols>
struct alignas(16) simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "Metal's simdgroup matrices are 8x8");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat>,
                "simdgroup matrices hold float, half or bfloat");
  T e[Rows][Cols];
  simdgroup_matrix() { std::memset(static_cast<void*>(e), 0xFF, sizeof e); }
  explicit simdgroup_matrix(T diag) {
    for (int i = 0; i < Rows; ++i)
      for (int j = 0; j < Cols; ++j) e[i][j] = i == j ? diag : T(0);
  }
  // This lane's two elements, in its own copy (the layout in emu_detail::lane_row / lane_col).
  vec<T, 2>& thread_elements() {
    const unsigned l = emu_current_lane()->simd_lane;
    return *reinterpret_cast<vec<T, 2>*>(&e[emu_detail::lane_row(l)][emu_detail::lane_col(l)]);
  }
  const vec<T, 2>& thread_elements() const { return const_cast<simdgroup_matrix*>(this)->thread_elements(); }
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
// The matrix the lanes hold together: element (lane_row(l), lane_col(l) + e) from lane l's copy.
// `at(lane)` gives lane's copy; lanes are the 32 of a full simdgroup, in any order.
template <class M, class At>
M gather(EmuLane** lanes, int n, At at) {
  M m;
  for (int i = 0; i < n; ++i) {
    const unsigned l = lanes[i]->simd_lane;
    const M& own = at(lanes[i]);
    const int r = lane_row(l), c = lane_col(l);
    m.e[r][c] = own.e[r][c];
    m.e[r][c + 1] = own.e[r][c + 1];
  }
  return m;
}

template <class M, class T, bool Store>
void resolve_matrix_io(EmuLane** lanes, int n) {
  const EmuCollective& c = lanes[0]->coll;
  if (n != 32) emu_fail("%s:%d: %s with %d active lanes (needs a full simdgroup)", c.file, c.line, c.name, n);
  M gathered;
  if (Store) gathered = gather<M>(lanes, n, [](EmuLane* l) -> const M& { return *static_cast<const M*>(l->coll.dst); });
  M& m = Store ? gathered : *static_cast<M*>(c.dst);
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

// Operands: src points at {&a, &b, &c} (c null for simdgroup_multiply), each lane's own copies.
template <class M, int K> const M& operand(EmuLane* l) {
  return *static_cast<const M*>(static_cast<const void* const*>(l->coll.src)[K]);
}
template <class TD, class TA, class TB, class TC>
void resolve_mma(EmuLane** lanes, int n) {
  typedef simdgroup_matrix<TA, 8, 8> MA; typedef simdgroup_matrix<TB, 8, 8> MB;
  typedef simdgroup_matrix<TC, 8, 8> MC; typedef simdgroup_matrix<TD, 8, 8> MD;
  const EmuCollective& c0 = lanes[0]->coll;
  if (n != 32) emu_fail("%s:%d: %s with %d active lanes (needs a full simdgroup)", c0.file, c0.line, c0.name, n);
  const bool has_c = static_cast<const void* const*>(c0.src)[2] != nullptr;
  const MA a = gather<MA>(lanes, n, operand<MA, 0>);
  const MB b = gather<MB>(lanes, n, operand<MB, 1>);
  MC c;
  if (has_c) c = gather<MC>(lanes, n, operand<MC, 2>);
  MD r;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      float acc = has_c ? float(c.e[i][j]) : 0.0f;
      for (int k = 0; k < 8; ++k) acc += float(a.e[i][k]) * float(b.e[k][j]);
      r.e[i][j] = TD(acc);
    }
  for (int i = 0; i < n; ++i) std::memcpy(lanes[i]->coll.dst, &r, sizeof(MD));
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
