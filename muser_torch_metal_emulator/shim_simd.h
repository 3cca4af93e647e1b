// shim_simd.h: SIMD-group and quad-group functions and the barriers.
//
// Each is a collective: the lane parks, and the runtime resolves the call
// once every live lane of its simdgroup has arrived at the same call site
// (file:line), or reports divergence. Lanes that have returned are inactive,
// as on Metal: reductions, votes and prefix scans cover the active lanes; a
// shuffle that reads an inactive lane is reported (Metal leaves it
// undefined). Reductions add as a pairwise tree in lane order and prefix
// scans in lane order; the hardware's order is unspecified.
#pragma once

#include "shim_math.h"
#include "shim_runtime.h"

namespace metal {

namespace emu_detail {
template <class T> inline void put(EmuCollective& c, const T& v, int slot = 0) {
  static_assert(2 * sizeof(T) <= sizeof(c.in) && sizeof(T) <= sizeof(EmuCollective::out),
                "collective operand too large");
  std::memcpy(c.in + slot * sizeof(T), static_cast<const void*>(&v), sizeof(T));
}
template <class T> inline T get_in(const EmuLane* l, int slot = 0) {
  T v;
  std::memcpy(static_cast<void*>(&v), l->coll.in + slot * sizeof(T), sizeof(T));
  return v;
}
template <class T> inline void set_out(EmuLane* l, const T& v) {
  std::memcpy(l->coll.out, static_cast<const void*>(&v), sizeof(T));
}
[[noreturn]] void fail_inactive(const EmuLane* reader, int64_t src);

// Lanes [begin, end) of `lanes` (sorted by lane) form W-wide groups: simdgroup (32) or quad (4).
template <int W> inline int group_end(EmuLane** lanes, int n, int begin) {
  int e = begin;
  while (e < n && lanes[e]->simd_lane / W == lanes[begin]->simd_lane / W) ++e;
  return e;
}

template <class T, class Op, int W> void resolve_reduce(EmuLane** lanes, int n) {
  for (int b = 0; b < n;) {
    const int e = group_end<W>(lanes, n, b);
    T v[32];
    int m = e - b;
    for (int i = 0; i < m; ++i) v[i] = get_in<T>(lanes[b + i]);
    while (m > 1) {
      const int h = m / 2;
      for (int i = 0; i < h; ++i) v[i] = Op()(v[2 * i], v[2 * i + 1]);
      if (m & 1) v[h] = v[m - 1];
      m = h + (m & 1);
    }
    for (int i = b; i < e; ++i) set_out<T>(lanes[i], v[0]);
    b = e;
  }
}
template <class T, class Op, int W, bool Inclusive> void resolve_prefix(EmuLane** lanes, int n) {
  for (int b = 0; b < n;) {
    const int e = group_end<W>(lanes, n, b);
    T acc = Op::identity();
    for (int i = b; i < e; ++i) {
      const T v = get_in<T>(lanes[i]);
      if (Inclusive) acc = Op()(acc, v);
      set_out<T>(lanes[i], acc);
      if (!Inclusive) acc = Op()(acc, v);
    }
    b = e;
  }
}
struct Add { template <class T> T operator()(T a, T b) const { return a + b; } };
struct Mul { template <class T> T operator()(T a, T b) const { return a * b; } };
struct Min { template <class T> T operator()(T a, T b) const { return min(a, b); } };
struct Max { template <class T> T operator()(T a, T b) const { return max(a, b); } };
struct And { template <class T> T operator()(T a, T b) const { return a & b; } };
struct Or { template <class T> T operator()(T a, T b) const { return a | b; } };
struct Xor { template <class T> T operator()(T a, T b) const { return a ^ b; } };
template <class T> struct SumOf { T operator()(T a, T b) const { return a + b; } static T identity() { return T(0); } };
template <class T> struct ProductOf {
  T operator()(T a, T b) const { return a * b; }
  static T identity() { return T(1); }
};

EmuLane* find_lane(EmuLane** lanes, int n, int64_t simd_lane);

// coll.arg is the source lane each reader computed; coll.src != nullptr marks
// the *_and_fill variants, whose second value (slot 1) fills past the end.
template <class T> void resolve_shuffle(EmuLane** lanes, int n) {
  T got[32];
  for (int i = 0; i < n; ++i) {
    int64_t s = lanes[i]->coll.arg;
    int slot = 0;
    if (s >= 1000) { s -= 1000; slot = 1; }         // and_fill: read the source's filling value
    EmuLane* src = find_lane(lanes, n, s);
    if (!src) fail_inactive(lanes[i], s);
    got[i] = get_in<T>(src, slot);
  }
  for (int i = 0; i < n; ++i) set_out<T>(lanes[i], got[i]);
}
template <class T> void resolve_first(EmuLane** lanes, int n) {
  const T v = get_in<T>(lanes[0]);
  for (int i = 0; i < n; ++i) set_out<T>(lanes[i], v);
}
// out = (mask of lanes that voted true, mask of active lanes), bit = simd lane.
inline void resolve_ballot(EmuLane** lanes, int n) {
  uint64_t m[2] = {0, 0};
  for (int i = 0; i < n; ++i) {
    const uint64_t bit = uint64_t(1) << lanes[i]->simd_lane;
    m[1] |= bit;
    if (get_in<bool>(lanes[i])) m[0] |= bit;
  }
  for (int i = 0; i < n; ++i) std::memcpy(lanes[i]->coll.out, m, sizeof m);
}
inline void resolve_first_lane(EmuLane** lanes, int n) {
  for (int i = 0; i < n; ++i) set_out<bool>(lanes[i], i == 0);
}
inline void resolve_quad_first_lane(EmuLane** lanes, int n) {
  for (int b = 0; b < n;) {
    const int e = group_end<4>(lanes, n, b);
    for (int i = b; i < e; ++i) set_out<bool>(lanes[i], i == b);
    b = e;
  }
}
inline void resolve_nothing(EmuLane**, int) {}

template <class R, class T>
inline R collective(const char* name, const T& v, EmuResolve r, int64_t arg, bool uniform, uint64_t key,
                    const char* file, int line, const T* fill = nullptr) {
  EmuCollective c{};
  c.name = name; c.file = file; c.line = line; c.scope = EMU_SIMD; c.resolve = r; c.arg = arg;
  c.uniform = uniform; c.key = key;
  put(c, v);
  if (fill) put(c, *fill, 1);
  emu_park(&c);
  R out;
  std::memcpy(static_cast<void*>(&out), emu_current_lane()->coll.out, sizeof(R));
  return out;
}
inline uint lane_id() { return emu_current_lane()->simd_lane; }
}  // namespace emu_detail

#define MUSER_EMU_SITE const char* file = __builtin_FILE(), int line = __builtin_LINE()
#define MUSER_EMU_AT file, line

// ---- reductions (simd_* over 32 lanes, quad_* over 4) ---------------------------------
#define MUSER_EMU_REDUCE(fn, Op, W)                                                              \
  template <class T> inline T fn(T v, MUSER_EMU_SITE) {                                           \
    return emu_detail::collective<T>(#fn, v, emu_detail::resolve_reduce<T, Op, W>, 0, false, 0, MUSER_EMU_AT); \
  }
MUSER_EMU_REDUCE(simd_sum, emu_detail::Add, 32) MUSER_EMU_REDUCE(simd_product, emu_detail::Mul, 32)
MUSER_EMU_REDUCE(simd_min, emu_detail::Min, 32) MUSER_EMU_REDUCE(simd_max, emu_detail::Max, 32)
MUSER_EMU_REDUCE(simd_and, emu_detail::And, 32) MUSER_EMU_REDUCE(simd_or, emu_detail::Or, 32)
MUSER_EMU_REDUCE(simd_xor, emu_detail::Xor, 32)
MUSER_EMU_REDUCE(quad_sum, emu_detail::Add, 4) MUSER_EMU_REDUCE(quad_product, emu_detail::Mul, 4)
MUSER_EMU_REDUCE(quad_min, emu_detail::Min, 4) MUSER_EMU_REDUCE(quad_max, emu_detail::Max, 4)
MUSER_EMU_REDUCE(quad_and, emu_detail::And, 4) MUSER_EMU_REDUCE(quad_or, emu_detail::Or, 4)
MUSER_EMU_REDUCE(quad_xor, emu_detail::Xor, 4)
#undef MUSER_EMU_REDUCE

#define MUSER_EMU_PREFIX(fn, Op, W, inclusive)                                                   \
  template <class T> inline T fn(T v, MUSER_EMU_SITE) {                                           \
    return emu_detail::collective<T>(#fn, v, emu_detail::resolve_prefix<T, emu_detail::Op<T>, W, inclusive>, 0, \
                                     false, 0, MUSER_EMU_AT);                                     \
  }
MUSER_EMU_PREFIX(simd_prefix_inclusive_sum, SumOf, 32, true)
MUSER_EMU_PREFIX(simd_prefix_exclusive_sum, SumOf, 32, false)
MUSER_EMU_PREFIX(simd_prefix_inclusive_product, ProductOf, 32, true)
MUSER_EMU_PREFIX(simd_prefix_exclusive_product, ProductOf, 32, false)
MUSER_EMU_PREFIX(quad_prefix_inclusive_sum, SumOf, 4, true)
MUSER_EMU_PREFIX(quad_prefix_exclusive_sum, SumOf, 4, false)
MUSER_EMU_PREFIX(quad_prefix_inclusive_product, ProductOf, 4, true)
MUSER_EMU_PREFIX(quad_prefix_exclusive_product, ProductOf, 4, false)
#undef MUSER_EMU_PREFIX

// ---- shuffles --------------------------------------------------------------------------
// Each lane computes its source lane; deltas, masks and broadcast lanes must
// be the same on every lane (Metal requires it), which `uniform` checks.
namespace emu_detail {
template <int W> inline int64_t down_src(int64_t delta) {
  const int64_t l = lane_id(), base = l / W * W;
  return l - base + delta < W ? l + delta : l;
}
template <int W> inline int64_t up_src(int64_t delta) {
  const int64_t l = lane_id(), base = l / W * W;
  return l - base >= delta ? l - delta : l;
}
template <int W> inline int64_t rot_src(int64_t delta) {
  const int64_t l = lane_id(), base = l / W * W;
  return base + ((l - base + delta) % W + W) % W;
}
template <int W> inline int64_t xor_src(int64_t mask) {
  // A quad mask stays within the quad; a simd mask of 32 or more names no lane.
  return W == 32 ? int64_t(lane_id()) ^ mask : int64_t(lane_id()) ^ (mask & (W - 1));
}
template <int W> inline int64_t idx_src(int64_t idx) { return lane_id() / W * W + idx; }
}  // namespace emu_detail

#define MUSER_EMU_SHUFFLE(fn, W, SRC, uniform)                                                   \
  template <class T> inline T fn(T v, ushort k, MUSER_EMU_SITE) {                                 \
    return emu_detail::collective<T>(#fn, v, emu_detail::resolve_shuffle<T>, emu_detail::SRC<W>(k), uniform, \
                                     k, MUSER_EMU_AT);                                            \
  }
MUSER_EMU_SHUFFLE(simd_shuffle, 32, idx_src, false) MUSER_EMU_SHUFFLE(simd_shuffle_down, 32, down_src, true)
MUSER_EMU_SHUFFLE(simd_shuffle_up, 32, up_src, true) MUSER_EMU_SHUFFLE(simd_shuffle_xor, 32, xor_src, true)
MUSER_EMU_SHUFFLE(simd_shuffle_rotate_down, 32, rot_src, true)
MUSER_EMU_SHUFFLE(simd_broadcast, 32, idx_src, true)
MUSER_EMU_SHUFFLE(quad_shuffle, 4, idx_src, false) MUSER_EMU_SHUFFLE(quad_shuffle_down, 4, down_src, true)
MUSER_EMU_SHUFFLE(quad_shuffle_up, 4, up_src, true) MUSER_EMU_SHUFFLE(quad_shuffle_xor, 4, xor_src, true)
MUSER_EMU_SHUFFLE(quad_shuffle_rotate_down, 4, rot_src, true)
MUSER_EMU_SHUFFLE(quad_broadcast, 4, idx_src, true)
#undef MUSER_EMU_SHUFFLE
template <class T> inline T simd_shuffle_rotate_up(T v, ushort k, MUSER_EMU_SITE) {
  return emu_detail::collective<T>("simd_shuffle_rotate_up", v, emu_detail::resolve_shuffle<T>,
                                   emu_detail::rot_src<32>(-int64_t(k)), true, k, MUSER_EMU_AT);
}
template <class T> inline T quad_shuffle_rotate_up(T v, ushort k, MUSER_EMU_SITE) {
  return emu_detail::collective<T>("quad_shuffle_rotate_up", v, emu_detail::resolve_shuffle<T>,
                                   emu_detail::rot_src<4>(-int64_t(k)), true, k, MUSER_EMU_AT);
}
// *_and_fill: past the end of the simdgroup the result comes from `fill` of
// the lane wrapped around (down) or from below the start (up).
template <class T> inline T simd_shuffle_and_fill_down(T v, T fill, ushort k, MUSER_EMU_SITE) {
  const int64_t l = emu_detail::lane_id(), s = l + k;
  return emu_detail::collective<T>("simd_shuffle_and_fill_down", v, emu_detail::resolve_shuffle<T>,
                                   s < 32 ? s : 1000 + s - 32, true, k, MUSER_EMU_AT, &fill);
}
template <class T> inline T simd_shuffle_and_fill_up(T v, T fill, ushort k, MUSER_EMU_SITE) {
  const int64_t l = emu_detail::lane_id(), s = l - k;
  return emu_detail::collective<T>("simd_shuffle_and_fill_up", v, emu_detail::resolve_shuffle<T>,
                                   s >= 0 ? s : 1000 + s + 32, true, k, MUSER_EMU_AT, &fill);
}
template <class T> inline T simd_broadcast_first(T v, MUSER_EMU_SITE) {
  return emu_detail::collective<T>("simd_broadcast_first", v, emu_detail::resolve_first<T>, 0, false, 0, MUSER_EMU_AT);
}

// ---- votes -------------------------------------------------------------------------------
struct simd_vote {
  typedef uint64_t vote_t;
  vote_t v, active;
  explicit constexpr simd_vote(vote_t m = 0, vote_t act = ~vote_t(0) >> 32) : v(m), active(act) {}
  explicit constexpr operator vote_t() const { return v; }
  bool all() const { return v == active; }   // every active lane voted true
  bool any() const { return v != 0; }
};
namespace emu_detail {
struct Masks { uint64_t vote, active; };
inline simd_vote vote(const char* name, bool b, const char* file, int line) {
  const Masks m = collective<Masks>(name, b, resolve_ballot, 0, false, 0, file, line);
  return simd_vote(m.vote, m.active);
}
}  // namespace emu_detail
namespace emu_detail {
// simd_all / simd_any / quad_all / quad_any: a boolean reduction over `Width` lanes.
template <class Op, int Width>
inline bool vote_reduce(const char* name, bool b, const char* file, int line) {
  return collective<bool>(name, b, resolve_reduce<bool, Op, Width>, 0, false, 0, file, line);
}
}  // namespace emu_detail
inline bool simd_all(bool b, MUSER_EMU_SITE) {
  return emu_detail::vote_reduce<emu_detail::And, 32>("simd_all", b, MUSER_EMU_AT);
}
inline bool simd_any(bool b, MUSER_EMU_SITE) {
  return emu_detail::vote_reduce<emu_detail::Or, 32>("simd_any", b, MUSER_EMU_AT);
}
inline bool quad_all(bool b, MUSER_EMU_SITE) {
  return emu_detail::vote_reduce<emu_detail::And, 4>("quad_all", b, MUSER_EMU_AT);
}
inline bool quad_any(bool b, MUSER_EMU_SITE) {
  return emu_detail::vote_reduce<emu_detail::Or, 4>("quad_any", b, MUSER_EMU_AT);
}
inline simd_vote simd_ballot(bool b, MUSER_EMU_SITE) { return emu_detail::vote("simd_ballot", b, MUSER_EMU_AT); }
inline simd_vote simd_active_threads_mask(MUSER_EMU_SITE) {
  return emu_detail::vote("simd_active_threads_mask", true, MUSER_EMU_AT);
}
inline bool simd_is_first(MUSER_EMU_SITE) {
  return emu_detail::collective<bool>("simd_is_first", false, emu_detail::resolve_first_lane, 0, false, 0,
                                      MUSER_EMU_AT);
}
inline bool quad_is_first(MUSER_EMU_SITE) {
  return emu_detail::collective<bool>("quad_is_first", false, emu_detail::resolve_quad_first_lane, 0, false, 0,
                                      MUSER_EMU_AT);
}

// ---- barriers ------------------------------------------------------------------------------
inline void simdgroup_barrier(mem_flags, MUSER_EMU_SITE) {
  emu_detail::collective<int>("simdgroup_barrier", 0, emu_detail::resolve_nothing, 0, false, 0, MUSER_EMU_AT);
}
inline void threadgroup_barrier(mem_flags, MUSER_EMU_SITE) {
  EmuCollective c{};
  c.name = "threadgroup_barrier"; c.file = file; c.line = line; c.scope = EMU_THREADGROUP;
  c.resolve = emu_detail::resolve_nothing;
  emu_park(&c);
}

}  // namespace metal
