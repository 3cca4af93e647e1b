// shim_atomic.h: Metal's atomic types and atomic_*_explicit functions.
//
// Lanes run one at a time on one CPU thread, so every operation is atomic as
// written; the memory order is accepted and has nothing to order. atomic<T>
// has T's size and alignment, so `(device atomic_float*)&buf[i]` works as on
// Metal. Float atomics add in the order the schedule runs the lanes.
#pragma once

#include "shim_types.h"

namespace metal {

enum memory_order {
  memory_order_relaxed = 0, memory_order_acquire = 2, memory_order_release = 3, memory_order_acq_rel = 4,
  memory_order_seq_cst = 5
};
enum class thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };

template <class T> struct atomic {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, uint> || std::is_same_v<T, bool> ||
                    std::is_same_v<T, float> || std::is_same_v<T, ulong> || std::is_same_v<T, long>,
                "Metal has atomic int, uint, bool, float, and (min/max only) ulong");
  T value;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<ulong> atomic_ulong;
static_assert(sizeof(atomic_float) == 4 && alignof(atomic_int) == 4, "atomics are laid out as their values");

template <class T> struct emu_identity { typedef T type; };
template <class T> using emu_same = typename emu_identity<T>::type;

template <class T> inline void atomic_store_explicit(volatile atomic<T>* o, emu_same<T> v, memory_order) {
  o->value = v;
}
template <class T> inline T atomic_load_explicit(const volatile atomic<T>* o, memory_order) { return o->value; }
template <class T> inline T atomic_exchange_explicit(volatile atomic<T>* o, emu_same<T> v, memory_order) {
  const T old = o->value;
  o->value = v;
  return old;
}
template <class T>
inline bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* o, T* expected, emu_same<T> desired,
                                                  memory_order, memory_order) {
  const T cur = o->value;
  if (cur == *expected) {
    o->value = desired;
    return true;
  }
  *expected = cur;
  return false;
}
template <class T>
inline bool atomic_compare_exchange_strong_explicit(volatile atomic<T>* o, T* expected, emu_same<T> desired,
                                                    memory_order s, memory_order f) {
  return atomic_compare_exchange_weak_explicit(o, expected, desired, s, f);
}

#define MUSER_EMU_FETCH(op, expr, ok)                                                            \
  template <class T> inline T atomic_fetch_##op##_explicit(volatile atomic<T>* o, emu_same<T> v, memory_order) { \
    static_assert(ok, "atomic_fetch_" #op "_explicit is not defined for this atomic type");      \
    const T old = o->value;                                                                      \
    o->value = expr;                                                                             \
    return old;                                                                                  \
  }
#define MUSER_EMU_INT (std::is_integral_v<T> && !std::is_same_v<T, bool>)
MUSER_EMU_FETCH(add, T(old + v), (MUSER_EMU_INT || std::is_same_v<T, float>))
MUSER_EMU_FETCH(sub, T(old - v), (MUSER_EMU_INT || std::is_same_v<T, float>))
MUSER_EMU_FETCH(and, T(old & v), MUSER_EMU_INT)
MUSER_EMU_FETCH(or, T(old | v), MUSER_EMU_INT)
MUSER_EMU_FETCH(xor, T(old ^ v), MUSER_EMU_INT)
MUSER_EMU_FETCH(min, T(v < old ? v : old), MUSER_EMU_INT)
MUSER_EMU_FETCH(max, T(old < v ? v : old), MUSER_EMU_INT)
#undef MUSER_EMU_FETCH
#undef MUSER_EMU_INT

inline void atomic_thread_fence(mem_flags, memory_order, thread_scope = thread_scope::thread_scope_device) {}

}  // namespace metal
