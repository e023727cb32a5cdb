//! Every decoder of hydrant-proto on arbitrary bytes: none may panic, and a header it accepts
//! never announces more than the limits allow.
#![no_main]

use hydrant_proto::message::{
    BatchGetRequest, BatchItem, FlushRequest, GetRequest, HelloRequest, HelloResponse,
    ListEntries, ListRequest, Message, ObjectInfo, ObjectName, PlanKeys, PlanRequest,
    PrefetchRequest, PutRequest, UploadsAnswer, UploadsRequest,
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
    let _ = PrefetchRequest::decode(data);
    let _ = FlushRequest::decode(data);
    let _ = UploadsRequest::decode(data);
    let _ = UploadsAnswer::decode(data);
    let _ = PlanRequest::decode(data);
    let _ = PlanKeys::decode(data);
});
