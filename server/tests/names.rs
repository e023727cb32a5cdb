//! Names that try to escape their place: the real server process, spoken to in raw frames (so
//! that no client-side check stands in the way), in front of a folder origin and of an S3 one.
//! Every such name is refused with INVALID_KEY, and nothing anywhere changes: not the data
//! file, not the origin, not the store.

mod common;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{call, S3Server, Scratch, ServerProcess};
use hydrant_proto::codec::Writer;
use hydrant_proto::message::{
    FlushRequest, GetRequest, ListRequest, Message, ObjectName, PrefetchRequest, PutRequest,
};
use hydrant_proto::{Opcode, Status};

/// Names no request may use, as (bucket, key).
fn hostile_names() -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = [
        (".", "data.hyd"),
        ("..", "data.hyd"),
        ("..", "origin/data/seed"),
        (".", "data/seed"),
        ("data", "../data.hyd"),
        ("data", "a/../../data.hyd"),
        ("data", "a/../../x"),
        ("data", "./seed"),
        ("data", "."),
        ("data", ".."),
        ("data", "//"),
        ("data", "a//b"),
        ("data", "/seed"),
        ("data", "seed/"),
        ("data", "%2e%2e/data.hyd"),
        ("data", "%2E%2e/%2e%2e/data.hyd"),
        ("data", "a/.%2e/.%2e/x"),
        ("data", "a\0b"),
        ("-data", "seed"),
        ("data.", "seed"),
        ("da..ta", "seed"),
        ("Data", "seed"),
    ]
    .into_iter()
    .map(|(bucket, key)| (bucket.to_string(), key.to_string()))
    .collect();
    names.push(("data".into(), "k".repeat(1025)));
    names.push(("b".repeat(64), "seed".into()));
    names
}

/// An ObjectName's encoding, whatever the name (the encoder does not check).
fn encoded(bucket: &str, key: &str) -> Vec<u8> {
    ObjectName {
        bucket: bucket.into(),
        key: key.into(),
    }
    .encode()
}

fn expect_invalid(
    stream: &mut TcpStream,
    what: &str,
    opcode: Opcode,
    extension: &[u8],
    payload: &[u8],
) {
    let response = call(stream, opcode, extension, payload);
    assert_eq!(
        response.status(),
        Status::InvalidKey,
        "{what}: {:?} {}",
        response.status(),
        response.message()
    );
}

/// Every operation that takes a name, with each hostile name.
fn attack(stream: &mut TcpStream) {
    for (bucket, key) in hostile_names() {
        let what = format!("{bucket:?}/{key:?}");
        let name = ObjectName {
            bucket: bucket.clone(),
            key: key.clone(),
        };
        let put = PutRequest {
            name: name.clone(),
            object_bytes: 5,
        };
        expect_invalid(stream, &what, Opcode::Put, &put.encode(), b"owned");
        let get = GetRequest {
            name: name.clone(),
            range_start: 0,
            range_end: None,
        };
        expect_invalid(stream, &what, Opcode::Get, &get.encode(), &[]);
        expect_invalid(stream, &what, Opcode::Head, &encoded(&bucket, &key), &[]);
        expect_invalid(stream, &what, Opcode::Delete, &encoded(&bucket, &key), &[]);
        let prefetch = PrefetchRequest {
            bucket: bucket.clone(),
            prefix: String::new(),
            keys: vec![key.clone()],
        };
        expect_invalid(stream, &what, Opcode::Prefetch, &prefetch.encode(), &[]);
        // A BATCH_GET item with such a name: the batch is refused whole.
        let mut batch = Writer::new();
        batch.u32(1);
        get.encode_into(&mut batch);
        expect_invalid(stream, &what, Opcode::BatchGet, &batch.finish(), &[]);
    }
    let prefixes = ["../", "a/../", "/", "%2e%2e/", "a//"];
    for (bucket, prefix) in [(".", ""), ("..", ""), ("data.", "")]
        .into_iter()
        .chain(prefixes.iter().map(|prefix| ("data", *prefix)))
    {
        let what = format!("LIST {bucket:?} {prefix:?}");
        let list = ListRequest {
            bucket: bucket.into(),
            prefix: prefix.into(),
            start_after: None,
            limit: 10,
        };
        expect_invalid(stream, &what, Opcode::List, &list.encode(), &[]);
        let after = ListRequest {
            bucket: "data".into(),
            prefix: String::new(),
            start_after: Some(format!("{prefix}x")),
            limit: 10,
        };
        if !prefix.is_empty() {
            expect_invalid(stream, &what, Opcode::List, &after.encode(), &[]);
        }
        let prefetch = PrefetchRequest {
            bucket: bucket.into(),
            prefix: prefix.into(),
            keys: Vec::new(),
        };
        expect_invalid(stream, &what, Opcode::Prefetch, &prefetch.encode(), &[]);
        let flush = FlushRequest {
            bucket: Some(bucket.into()),
            prefix: prefix.into(),
            timeout_ms: 1000,
        };
        expect_invalid(stream, &what, Opcode::Flush, &flush.encode(), &[]);
    }
}

/// Every file under `root` (but the data file, summed instead) with its bytes.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            if path.is_dir() {
                files.insert(format!("{name}/"), Vec::new());
                folders.push(path);
            } else if name == "data.hyd" {
                let bytes = std::fs::read(&path).unwrap();
                files.insert(name, crc32c::crc32c(&bytes).to_le_bytes().to_vec());
            } else {
                files.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// The tree once it stops changing (the server's own writes after a flush have landed).
fn settled_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut last = tree(root);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = tree(root);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// What a client sees of the store: `data/seed` and the listing.
fn visible(server: &ServerProcess) -> (Vec<u8>, Vec<String>) {
    let mut client = server.client();
    let (_, seed) = client.get("data", "seed", None).unwrap();
    let listed = client
        .list("data", "", None, 100)
        .unwrap()
        .into_iter()
        .map(|entry| entry.key)
        .collect();
    (seed, listed)
}

#[test]
fn names_that_escape_their_place_are_refused_and_change_nothing_on_a_folder_origin() {
    let scratch = Scratch::new("names-folder");
    // The server's default origin: the folder `origin` beside the data file.
    std::fs::create_dir_all(scratch.path().join("origin/data")).unwrap();
    std::fs::write(scratch.path().join("origin/data/seed"), b"from the origin").unwrap();
    let server = ServerProcess::start(scratch.path(), 512, &[], &[]);
    let mut client = server.client();
    client.put("data", "written", b"through hydrant").unwrap();
    client
        .flush(Some("data"), "", Duration::from_secs(30))
        .unwrap();
    let before_view = visible(&server);
    assert_eq!(before_view.0, b"from the origin");
    let before = settled_tree(scratch.path());
    let objects_before = server.metric("hydrant_objects");

    let mut stream = server.greeted();
    attack(&mut stream);

    // Nothing was created, overwritten or deleted: no folder beside the data file or inside
    // the origin, the data file's bytes the same, the store's objects the same.
    assert_eq!(settled_tree(scratch.path()), before);
    assert_eq!(visible(&server), before_view);
    assert_eq!(server.metric("hydrant_objects"), objects_before);
    // And the connection still serves.
    call(&mut stream, Opcode::Ping, &[], &[]);
}

#[test]
fn names_that_escape_their_place_are_refused_and_change_nothing_on_an_s3_origin() {
    let s3 = S3Server::start();
    s3.create_bucket("hostile-names");
    s3.put("hostile-names", "data/seed", b"from the origin");
    let scratch = Scratch::new("names-s3");
    let server = ServerProcess::start(
        scratch.path(),
        512,
        &["--origin", "s3://hostile-names"],
        &s3.env(),
    );
    let mut client = server.client();
    client.put("data", "written", b"through hydrant").unwrap();
    client
        .flush(Some("data"), "", Duration::from_secs(30))
        .unwrap();
    let listed_before = s3.list("hostile-names");
    assert_eq!(listed_before, ["data/seed", "data/written"]);
    let view_before = visible(&server);
    let before = settled_tree(scratch.path());

    let mut stream = server.greeted();
    attack(&mut stream);

    assert_eq!(s3.list("hostile-names"), listed_before);
    assert_eq!(settled_tree(scratch.path()), before);
    assert_eq!(visible(&server), view_before);
    call(&mut stream, Opcode::Ping, &[], &[]);
}
