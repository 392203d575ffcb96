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

/// A writer that takes at most `left` bytes: past that, every write fails
/// with [`OVER_BOUND`], so a decompression bomb stops at the bound instead
/// of filling the disk.
pub(crate) struct Bounded<W> {
    inner: W,
    left: u64,
}

/// The message of the error a [`Bounded`] writer fails with.
const OVER_BOUND: &str = "decompressed size over the bound";

impl<W: Write> Bounded<W> {
    pub(crate) fn new(inner: W, bound: u64) -> Self {
        Self { inner, left: bound }
    }

    /// Whether `more` bytes still fit.
    fn fits(&self, more: usize) -> bool {
        (more as u64) <= self.left
    }
}

impl<W: Write> Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.fits(buf.len()) {
            return Err(std::io::Error::other(OVER_BOUND));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The error for source `name` whose decompression passed `bound`, or
/// `error` itself.
fn over_bound(name: &str, bound: u64, error: Error) -> Error {
    let over = match &error {
        Error::Io(e) => e.to_string().contains(OVER_BOUND),
        Error::InvalidInput(m) => m.contains(OVER_BOUND),
        _ => false,
    };
    if !over {
        return error;
    }
    Error::invalid(format!(
        "source file {name} decompresses to more than {} (limits.source_inflated_bytes): it is \
         not loaded; split it, or raise the bound if it is genuine",
        crate::limits::human(bound)
    ))
}

/// Decompresses a Snappy file, framed (`sNaPpY` stream identifier) or in
/// Hadoop's block format (big-endian uncompressed and compressed lengths
/// before each block), into `out` (a bounded writer: a chunk whose claimed
/// size does not fit is refused before it is decompressed).
pub(crate) fn unsnappy<W: Write>(data: &[u8], out: &mut Bounded<W>) -> Result<()> {
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
            let claimed =
                snap::raw::decompress_len(&rest[..length]).map_err(|e| bad(&e.to_string()))?;
            if !out.fits(claimed) {
                return Err(Error::invalid(OVER_BOUND));
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
        let bound = crate::limits::current().source_inflated_bytes;
        let mut out = Bounded::new(
            std::io::BufWriter::new(std::fs::File::create(&path)?),
            bound,
        );
        let written = match file.compression {
            Compression::Snappy => unsnappy(&data, &mut out),
            Compression::None => out.write_all(&data).map_err(Error::from),
            other => inflate(other, data, &mut out),
        }
        .and_then(|()| out.flush().map_err(Error::from));
        written.map_err(|e| over_bound(&file.uri, bound, e))?;
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

/// Decompresses `data` with `compression` into `out`, a buffer at a time.
fn inflate<W: Write>(
    compression: Compression,
    data: bytes::Bytes,
    out: &mut Bounded<W>,
) -> Result<()> {
    let mut reader = compression_type(compression).convert_read(std::io::Cursor::new(data))?;
    let mut buffer = vec![0; 1 << 20];
    loop {
        let n = reader.read(&mut buffer)?;
        if n == 0 {
            return Ok(());
        }
        out.write_all(&buffer[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bomb stops at the bound, named, whatever the codec.
    #[test]
    fn decompression_stops_at_the_bound() {
        let zeros = vec![0u8; 4 << 20];
        let mut gzip = vec![];
        {
            let mut encoder = flate2::write::GzEncoder::new(&mut gzip, flate2::Compression::fast());
            encoder.write_all(&zeros).unwrap();
            encoder.finish().unwrap();
        }
        let mut out = Bounded::new(vec![], 1 << 20);
        let error = inflate(Compression::Gzip, gzip.into(), &mut out).unwrap_err();
        let error = over_bound("s3://b/in/bomb.csv.gz", 1 << 20, error).to_string();
        assert!(
            error.contains(
                "source file s3://b/in/bomb.csv.gz decompresses to more than 1 MiB \
                 (limits.source_inflated_bytes)"
            ),
            "{error}"
        );
        assert!(out.inner.len() <= 1 << 20);
        // Snappy in Hadoop's blocks: refused from the chunk's claimed size.
        let chunk = snap::raw::Encoder::new().compress_vec(&zeros).unwrap();
        let mut hadoop = (zeros.len() as u32).to_be_bytes().to_vec();
        hadoop.extend((chunk.len() as u32).to_be_bytes());
        hadoop.extend(&chunk);
        let mut out = Bounded::new(vec![], 1 << 20);
        let error = unsnappy(&hadoop, &mut out).unwrap_err();
        assert!(
            over_bound("f", 1 << 20, error)
                .to_string()
                .contains("limits.source_inflated_bytes")
        );
        assert!(out.inner.is_empty());
    }

    #[test]
    fn snappy_framed_and_hadoop() {
        let text = b"id,name\n1,a\n2,b\n".repeat(1000);
        let mut framed = vec![];
        {
            let mut encoder = snap::write::FrameEncoder::new(&mut framed);
            encoder.write_all(&text).unwrap();
        }
        let mut out = Bounded::new(vec![], u64::MAX);
        unsnappy(&framed, &mut out).unwrap();
        assert_eq!(out.inner, text);

        // Hadoop: [uncompressed length][compressed length][chunk] per block.
        let chunk = snap::raw::Encoder::new().compress_vec(&text).unwrap();
        let mut hadoop = (text.len() as u32).to_be_bytes().to_vec();
        hadoop.extend((chunk.len() as u32).to_be_bytes());
        hadoop.extend(&chunk);
        let mut out = Bounded::new(vec![], u64::MAX);
        unsnappy(&hadoop, &mut out).unwrap();
        assert_eq!(out.inner, text);
        assert!(unsnappy(&hadoop[..10], &mut Bounded::new(vec![], u64::MAX)).is_err());
    }
}
