//! CRC32C (Castagnoli), the checksum of frames and stored data.
//!
//! Buffers of 256 bytes or more are folded 256 bytes at a time with carry-less multiplication
//! on 512-bit registers (VPCLMULQDQ + AVX-512F) where the CPU has them, several times faster
//! than the `crc32` instruction the `crc32c` crate uses (which finishes the folded remainder
//! and every short buffer). The result is the same CRC either way.
//!
//! The folding: a 16-byte lane `A` that stands `D` bits before a lane `B` of the message is
//! congruent, modulo the polynomial, to `A.lo * x^(D+32) + A.hi * x^(D-32)` placed at `B` (in the
//! reflected bit order of CRC32C, with the constants shifted by one for the product's
//! alignment). Folding every lane forward keeps the CRC of "lanes, then the bytes not yet
//! read" equal to the CRC of the message, so the last 64 bytes of lanes are finished with the
//! plain instruction.

/// The CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// The CRC32C of the bytes whose CRC32C is `crc`, followed by `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= FOLD_BYTES_MIN && wide::available() {
        // SAFETY: the CPU has the features `fold` is compiled for (checked just above).
        return unsafe { wide::fold(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

pub mod combine;

/// Below this, folding does not pay for itself.
const FOLD_BYTES_MIN: usize = 256;

/// x^bits modulo the polynomial (bit-reflected, as CRC32C computes), shifted left by one for
/// the alignment of a carry-less product: a folding constant. `bits` is a multiple of 8.
const fn fold_constant(bits: u64) -> u64 {
    assert!(bits.is_multiple_of(8));
    (combine::shift_of(bits / 8) as u64) << 1
}

#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::fold_constant;

    /// Constants to fold a lane 256 bytes forward (the four-register loop) and 64 bytes
    /// forward (one register into the next).
    const FAR: (u64, u64) = (fold_constant(2048 + 32), fold_constant(2048 - 32));
    const NEAR: (u64, u64) = (fold_constant(512 + 32), fold_constant(512 - 32));

    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }

    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn constants((low, high): (u64, u64)) -> __m512i {
        _mm512_broadcast_i32x4(_mm_set_epi64x(high as i64, low as i64))
    }

    /// `lanes` folded forward by the distance of `keys`, then `next` added.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold_into(lanes: __m512i, keys: __m512i, next: __m512i) -> __m512i {
        let low = _mm512_clmulepi64_epi128::<0x00>(lanes, keys);
        let high = _mm512_clmulepi64_epi128::<0x11>(lanes, keys);
        // Three-way XOR (0x96: a ^ b ^ c).
        _mm512_ternarylogic_epi64::<0x96>(low, high, next)
    }

    /// # Safety
    /// `data` holds at least 256 bytes; the CPU has AVX-512F and VPCLMULQDQ.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub(super) unsafe fn fold(crc: u32, data: &[u8]) -> u32 {
        debug_assert!(data.len() >= 256);
        let load = |offset: usize| {
            // SAFETY: callers pass offsets with 64 bytes of `data` behind them.
            unsafe { _mm512_loadu_si512(data.as_ptr().add(offset).cast()) }
        };
        // The CRC so far enters as the complement of the first four bytes.
        let mut start = [0u32; 16];
        start[0] = !crc;
        // SAFETY: reads the 64 bytes of `start`.
        let start = unsafe { _mm512_loadu_si512(start.as_ptr().cast()) };
        let mut lanes = [
            _mm512_xor_si512(load(0), start),
            load(64),
            load(128),
            load(192),
        ];
        let mut offset = 256;
        let far = constants(FAR);
        while data.len() - offset >= 256 {
            for (index, lane) in lanes.iter_mut().enumerate() {
                *lane = fold_into(*lane, far, load(offset + 64 * index));
            }
            offset += 256;
        }
        let near = constants(NEAR);
        let mut last = fold_into(lanes[0], near, lanes[1]);
        last = fold_into(last, near, lanes[2]);
        last = fold_into(last, near, lanes[3]);
        while data.len() - offset >= 64 {
            last = fold_into(last, near, load(offset));
            offset += 64;
        }
        let mut remainder = [0u8; 64];
        // SAFETY: writes the 64 bytes of `remainder`.
        unsafe { _mm512_storeu_si512(remainder.as_mut_ptr().cast(), last) };
        // The lanes are message bytes with a CRC of their own: start from zero (the complement
        // of the initial value is already in), then go on over the bytes left.
        let folded = crc32c::crc32c_append(!0, &remainder);
        crc32c::crc32c_append(folded, &data[offset..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes of a xorshift sequence from `seed`.
    pub(crate) fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn the_same_crc_as_the_plain_instruction_for_every_length_start_and_initial_value() {
        let data = bytes(1, 70_100);
        for len in (0..2_200).chain([4096, 4097, 65_536, 69_999]) {
            for start in [0, 1, 7, 63] {
                let slice = &data[start..start + len];
                assert_eq!(
                    crc32c(slice),
                    crc32c::crc32c(slice),
                    "len {len} start {start}"
                );
                for initial in [0, 1, 0xFFFF_FFFF, 0x1234_5678] {
                    assert_eq!(
                        crc32c_append(initial, slice),
                        crc32c::crc32c_append(initial, slice),
                        "len {len} start {start} initial {initial:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_check_value_of_crc32c() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        let long: Vec<u8> = b"123456789".iter().cycle().take(9 * 100).copied().collect();
        assert_eq!(crc32c(&long), crc32c::crc32c(&long));
    }

    #[test]
    fn a_crc_appended_in_pieces_is_the_crc_of_the_whole() {
        let data = bytes(2, 10_000);
        for split in [0, 1, 255, 256, 257, 4096, 9_999] {
            let (head, tail) = data.split_at(split);
            assert_eq!(
                crc32c_append(crc32c(head), tail),
                crc32c(&data),
                "split {split}"
            );
        }
    }
}
