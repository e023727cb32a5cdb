//! A blocking Redis connection speaking RESP2: the second small-value peer of the key-value
//! workloads (`--peer-redis`). One request at a time, like the blocking `hydrant-client` and
//! the memcached driver.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Redis accepts any bytes as a key up to 512 MB; this bound keeps requests small and equal to
/// memcached's, so that one key set serves both peers.
pub const KEY_BYTES_MAX: usize = 250;

/// The largest bulk string we accept in an answer (Redis' own limit on a value).
const BULK_BYTES_MAX: usize = 512 << 20;

pub struct RedisConnection {
    stream: BufReader<TcpStream>,
    line: String,
    value: Vec<u8>,
    request: Vec<u8>,
}

fn protocol_error(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl RedisConnection {
    pub fn connect(address: &str, timeout: Duration) -> io::Result<RedisConnection> {
        let resolved = std::net::ToSocketAddrs::to_socket_addrs(address)?
            .next()
            .ok_or_else(|| protocol_error(format!("{address} resolves to no address")))?;
        let stream = TcpStream::connect_timeout(&resolved, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(RedisConnection {
            stream: BufReader::new(stream),
            line: String::new(),
            value: Vec::new(),
            request: Vec::new(),
        })
    }

    /// Send one command as a RESP array of bulk strings.
    fn send(&mut self, arguments: &[&[u8]]) -> io::Result<()> {
        self.request.clear();
        self.request
            .extend_from_slice(format!("*{}\r\n", arguments.len()).as_bytes());
        for argument in arguments {
            self.request
                .extend_from_slice(format!("${}\r\n", argument.len()).as_bytes());
            self.request.extend_from_slice(argument);
            self.request.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&self.request)
    }

    fn read_line(&mut self) -> io::Result<&str> {
        self.line.clear();
        if self.stream.read_line(&mut self.line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(self.line.trim_end_matches("\r\n"))
    }

    /// The value of `key`, or `None` when Redis does not hold it.
    pub fn get(&mut self, key: &str) -> io::Result<Option<&[u8]>> {
        assert!(key.len() <= KEY_BYTES_MAX, "key over {KEY_BYTES_MAX} bytes");
        self.send(&[b"GET", key.as_bytes()])?;
        let header = self.read_line()?.to_string();
        let Some(length) = header.strip_prefix('$') else {
            return Err(protocol_error(format!(
                "Redis answered {header:?} to a GET"
            )));
        };
        if length == "-1" {
            return Ok(None);
        }
        let bytes = length
            .parse::<usize>()
            .ok()
            .filter(|&bytes| bytes <= BULK_BYTES_MAX)
            .ok_or_else(|| protocol_error(format!("Redis answered {header:?} to a GET")))?;
        self.value.resize(bytes + 2, 0);
        self.stream.read_exact(&mut self.value)?;
        if !self.value.ends_with(b"\r\n") {
            return Err(protocol_error("a bulk string not followed by CRLF".into()));
        }
        Ok(Some(&self.value[..bytes]))
    }

    /// Store `value` under `key`, with no expiry.
    pub fn set(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        assert!(key.len() <= KEY_BYTES_MAX, "key over {KEY_BYTES_MAX} bytes");
        self.send(&[b"SET", key.as_bytes(), value])?;
        let answer = self.read_line()?;
        if answer != "+OK" {
            return Err(protocol_error(format!(
                "Redis answered {answer:?} to a SET"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that reads each command (a RESP array) and answers the next canned answer; the
    /// commands it read come back through the join handle.
    fn canned(answers: Vec<&'static [u8]>) -> (String, std::thread::JoinHandle<Vec<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            let mut commands = Vec::new();
            for answer in answers {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let count: usize = line.trim_end().strip_prefix('*').unwrap().parse().unwrap();
                let mut command = Vec::new();
                for _ in 0..count {
                    line.clear();
                    reader.read_line(&mut line).unwrap();
                    let bytes: usize = line.trim_end().strip_prefix('$').unwrap().parse().unwrap();
                    let mut argument = vec![0; bytes + 2];
                    reader.read_exact(&mut argument).unwrap();
                    argument.truncate(bytes);
                    command.push(String::from_utf8_lossy(&argument).into_owned());
                }
                commands.push(command);
                writer.write_all(answer).unwrap();
            }
            commands
        });
        (address, handle)
    }

    #[test]
    fn commands_are_framed_and_answers_parsed() {
        let (address, server) = canned(vec![
            b"+OK\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"$-1\r\n",
            b"-ERR wrong\r\n",
        ]);
        let mut connection = RedisConnection::connect(&address, Duration::from_secs(5)).unwrap();
        connection.set("k1", b"he\r\no").unwrap();
        assert_eq!(connection.get("k1").unwrap(), Some(&b"he\r\no"[..]));
        assert_eq!(connection.get("k2").unwrap(), None);
        let error = connection.get("k3").unwrap_err();
        assert!(error.to_string().contains("-ERR wrong"), "{error}");
        let commands = server.join().unwrap();
        assert_eq!(commands[0], ["SET", "k1", "he\r\no"]);
        assert_eq!(commands[1], ["GET", "k1"]);
        assert_eq!(commands[2], ["GET", "k2"]);
    }

    #[test]
    fn a_truncated_or_oversized_answer_is_an_error() {
        let (address, _server) = canned(vec![b"$600000000\r\n"]);
        let mut connection = RedisConnection::connect(&address, Duration::from_secs(5)).unwrap();
        let error = connection.get("k").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        // The server sends 2 of 5 bytes and closes the connection.
        let (address, _server) = canned(vec![b"$5\r\nab"]);
        let mut connection = RedisConnection::connect(&address, Duration::from_secs(5)).unwrap();
        let error = connection.get("k").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");
    }
}
