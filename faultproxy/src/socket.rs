//! Ways to end a client connection: an abrupt reset, and a lingering close that lets an error
//! answer reach a client that is still sending.

use std::io::{self, Read};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// How long a lingering close keeps reading what the client still sends.
pub const LINGERING_CLOSE_MS: u64 = 1_000;

/// The most bytes a lingering close reads and discards.
pub const LINGERING_CLOSE_BYTES_MAX: u64 = 1 << 20;

/// Closes `stream` with a TCP reset instead of an orderly FIN, so that the client sees
/// ECONNRESET. The caller must hold the last descriptor of the socket: the reset is sent when
/// the last one closes.
pub fn reset(stream: TcpStream) {
    // A failure here leaves an orderly close, which the client also sees as an error mid-request.
    let _ = set_linger_zero(&stream);
    drop(stream);
}

fn set_linger_zero(stream: &TcpStream) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &linger)?;
    Ok(())
}

/// Closes after an answer sent before the request was read in full (431, 400, an early error):
/// closing with unread bytes would make the kernel send a reset, which can destroy the answer
/// before the client reads it. So the sending side is shut and the rest read and discarded, for
/// a bounded time and size.
pub fn close_lingering(mut stream: TcpStream) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_millis(LINGERING_CLOSE_MS);
    let mut discarded = 0;
    let mut buffer = [0u8; 16 * 1024];
    while discarded < LINGERING_CLOSE_BYTES_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(count) => discarded += count as u64,
        }
    }
}
