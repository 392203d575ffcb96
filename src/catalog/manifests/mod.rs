//! Reading a manifest list or manifest a client wrote: confined to the
//! table's location and bounded in size ([`crate::catalog::confine::read_confined`]),
//! every Avro block checked to decompress within
//! [`crate::limits::ReadLimits::metadata_inflated_bytes`] with a codec
//! Iceberg writers use ([`check_container`]) before the Avro reader sees it,
//! and parsed so that a malformed file is an error, never a panic. Deleting
//! a table's files by what its manifests name ([`delete_confined`]) reads
//! them the same way, and deletes through the gate.
//!
//! The spec asks for the table's schema
//! (JSON) in a manifest's `schema` metadata; some writers put the manifest
//! entry's own schema there instead (DuckDB 1.4 does), which iceberg-rust
//! cannot parse, although the entries themselves are sound. Such a manifest
//! is read with its `schema` replaced by the table's schema of the manifest's
//! `schema-id`: the one the spec says it should have carried. A client's
//! append through icestage's REST catalog gets such manifests rewritten
//! before it lands ([`normalize`]), so every later reader (scans, rules)
//! reads them as written by the spec.
//!
//! [`lookup`] keeps manifests decoded once, for lookups by partition value
//! and reads by time.

pub(crate) mod lookup;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use iceberg::TableUpdate;
use iceberg::spec::{
    FormatVersion, Manifest, ManifestFile, ManifestList, ManifestListWriter, Snapshot,
};
use iceberg::table::Table;

use crate::catalog::confine::read_confined;
use crate::error::{Error, Result, on_own_task};
use crate::limits;

/// Metadata files read (or, by a clean-up, deleted) at once: each read is
/// bounded ([`limits`]), so this bounds the memory they take together.
const READS_AT_ONCE: usize = 8;

/// iceberg-rust's words for a manifest whose `schema` is not a table schema.
const MISPLACED_SCHEMA: &str = "Fail to parse schema in manifest metadata";

/// Rewrites the manifests that the snapshot of `updates` adds (an append
/// checked by [`crate::catalog::commit::append::check_append`]) when their `schema` metadata
/// is not a table schema: each gets a repaired copy next to it, and the
/// snapshot a new manifest list naming the copies. Appends whose manifests
/// follow the spec are left exactly as sent.
///
/// Every file it reads lies under `location` (the table's assigned
/// location): a manifest named elsewhere is refused before it is opened.
pub(crate) async fn normalize(
    table: &Table,
    location: &str,
    updates: &mut [TableUpdate],
) -> Result<()> {
    let Some(TableUpdate::AddSnapshot { snapshot }) = updates.first_mut() else {
        return Ok(());
    };
    let io = table.file_io();
    let list = load_list(table, &Arc::new(snapshot.clone()), location).await?;
    if table.metadata().format_version() != FormatVersion::V2 {
        return Ok(());
    }
    let mut repaired_any = false;
    let mut files = vec![];
    for mut file in list.entries().iter().cloned() {
        if file.added_snapshot_id == snapshot.snapshot_id() {
            let bytes = read_avro(io, &file.manifest_path, location, "manifest").await?;
            if let Err(Error::Iceberg(error)) = parse_manifest(&bytes, &file.manifest_path)
                && error.message() == MISPLACED_SCHEMA
                && let Some(repaired) = with_table_schema(&bytes, table)
            {
                let path = format!(
                    "{}-icestage.avro",
                    file.manifest_path.trim_end_matches(".avro")
                );
                io.new_output(&path)?.write(repaired.clone().into()).await?;
                file.manifest_path = path;
                file.manifest_length = repaired.len() as i64;
                repaired_any = true;
            }
        }
        files.push(file);
    }
    if !repaired_any {
        return Ok(());
    }
    let list_path = format!(
        "{}-icestage.avro",
        snapshot.manifest_list().trim_end_matches(".avro")
    );
    let mut writer = ManifestListWriter::v2(
        io.new_output(&list_path)?.writer().await?,
        snapshot.snapshot_id(),
        snapshot.parent_snapshot_id(),
        snapshot.sequence_number(),
    );
    writer.add_manifests(files.into_iter())?;
    writer.close().await?;
    let rebuilt = Snapshot::builder()
        .with_snapshot_id(snapshot.snapshot_id())
        .with_parent_snapshot_id(snapshot.parent_snapshot_id())
        .with_sequence_number(snapshot.sequence_number())
        .with_timestamp_ms(snapshot.timestamp_ms())
        .with_manifest_list(list_path)
        .with_summary(snapshot.summary().clone())
        .schema_id_opt(snapshot.schema_id())
        .build();
    *snapshot = rebuilt;
    Ok(())
}

/// The manifest list of `snapshot` of `table`, read as a client's file
/// under `location` (see the module documentation).
pub(crate) async fn load_list(
    table: &Table,
    snapshot: &iceberg::spec::SnapshotRef,
    location: &str,
) -> Result<ManifestList> {
    let path = snapshot.manifest_list();
    let bytes = read_confined(table.file_io(), path, location, "manifest list").await?;
    decode_list(&bytes, table.metadata().format_version(), path)
}

/// Deletes `table`'s files that lie under `location`: its metadata files
/// (metadata log, manifest lists, manifests) and, with
/// [`Removal::Everything`], its data files. Paths outside `location` are
/// never touched, whatever the metadata says, and with
/// [`Removal::MetadataOnly`] no path a manifest names as a data file is
/// deleted (the target references them). Best effort: a file that is already
/// gone is fine.
pub(crate) async fn delete_confined(
    table: &Table,
    location: &str,
    removal: crate::catalog::Removal,
) -> Result<()> {
    use std::collections::HashSet;

    use crate::catalog::Removal;
    use crate::catalog::confine::{canonical, delete_within, is_under, local, metadata_paths};
    let io = table.file_io();
    if removal == Removal::Location {
        // The folder itself replaced by a link would name another folder.
        let linked = local(location).is_some_and(|folder| {
            std::fs::symlink_metadata(folder).is_ok_and(|m| m.file_type().is_symlink())
        });
        if canonical(location).is_some() && !linked {
            let _ = io.delete_prefix(location.trim_end_matches('/')).await;
        }
        return Ok(());
    }
    let mut metadata: HashSet<String> = metadata_paths(table).into_iter().collect();
    // Each snapshot's list names the manifests of the snapshots before it
    // too: every list is read, then every manifest once, several at a time.
    // (Owned items: a closure over borrowed ones would not be `Send` for
    // every caller's future.)
    let snapshots: Vec<iceberg::spec::SnapshotRef> =
        table.metadata().snapshots().cloned().collect();
    let lists: Vec<ManifestList> = futures::stream::iter(snapshots)
        .map(|snapshot| async move { load_list(table, &snapshot, location).await })
        .buffer_unordered(READS_AT_ONCE)
        .filter_map(|list| async move { list.ok() })
        .collect()
        .await;
    let (mut seen, mut manifests) = (HashSet::new(), vec![]);
    for manifest in lists.iter().flat_map(|list| list.entries()) {
        if is_under(&manifest.manifest_path, location) && seen.insert(&manifest.manifest_path) {
            manifests.push(manifest.clone());
        }
    }
    metadata.extend(seen.into_iter().cloned());
    let data: HashSet<String> = futures::stream::iter(manifests)
        .map(|manifest| load_apart(table, manifest, location))
        .buffer_unordered(READS_AT_ONCE)
        .fold(HashSet::new(), |mut data, loaded| async move {
            if let Ok(loaded) = loaded {
                data.extend(
                    loaded
                        .entries()
                        .iter()
                        .map(|e| e.data_file().file_path().to_string()),
                );
            }
            data
        })
        .await;
    let doomed: Vec<String> = match removal {
        Removal::Everything | Removal::Location => metadata.into_iter().chain(data).collect(),
        // A path a manifest names as data is never deleted here, even when
        // another (client-written) manifest list calls it a manifest.
        Removal::MetadataOnly => metadata.difference(&data).cloned().collect(),
    };
    futures::stream::iter(doomed)
        .for_each_concurrent(READS_AT_ONCE, |path| async move {
            delete_within(io, &path, location).await;
        })
        .await;
    // The files its rows reference (or, for a staging table, that a client
    // put there for them) are the table's too.
    let files = crate::catalog::confine::files_folder(location);
    if canonical(location).is_some() && !crate::catalog::confine::through_link(&files, location) {
        let _ = io.delete_prefix(&format!("{files}/")).await;
    }
    Ok(())
}

/// The snapshot that added `entry` and its data sequence number, which a
/// rewrite of the manifest that lists it (`manifest`, of table `name`)
/// must keep; an entry without them is refused.
pub(crate) fn kept_numbers(
    entry: &iceberg::spec::ManifestEntry,
    manifest: &iceberg::spec::ManifestFile,
    name: &str,
) -> Result<(i64, i64)> {
    match (entry.snapshot_id(), entry.sequence_number()) {
        (Some(added_in), Some(sequence)) => Ok((added_in, sequence)),
        _ => Err(Error::invalid(format!(
            "{name}: manifest {} has an entry without its snapshot or sequence number",
            manifest.manifest_path
        ))),
    }
}

/// A manifest list's `bytes` (from `path`) decoded: the container checked
/// ([`check_container`]), then parsed so that a panic is an error.
pub(crate) fn decode_list(
    bytes: &[u8],
    version: FormatVersion,
    path: &str,
) -> Result<ManifestList> {
    checked(bytes, path, "manifest list")?;
    unpanicked(path, || ManifestList::parse_with_version(bytes, version))
}

/// A manifest's `bytes` (from `path`) decoded as [`decode_list`] does.
pub(crate) fn decode_manifest(bytes: &[u8], path: &str) -> Result<Manifest> {
    checked(bytes, path, "manifest")?;
    parse_manifest(bytes, path)
}

/// The manifest `file` of `table`, read as a client's file under
/// `location` (see the module documentation), its entries completed from
/// `file` as Iceberg's inheritance says (snapshot id, sequence numbers).
pub(crate) async fn load(table: &Table, file: &ManifestFile, location: &str) -> Result<Manifest> {
    let path = &file.manifest_path;
    if file.key_metadata.is_some() {
        return Err(Error::NotSupported(format!(
            "manifest {path} is encrypted: icestage reads no encrypted table"
        )));
    }
    let bytes = read_avro(table.file_io(), path, location, "manifest").await?;
    parse_with_table(&bytes, path, table).map(|manifest| inherit(manifest, file))
}

/// Each of the manifests `files` of `table`, read with [`load`] (each on
/// a task of its own: [`load_apart`]), in order, [`READS_AT_ONCE`] at a time: a table written in many appends has a
/// manifest per append, and each read waits on storage. The first error
/// in order is the answer.
pub(crate) async fn load_each<'a>(
    table: &Table,
    files: impl IntoIterator<Item = &'a ManifestFile>,
    location: &str,
) -> Result<Vec<(ManifestFile, Manifest)>> {
    // (Owned items: a closure over borrowed ones would not be `Send` for
    // every caller's future.)
    let files: Vec<ManifestFile> = files.into_iter().cloned().collect();
    futures::stream::iter(files)
        .map(|file| async move {
            let manifest = load_apart(table, file.clone(), location).await?;
            Ok::<_, Error>((file, manifest))
        })
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await
}

/// [`load`] as a task of its own: decoding a manifest is CPU work (its
/// Avro schema, the table schema it carries, every entry), so manifests
/// read together decode on all cores instead of taking turns on one (10
/// manifests of 10M staged rows: about 9 ms of a promotion's start, on
/// one core of two).
async fn load_apart(table: &Table, file: ManifestFile, location: &str) -> Result<Manifest> {
    let (table, location) = (table.clone(), location.to_string());
    on_own_task("a task reading a manifest", async move {
        load(&table, &file, &location).await
    })
    .await
}

/// The data and delete files the manifests `files` of `table` list, each
/// read with [`load`]: of live entries only with `live_only`, of every
/// entry otherwise.
pub(crate) async fn listed_files<'a>(
    table: &Table,
    files: impl IntoIterator<Item = &'a ManifestFile>,
    location: &str,
    live_only: bool,
) -> Result<std::collections::HashSet<String>> {
    let mut paths = std::collections::HashSet::new();
    for (_, manifest) in load_each(table, files, location).await? {
        paths.extend(
            manifest
                .entries()
                .iter()
                .filter(|e| !live_only || e.is_alive())
                .map(|e| e.data_file().file_path().to_string()),
        );
    }
    Ok(paths)
}

/// What entries whose snapshot id or sequence numbers are unset take from
/// the manifest list entry `file` (Iceberg's inheritance, as
/// `ManifestFile::load_manifest` applies it).
fn inherit(manifest: Manifest, file: &ManifestFile) -> Manifest {
    /// The sequence number of tables written before sequence numbers.
    const INITIAL_SEQUENCE_NUMBER: i64 = 0;
    let (entries, metadata) = manifest.into_parts();
    let entries = entries
        .into_iter()
        .map(|entry| {
            let mut entry = Arc::unwrap_or_clone(entry);
            entry.snapshot_id.get_or_insert(file.added_snapshot_id);
            if entry.status == iceberg::spec::ManifestStatus::Added
                || file.sequence_number == INITIAL_SEQUENCE_NUMBER
            {
                entry.sequence_number.get_or_insert(file.sequence_number);
                entry
                    .file_sequence_number
                    .get_or_insert(file.sequence_number);
            }
            entry
        })
        .collect();
    Manifest::new(metadata, entries)
}

/// `bytes` of the manifest at `path` parsed, with a misplaced `schema`
/// replaced by `table`'s (see the module documentation).
fn parse_with_table(bytes: &[u8], path: &str, table: &Table) -> Result<Manifest> {
    match parse_manifest(bytes, path) {
        Ok(manifest) => Ok(manifest),
        Err(Error::Iceberg(error)) if error.message() == MISPLACED_SCHEMA => {
            let repaired = with_table_schema(bytes, table).ok_or_else(|| {
                Error::invalid(format!(
                    "manifest {path} has a 'schema' that is not a table schema, and no schema of \
                     the table matches its 'schema-id': write it with the table's schema"
                ))
            })?;
            parse_manifest(&repaired, path)
        }
        Err(error) => Err(error),
    }
}

/// `path` read with [`read_confined`] and checked with [`check_container`].
async fn read_avro(
    io: &iceberg::io::FileIO,
    path: &str,
    location: &str,
    what: &str,
) -> Result<bytes::Bytes> {
    let bytes = read_confined(io, path, location, what).await?;
    checked(&bytes, path, what)?;
    Ok(bytes)
}

/// [`check_container`] with the bound in force, as an error naming `path`.
fn checked(bytes: &[u8], path: &str, what: &str) -> Result<()> {
    let bound = limits::current().metadata_inflated_bytes;
    check_container(bytes, bound).map_err(|why| {
        Error::invalid(format!(
            "{what} '{path}' cannot be read: {why}; write it again with an Iceberg writer"
        ))
    })
}

fn parse_manifest(bytes: &[u8], path: &str) -> Result<Manifest> {
    unpanicked(path, || Manifest::parse_avro(bytes))
}

/// Runs a parser of a client's bytes: a panic inside it (a malformed file
/// the parser did not expect) is an error naming `path`, not a dead task.
fn unpanicked<T>(path: &str, parse: impl FnOnce() -> iceberg::Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse)) {
        Ok(parsed) => Ok(parsed?),
        Err(_) => Err(Error::invalid(format!(
            "'{path}' is malformed: its Avro could not be decoded; write it again with an \
             Iceberg writer"
        ))),
    }
}

/// The Avro codecs Iceberg writers use, which the container's blocks may
/// be compressed with.
const CODECS: &[&str] = &["null", "deflate", "snappy", "zstandard"];

/// Checks an Avro object container before the Avro reader decodes it: a
/// codec of [`CODECS`], and blocks that together decompress to at most
/// `bound` bytes (each is decompressed here within what is left of the
/// bound, so a block that would inflate past it is stopped at the bound).
/// The reason it is refused otherwise.
pub(crate) fn check_container(bytes: &[u8], bound: u64) -> std::result::Result<(), String> {
    let (metadata, rest) = read_header(bytes).ok_or("its Avro header is malformed")?;
    let codec = metadata
        .iter()
        .find(|(k, _)| k == b"avro.codec")
        .map_or("null".to_string(), |(_, v)| {
            String::from_utf8_lossy(v).into_owned()
        });
    if !CODECS.contains(&codec.as_str()) {
        return Err(format!(
            "its Avro codec '{codec}' is not one Iceberg writers use ({})",
            CODECS.join(", ")
        ));
    }
    let mut at = rest.get(16..).ok_or("its Avro header has no sync marker")?;
    let mut left = bound;
    while !at.is_empty() {
        let malformed = || "an Avro block is malformed".to_string();
        let _objects = read_long(&mut at).ok_or_else(malformed)?;
        let size =
            usize::try_from(read_long(&mut at).ok_or_else(malformed)?).map_err(|_| malformed())?;
        let block = at.get(..size).ok_or_else(malformed)?;
        at = at
            .get(size..)
            .and_then(|r| r.get(16..))
            .ok_or_else(malformed)?;
        let inflated = inflated_size(&codec, block, left).ok_or_else(|| {
            format!(
                "its Avro blocks decompress to more than {} (limits.metadata_inflated_bytes) \
                 or are corrupt",
                limits::human(bound)
            )
        })?;
        left -= inflated;
    }
    Ok(())
}

/// What `block` decompresses to with `codec`, when that is at most `left`
/// bytes and the block decodes; `None` otherwise.
fn inflated_size(codec: &str, block: &[u8], left: u64) -> Option<u64> {
    use std::io::Read;
    let limit = usize::try_from(left).unwrap_or(usize::MAX);
    let size = match codec {
        "null" => block.len(),
        "deflate" => miniz_oxide::inflate::decompress_to_vec_with_limit(block, limit)
            .ok()?
            .len(),
        "snappy" => {
            // The block ends in the CRC32 of the uncompressed bytes.
            let body = block.get(..block.len().checked_sub(4)?)?;
            let claimed = snap::raw::decompress_len(body).ok()?;
            if claimed > limit {
                return None;
            }
            snap::raw::Decoder::new().decompress_vec(body).ok()?.len()
        }
        "zstandard" => {
            // Counted as it streams, never held: at most one byte past the bound.
            let decoder = zstd::stream::read::Decoder::new(block).ok()?;
            let counted = std::io::copy(
                &mut decoder.take(left.saturating_add(1)),
                &mut std::io::sink(),
            )
            .ok()?;
            usize::try_from(counted).ok()?
        }
        _ => return None,
    };
    let size = size as u64;
    (size <= left).then_some(size)
}

/// `bytes` (an Avro object container) with its `schema` metadata set to the
/// JSON of `table`'s schema of the container's `schema-id`; `None` when the
/// header cannot be read or the table has no such schema.
fn with_table_schema(bytes: &[u8], table: &Table) -> Option<Vec<u8>> {
    let (entries, rest) = read_header(bytes)?;
    let schema_id: i32 = entries
        .iter()
        .find(|(k, _)| k == b"schema-id")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0);
    let schema = table.metadata().schema_by_id(schema_id)?;
    let json = serde_json::to_vec(schema.as_ref()).ok()?;
    let mut out = b"Obj\x01".to_vec();
    write_long(&mut out, entries.len() as i64);
    for (key, value) in &entries {
        let value = if key == b"schema" { &json } else { value };
        write_bytes(&mut out, key);
        write_bytes(&mut out, value);
    }
    write_long(&mut out, 0);
    out.extend_from_slice(rest);
    Some(out)
}

type Metadata = Vec<(Vec<u8>, Vec<u8>)>;

/// The metadata map of an Avro object container's header, and what follows
/// it (the sync marker and the blocks).
fn read_header(bytes: &[u8]) -> Option<(Metadata, &[u8])> {
    let mut at = bytes.strip_prefix(b"Obj\x01")?;
    let mut entries = vec![];
    loop {
        let count = read_long(&mut at)?;
        if count == 0 {
            return Some((entries, at));
        }
        if count < 0 {
            // A negative count is followed by the block's size in bytes.
            read_long(&mut at)?;
        }
        for _ in 0..count.unsigned_abs() {
            let key = read_bytes(&mut at)?;
            let value = read_bytes(&mut at)?;
            entries.push((key, value));
        }
    }
}

fn read_long(at: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = at.split_first()?;
        *at = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}

fn read_bytes(at: &mut &[u8]) -> Option<Vec<u8>> {
    let len = usize::try_from(read_long(at)?).ok()?;
    let (value, rest) = (at.get(..len)?, at.get(len..)?);
    *at = rest;
    Some(value.to_vec())
}

fn write_long(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let byte = (zigzag & 0x7f) as u8;
        zigzag >>= 7;
        if zigzag == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn write_bytes(out: &mut Vec<u8>, value: &[u8]) {
    write_long(out, value.len() as i64);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avro_longs_and_headers_round_trip() {
        for value in [0i64, 1, -1, 63, -64, 64, 300, i64::MAX, i64::MIN] {
            let mut out = vec![];
            write_long(&mut out, value);
            assert_eq!(read_long(&mut out.as_slice()), Some(value), "{value}");
        }
        let mut container = b"Obj\x01".to_vec();
        write_long(&mut container, 2);
        for (k, v) in [(&b"schema"[..], &b"{}"[..]), (b"schema-id", b"0")] {
            write_bytes(&mut container, k);
            write_bytes(&mut container, v);
        }
        write_long(&mut container, 0);
        container.extend_from_slice(&[7u8; 16]);
        let (entries, rest) = read_header(&container).unwrap();
        assert_eq!(entries[1], (b"schema-id".to_vec(), b"0".to_vec()));
        assert_eq!(rest, &[7u8; 16]);
        assert!(read_header(b"Obj\x01\x04").is_none());
    }
}
