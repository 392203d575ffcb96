//! Compressed files: the compression DataFusion reads in place, and local
//! staging (decompressed) for what it cannot read: Snappy, framed or in
//! Hadoop's block format, and selections that mix compressions.

use std::io::{Read, Write};

use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use tempfile::TempDir;

use super::options::Compression;
use super::source::{Access, SourceFile};
use crate::error::{Error, Result};

pub(crate) fn compression_type(compression: Compression) -> FileCompressionType {
    match compression {
        Compression::Gzip => FileCompressionType::GZIP,
        Compression::Bzip2 => FileCompressionType::BZIP2,
        Compression::Xz => FileCompressionType::XZ,
        Compression::Zstd => FileCompressionType::ZSTD,
        Compression::None | Compression::Snappy => FileCompressionType::UNCOMPRESSED,
    }
}

/// Decompresses a Snappy file, framed (`sNaPpY` stream identifier) or in
/// Hadoop's block format (big-endian uncompressed and compressed lengths
/// before each block).
pub(crate) fn unsnappy(data: &[u8], out: &mut impl Write) -> Result<()> {
    const FRAMED: &[u8] = b"\xff\x06\x00\x00sNaPpY";
    let bad = |what: &str| {
        Error::invalid(format!(
            "not a snappy file ({what}): check the file or pass the right name"
        ))
    };
    if data.starts_with(FRAMED) {
        std::io::copy(&mut snap::read::FrameDecoder::new(data), out)?;
        return Ok(());
    }
    let mut rest = data;
    let word = |bytes: &[u8]| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err(bad("truncated block header"));
        }
        let mut remaining = word(rest);
        rest = &rest[4..];
        while remaining > 0 {
            if rest.len() < 4 {
                return Err(bad("truncated chunk header"));
            }
            let length = word(rest);
            rest = &rest[4..];
            if rest.len() < length {
                return Err(bad("truncated chunk"));
            }
            let chunk = snap::raw::Decoder::new()
                .decompress_vec(&rest[..length])
                .map_err(|e| bad(&e.to_string()))?;
            remaining = remaining.saturating_sub(chunk.len());
            out.write_all(&chunk)?;
            rest = &rest[length..];
        }
    }
    Ok(())
}

/// Files staged on local disk, decompressed, for a selection DataFusion
/// cannot read in place (Snappy, or mixed compressions).
pub(crate) async fn stage_locally(
    access: &Access,
    files: &[SourceFile],
) -> Result<(TempDir, Vec<SourceFile>)> {
    // Not a dot-folder: DataFusion's listing skips hidden paths.
    let dir = tempfile::Builder::new()
        .prefix("icestage-staged-")
        .tempdir()?;
    let mut staged = vec![];
    for (n, file) in files.iter().enumerate() {
        let data = access
            .store
            .get(&file.meta.location)
            .await
            .map_err(|e| access.storage_error(e))?
            .bytes()
            .await
            .map_err(|e| access.storage_error(e))?;
        let name = file.meta.location.filename().unwrap_or("file");
        let plain = name
            .rsplit_once('.')
            .filter(|_| file.compression != Compression::None)
            .map_or(name, |(stem, _)| stem);
        let path = dir.path().join(format!("{n:05}-{plain}"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
        match file.compression {
            Compression::Snappy => unsnappy(&data, &mut out)?,
            Compression::None => out.write_all(&data)?,
            other => {
                let mut reader =
                    compression_type(other).convert_read(std::io::Cursor::new(data))?;
                let mut buffer = vec![0; 1 << 20];
                loop {
                    let n = reader.read(&mut buffer)?;
                    if n == 0 {
                        break;
                    }
                    out.write_all(&buffer[..n])?;
                }
            }
        }
        out.flush()?;
        let meta = object_store::local::LocalFileSystem::new()
            .head(
                &ObjectPath::from_absolute_path(&path)
                    .map_err(|e| Error::invalid(e.to_string()))?,
            )
            .await
            .map_err(|e| Error::invalid(e.to_string()))?;
        staged.push(SourceFile {
            uri: format!("file://{}", path.display()),
            compression: Compression::None,
            meta,
        });
    }
    Ok((dir, staged))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snappy_framed_and_hadoop() {
        let text = b"id,name\n1,a\n2,b\n".repeat(1000);
        let mut framed = vec![];
        {
            let mut encoder = snap::write::FrameEncoder::new(&mut framed);
            encoder.write_all(&text).unwrap();
        }
        let mut out = vec![];
        unsnappy(&framed, &mut out).unwrap();
        assert_eq!(out, text);

        // Hadoop: [uncompressed length][compressed length][chunk] per block.
        let chunk = snap::raw::Encoder::new().compress_vec(&text).unwrap();
        let mut hadoop = (text.len() as u32).to_be_bytes().to_vec();
        hadoop.extend((chunk.len() as u32).to_be_bytes());
        hadoop.extend(&chunk);
        let mut out = vec![];
        unsnappy(&hadoop, &mut out).unwrap();
        assert_eq!(out, text);
        assert!(unsnappy(&hadoop[..10], &mut vec![]).is_err());
    }
}
