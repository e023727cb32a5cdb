//! One client connection: reads requests one after another (keep-alive), and for each either
//! answers it from the control endpoint, injects a fault, or forwards it over the connection's
//! own upstream connection and relays the response.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::Duration;

use crate::config::{DelayRange, FaultKind, Settings};
use crate::control;
use crate::http::{BodyCopy, CopyEnd, Framing, HeadError, Inbound, RequestHead, ResponseHead};
use crate::server::Shared;
use crate::socket;
use crate::stats::{Fault, Method};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// Requests whose path starts with this are answered by the proxy itself.
pub const CONTROL_PREFIX: &str = "/__proxy/";

/// How long connecting to the upstream server may take.
pub const UPSTREAM_CONNECT_TIMEOUT_MS: u64 = 5_000;

/// How long the upstream server may stay silent while a response is awaited or relayed. Long,
/// because a server may take a while to answer a large upload, but bounded, so that a hung
/// server does not hold a thread for ever.
pub const UPSTREAM_IDLE_TIMEOUT_MS: u64 = 300_000;

/// How long to wait for `100 Continue` before sending the body anyway, as curl does (RFC 9110,
/// section 10.1.1: a client need not wait indefinitely).
pub const EXPECT_CONTINUE_WAIT_MS: u64 = 1_000;

/// Where a mid-body reset cuts a body of unknown length (chunked, or until close): after the
/// first payload byte, so that the client certainly sees a truncated body.
pub const MID_BODY_UNKNOWN_LENGTH_CUT_BYTES: u64 = 1;

const SLOW_DOWN_BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

const INTERNAL_ERROR_BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message></Error>";

/// How a connection ends.
enum Ending {
    Close,
    /// An answer went out before the request was read in full; see `socket::close_lingering`.
    CloseLingering,
    Reset,
}

/// What follows a request.
enum Next {
    KeepAlive,
    End(Ending),
}

/// Serves connection `id` until it ends, then closes it as its last request asked.
pub fn run(shared: &Shared, id: u64, client: TcpStream) {
    // Heads and bodies go out in separate writes; without NODELAY, Nagle's algorithm would hold
    // the second write until the peer's delayed acknowledgement, some 40 ms.
    let _ = client.set_nodelay(true);
    let mut session = Session {
        shared,
        id,
        client: Inbound::new(client),
        upstream: None,
        random: stream_of(shared.seed, id),
    };
    let ending = session.serve();
    drop(session.upstream.take());
    shared.connections.remove(id);
    let client = session.client.into_stream();
    match ending {
        Ending::Close => drop(client),
        Ending::CloseLingering => socket::close_lingering(client),
        Ending::Reset => socket::reset(client),
    }
}

/// The generator of connection `stream` of a run seeded with `seed`.
fn stream_of(seed: u64, stream: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

struct Session<'a> {
    shared: &'a Shared,
    id: u64,
    client: Inbound,
    /// Kept between requests while the upstream server keeps it alive.
    upstream: Option<Inbound>,
    /// This connection's draws (faults, delays, cut points): seeded from the run's seed and
    /// the connection's number, so a connection's draws do not depend on how threads interleave.
    random: Xoshiro256PlusPlus,
}

impl Session<'_> {
    fn serve(&mut self) -> Ending {
        loop {
            let head = match self.client.read_head() {
                Ok(Some(head)) => head,
                Ok(None) => return Ending::Close,
                Err(HeadError::TooLarge) => {
                    let _ = self.answer_simple(431, "Request Header Fields Too Large", true);
                    return Ending::CloseLingering;
                }
                Err(HeadError::Truncated | HeadError::Io(_)) => return Ending::Close,
            };
            let request = match RequestHead::parse(head) {
                Ok(request) => request,
                Err(_) => {
                    let _ = self.answer_simple(400, "Bad Request", true);
                    return Ending::CloseLingering;
                }
            };
            let next = if request.target.starts_with(CONTROL_PREFIX) {
                self.answer_control(&request)
            } else {
                self.proxy(&request)
            };
            match next {
                Ok(Next::KeepAlive) => continue,
                Ok(Next::End(ending)) => return ending,
                Err(_) => return Ending::Close,
            }
        }
    }

    fn answer_control(&mut self, request: &RequestHead) -> io::Result<Next> {
        if request.expect_continue {
            write_interim_continue(self.client.stream())?;
        }
        BodyCopy::discard().run(request.framing, &mut self.client, &mut io::sink())?;
        let answer = control::answer(
            self.shared,
            &request.method,
            request.path(),
            request.query(),
        );
        let close = !request.keep_alive;
        let response = render_response(
            answer.status,
            answer.reason,
            "application/json",
            answer.body.as_bytes(),
            true,
            close,
        );
        self.client.stream().write_all(&response)?;
        Ok(keep_alive_unless(close))
    }

    fn proxy(&mut self, request: &RequestHead) -> io::Result<Next> {
        let method = Method::from_token(&request.method);
        self.shared.stats.request_received(method, request.path());
        let settings = self.shared.settings();
        self.sleep_delay(settings.delay);
        match self.choose_fault(&settings, request) {
            None => self.forward(request, method, false),
            Some(Fault::ResetMidBody) => self.forward(request, method, true),
            Some(Fault::ResetBeforeForwarding) => {
                self.shared
                    .stats
                    .faulted(method, Fault::ResetBeforeForwarding);
                Ok(Next::End(Ending::Reset))
            }
            Some(fault @ Fault::SlowDown) => {
                self.answer_fault(request, method, fault, 503, "Slow Down", SLOW_DOWN_BODY)
            }
            Some(fault @ Fault::InternalError) => self.answer_fault(
                request,
                method,
                fault,
                500,
                "Internal Server Error",
                INTERNAL_ERROR_BODY,
            ),
        }
    }

    fn sleep_delay(&mut self, delay: DelayRange) {
        if delay.is_none() {
            return;
        }
        let delay_ms = self.random.random_range(delay.min_ms..=delay.max_ms);
        thread::sleep(Duration::from_millis(delay_ms));
    }

    /// Draws whether this request is faulted and how. The rate is drawn for every request, even
    /// at rate 0, so that a connection's sequence of draws does not depend on runtime changes to
    /// the rate; a fault drawn once the limit (`fault_limit`) is spent is not injected.
    fn choose_fault(&mut self, settings: &Settings, request: &RequestHead) -> Option<Fault> {
        let draw: f64 = self.random.random();
        if draw >= settings.fault_rate {
            return None;
        }
        if !settings.fault_match.is_empty()
            && !format!("{} {}", request.method, request.target).contains(&settings.fault_match)
        {
            return None;
        }
        let kind = settings.faults[self.random.random_range(0..settings.faults.len())];
        let fault = match kind {
            FaultKind::SlowDown => Fault::SlowDown,
            FaultKind::InternalError => Fault::InternalError,
            FaultKind::ResetBeforeForwarding => Fault::ResetBeforeForwarding,
            FaultKind::ResetMidBody => Fault::ResetMidBody,
            FaultKind::Reset => match self.random.random_bool(0.5) {
                true => Fault::ResetBeforeForwarding,
                false => Fault::ResetMidBody,
            },
        };
        // Taken from the limit after every draw, so that a limit leaves the draws as they were.
        self.shared.take_fault().then_some(fault)
    }

    /// Answers an S3 error without forwarding. The request body is read and dropped first so
    /// the connection stays usable, except when the client waits for `100 Continue`: then it may
    /// or may not send the body, and only closing leaves the connection unambiguous.
    fn answer_fault(
        &mut self,
        request: &RequestHead,
        method: Method,
        fault: Fault,
        status: u16,
        reason: &str,
        body: &str,
    ) -> io::Result<Next> {
        self.shared.stats.faulted(method, fault);
        let close = !request.keep_alive || request.expect_continue;
        if !request.expect_continue {
            BodyCopy::discard().run(request.framing, &mut self.client, &mut io::sink())?;
        }
        let response = render_response(
            status,
            reason,
            "application/xml",
            body.as_bytes(),
            !request.is_head(),
            close,
        );
        self.client.stream().write_all(&response)?;
        match (close, request.expect_continue) {
            (_, true) => Ok(Next::End(Ending::CloseLingering)),
            (true, false) => Ok(Next::End(Ending::Close)),
            (false, false) => Ok(Next::KeepAlive),
        }
    }

    /// Forwards a request and relays its response; with `reset_mid_body`, resets the client
    /// connection part way through the response body instead of finishing it.
    fn forward(
        &mut self,
        request: &RequestHead,
        method: Method,
        reset_mid_body: bool,
    ) -> io::Result<Next> {
        let (mut upstream, response, body_state_unknown) = match self.exchange(request) {
            Ok(exchanged) => exchanged,
            Err(RelayError::Client(error)) => return Err(error),
            Err(RelayError::Upstream | RelayError::UpstreamClosedFirst) => {
                return self.answer_bad_gateway(method)
            }
        };
        let framing = response.framing(request.is_head());
        if reset_mid_body {
            self.shared.stats.faulted(method, Fault::ResetMidBody);
            self.relay_cut_response(&response, framing, &mut upstream)?;
            return Ok(Next::End(Ending::Reset));
        }
        self.shared.stats.forwarded(method);
        self.client.stream().write_all(&response.bytes)?;
        let stats = &self.shared.stats;
        let copy = BodyCopy {
            throttle: Some(&self.shared.throttle),
            record: &|bytes| stats.response_body_bytes(bytes),
            cut_after_bytes: None,
        };
        copy.run(framing, &mut upstream, &mut self.client.stream())?;
        let upstream_reusable = response.keep_alive && framing != Framing::UntilClose;
        if upstream_reusable {
            self.upstream = Some(upstream);
        }
        if body_state_unknown {
            return Ok(Next::End(Ending::CloseLingering));
        }
        // A response that closes its connection tells the client so in its own header fields,
        // which are relayed unchanged, so the client connection ends with it.
        Ok(keep_alive_unless(!request.keep_alive || !upstream_reusable))
    }

    /// Sends the request upstream and reads the final response head. A kept connection that the
    /// server closed while it was idle fails before any byte of a response; a request without a
    /// body is then sent once more on a new connection, as HTTP clients do (RFC 9112, section
    /// 9.3.1), since the server cannot have acted on it.
    fn exchange(
        &mut self,
        request: &RequestHead,
    ) -> Result<(Inbound, ResponseHead, bool), RelayError> {
        let retryable = request.framing == Framing::Empty && !request.expect_continue;
        let (mut upstream, reused) = self.take_upstream().map_err(|_| RelayError::Upstream)?;
        match self.send_request(request, &mut upstream) {
            Err(RelayError::UpstreamClosedFirst) if reused && retryable => {}
            result => return result.map(|(response, unknown)| (upstream, response, unknown)),
        }
        let mut upstream = self.connect_upstream().map_err(|_| RelayError::Upstream)?;
        let (response, unknown) = self.send_request(request, &mut upstream)?;
        Ok((upstream, response, unknown))
    }

    fn send_request(
        &mut self,
        request: &RequestHead,
        upstream: &mut Inbound,
    ) -> Result<(ResponseHead, bool), RelayError> {
        upstream
            .stream()
            .write_all(&request.bytes)
            .map_err(|_| RelayError::UpstreamClosedFirst)?;
        self.relay_request(request, upstream)
    }

    /// Sends the request body (after `100 Continue` when the client asked for it) and reads the
    /// final response head, relaying interim responses. Also says whether the client's body was
    /// left unsent, which happens when the server answers before `100 Continue`.
    fn relay_request(
        &mut self,
        request: &RequestHead,
        upstream: &mut Inbound,
    ) -> Result<(ResponseHead, bool), RelayError> {
        if request.expect_continue {
            match self.wait_for_continue(upstream)? {
                Some(early) if !early.is_interim() => return Ok((early, true)),
                Some(interim) => self.client.stream().write_all(&interim.bytes)?,
                None => {}
            }
        }
        let stats = &self.shared.stats;
        let copy = BodyCopy {
            throttle: Some(&self.shared.throttle),
            record: &|bytes| stats.request_body_bytes(bytes),
            cut_after_bytes: None,
        };
        copy.run(request.framing, &mut self.client, &mut upstream.stream())
            .map_err(RelayError::Client)?;
        Ok((self.read_final_response(upstream)?, false))
    }

    /// Waits up to `EXPECT_CONTINUE_WAIT_MS` for the server's first answer to a request that
    /// expects `100 Continue`; `None` if it stayed silent.
    fn wait_for_continue(
        &mut self,
        upstream: &mut Inbound,
    ) -> Result<Option<ResponseHead>, RelayError> {
        let expect_wait = Duration::from_millis(EXPECT_CONTINUE_WAIT_MS);
        let idle = Duration::from_millis(UPSTREAM_IDLE_TIMEOUT_MS);
        upstream
            .stream()
            .set_read_timeout(Some(expect_wait))
            .map_err(|_| RelayError::Upstream)?;
        let waited = upstream.wait_for_data();
        upstream
            .stream()
            .set_read_timeout(Some(idle))
            .map_err(|_| RelayError::Upstream)?;
        match waited {
            Ok(true) => Ok(Some(read_response_head(upstream)?)),
            Ok(false) => Ok(None),
            Err(_) => Err(RelayError::Upstream),
        }
    }

    /// Reads response heads until a final one, relaying interim ones (such as `100 Continue`
    /// sent although not asked for, or `103 Early Hints`) to the client.
    fn read_final_response(&mut self, upstream: &mut Inbound) -> Result<ResponseHead, RelayError> {
        loop {
            let response = read_response_head(upstream)?;
            if !response.is_interim() {
                return Ok(response);
            }
            // 101 switches the connection to another protocol, which this proxy cannot relay.
            if response.status == 101 {
                return Err(RelayError::Upstream);
            }
            self.client.stream().write_all(&response.bytes)?;
        }
    }

    /// Relays the response head and part of the body, for a mid-body reset. A response without
    /// a body of at least two bytes cannot be cut inside it, so the reset then comes before the
    /// head: the server acted on the request, and the client never hears back.
    fn relay_cut_response(
        &mut self,
        response: &ResponseHead,
        framing: Framing,
        upstream: &mut Inbound,
    ) -> io::Result<CopyEnd> {
        let cut_after_bytes = match framing {
            Framing::Length(length) if length >= 2 => self.random.random_range(1..length),
            Framing::Chunked | Framing::UntilClose => MID_BODY_UNKNOWN_LENGTH_CUT_BYTES,
            Framing::Empty | Framing::Length(_) => return Ok(CopyEnd::Cut),
        };
        self.client.stream().write_all(&response.bytes)?;
        let stats = &self.shared.stats;
        let copy = BodyCopy {
            throttle: Some(&self.shared.throttle),
            record: &|bytes| stats.response_body_bytes(bytes),
            cut_after_bytes: Some(cut_after_bytes),
        };
        copy.run(framing, upstream, &mut self.client.stream())
    }

    /// The connection's upstream connection, and whether it was kept from an earlier request:
    /// the kept one if the server has not closed it, else a new one.
    fn take_upstream(&mut self) -> io::Result<(Inbound, bool)> {
        if let Some(kept) = self.upstream.take() {
            if is_reusable(&kept) {
                return Ok((kept, true));
            }
        }
        Ok((self.connect_upstream()?, false))
    }

    fn connect_upstream(&mut self) -> io::Result<Inbound> {
        let stream = connect(&self.shared.upstream)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_millis(UPSTREAM_IDLE_TIMEOUT_MS)))?;
        self.shared
            .connections
            .set_upstream(self.id, stream.try_clone()?);
        if self.shared.is_shutting_down() {
            return Err(io::ErrorKind::ConnectionAborted.into());
        }
        Ok(Inbound::new(stream))
    }

    /// Answers 502 when the upstream server cannot be reached or broke off before its response
    /// head; the request body may be unread, so the connection closes.
    fn answer_bad_gateway(&mut self, method: Method) -> io::Result<Next> {
        self.shared.stats.failed(method);
        self.answer_simple(502, "Bad Gateway", true)?;
        Ok(Next::End(Ending::CloseLingering))
    }

    fn answer_simple(&mut self, status: u16, reason: &str, close: bool) -> io::Result<()> {
        let response =
            render_response(status, reason, "text/plain", reason.as_bytes(), true, close);
        self.client.stream().write_all(&response)
    }
}

/// Why relaying a request failed: the client side ends the connection, the upstream side is
/// answered with 502.
enum RelayError {
    Client(io::Error),
    Upstream,
    /// The upstream server closed the connection before any byte of a response.
    UpstreamClosedFirst,
}

impl From<io::Error> for RelayError {
    /// Writes to the client are the only plain `io::Error`s in relaying.
    fn from(error: io::Error) -> Self {
        RelayError::Client(error)
    }
}

fn read_response_head(upstream: &mut Inbound) -> Result<ResponseHead, RelayError> {
    match upstream.read_head() {
        Ok(Some(head)) => ResponseHead::parse(head).map_err(|_| RelayError::Upstream),
        Ok(None) | Err(HeadError::Io(io::ErrorKind::ConnectionReset)) => {
            Err(RelayError::UpstreamClosedFirst)
        }
        Err(_) => Err(RelayError::Upstream),
    }
}

fn keep_alive_unless(close: bool) -> Next {
    match close {
        true => Next::End(Ending::Close),
        false => Next::KeepAlive,
    }
}

fn write_interim_continue(mut client: &TcpStream) -> io::Result<()> {
    client.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
}

/// Whether a kept upstream connection can carry another request: nothing unread, and the server
/// has not closed it while it was idle (a peek that would block means it is open and quiet).
fn is_reusable(upstream: &Inbound) -> bool {
    if upstream.buffered_bytes() > 0 {
        return false;
    }
    let stream = upstream.stream();
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut probe = [0u8; 1];
    let open_and_quiet = matches!(
        stream.peek(&mut probe),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock
    );
    stream.set_nonblocking(false).is_ok() && open_and_quiet
}

fn connect(upstream: &str) -> io::Result<TcpStream> {
    let timeout = Duration::from_millis(UPSTREAM_CONNECT_TIMEOUT_MS);
    let mut last_error = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{upstream} resolves to no address"),
    );
    for address in upstream.to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(stream) => return Ok(stream),
            Err(error) => last_error = error,
        }
    }
    Err(last_error)
}

/// A complete response with a `Content-Length` body; `include_body` is false for HEAD, whose
/// response states the length without the body.
fn render_response(
    status: u16,
    reason: &str,
    content_type: &str,
    body: &[u8],
    include_body: bool,
    close: bool,
) -> Vec<u8> {
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    if close {
        response.extend_from_slice(b"Connection: close\r\n");
    }
    response.extend_from_slice(b"\r\n");
    if include_body {
        response.extend_from_slice(body);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_draws_the_same_sequence_for_the_same_seed_and_another_for_another_stream() {
        let draws = |seed, stream| {
            let mut random = stream_of(seed, stream);
            (0..8).map(|_| random.random::<u64>()).collect::<Vec<_>>()
        };
        assert_eq!(draws(7, 0), draws(7, 0));
        assert_ne!(draws(7, 0), draws(7, 1));
        assert_ne!(draws(7, 0), draws(8, 0));
    }
}
