//! Reading a manifest a client wrote. The spec asks for the table's schema
//! (JSON) in a manifest's `schema` metadata; some writers put the manifest
//! entry's own schema there instead (DuckDB 1.4 does), which iceberg-rust
//! cannot parse, although the entries themselves are sound. Such a manifest
//! is read with its `schema` replaced by the table's schema of the manifest's
//! `schema-id`: the one the spec says it should have carried. A client's
//! append through icestage's REST catalog gets such manifests rewritten
//! before it lands ([`normalize`]), so every later reader (scans, rules)
//! reads them as written by the spec.

use std::sync::Arc;

use iceberg::TableUpdate;
use iceberg::spec::{FormatVersion, Manifest, ManifestFile, ManifestListWriter, Snapshot};
use iceberg::table::Table;

use crate::error::{Error, Result};

/// iceberg-rust's words for a manifest whose `schema` is not a table schema.
const MISPLACED_SCHEMA: &str = "Fail to parse schema in manifest metadata";

/// Rewrites the manifests that the snapshot of `updates` adds (an append
/// checked by [`super::append::check_append`]) when their `schema` metadata
/// is not a table schema: each gets a repaired copy next to it, and the
/// snapshot a new manifest list naming the copies. Appends whose manifests
/// follow the spec are left exactly as sent.
pub(crate) async fn normalize(table: &Table, updates: &mut [TableUpdate]) -> Result<()> {
    let Some(TableUpdate::AddSnapshot { snapshot }) = updates.first_mut() else {
        return Ok(());
    };
    if table.metadata().format_version() != FormatVersion::V2 {
        return Ok(());
    }
    let io = table.file_io();
    let list = table
        .manifest_list_reader(&Arc::new(snapshot.clone()))
        .load()
        .await?;
    let mut repaired_any = false;
    let mut files = vec![];
    for mut file in list.entries().iter().cloned() {
        if file.added_snapshot_id == snapshot.snapshot_id() {
            let bytes = io.new_input(&file.manifest_path)?.read().await?;
            if let Err(error) = Manifest::parse_avro(&bytes)
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

/// The manifest `file` of `table`.
pub(crate) async fn load(table: &Table, file: &ManifestFile) -> Result<Manifest> {
    let bytes = table
        .file_io()
        .new_input(&file.manifest_path)?
        .read()
        .await?;
    match Manifest::parse_avro(&bytes) {
        Ok(manifest) => Ok(manifest),
        Err(error) if error.message() == MISPLACED_SCHEMA => {
            let repaired = with_table_schema(&bytes, table).ok_or_else(|| {
                Error::invalid(format!(
                    "manifest {} has a 'schema' that is not a table schema, and no schema of \
                     the table matches its 'schema-id': write it with the table's schema",
                    file.manifest_path
                ))
            })?;
            Ok(Manifest::parse_avro(&repaired)?)
        }
        Err(error) => Err(error.into()),
    }
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
