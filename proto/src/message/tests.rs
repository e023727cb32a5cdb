use super::*;

fn name() -> ObjectName {
    ObjectName {
        bucket: "datasets".into(),
        key: "train/shard-0001.tar".into(),
    }
}

#[test]
fn every_message_round_trips() {
    let hello = HelloRequest {
        version_min: 1,
        version_max: 1,
        limits: Limits::default(),
        client_nonce: [7; NONCE_BYTES],
        proof: Some([9; PROOF_BYTES]),
    };
    assert_eq!(HelloRequest::decode(&hello.encode()), Ok(hello));
    let prefetch = PrefetchRequest {
        bucket: "datasets".into(),
        prefix: "train/".into(),
        keys: vec!["a".into(), "b/c".into()],
    };
    assert_eq!(PrefetchRequest::decode(&prefetch.encode()), Ok(prefetch));
    let warmed = PrefetchResult {
        objects: 3,
        bytes: 1 << 40,
    };
    assert_eq!(PrefetchResult::decode(&warmed.encode()), Ok(warmed));
    let plan = PlanRequest {
        bucket: "datasets".into(),
        plan_id: u64::MAX - 3,
        window_bytes: 256 << 20,
        idle_ms: 30_000,
    };
    assert_eq!(PlanRequest::decode(&plan.encode()), Ok(plan));
    let keys = PlanKeys {
        keys: vec!["train/b".into(), "train/a".into(), "train/b".into()],
    };
    assert_eq!(PlanKeys::decode(&keys.encode()), Ok(keys));
    assert_eq!(
        PlanResult::decode(&PlanResult { keys: 9 }.encode()),
        Ok(PlanResult { keys: 9 })
    );
    let uploads = UploadsRequest {
        bucket: Some("ckpt".into()),
        prefix: "step-9/".into(),
        retry: true,
        limit: 100,
    };
    assert_eq!(UploadsRequest::decode(&uploads.encode()), Ok(uploads));
    let refused = UploadsAnswer {
        total: 7,
        refused: vec![RefusedUpload {
            bucket: "ckpt".into(),
            key: "x/y".into(),
            seq: 12,
            object_bytes: 4096,
            reason: "origin refused".into(),
        }],
    };
    assert_eq!(UploadsAnswer::decode(&refused.encode()), Ok(refused));
    for bucket in [None, Some("ckpt".to_string())] {
        let flush = FlushRequest {
            prefix: if bucket.is_some() {
                "step-9/".into()
            } else {
                String::new()
            },
            bucket,
            timeout_ms: 60_000,
        };
        assert_eq!(FlushRequest::decode(&flush.encode()), Ok(flush));
    }
    let prefix_without_bucket = FlushRequest {
        bucket: None,
        prefix: "x".into(),
        timeout_ms: 1,
    };
    assert!(FlushRequest::decode(&prefix_without_bucket.encode()).is_err());
    let answer = HelloResponse {
        version: 1,
        limits: Limits::default(),
        server_nonce: [3; NONCE_BYTES],
        auth_required: true,
        shard_count: 2,
        placement_hash: 1,
        shard_ports: vec![7701, 7702],
    };
    assert_eq!(HelloResponse::decode(&answer.encode()), Ok(answer.clone()));
    // A later server's answer with fields appended: the known ones decode, the rest is
    // passed over; an answer that ends after the placement hash offers no shard ports.
    let mut grown = answer.encode();
    grown.extend_from_slice(&[9, 9, 9, 9, 9]);
    assert_eq!(HelloResponse::decode(&grown), Ok(answer.clone()));
    let mut older = answer.encode();
    older.truncate(older.len() - 6);
    assert_eq!(
        HelloResponse::decode(&older).map(|hello| hello.shard_ports),
        Ok(Vec::new())
    );
    let none = HelloResponse {
        shard_ports: Vec::new(),
        ..answer.clone()
    };
    assert_eq!(HelloResponse::decode(&none.encode()), Ok(none));
    let wrong_count = HelloResponse {
        shard_ports: vec![7701],
        ..answer.clone()
    };
    assert!(HelloResponse::decode(&wrong_count.encode()).is_err());
    let port_zero = HelloResponse {
        shard_ports: vec![7701, 0],
        ..answer
    };
    assert!(HelloResponse::decode(&port_zero.encode()).is_err());
    let get = GetRequest {
        name: name(),
        range_start: 10,
        range_end: Some(20),
    };
    assert_eq!(GetRequest::decode(&get.encode()), Ok(get.clone()));
    let whole = GetRequest {
        name: name(),
        range_start: 0,
        range_end: None,
    };
    let get_bytes = get.encode();
    let borrowed = GetRequestRef::decode(&get_bytes).expect("decodes");
    assert_eq!(
        (
            borrowed.name.to_owned(),
            borrowed.range_start,
            borrowed.range_end
        ),
        (get.name.clone(), 10, Some(20))
    );
    assert_eq!(GetRequest::decode(&borrowed.encode()), Ok(get.clone()));
    assert_eq!(GetRequest::decode(&whole.encode()), Ok(whole));
    let info = ObjectInfo {
        object_bytes: 100,
        seq: 5,
        dirty: true,
        range_start: 10,
    };
    assert_eq!(ObjectInfo::decode(&info.encode()), Ok(info));
    assert_eq!(info.encode().len(), OBJECT_INFO_BYTES);
    assert_eq!(
        ObjectInfo::decode(&info.to_bytes()),
        Ok(info),
        "to_bytes is the encoding"
    );
    let put = PutRequest {
        name: name(),
        object_bytes: 1 << 40,
    };
    assert_eq!(PutRequest::decode(&put.encode()), Ok(put));
    let list = ListRequest {
        bucket: "datasets".into(),
        prefix: "train/".into(),
        start_after: Some("train/a".into()),
        limit: 100,
    };
    assert_eq!(ListRequest::decode(&list.encode()), Ok(list));
}

#[test]
fn bad_contents_are_refused() {
    let mut bad_bucket = Writer::new();
    bad_bucket.bytes16(b"Data");
    bad_bucket.bytes16(b"key");
    assert!(ObjectName::decode(&bad_bucket.finish()).is_err());
    let long_key = ObjectName {
        bucket: "b".into(),
        key: "k".repeat(1025),
    };
    assert!(ObjectName::decode(&long_key.encode()).is_err());
    let empty_key = ObjectName {
        bucket: "b".into(),
        key: String::new(),
    };
    assert!(ObjectName::decode(&empty_key.encode()).is_err());
    let mut trailing = name().encode();
    trailing.push(0);
    assert_eq!(
        ObjectName::decode(&trailing),
        Err(ProtoError::Malformed("trailing bytes after the extension"))
    );
    let backwards = GetRequest {
        name: name(),
        range_start: 20,
        range_end: Some(10),
    };
    assert!(GetRequest::decode(&backwards.encode()).is_err());
    assert!(GetRequestRef::decode(&backwards.encode()).is_err());
    let mut trailing_get = GetRequest {
        name: name(),
        range_start: 0,
        range_end: None,
    }
    .encode();
    trailing_get.push(0);
    assert!(GetRequestRef::decode(&trailing_get).is_err());
    let small_limits = Limits {
        extension_bytes_max: 10,
        ..Limits::default()
    };
    let hello = HelloRequest {
        version_min: 1,
        version_max: 1,
        limits: small_limits,
        client_nonce: [0; 16],
        proof: None,
    };
    assert!(
        HelloRequest::decode(&hello.encode()).is_err(),
        "limits below the floor are refused"
    );
    let encoded = name().encode();
    for cut in 0..encoded.len() {
        assert!(ObjectName::decode(&encoded[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn a_plan_out_of_bounds_is_refused() {
    let plan = |window_bytes, idle_ms| PlanRequest {
        bucket: "datasets".into(),
        plan_id: 1,
        window_bytes,
        idle_ms,
    };
    assert!(PlanRequest::decode(&plan(0, 1000).encode()).is_err());
    assert!(PlanRequest::decode(&plan(PLAN_WINDOW_BYTES_MAX + 1, 1000).encode()).is_err());
    assert!(PlanRequest::decode(&plan(1 << 20, PLAN_IDLE_MS_MIN - 1).encode()).is_err());
    assert!(PlanRequest::decode(&plan(1 << 20, PLAN_IDLE_MS_MAX + 1).encode()).is_err());
    assert!(PlanRequest::decode(&plan(PLAN_WINDOW_BYTES_MAX, PLAN_IDLE_MS_MAX).encode()).is_ok());
    // A count past the bound is refused before any key is read.
    let mut payload = ((PLAN_KEYS_MAX + 1) as u32).to_le_bytes().to_vec();
    payload.extend_from_slice(&[1, 0, b'a']);
    assert!(PlanKeys::decode(&payload).is_err());
    // Keys are held to the key grammar.
    let escaping = PlanKeys {
        keys: vec!["../x".into()],
    };
    assert!(PlanKeys::decode(&escaping.encode()).is_err());
}
