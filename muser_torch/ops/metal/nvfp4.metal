// nvfp4.metal: the Muser-native NVFP4_E2M1 payload (muser_torch/formats/nvfp4.py).
// A row is n_in / 2 payload bytes (byte i: element 2i in the low nibble, 2i+1
// in the high one) plus n_in / 16 E4M3FN scale bytes in a companion tensor;
// w = (e2m1(code) * e4m3fn(scale)) * scale_2. Chunk c is scale group c.

static_assert(MUSER_NVFP4_GROUP == MUSER_CHUNK, "one NVFP4 scale group per chunk");
static_assert(MUSER_NVFP4_E2M1_BYTES * 2 == MUSER_NVFP4_GROUP && MUSER_NVFP4_E2M1_QS == 0,
              "a payload group is its 8 code bytes: two codes per byte");

constant float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// E4M3FN: bias 7, no infinities, S.1111.111 is NaN; subnormals are m * 2^-9.
inline float e4m3fn(uchar b) {
  const uint e = (b >> 3) & 0x0F, m = b & 7;
  float v;
  if ((b & 0x7F) == 0x7F) {
    v = NAN;
  } else if (e == 0) {
    v = float(m) * 0.001953125f;
  } else {
    v = as_type<float>(((e + 120u) << 23) | (m << 20));
  }
  return (b & 0x80) ? -v : v;
}

struct FormatNVFP4 {
  static long row_bytes(long n_in) { return n_in / MUSER_NVFP4_GROUP * MUSER_NVFP4_E2M1_BYTES; }
  static void chunk(device const uchar *row, device const uchar *srow, float scale_2, uint c,
                    thread float *w) {
    device const uchar *q = row + long(c) * MUSER_NVFP4_E2M1_BYTES;
    const float s = e4m3fn(srow[c]);
    for (int i = 0; i < MUSER_NVFP4_E2M1_BYTES; ++i) {
      w[2 * i] = (kE2M1[q[i] & 0x0F] * s) * scale_2;
      w[2 * i + 1] = (kE2M1[q[i] >> 4] * s) * scale_2;
    }
  }
};

MUSER_DEFINE_KERNELS(nvfp4_e2m1, FormatNVFP4)
