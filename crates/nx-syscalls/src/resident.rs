//! A whole file read into anonymous memory backed by transparent huge pages.
//!
//! Why copy a file that could be mapped: decode streams every weight once per token, and
//! with 4 KiB pages that stream misses the TLB every 4 KiB. Page-cache pages of a mapped
//! file are 4 KiB unless the kernel happened to read the file into 2 MiB folios, which
//! nx cannot arrange for a file already cached; anonymous memory advised with
//! `MADV_HUGEPAGE` gets 2 MiB pages whenever the kernel has them. On the Zen 4 VM of
//! `docs/benchmarks.md` that alone took decode of the Qwen2.5-1.5B shapes from about 26 to
//! 30 tok/s (2 threads) and 16.7 to 21 tok/s (one thread). The price is one sequential
//! read of the file when it is opened and memory for the whole file up front, so
//! [`Placement::choose`] keeps a file mapped when huge pages are off or the file would not
//! fit in memory twice (the copy and the page cache the read goes through).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Where a model file's bytes live while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Mapped read-only from the file: nothing is read until used (lazy), pages as the
    /// page cache holds them.
    Mapped,
    /// Read once into anonymous memory on 2 MiB pages ([`ResidentFile`]).
    Resident,
}

/// Size of a transparent huge page on x86-64 (a PMD entry).
pub const HUGE_PAGE: usize = 2 << 20;

impl Placement {
    /// The placement that decodes fastest here for a file of `file_len` bytes, and, when
    /// that is [`Placement::Mapped`], why. Resident unless transparent huge pages are off
    /// (`/sys/kernel/mm/transparent_hugepage/enabled` says `[never]`, or the system is not
    /// Linux) or twice the file exceeds `MemAvailable`.
    pub fn choose(file_len: u64) -> (Placement, Option<&'static str>) {
        Placement::choose_from(
            file_len,
            std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok(),
            std::fs::read_to_string("/proc/meminfo").ok(),
        )
    }

    /// [`Placement::choose`] over the texts of the two kernel files (testable).
    pub fn choose_from(
        file_len: u64,
        thp_enabled: Option<String>,
        meminfo: Option<String>,
    ) -> (Placement, Option<&'static str>) {
        if !cfg!(target_os = "linux") {
            return (Placement::Mapped, Some("huge pages are only used on Linux"));
        }
        match thp_enabled {
            Some(s) if !s.contains("[never]") => {}
            _ => return (Placement::Mapped, Some("transparent huge pages are off")),
        }
        let available = meminfo.as_deref().and_then(mem_available_bytes);
        match available {
            Some(avail) if file_len.saturating_mul(2) <= avail => (Placement::Resident, None),
            Some(_) => (
                Placement::Mapped,
                Some("the file does not fit twice in available memory"),
            ),
            None => (Placement::Mapped, Some("available memory is unknown")),
        }
    }

    /// The placement's name in logs and `--help`.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Mapped => "mapped",
            Placement::Resident => "resident",
        }
    }
}

/// `MemAvailable` from the text of `/proc/meminfo`, in bytes.
fn mem_available_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A file's bytes, read once into read-only anonymous memory that starts on a 2 MiB
/// boundary and is advised for transparent huge pages.
#[derive(Debug)]
pub struct ResidentFile {
    path: PathBuf,
    memory: Memory,
    len: usize,
}

/// The anonymous mapping (`None` for an empty file: mapping zero bytes is an error).
#[derive(Debug)]
struct Memory {
    start: Option<std::ptr::NonNull<u8>>,
    mapped_len: usize,
}

// SAFETY: the memory is read-only after `ResidentFile::read` returns and owned by the
// value alone; sharing `&[u8]` views of it across threads is what a `Vec<u8>` allows too.
unsafe impl Send for Memory {}
// SAFETY: as above: nothing writes through it once it is handed out.
unsafe impl Sync for Memory {}

impl ResidentFile {
    /// Reads the whole of `path` into fresh huge-page memory.
    pub fn read(path: impl AsRef<Path>) -> io::Result<ResidentFile> {
        let path = path.as_ref();
        let (file, len) = crate::mapped::open_file(path)?;
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large"))?;
        let memory = Memory::allocate(len)?;
        if let Some(start) = memory.start {
            // SAFETY: `start` begins `mapped_len >= len` bytes of writable memory that this
            // function owns and nothing else references yet.
            let dst = unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), len) };
            read_all(&file, dst)?;
            memory.seal()?;
        }
        Ok(ResidentFile {
            path: path.to_path_buf(),
            memory,
            len,
        })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self.memory.start {
            // SAFETY: `len` bytes from `start` were written by `read` and are never
            // written again; the mapping lives as long as `self`.
            Some(start) => unsafe { std::slice::from_raw_parts(start.as_ptr(), self.len) },
            None => &[],
        }
    }

    /// The file length in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The path the file was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Fills `dst` from the start of `file`; a file that shrank meanwhile is an error.
fn read_all(file: &File, dst: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    // In pieces, so that a read is never larger than the kernel's per-call limit.
    const PIECE: usize = 64 << 20;
    for (i, piece) in dst.chunks_mut(PIECE).enumerate() {
        file.read_exact_at(piece, (i * PIECE) as u64)?;
    }
    Ok(())
}

/// Asks for transparent huge pages on the whole 2 MiB pages inside `[ptr, ptr + len)`, which
/// the caller owns and has not touched yet (pages already present stay small). A refusal
/// (huge pages off) only means 4 KiB pages, so it is ignored.
pub(crate) fn advise_huge_pages(ptr: *const u8, len: usize) {
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize).saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
    #[cfg(target_os = "linux")]
    if start < end {
        // SAFETY: advice only, on whole pages of memory the caller owns; it changes no
        // contents and no protection.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, end);
}

impl Memory {
    /// Maps `len` bytes (rounded up to whole huge pages) of zeroed, writable anonymous
    /// memory starting on a huge-page boundary and advises it for huge pages.
    fn allocate(len: usize) -> io::Result<Memory> {
        if len == 0 {
            return Ok(Memory {
                start: None,
                mapped_len: 0,
            });
        }
        let too_large = || io::Error::new(io::ErrorKind::OutOfMemory, "file too large to copy");
        let mapped_len = len
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(too_large)?;
        let reserve_len = mapped_len.checked_add(HUGE_PAGE).ok_or_else(too_large)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base_addr = base as usize;
        let start_addr = base_addr.next_multiple_of(HUGE_PAGE);
        let head = start_addr - base_addr;
        let tail = reserve_len - head - mapped_len;
        // SAFETY: both ranges lie inside the reservation just made and outside the part
        // kept; unmapping them leaves `[start_addr, start_addr + mapped_len)` mapped.
        unsafe {
            if head > 0 {
                libc::munmap(base, head);
            }
            if tail > 0 {
                libc::munmap((start_addr + mapped_len) as *mut libc::c_void, tail);
            }
        }
        advise_huge_pages(start_addr as *const u8, mapped_len);
        #[cfg(target_os = "linux")]
        // SAFETY: fills the pages of memory this function owns with zeros (what a fault
        // would do), up front: a read into unpopulated huge-page memory faults page by
        // page inside the copy and took 2.0 s for 1 GB against 0.22 s populated first.
        // Older kernels refuse the advice; the read then faults the pages in.
        unsafe {
            libc::madvise(
                start_addr as *mut libc::c_void,
                mapped_len,
                libc::MADV_POPULATE_WRITE,
            );
        }
        Ok(Memory {
            start: std::ptr::NonNull::new(start_addr as *mut u8),
            mapped_len,
        })
    }

    /// Makes the memory read-only, as a file mapping would be.
    fn seal(&self) -> io::Result<()> {
        let Some(start) = self.start else {
            return Ok(());
        };
        // SAFETY: changes the protection of exactly the range `allocate` kept.
        let rc = unsafe {
            libc::mprotect(
                start.as_ptr() as *mut libc::c_void,
                self.mapped_len,
                libc::PROT_READ,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            // SAFETY: unmaps exactly the range `allocate` kept; no slice of it outlives
            // the `ResidentFile` that owns this memory.
            unsafe {
                libc::munmap(start.as_ptr() as *mut libc::c_void, self.mapped_len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot map memory or read files by offset")]
    fn holds_the_file_on_a_huge_page_boundary() {
        let dir = std::env::temp_dir().join(format!("nx-resident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.bin");
        // Longer than one read piece would be slow; odd-sized to check the tail.
        let data: Vec<u8> = (0..3_000_017u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        let r = ResidentFile::read(&p).unwrap();
        assert_eq!(r.bytes(), &data[..]);
        assert_eq!(r.len(), data.len() as u64);
        assert_eq!(r.bytes().as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(r.path(), p.as_path());
        let e = dir.join("empty.bin");
        std::fs::File::create(&e).unwrap();
        let r = ResidentFile::read(&e).unwrap();
        assert!(r.is_empty() && r.bytes().is_empty());
        assert!(ResidentFile::read(dir.join("missing")).is_err());
        assert!(ResidentFile::read(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn placement_follows_huge_pages_and_memory() {
        let mem = |kib: u64| Some(format!("MemTotal: 99 kB\nMemAvailable:  {kib} kB\n"));
        let on = || Some("always [madvise] never\n".to_string());
        let gib = 1u64 << 30;
        let choose = Placement::choose_from;
        if cfg!(target_os = "linux") {
            assert_eq!(choose(gib, on(), mem(4 << 20)), (Placement::Resident, None));
            assert_eq!(choose(gib, on(), mem(1 << 20)).0, Placement::Mapped);
            let never = Some("always madvise [never]\n".to_string());
            assert_eq!(choose(gib, never, mem(4 << 20)).0, Placement::Mapped);
            assert_eq!(choose(gib, None, mem(4 << 20)).0, Placement::Mapped);
            assert_eq!(choose(gib, on(), None).0, Placement::Mapped);
            assert_eq!(
                choose(gib, on(), Some("MemAvailable: x kB".into())).0,
                Placement::Mapped
            );
        }
        assert_eq!(mem_available_bytes("MemAvailable: 2 kB"), Some(2048));
    }
}
