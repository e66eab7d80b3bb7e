//! Read-only memory mapping of a whole file.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// How the kernel should expect the mapping to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Pages will be read front to back (a forward pass over the layers).
    Sequential,
    /// Pages will be read in no particular order (token embeddings).
    Random,
    /// Pages will be needed soon: start reading them in now.
    WillNeed,
}

/// A file mapped read-only into memory. Opening maps it; no byte of its contents is
/// read until somebody touches [`MappedFile::bytes`].
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    // `None` for an empty file: mapping zero bytes is an error on some systems.
    map: Option<memmap2::Mmap>,
}

/// Opens `path` for reading and returns it with its length; a directory is an error.
pub(crate) fn open_file(path: &Path) -> io::Result<(File, u64)> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a directory",
        ));
    }
    Ok((file, meta.len()))
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: impl AsRef<Path>) -> io::Result<MappedFile> {
        let path = path.as_ref();
        let (file, len) = open_file(path)?;
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the mapping is read-only and we never hand out mutable access. Another
            // process truncating the file underneath us could fault on access; that is the
            // accepted contract of every mmap-based model loader (llama.cpp included).
            Some(unsafe { memmap2::MmapOptions::new().map(&file)? })
        };
        Ok(MappedFile {
            path: path.to_path_buf(),
            map,
        })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The file length in bytes.
    pub fn len(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tells the kernel how the whole mapping will be read. Advice is a hint: failures
    /// are ignored because correctness never depends on it.
    pub fn advise(&self, advice: Advice) {
        self.advise_range(advice, 0, self.bytes().len());
    }

    /// Advice for a byte range of the mapping (clamped to the file).
    pub fn advise_range(&self, advice: Advice, offset: usize, len: usize) {
        #[cfg(unix)]
        if let Some(map) = &self.map {
            let end = offset.saturating_add(len).min(map.len());
            if offset >= end {
                return;
            }
            let a = match advice {
                Advice::Sequential => memmap2::Advice::Sequential,
                Advice::Random => memmap2::Advice::Random,
                Advice::WillNeed => memmap2::Advice::WillNeed,
            };
            // madvise needs a page-aligned start.
            let page = 4096;
            let start = offset / page * page;
            let _ = map.advise_range(a, start, end - start);
        }
        #[cfg(not(unix))]
        let _ = (advice, offset, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot map files (mmap of a file descriptor)")]
    fn maps_contents_and_empty_files() {
        let dir = std::env::temp_dir().join(format!("nx-syscalls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.bin");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(b"hello")
            .unwrap();
        let m = MappedFile::open(&p).unwrap();
        assert_eq!(m.bytes(), b"hello");
        assert_eq!(m.len(), 5);
        m.advise(Advice::Sequential);
        m.advise_range(Advice::WillNeed, 3, 100);
        let e = dir.join("empty.bin");
        std::fs::File::create(&e).unwrap();
        let m = MappedFile::open(&e).unwrap();
        assert!(m.is_empty());
        assert!(MappedFile::open(dir.join("missing")).is_err());
        assert!(MappedFile::open(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
