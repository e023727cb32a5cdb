//! The writer's side: answer frames as queued (header and extension, payload where the read
//! left it) and the loop that sends them, several per send.

use super::*;

/// Bytes an answer carries, held until every frame that carries them is sent.
pub(super) struct HeldBytes {
    pub(super) body: Body,
    pub(super) _reservation: Option<Reservation>,
}

pub(super) enum Body {
    /// Where the read left them: the DRAM tier's copy or the shard's pinned buffers.
    Read(ReadData),
    Owned(Vec<u8>),
}

impl HeldBytes {
    pub(super) fn owned(bytes: Vec<u8>) -> HeldBytes {
        HeldBytes {
            body: Body::Owned(bytes),
            _reservation: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        match &self.body {
            Body::Read(data) => data.len(),
            Body::Owned(bytes) => bytes.len(),
        }
    }

    /// Each slice of the bytes of `range`, in order.
    pub(super) fn for_each_slice(
        &self,
        range: std::ops::Range<usize>,
        mut visit: impl FnMut(&[u8]),
    ) {
        let mut offset = 0;
        let mut part = |part: &[u8]| {
            let (part_start, part_end) = (offset, offset + part.len());
            offset = part_end;
            let start = range.start.max(part_start);
            let end = range.end.min(part_end);
            if start < end {
                visit(&part[start - part_start..end - part_start]);
            }
        };
        match &self.body {
            Body::Read(data) => data.for_each_part(part),
            Body::Owned(bytes) => part(bytes),
        }
    }

    /// The CRC32C of `range`: for the whole of a read, what the engine knows of it (the DRAM
    /// tier keeps its objects' CRCs, NVMe reads join their checked pieces' CRCs); else read.
    pub(super) fn crc(&self, range: std::ops::Range<usize>) -> u32 {
        if let Body::Read(data) = &self.body {
            if range == (0..data.len()) {
                return data.crc();
            }
        }
        let mut crc = 0;
        self.for_each_slice(range, |slice| {
            crc = hydrant_proto::crc::crc32c_append(crc, slice)
        });
        crc
    }
}

/// One answer frame waiting to be sent: its header and extension, then its payload where it
/// lies.
pub(super) struct OutFrame {
    pub(super) head: Head,
    pub(super) payload: Option<(Rc<HeldBytes>, std::ops::Range<usize>)>,
}

impl OutFrame {
    pub(super) fn len(&self) -> usize {
        self.head.as_slice().len() + self.payload.as_ref().map_or(0, |(_, range)| range.len())
    }

    pub(super) fn slice_count(&self) -> usize {
        let mut count = 1;
        if let Some((held, range)) = &self.payload {
            held.for_each_slice(range.clone(), |_| count += 1);
        }
        count
    }
}

/// Answer frames sent together.
pub(super) struct SendBatch {
    pub(super) frames: Vec<OutFrame>,
}

// SAFETY: every slice lies on the heap, owned or shared by a frame of the batch and never
// changed while it is held: a head lies in its frame, inside the batch's Vec (whose buffer
// neither moves nor changes while the batch is held), or in a Vec of its own; payloads are
// Vecs, the DRAM tier's Rc<[u8]> (never written after it is filled) or the shard's read buffers
// (owned by the ReadData).
unsafe impl SendParts for SendBatch {
    fn for_each_part(&self, visit: &mut dyn FnMut(&[u8])) {
        for frame in &self.frames {
            visit(frame.head.as_slice());
            if let Some((held, range)) = &frame.payload {
                held.for_each_slice(range.clone(), &mut *visit);
            }
        }
    }
}

/// Bytes of header and extension a frame holds in itself (GET's answer: 48 + 25); a longer
/// head (HELLO's answer, say) has a Vec of its own.
pub(super) const HEAD_INLINE_BYTES: usize = 80;

/// A frame's header and extension, as sent.
pub(super) enum Head {
    Inline([u8; HEAD_INLINE_BYTES], u8),
    Heap(Vec<u8>),
}

impl Head {
    pub(super) fn new(header: &FrameHeader, extension: &[u8]) -> Head {
        let len = FRAME_HEADER_BYTES + extension.len();
        if len <= HEAD_INLINE_BYTES {
            let mut bytes = [0u8; HEAD_INLINE_BYTES];
            bytes[..FRAME_HEADER_BYTES].copy_from_slice(&header.encode());
            bytes[FRAME_HEADER_BYTES..len].copy_from_slice(extension);
            Head::Inline(bytes, len as u8)
        } else {
            let mut bytes = Vec::with_capacity(len);
            bytes.extend_from_slice(&header.encode());
            bytes.extend_from_slice(extension);
            Head::Heap(bytes)
        }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            Head::Inline(bytes, len) => &bytes[..usize::from(*len)],
            Head::Heap(bytes) => bytes,
        }
    }
}

pub(super) fn out_frame(
    header: &FrameHeader,
    extension: &[u8],
    payload: Option<Rc<HeldBytes>>,
    range: std::ops::Range<usize>,
) -> OutFrame {
    let head = Head::new(header, extension);
    OutFrame {
        head,
        payload: payload
            .filter(|_| !range.is_empty())
            .map(|held| (held, range)),
    }
}

/// The longest list of frames a connection's writer keeps between sends.
pub(super) const FRAMES_KEPT_MAX: usize = 64;

/// Send queued answers, several per send (each from where its bytes lie), until reading is
/// done and the queue is empty.
pub(super) async fn write_loop(connection: Rc<Connection>, socket: RawFd) {
    // Kept from batch to batch, so that a send allocates no list of frames.
    let mut frames = Vec::new();
    loop {
        let batch = {
            let mut outbox = connection.outbox.borrow_mut();
            let mut bytes = 0;
            let mut slices = 0;
            while let Some(frame) = outbox.front() {
                let frame_slices = frame.slice_count();
                if !frames.is_empty()
                    && (bytes + frame.len() > SEND_BATCH_BYTES_MAX
                        || slices + frame_slices > SEND_SLICES_MAX)
                {
                    break;
                }
                bytes += frame.len();
                slices += frame_slices;
                frames.push(outbox.pop_front().expect("front exists"));
            }
            SendBatch { frames }
        };
        if batch.frames.is_empty() {
            if connection.reading_done.get() {
                return;
            }
            frames = batch.frames;
            connection.outbox_changed.wait().await;
            continue;
        }
        let total: usize = batch.frames.iter().map(OutFrame::len).sum();
        let (sent, batch) = net::send_parts(socket, batch).await;
        // The answers' bytes (and their room in the budget) go back now.
        frames = batch.frames;
        frames.clear();
        if frames.capacity() > FRAMES_KEPT_MAX {
            // A burst of many small answers: give the list back rather than keep it per
            // connection.
            frames = Vec::new();
        }
        connection.last_activity.set(time::now_coarse());
        connection
            .outbox_bytes
            .set(connection.outbox_bytes.get() - total);
        if sent.is_err() {
            // The peer is gone: drop what is left; the reader sees the close too.
            connection.outbox.borrow_mut().clear();
            connection.outbox_bytes.set(0);
            if connection.reading_done.get() {
                return;
            }
        }
        connection.outbox_changed.wake_all();
    }
}
