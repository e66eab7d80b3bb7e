//! A GGUF file: the mapping plus its parsed header.

use std::path::Path;

use nx_syscalls::{MappedFile, Placement, ResidentFile};

use crate::{GgufError, GgufHeader, Metadata, TensorInfo};

enum Backing {
    Mapped(MappedFile),
    Resident(ResidentFile),
    Owned(Vec<u8>),
}

/// An open GGUF file. Opening maps the file and parses the header; tensor bytes are
/// handed out as borrowed slices of the mapping and read only when used.
pub struct Gguf {
    backing: Backing,
    header: GgufHeader,
}

/// Wraps an I/O error of opening or reading `path` as the error that names it.
fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> GgufError + '_ {
    move |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Gguf {
    /// Maps `path` and parses its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let map = MappedFile::open(path).map_err(io_error(path))?;
        let header = GgufHeader::parse(map.bytes())?;
        Ok(Gguf {
            backing: Backing::Mapped(map),
            header,
        })
    }

    /// Opens `path` with its bytes placed as `placement` says: [`Placement::Mapped`] is
    /// [`Gguf::open`]; [`Placement::Resident`] checks the header on a mapping first (a
    /// file that is not GGUF fails before anything is copied), then reads the whole file
    /// into huge-page memory ([`ResidentFile`]) and parses the header again from there.
    pub fn open_placed(path: impl AsRef<Path>, placement: Placement) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let mapped = Gguf::open(path)?;
        if placement == Placement::Mapped {
            return Ok(mapped);
        }
        drop(mapped);
        Gguf::read_resident(path)
    }

    /// Reads the whole of `path` into huge-page memory ([`ResidentFile`]) and parses the
    /// header from there, without checking it on a mapping first as
    /// [`Gguf::open_placed`] does (for a caller that has just checked the file itself).
    pub fn read_resident(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let resident = ResidentFile::read(path).map_err(io_error(path))?;
        let header = GgufHeader::parse(resident.bytes())?;
        Ok(Gguf {
            backing: Backing::Resident(resident),
            header,
        })
    }

    /// Where the bytes live: mapped from the file (also for [`Gguf::from_bytes`], which
    /// holds them on the heap) or resident in huge-page memory.
    pub fn placement(&self) -> Placement {
        match &self.backing {
            Backing::Resident(_) => Placement::Resident,
            Backing::Mapped(_) | Backing::Owned(_) => Placement::Mapped,
        }
    }

    /// Parses a file held in memory (tests, generated fixtures).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        let header = GgufHeader::parse(&bytes)?;
        Ok(Gguf {
            backing: Backing::Owned(bytes),
            header,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mapped(m) => m.bytes(),
            Backing::Resident(r) => r.bytes(),
            Backing::Owned(v) => v,
        }
    }

    /// The mapping, when the file was opened from disk.
    pub fn mapped_file(&self) -> Option<&MappedFile> {
        match &self.backing {
            Backing::Mapped(m) => Some(m),
            Backing::Resident(_) | Backing::Owned(_) => None,
        }
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }

    /// The data bytes of `info`. The parser checked that every tensor of this file lies
    /// inside it; an `info` from another file yields an empty slice rather than a panic.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = self.header.data_offset.saturating_add(info.offset);
        let end = start.saturating_add(info.n_bytes);
        let bytes = self.bytes();
        match (usize::try_from(start), usize::try_from(end)) {
            (Ok(s), Ok(e)) if s <= e && e <= bytes.len() => &bytes[s..e],
            _ => &[],
        }
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.metadata().get_str("general.architecture")
    }
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.header.version)
            .field("metadata", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}
