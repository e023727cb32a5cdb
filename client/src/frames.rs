//! What the blocking and the async connections share: how a request becomes frames, the HELLO
//! messages, and how long a GET's answer is.

use std::ops::Range;

use hydrant_proto::message::{HelloRequest, Message, ObjectInfo};
use hydrant_proto::{payload_crc, FrameFlags, FrameHeader, Limits, Opcode, FRAME_HEADER_BYTES};

/// One answer frame, read whole.
pub(crate) struct Frame {
    pub(crate) header: FrameHeader,
    pub(crate) extension: Vec<u8>,
    pub(crate) payload: Vec<u8>,
}

/// Progress of a transfer: called with (bytes moved so far, bytes in all).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// A shorter borrow of an optional progress callback, for one attempt of a retried call.
pub(crate) fn reborrow<'a>(progress: &'a mut Option<Progress<'_>>) -> Option<Progress<'a>> {
    match progress {
        Some(progress) => Some(&mut **progress),
        None => None,
    }
}

/// Bytes moved between two calls of a progress callback, so that a large frame still reports
/// as it goes.
pub(crate) const PROGRESS_STEP_BYTES: usize = 1 << 20;

/// One frame of a request: its header and extension encoded together (small), and the range of
/// the request's payload it carries (sent from the caller's buffer, uncopied).
pub(crate) struct RequestFrame {
    pub(crate) head: Vec<u8>,
    pub(crate) payload: Range<usize>,
}

/// The frames of one request: a payload above the negotiated frame limit goes as several
/// frames, the extension in the first, MORE on all but the last.
pub(crate) fn request_frames(
    opcode: Opcode,
    request_id: u64,
    extension: &[u8],
    payload: &[u8],
    limits: &Limits,
    flags: FrameFlags,
) -> Vec<RequestFrame> {
    let part_bytes = usize::try_from(limits.payload_bytes_max).unwrap_or(usize::MAX);
    assert!(part_bytes > 0, "a negotiated frame holds at least 4 KiB");
    let parts = payload.len().div_ceil(part_bytes).max(1);
    (0..parts)
        .map(|index| {
            let range = (index * part_bytes).min(payload.len())
                ..((index + 1) * part_bytes).min(payload.len());
            let part_extension = if index == 0 { extension } else { &[][..] };
            let mut header = FrameHeader::new(
                opcode,
                request_id,
                part_extension,
                range.len() as u64,
                payload_crc(&payload[range.clone()]),
            );
            header.flags = flags;
            if index + 1 < parts {
                header.flags = header.flags.with(FrameFlags::MORE);
            }
            let mut head = Vec::with_capacity(FRAME_HEADER_BYTES + part_extension.len());
            head.extend_from_slice(&header.encode());
            head.extend_from_slice(part_extension);
            RequestFrame {
                head,
                payload: range,
            }
        })
        .collect()
}

/// HELLO for protocol version 1 with our limits, and the proof of the token when the server
/// asked for one.
pub(crate) fn hello(client_nonce: [u8; 16], proof: Option<[u8; 32]>) -> Vec<u8> {
    HelloRequest {
        version_min: 1,
        version_max: 1,
        limits: Limits::default(),
        client_nonce,
        proof,
    }
    .encode()
}

/// The bytes a GET of `range_end` (exclusive; `None`: to the end) answered with `info` carries,
/// as the server computes them.
pub(crate) fn answer_bytes(info: &ObjectInfo, range_end: Option<u64>) -> u64 {
    let end = range_end
        .unwrap_or(info.object_bytes)
        .min(info.object_bytes);
    end.saturating_sub(info.range_start)
}

/// A random 64-bit number: std's randomly seeded hasher over a counter and the clock. Good
/// enough for nonces and backoff jitter, with no dependency.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    hasher.write_u128(nanos);
    hasher.finish()
}

/// A nonce for HELLO, new for every connection.
pub(crate) fn random_nonce() -> [u8; 16] {
    let mut nonce = [0u8; 16];
    nonce[..8].copy_from_slice(&random_u64().to_le_bytes());
    nonce[8..].copy_from_slice(&random_u64().to_le_bytes());
    nonce
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_payload_is_split_into_frames_with_more_on_all_but_the_last() {
        let limits = Limits {
            payload_bytes_max: 4096,
            ..Limits::default()
        };
        let payload = vec![7u8; 10_000];
        let frames = request_frames(
            Opcode::Put,
            9,
            b"name",
            &payload,
            &limits,
            FrameFlags::empty(),
        );
        let ranges: Vec<_> = frames.iter().map(|frame| frame.payload.clone()).collect();
        assert_eq!(ranges, [0..4096, 4096..8192, 8192..10_000]);
        for (index, frame) in frames.iter().enumerate() {
            let header = FrameHeader::decode(&frame.head, &limits).unwrap();
            assert_eq!(header.request_id, 9);
            assert_eq!(header.flags.contains(FrameFlags::MORE), index < 2);
            let extension_bytes = if index == 0 { 4 } else { 0 };
            assert_eq!(header.extension_len, extension_bytes);
            assert_eq!(frame.head.len(), 48 + extension_bytes as usize);
        }
        let empty = request_frames(Opcode::Ping, 1, &[], &[], &limits, FrameFlags::empty());
        assert_eq!(empty.len(), 1, "a request without payload is one frame");
    }

    #[test]
    fn answer_bytes_follow_the_range_clipped_to_the_object() {
        let info = ObjectInfo {
            object_bytes: 100,
            seq: 1,
            dirty: false,
            range_start: 10,
        };
        assert_eq!(answer_bytes(&info, None), 90);
        assert_eq!(answer_bytes(&info, Some(20)), 10);
        assert_eq!(answer_bytes(&info, Some(1000)), 90);
    }
}
