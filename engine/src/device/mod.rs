//! Devices: raw block devices or large regular files, always opened with O_DIRECT.
//!
//! Opening checks what can be checked without writing: the size (BLKGETSIZE64 or the file
//! length), the direct-I/O alignment (statx STATX_DIOALIGN, else the logical block size) and
//! that the size is a multiple of it. Whether the device holds a hydrant store is the engine's
//! question, answered from the superblocks read here with [`Device::read_at`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::buf::IoBuf;
use crate::format::BLOCK_BYTES;
use crate::{Error, ErrorKind, Result};

/// `_IOR(0x12, 114, size_t)`: the size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `_IO(0x12, 104)`: the logical sector size of a block device.
const BLKSSZGET: libc::c_ulong = 0x1268;

/// Where a device is and, for a file that does not exist yet, how large to create it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    pub path: PathBuf,
    /// Create the file with this many bytes if it does not exist. `None`: it must exist.
    pub create_bytes: Option<u64>,
}

impl DeviceConfig {
    pub fn new(path: impl Into<PathBuf>) -> DeviceConfig {
        DeviceConfig {
            path: path.into(),
            create_bytes: None,
        }
    }

    pub fn create(path: impl Into<PathBuf>, bytes: u64) -> DeviceConfig {
        DeviceConfig {
            path: path.into(),
            create_bytes: Some(bytes),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    File,
    BlockDevice,
}

/// An open device.
#[derive(Debug)]
pub struct Device {
    file: File,
    path: PathBuf,
    kind: DeviceKind,
    bytes: u64,
    /// The alignment of offsets and lengths for direct I/O on this device.
    direct_io_align: u32,
    /// True when this call created the file: it holds nothing yet.
    created: bool,
}

impl Device {
    /// Open (or create, when configured and absent) a device of at least `bytes_min` bytes.
    /// Nothing is written to an existing device.
    pub fn open(config: &DeviceConfig, bytes_min: u64) -> Result<Device> {
        let path = &config.path;
        let exists = path.exists();
        let created = match (exists, config.create_bytes) {
            (false, Some(bytes)) => {
                check_size(path, bytes, BLOCK_BYTES as u32, bytes_min)?;
                create_file(path, bytes)?;
                true
            }
            (false, None) => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "device {} does not exist (give a size to create it as a file)",
                        path.display()
                    ),
                ))
            }
            (true, _) => false,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
            .map_err(|error| {
                Error::io(
                    format!("cannot open {} with O_DIRECT", path.display()),
                    error,
                )
            })?;
        let metadata = file
            .metadata()
            .map_err(|error| Error::io(format!("cannot stat {}", path.display()), error))?;
        let kind = if metadata.file_type().is_block_device() {
            DeviceKind::BlockDevice
        } else if metadata.is_file() {
            DeviceKind::File
        } else {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        };
        let bytes = match kind {
            DeviceKind::File => metadata.len(),
            DeviceKind::BlockDevice => block_device_bytes(&file, path)?,
        };
        if let (Some(wanted), false) = (config.create_bytes, created) {
            if kind == DeviceKind::File && wanted != bytes {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "{} already exists with {bytes} bytes, not the {wanted} asked for; \
                         resize or remove it to change its size",
                        path.display()
                    ),
                ));
            }
        }
        let direct_io_align = direct_io_alignment(&file, kind);
        check_size(path, bytes, direct_io_align, bytes_min)?;
        Ok(Device {
            file,
            path: path.clone(),
            kind,
            bytes,
            direct_io_align,
            created,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn direct_io_align(&self) -> u32 {
        self.direct_io_align
    }

    pub fn created(&self) -> bool {
        self.created
    }

    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Read `len` bytes at `offset` synchronously (used while opening, before any ring runs).
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = IoBuf::heap(len);
        buf.set_len(crate::buf::align_up(len));
        let mut done = 0;
        while done < len {
            // SAFETY: the destination lies inside buf's capacity; the fd is ours.
            let read = unsafe {
                libc::pread(
                    self.raw_fd(),
                    buf.as_mut_ptr().add(done).cast(),
                    buf.len() - done,
                    (offset + done as u64) as libc::off_t,
                )
            };
            if read < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io(
                    format!("cannot read {} at {offset}", self.path.display()),
                    error,
                ));
            }
            if read == 0 {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{} ended at {} while reading {len} bytes at {offset}",
                        self.path.display(),
                        offset + done as u64
                    ),
                ));
            }
            done += read as usize;
        }
        Ok(buf.as_slice()[..len].to_vec())
    }

    /// Write `data` (a multiple of 4 KiB) at `offset` synchronously and make it durable.
    pub fn write_durable(&self, offset: u64, data: &[u8]) -> Result<()> {
        assert_eq!(data.len() % BLOCK_BYTES, 0);
        let mut buf = IoBuf::heap(data.len());
        buf.set_len(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        let mut done = 0;
        while done < data.len() {
            // SAFETY: the source lies inside buf; the fd is ours.
            let written = unsafe {
                libc::pwrite(
                    self.raw_fd(),
                    buf.as_ptr().add(done).cast(),
                    data.len() - done,
                    (offset + done as u64) as libc::off_t,
                )
            };
            if written < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io(
                    format!("cannot write {} at {offset}", self.path.display()),
                    error,
                ));
            }
            done += written as usize;
        }
        self.file
            .sync_data()
            .map_err(|error| Error::io(format!("cannot sync {}", self.path.display()), error))
    }
}

fn check_size(path: &Path, bytes: u64, align: u32, bytes_min: u64) -> Result<()> {
    if align as usize > BLOCK_BYTES {
        return Err(Error::new(
            ErrorKind::DeviceMisaligned,
            format!(
                "{} needs {align}-byte aligned direct I/O; hydrant's format supports at most {BLOCK_BYTES}",
                path.display()
            ),
        ));
    }
    if !bytes.is_multiple_of(align as u64) {
        return Err(Error::new(
            ErrorKind::DeviceMisaligned,
            format!(
                "{} is {bytes} bytes, which is not a multiple of its {align}-byte direct-I/O alignment",
                path.display()
            ),
        ));
    }
    if bytes < bytes_min {
        return Err(Error::new(
            ErrorKind::DeviceTooSmall,
            format!(
                "{} is {bytes} bytes; this configuration needs at least {bytes_min} bytes \
                 (superblocks plus three regions per shard)",
                path.display()
            ),
        ));
    }
    Ok(())
}

fn create_file(path: &Path, bytes: u64) -> Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)
                .map_err(|error| Error::io(format!("cannot create {}", parent.display()), error))?;
        }
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|error| Error::io(format!("cannot create {}", path.display()), error))?;
    // SAFETY: fallocate on an fd we own, with plain integer arguments.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if result != 0 {
        let error = io::Error::last_os_error();
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(Error::io(
            format!("cannot allocate {bytes} bytes for {}", path.display()),
            error,
        ));
    }
    file.sync_all()
        .map_err(|error| Error::io(format!("cannot sync {}", path.display()), error))
}

fn block_device_bytes(file: &File, path: &Path) -> Result<u64> {
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at a live u64.
    let result =
        unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut bytes as *mut u64) };
    if result != 0 {
        return Err(Error::io(
            format!("cannot read the size of {}", path.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(bytes)
}

/// The direct-I/O offset alignment: STATX_DIOALIGN where the kernel and file system report it,
/// else the logical sector size of a block device, else 4096 for a file.
fn direct_io_alignment(file: &File, kind: DeviceKind) -> u32 {
    // SAFETY: statx writes into the zeroed struct we own; the empty path with AT_EMPTY_PATH
    // refers to the fd itself.
    let statx_align = unsafe {
        let mut statx: libc::statx = std::mem::zeroed();
        let result = libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut statx,
        );
        (result == 0
            && statx.stx_mask & libc::STATX_DIOALIGN != 0
            && statx.stx_dio_offset_align > 0)
            .then_some(statx.stx_dio_offset_align)
    };
    if let Some(align) = statx_align {
        return align;
    }
    if kind == DeviceKind::BlockDevice {
        let mut sector: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer, which points at a live int.
        let result = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                BLKSSZGET as _,
                &mut sector as *mut libc::c_int,
            )
        };
        if result == 0 && sector > 0 {
            return sector as u32;
        }
    }
    BLOCK_BYTES as u32
}

/// Whether the device under `fd` (a block device, or a file on a file system) may be written
/// from memory that another process can change during the write. Not where the block layer
/// asks for pages that stay put while they are written (`queue/stable_writes`: integrity
/// metadata computed before the device reads the data, checksumming layers, where a change
/// would fail the write itself and stop the store), nor where that cannot be told (a file
/// system with no block device of its own: tmpfs, btrfs, network file systems).
pub fn allows_unstable_writes(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: fstat writes into the zeroed struct it is given.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return false;
    }
    let device = if stat.st_mode & libc::S_IFMT == libc::S_IFBLK {
        stat.st_rdev
    } else {
        stat.st_dev
    };
    let (major, minor) = (libc::major(device), libc::minor(device));
    if major == 0 {
        return false;
    }
    let Ok(node) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else {
        return false;
    };
    // A partition's queue is its disk's.
    let queues = [node.join("queue"), node.join("../queue")];
    queues
        .iter()
        .find_map(|queue| std::fs::read_to_string(queue.join("stable_writes")).ok())
        .is_some_and(|flag| flag.trim() == "0")
}

#[cfg(test)]
mod stable_write_tests {
    use std::os::fd::AsRawFd;

    #[test]
    fn a_file_without_a_block_device_of_its_own_is_not_written_from_client_memory() {
        let path = format!("/dev/shm/hydrant-stable-writes-{}", std::process::id());
        let file = std::fs::File::create(&path).unwrap();
        let allowed = super::allows_unstable_writes(file.as_raw_fd());
        std::fs::remove_file(&path).unwrap();
        assert!(!allowed, "tmpfs has no queue to ask");
        assert!(
            !super::allows_unstable_writes(-1),
            "nor has a closed descriptor"
        );
    }
}
