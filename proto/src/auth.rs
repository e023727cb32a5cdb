//! The HELLO proof: HMAC-SHA256 keyed by the shared token over the server's nonce then the
//! client's. The token itself never crosses the wire.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::message::{NONCE_BYTES, PROOF_BYTES};

/// Shortest token a server accepts.
pub const TOKEN_BYTES_MIN: usize = 16;

pub fn proof(
    token: &[u8],
    server_nonce: &[u8; NONCE_BYTES],
    client_nonce: &[u8; NONCE_BYTES],
) -> [u8; PROOF_BYTES] {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes keys of any length");
    mac.update(server_nonce);
    mac.update(client_nonce);
    mac.finalize().into_bytes().into()
}

/// Check a proof in constant time.
pub fn verify(
    token: &[u8],
    server_nonce: &[u8; NONCE_BYTES],
    client_nonce: &[u8; NONCE_BYTES],
    proof: &[u8; PROOF_BYTES],
) -> bool {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes keys of any length");
    mac.update(server_nonce);
    mac.update(client_nonce);
    mac.verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_token_verifies_and_nothing_else_does() {
        let token = b"a shared secret of some length";
        let proof = proof(token, &[1; 16], &[2; 16]);
        assert!(verify(token, &[1; 16], &[2; 16], &proof));
        assert!(!verify(
            b"another secret of some length!",
            &[1; 16],
            &[2; 16],
            &proof
        ));
        assert!(
            !verify(token, &[3; 16], &[2; 16], &proof),
            "a replayed proof fails a new nonce"
        );
        let mut flipped = proof;
        flipped[0] ^= 1;
        assert!(!verify(token, &[1; 16], &[2; 16], &flipped));
    }
}
