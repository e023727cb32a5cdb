//! Every decoder of hydrant-proto on arbitrary bytes: none may panic, and a header it accepts
//! never announces more than the limits allow.
#![no_main]

use hydrant_proto::message::{
    BatchGetRequest, BatchItem, GetRequest, HelloRequest, HelloResponse, ListEntries, ListRequest,
    Message, ObjectInfo, ObjectName, PutRequest,
};
use hydrant_proto::{FrameHeader, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    if let Ok(header) = FrameHeader::decode(data, &limits) {
        assert!(header.extension_len <= limits.extension_bytes_max);
        assert!(header.payload_len <= limits.payload_bytes_max);
    }
    let _ = FrameHeader::salvage(data);
    let _ = HelloRequest::decode(data);
    let _ = HelloResponse::decode(data);
    let _ = ObjectName::decode(data);
    let _ = GetRequest::decode(data);
    let _ = PutRequest::decode(data);
    let _ = ObjectInfo::decode(data);
    let _ = ListRequest::decode(data);
    let _ = ListEntries::decode(data);
    let _ = BatchGetRequest::decode(data);
    let _ = BatchItem::decode(data);
});
