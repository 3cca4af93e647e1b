// kquant.metal: chunk decoders for the K-quant super-blocks (256 elements).
// Layouts: muser_torch/formats/kquant.py (the bit diagrams live there).
// Chunk c of a row is super-block c / 16, elements 16 (c % 16) .. + 15.

struct block_q4_K {
  half d;
  half dmin;
  uchar scales[MUSER_K_SCALE_SIZE];
  uchar qs[MUSER_QK_K / 2];
};
struct block_q5_K {
  half d;
  half dmin;
  uchar scales[MUSER_K_SCALE_SIZE];
  uchar qh[MUSER_QK_K / 8];
  uchar qs[MUSER_QK_K / 2];
};
struct block_q6_K {
  uchar ql[MUSER_QK_K / 2];
  uchar qh[MUSER_QK_K / 4];
  char scales[MUSER_QK_K / 16];
  half d;
};
static_assert(sizeof(block_q4_K) == MUSER_Q4_K_BYTES, "Q4_K block size differs from formats/types.py");
static_assert(sizeof(block_q5_K) == MUSER_Q5_K_BYTES, "Q5_K block size differs from formats/types.py");
static_assert(sizeof(block_q6_K) == MUSER_Q6_K_BYTES, "Q6_K block size differs from formats/types.py");
static_assert(MUSER_QK_K % MUSER_CHUNK == 0, "a chunk never straddles super-blocks");

enum : int { kChunksPerBlock = MUSER_QK_K / MUSER_CHUNK };

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

// The fifth bits: Q5_K only (the Q4_K overload is never called).
inline device const uchar *blk_qh(device const block_q5_K *b) { return b->qh; }
inline device const uchar *blk_qh(device const block_q4_K *) { return nullptr; }

// Shared by Q4_K and Q5_K: y = (d * sc) * q - (dmin * m), sub-block j = s / 2.
// Within 64-element group g = s / 4, chunk s reads qs[32 g + 16 (s & 1) ..]:
// low nibbles for the group's first 32 elements, high nibbles for the rest.
template <bool kHasHighBit, class B>
inline void asymmetric_chunk(device const B *blk, int s, thread float *w) {
  const int j = s / 2;
  int sc, m;
  scale_min_k4(j, blk->scales, sc, m);
  const float scale = float(blk->d) * float(sc);
  const float shift = float(blk->dmin) * float(m);
  const int l0 = (s & 1) * 16;
  device const uchar *q = blk->qs + 32 * (s / 4) + l0;
  const int nib = (j & 1) * 4;
  for (int i = 0; i < MUSER_CHUNK; ++i) {
    int code = (q[i] >> nib) & 0x0F;
    if (kHasHighBit) code |= ((blk_qh(blk)[l0 + i] >> j) & 1) << 4;
    w[i] = scale * float(code) - shift;
  }
}

struct FormatQ4K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q4_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, long c, thread float *w) {
    device const block_q4_K *blk = (device const block_q4_K *)row + c / kChunksPerBlock;
    asymmetric_chunk<false>(blk, int(c % kChunksPerBlock), w);
  }
};

struct FormatQ5K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q5_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, long c, thread float *w) {
    device const block_q5_K *blk = (device const block_q5_K *)row + c / kChunksPerBlock;
    asymmetric_chunk<true>(blk, int(c % kChunksPerBlock), w);
  }
};

// Q6_K: element e = 16 s + i lies in half h = e / 128, quarter q = (e % 128) / 32,
// column l = e % 32: low 4 bits from ql[64 h + 32 (q & 1) + l] (high nibble
// when q >= 2), top 2 bits from qh[32 h + l] >> 2q; y = (d * sc[s]) * (code - 32).
struct FormatQ6K {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_Q6_K_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, long c, thread float *w) {
    device const block_q6_K *blk = (device const block_q6_K *)row + c / kChunksPerBlock;
    const int s = int(c % kChunksPerBlock);
    const int e0 = s * MUSER_CHUNK, h = e0 / 128, q = (e0 % 128) / 32, l0 = e0 % 32;
    device const uchar *ql = blk->ql + 64 * h + 32 * (q & 1) + l0;
    device const uchar *qh = blk->qh + 32 * h + l0;
    const int lshift = (q >> 1) * 4, hshift = 2 * q;
    const float scale = float(blk->d) * float(blk->scales[s]);
    for (int i = 0; i < MUSER_CHUNK; ++i) {
      const int code = ((ql[i] >> lshift) & 0x0F) | (((qh[i] >> hshift) & 3) << 4);
      w[i] = scale * float(code - 32);
    }
  }
};

MUSER_DEFINE_KERNELS(q4_k, FormatQ4K)
MUSER_DEFINE_KERNELS(q5_k, FormatQ5K)
MUSER_DEFINE_KERNELS(q6_k, FormatQ6K)
