// f16.metal: plain IEEE half weights, a row being n_in halfs (2 n_in bytes).

struct FormatF16 {
  static long row_bytes(long n_in) { return n_in * MUSER_F16_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, long c, thread float *w) {
    device const half *h = (device const half *)row + c * MUSER_CHUNK;
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(h[i]);
  }
};
static_assert(MUSER_F16_BYTES == sizeof(half), "F16 element size differs from formats/types.py");

MUSER_DEFINE_KERNELS(f16, FormatF16)
