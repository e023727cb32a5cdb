//! Same-host writes from the writer's own memory (WRITE_MEMORY, no shared region) against the
//! real `hydrant-server` process: objects gathered from many parts land byte-exact, counted,
//! and survive SIGKILL of the server; an address that is not mapped in the writer, at
//! the start or part-way, is refused with nothing stored; conditions hold as for WRITE.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{object_bytes, Scratch, ServerProcess};
use hydrant_client::local::{LocalClient, LocalCondition};
use hydrant_client::ClientError;
use hydrant_proto::Status;

fn socket_of(scratch: &Scratch) -> PathBuf {
    scratch.path().join("local.sock")
}

fn start(scratch: &Scratch) -> ServerProcess {
    let socket = socket_of(scratch);
    ServerProcess::start_shards(
        scratch.path(),
        2,
        512,
        &[
            "--origin",
            "none",
            "--local-socket",
            socket.to_str().unwrap(),
        ],
        &[],
    )
}

fn status_of(error: ClientError) -> u8 {
    match error {
        ClientError::Status { status, .. } => status,
        other => panic!("expected a status, got {other}"),
    }
}

fn stored(tcp: &mut hydrant_client::Client, key: &str) -> Option<Vec<u8>> {
    match tcp.get("b", key, None) {
        Ok((_, data)) => Some(data),
        Err(error) => {
            assert_eq!(status_of(error), Status::NotFound as u8, "{key}");
            None
        }
    }
}

#[test]
fn objects_from_many_parts_of_the_writers_memory_land_byte_exact_and_survive_sigkill() {
    let scratch = Scratch::new("local-memory-writes");
    let mut server = start(&scratch);
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    // Objects as a writer gathers them: one part, many small ones, parts of every size around
    // the chunk size, an empty part among them, and nothing at all.
    let shapes: Vec<Vec<usize>> = vec![
        vec![(9 << 20) + 123],
        (0..300).map(|index| 1 + index * 37).collect(),
        vec![4 << 20, 1, (4 << 20) - 1, 0, 4097, 3 << 20],
        vec![],
        vec![1],
    ];
    let mut expected = Vec::new();
    let mut total = 0;
    for (seed, shape) in shapes.iter().enumerate() {
        let parts: Vec<Vec<u8>> = shape
            .iter()
            .enumerate()
            .map(|(index, &length)| object_bytes((seed * 1000 + index) as u64, length))
            .collect();
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let key = format!("gathered/{seed}");
        let info = client
            .write_memory(&slices, "b", &key, LocalCondition::None)
            .unwrap();
        let whole = parts.concat();
        assert_eq!(info.bytes, whole.len() as u64);
        total += whole.len();
        expected.push((key, whole));
    }
    assert_eq!(
        server.metric("hydrant_local_memory_write_bytes_total"),
        total as u64,
        "every byte read from the writer's memory"
    );
    assert_eq!(server.metric("hydrant_shared_write_bytes_total"), 0);
    let check = |server: &ServerProcess| {
        let mut tcp = server.client();
        for (key, whole) in &expected {
            assert_eq!(stored(&mut tcp, key).as_ref(), Some(whole), "{key}");
        }
    };
    check(&server);
    drop(client);
    server.kill();
    let server = start(&scratch);
    check(&server);
}

#[test]
fn memory_the_writer_does_not_have_is_refused_and_nothing_is_stored() {
    let scratch = Scratch::new("local-memory-refused");
    let server = start(&scratch);
    let mut tcp = server.client();
    let mut client = LocalClient::connect(socket_of(&scratch)).unwrap();
    let good = object_bytes(1, 6 << 20);
    // An address no process maps (the first page), as the only part.
    // SAFETY: never dereferenced here; the server reads it from this process and fails.
    let unmapped: &[u8] = unsafe { std::slice::from_raw_parts(4096 as *const u8, 4096) };
    let error = client
        .write_memory(&[unmapped], "b", "refused/first", LocalCondition::None)
        .unwrap_err();
    assert_eq!(status_of(error), Status::InvalidRange as u8);
    // Part-way: the first chunk reads, a later part does not; nothing becomes visible.
    let error = client
        .write_memory(
            &[&good, unmapped],
            "b",
            "refused/later",
            LocalCondition::None,
        )
        .unwrap_err();
    assert_eq!(status_of(error), Status::InvalidRange as u8);
    assert_eq!(stored(&mut tcp, "refused/first"), None);
    assert_eq!(stored(&mut tcp, "refused/later"), None);

    // Conditions, as for a WRITE from a region.
    let first = client
        .write_memory(&[&good[..5000]], "b", "cond", LocalCondition::Absent)
        .unwrap();
    let error = client
        .write_memory(&[&good[..10]], "b", "cond", LocalCondition::Absent)
        .unwrap_err();
    assert_eq!(status_of(error), Status::PreconditionFailed as u8);
    let error = client
        .write_memory(
            &[&good[..10]],
            "b",
            "cond",
            LocalCondition::Version(first.seq + 99),
        )
        .unwrap_err();
    assert_eq!(status_of(error), Status::PreconditionFailed as u8);
    assert_eq!(stored(&mut tcp, "cond"), Some(good[..5000].to_vec()));
    client
        .write_memory(
            &[&good[..10]],
            "b",
            "cond",
            LocalCondition::Version(first.seq),
        )
        .unwrap();
    assert_eq!(stored(&mut tcp, "cond"), Some(good[..10].to_vec()));
    // The connection still serves after its refusals.
    client
        .write_memory(&[&good], "b", "after", LocalCondition::None)
        .unwrap();
    assert_eq!(stored(&mut tcp, "after"), Some(good));
}

/// userfaultfd's API as the kernel's headers give it (libc has the syscall, not the ioctls).
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f; // _IOWR(0xAA, 0x3F, struct uffdio_api)
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00; // _IOWR(0xAA, 0x00, struct uffdio_register)
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;

/// `bytes` of fresh anonymous memory whose first touch of any page but the first waits until
/// the returned descriptor is closed (a userfaultfd that nobody answers): memory as slow as the writer's page faults can
/// make it (a file on a stuck file system behaves the same).
fn memory_that_faults_forever(bytes: usize) -> (*mut u8, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscalls on memory and descriptors this function owns.
    unsafe {
        let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) as i32;
        assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
        let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut api = UffdioApi {
            api: UFFD_API,
            features: 0,
            ioctls: 0,
        };
        assert_eq!(
            libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), UFFDIO_API, &mut api),
            0
        );
        let memory = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(memory, libc::MAP_FAILED);
        // The first page is there (a look at the first byte finds it); the rest is not.
        memory.cast::<u8>().write(7);
        let mut register = UffdioRegister {
            start: memory as u64,
            len: bytes as u64,
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        assert_eq!(
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                UFFDIO_REGISTER,
                &mut register
            ),
            0,
            "UFFDIO_REGISTER: {}",
            std::io::Error::last_os_error()
        );
        (memory.cast(), fd)
    }
}

#[test]
fn a_writer_whose_memory_never_arrives_stalls_only_its_own_write() {
    let scratch = Scratch::new("local-memory-stuck");
    let server = start(&scratch);
    let bytes = 8 << 20;
    let (memory, fault_fd) = memory_that_faults_forever(bytes);
    let address = memory as usize;
    let socket = socket_of(&scratch);
    let stuck = std::thread::spawn(move || {
        let mut client = LocalClient::connect(socket).unwrap();
        // SAFETY: mapped above and never unmapped while this thread runs; read only by the
        // server (through the kernel), whose reads wait on the userfaultfd.
        let part = unsafe { std::slice::from_raw_parts(address as *const u8, bytes) };
        client.write_memory(&[part], "b", "stuck", LocalCondition::None)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !stuck.is_finished(),
        "the read of the writer's memory waits on its faults"
    );
    // Meanwhile every shard serves everyone else: keys of both shards written and read over
    // TCP, and written from memory through the same-host socket.
    let mut tcp = server.client();
    let mut other = LocalClient::connect(socket_of(&scratch)).unwrap();
    let started = std::time::Instant::now();
    for index in 0..16 {
        let data = object_bytes(100 + index, 300_000);
        tcp.put("b", &format!("served/{index}"), &data).unwrap();
        assert_eq!(
            stored(&mut tcp, &format!("served/{index}")),
            Some(data.clone())
        );
        other
            .write_memory(
                &[&data],
                "b",
                &format!("local/{index}"),
                LocalCondition::None,
            )
            .unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the other writes took {:?}",
        started.elapsed()
    );
    assert!(!stuck.is_finished());
    assert_eq!(
        stored(&mut tcp, "stuck"),
        None,
        "nothing of it is visible yet"
    );
    // Closing the userfaultfd lets the faults through (fresh zero pages): the write completes.
    drop(fault_fd);
    let info = stuck.join().unwrap().unwrap();
    assert_eq!(info.bytes, bytes as u64);
    let mut expected = vec![0u8; bytes];
    expected[0] = 7;
    assert_eq!(stored(&mut tcp, "stuck"), Some(expected));
}
