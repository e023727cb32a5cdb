//! The per-core runtime on its own: timers, cross-thread channels, the in-flight bound, and the
//! rule that a buffer handed to the ring stays with the ring until its completion arrives.

mod common;

use std::future::Future;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use common::TempDir;
use hydrant_engine::buf::{Arena, IoBuf};
use hydrant_engine::rt::channel::{bounded, oneshot};
use hydrant_engine::rt::op::{read_at, write_at, FileRef};
use hydrant_engine::rt::{
    block_on, current_reactor, spawn, start_thread, time::sleep, ReactorConfig, WAITER_PASSES_MAX,
};

/// Run `body` on a fresh shard thread and return its result.
fn on_shard<T, F, Fut>(config: ReactorConfig, body: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let (reply, answer) = oneshot();
    let thread = start_thread("test-shard".into(), None, config, move || async move {
        reply.send(body().await);
    })
    .unwrap();
    let result = block_on(answer).expect("the shard answered");
    thread.join().unwrap();
    result
}

fn direct_file(dir: &TempDir, bytes: usize) -> std::fs::File {
    let path = dir.file("runtime.dat");
    std::fs::write(&path, vec![0u8; bytes]).unwrap();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap()
}

#[test]
fn a_sleeping_shard_wakes_on_its_timer() {
    let elapsed = on_shard(ReactorConfig::default(), || async {
        let started = Instant::now();
        sleep(Duration::from_millis(30)).await;
        started.elapsed()
    });
    assert!(elapsed >= Duration::from_millis(30), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn a_bounded_channel_carries_everything_and_refuses_past_its_capacity() {
    let (sender, receiver) = bounded::<u64>(4);
    for value in 0..4 {
        sender.try_send(value).unwrap();
    }
    assert_eq!(sender.try_send(99), Err(99), "a full channel refuses");
    let producers: Vec<_> = (0..2u64)
        .map(|producer| {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for value in 0..1000u64 {
                    block_on(sender.send(producer * 1_000_000 + value)).unwrap();
                }
            })
        })
        .collect();
    drop(sender);
    let (sum, count) = on_shard(ReactorConfig::default(), move || async move {
        let mut sum = 0u64;
        let mut count = 0u64;
        while let Some(value) = receiver.recv().await {
            sum += value;
            count += 1;
        }
        (sum, count)
    });
    for producer in producers {
        producer.join().unwrap();
    }
    let expected: u64 = (0..4).sum::<u64>()
        + (0..1000u64)
            .map(|value| value + value + 1_000_000)
            .sum::<u64>();
    assert_eq!(count, 2004);
    assert_eq!(sum, expected);
}

#[test]
fn in_flight_io_stays_under_the_bound() {
    let dir = TempDir::new("runtime-bound");
    let file = direct_file(&dir, 1 << 20);
    let fd = file.as_raw_fd();
    let config = ReactorConfig {
        io_depth_max: 8,
        ..ReactorConfig::default()
    };
    let (highest, reads) = on_shard(config, move || async move {
        let arena = Arena::new(16 << 20).unwrap();
        let highest = Rc::new(std::cell::Cell::new(0usize));
        let tasks: Vec<_> = (0..200u64)
            .map(|index| {
                let buf = arena.allocate(4096);
                let highest = highest.clone();
                spawn(async move {
                    let read = read_at(FileRef::Raw(fd), buf, (index % 256) * 4096, 4096);
                    let mut read = pin!(read);
                    let result = std::future::poll_fn(|context| {
                        let poll = read.as_mut().poll(context);
                        highest.set(highest.get().max(current_reactor().in_flight()));
                        poll
                    })
                    .await;
                    result.0.unwrap()
                })
            })
            .collect();
        let mut reads = 0;
        for task in tasks {
            reads += task.await;
        }
        (highest.get(), reads)
    });
    assert_eq!(reads, 200 * 4096);
    assert!(
        highest <= 8,
        "at most 8 operations in flight, saw {highest}"
    );
    assert!(highest > 1, "operations did run concurrently");
    drop(file);
}

#[test]
fn device_bytes_in_flight_stay_under_the_byte_bound_and_a_larger_read_goes_alone_in_turn() {
    const BOUND: u64 = 1 << 20;
    const LARGE: usize = 256 << 10;
    const HUGE: usize = 2 << 20;
    let dir = TempDir::new("runtime-bytes");
    let file = direct_file(&dir, 4 << 20);
    let pattern: Vec<u8> = (0..4 << 20).map(|index| (index % 251) as u8).collect();
    {
        use std::os::unix::fs::FileExt;
        std::fs::File::options()
            .write(true)
            .open(dir.file("runtime.dat"))
            .unwrap()
            .write_all_at(&pattern, 0)
            .unwrap();
    }
    let fd = file.as_raw_fd();
    let config = ReactorConfig {
        io_bytes_max: BOUND,
        ..ReactorConfig::default()
    };
    // (highest bytes without the huge read, highest operations, operations beside the huge
    // read, every read right)
    let (bytes, operations, beside_huge, right) = on_shard(config, move || async move {
        let arena = Arena::new(16 << 20).unwrap();
        let highest_bytes = Rc::new(std::cell::Cell::new(0u64));
        let highest_operations = Rc::new(std::cell::Cell::new(0usize));
        let beside_huge = Rc::new(std::cell::Cell::new(0usize));
        let completions = Rc::new(std::cell::Cell::new(0usize));
        // 48 reads of 256 KiB and 48 of 4 KiB, interleaved, and one of 2 MiB (twice the
        // bound) among them.
        let tasks: Vec<_> = (0..97u64)
            .map(|index| {
                let length = match index {
                    48 => HUGE,
                    _ if index % 2 == 0 => LARGE,
                    _ => 4096,
                };
                let offset = if length == HUGE {
                    0
                } else {
                    (index * 12_288) % ((4 << 20) - LARGE as u64) / 4096 * 4096
                };
                let buf = arena.allocate(length);
                let (highest_bytes, highest_operations, beside_huge, completions) = (
                    highest_bytes.clone(),
                    highest_operations.clone(),
                    beside_huge.clone(),
                    completions.clone(),
                );
                spawn(async move {
                    let read = read_at(FileRef::Raw(fd), buf, offset, length);
                    let mut read = pin!(read);
                    let (result, buf) = std::future::poll_fn(|context| {
                        let poll = read.as_mut().poll(context);
                        let reactor = current_reactor();
                        if reactor.bytes_in_flight() < HUGE as u64 {
                            highest_bytes.set(highest_bytes.get().max(reactor.bytes_in_flight()));
                        }
                        highest_operations.set(highest_operations.get().max(reactor.in_flight()));
                        if reactor.bytes_in_flight() >= HUGE as u64 {
                            beside_huge.set(beside_huge.get().max(reactor.in_flight() - 1));
                        }
                        poll
                    })
                    .await;
                    completions.set(completions.get() + 1);
                    (result.unwrap(), offset, buf, completions.get())
                })
            })
            .collect();
        let mut right = true;
        let mut order = Vec::new();
        for (index, task) in tasks.into_iter().enumerate() {
            let (read, offset, buf, completed) = task.await;
            order.push(completed);
            let expected = if index == 48 {
                HUGE
            } else if index % 2 == 0 {
                LARGE
            } else {
                4096
            };
            right &= read == expected
                && buf.as_slice() == &pattern[offset as usize..offset as usize + expected];
        }
        // Every read asked for after the huge one waited behind it: none overtook it.
        let overtaken = order[49..].iter().filter(|&&done| done < order[48]).count();
        (
            highest_bytes.get(),
            highest_operations.get(),
            beside_huge.get(),
            right && overtaken == 0,
        )
    });
    assert!(
        right,
        "every read returned the file's bytes, and none asked for after the huge read overtook it"
    );
    assert!(
        bytes <= BOUND,
        "at most {BOUND} bytes in flight beside the huge read, saw {bytes}"
    );
    assert!(
        bytes > LARGE as u64,
        "large reads ran concurrently: {bytes}"
    );
    assert_eq!(beside_huge, 0, "the read larger than the bound went alone");
    assert!(
        operations > 4,
        "small reads ran beside large ones under the byte bound: {operations} at once"
    );
    drop(file);
}

#[test]
fn a_read_dropped_while_waiting_for_room_gives_its_place_to_the_next() {
    let dir = TempDir::new("runtime-line");
    let file = direct_file(&dir, 1 << 20);
    let fd = file.as_raw_fd();
    let config = ReactorConfig {
        io_depth_max: 1,
        ..ReactorConfig::default()
    };
    let (reply, answer) = std::sync::mpsc::channel();
    let thread = start_thread("test-line".into(), None, config, move || async move {
        let arena = Arena::new(1 << 20).unwrap();
        let mut context = Context::from_waker(Waker::noop());
        // One operation at a time: the first is submitted, the second waits in line.
        let mut first = Box::pin(read_at(FileRef::Raw(fd), arena.allocate(4096), 0, 4096));
        assert!(first.as_mut().poll(&mut context).is_pending());
        let mut second = Box::pin(read_at(FileRef::Raw(fd), arena.allocate(4096), 4096, 4096));
        assert!(second.as_mut().poll(&mut context).is_pending());
        // The third lines up behind the second, which is then dropped before it was submitted.
        let third = spawn(read_at(FileRef::Raw(fd), arena.allocate(4096), 8192, 4096));
        sleep(Duration::from_millis(1)).await;
        // The first completes: the room it leaves goes to the second, first in line, which is
        // then dropped without being polled again; the third must get its place.
        let first = first.await.0.unwrap();
        drop(second);
        let third = third.await.0.unwrap();
        reply.send((first, third)).unwrap();
    })
    .unwrap();
    let read = answer
        .recv_timeout(Duration::from_secs(10))
        .expect("the read behind the dropped one ran");
    assert_eq!(read, (4096, 4096));
    thread.join().unwrap();
    drop(file);
}

#[test]
fn reads_that_fit_pass_a_waiting_larger_one_until_it_has_been_passed_enough() {
    let dir = TempDir::new("runtime-pass");
    let file = direct_file(&dir, 4 << 20);
    let fd = file.as_raw_fd();
    let config = ReactorConfig {
        io_bytes_max: 1 << 20,
        ..ReactorConfig::default()
    };
    let outcome = on_shard(config, move || async move {
        let arena = Arena::new(4 << 20).unwrap();
        let mut context = Context::from_waker(Waker::noop());
        let in_flight = || current_reactor().in_flight();
        // 768 KiB in flight; a read of 512 KiB does not fit under the 1 MiB bound and waits.
        let mut large = Box::pin(read_at(
            FileRef::Raw(fd),
            arena.allocate(768 << 10),
            0,
            768 << 10,
        ));
        assert!(large.as_mut().poll(&mut context).is_pending());
        let mut waiting = Box::pin(read_at(
            FileRef::Raw(fd),
            arena.allocate(512 << 10),
            1 << 20,
            512 << 10,
        ));
        assert!(waiting.as_mut().poll(&mut context).is_pending());
        assert_eq!(in_flight(), 1, "the 512 KiB read waits");
        // Reads of 4 KiB fit and pass it, WAITER_PASSES_MAX of them; the next waits behind it
        // although it would fit.
        let mut small = Vec::new();
        for index in 0..=WAITER_PASSES_MAX as u64 {
            let mut read = Box::pin(read_at(
                FileRef::Raw(fd),
                arena.allocate(4096),
                (2 << 20) + index * 4096,
                4096,
            ));
            assert!(read.as_mut().poll(&mut context).is_pending());
            small.push(read);
        }
        let passed = in_flight() - 1;
        let mut lengths = vec![large.await.0.unwrap(), waiting.await.0.unwrap()];
        for read in small {
            lengths.push(read.await.0.unwrap());
        }
        (passed, lengths)
    });
    let (passed, lengths) = outcome;
    assert_eq!(
        passed, WAITER_PASSES_MAX as usize,
        "small reads passed the waiting one until it closed the line"
    );
    assert_eq!(lengths[0], 768 << 10);
    assert_eq!(lengths[1], 512 << 10);
    assert!(lengths[2..].iter().all(|&length| length == 4096));
    drop(file);
}

#[test]
fn a_dropped_read_leaves_its_buffer_with_the_ring_until_completion() {
    let dir = TempDir::new("runtime-drop");
    let file = direct_file(&dir, 1 << 20);
    let fd = file.as_raw_fd();
    let (in_flight_after_drop, in_flight_later, still_works) =
        on_shard(ReactorConfig::default(), move || async move {
            let reactor = current_reactor();
            {
                let read = read_at(FileRef::Raw(fd), IoBuf::heap(1 << 20), 0, 1 << 20);
                let mut read = pin!(read);
                let mut context = Context::from_waker(Waker::noop());
                // One poll submits the read; then the future is dropped with the read in flight.
                assert!(read.as_mut().poll(&mut context).is_pending());
            }
            let in_flight_after_drop = reactor.in_flight();
            // The completion still arrives and frees the slot (and the buffer) it kept.
            let deadline = Instant::now() + Duration::from_secs(5);
            while reactor.in_flight() > 0 && Instant::now() < deadline {
                sleep(Duration::from_millis(1)).await;
            }
            let in_flight_later = reactor.in_flight();
            let mut buf = IoBuf::heap(4096);
            buf.set_len(4096);
            buf.as_mut_slice().fill(0xAB);
            let (written, _) = write_at(FileRef::Raw(fd), buf, 8192).await;
            let (read, buf) = read_at(FileRef::Raw(fd), IoBuf::heap(4096), 8192, 4096).await;
            let still_works = written.is_ok()
                && read.unwrap() == 4096
                && buf.as_slice().iter().all(|&byte| byte == 0xAB);
            (in_flight_after_drop, in_flight_later, still_works)
        });
    assert_eq!(
        in_flight_after_drop, 1,
        "the abandoned read is still owned by the ring"
    );
    assert_eq!(in_flight_later, 0, "its completion freed it");
    assert!(still_works);
    drop(file);
}

#[test]
fn a_shard_accepts_receives_and_sends_on_loopback() {
    use hydrant_engine::rt::net;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd as _;
    let listener = net::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = net::local_address(&listener).unwrap();
    let client = std::thread::spawn(move || {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(b"hello over io_uring").unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut echoed = Vec::new();
        stream.read_to_end(&mut echoed).unwrap();
        echoed
    });
    let fd = listener.as_raw_fd();
    let received = on_shard(ReactorConfig::default(), move || async move {
        let connection = net::accept(fd).await.unwrap();
        let mut buf = IoBuf::heap(4096);
        loop {
            // The first receive waits for readiness first (POLL_FIRST), the others try at once.
            let expect_wait = buf.is_empty();
            let (read, filled) = net::recv(connection.as_raw_fd(), buf, expect_wait).await;
            buf = filled;
            if read.unwrap() == 0 {
                break;
            }
        }
        let received = buf.as_slice().to_vec();
        let (sent, _) = net::send_all(connection.as_raw_fd(), buf).await;
        sent.unwrap();
        received
    });
    assert_eq!(received, b"hello over io_uring");
    assert_eq!(client.join().unwrap(), b"hello over io_uring");
    drop(listener);
}
