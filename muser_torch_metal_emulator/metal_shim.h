// metal_shim.h: lets unmodified Metal Shading Language compute source compile
// with g++ (C++17) and run on the fiber runtime in emu_runtime.cpp.
//
// Contract with the driver (emulator.py, msl_source.py): the driver
// preprocesses the source with this header force-included, then rewrites the
// user's part of the translation unit: address-space qualifiers vanish
// (`constant` becomes `const`), `threadgroup T name[n];` declarations become
// one shared allocation per threadgroup (emu_tg), unsuffixed float literals
// become float, and one extern "C" wrapper per kernel binds the arguments
// (emu_invoke). Everything the wrappers and the runtime share is in
// shim_runtime.h.
//
// The pieces: shim_types.h (scalars, half, bfloat, limits), shim_vec.h
// (vectors and swizzles), shim_math.h (metal:: functions), shim_atomic.h,
// shim_simd.h (simd_* / quad_* collectives, barriers), shim_matrix.h
// (simdgroup matrices).
#pragma once

#include "shim_types.h"
#include "shim_vec.h"
#include "shim_math.h"
#include "shim_runtime.h"
#include "shim_atomic.h"
#include "shim_simd.h"
#include "shim_matrix.h"

using namespace metal;
