//! Reads: the DRAM tier, then NVMe, then the origin (through `through`).

use super::*;

impl Cache {
    /// The attributes of version `seq` of `key` as stored here, or for `seq` 0 (an answer
    /// from the origin: data read through, or a HEAD of an object not here) as the origin last
    /// said them; `None` when that version is no longer the stored one.
    pub async fn attributes(
        &self,
        key: &ObjectKey,
        seq: u64,
    ) -> Result<Option<crate::attributes::Attributes>> {
        if seq == 0 {
            let said = match self.route(key) {
                Ok(Some((origin, _))) => origin.reads.last_seen(key),
                _ => None,
            };
            return Ok(Some(
                said.map(|version| (*version.attributes).clone())
                    .unwrap_or_default(),
            ));
        }
        self.store.attributes(key, seq).await
    }

    /// The object (whole, or `range`), from NVMe or through it from the origin. `None` when
    /// neither has it.
    pub async fn get(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Option<CacheRead>> {
        Ok(self
            .get_parts(key, range)
            .await?
            .map(PartsRead::into_cache_read))
    }

    /// Say that reads of `key` want its attributes, until the guard drops (see
    /// `Store::want_attributes`).
    pub fn want_attributes(&self, key: &ObjectKey) -> crate::store::AttributesWanted {
        self.store.want_attributes(key)
    }

    /// Like `get`, but the bytes are left where the read found them (the shard's pinned
    /// buffers, the DRAM tier's copy), so that a caller can copy them once, straight to where
    /// they go. `copied_bytes` says how many bytes the engine copied on the way.
    pub async fn get_parts(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
    ) -> Result<Option<PartsRead>> {
        self.plans.asked(key);
        Ok(self
            .get_to(key, range, None, None)
            .await?
            .map(|got| match got {
                Got::Parts(read) => read,
                Got::Placed(_) | Got::Sized(_) => unreachable!("nothing placed, no bound"),
            }))
    }

    /// Like `get_parts`, but an answer of more than `bytes_max` bytes read through from the
    /// origin is not read: its size comes back instead, once the origin told it (objects on
    /// NVMe are read whatever their size: callers bound those by the size the index knows).
    /// A server reserves room for an answer before its bytes are held.
    pub async fn get_parts_within(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        bytes_max: u64,
    ) -> Result<Option<Within>> {
        self.plans.asked(key);
        Ok(self
            .get_to(key, range, None, Some(bytes_max))
            .await?
            .map(|got| match got {
                Got::Parts(read) => Within::Read(read),
                Got::Sized(oversized) => Within::Sized(oversized.len),
                Got::Placed(_) => unreachable!("nothing is placed without a target"),
            }))
    }

    /// Like `get`, into `target` (a same-host client's region): data on NVMe lands there by
    /// the device's DMA with no CPU copy when `Store::get_into` can do it (and is then not
    /// admitted to the DRAM tier: the region is the reader's copy); a DRAM hit, origin data
    /// and reads that are not suitable are copied in once. Nothing is written when the range
    /// does not fit (`Placed::written` is false).
    pub async fn get_into(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: &ExternalBuf,
    ) -> Result<Option<Placed>> {
        self.plans.asked(key);
        // A range known not to fit is refused before anything is read (when the stored copy is
        // the current version without asking the origin).
        let settled = |meta: &ObjectMeta| -> Result<bool> {
            Ok(meta.dirty
                || self
                    .route(key)?
                    .is_none_or(|(_, route)| route.revalidate == Revalidate::Immutable))
        };
        if let Some(meta) = self
            .store
            .head(key)
            .filter(|meta| settled(meta).unwrap_or(false))
        {
            let (start, end) = resolve_range(range, meta.bytes)?;
            if end - start > target.len() as u64 {
                return Ok(Some(Placed {
                    bytes: meta.bytes,
                    seq: meta.seq,
                    dirty: meta.dirty,
                    start,
                    len: end - start,
                    written: false,
                    from_origin: false,
                    copied_bytes: 0,
                }));
            }
        }
        // Read through from the origin only what fits: an object larger than its place is
        // refused once the origin told its size, not fetched whole first.
        let room = Some(target.len() as u64);
        let Some(got) = self.get_to(key, range, Some(target), room).await? else {
            return Ok(None);
        };
        Ok(Some(match got {
            Got::Placed(read) => Placed {
                bytes: read.bytes,
                seq: read.seq,
                dirty: read.dirty,
                start: read.start,
                len: read.len,
                written: true,
                from_origin: false,
                copied_bytes: 0,
            },
            Got::Sized(oversized) => Placed {
                bytes: oversized.bytes,
                seq: 0,
                dirty: false,
                start: oversized.start,
                len: oversized.len,
                written: false,
                from_origin: true,
                copied_bytes: 0,
            },
            Got::Parts(read) => {
                let len = read.data.len();
                let written = len <= target.len();
                if written {
                    let mut offset = 0;
                    for part in read.data.parts() {
                        target.write_at(offset, part);
                        offset += part.len();
                    }
                }
                Placed {
                    bytes: read.bytes,
                    seq: read.seq,
                    dirty: read.dirty,
                    start: read.start,
                    len: len as u64,
                    written,
                    from_origin: read.from_origin,
                    copied_bytes: read.copied_bytes + if written { len as u64 } else { 0 },
                }
            }
        }))
    }

    pub(super) async fn get_to(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: Option<&ExternalBuf>,
        bytes_max: Option<u64>,
    ) -> Result<Option<Got>> {
        let Some((origin, route)) = self.route(key)? else {
            return self.get_stored(key, range, target).await;
        };
        for _ in 0..READ_ATTEMPTS_MAX {
            if let Some(version) = self.store.version(key) {
                let current = current_without_asking(origin, &route, key, version.dirty)
                    || match self
                        .revalidate(origin, &route, key, version.seq, range)
                        .await?
                    {
                        Revalidated::Current => true,
                        Revalidated::Replaced(read) => {
                            return Ok(Some(Got::Parts(PartsRead::owned(read))))
                        }
                        Revalidated::Gone => return Ok(None),
                        Revalidated::ReadThrough => false,
                    };
                if current {
                    if let Some(read) = self.get_stored(key, range, target).await? {
                        return Ok(Some(read));
                    }
                    continue; // deleted or evicted meanwhile
                }
            }
            match self
                .read_through(origin, &route, key, range, bytes_max)
                .await?
            {
                Through::Read(read) => return Ok(Some(Got::Parts(PartsRead::owned(read)))),
                Through::Sized(bytes) => return Ok(Some(Got::Sized(bytes))),
                Through::NotFound => return Ok(None),
                Through::Changed => origin.reads.forget(key),
            }
        }
        Err(Error::new(
            ErrorKind::OriginUnavailable,
            format!(
                "{}/{} kept changing at the origin while it was read",
                key.bucket(),
                key.key()
            ),
        ))
    }

    /// The object (whole, or `range`) from the DRAM tier, when it holds the version NVMe holds
    /// and that version is current without asking the origin; `None` otherwise (and for a range
    /// outside the object), with nothing counted (the object is marked visited on NVMe all the
    /// same, as the read that follows would): the caller then reads with `get_parts`.
    /// `reserve` is asked for room for the answer's payload bytes before anything is counted; a
    /// `None` from it declines too. Never waits, so a server can answer a hit where the request
    /// arrived.
    pub fn get_memory<R>(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        reserve: impl FnOnce(u64) -> Option<R>,
    ) -> Option<(PartsRead, R)> {
        let dram = self.dram.as_ref()?;
        // Marked visited now: a GET reads the object whichever path answers it.
        let version = self.store.version_touched(key)?;
        if let Some((origin, route)) = self.route(key).ok()? {
            if !current_without_asking(origin, &route, key, version.dirty) {
                return None;
            }
        }
        let (start, end) = resolve_range(range, version.bytes).ok()?;
        let reservation = reserve(end - start)?;
        let whole = whole(range, version.bytes);
        let (data, crc) = dram.hit_if_held(key, version.seq, version.bytes, whole)?;
        debug_assert_eq!(
            data.len() as u64,
            version.bytes,
            "the tier holds whole objects"
        );
        self.plans.asked(key);
        Some((from_memory(version, start..end, data, crc), reservation))
    }

    /// The answer to a read of `range` of `version` that the DRAM tier holds (`data`, whose
    /// CRC32C is `crc`).
    pub(super) fn hit(
        &self,
        key: &ObjectKey,
        version: StoredVersion,
        range: Option<ByteRange>,
        data: DramBytes,
        crc: u32,
    ) -> Result<PartsRead> {
        self.store.touch(key);
        let (start, end) = resolve_range(range, data.len() as u64)?;
        Ok(from_memory(version, start..end, data, crc))
    }

    /// The object from the DRAM tier, or from NVMe (filling the DRAM tier as its policy asks;
    /// a read into a target is served by a DRAM hit but fills nothing).
    pub(super) async fn get_stored(
        &self,
        key: &ObjectKey,
        range: Option<ByteRange>,
        target: Option<&ExternalBuf>,
    ) -> Result<Option<Got>> {
        if let (Some(dram), Some(version)) = (&self.dram, self.store.version(key)) {
            let whole = target.is_none() && whole(range, version.bytes);
            match dram.lookup(key, version.seq, version.bytes, whole) {
                Lookup::Hit(data, crc) => {
                    return self
                        .hit(key, version, range, data, crc)
                        .map(|read| Some(Got::Parts(read)));
                }
                Lookup::Fill => {
                    let Some(read) = self.store.get(key, None).await? else {
                        return Ok(None);
                    };
                    // Two copies: gathering the parts, and the DRAM tier's own.
                    let data = read.to_vec();
                    dram.fill(key, read.seq, &data, read.crc());
                    let bytes = data.len() as u64;
                    let (start, end) = resolve_range(range, bytes)?;
                    return Ok(Some(Got::Parts(PartsRead {
                        bytes,
                        seq: read.seq,
                        dirty: read.dirty,
                        stamp: read.stamp,
                        start,
                        data: ReadData::Owned(data).narrowed(start as usize..end as usize),
                        from_origin: false,
                        origin_version: 0,
                        origin_attributes: None,
                        copied_bytes: 2 * bytes,
                    })));
                }
                Lookup::Pass => {}
            }
        }
        if let Some(target) = target {
            match self.store.get_into(key, range, target).await? {
                DirectGet::Placed(read) => return Ok(Some(Got::Placed(read))),
                DirectGet::Absent => return Ok(None),
                DirectGet::Unsuitable => {}
            }
        }
        Ok(self.store.get(key, range).await?.map(|read| {
            Got::Parts(PartsRead {
                bytes: read.bytes,
                seq: read.seq,
                dirty: read.dirty,
                stamp: read.stamp,
                start: read.start,
                from_origin: false,
                origin_version: 0,
                origin_attributes: None,
                copied_bytes: 0,
                data: ReadData::Store(read),
            })
        }))
    }
}
