//! One handler per operation: GET (from memory where it arrived, or on the owning shard), PUT,
//! HEAD, DELETE, LIST, PREFETCH, FLUSH, STATS and BATCH_GET.

use super::*;

/// Answer a GET where it arrived, without a task of its own, when its key is this shard's and
/// the DRAM tier holds the current version (the common case of small hot objects: no wait is
/// possible). Returns false, having counted and sent nothing (the object may be marked visited
/// on NVMe, as the usual path's read would), when the request must take the usual
/// path (it may then still be a DRAM hit: this path only skips what must not wait).
pub(super) fn answer_from_memory(
    connection: &Rc<Connection>,
    header: &FrameHeader,
    extension: &[u8],
    payload_bytes_in: usize,
) -> bool {
    // From the turn that received the frame: no clock read here.
    let started = time::now_coarse();
    let Ok(request) = GetRequestRef::decode(extension) else {
        return false;
    };
    let Ok(key) = ObjectKey::new(request.name.bucket, request.name.key) else {
        return false;
    };
    let cache = &connection.cache;
    if connection.engine.shard_of(&key) != cache.shard() as usize {
        return false;
    }
    let range = ByteRange {
        start: request.range_start,
        end: request.range_end,
    };
    let budget = &connection.answer_budget;
    let Some((read, reservation)) = cache.get_memory(&key, Some(range), |bytes| {
        budget.try_reserve(bytes as usize)
    }) else {
        return false;
    };
    let info = ObjectInfo {
        object_bytes: read.bytes,
        seq: read.seq,
        dirty: read.dirty,
        range_start: read.start,
    };
    let payload_bytes = read.data.len();
    metrics::count_copies(metrics::PATH_TCP, read.copied_bytes, payload_bytes as u64);
    let held = HeldBytes {
        body: Body::Read(read.data),
        _reservation: Some(reservation),
    };
    let extension_out = info.to_bytes();
    connection.answer_held(header, Status::Ok, &extension_out, Some(Rc::new(held)));
    let bytes_in = FRAME_HEADER_BYTES + extension.len() + payload_bytes_in;
    let bytes_out = FRAME_HEADER_BYTES + extension_out.len() + payload_bytes;
    metrics::record_request(Opcode::Get, true, started.elapsed(), bytes_in, bytes_out);
    metrics::count(|counters| counters.answered_on_arrival += 1);
    true
}

pub(super) async fn request(
    connection: Rc<Connection>,
    header: FrameHeader,
    extension: Vec<u8>,
    payload: Vec<u8>,
    permit: OwnedPermit,
) {
    let started = time::now_coarse();
    let bytes_in = FRAME_HEADER_BYTES + extension.len() + payload.len();
    if header.opcode == Opcode::BatchGet {
        let ok = batch_get(&connection, &header, &extension).await;
        metrics::record_request(header.opcode, ok, started.elapsed(), bytes_in, 0);
        drop(permit);
        return;
    }
    if header.opcode == Opcode::Get {
        let (ok, bytes_out) = match GetRequest::decode(&extension) {
            Ok(request) => super::stream::answer_get(&connection, &header, request).await,
            Err(error) => {
                let (status, message) = bad_request(error);
                connection.answer(&header, status, &[], message.as_bytes());
                (false, FRAME_HEADER_BYTES + message.len())
            }
        };
        metrics::record_request(header.opcode, ok, started.elapsed(), bytes_in, bytes_out);
        drop(permit);
        return;
    }
    let (ok, bytes_out) = match respond(&connection, &header, &extension, payload).await {
        Ok((extension, payload)) => {
            let payload_bytes = payload.as_ref().map_or(0, |held| held.len());
            connection.answer_held(&header, Status::Ok, &extension, payload);
            (true, FRAME_HEADER_BYTES + extension.len() + payload_bytes)
        }
        Err((status, message)) => {
            connection.answer(&header, status, &[], message.as_bytes());
            (false, FRAME_HEADER_BYTES + message.len())
        }
    };
    metrics::record_request(header.opcode, ok, started.elapsed(), bytes_in, bytes_out);
    drop(permit);
}

pub(super) type Answer = Result<(Vec<u8>, Option<Rc<HeldBytes>>), (Status, String)>;

pub(super) fn owned_payload(bytes: Vec<u8>) -> Option<Rc<HeldBytes>> {
    (!bytes.is_empty()).then(|| Rc::new(HeldBytes::owned(bytes)))
}

pub(super) fn bad_request(error: ProtoError) -> (Status, String) {
    (Status::for_error(&error), error.to_string())
}

pub(crate) fn engine_failure(error: hydrant_engine::Error) -> (Status, String) {
    let status = match error.kind() {
        ErrorKind::InvalidKey => Status::InvalidKey,
        ErrorKind::InvalidRange => Status::InvalidRange,
        ErrorKind::TooLarge | ErrorKind::AttributesTooLarge => Status::TooLarge,
        ErrorKind::ChecksumMismatch => Status::DataCorrupt,
        ErrorKind::NoSpace => Status::NoSpace,
        ErrorKind::StoreFailed => Status::StoreFailed,
        ErrorKind::ShuttingDown => Status::ShuttingDown,
        ErrorKind::OriginUnavailable => Status::OriginUnavailable,
        ErrorKind::OriginRefused => Status::OriginRefused,
        ErrorKind::ReadOnly => Status::ReadOnly,
        ErrorKind::PreconditionFailed => Status::PreconditionFailed,
        ErrorKind::Busy => Status::Busy,
        ErrorKind::Timeout => Status::Timeout,
        _ => Status::Internal,
    };
    (status, error.to_string())
}

pub(super) fn object_key(name: &ObjectName) -> Result<ObjectKey, (Status, String)> {
    ObjectKey::new(&name.bucket, &name.key).map_err(engine_failure)
}

/// Run `call` on the shard that owns `key`: here, or through the engine's inbox of that shard.
pub(super) async fn on_owner<T, F, Fut>(
    connection: &Connection,
    key: &ObjectKey,
    call: F,
) -> hydrant_engine::Result<T>
where
    T: Send + 'static,
    F: FnOnce(Rc<Cache>) -> Fut + Send + 'static,
    Fut: Future<Output = hydrant_engine::Result<T>> + 'static,
{
    let shard = connection.engine.shard_of(key);
    if shard == connection.cache.shard() as usize {
        call(connection.cache.clone()).await
    } else {
        metrics::count(|counters| counters.requests_forwarded += 1);
        connection.engine.on_shard(shard, call).await
    }
}

/// What an answer says about a stored object (from its start).
pub(super) fn info_of(meta: &hydrant_engine::ObjectMeta) -> ObjectInfo {
    ObjectInfo {
        object_bytes: meta.bytes,
        seq: meta.seq,
        dirty: meta.dirty,
        range_start: 0,
    }
}

/// The bytes a read of `range` returns from an object of `object_bytes`.
pub(super) fn range_bytes(range: ByteRange, object_bytes: u64) -> u64 {
    let end = range.end.unwrap_or(object_bytes).min(object_bytes);
    end.saturating_sub(range.start)
}

/// What the owning shard found for a GET: the bytes (read), or only the size when the answer is
/// large enough that room must be reserved for it first.
pub(super) enum Found {
    /// The info, the bytes gathered to cross shards, the origin version's tag.
    Read((ObjectInfo, Vec<u8>, u64)),
    Sized(u64),
}

/// What a GET read: the answer's info, its bytes where they lie, and (for data read through
/// from the origin) the origin version's tag (`ReadData::origin_version`).
pub(super) struct Got {
    pub(super) info: ObjectInfo,
    pub(super) held: Rc<HeldBytes>,
    pub(super) origin_version: u64,
}

/// One GET, on the shard that owns its key. With `bytes_max`, a read that would return more
/// is refused from the object's size before anything is read. Room for the answer's bytes is
/// reserved in the connection's budget before they are read when the store knows the object's
/// size (objects read through from the origin are reserved for once read: their size is not
/// known before). On this shard the bytes stay where the read left them; from another shard
/// they come as a vector.
pub(super) async fn get_object(
    connection: &Connection,
    request: GetRequest,
    bytes_max: Option<u64>,
) -> Result<Got, (Status, String)> {
    let key = object_key(&request.name)?;
    let range = ByteRange {
        start: request.range_start,
        end: request.range_end,
    };
    let not_found = || {
        (
            Status::NotFound,
            format!("{}/{} is not stored", request.name.bucket, request.name.key),
        )
    };
    let budget = &connection.answer_budget;
    let shard = connection.engine.shard_of(&key);
    if shard == connection.cache.shard() as usize {
        let cache = connection.cache.clone();
        let size = cache
            .stored_bytes(&key)
            .map(|bytes| range_bytes(range, bytes));
        check_item_size(size, bytes_max).map_err(engine_failure)?;
        // Room is reserved before any bytes are held: the size the index knows, or, for an
        // object read through from the origin, a chunk's worth until the origin tells its size
        // (a larger answer is then not read until its room is reserved).
        let mut room = size.unwrap_or(UNSIZED_ANSWER_RESERVED_BYTES);
        loop {
            let mut reservation = budget.reserve(room as usize).await;
            // The wait for room may have let a larger version in.
            let now = cache
                .stored_bytes(&key)
                .map(|bytes| range_bytes(range, bytes));
            if let Some(now) = now.filter(|&now| now > room) {
                check_item_size(Some(now), bytes_max).map_err(engine_failure)?;
                room = now;
                continue;
            }
            let read = match cache
                .get_parts_within(&key, Some(range), room)
                .await
                .map_err(engine_failure)?
                .ok_or_else(not_found)?
            {
                Within::Read(read) => read,
                Within::Sized(bytes) => {
                    check_item_size(Some(bytes), bytes_max).map_err(engine_failure)?;
                    room = bytes;
                    continue;
                }
            };
            reservation.shrink_to(read.data.len());
            let info = ObjectInfo {
                object_bytes: read.bytes,
                seq: read.seq,
                dirty: read.dirty,
                range_start: read.start,
            };
            metrics::count_copies(metrics::PATH_TCP, read.copied_bytes, read.data.len() as u64);
            let origin_version = read.origin_version;
            let held = HeldBytes {
                body: Body::Read(read.data),
                _reservation: Some(reservation),
            };
            return Ok(Got {
                info,
                held: Rc::new(held),
                origin_version,
            });
        }
    }
    // Another shard's key: small answers come back in one hop; a large one first says its size,
    // then is read once its room is reserved.
    metrics::count(|counters| counters.requests_forwarded += 1);
    let mut reserved: Option<(Reservation, u64)> = None;
    loop {
        let room = reserved.as_ref().map(|(_, room)| *room);
        let key = key.clone();
        let found = connection
            .engine
            .on_shard(shard, move |cache: Rc<Cache>| async move {
                let size = cache
                    .stored_bytes(&key)
                    .map(|bytes| range_bytes(range, bytes));
                check_item_size(size, bytes_max)?;
                let room = room.unwrap_or(ANSWER_RESERVED_AFTER_BYTES_MAX);
                if let Some(size) = size.filter(|&size| size > room) {
                    return Ok(Some(Found::Sized(size)));
                }
                let read = match cache.get_parts_within(&key, Some(range), room).await? {
                    None => return Ok(None),
                    Some(Within::Sized(bytes)) => {
                        check_item_size(Some(bytes), bytes_max)?;
                        return Ok(Some(Found::Sized(bytes)));
                    }
                    Some(Within::Read(read)) => read,
                };
                let info = ObjectInfo {
                    object_bytes: read.bytes,
                    seq: read.seq,
                    dirty: read.dirty,
                    range_start: read.start,
                };
                // Gathered into a vector to cross to the connection's shard (a copy, counted
                // in `gathered`, unless the bytes already were one).
                let (data, gathered) = read.data.into_vec();
                let copied = read.copied_bytes + gathered;
                metrics::count_copies(metrics::PATH_TCP, copied, data.len() as u64);
                Ok(Some(Found::Read((info, data, read.origin_version))))
            })
            .await
            .map_err(engine_failure)?
            .ok_or_else(not_found)?;
        match found {
            Found::Sized(size) => {
                // Given back before waiting for the larger room.
                drop(reserved.take());
                reserved = Some((budget.reserve(size as usize).await, size));
            }
            Found::Read((info, data, origin_version)) => {
                let reservation = match reserved {
                    Some((mut reservation, _)) => {
                        reservation.shrink_to(data.len());
                        reservation
                    }
                    // At most ANSWER_RESERVED_AFTER_BYTES_MAX, read before its room.
                    None => budget.reserve(data.len()).await,
                };
                let held = HeldBytes {
                    body: Body::Owned(data),
                    _reservation: Some(reservation),
                };
                return Ok(Got {
                    info,
                    held: Rc::new(held),
                    origin_version,
                });
            }
        }
    }
}

/// Refuse a batch item whose answer would exceed `bytes_max`, from its size.
pub(super) fn check_item_size(
    size: Option<u64>,
    bytes_max: Option<u64>,
) -> hydrant_engine::Result<()> {
    match (size, bytes_max) {
        (Some(size), Some(bytes_max)) if size > bytes_max => Err(hydrant_engine::Error::new(
            ErrorKind::TooLarge,
            format!(
                "{size} bytes exceed the payload limit of {bytes_max}; get this item on its own"
            ),
        )),
        _ => Ok(()),
    }
}

/// BATCH_GET: every item answered by a frame of its own, as it completes (or in request order
/// with IN_ORDER); every answer but the last carries MORE. Returns whether the batch was valid.
pub(super) async fn batch_get(
    connection: &Rc<Connection>,
    header: &FrameHeader,
    extension: &[u8],
) -> bool {
    let request = match BatchGetRequest::decode(extension) {
        Ok(request) => request,
        Err(error) => {
            connection.answer(
                header,
                Status::for_error(&error),
                &[],
                error.to_string().as_bytes(),
            );
            return false;
        }
    };
    let items_max = connection.limits.get().batch_items_max as usize;
    if request.items.len() > items_max {
        let message = format!(
            "{} items exceed the batch limit of {items_max}",
            request.items.len()
        );
        connection.answer(header, Status::TooLarge, &[], message.as_bytes());
        return false;
    }
    let total = request.items.len();
    let answered = Rc::new(Cell::new(0usize));
    if header.flags.contains(FrameFlags::IN_ORDER) {
        for (index, item) in request.items.into_iter().enumerate() {
            let bytes_max = connection.limits.get().payload_bytes_max;
            let result = get_object(connection, item, Some(bytes_max)).await;
            answer_item(connection, header, index, result, &answered, total);
        }
    } else {
        // An item becomes a task only once it has one of the connection's item permits, so a
        // connection holds at most BATCH_ITEMS_IN_FLIGHT_MAX item tasks however many batches
        // and items it sends.
        let finished = Rc::new(WaitQueue::new());
        for (index, item) in request.items.into_iter().enumerate() {
            let permit = connection.batch_items.clone().acquire_owned().await;
            let connection = connection.clone();
            let answered = answered.clone();
            let finished = finished.clone();
            let header = *header;
            spawn(async move {
                let bytes_max = connection.limits.get().payload_bytes_max;
                let result = get_object(&connection, item, Some(bytes_max)).await;
                answer_item(&connection, &header, index, result, &answered, total);
                drop(permit);
                finished.wake_all();
            });
        }
        while answered.get() < total {
            finished.wait().await;
        }
    }
    true
}

pub(super) fn answer_item(
    connection: &Connection,
    request: &FrameHeader,
    index: usize,
    result: Result<Got, (Status, String)>,
    answered: &Cell<usize>,
    total: usize,
) {
    answered.set(answered.get() + 1);
    let payload_max = connection.limits.get().payload_bytes_max;
    let result = match result {
        Ok(got) if got.held.len() as u64 > payload_max => Err((
            Status::TooLarge,
            format!(
                "{} bytes exceed the payload limit of {payload_max}; get this item on its own",
                got.held.len()
            ),
        )),
        other => other,
    };
    let (status, info, payload) = match result {
        Ok(got) => (Status::Ok, Some(got.info), got.held),
        Err((status, message)) => (
            status,
            None,
            Rc::new(HeldBytes::owned(message.into_bytes())),
        ),
    };
    let extension = BatchItem {
        item: index as u32,
        info,
    }
    .encode();
    let range = 0..payload.len();
    let mut header = FrameHeader::response(request, status as u8, &extension, &[]);
    header.payload_len = range.len() as u64;
    header.payload_crc = if range.is_empty() {
        0
    } else {
        payload.crc(range.clone())
    };
    if answered.get() < total {
        header.flags = header.flags.with(FrameFlags::MORE);
    }
    connection.queue(out_frame(&header, &extension, Some(payload), range));
}

pub(super) async fn respond(
    connection: &Connection,
    header: &FrameHeader,
    extension: &[u8],
    payload: Vec<u8>,
) -> Answer {
    match header.opcode {
        Opcode::Ping => Ok((Vec::new(), None)),
        Opcode::Get => unreachable!("GETs are answered by stream::answer_get"),
        Opcode::Put => {
            let request = PutRequest::decode(extension).map_err(bad_request)?;
            if request.object_bytes != payload.len() as u64 {
                return Err((
                    Status::BadRequest,
                    "object_bytes differs from the payload length".into(),
                ));
            }
            let key = object_key(&request.name)?;
            let meta = on_owner(connection, &key.clone(), move |cache| async move {
                cache
                    .put(key, payload, Precondition::Any, None, Vec::new())
                    .await
            })
            .await
            .map_err(engine_failure)?;
            let info = info_of(&meta);
            Ok((info.encode(), None))
        }
        Opcode::Head => {
            let name = ObjectName::decode(extension).map_err(bad_request)?;
            let key = object_key(&name)?;
            let meta = on_owner(connection, &key.clone(), move |cache| async move {
                cache.head(&key).await
            })
            .await
            .map_err(engine_failure)?;
            match meta {
                Some(meta) => {
                    let info = info_of(&meta);
                    Ok((info.encode(), None))
                }
                None => Err((
                    Status::NotFound,
                    format!("{}/{} is not stored", name.bucket, name.key),
                )),
            }
        }
        Opcode::Delete => {
            let name = ObjectName::decode(extension).map_err(bad_request)?;
            let key = object_key(&name)?;
            let existed = on_owner(connection, &key.clone(), move |cache| async move {
                cache.delete(key).await
            })
            .await
            .map_err(engine_failure)?;
            if existed {
                Ok((Vec::new(), None))
            } else {
                Err((
                    Status::NotFound,
                    format!("{}/{} is not stored", name.bucket, name.key),
                ))
            }
        }
        Opcode::Stats => {
            let text = metrics::gather(&connection.engine)
                .await
                .map_err(engine_failure)?;
            Ok((Vec::new(), owned_payload(text.into_bytes())))
        }
        Opcode::List => {
            let request = ListRequest::decode(extension).map_err(bad_request)?;
            let limit = (request.limit as usize).min(LIST_ENTRIES_MAX);
            let listed = connection
                .engine
                .list(
                    &request.bucket,
                    &request.prefix,
                    request.start_after.as_deref(),
                    limit,
                )
                .await
                .map_err(engine_failure)?;
            let entries = listed
                .into_iter()
                .map(|meta| ListEntry {
                    key: meta.key,
                    object_bytes: meta.bytes,
                    seq: meta.seq,
                    dirty: meta.dirty,
                })
                .collect();
            Ok((Vec::new(), owned_payload(ListEntries { entries }.encode())))
        }
        Opcode::Prefetch => {
            let request = PrefetchRequest::decode(extension).map_err(bad_request)?;
            let (objects, bytes) = connection
                .engine
                .prefetch(
                    &request.bucket,
                    &request.prefix,
                    request.keys,
                    PREFETCH_READS_IN_FLIGHT,
                )
                .await
                .map_err(engine_failure)?;
            Ok((PrefetchResult { objects, bytes }.encode(), None))
        }
        Opcode::Plan => {
            let request = PlanRequest::decode(extension).map_err(bad_request)?;
            let keys = PlanKeys::decode(&payload).map_err(bad_request)?;
            let keys = connection
                .engine
                .plan(
                    &request.bucket,
                    request.plan_id,
                    keys.keys,
                    request.window_bytes,
                    Duration::from_millis(request.idle_ms as u64),
                )
                .await
                .map_err(engine_failure)?;
            Ok((PlanResult { keys }.encode(), None))
        }
        Opcode::Flush => {
            let request = FlushRequest::decode(extension).map_err(bad_request)?;
            connection
                .engine
                .flush(
                    request.bucket.as_deref(),
                    &request.prefix,
                    Duration::from_millis(request.timeout_ms as u64),
                )
                .await
                .map_err(engine_failure)?;
            Ok((Vec::new(), None))
        }
        Opcode::Uploads => {
            let request = UploadsRequest::decode(extension).map_err(bad_request)?;
            let (listed, total) = connection
                .engine
                .refused_uploads(
                    request.bucket.as_deref(),
                    &request.prefix,
                    request.retry,
                    request.limit as usize,
                )
                .await
                .map_err(engine_failure)?;
            let refused = listed
                .into_iter()
                .map(|failed| RefusedUpload {
                    bucket: failed.bucket,
                    key: failed.key,
                    seq: failed.seq,
                    object_bytes: failed.bytes,
                    reason: failed.reason,
                })
                .collect();
            let answer = UploadsAnswer {
                total: total as u64,
                refused,
            };
            Ok((Vec::new(), owned_payload(answer.encode())))
        }
        other => Err((
            Status::Unsupported,
            format!("{other:?} is not supported yet"),
        )),
    }
}
