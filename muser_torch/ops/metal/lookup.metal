// lookup.metal: chunk decoders for the lookup-table formats IQ4_NL, IQ4_XS
// and MXFP4 (muser_torch/formats/iq4.py and mxfp4.py have the layouts in
// words). A 4-bit code indexes a table of 16 values: MUSER_IQ4_VALUES (from
// formats/layout.py, via the prelude) or ggml's doubled E2M1 values, whose
// E8M0 scale is halved to match. In every 32 elements, qs byte i holds
// element i in its low nibble and element i + 16 in its high nibble, so
// chunk h of a 32-element group reads its 16 qs bytes, nibble h.

static_assert(MUSER_QK_IQ4_NL == 2 * MUSER_CHUNK && MUSER_QK_MXFP4 == 2 * MUSER_CHUNK,
              "a 32-element block is two chunks");
static_assert(MUSER_IQ4_NL_BYTES - MUSER_IQ4_NL_QS == MUSER_CHUNK && MUSER_MXFP4_BYTES - MUSER_MXFP4_QS == MUSER_CHUNK,
              "16 qs bytes: two codes each");
static_assert(MUSER_IQ4_XS_BYTES - MUSER_IQ4_XS_QS == MUSER_QK_K / 2 && MUSER_IQ4_XS_SCALES_L - MUSER_IQ4_XS_SCALES_H == 2,
              "IQ4_XS: a u16 of high scale bits, a nibble per sub-block, then the codes");
static_assert(MUSER_IQ4_NL_BYTES % 2 == 0 && MUSER_IQ4_XS_BYTES % 2 == 0 && MUSER_IQ4_NL_D % 2 == 0 &&
                  MUSER_IQ4_XS_D % 2 == 0,
              "block halfs stay 2-byte aligned (MXFP4 has none)");

constant char kIQ4Values[16] = MUSER_IQ4_VALUES;
constant char kFP4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Half the value of an E8M0 scale byte, 2^(e - 128) (e = 0, 1: subnormals).
inline float e8m0_half(uchar e) {
  return as_type<float>(e < 2 ? 0x00200000u << e : uint(e - 1) << 23);
}

// IQ4_NL: y = v[code] * d.
struct FormatIQ4NL {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_IQ4_NL * MUSER_IQ4_NL_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 2) * MUSER_IQ4_NL_BYTES;
    const int h = int(c % 2);
    const float d = f16_at(blk, MUSER_IQ4_NL_D);
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(kIQ4Values[(blk[MUSER_IQ4_NL_QS + i] >> (4 * h)) & 0x0F]) * d;
  }
};

// IQ4_XS: chunk c is super-block c / 16, sub-block j = (c % 16) / 2, half c % 2;
// ls_j: 4 low bits in nibble j % 2 of scales_l[j / 2], 2 high bits at bits 2j of
// the little-endian u16 scales_h; y = v[code] * (d * (ls_j - 32)).
struct FormatIQ4XS {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_K * MUSER_IQ4_XS_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 16) * MUSER_IQ4_XS_BYTES;
    const int j = int(c % 16) / 2, h = int(c % 2);
    const uint high = uint(blk[MUSER_IQ4_XS_SCALES_H]) | (uint(blk[MUSER_IQ4_XS_SCALES_H + 1]) << 8);
    const int ls = ((blk[MUSER_IQ4_XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0x0F) | int(((high >> (2 * j)) & 3) << 4);
    const float dl = f16_at(blk, MUSER_IQ4_XS_D) * float(ls - 32);
    device const uchar *qs = blk + MUSER_IQ4_XS_QS + 16 * j;
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(kIQ4Values[(qs[i] >> (4 * h)) & 0x0F]) * dl;
  }
};

// MXFP4: y = doubled_e2m1[code] * e8m0_half(e).
struct FormatMXFP4 {
  static long row_bytes(long n_in) { return n_in / MUSER_QK_MXFP4 * MUSER_MXFP4_BYTES; }
  static void chunk(device const uchar *row, device const uchar *, float, uint c, thread float *w) {
    device const uchar *blk = row + long(c / 2) * MUSER_MXFP4_BYTES;
    const int h = int(c % 2);
    const float d = e8m0_half(blk[MUSER_MXFP4_E]);
    for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = float(kFP4Doubled[(blk[MUSER_MXFP4_QS + i] >> (4 * h)) & 0x0F]) * d;
  }
};

MUSER_DEFINE_KERNELS(iq4_nl, FormatIQ4NL)
MUSER_DEFINE_KERNELS(iq4_xs, FormatIQ4XS)
MUSER_DEFINE_KERNELS(mxfp4, FormatMXFP4)
