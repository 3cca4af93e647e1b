// kquant.metal: chunk decoders for the K-quant super-blocks (256 elements):
// Q4_K, Q5_K, Q6_K, Q2_K, Q3_K.
// Layouts: muser_torch/formats/layout.py (field offsets, via the prelude) and
// formats/kquant.py (the bit diagrams). Chunk c of a row is super-block
// c / 16, elements 16 (c % 16) .. + 15.

static_assert(MUSER_QK_K % MUSER_CHUNK == 0, "a chunk never straddles super-blocks");
static_assert(MUSER_Q4_K_BYTES - MUSER_Q4_K_QS == MUSER_QK_K / 2 && MUSER_Q5_K_BYTES - MUSER_Q5_K_QS == MUSER_QK_K / 2,
              "qs holds two 4-bit codes a byte, to the end of the block");
static_assert(MUSER_Q5_K_QS - MUSER_Q5_K_QH == MUSER_QK_K / 8, "Q5_K qh holds one bit per element");
static_assert(MUSER_Q4_K_QS - MUSER_Q4_K_SCALES == MUSER_K_SCALE_SIZE, "12 bytes of packed 6-bit scales and mins");
static_assert(MUSER_Q6_K_QH - MUSER_Q6_K_QL == MUSER_QK_K / 2 && MUSER_Q6_K_SCALES - MUSER_Q6_K_QH == MUSER_QK_K / 4,
              "Q6_K: 4 low bits, then 2 high bits per element");
static_assert(MUSER_Q4_K_BYTES % 2 == 0 && MUSER_Q5_K_BYTES % 2 == 0 && MUSER_Q6_K_BYTES % 2 == 0 &&
                  MUSER_Q6_K_D % 2 == 0,
              "block halfs stay 2-byte aligned");

enum : uint { kChunksPerBlock = MUSER_QK_K / MUSER_CHUNK };

// The 6-bit (scale, min) of sub-block j (32 elements) of a Q4_K/Q5_K block.
inline void scale_min_k4(int j, device const uchar *q, thread int &sc, thread int &m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Shared by Q4_K and Q5_K (field offsets D, DMIN, SCALES, QS; QH < 0: no
// fifth bits): y = (d * sc) * q - (dmin * m), sub-block j = s / 2. Within
// 64-element group g = s / 4, chunk s reads qs[32 g + 16 (s & 1) ..]: low
// nibbles for the group's first 32 elements, high nibbles for the rest.
template <int D, int DMIN, int SCALES, int QH, int QS>
inline void asymmetric_chunk(device const uchar *blk, int s, thread float *w) {
  const int j = s / 2;
  int sc, m;
  scale_min_k4(j, blk + SCALES, sc, m);
  const float scale = f16_at(blk, D) * float(sc);
  const float shift = f16_at(blk, DMIN) * float(m);
  const int l0 = (s & 1) * 16;
  device const uchar *q = blk + QS + 32 * (s / 4) + l0;
  const int nib = (j & 1) * 4;
  for (int i = 0; i < MUSER_CHUNK; ++i) {
    int code = (q[i] >> nib) & 0x0F;
    if (QH >= 0) code |= ((blk[QH + l0 + i] >> j) & 1) << 4;
    w[i] = scale * float(code) - shift;
  }
}

struct FormatQ4K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q4_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    asymmetric_chunk<MUSER_Q4_K_D, MUSER_Q4_K_DMIN, MUSER_Q4_K_SCALES, -1, MUSER_Q4_K_QS>(
        row + long(c / kChunksPerBlock) * MUSER_Q4_K_BYTES, int(c % kChunksPerBlock), w);
  }
};

struct FormatQ5K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q5_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    asymmetric_chunk<MUSER_Q5_K_D, MUSER_Q5_K_DMIN, MUSER_Q5_K_SCALES, MUSER_Q5_K_QH, MUSER_Q5_K_QS>(
        row + long(c / kChunksPerBlock) * MUSER_Q5_K_BYTES, int(c % kChunksPerBlock), w);
  }
};

// Q6_K: element e = 16 s + i lies in half h = e / 128, quarter q = (e % 128) / 32,
// column l = e % 32: low 4 bits from ql[64 h + 32 (q & 1) + l] (high nibble
// when q >= 2), top 2 bits from qh[32 h + l] >> 2q; y = (d * sc[s]) * (code - 32).
struct FormatQ6K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q6_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / kChunksPerBlock) * MUSER_Q6_K_BYTES;
    const int s = int(c % kChunksPerBlock);
    const int e0 = s * MUSER_CHUNK, h = e0 / 128, q = (e0 % 128) / 32, l0 = e0 % 32;
    device const uchar *ql = blk + MUSER_Q6_K_QL + 64 * h + 32 * (q & 1) + l0;
    device const uchar *qh = blk + MUSER_Q6_K_QH + 32 * h + l0;
    const int lshift = (q >> 1) * 4, hshift = 2 * q;
    const float scale = f16_at(blk, MUSER_Q6_K_D) * float(((device const char *)(blk + MUSER_Q6_K_SCALES))[s]);
    for (int i = 0; i < MUSER_CHUNK; ++i) {
      const int code = ((ql[i] >> lshift) & 0x0F) | (((qh[i] >> hshift) & 3) << 4);
      w[i] = scale * float(code - 32);
    }
  }
};

// Q2_K / Q3_K: chunk s of a block is sub-block s (16 elements): half h = s / 8,
// crumb j = (s / 2) % 4, column l0 = 16 (s & 1); element l of it is bits 2j..
// of qs[32 h + l0 + l]. Q3_K adds 4 where bit 4h + j of hmask[l0 + l] is set.
static_assert(MUSER_Q2_K_QS - MUSER_Q2_K_SCALES == MUSER_QK_K / 16 && MUSER_Q3_K_QS - MUSER_Q3_K_HMASK == MUSER_QK_K / 8,
              "Q2_K: one scale byte per 16 elements; Q3_K: one hmask bit per element");
static_assert(MUSER_Q2_K_BYTES % 2 == 0 && MUSER_Q2_K_D % 2 == 0 && MUSER_Q2_K_DMIN % 2 == 0 &&
                  MUSER_Q3_K_BYTES % 2 == 0 && MUSER_Q3_K_D % 2 == 0,
              "block halfs stay 2-byte aligned");

// y = (d * sc) * q - (dmin * m), sc and m the low and high nibbles of scales[s].
struct FormatQ2K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q2_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / kChunksPerBlock) * MUSER_Q2_K_BYTES;
    const int s = int(c % kChunksPerBlock);
    const uchar sc = blk[MUSER_Q2_K_SCALES + s];
    const float scale = f16_at(blk, MUSER_Q2_K_D) * float(sc & 0x0F);
    const float shift = f16_at(blk, MUSER_Q2_K_DMIN) * float(sc >> 4);
    device const uchar *q = blk + MUSER_Q2_K_QS + 32 * (s / 8) + 16 * (s & 1);
    const int crumb = 2 * ((s / 2) % 4);
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = scale * float((q[i] >> crumb) & 3) - shift;
  }
};

// y = (d * (s6 - 32)) * (q - 4 + 4 hbit); the 6-bit s6 packed as kquant.py draws it.
struct FormatQ3K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q3_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / kChunksPerBlock) * MUSER_Q3_K_BYTES;
    const int s = int(c % kChunksPerBlock);
    device const uchar *sc = blk + MUSER_Q3_K_SCALES;
    const int lo = s < 8 ? (sc[s] & 0x0F) : (sc[s - 8] >> 4);
    const int s6 = lo | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4);
    const float scale = f16_at(blk, MUSER_Q3_K_D) * float(s6 - 32);
    const int l0 = 16 * (s & 1), j = (s / 2) % 4, h = s / 8;
    device const uchar *q = blk + MUSER_Q3_K_QS + 32 * h + l0;
    device const uchar *hm = blk + MUSER_Q3_K_HMASK + l0;
    for (int i = 0; i < MUSER_CHUNK; ++i) {
      const int code = ((q[i] >> (2 * j)) & 3) - (((hm[i] >> (4 * h + j)) & 1) ? 0 : 4);
      w[i] = scale * float(code);
    }
  }
};

MUSER_DEFINE_KERNELS(q4_k, FormatQ4K)
MUSER_DEFINE_KERNELS(q5_k, FormatQ5K)
MUSER_DEFINE_KERNELS(q6_k, FormatQ6K)
MUSER_DEFINE_KERNELS(q2_k, FormatQ2K)
MUSER_DEFINE_KERNELS(q3_k, FormatQ3K)
