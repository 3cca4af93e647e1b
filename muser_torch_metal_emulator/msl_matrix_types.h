// msl_matrix_types.h: Metal's matrix type names (floatCxR, halfCxR, ...) over a `matrix<T, C, R>`
// template of the including header: shim_vec.h (the emulator) and clang_msl.h (the static pass).
#pragma once

#define MUSER_MSL_MATRIX_TYPES(T)                                                                   \
  typedef matrix<T, 2, 2> T##2x2; typedef matrix<T, 2, 3> T##2x3; typedef matrix<T, 2, 4> T##2x4;  \
  typedef matrix<T, 3, 2> T##3x2; typedef matrix<T, 3, 3> T##3x3; typedef matrix<T, 3, 4> T##3x4;  \
  typedef matrix<T, 4, 2> T##4x2; typedef matrix<T, 4, 3> T##4x3; typedef matrix<T, 4, 4> T##4x4;
