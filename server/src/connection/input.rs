//! The reader's side: bytes received and not yet decoded, in one buffer.

use super::*;

/// Bytes received and not yet consumed, in one buffer: the bytes `start..len` of `buf`. It
/// holds at least `RECEIVE_BYTES_MIN`, grows to hold the frame being read (bounded by the
/// negotiated limits), and shrinks back once a large frame is used.
///
/// While the connection waits for small frames, a multishot receive stays armed on its socket
/// (`net::RecvStream`): the kernel puts arriving bytes in the shard's provided buffers and they
/// are copied here, with no submission per request. A frame that still misses more than
/// `STREAM_BYTES_MAX` is received with plain receives straight into this buffer, and so is
/// the rest of a frame during which a stream ended without the peer closing (no provided buffer
/// was free, or the connection left too many unread).
pub(super) struct Input {
    pub(super) socket: RawFd,
    /// The connection's last activity, set by every receive that brings bytes.
    pub(super) last_activity: Rc<Cell<Instant>>,
    /// `None` only while a plain receive holds it.
    pub(super) buf: Option<IoBuf>,
    pub(super) start: usize,
    /// The armed multishot receive, if any: while it is, nothing else receives.
    pub(super) stream: Option<net::RecvStream>,
    /// A stream ended without the peer closing: plain receives until this frame is in.
    pub(super) plain: bool,
}

/// A frame missing more bytes than this is received straight into the input buffer, not in
/// provided buffers.
pub(super) const STREAM_BYTES_MAX: usize = 64 * 1024;

impl Input {
    pub(super) fn new(socket: RawFd, last_activity: Rc<Cell<Instant>>) -> Input {
        Input {
            socket,
            last_activity,
            buf: Some(IoBuf::heap(RECEIVE_BYTES_MIN)),
            start: 0,
            stream: None,
            plain: false,
        }
    }

    pub(super) fn buf(&self) -> &IoBuf {
        self.buf
            .as_ref()
            .expect("the input buffer is back from its receive")
    }

    pub(super) fn buffered(&self) -> usize {
        self.buf().len() - self.start
    }

    /// Wait until at least `count` bytes are buffered. Ok(false) when the peer closed the
    /// connection cleanly with nothing buffered.
    pub(super) async fn fill(&mut self, count: usize) -> io::Result<bool> {
        if self.buffered() == 0 {
            self.plain = false;
        }
        while self.buffered() < count {
            let buffered = self.buffered();
            if count - buffered > STREAM_BYTES_MAX {
                // A large frame: plain receives, once the stream's last bytes are in.
                if let Some(stream) = self.stream.as_mut() {
                    stream.cancel();
                }
            } else if self.stream.is_none() && !self.plain {
                self.stream = net::RecvStream::start(self.socket);
            }
            let mut buf = self
                .buf
                .take()
                .expect("the input buffer is back from its receive");
            if buffered == 0 {
                // Everything was used: start again at the front, and give a large frame's
                // memory back.
                self.start = 0;
                buf.set_len(0);
                if buf.capacity() > RECEIVE_BYTES {
                    buf = IoBuf::heap(RECEIVE_BYTES_MIN);
                }
            }
            // Room for the rest of `count`: a larger buffer when this one cannot hold the whole
            // of it, grown with what arrives (by at most RECEIVE_BYTES past the bytes buffered,
            // or to twice its size), so that a frame's announced length is not allocated before
            // its bytes come; else the buffered bytes move to the front when the room behind
            // them is short. A stream needs room for one provided buffer.
            let whole = count.max(RECEIVE_BYTES_MIN);
            let mut capacity = whole.min((buffered + RECEIVE_BYTES).max(2 * buf.capacity()));
            let room_short = if self.stream.is_some() {
                capacity = capacity.max((buffered + net::RECEIVE_BUFFER_BYTES).next_power_of_two());
                buf.capacity() - buf.len() < net::RECEIVE_BUFFER_BYTES
            } else {
                buf.capacity() - self.start < count
            };
            if buf.capacity() < capacity {
                let mut larger = IoBuf::heap(capacity);
                larger.set_len(buffered);
                larger
                    .as_mut_slice()
                    .copy_from_slice(&buf.as_slice()[self.start..]);
                buf = larger;
                self.start = 0;
            } else if self.start > 0 && room_short {
                let end = buf.len();
                buf.set_len(buf.capacity());
                buf.as_mut_slice().copy_within(self.start..end, 0);
                buf.set_len(buffered);
                self.start = 0;
            }
            let received = match self.stream.as_mut() {
                Some(stream) => {
                    let received = stream.recv_into(&mut buf).await;
                    self.buf = Some(buf);
                    match received? {
                        net::Received::Data(bytes) => bytes,
                        net::Received::Closed => {
                            self.stream = None;
                            0
                        }
                        net::Received::Ended => {
                            self.stream = None;
                            self.plain = true;
                            continue;
                        }
                    }
                }
                None => {
                    // With nothing buffered, the peer is most likely still waiting for an
                    // answer.
                    let (received, buf) = net::recv(self.socket, buf, buffered == 0).await;
                    self.buf = Some(buf);
                    received?
                }
            };
            if received > 0 {
                self.last_activity.set(time::now_coarse());
            }
            if received == 0 {
                if buffered == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection mid-frame",
                ));
            }
        }
        Ok(true)
    }

    /// The next `count` bytes, already buffered (see `fill`), consumed: they stay where they
    /// lie until the next `fill`.
    pub(super) fn take_filled(&mut self, count: usize) -> &[u8] {
        assert!(
            self.buffered() >= count,
            "more bytes taken than were filled"
        );
        let start = self.start;
        self.start += count;
        &self.buf().as_slice()[start..start + count]
    }

    /// The next bytes, at most `max` and at most `RECEIVE_BYTES` (waited for, up to that much,
    /// so that a large payload is received in large pieces without a buffer of its size).
    pub(super) async fn take_upto(&mut self, max: usize) -> Result<&[u8], String> {
        let count = max.min(RECEIVE_BYTES);
        self.take(count).await
    }

    /// Up to `max` more bytes of a payload appended to `chunk` (at most its room, at least one
    /// byte): bytes already buffered are copied; with none buffered and no multishot receive
    /// armed, they are received straight into the chunk, so that a streamed PUT's bytes reach
    /// the device with no copy on the way.
    pub(super) async fn take_into(
        &mut self,
        chunk: &mut hydrant_engine::buf::ChunkData,
        max: usize,
    ) -> Result<(), String> {
        let max = max.min(chunk.capacity() - chunk.len());
        assert!(max > 0, "bytes taken into a full chunk");
        if self.buffered() == 0 && self.stream.is_none() {
            let (received, back) =
                net::recv_into_chunk(self.socket, std::mem::take(chunk), max).await;
            *chunk = back;
            return match received {
                Ok(0) => Err("the peer closed the connection mid-frame".into()),
                Ok(_) => {
                    self.last_activity.set(time::now_coarse());
                    Ok(())
                }
                Err(error) => Err(error.to_string()),
            };
        }
        // A multishot receive is armed (taking the bytes it holds ends it for a large
        // payload, see `fill`), or bytes came with the frame before: through the buffer.
        let count = if self.buffered() > 0 {
            max.min(self.buffered())
        } else {
            max.min(RECEIVE_BYTES)
        };
        chunk.extend_from_slice(self.take(count).await?);
        Ok(())
    }

    /// The next `count` bytes, waited for (an error if the peer closes before them).
    pub(super) async fn take(&mut self, count: usize) -> Result<&[u8], String> {
        match self.fill(count).await {
            Ok(true) => Ok(self.take_filled(count)),
            Ok(false) => Err("the peer closed the connection mid-frame".into()),
            Err(error) => Err(error.to_string()),
        }
    }
}
