//! A blocking memcached connection speaking the text protocol: the peer hydrant's GETs and PUTs
//! are measured against (`hydrant-bench server`, and the key-value workloads' `--peer-memcached`).
//! One request at a time, like the blocking `hydrant-client`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// memcached refuses longer keys (and keys with spaces or control characters).
pub const KEY_BYTES_MAX: usize = 250;

pub struct MemcachedConnection {
    stream: BufReader<TcpStream>,
    line: String,
    value: Vec<u8>,
}

/// Whether memcached accepts `key` as a key.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= KEY_BYTES_MAX
        && key.bytes().all(|byte| byte > b' ' && byte != 0x7f)
}

fn protocol_error(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl MemcachedConnection {
    pub fn connect(address: &str, timeout: Duration) -> io::Result<MemcachedConnection> {
        let stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(MemcachedConnection {
            stream: BufReader::new(stream),
            line: String::new(),
            value: Vec::new(),
        })
    }

    fn read_line(&mut self) -> io::Result<&str> {
        self.line.clear();
        if self.stream.read_line(&mut self.line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(self.line.trim_end_matches("\r\n"))
    }

    /// The value of `key`, or `None` when memcached does not hold it.
    pub fn get(&mut self, key: &str) -> io::Result<Option<&[u8]>> {
        assert!(valid_key(key), "not a memcached key: {key:?}");
        self.stream
            .get_mut()
            .write_all(format!("get {key}\r\n").as_bytes())?;
        let header = self.read_line()?;
        if header == "END" {
            return Ok(None);
        }
        // VALUE <key> <flags> <bytes>
        let fields: Vec<&str> = header.split(' ').collect();
        let value_bytes = match fields.as_slice() {
            ["VALUE", answered, _flags, bytes] if *answered == key => bytes.parse::<usize>().ok(),
            _ => None,
        }
        .ok_or_else(|| protocol_error(format!("memcached answered {header:?} to a get")))?;
        self.value.resize(value_bytes + 2, 0);
        self.stream.read_exact(&mut self.value)?;
        if !self.value.ends_with(b"\r\n") {
            return Err(protocol_error("a value not followed by CRLF".into()));
        }
        let end = self.read_line()?;
        if end != "END" {
            return Err(protocol_error(format!(
                "memcached ended a get with {end:?}"
            )));
        }
        Ok(Some(&self.value[..value_bytes]))
    }

    /// Store `value` under `key`, with no flags and no expiry.
    pub fn set(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        assert!(valid_key(key), "not a memcached key: {key:?}");
        let stream = self.stream.get_mut();
        let mut request = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        stream.write_all(&request)?;
        let answer = self.read_line()?;
        if answer != "STORED" {
            return Err(protocol_error(format!(
                "memcached answered {answer:?} to a set"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that reads each request and answers the next canned answer.
    fn canned(answers: Vec<&'static [u8]>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            for answer in answers {
                let mut request = String::new();
                reader.read_line(&mut request).unwrap();
                if request.starts_with("set ") {
                    let bytes: usize = request
                        .trim_end()
                        .rsplit(' ')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap();
                    let mut value = vec![0; bytes + 2];
                    reader.read_exact(&mut value).unwrap();
                }
                writer.write_all(answer).unwrap();
            }
        });
        address
    }

    #[test]
    fn gets_sets_and_misses_are_parsed() {
        let address = canned(vec![
            b"STORED\r\n",
            b"VALUE k1 0 5\r\nhello\r\nEND\r\n",
            b"END\r\n",
            b"VALUE k1 0 3\r\nabc\r\nEN",
        ]);
        let mut connection =
            MemcachedConnection::connect(&address, Duration::from_secs(5)).unwrap();
        connection.set("k1", b"hello").unwrap();
        assert_eq!(connection.get("k1").unwrap(), Some(&b"hello"[..]));
        assert_eq!(connection.get("k2").unwrap(), None);
        // A truncated answer is an error, not a short value.
        assert!(connection.get("k1").is_err());
    }

    #[test]
    fn errors_and_foreign_answers_are_refused() {
        let address = canned(vec![
            b"SERVER_ERROR object too large for cache\r\n",
            b"VALUE other 0 1\r\nx\r\nEND\r\n",
        ]);
        let mut connection =
            MemcachedConnection::connect(&address, Duration::from_secs(5)).unwrap();
        let error = connection.set("k", &[0; 10]).unwrap_err();
        assert!(error.to_string().contains("SERVER_ERROR"), "{error}");
        assert!(connection.get("k").is_err());
    }

    #[test]
    fn keys_memcached_refuses_are_recognised() {
        assert!(valid_key("kv/000000000001"));
        assert!(!valid_key(""));
        assert!(!valid_key("has space"));
        assert!(!valid_key("line\nbreak"));
        assert!(!valid_key(&"k".repeat(KEY_BYTES_MAX + 1)));
    }
}
