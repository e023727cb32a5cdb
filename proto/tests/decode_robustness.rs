//! The decoders against many mutated and random inputs: they return a result, never panic, never
//! read past their input, and never accept a header whose announced lengths exceed the limits.
//! (A stable, bounded stand-in that runs in every CI; a cargo-fuzz target is still to come.)

use hydrant_proto::local::{
    LocalCondition, LocalRead, LocalReadAnswer, LocalRegionInfo, LocalWrite, LocalWriteAnswer,
    LocalWriteMemory,
};
use hydrant_proto::message::{
    GetRequest, HelloRequest, HelloResponse, ListEntries, ListRequest, Message, ObjectInfo,
    ObjectName, PutRequest,
};
use hydrant_proto::{FrameHeader, Limits, Opcode, FRAME_HEADER_BYTES};

struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

fn decode_everything(bytes: &[u8], limits: &Limits) -> bool {
    let accepted = FrameHeader::decode(bytes, limits).map(|header| {
        assert!(header.extension_len <= limits.extension_bytes_max);
        assert!(header.payload_len <= limits.payload_bytes_max);
    });
    let _ = FrameHeader::salvage(bytes);
    let _ = HelloRequest::decode(bytes);
    let _ = HelloResponse::decode(bytes);
    let _ = ObjectName::decode(bytes);
    let _ = GetRequest::decode(bytes);
    let _ = PutRequest::decode(bytes);
    let _ = ObjectInfo::decode(bytes);
    let _ = ListRequest::decode(bytes);
    let _ = ListEntries::decode(bytes);
    let _ = LocalRead::decode(bytes);
    let _ = LocalReadAnswer::decode(bytes);
    let _ = LocalRegionInfo::decode(bytes);
    if let Ok(write) = LocalWrite::decode(bytes) {
        assert!(write.bucket.len() <= 255 && write.key.len() <= 4096);
    }
    let _ = LocalWriteAnswer::decode(bytes);
    if let Ok(write) = LocalWriteMemory::decode(bytes) {
        assert!(write.parts.len() <= hydrant_proto::local::LOCAL_WRITE_PARTS_MAX as usize);
    }
    accepted.is_ok()
}

fn seeds() -> Vec<Vec<u8>> {
    let name = ObjectName {
        bucket: "datasets".into(),
        key: "train/0001.tar".into(),
    };
    vec![
        FrameHeader::new(Opcode::Put, 7, b"extension", 100, 5)
            .encode()
            .to_vec(),
        HelloRequest {
            version_min: 1,
            version_max: 1,
            limits: Limits::default(),
            client_nonce: [1; 16],
            proof: Some([2; 32]),
        }
        .encode(),
        GetRequest {
            name: name.clone(),
            range_start: 5,
            range_end: Some(9),
        }
        .encode(),
        PutRequest {
            name: name.clone(),
            object_bytes: 1 << 20,
        }
        .encode(),
        ListRequest {
            bucket: "datasets".into(),
            prefix: "train/".into(),
            start_after: None,
            limit: 10,
        }
        .encode(),
        name.encode(),
        LocalWrite {
            region: 1,
            offset: 4096,
            length: 1 << 20,
            condition: LocalCondition::Version(7),
            bucket: "datasets".into(),
            key: "train/0001.tar".into(),
        }
        .encode(),
        LocalWriteMemory {
            parts: vec![(0x7f00_0000_1000, 4096), (0x7f00_0100_0000, 1 << 20)],
            condition: LocalCondition::Absent,
            bucket: "datasets".into(),
            key: "train/0001.tar".into(),
        }
        .encode(),
        LocalWriteAnswer {
            seq: 9,
            bytes: 1 << 20,
            dirty: true,
        }
        .encode(),
    ]
}

#[test]
fn mutated_and_random_inputs_never_panic() {
    let limits = Limits::default();
    let mut random = Random(0x9E37_79B9_7F4A_7C15);
    let seeds = seeds();
    let mut headers_accepted = 0;
    for round in 0..200_000 {
        let mut bytes = if round % 4 == 0 {
            let len = random.below(2 * FRAME_HEADER_BYTES);
            (0..len).map(|_| random.next() as u8).collect()
        } else {
            seeds[random.below(seeds.len())].clone()
        };
        let mutations = if round % 8 == 1 {
            0
        } else {
            1 + random.below(4)
        };
        for _ in 0..mutations {
            match random.below(4) {
                0 if !bytes.is_empty() => {
                    let at = random.below(bytes.len());
                    bytes[at] ^= 1 << random.below(8);
                }
                1 if !bytes.is_empty() => {
                    let len = random.below(bytes.len());
                    bytes.truncate(len);
                }
                2 => bytes.push(random.next() as u8),
                _ if bytes.len() >= 2 => {
                    let at = random.below(bytes.len() - 1);
                    bytes.swap(at, at + 1);
                }
                _ => {}
            }
        }
        headers_accepted += usize::from(decode_everything(&bytes, &limits));
    }
    assert!(
        headers_accepted > 0,
        "unmutated seeds decode, so the loop exercised the accepting path"
    );
}
