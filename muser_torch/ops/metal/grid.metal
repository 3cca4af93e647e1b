// grid.metal: chunk decoders for the 3-bit grid formats IQ3_XXS and IQ3_S
// (muser_torch/formats/iq3.py has the layouts in words). A qs byte (IQ3_S: with
// a ninth bit from qh) picks a grid word of four unsigned magnitudes, element j
// in byte j (MUSER_IQ3XXS_GRID, MUSER_IQ3S_GRID from formats/iq_grids.py, via
// the prelude); every element has its own sign bit. Chunk c is super-block
// c / 16, 32-element sub-block s = (c % 16) / 2, half h = c % 2: grid words
// 8s + 4h .. 8s + 4h + 3 and sign bits 16h .. 16h + 15 of the sub-block.

static_assert(MUSER_QK_K == 32 * 8 && MUSER_CHUNK == 16, "a sub-block of 32 is two chunks of 16");
static_assert(MUSER_IQ3_XXS_BYTES % 2 == 0 && MUSER_IQ3_S_BYTES % 2 == 0 && MUSER_IQ3_XXS_D % 2 == 0 &&
                  MUSER_IQ3_S_D % 2 == 0,
              "block halfs stay 2-byte aligned");

constant uint kIQ3XXSGrid[256] = MUSER_IQ3XXS_GRID;
constant uint kIQ3SGrid[512] = MUSER_IQ3S_GRID;
constant uchar kKSigns[128] = MUSER_KSIGNS;

inline uint le32_at(device const uchar *p) {
  return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}

// Element e (0..31 of a sub-block) of grid word g, sign bit set in `signs`: y = mag * db, negated.
inline float grid_value(uint g, int e, uint signs, float db) {
  const float v = float((g >> (8 * (e % 4))) & 0xFFu) * db;
  return (signs >> e) & 1u ? -v : v;
}

// IQ3_XXS: the sub-block's u32 holds four 7-bit sign codes (KSIGNS restores the
// parity bit) and s in its top 4 bits; y = grid * (d * (0.5 + s) * 0.5), signed.
struct FormatIQ3XXS {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_IQ3_XXS_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 16) * MUSER_IQ3_XXS_BYTES;
    const int s = int(c % 16) / 2, h = int(c % 2);
    const uint aux = le32_at(blk + MUSER_IQ3_XXS_SCALES_SIGNS + 4 * s);
    const float db = f16_at(blk, MUSER_IQ3_XXS_D) * (0.5f + float(aux >> 28)) * 0.5f;
    const uint signs = uint(kKSigns[(aux >> (14 * h)) & 127]) << (16 * h) |
                       uint(kKSigns[(aux >> (14 * h + 7)) & 127]) << (16 * h + 8);
    for (int i = 0; i < MUSER_CHUNK; ++i) {
      const int e = 16 * h + i;
      w[i] = grid_value(kIQ3XXSGrid[blk[MUSER_IQ3_XXS_QS + 8 * s + e / 4]], e, signs, db);
    }
  }
};

// IQ3_S: index qs[k] | (bit k % 8 of qh[k / 8]) << 8; sign bits straight from
// `signs`; y = grid * (d * (1 + 2s)), s nibble s % 2 of scales[s / 2].
struct FormatIQ3S {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_IQ3_S_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 16) * MUSER_IQ3_S_BYTES;
    const int s = int(c % 16) / 2, h = int(c % 2);
    const int sc = (blk[MUSER_IQ3_S_SCALES + s / 2] >> (4 * (s % 2))) & 0x0F;
    const float db = f16_at(blk, MUSER_IQ3_S_D) * float(1 + 2 * sc);
    const uint signs = le32_at(blk + MUSER_IQ3_S_SIGNS + 4 * s);
    const uint qh = blk[MUSER_IQ3_S_QH + s];
    for (int i = 0; i < MUSER_CHUNK; ++i) {
      const int e = 16 * h + i, k = e / 4;
      const uint index = uint(blk[MUSER_IQ3_S_QS + 8 * s + k]) | (((qh >> k) & 1u) << 8);
      w[i] = grid_value(kIQ3SGrid[index], e, signs, db);
    }
  }
};

MUSER_DEFINE_KERNELS(iq3_xxs, FormatIQ3XXS)
MUSER_DEFINE_KERNELS(iq3_s, FormatIQ3S)
