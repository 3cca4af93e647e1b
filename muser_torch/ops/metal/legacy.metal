// legacy.metal: chunk decoders for the 32-element formats Q4_0, Q4_1, Q5_0,
// Q5_1 and Q8_0. Field offsets come from muser_torch/formats/layout.py via the
// prelude; formats/legacy.py has the layouts in words. Chunk c of a row is
// half c % 2 of block c / 2: elements 16 h .. 16 h + 15. In a 4- or 5-bit
// block, qs byte i holds element i in its low nibble and element i + 16 in
// its high nibble, so chunk h reads all 16 qs bytes, nibble h; bit e of the
// little-endian 32-bit qh is the fifth bit of element e.

static_assert(MUSER_QK_LEGACY == 2 * MUSER_CHUNK, "a 32-element block is two chunks");
static_assert(MUSER_Q4_0_BYTES - MUSER_Q4_0_QS == MUSER_CHUNK && MUSER_Q4_1_BYTES - MUSER_Q4_1_QS == MUSER_CHUNK &&
                  MUSER_Q5_0_BYTES - MUSER_Q5_0_QS == MUSER_CHUNK && MUSER_Q5_1_BYTES - MUSER_Q5_1_QS == MUSER_CHUNK,
              "16 qs bytes: two codes each");
static_assert(MUSER_Q5_0_QS - MUSER_Q5_0_QH == 4 && MUSER_Q5_1_QS - MUSER_Q5_1_QH == 4, "qh is one 32-bit word");
static_assert(MUSER_Q8_0_BYTES - MUSER_Q8_0_QS == MUSER_QK_LEGACY, "Q8_0: one signed byte per element");
static_assert(MUSER_Q4_0_BYTES % 2 == 0 && MUSER_Q4_1_BYTES % 2 == 0 && MUSER_Q5_0_BYTES % 2 == 0 &&
                  MUSER_Q5_1_BYTES % 2 == 0 && MUSER_Q8_0_BYTES % 2 == 0 && MUSER_Q4_1_M % 2 == 0 &&
                  MUSER_Q5_1_M % 2 == 0,
              "block halfs stay 2-byte aligned");

// The 4- or 5-bit code of element 16 h + i (QH < 0: no fifth bit).
template <int QS, int QH>
inline int legacy_code(device const uchar *blk, int h, int i) {
  int code = (blk[QS + i] >> (4 * h)) & 0x0F;
  if (QH >= 0) {
    const int e = 16 * h + i;
    code |= ((blk[QH + e / 8] >> (e % 8)) & 1) << 4;
  }
  return code;
}

// Symmetric: y = d * (code - offset), the subtraction exact in int.
template <int BYTES, int D, int QS, int QH, int OFFSET>
struct SymmetricFormat {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_LEGACY * BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 2) * BYTES;
    const int h = int(c % 2);
    const float d = f16_at(blk, D);
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(legacy_code<QS, QH>(blk, h, i) - OFFSET) * d;
  }
};

// Asymmetric: y = code * d + m.
template <int BYTES, int D, int M, int QS, int QH>
struct AsymmetricFormat {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_LEGACY * BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 2) * BYTES;
    const int h = int(c % 2);
    const float d = f16_at(blk, D), m = f16_at(blk, M);
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(legacy_code<QS, QH>(blk, h, i)) * d + m;
  }
};

// Q8_0: y = d * qs[e], qs signed.
struct FormatQ80 {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_LEGACY * MUSER_Q8_0_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 2) * MUSER_Q8_0_BYTES;
    device const char *q = (device const char *)(blk + MUSER_Q8_0_QS) + 16 * (c % 2);
    const float d = f16_at(blk, MUSER_Q8_0_D);
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(q[i]) * d;
  }
};

typedef SymmetricFormat<MUSER_Q4_0_BYTES, MUSER_Q4_0_D, MUSER_Q4_0_QS, -1, 8> FormatQ40;
typedef AsymmetricFormat<MUSER_Q4_1_BYTES, MUSER_Q4_1_D, MUSER_Q4_1_M, MUSER_Q4_1_QS, -1> FormatQ41;
typedef SymmetricFormat<MUSER_Q5_0_BYTES, MUSER_Q5_0_D, MUSER_Q5_0_QS, MUSER_Q5_0_QH, 16> FormatQ50;
typedef AsymmetricFormat<MUSER_Q5_1_BYTES, MUSER_Q5_1_D, MUSER_Q5_1_M, MUSER_Q5_1_QS, MUSER_Q5_1_QH> FormatQ51;

MUSER_DEFINE_KERNELS(q4_0, FormatQ40)
MUSER_DEFINE_KERNELS(q4_1, FormatQ41)
MUSER_DEFINE_KERNELS(q5_0, FormatQ50)
MUSER_DEFINE_KERNELS(q5_1, FormatQ51)
MUSER_DEFINE_KERNELS(q8_0, FormatQ80)
