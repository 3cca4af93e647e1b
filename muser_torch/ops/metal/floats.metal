// floats.metal: plain float weights, one element per value: F16 (IEEE half)
// and BF16 (the top 16 bits of a float32, widened exactly by a shift).

static_assert(MUSER_F16_BYTES == sizeof(half) && MUSER_BF16_BYTES == sizeof(ushort),
              "F16 / BF16 element sizes differ from formats/layout.py");

struct FormatF16 {
  static long row_bytes(long n_in) { return n_in * MUSER_F16_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const half *h = (device const half *)row + long(c) * MUSER_CHUNK;
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(h[i]);
  }
};

struct FormatBF16 {
  static long row_bytes(long n_in) { return n_in * MUSER_BF16_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const ushort *b = (device const ushort *)row + long(c) * MUSER_CHUNK;
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = as_type<float>(uint(b[i]) << 16);
  }
};

MUSER_DEFINE_KERNELS(f16, FormatF16)
MUSER_DEFINE_KERNELS(bf16, FormatBF16)
