//! The little encoding of extensions: fixed-width little-endian integers and length-prefixed
//! byte strings. A reader never reads past its input and never allocates more than it was given.

use crate::ProtoError;

/// Bytes a writer has room for before it grows: most extensions (a name and a few numbers) fit.
const WRITER_BYTES_INITIAL: usize = 128;

/// Builds an extension.
pub struct Writer {
    bytes: Vec<u8>,
}

impl Default for Writer {
    fn default() -> Writer {
        Writer {
            bytes: Vec::with_capacity(WRITER_BYTES_INITIAL),
        }
    }
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    pub fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// A byte string of at most 65,535 bytes, prefixed by its u16 length.
    pub fn bytes16(&mut self, value: &[u8]) {
        let len = u16::try_from(value.len()).expect("a short string is at most 65535 bytes");
        self.u16(len);
        self.bytes.extend_from_slice(value);
    }

    pub fn fixed(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
    }

    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Reads an extension.
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, position: 0 }
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], ProtoError> {
        let available = self.bytes.len() - self.position;
        if count > available {
            return Err(ProtoError::Truncated {
                needed: count,
                available,
            });
        }
        let taken = &self.bytes[self.position..self.position + count];
        self.position += count;
        Ok(taken)
    }

    pub fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    pub fn bytes16(&mut self) -> Result<&'a [u8], ProtoError> {
        let len = self.u16()? as usize;
        self.take(len)
    }

    /// A UTF-8 string of at most `max` bytes.
    pub fn text16(&mut self, max: usize, what: &'static str) -> Result<&'a str, ProtoError> {
        let bytes = self.bytes16()?;
        if bytes.len() > max {
            return Err(ProtoError::Malformed(what));
        }
        std::str::from_utf8(bytes).map_err(|_| ProtoError::Malformed(what))
    }

    pub fn fixed<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// Pass over what is left (fields appended by a later server, which this reader does not
    /// know).
    pub fn skip_rest(&mut self) {
        self.position = self.bytes.len();
    }

    /// The whole input must have been read: trailing bytes are an error.
    pub fn finish(self) -> Result<(), ProtoError> {
        if self.position != self.bytes.len() {
            return Err(ProtoError::Malformed("trailing bytes after the extension"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_and_refuses_truncation() {
        let mut writer = Writer::new();
        writer.u8(7);
        writer.u64(u64::MAX - 1);
        writer.bytes16(b"datasets");
        let bytes = writer.finish();
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.u8(), Ok(7));
        assert_eq!(reader.u64(), Ok(u64::MAX - 1));
        assert_eq!(reader.text16(63, "bucket"), Ok("datasets"));
        reader.finish().unwrap();
        let mut short = Reader::new(&bytes[..bytes.len() - 1]);
        short.u8().unwrap();
        short.u64().unwrap();
        assert_eq!(
            short.bytes16(),
            Err(ProtoError::Truncated {
                needed: 8,
                available: 7
            })
        );
        let mut long_len = Reader::new(&[0xff, 0xff, 1]);
        assert!(matches!(
            long_len.bytes16(),
            Err(ProtoError::Truncated { .. })
        ));
    }
}
