//! Reading a region's log back: for recovery and for reclaim.

use crate::buf::IoBuf;
use crate::format::{EntryHeader, EntryKind, BLOCK_BYTES, ENTRY_FLAG_FROM_CLIENT};
use crate::rt::op::read_at;
use crate::{Error, Result};

use super::Store;

/// The log is read in windows of this many bytes.
const SCAN_WINDOW_BYTES: usize = 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScanMode {
    /// A region whose writes were all flushed before a newer region was opened: trust entry
    /// headers (data is verified when read), and skip over a damaged header to the next valid
    /// one.
    Sealed,
    /// The newest region, which may end in a torn write: verify every entry's data, and end
    /// the log at the first entry that does not check out, but for one written from a client's
    /// memory (`ENTRY_FLAG_FROM_CLIENT`) whose header checks out: that one is passed over (see
    /// `RegionScan::damaged`).
    Tail,
}

pub(crate) struct ScannedEntry {
    pub offset: u64,
    pub header: EntryHeader,
}

pub(crate) struct RegionScan {
    pub entries: Vec<ScannedEntry>,
    /// Where the valid log ends.
    pub end: u64,
    /// Headers that failed their checksum and were skipped (sealed regions only).
    pub damaged_headers: u64,
    /// The log ended in entries whose data did not check out (tail region only).
    pub torn: bool,
    /// Entries written from a client's memory, with a sound header and data that does not
    /// check out, followed by an entry that checks out (tail region only). Torn by a crash (a
    /// write never acknowledged) or changed by the client while the device read them (a write
    /// that completed, after which others may have been acknowledged): either way recovery
    /// must void their versions and keep what follows. Any other entry that does not check
    /// out is a torn write, after which nothing was acknowledged (an acknowledgement waits for
    /// every write placed before it): the log ends there, as it does after damaged entries with
    /// nothing sound after them.
    pub damaged: Vec<ScannedEntry>,
    /// The log ends in a seal entry: it was closed cleanly (or sealed by a recovery).
    pub ends_in_seal: bool,
}

struct Window {
    start: u64,
    buf: IoBuf,
}

impl Window {
    fn covers(&self, offset: u64, len: usize) -> bool {
        offset >= self.start && offset + len as u64 <= self.start + self.buf.len() as u64
    }

    fn slice(&self, offset: u64, len: usize) -> &[u8] {
        let start = (offset - self.start) as usize;
        &self.buf.as_slice()[start..start + len]
    }
}

impl Store {
    async fn read_window(&self, region: usize, offset: u64, buf: IoBuf) -> Result<Window> {
        let region_bytes = self.geometry.region_bytes;
        let len = (SCAN_WINDOW_BYTES as u64).min(region_bytes - offset) as usize;
        let (result, buf) = read_at(
            self.places[region].file,
            buf,
            self.places[region].offset + offset,
            len,
        )
        .await;
        let read =
            result.map_err(|error| Error::io(format!("cannot read region {region}"), error))?;
        let mut buf = buf;
        buf.set_len(read.min(len) / BLOCK_BYTES * BLOCK_BYTES);
        Ok(Window { start: offset, buf })
    }

    /// Read the entries of `region` written under `region_seq`.
    pub(crate) async fn scan_region(
        &self,
        region: usize,
        region_seq: u64,
        mode: ScanMode,
    ) -> Result<RegionScan> {
        let region_bytes = self.geometry.region_bytes;
        let crc_block = self.geometry.crc_block_bytes;
        let mut scan = RegionScan {
            entries: Vec::new(),
            end: BLOCK_BYTES as u64,
            damaged_headers: 0,
            torn: false,
            damaged: Vec::new(),
            ends_in_seal: false,
        };
        // Damaged entries not yet followed by a sound one (tail region only).
        let mut pending: Vec<ScannedEntry> = Vec::new();
        let mut window = Window {
            start: 0,
            buf: self.arena.allocate(SCAN_WINDOW_BYTES),
        };
        let mut offset = BLOCK_BYTES as u64;
        // True while skipping past a damaged header, when a zero block may be user data.
        let mut resyncing = false;
        while offset + BLOCK_BYTES as u64 <= region_bytes {
            if !window.covers(offset, BLOCK_BYTES) {
                window = self.read_window(region, offset, window.buf).await?;
                if !window.covers(offset, BLOCK_BYTES) {
                    break;
                }
            }
            let block = window.slice(offset, BLOCK_BYTES);
            if !resyncing && block.iter().all(|&byte| byte == 0) {
                break; // never written: the end of the log
            }
            let header = match EntryHeader::decode(block, crc_block) {
                Some(header)
                    if header.region_seq == region_seq
                        && offset + header.entry_bytes() <= region_bytes =>
                {
                    header
                }
                Some(header) if header.region_seq != region_seq => break, // left from an earlier use
                _ => match mode {
                    ScanMode::Tail => {
                        scan.torn = true;
                        break;
                    }
                    ScanMode::Sealed => {
                        scan.damaged_headers += u64::from(!resyncing);
                        resyncing = true;
                        offset += BLOCK_BYTES as u64;
                        continue;
                    }
                },
            };
            resyncing = false;
            if header.kind == EntryKind::Seal {
                scan.ends_in_seal = true;
                break;
            }
            if mode == ScanMode::Tail && header.kind == EntryKind::Chunk && header.data_bytes > 0 {
                let data_offset = offset + BLOCK_BYTES as u64;
                let data_len = header.data_bytes as usize;
                let intact = if window.covers(data_offset, data_len) {
                    data_intact(window.slice(data_offset, data_len), &header, crc_block)
                } else {
                    let buf = self.arena.allocate(data_len);
                    let (result, buf) = read_at(
                        self.places[region].file,
                        buf,
                        self.places[region].offset + data_offset,
                        crate::buf::align_up(data_len),
                    )
                    .await;
                    let read = result.map_err(|error| {
                        Error::io(format!("cannot read region {region}"), error)
                    })?;
                    read >= data_len && data_intact(&buf.as_slice()[..data_len], &header, crc_block)
                };
                if !intact && header.flags & ENTRY_FLAG_FROM_CLIENT == 0 {
                    scan.torn = true;
                    break;
                }
                if !intact {
                    let next = offset + header.entry_bytes();
                    pending.push(ScannedEntry { offset, header });
                    offset = next;
                    continue;
                }
            }
            let next = offset + header.entry_bytes();
            scan.damaged.append(&mut pending);
            scan.entries.push(ScannedEntry { offset, header });
            offset = next;
            scan.end = next;
        }
        scan.torn |= !pending.is_empty();
        Ok(scan)
    }
}

pub(super) fn data_intact(data: &[u8], header: &EntryHeader, crc_block_bytes: u32) -> bool {
    data.chunks(crc_block_bytes as usize)
        .zip(&header.data_crcs)
        .all(|(piece, crc)| hydrant_crc::crc32c(piece) == *crc)
}
