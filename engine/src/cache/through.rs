//! Read-through: revalidating stale copies, reading what NVMe lacks from the origin (one
//! coalesced request per chunk), reading ahead, and admitting what came back.

use super::*;

impl Cache {
    /// Check a clean whole-object copy (version `seq` on NVMe) whose TTL ran out. Up to a
    /// chunk: a conditional GET with the cached ETag (304 keeps the copy, 200 replaces it).
    /// Larger (written through this node): a HEAD compared with the ETag the upload got.
    pub(super) async fn revalidate(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        seq: u64,
        range: Option<ByteRange>,
    ) -> Result<Revalidated> {
        let chunk_bytes = self.chunk_bytes();
        let seen = origin.reads.last_seen(key);
        let path = route.path(key.key())?;
        let origins = origin.origins.clone();
        // What the origin says is remembered only if no write or delete of the key began
        // meanwhile (it may predate one).
        let watch = origin.reads.watch(key);
        if self
            .store
            .head(key)
            .is_some_and(|meta| meta.bytes > chunk_bytes)
        {
            let found = origins
                .run(remote::head(origins.clone(), route.clone(), path))
                .await?;
            let same = match (&found, &seen) {
                (Some(found), Some(seen)) => found.etag.is_some() && *found == *seen,
                _ => false,
            };
            if same && watch.unchanged() {
                origin.reads.confirm(key);
                return Ok(Revalidated::Current);
            }
            self.drop_copy(key, seq).await?;
            return Ok(match found {
                Some(_) => Revalidated::ReadThrough,
                None => {
                    origin.reads.forget(key);
                    Revalidated::Gone
                }
            });
        }
        let condition = match seen.and_then(|seen| seen.etag) {
            Some(etag) => Condition::IfNoneMatch(etag),
            None => Condition::None,
        };
        let fetched = origins
            .run(remote::fetch(
                origins.clone(),
                route.clone(),
                path,
                None,
                chunk_bytes,
                condition,
            ))
            .await?;
        match fetched {
            Fetch::NotModified => {
                origin.reads.confirm(key);
                Ok(Revalidated::Current)
            }
            Fetch::NotFound => {
                origin.reads.forget(key);
                self.drop_copy(key, seq).await?;
                Ok(Revalidated::Gone)
            }
            Fetch::Changed => Ok(Revalidated::ReadThrough),
            Fetch::Data {
                version,
                start: _,
                data,
            } => {
                if version.bytes > chunk_bytes {
                    if watch.unchanged() {
                        origin.reads.remember(key, version);
                    }
                    self.drop_copy(key, seq).await?;
                    return Ok(Revalidated::ReadThrough);
                }
                let read = answer(&version, 0, &data, range)?;
                let _guard = self.locks.lock(key).await;
                if stored_seq(&self.store, key) == Some(seq) && watch.unchanged() {
                    origin.reads.remember(key, version.clone());
                    put_from_origin(&self.store, key, &data, &version).await?;
                }
                Ok(Revalidated::Replaced(read))
            }
        }
    }

    /// Delete the copy of `key` if it is still version `seq` (and clean): an origin read found
    /// it outdated, and no write has replaced it since.
    pub(super) async fn drop_copy(&self, key: &ObjectKey, seq: u64) -> Result<()> {
        let _guard = self.locks.lock(key).await;
        let unchanged = self
            .store
            .head(key)
            .is_some_and(|meta| meta.seq == seq && !meta.dirty);
        if unchanged {
            self.store.delete(key.clone()).await?;
        }
        Ok(())
    }

    /// Read from the origin what NVMe does not hold, admitting it as it arrives.
    pub(super) async fn read_through(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        range: Option<ByteRange>,
        bytes_max: Option<u64>,
    ) -> Result<Through> {
        let chunk_bytes = self.chunk_bytes();
        let mut discovered = None;
        let version = match origin.reads.fresh(key, route.revalidate) {
            Some(version) => version,
            None => {
                // The first read of an unknown object: its first chunk (the whole object when
                // small), which also tells its size and ETag.
                let fetched = self.fetch_chunk(origin, route, key, DISCOVER, None).await?;
                match &*fetched {
                    Fetch::Data { version, data, .. } => {
                        let (start, end) = resolve_range(range, version.bytes)?;
                        if bytes_max.is_some_and(|bytes_max| end - start > bytes_max) {
                            return Ok(Through::Sized(Oversized {
                                bytes: version.bytes,
                                start,
                                len: end - start,
                            }));
                        }
                        if version.bytes <= chunk_bytes || data_covers(range, data.len() as u64) {
                            return Ok(Through::Read(answer(version, 0, data, range)?));
                        }
                        let version = version.clone();
                        discovered = Some(fetched);
                        version
                    }
                    Fetch::NotFound => return Ok(Through::NotFound),
                    Fetch::Changed | Fetch::NotModified => return Ok(Through::Changed),
                }
            }
        };
        let (start, end) = resolve_range(range, version.bytes)?;
        if bytes_max.is_some_and(|bytes_max| end - start > bytes_max) {
            return Ok(Through::Sized(Oversized {
                bytes: version.bytes,
                start,
                len: end - start,
            }));
        }
        if end - start > ORIGIN_READ_BYTES_MAX {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "{} bytes of {}/{} asked for at once; read at most {ORIGIN_READ_BYTES_MAX} bytes per request (use ranges)",
                    end - start,
                    key.bucket(),
                    key.key()
                ),
            ));
        }
        if start == end {
            return Ok(Through::Read(CacheRead {
                bytes: version.bytes,
                seq: 0,
                dirty: false,
                stamp: version.stamp(),
                start,
                data: Vec::new(),
                from_origin: false,
                origin_version: version_tag(&version),
                origin_attributes: Some(version.attributes.clone()),
            }));
        }
        if version.bytes <= chunk_bytes {
            let fetched = self
                .fetch_chunk(origin, route, key, 0, Some(&version))
                .await?;
            return Ok(match &*fetched {
                Fetch::Data {
                    version: fetched_version,
                    data,
                    ..
                } if *fetched_version == version => {
                    Through::Read(answer(&version, 0, data, range)?)
                }
                Fetch::NotFound => Through::NotFound,
                _ => Through::Changed,
            });
        }
        let first = start / chunk_bytes;
        let last = (end - 1) / chunk_bytes;
        let mut data = Vec::with_capacity((end - start) as usize);
        let mut from_origin = false;
        for chunk in first..=last {
            let chunk_start = chunk * chunk_bytes;
            let chunk_end = (chunk_start + chunk_bytes).min(version.bytes);
            let wanted = start.max(chunk_start)..end.min(chunk_end);
            let chunk_key = chunk_key(key, &version, chunk);
            let first_chunk = if chunk == 0 { discovered.take() } else { None };
            if let (Some(chunk_key), None) = (&chunk_key, &first_chunk) {
                let inner = ByteRange {
                    start: wanted.start - chunk_start,
                    end: Some(wanted.end - chunk_start),
                };
                if let Some(read) = self.store.get(chunk_key, Some(inner)).await? {
                    data.extend_from_slice(&read.to_vec());
                    continue;
                }
            }
            from_origin = true;
            let fetched = match first_chunk {
                Some(fetched) => fetched,
                None => {
                    self.fetch_chunk(origin, route, key, chunk, Some(&version))
                        .await?
                }
            };
            match &*fetched {
                Fetch::Data {
                    version: fetched_version,
                    start: fetched_start,
                    data: fetched_data,
                } if *fetched_version == version => {
                    let covered = *fetched_start <= wanted.start
                        && wanted.end <= fetched_start + fetched_data.len() as u64;
                    if !covered {
                        return Err(Error::new(
                            ErrorKind::OriginUnavailable,
                            format!(
                                "origin {} returned a short chunk {chunk} of {}/{}",
                                route.url,
                                key.bucket(),
                                key.key()
                            ),
                        ));
                    }
                    let offset = (wanted.start - fetched_start) as usize;
                    let length = (wanted.end - wanted.start) as usize;
                    data.extend_from_slice(&fetched_data[offset..offset + length]);
                }
                Fetch::NotFound => return Ok(Through::NotFound),
                // Another version than the one this read is pinned to: start over.
                _ => return Ok(Through::Changed),
            }
        }
        if origin.reads.note_sequential(key, first, last) {
            self.read_ahead(origin, route, key, &version, last);
        }
        Ok(Through::Read(CacheRead {
            bytes: version.bytes,
            seq: 0,
            dirty: false,
            stamp: version.stamp(),
            start,
            data,
            from_origin,
            origin_version: version_tag(&version),
            origin_attributes: Some(version.attributes.clone()),
        }))
    }

    /// Start fetching the chunks after `last` for a sequential reader, unless cached or in
    /// flight.
    pub(super) fn read_ahead(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        version: &OriginVersion,
        last: u64,
    ) {
        let chunks = version.bytes.div_ceil(self.chunk_bytes());
        for chunk in last + 1..(last + 1 + READAHEAD_CHUNKS).min(chunks) {
            let Some(chunk_key) = chunk_key(key, version, chunk) else {
                return; // nowhere to keep it
            };
            if origin.reads.flights() >= READAHEAD_FLIGHTS_MAX {
                return;
            }
            if self.store.head(&chunk_key).is_some()
                || origin.reads.in_flight(&(key.clone(), chunk))
            {
                continue;
            }
            let fetch = self.start_fetch(origin, route, key, chunk, Some(version));
            crate::rt::spawn(async move {
                let _ = fetch.await;
            });
        }
    }

    pub(super) async fn fetch_chunk(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        chunk: u64,
        version: Option<&OriginVersion>,
    ) -> Result<Rc<Fetch>> {
        self.start_fetch(origin, route, key, chunk, version).await
    }

    /// The coalesced origin read of `chunk` of `key` (`DISCOVER`: its first chunk, version
    /// unknown), admitted to the store when it arrives.
    pub(super) fn start_fetch(
        &self,
        origin: &ShardOrigin,
        route: &Arc<Route>,
        key: &ObjectKey,
        chunk: u64,
        version: Option<&OriginVersion>,
    ) -> impl std::future::Future<Output = Result<Rc<Fetch>>> + 'static {
        let chunk_bytes = self.chunk_bytes();
        let origins = origin.origins.clone();
        let reads = origin.reads.clone();
        let store = self.store.clone();
        let locks = self.locks.clone();
        let admission = self.admission.clone();
        admission.record_miss(key, store.object_count());
        let path = route.path(key.key());
        let route = route.clone();
        let key = key.clone();
        let version = version.cloned();
        // What the key holds now, and whether it is written or deleted from now on: a flight's
        // data is admitted only if it still holds that and nothing changed it.
        let seen_seq = stored_seq(&store, &key);
        let watch = reads.watch(&key);
        async move {
            let path = path?;
            let (range, condition) = match &version {
                None => (None, Condition::None),
                Some(version) => {
                    let etag = version
                        .etag
                        .clone()
                        .map_or(Condition::None, Condition::IfMatch);
                    if version.bytes <= chunk_bytes {
                        (None, etag)
                    } else {
                        let start = chunk * chunk_bytes;
                        let end = (start + chunk_bytes).min(version.bytes);
                        (Some(start..end), etag)
                    }
                }
            };
            let fetch = move || {
                origins.run(remote::fetch(
                    origins.clone(),
                    route,
                    path,
                    range,
                    chunk_bytes,
                    condition,
                ))
            };
            let admitted_reads = reads.clone();
            let admitted_key = key.clone();
            let flight_watch = watch.clone();
            let admit = move |fetched: Rc<Fetch>| async move {
                let admitting = Admission {
                    store: &store,
                    reads: &admitted_reads,
                    locks: &locks,
                    admission: &admission,
                    key: &admitted_key,
                    seen_seq,
                    watch: &watch,
                    chunk_bytes,
                };
                admitting.admit(&fetched).await;
            };
            reads
                .coalesced((key, chunk), flight_watch, fetch, admit)
                .await
        }
    }

    /// The object's metadata: from NVMe, else from the origin (HEAD, remembered for the
    /// metadata TTL).
    pub async fn head(&self, key: &ObjectKey) -> Result<Option<ObjectMeta>> {
        if let Some(meta) = self.store.head(key) {
            return Ok(Some(meta));
        }
        let Some((origin, route)) = self.route(key)? else {
            return Ok(None);
        };
        let metadata_ttl = Revalidate::Ttl(origin.origins.config().metadata_ttl);
        let version = match origin.reads.fresh(key, metadata_ttl) {
            Some(version) => Some(version),
            None => {
                let path = route.path(key.key())?;
                let origins = origin.origins.clone();
                let watch = origin.reads.watch(key);
                let found = origins
                    .run(remote::head(origins.clone(), route.clone(), path))
                    .await?;
                // What a HEAD racing a write or delete saw may be older than it: not kept.
                match &found {
                    Some(version) if watch.unchanged() => {
                        origin.reads.remember(key, version.clone())
                    }
                    _ => origin.reads.forget(key),
                }
                found
            }
        };
        Ok(version.map(|version| ObjectMeta {
            bucket: key.bucket().to_string(),
            key: key.key().to_string(),
            bytes: version.bytes,
            seq: 0,
            dirty: false,
            stamp: version.stamp(),
        }))
    }

    /// Read the whole object through into the cache a chunk at a time, as a reader would
    /// (memory bounded by a chunk; the first read tells the size, so no HEAD goes before it);
    /// returns its size, or `None` when neither NVMe nor the origin has it. Not a reader's
    /// read: plans (`plan.rs`) are not told of it.
    pub async fn warm(&self, key: &ObjectKey) -> Result<Option<u64>> {
        let chunk_bytes = self.chunk_bytes();
        let mut start = 0;
        loop {
            let range = ByteRange {
                start,
                end: Some(start + chunk_bytes),
            };
            let Some(Got::Parts(read)) = self.get_to(key, Some(range), None, None).await? else {
                return Ok(None);
            };
            start += chunk_bytes;
            if start >= read.bytes {
                return Ok(Some(read.bytes));
            }
        }
    }
}

/// What checking a stale whole copy found.
pub(super) enum Revalidated {
    Current,
    Replaced(CacheRead),
    Gone,
    /// The copy is gone or outdated: read through from the origin.
    ReadThrough,
}

pub(super) enum Through {
    Read(CacheRead),
    /// Not read: more bytes than the caller has room for.
    Sized(Oversized),
    NotFound,
    /// The origin object changed during the read: start over.
    Changed,
}

/// The chunk key of a large origin object's chunk; `None` when the version has no ETag (two
/// versions of one size could not be told apart) or the key is too long for the suffix.
pub(super) fn chunk_key(key: &ObjectKey, version: &OriginVersion, chunk: u64) -> Option<ObjectKey> {
    version.etag.as_ref()?;
    key.origin_chunk(version_tag(version), chunk)
}

/// Whether data read from the start of an object covers `range`.
pub(super) fn data_covers(range: Option<ByteRange>, available: u64) -> bool {
    range.is_some_and(|range| range.end.is_some_and(|end| end <= available))
}

/// The part of `data` (the object's bytes from `data_start`) that `range` asks for; an error
/// when `data` does not hold all of it.
pub(super) fn answer(
    version: &OriginVersion,
    data_start: u64,
    data: &[u8],
    range: Option<ByteRange>,
) -> Result<CacheRead> {
    let (start, end) = resolve_range(range, version.bytes)?;
    let data_end = data_start + data.len() as u64;
    if start < data_start || end > data_end {
        return Err(Error::new(
            ErrorKind::OriginUnavailable,
            format!("the origin returned bytes {data_start}-{data_end}, not {start}-{end}"),
        ));
    }
    let slice = &data[(start - data_start) as usize..(end - data_start) as usize];
    Ok(CacheRead {
        bytes: version.bytes,
        seq: 0,
        dirty: false,
        stamp: version.stamp(),
        start,
        data: slice.to_vec(),
        from_origin: true,
        origin_version: version_tag(version),
        origin_attributes: Some(version.attributes.clone()),
    })
}

/// Store `data` read from the origin as `key`, with what the origin says of it: its time, its
/// MD5 tag, and its attributes (left out where they do not fit beside the key: the bytes
/// matter more).
async fn put_from_origin(
    store: &Store,
    key: &ObjectKey,
    data: &[u8],
    version: &OriginVersion,
) -> Result<ObjectMeta> {
    let attributes = version.attributes.encode().unwrap_or_default();
    let stamp = version.stamp();
    match store
        .put_stamped(key.clone(), data, false, stamp, &attributes)
        .await
    {
        Err(error) if error.kind() == ErrorKind::AttributesTooLarge => {
            store
                .put_stamped(key.clone(), data, false, stamp, &[])
                .await
        }
        stored => stored,
    }
}

/// Putting what an origin read returned into the store.
pub(super) struct Admission<'a> {
    store: &'a Store,
    reads: &'a Reads,
    locks: &'a Rc<KeyLocks>,
    admission: &'a NvmeAdmission,
    key: &'a ObjectKey,
    /// The key's version on NVMe when the origin read started.
    seen_seq: Option<u64>,
    /// Whether the key was written or deleted since the origin read started.
    watch: &'a Watch,
    chunk_bytes: u64,
}

impl Admission<'_> {
    /// A small object whole under its key, a chunk of a large one under its chunk key; only if
    /// no write or delete of the key began since the read started (else the bytes may predate
    /// an acknowledged write, and neither they nor their version are kept). A failed admission
    /// is logged; the readers already have their data.
    async fn admit(&self, fetched: &Fetch) {
        if !self.watch.unchanged() {
            return;
        }
        let Fetch::Data {
            version,
            start,
            data,
        } = fetched
        else {
            if matches!(fetched, Fetch::NotFound | Fetch::Changed) {
                self.reads.forget(self.key);
            }
            return;
        };
        if !self.admission.admit(
            self.key,
            data.len() as u64,
            self.store.has_room(data.len() as u64),
        ) {
            self.reads.remember(self.key, version.clone());
            return;
        }
        let outcome = if version.bytes <= self.chunk_bytes {
            let _guard = self.locks.lock(self.key).await;
            if stored_seq(self.store, self.key) != self.seen_seq || !self.watch.unchanged() {
                return; // written, deleted or admitted since: this data is not the newest
            }
            if self.store.head(self.key).is_some_and(|meta| meta.dirty) {
                return; // a write not yet at the origin is never replaced by origin bytes
            }
            self.reads.remember(self.key, version.clone());
            put_from_origin(self.store, self.key, data, version)
                .await
                .map(|_| ())
        } else {
            self.reads.remember(self.key, version.clone());
            let chunk = start / self.chunk_bytes;
            match chunk_key(self.key, version, chunk) {
                Some(chunk_key) if start % self.chunk_bytes == 0 => {
                    self.store.put(chunk_key, data, false).await.map(|_| ())
                }
                _ => Ok(()),
            }
        };
        if let Err(error) = outcome {
            log::warn!(
                "could not cache {}/{} from the origin: {error}",
                self.key.bucket(),
                self.key.key()
            );
        }
    }
}
