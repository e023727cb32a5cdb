//! Streams both ways. A GET larger than a chunk is read and sent a chunk at a time, each part's
//! room taken from the connection's answer budget before it is read (so the budget, not the
//! object, bounds what the answer holds); every part must be of the version the first was, else
//! the answer ends with a CHANGED frame.
//!
//! A streamed PUT (frames flagged MORE): its payload is taken from the connection as it arrives,
//! in pieces of at most `RECEIVE_BYTES`, cut into the engine's chunks and handed to the owning
//! shard's put one chunk at a time (`EngineHandle::put_stream`), so that an object of any size
//! is never whole in memory. A connection holds at most the chunk it is filling and the chunks
//! queued for the shard; all streams together hold at most the engine's `streamed_bytes_max`,
//! and a stream waits (the connection is not read) while that is reached. The stream is read to
//! its last frame even when refused, so that one request gets one answer and the connection
//! stays in step; a stream cut off or refused midway leaves nothing visible: the object's last
//! chunk, which makes the version complete, goes to the shard only once every frame is in and
//! has matched its checksum, and a frame that would carry bytes past the object's is refused
//! before any of them is kept.

use hydrant_engine::{PutSink, StreamedChunk};
use hydrant_proto::crc::combine::Joined;

use super::*;

/// The put a stream feeds, while it is accepted.
struct Feeding {
    sink: PutSink,
    outcome: hydrant_engine::rt::JoinHandle<hydrant_engine::Result<hydrant_engine::ObjectMeta>>,
    object_bytes: u64,
    chunk_bytes: u64,
    /// Bytes received so far (all of them in chunks).
    received: u64,
    /// The chunk being filled.
    chunk: Option<StreamedChunk>,
    /// Its piece checksums, as its bytes land.
    checksums: PieceChecksums,
    /// The put ended before the stream did (its outcome says why).
    ended: bool,
}

/// The CRC32C of a chunk's pieces of `piece_bytes` (the store's `crc_block_bytes`), computed
/// as the chunk fills, in the same pass over the bytes that checks the frames' checksums: the
/// shard takes them as they are (`StreamedChunk::crcs`) instead of reading every byte again,
/// and a frame's checksum is joined from its pieces' (a few carry-less multiplications each).
struct PieceChecksums {
    piece_bytes: usize,
    /// The chunk's pieces so far.
    done: Vec<u32>,
    /// The piece being filled: the CRC32C and length of its bytes in earlier frames...
    before: (u32, u64),
    /// ... and in this frame.
    open: (u32, u64),
}

impl PieceChecksums {
    fn new(piece_bytes: usize) -> PieceChecksums {
        PieceChecksums {
            piece_bytes,
            done: Vec::new(),
            before: (0, 0),
            open: (0, 0),
        }
    }

    /// Checksum `data[from..]`, the bytes just added to the chunk that holds `data`, into its
    /// pieces' checksums and the frame's (`frame`).
    fn add(&mut self, data: &[u8], from: usize, frame: &mut Joined) {
        let mut at = from;
        while at < data.len() {
            let piece_end = (at / self.piece_bytes + 1) * self.piece_bytes;
            let end = piece_end.min(data.len());
            self.open.0 = hydrant_proto::crc::crc32c_append(self.open.0, &data[at..end]);
            self.open.1 += (end - at) as u64;
            if end == piece_end {
                self.close_piece(frame);
            }
            at = end;
        }
    }

    /// The frame ends (or bytes that are not kept follow in it): the open piece's bytes so far
    /// go into the frame's checksum, and the piece goes on in the next.
    fn end_frame(&mut self, frame: &mut Joined) {
        let (crc, bytes) = std::mem::take(&mut self.open);
        frame.push(crc, bytes);
        self.before = (
            hydrant_proto::crc::combine::combine(self.before.0, crc, bytes),
            self.before.1 + bytes,
        );
    }

    fn close_piece(&mut self, frame: &mut Joined) {
        let (crc, bytes) = std::mem::take(&mut self.open);
        frame.push(crc, bytes);
        let (before, before_bytes) = std::mem::take(&mut self.before);
        self.done.push(if before_bytes == 0 {
            crc
        } else {
            hydrant_proto::crc::combine::combine(before, crc, bytes)
        });
    }

    /// The checksums of a whole chunk (its last piece may be short); ready for the next.
    fn finish(&mut self, frame: &mut Joined) -> Vec<u32> {
        if self.open.1 + self.before.1 > 0 {
            self.close_piece(frame);
        }
        std::mem::take(&mut self.done)
    }
}

impl Feeding {
    /// Bytes of the chunk that starts at `received`.
    fn chunk_len(&self) -> usize {
        (self.object_bytes - self.received).min(self.chunk_bytes) as usize
    }

    /// Receive up to `max` more bytes of the payload into the chunk being filled (straight from
    /// the socket where none are buffered), checksum them where they landed (into `frame`, the
    /// frame's checksum), and hand the chunk to the put once full. Returns how many came.
    async fn receive(
        &mut self,
        engine: &EngineHandle,
        input: &mut Input,
        max: usize,
        frame: &mut Joined,
    ) -> Result<usize, String> {
        if self.chunk.is_none() {
            self.chunk = Some(engine.streamed_chunk(self.chunk_len()).await);
        }
        let chunk = self.chunk.as_mut().expect("just made");
        let from = chunk.data.len();
        input.take_into(&mut chunk.data, max).await?;
        self.checksums.add(&chunk.data, from, frame);
        let added = chunk.data.len() - from;
        self.received += added as u64;
        // The last chunk makes the version visible: it waits until every frame is in and
        // checked (`stream_in`).
        if chunk.data.len() == chunk.data.capacity() && self.received < self.object_bytes {
            self.send_chunk(frame).await;
        }
        Ok(added)
    }

    async fn send_chunk(&mut self, frame: &mut Joined) {
        let mut chunk = self.chunk.take().expect("a chunk to send");
        chunk.crcs = Some(self.checksums.finish(frame));
        if !self.sink.send(chunk).await {
            self.ended = true;
        }
    }
}

/// Read a streamed request whose first frame's header is `first`, and answer it.
pub(super) async fn stream_in(
    connection: &Rc<Connection>,
    input: &mut Input,
    first: FrameHeader,
    in_flight: &Rc<Semaphore>,
) -> Result<(), String> {
    let started = time::now_coarse();
    let extension = input.take(first.extension_len as usize).await?.to_vec();
    let mut refusal = first
        .check_extension(&extension)
        .err()
        .map(|error| (Status::for_error(&error), error.to_string()));
    if refusal.is_none() && first.opcode != Opcode::Put {
        refusal = Some((
            Status::BadRequest,
            "only PUT may stream over several frames".into(),
        ));
    }
    let mut feeding = None;
    if refusal.is_none() {
        match start(connection, &extension) {
            Ok(started) => feeding = Some(started),
            Err(refused) => refusal = Some(refused),
        }
    }
    // The PUT counts among the requests in flight from its first frame to its answer.
    let permit = in_flight.acquire_owned().await;
    let mut frame = first;
    let mut bytes_in = FRAME_HEADER_BYTES + extension.len();
    loop {
        let mut remaining = frame.payload_len as usize;
        let mut crc = Joined::new();
        if feeding
            .as_ref()
            .is_some_and(|feeding| feeding.received + frame.payload_len > feeding.object_bytes)
        {
            // Refused before any of its bytes is kept: the put never gets its last chunk.
            refusal = Some((Status::BadRequest, "more bytes than object_bytes".into()));
            feeding = None;
        }
        while remaining > 0 {
            match feeding.as_mut().filter(|feeding| !feeding.ended) {
                Some(feeding) => {
                    remaining -= feeding
                        .receive(&connection.engine, input, remaining, &mut crc)
                        .await?;
                }
                None => {
                    // Refused, or the put ended: the rest is read and checked, not kept.
                    if let Some(feeding) = feeding.as_mut() {
                        feeding.checksums.end_frame(&mut crc);
                    }
                    let piece = input.take_upto(remaining).await?;
                    remaining -= piece.len();
                    crc.push(hydrant_proto::crc::crc32c(piece), piece.len() as u64);
                }
            }
        }
        if let Some(feeding) = feeding.as_mut() {
            feeding.checksums.end_frame(&mut crc);
        }
        let crc = crc.crc();
        bytes_in += frame.payload_len as usize;
        if refusal.is_none() {
            if let Err(error) = frame.check_payload_crc(crc) {
                refusal = Some((Status::ChecksumMismatch, error.to_string()));
                feeding = None;
            }
        }
        if !frame.flags.contains(FrameFlags::MORE) {
            break;
        }
        frame = next_frame(connection, input, &first).await?;
        bytes_in += FRAME_HEADER_BYTES;
    }
    let mut feeding = match (refusal, feeding) {
        (Some((status, message)), _) => {
            connection.answer(&first, status, &[], message.as_bytes());
            metrics::record_request(Opcode::Put, false, started.elapsed(), bytes_in, 0);
            return Ok(());
        }
        (None, None) => unreachable!("an accepted stream feeds a put"),
        (None, Some(feeding)) => feeding,
    };
    if feeding.received < feeding.object_bytes {
        // The put failed midway (its outcome says why), or the stream was short.
        let short = (
            Status::BadRequest,
            format!(
                "the stream carried {} of its {} bytes",
                feeding.received, feeding.object_bytes
            ),
        );
        let (status, message) = if feeding.ended {
            let Feeding { sink, outcome, .. } = feeding;
            drop(sink);
            outcome.await.err().map_or(short, engine_failure)
        } else {
            short
        };
        connection.answer(&first, status, &[], message.as_bytes());
        metrics::record_request(Opcode::Put, false, started.elapsed(), bytes_in, 0);
        return Ok(());
    }
    if feeding.object_bytes == 0 && !feeding.ended {
        // An empty object is one empty chunk.
        feeding.chunk = Some(connection.engine.streamed_chunk(0).await);
    }
    if feeding.chunk.is_some() && !feeding.ended {
        // The last chunk, held until every frame was read and checked.
        feeding.send_chunk(&mut Joined::new()).await;
    }
    // The shard answers once every chunk is durable; the reader goes on meanwhile.
    let connection = connection.clone();
    spawn(async move {
        let Feeding { sink, outcome, .. } = feeding;
        drop(sink);
        let (ok, bytes_out) = match outcome.await {
            Ok(meta) => {
                let extension = ObjectInfo {
                    object_bytes: meta.bytes,
                    seq: meta.seq,
                    dirty: meta.dirty,
                    range_start: 0,
                }
                .encode();
                connection.answer_held(&first, Status::Ok, &extension, None);
                (true, FRAME_HEADER_BYTES + extension.len())
            }
            Err(error) => {
                let (status, message) = engine_failure(error);
                connection.answer(&first, status, &[], message.as_bytes());
                (false, FRAME_HEADER_BYTES + message.len())
            }
        };
        metrics::record_request(Opcode::Put, ok, started.elapsed(), bytes_in, bytes_out);
        drop(permit);
    });
    Ok(())
}

/// Check a streamed PUT's request and start the owning shard's put.
fn start(connection: &Connection, extension: &[u8]) -> Result<Feeding, (Status, String)> {
    let request = PutRequest::decode(extension).map_err(bad_request)?;
    let (sink, outcome) = connection
        .engine
        .put_stream(
            &request.name.bucket,
            &request.name.key,
            request.object_bytes,
        )
        .map_err(engine_failure)?;
    Ok(Feeding {
        sink,
        outcome: spawn(outcome),
        object_bytes: request.object_bytes,
        chunk_bytes: connection.engine.chunk_bytes(),
        received: 0,
        chunk: None,
        checksums: PieceChecksums::new(connection.engine.crc_block_bytes() as usize),
        ended: false,
    })
}

/// The header of a streamed request's next frame: the same request id and opcode, no
/// extension. Anything else means the stream cannot be trusted: the connection closes.
async fn next_frame(
    connection: &Connection,
    input: &mut Input,
    first: &FrameHeader,
) -> Result<FrameHeader, String> {
    if !input
        .fill(FRAME_HEADER_BYTES)
        .await
        .map_err(|error| error.to_string())?
    {
        return Err("the peer closed the connection inside a streamed request".into());
    }
    let header_bytes = input.take_filled(FRAME_HEADER_BYTES);
    let part = FrameHeader::decode(header_bytes, &connection.limits.get())
        .map_err(|error| format!("closing the connection: {error}"))?;
    if part.request_id != first.request_id || part.opcode != first.opcode || part.extension_len != 0
    {
        return Err(
            "closing the connection: a streamed request's frames must follow each other".into(),
        );
    }
    Ok(part)
}

/// Answer a GET: in one piece when it is at most a chunk, else part by part, one chunk's range
/// at a time (`ANSWER_BYTES_MAX` of them queued at most, by the answer budget). Returns whether
/// it succeeded and the bytes it queued.
pub(super) async fn answer_get(
    connection: &Rc<Connection>,
    header: &FrameHeader,
    request: GetRequest,
) -> (bool, usize) {
    let chunk_bytes = connection.engine.chunk_bytes();
    let part = |start: u64, end: u64| GetRequest {
        name: request.name.clone(),
        range_start: start,
        range_end: Some(end),
    };
    let start = request.range_start;
    let first_end = (start / chunk_bytes + 1) * chunk_bytes;
    let first_end = request
        .range_end
        .map_or(first_end, |end| end.min(first_end));
    let first = match get_object(connection, part(start, first_end), None).await {
        Ok(got) => got,
        Err((status, message)) => {
            connection.answer(header, status, &[], message.as_bytes());
            return (false, FRAME_HEADER_BYTES + message.len());
        }
    };
    let info = first.info;
    let end = request
        .range_end
        .map_or(info.object_bytes, |end| end.min(info.object_bytes));
    let mut position = info.range_start + first.held.len() as u64;
    let extension = info.encode();
    let mut bytes_out = FRAME_HEADER_BYTES + extension.len() + first.held.len();
    connection.answer_part(
        header,
        Status::Ok,
        &extension,
        Some(first.held),
        position >= end,
    );
    while position < end {
        let part_end = (position + chunk_bytes).min(end);
        let got = match get_object(connection, part(position, part_end), None).await {
            Ok(got) => got,
            Err((status, message)) => {
                return end_early(connection, header, status, &message, bytes_out)
            }
        };
        let same = got.info.seq == info.seq
            && got.info.object_bytes == info.object_bytes
            && got.origin_version == first.origin_version
            && got.info.range_start == position
            && got.held.len() as u64 == part_end - position;
        if !same {
            let message = "the object changed while it was read; read it again";
            return end_early(connection, header, Status::Changed, message, bytes_out);
        }
        position = part_end;
        bytes_out += got.held.len();
        connection.answer_part(header, Status::Ok, &[], Some(got.held), position >= end);
    }
    (true, bytes_out)
}

/// End a streamed answer with a frame of `status` (its payload the reason): the client
/// discards what it received of the answer.
fn end_early(
    connection: &Connection,
    header: &FrameHeader,
    status: Status,
    message: &str,
    bytes_out: usize,
) -> (bool, usize) {
    connection.answer(header, status, &[], message.as_bytes());
    (false, bytes_out + FRAME_HEADER_BYTES + message.len())
}
