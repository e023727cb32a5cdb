//! One blocking connection to a node: HELLO, requests sent as frames, answers read back, and
//! a pipelined batch (a writer thread sends while the caller's thread reads the answers, which
//! come in any order and are matched by request id).

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

use hydrant_proto::message::{BatchGetRequest, BatchItem, HelloResponse, Message, ObjectInfo};
use hydrant_proto::{FrameFlags, FrameHeader, Limits, Opcode, ProtoError, FRAME_HEADER_BYTES};

use crate::error::{ClientError, Result};
use crate::frames::{
    answer_bytes, hello, random_nonce, request_frames, Frame, Progress, PROGRESS_STEP_BYTES,
};
use crate::ItemResult;

/// Where a GET's bytes go: a vector sized from the answer, or the caller's buffer.
/// Bytes of a streamed PUT read from its source and sent at once.
const PUT_FRAME_BYTES_MAX: u64 = 8 << 20;

pub(crate) enum Destination<'a> {
    Grow(&'a mut Vec<u8>),
    Fixed(&'a mut [u8]),
    /// Written frame by frame as they arrive (each checked before it is written).
    Write(&'a mut dyn std::io::Write),
}

/// One request of a pipelined batch.
pub(crate) struct PipelinedRequest<'a> {
    pub(crate) opcode: Opcode,
    pub(crate) extension: Vec<u8>,
    pub(crate) payload: &'a [u8],
}

/// Bytes read from the socket at once: a small answer's header, extension and payload arrive
/// in one receive; a large payload is read straight into its destination past the first bytes.
const RECEIVE_BUFFER_BYTES: usize = 64 * 1024;

pub(crate) struct Connection {
    /// Reads go through the buffer; writes go to the socket itself (`get_mut`).
    stream: BufReader<TcpStream>,
    pub(crate) limits: Limits,
    /// From HELLO: the server's shards and each shard's own port (empty: none offered).
    pub(crate) shard_count: u16,
    pub(crate) placement_hash: u32,
    pub(crate) shard_ports: Vec<u16>,
    next_request_id: u64,
    request_timeout: Duration,
    /// An I/O or protocol error left the connection out of step: it must not be used again.
    pub(crate) broken: bool,
}

impl Connection {
    /// Connect to `address` and say HELLO (twice, with the proof of `token`, when the server
    /// asks for one).
    pub(crate) fn open(
        address: &str,
        token: Option<&[u8]>,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Connection> {
        let resolved = address.to_socket_addrs()?.next().ok_or_else(|| {
            ClientError::Usage(format!("{address} does not resolve to an address"))
        })?;
        let stream = TcpStream::connect_timeout(&resolved, connect_timeout)?;
        // HELLO is bounded by the connect timeout; requests after it by the request timeout.
        stream.set_read_timeout(Some(connect_timeout))?;
        stream.set_write_timeout(Some(connect_timeout))?;
        stream.set_nodelay(true)?;
        let mut connection = Connection {
            stream: BufReader::with_capacity(RECEIVE_BUFFER_BYTES, stream),
            limits: Limits::default(),
            shard_count: 1,
            placement_hash: 0,
            shard_ports: Vec::new(),
            next_request_id: 1,
            request_timeout,
            broken: false,
        };
        let client_nonce = random_nonce();
        let answer = connection.call(Opcode::Hello, &hello(client_nonce, None), &[])?;
        let mut greeting = HelloResponse::decode(&answer.extension)?;
        if greeting.auth_required {
            let token = token.ok_or_else(|| {
                ClientError::Usage(format!("{address} asks for a token (set HYDRANT_TOKEN)"))
            })?;
            let proof = hydrant_proto::auth::proof(token, &greeting.server_nonce, &client_nonce);
            let answer = connection.call(Opcode::Hello, &hello(client_nonce, Some(proof)), &[])?;
            greeting = HelloResponse::decode(&answer.extension)?;
        }
        connection.limits = greeting.limits;
        connection.shard_count = greeting.shard_count;
        connection.placement_hash = greeting.placement_hash;
        connection.shard_ports = greeting.shard_ports;
        connection.set_answer_timeout(Some(request_timeout))?;
        connection
            .stream
            .get_ref()
            .set_write_timeout(Some(request_timeout))?;
        Ok(connection)
    }

    /// The address this connection reached (the one of several a name resolves to).
    pub(crate) fn peer_address(&self) -> Option<std::net::SocketAddr> {
        self.stream.get_ref().peer_addr().ok()
    }

    /// How long to wait for the next bytes of an answer (`None`: without end).
    pub(crate) fn set_answer_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        let result = self
            .stream
            .get_ref()
            .set_read_timeout(timeout)
            .map_err(ClientError::Io);
        self.note(&result);
        result
    }

    /// The request timeout, for calls that lift it for a while.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Send a request and wait for its whole answer; an error status becomes an error.
    pub(crate) fn call(
        &mut self,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
    ) -> Result<Frame> {
        self.call_with_progress(opcode, extension, payload, None)
    }

    /// `call`, reporting the bytes of `payload` sent to `progress`.
    pub(crate) fn call_with_progress(
        &mut self,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
        progress: Option<Progress<'_>>,
    ) -> Result<Frame> {
        let result = self.exchange(opcode, extension, payload, progress);
        self.note(&result);
        result
    }

    /// A GET whose bytes go to `destination`; returns the object's info and the bytes read.
    /// A buffer too small for the answer is refused from the answer's info, before its bytes
    /// are read (the connection is then closed, as they are still on their way).
    pub(crate) fn get(
        &mut self,
        extension: &[u8],
        range_end: Option<u64>,
        destination: Destination<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<(ObjectInfo, usize)> {
        let result = self
            .send(Opcode::Get, extension, &[], FrameFlags::empty(), None)
            .and_then(|request_id| {
                self.receive_object(request_id, range_end, destination, progress)
            });
        self.note(&result);
        result
    }

    /// After an I/O or protocol error, or an answer left half read, the byte stream cannot be
    /// trusted any more.
    fn note<T>(&mut self, result: &Result<T>) {
        if let Err(error) = result {
            if error.breaks_connection() || matches!(error, ClientError::BufferTooSmall { .. }) {
                self.broken = true;
            }
        }
    }

    fn take_request_id(&mut self) -> u64 {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        request_id
    }

    fn exchange(
        &mut self,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
        progress: Option<Progress<'_>>,
    ) -> Result<Frame> {
        let request_id = self.send(opcode, extension, payload, FrameFlags::empty(), progress)?;
        let mut answer = self.receive()?;
        expect_request(&answer.header, request_id)?;
        while answer.header.flags.contains(FrameFlags::MORE) {
            let next = self.receive()?;
            if next.header.request_id != request_id {
                return Err(malformed("a streamed answer was interrupted"));
            }
            if next.header.status != 0 {
                return Err(ClientError::from_answer(next.header.status, &next.payload));
            }
            answer.payload.extend_from_slice(&next.payload);
            answer.header.flags = next.header.flags;
        }
        if answer.header.status != 0 {
            return Err(ClientError::from_answer(
                answer.header.status,
                &answer.payload,
            ));
        }
        Ok(answer)
    }

    /// Write one request's frames; returns its request id.
    fn send(
        &mut self,
        opcode: Opcode,
        extension: &[u8],
        payload: &[u8],
        flags: FrameFlags,
        mut progress: Option<Progress<'_>>,
    ) -> Result<u64> {
        let request_id = self.take_request_id();
        let total = payload.len() as u64;
        let mut sent = 0u64;
        for frame in request_frames(opcode, request_id, extension, payload, &self.limits, flags) {
            self.stream.get_mut().write_all(&frame.head)?;
            for step in payload[frame.payload].chunks(PROGRESS_STEP_BYTES) {
                self.stream.get_mut().write_all(step)?;
                sent += step.len() as u64;
                if let Some(progress) = progress.as_mut() {
                    progress(sent, total);
                }
            }
        }
        Ok(request_id)
    }

    fn receive_object(
        &mut self,
        request_id: u64,
        range_end: Option<u64>,
        destination: Destination<'_>,
        mut progress: Option<Progress<'_>>,
    ) -> Result<(ObjectInfo, usize)> {
        let mut header = self.receive_header()?;
        expect_request(&header, request_id)?;
        let extension = self.receive_extension(&header)?;
        if header.status != 0 {
            let reason = self.receive_payload(&header)?;
            return Err(ClientError::from_answer(header.status, &reason));
        }
        let info = ObjectInfo::decode(&extension)?;
        let needed = answer_bytes(&info, range_end);
        if let Destination::Write(writer) = destination {
            let written = self.receive_to_writer(request_id, header, needed, writer, progress)?;
            return Ok((info, written));
        }
        let target: &mut [u8] = match destination {
            Destination::Grow(vector) => {
                let needed = usize::try_from(needed)
                    .map_err(|_| malformed("an answer larger than memory"))?;
                vector.clear();
                vector.resize(needed, 0);
                &mut vector[..]
            }
            Destination::Fixed(buffer) if (buffer.len() as u64) < needed => {
                return Err(ClientError::BufferTooSmall {
                    needed,
                    capacity: buffer.len(),
                })
            }
            Destination::Fixed(buffer) => buffer,
            Destination::Write(_) => unreachable!("written above"),
        };
        let mut received = 0usize;
        loop {
            let end = received
                .checked_add(header.payload_len as usize)
                .filter(|&end| end as u64 <= needed)
                .ok_or_else(|| malformed("an answer longer than its object"))?;
            let mut crc = 0u32;
            for step in target[received..end].chunks_mut(PROGRESS_STEP_BYTES) {
                self.stream.read_exact(step)?;
                crc = hydrant_proto::crc::crc32c_append(crc, step);
                received += step.len();
                if let Some(progress) = progress.as_mut() {
                    progress(received as u64, needed);
                }
            }
            header.check_payload_crc(crc)?;
            if !header.flags.contains(FrameFlags::MORE) {
                break;
            }
            header = self.next_answer_frame(request_id)?;
        }
        if received as u64 != needed {
            return Err(malformed("an answer shorter than its object"));
        }
        Ok((info, received))
    }

    /// The header of a streamed answer's next frame. A frame with an error status ends the
    /// answer early (the object changed while it was sent, say): its reason is the error, and
    /// what came before is not an answer.
    fn next_answer_frame(&mut self, request_id: u64) -> Result<FrameHeader> {
        let header = self.receive_header()?;
        expect_request(&header, request_id)?;
        if header.status != 0 {
            let _ = self.receive_extension(&header)?;
            let reason = self.receive_payload(&header)?;
            return Err(ClientError::from_answer(header.status, &reason));
        }
        if header.extension_len != 0 {
            return Err(malformed(
                "a streamed answer's later frame has an extension",
            ));
        }
        Ok(header)
    }

    /// The rest of an answer whose first frame's header is `header`, each frame's payload
    /// checked and then written to `writer`; returns the bytes written (`needed` in all).
    fn receive_to_writer(
        &mut self,
        request_id: u64,
        mut header: FrameHeader,
        needed: u64,
        writer: &mut dyn std::io::Write,
        mut progress: Option<Progress<'_>>,
    ) -> Result<usize> {
        let mut frame = Vec::new();
        let mut written = 0u64;
        loop {
            if written + header.payload_len > needed {
                return Err(malformed("an answer longer than its object"));
            }
            frame.resize(header.payload_len as usize, 0);
            self.stream.read_exact(&mut frame)?;
            header.check_payload_crc(hydrant_proto::crc::crc32c_append(0, &frame))?;
            writer.write_all(&frame).map_err(ClientError::Local)?;
            written += frame.len() as u64;
            if let Some(progress) = progress.as_mut() {
                progress(written, needed);
            }
            if !header.flags.contains(FrameFlags::MORE) {
                break;
            }
            header = self.next_answer_frame(request_id)?;
        }
        if written != needed {
            return Err(malformed("an answer shorter than its object"));
        }
        Ok(written as usize)
    }

    /// A PUT of `object_bytes` read from `source` as it is sent, a frame at a time (at most
    /// `PUT_FRAME_BYTES_MAX` of it in memory): the object is never whole here.
    pub(crate) fn put_from(
        &mut self,
        extension: &[u8],
        object_bytes: u64,
        source: &mut dyn std::io::Read,
        mut progress: Option<Progress<'_>>,
    ) -> Result<Frame> {
        let result = (|| {
            let request_id = self.take_request_id();
            let frame_bytes = self.limits.payload_bytes_max.min(PUT_FRAME_BYTES_MAX);
            let mut buffer = Vec::new();
            let mut sent = 0u64;
            loop {
                let this = (object_bytes - sent).min(frame_bytes) as usize;
                buffer.resize(this, 0);
                source.read_exact(&mut buffer).map_err(ClientError::Local)?;
                let first = sent == 0;
                let last = sent + this as u64 == object_bytes;
                let extension = if first { extension } else { &[][..] };
                let crc = if buffer.is_empty() {
                    0
                } else {
                    hydrant_proto::crc::crc32c_append(0, &buffer)
                };
                let mut header =
                    FrameHeader::new(Opcode::Put, request_id, extension, this as u64, crc);
                if !last {
                    header.flags = header.flags.with(FrameFlags::MORE);
                }
                let stream = self.stream.get_mut();
                stream.write_all(&header.encode())?;
                stream.write_all(extension)?;
                stream.write_all(&buffer)?;
                sent += this as u64;
                if let Some(progress) = progress.as_mut() {
                    progress(sent, object_bytes);
                }
                if last {
                    break;
                }
            }
            let answer = self.receive()?;
            expect_request(&answer.header, request_id)?;
            if answer.header.status != 0 {
                return Err(ClientError::from_answer(
                    answer.header.status,
                    &answer.payload,
                ));
            }
            Ok(answer)
        })();
        if matches!(result, Err(ClientError::Local(_))) {
            // Frames of the PUT may be half sent: the connection cannot be used again.
            self.broken = true;
        }
        self.note(&result);
        result
    }

    /// Send one BATCH_GET and gather its answers (one frame per item, the last without MORE).
    pub(crate) fn batch(
        &mut self,
        request: &BatchGetRequest,
        in_order: bool,
    ) -> Result<Vec<ItemResult>> {
        let result = self.exchange_batch(request, in_order);
        self.note(&result);
        result
    }

    fn exchange_batch(
        &mut self,
        request: &BatchGetRequest,
        in_order: bool,
    ) -> Result<Vec<ItemResult>> {
        let flags = if in_order {
            FrameFlags::IN_ORDER
        } else {
            FrameFlags::empty()
        };
        let request_id = self.send(Opcode::BatchGet, &request.encode(), &[], flags, None)?;
        let mut results: Vec<Option<ItemResult>> = (0..request.items.len()).map(|_| None).collect();
        loop {
            let answer = self.receive()?;
            expect_request(&answer.header, request_id)?;
            let more = answer.header.flags.contains(FrameFlags::MORE);
            place_batch_item(&mut results, answer)?;
            if !more {
                break;
            }
        }
        results
            .into_iter()
            .map(|result| result.ok_or_else(|| malformed("an item left unanswered")))
            .collect()
    }

    /// Send every request of `requests` on this connection before their answers are read (at
    /// most the negotiated `requests_in_flight_max` unanswered at once), and gather the answers
    /// as they come, in any order; each request's result is at its position. A connection
    /// error fails the whole batch.
    pub(crate) fn pipeline(
        &mut self,
        requests: &[&PipelinedRequest<'_>],
    ) -> Result<Vec<Result<Frame>>> {
        let result = self.exchange_pipeline(requests);
        self.note(&result);
        result
    }

    fn exchange_pipeline(
        &mut self,
        requests: &[&PipelinedRequest<'_>],
    ) -> Result<Vec<Result<Frame>>> {
        let first_id = self.next_request_id;
        self.next_request_id += requests.len() as u64;
        let in_flight_max = (self.limits.requests_in_flight_max as usize).max(1);
        // Each request the writer sends takes a credit; each answer the reader completes gives
        // one back, so no more than `in_flight_max` are unanswered at once.
        let (credits, credits_back) = mpsc::sync_channel::<()>(in_flight_max);
        let writer_stream = self.stream.get_ref().try_clone()?;
        let limits = self.limits;
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || -> io::Result<()> {
                let mut writer = BufWriter::new(writer_stream);
                for (index, request) in requests.iter().enumerate() {
                    if let Err(mpsc::TrySendError::Full(())) = credits.try_send(()) {
                        // Out of credits: what is buffered must reach the server, or its
                        // answers, and so our credits, never come.
                        writer.flush()?;
                        if credits.send(()).is_err() {
                            return Ok(());
                        }
                    }
                    let request_id = first_id + index as u64;
                    for frame in request_frames(
                        request.opcode,
                        request_id,
                        &request.extension,
                        request.payload,
                        &limits,
                        FrameFlags::empty(),
                    ) {
                        writer.write_all(&frame.head)?;
                        writer.write_all(&request.payload[frame.payload])?;
                    }
                }
                writer.flush()
            });
            let answers = self.gather_pipeline(first_id, requests.len(), &credits_back);
            if answers.is_err() {
                // The writer may wait for a credit or for room in the socket: dropping the
                // credits and shutting the socket down make both fail at once.
                drop(credits_back);
                let _ = self.stream.get_ref().shutdown(std::net::Shutdown::Both);
            }
            let written = writer.join().expect("the pipeline writer does not panic");
            let answers = answers?;
            written?;
            Ok(answers)
        })
    }

    fn gather_pipeline(
        &mut self,
        first_id: u64,
        count: usize,
        credits_back: &mpsc::Receiver<()>,
    ) -> Result<Vec<Result<Frame>>> {
        let mut results: Vec<Option<Result<Frame>>> = (0..count).map(|_| None).collect();
        let mut streaming: HashMap<u64, Frame> = HashMap::new();
        let mut answered = 0;
        while answered < count {
            let frame = self.receive()?;
            let request_id = frame.header.request_id;
            let index = request_id
                .checked_sub(first_id)
                .filter(|&index| index < count as u64)
                .ok_or_else(|| malformed("an answer to a request not sent"))?
                as usize;
            let frame = match streaming.remove(&request_id) {
                // A later frame with an error ends the answer: its reason is the answer.
                Some(_) if frame.header.status != 0 => frame,
                Some(mut gathered) => {
                    gathered.payload.extend_from_slice(&frame.payload);
                    gathered.header.flags = frame.header.flags;
                    gathered
                }
                None => frame,
            };
            if frame.header.flags.contains(FrameFlags::MORE) {
                streaming.insert(request_id, frame);
                continue;
            }
            if results[index].is_some() {
                return Err(malformed("a request answered twice"));
            }
            results[index] = Some(if frame.header.status == 0 {
                Ok(frame)
            } else {
                Err(ClientError::from_answer(
                    frame.header.status,
                    &frame.payload,
                ))
            });
            answered += 1;
            // The writer may have finished; a credit nobody waits for is fine to lose.
            let _ = credits_back.try_recv();
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every request was answered"))
            .collect())
    }

    fn receive_header(&mut self) -> Result<FrameHeader> {
        let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
        self.stream.read_exact(&mut header_bytes)?;
        Ok(FrameHeader::decode(&header_bytes, &self.limits)?)
    }

    fn receive_extension(&mut self, header: &FrameHeader) -> Result<Vec<u8>> {
        let mut extension = vec![0; header.extension_len as usize];
        self.stream.read_exact(&mut extension)?;
        header.check_extension(&extension)?;
        Ok(extension)
    }

    fn receive_payload(&mut self, header: &FrameHeader) -> Result<Vec<u8>> {
        let mut payload = vec![0; header.payload_len as usize];
        self.stream.read_exact(&mut payload)?;
        header.check_payload_crc(hydrant_proto::payload_crc(&payload))?;
        Ok(payload)
    }

    fn receive(&mut self) -> Result<Frame> {
        let header = self.receive_header()?;
        let extension = self.receive_extension(&header)?;
        let payload = self.receive_payload(&header)?;
        Ok(Frame {
            header,
            extension,
            payload,
        })
    }
}

/// Put one BATCH_GET answer frame at its item's place.
pub(crate) fn place_batch_item(results: &mut [Option<ItemResult>], answer: Frame) -> Result<()> {
    let Ok(item) = BatchItem::decode(&answer.extension) else {
        // The batch as a whole was refused.
        return Err(ClientError::from_answer(
            answer.header.status,
            &answer.payload,
        ));
    };
    let slot = results
        .get_mut(item.item as usize)
        .ok_or_else(|| malformed("an answer for an item not asked"))?;
    *slot = Some(match (answer.header.status, item.info) {
        (0, Some(info)) => Ok((info, answer.payload)),
        (status, _) => Err(ClientError::from_answer(status, &answer.payload)),
    });
    Ok(())
}

fn expect_request(header: &FrameHeader, request_id: u64) -> Result<()> {
    if header.request_id != request_id {
        return Err(malformed("an answer to another request"));
    }
    Ok(())
}

pub(crate) fn malformed(reason: &'static str) -> ClientError {
    ClientError::Protocol(ProtoError::Malformed(reason))
}
