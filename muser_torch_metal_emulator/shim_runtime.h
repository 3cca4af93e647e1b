// shim_runtime.h: what the shim, the generated kernel wrappers and the fiber
// runtime (emu_runtime.cpp) share: the lane record, the collective record,
// the runtime's entry points, and the argument binding of a kernel call.
#pragma once

#include <tuple>

#include "shim_vec.h"

struct EmuLane;
typedef void (*EmuResolve)(EmuLane** lanes, int n);

enum EmuScope { EMU_SIMD = 0, EMU_THREADGROUP = 1 };

// What a parked lane waits on. Lanes of one simdgroup must agree on
// (resolve, file, line); `key` must also agree where the op needs uniform
// arguments (simdgroup matrix loads and stores, simd_broadcast).
struct EmuCollective {
  const char* name;
  const char* file;
  int line;
  int scope;
  EmuResolve resolve;
  bool uniform;
  uint64_t key;
  int64_t arg;                          // source lane / delta / mask
  const void* src;                      // simdgroup matrix operands
  void* dst;
  uint64_t stride, ox, oy;
  bool transpose;
  alignas(16) unsigned char in[64];     // this lane's value (two for the *_and_fill shuffles)
  alignas(16) unsigned char out[32];    // the result for this lane
};

struct EmuLane {
  metal::uint3 tpig, tgpig, tptg, tptg_dims, dispatch_dims, groups, grid;
  unsigned tid, simd_lane, simd_index, simds, dispatch_simds, quad_lane, quad_index, quads;
  int state;            // 0 ready, 1 parked, 2 done
  void* sp;
  void* stack;
  EmuCollective coll;
};

// A function constant's value for the current dispatch (MTLFunctionConstantValues):
// kind 'b' bool, 'i' integer, 'f' floating; 0 when the pipeline set none.
struct EmuFcValue { char kind; int64_t i; double f; };

extern "C" {
EmuLane* emu_current_lane();
const EmuFcValue* emu_function_constant_value(int64_t index);
void emu_park(EmuCollective* c);  // fills the lane's slot and yields
void* emu_tg_alloc(size_t bytes, size_t align, const char* name, const char* file, int line);
void* emu_tg_param(int index);
[[noreturn]] void emu_fail(const char* fmt, ...);
}

// A `threadgroup T name[n];` declaration (rewritten by the driver): one
// allocation per threadgroup, keyed by its declaration site, shared by the lanes.
template <class A>
inline A& emu_tg(const char* name, const char* file, int line) {
  constexpr size_t align = alignof(A) > 16 ? alignof(A) : 16;
  return *static_cast<A*>(emu_tg_alloc(sizeof(A), align, name, file, line));
}

// `constant T name [[function_constant(i)]];` becomes reads of this (msl_source.rewrite): the
// value the dispatch set for index i, of T's kind. A read with no value, or a value of another
// kind or out of T's range, is reported (Metal would refuse to create the pipeline).
template <class T>
inline T emu_function_constant(int64_t index, const char* name) {
  const EmuFcValue* v = emu_function_constant_value(index);
  if (!v || !v->kind)
    emu_fail("function constant %s (index %lld) is used, but the dispatch set no value for it", name,
             (long long)index);
  if constexpr (std::is_same_v<T, bool>) {
    if (v->kind != 'b') emu_fail("function constant %s (index %lld) is a bool; the dispatch set %s", name,
                                 (long long)index, v->kind == 'i' ? "an integer" : "a float");
    return v->i != 0;
  } else if constexpr (std::is_integral_v<T>) {
    if (v->kind != 'i') emu_fail("function constant %s (index %lld) is an integer; the dispatch set %s", name,
                                 (long long)index, v->kind == 'b' ? "a bool" : "a float");
    if (v->i < int64_t(std::numeric_limits<T>::min()) ||
        (v->i > 0 && uint64_t(v->i) > uint64_t(std::numeric_limits<T>::max())))
      emu_fail("function constant %s (index %lld): %lld does not fit its %zu-byte type", name, (long long)index,
               (long long)v->i, sizeof(T));
    return T(v->i);
  } else {
    if (v->kind != 'f') emu_fail("function constant %s (index %lld) is floating; the dispatch set %s", name,
                                 (long long)index, v->kind == 'b' ? "a bool" : "an integer");
    return T(float(v->f));
  }
}
inline bool emu_function_constant_defined(int64_t index) {
  const EmuFcValue* v = emu_function_constant_value(index);
  return v && v->kind;
}

// `T a[n] = { [lo ... hi] = v };` (a GNU range designator, which Metal's clang takes and g++'s C++
// does not) becomes `T a[n]; emu_fill_range(a, lo, hi, v);` (msl_source.rewrite): the other
// elements are zero, as in the initializer.
template <class T, size_t N, class U>
inline void emu_fill_range(T (&a)[N], long lo, long hi, const U& v) {
  for (size_t i = 0; i < N; ++i) a[i] = T(0);
  for (long i = lo; i <= hi; ++i) a[i] = T(v);
}

// ---- binding a kernel's parameters ---------------------------------------------------
// The driver describes each parameter (EmuParamSpec) and reads each one's C++
// type back (EmuParamMeta) to check scalar arguments before a dispatch.
enum EmuParamKind { EMU_PARAM_BUFFER = 0, EMU_PARAM_BUILTIN = 1, EMU_PARAM_THREADGROUP = 2 };
struct EmuParamSpec { int kind; int index; };
struct EmuParamMeta {
  int indirect;      // 0 value, 1 pointer, 2 reference
  int writable;      // pointer or reference to non-const
  int elem_bytes;    // sizeof the pointee (or of the value)
  char category;     // 'f' float, 'i' signed, 'u' unsigned, 'b' bool, 'o' other (structs)
  int lanes;         // vector length of the pointee (1 for scalars)
};

enum EmuBuiltin {
  EMU_B_TPIG, EMU_B_TGPIG, EMU_B_TPTG, EMU_B_TID, EMU_B_SIMD_LANE, EMU_B_SIMD_INDEX, EMU_B_TPTG_DIMS,
  EMU_B_DISPATCH_DIMS, EMU_B_GROUPS, EMU_B_GRID, EMU_B_SIMD_WIDTH, EMU_B_SIMDS, EMU_B_DISPATCH_SIMDS,
  EMU_B_QUAD_LANE, EMU_B_QUAD_INDEX, EMU_B_QUADS, EMU_B_ZERO
};

inline metal::uint3 emu_builtin_value(const EmuLane* L, int b) {
  using metal::uint3;
  switch (b) {
    case EMU_B_TPIG: return L->tpig;
    case EMU_B_TGPIG: return L->tgpig;
    case EMU_B_TPTG: return L->tptg;
    case EMU_B_TID: return uint3(L->tid, 0u, 0u);
    case EMU_B_SIMD_LANE: return uint3(L->simd_lane, 0u, 0u);
    case EMU_B_SIMD_INDEX: return uint3(L->simd_index, 0u, 0u);
    case EMU_B_TPTG_DIMS: return L->tptg_dims;
    case EMU_B_DISPATCH_DIMS: return L->dispatch_dims;
    case EMU_B_GROUPS: return L->groups;
    case EMU_B_GRID: return L->grid;
    case EMU_B_SIMD_WIDTH: return uint3(32u, 0u, 0u);
    case EMU_B_SIMDS: return uint3(L->simds, 0u, 0u);
    case EMU_B_DISPATCH_SIMDS: return uint3(L->dispatch_simds, 0u, 0u);
    case EMU_B_QUAD_LANE: return uint3(L->quad_lane, 0u, 0u);
    case EMU_B_QUAD_INDEX: return uint3(L->quad_index, 0u, 0u);
    case EMU_B_QUADS: return uint3(L->quads, 0u, 0u);
    default: return uint3(0u, 0u, 0u);
  }
}

template <class T> struct emu_elem { typedef T type; static constexpr int lanes = 1; };
template <class T, int N> struct emu_elem<metal::vec<T, N>> { typedef T type; static constexpr int lanes = N; };
template <class T, int N> struct emu_elem<metal::packed_vec<T, N>> { typedef T type; static constexpr int lanes = N; };

template <class P>
constexpr EmuParamMeta emu_meta_of() {
  typedef std::remove_reference_t<P> NoRef;
  typedef std::conditional_t<std::is_pointer_v<NoRef>, std::remove_pointer_t<NoRef>, NoRef> Pointee;
  typedef std::remove_cv_t<Pointee> Bare;
  typedef std::remove_cv_t<typename emu_elem<Bare>::type> E;
  const char cat = std::is_same_v<E, bool> ? 'b'
                   : metal::is_float_scalar_v<E> ? 'f'
                   : std::is_integral_v<E> ? (std::is_signed_v<E> ? 'i' : 'u')
                                           : 'o';
  const int indirect = std::is_pointer_v<NoRef> ? 1 : std::is_reference_v<P> ? 2 : 0;
  int bytes = 0;
  if constexpr (!std::is_void_v<Bare>) bytes = int(sizeof(Bare));
  return EmuParamMeta{indirect, indirect && !std::is_const_v<Pointee>, bytes, cat, emu_elem<Bare>::lanes};
}

template <class P>
inline P emu_arg(void** bufs, const EmuParamSpec& s, const EmuLane* L) {
  if constexpr (std::is_pointer_v<P>) {
    void* p = s.kind == EMU_PARAM_THREADGROUP ? emu_tg_param(s.index) : bufs[s.index];
    return reinterpret_cast<P>(p);
  } else if constexpr (std::is_reference_v<P>) {
    return *reinterpret_cast<std::remove_reference_t<P>*>(bufs[s.index]);
  } else {
    const metal::uint3 v = emu_builtin_value(L, s.index);
    if constexpr (metal::is_scalar_v<P>) {
      return P(v.x);
    } else {
      P r;
      for (int i = 0; i < P::size; ++i) r[i] = typename emu_elem<P>::type(v[i]);
      return r;
    }
  }
}

template <class... P, size_t... I>
inline void emu_invoke_at(void (*f)(P...), void** bufs, const EmuParamSpec* spec, std::index_sequence<I...>) {
  const EmuLane* L = emu_current_lane();
  (void)L; (void)bufs; (void)spec;
  f(emu_arg<P>(bufs, spec[I], L)...);
}
template <class... P>
inline void emu_invoke(void (*f)(P...), void** bufs, const EmuParamSpec* spec) {
  emu_invoke_at(f, bufs, spec, std::index_sequence_for<P...>{});
}
template <class... P>
inline int emu_describe(void (*)(P...), EmuParamMeta* out) {
  const EmuParamMeta m[] = {emu_meta_of<P>()..., EmuParamMeta{}};
  for (size_t i = 0; i < sizeof...(P); ++i) out[i] = m[i];
  return int(sizeof...(P));
}
