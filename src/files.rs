//! The files a user names, read and written one way everywhere.
//!
//! - Every read is bounded: a file is refused by its size before a byte of it is read, and only
//!   regular files are read (a FIFO or a device would block or never end).
//! - Every output lands atomically (temporary file beside it, fsync, rename) when the path is a
//!   regular file or new; a symlink is written through to its target, and a special file
//!   (`/dev/null`, `/dev/stdout`, a FIFO) is written to, never replaced.
//! - Every temporary file is registered, so that a process told to stop (SIGTERM, SIGINT,
//!   SIGHUP) removes its temporaries before it dies. See [`remove_temporaries_on_signal`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("`{}`: {cause}", crate::shown::path(path))]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "`{}` is {kind}, not a regular file; give the path of a file",
        crate::shown::path(path)
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "`{}` is {size} bytes, more than the {limit} bytes a {what} may be",
        crate::shown::path(path)
    )]
    TooLarge {
        path: PathBuf,
        what: &'static str,
        size: u64,
        limit: u64,
    },
}

impl FileError {
    /// Turns an I/O error on `path` into one that names it: `.map_err(FileError::io(path))`.
    pub fn io(path: &Path) -> impl Fn(std::io::Error) -> FileError + '_ {
        move |source| FileError::Io {
            path: path.to_path_buf(),
            cause: source,
        }
    }
}

/// What kind of thing `meta` describes, in words, for errors.
pub(crate) fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        return "a symbolic link";
    }
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// Opens `path` for reading if it is a regular file (symlinks followed). Returns the file and
/// its size.
pub fn open_regular(path: &Path) -> Result<(File, u64), FileError> {
    let file = open_checked(path, std::fs::OpenOptions::new().read(true), false)?;
    let len = file.metadata().map_err(FileError::io(path))?.len();
    Ok((file, len))
}

/// Opens `path` with `options` when it is a regular file, never following a symbolic link at
/// the path itself: for files a program keeps in a folder of its own (a cache's partial
/// downloads and locks), where a link or a FIFO put there by someone else must not lead the
/// writes elsewhere or block the program.
pub fn open_regular_here(path: &Path, options: &std::fs::OpenOptions) -> Result<File, FileError> {
    open_checked(path, options, true)
}

/// Opens without blocking on a special file (a FIFO nobody writes or reads would block an
/// open), then checks what was opened is a regular file, so that no swap of the path between
/// a check and the open gets past.
fn open_checked(
    path: &Path,
    options: &std::fs::OpenOptions,
    no_follow: bool,
) -> Result<File, FileError> {
    let mut options = options.clone();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let follow = if no_follow { libc::O_NOFOLLOW } else { 0 };
        options.custom_flags(libc::O_NONBLOCK | follow);
    }
    let not_regular = |meta: &std::fs::Metadata| FileError::NotRegular {
        path: path.to_path_buf(),
        kind: kind_of(meta),
    };
    let file = match options.open(path) {
        Ok(file) => file,
        // A link (refused by O_NOFOLLOW) or a FIFO without a reader (ENXIO) is told as what
        // it is, not as the open's errno.
        Err(e) => {
            let meta = match no_follow {
                true => std::fs::symlink_metadata(path),
                false => std::fs::metadata(path),
            };
            return Err(match meta {
                Ok(meta) if !meta.is_file() => not_regular(&meta),
                _ => FileError::io(path)(e),
            });
        }
    };
    let meta = file.metadata().map_err(FileError::io(path))?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    // Reads and writes of a regular file never block in the sense O_NONBLOCK changes, so the
    // flag is left on.
    Ok(file)
}

/// Writes `bytes` to `path` atomically (temporary file beside it, fsync, rename), where `path`
/// is a regular file or absent: anything else there (a symbolic link, a FIFO, a device) is
/// refused and left as it is. For files a program keeps in a folder of its own.
pub fn replace_regular(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(FileError::NotRegular {
                path: path.to_path_buf(),
                kind: kind_of(&meta),
            })
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(FileError::io(path)(e)),
        _ => {}
    }
    let io = FileError::io(path);
    let mut tmp = TempFile::beside(path, ".zimage-").map_err(&io)?;
    tmp.write_all(bytes).map_err(&io)?;
    tmp.as_file().sync_all().map_err(&io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// Reads a whole regular file of at most `limit` bytes; `what` names the file's role in the
/// error (`"manifest"`, `"tokenizer file"`).
pub fn read_bounded(path: &Path, limit: u64, what: &'static str) -> Result<Vec<u8>, FileError> {
    let (file, size) = open_regular(path)?;
    let too_large = |size| FileError::TooLarge {
        path: path.to_path_buf(),
        what,
        size,
        limit,
    };
    if size > limit {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // A file that grows while it is read is still cut at the limit.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(FileError::io(path))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The `len` bytes of `path` from `offset` on (a tensor inside a blob or a model file).
pub fn read_range(path: &Path, offset: u64, len: u64) -> Result<Vec<u8>, FileError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = FileError::io(path);
    let mut f = File::open(path).map_err(&io)?;
    f.seek(SeekFrom::Start(offset)).map_err(&io)?;
    let mut bytes = vec![0u8; len as usize];
    f.read_exact(&mut bytes).map_err(&io)?;
    Ok(bytes)
}

/// [`read_bounded`], as UTF-8 text.
pub fn read_text_bounded(path: &Path, limit: u64, what: &'static str) -> Result<String, FileError> {
    String::from_utf8(read_bounded(path, limit, what)?).map_err(|e| FileError::Io {
        path: path.to_path_buf(),
        cause: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
    })
}

/// Where bytes meant for `path` really go.
enum Destination {
    /// Replace this regular (or not yet existing) file atomically.
    Replace(PathBuf),
    /// Write into this special file as it is.
    WriteInto(PathBuf),
}

/// Follows symlinks to the path that is written: a dangling link creates its target.
fn destination(path: &Path) -> Result<Destination, FileError> {
    // The kernel follows links that `read_link` cannot spell as a path: `/dev/stdout` on a pipe
    // reads `/proc/self/fd/1` → `pipe:[…]`. A special file reached that way is written into.
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() && !meta.is_dir() {
            return Ok(Destination::WriteInto(path.to_path_buf()));
        }
    }
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&at) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Destination::Replace(at))
            }
            Err(e) => return Err(FileError::io(&at)(e)),
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&at).map_err(FileError::io(&at))?;
                at = match at.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            Ok(meta) if meta.is_file() => return Ok(Destination::Replace(at)),
            Ok(meta) if meta.is_dir() => {
                return Err(FileError::NotRegular {
                    path: path.to_path_buf(),
                    kind: "a directory",
                })
            }
            Ok(_) => return Ok(Destination::WriteInto(at)),
        }
    }
    Err(FileError::Io {
        path: path.to_path_buf(),
        cause: std::io::Error::other("too many levels of symbolic links"),
    })
}

/// Writes an output file the user named: atomically when it is a regular file or new,
/// through a symlink to its target, and into a special file (`/dev/null`, a FIFO) as it is.
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    match destination(path)? {
        Destination::WriteInto(at) => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&at)
                .map_err(FileError::io(path))?;
            f.write_all(bytes).map_err(FileError::io(path))
        }
        Destination::Replace(at) => {
            let io = FileError::io(path);
            let mut tmp = TempFile::beside(&at, ".zimage-").map_err(&io)?;
            tmp.write_all(bytes).map_err(&io)?;
            tmp.as_file().sync_all().map_err(&io)?;
            tmp.persist(&at).map_err(|e| io(e.error))?;
            Ok(())
        }
    }
}

/// The path a multi-step writer (zTensor, DFSN, safetensors conversion) should build its
/// temporary file beside and rename over: `path` itself, or a symlink's target. Special files
/// are refused, since such writers need a real file to seek in.
pub fn output_path(path: &Path) -> Result<PathBuf, FileError> {
    match destination(path)? {
        Destination::Replace(at) => Ok(at),
        Destination::WriteInto(at) => {
            let kind = std::fs::metadata(&at)
                .map(|m| kind_of(&m))
                .unwrap_or("a special file");
            Err(FileError::NotRegular {
                path: path.to_path_buf(),
                kind,
            })
        }
    }
}

/// Temporary files that exist now, by registration id.
static TEMPORARIES: Mutex<Option<HashMap<u64, PathBuf>>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A registration of a temporary path: removed from the list when dropped. The file itself is
/// the owner's to remove or rename; the list is only for a process that is told to stop.
#[derive(Debug)]
pub struct Registered(u64);

/// Records `path` as a temporary file of this process until the returned value is dropped.
pub fn register_temporary(path: &Path) -> Registered {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut list = TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner());
    list.get_or_insert_with(HashMap::new)
        .insert(id, path.to_path_buf());
    Registered(id)
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut list = TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = list.as_mut() {
            list.remove(&self.0);
        }
    }
}

/// Removes every registered temporary file; returns how many there were.
pub fn remove_temporaries() -> usize {
    let list = TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner());
    remove_listed(&list)
}

fn remove_listed(list: &Option<HashMap<u64, PathBuf>>) -> usize {
    let paths: Vec<&PathBuf> = list.iter().flat_map(|l| l.values()).collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    paths.len()
}

/// Set by a program that ends itself on SIGTERM and SIGINT (`zimage serve` drains first).
static TERMINATION_HANDLED_ELSEWHERE: AtomicBool = AtomicBool::new(false);

/// SIGTERM and SIGINT no longer end the process here: the caller handles them and ends the
/// process itself, after [`remove_temporaries`] (SIGHUP still ends it here).
pub fn handle_termination_elsewhere() {
    TERMINATION_HANDLED_ELSEWHERE.store(true, Ordering::SeqCst);
}

/// On SIGTERM, SIGINT or SIGHUP: remove this process's temporary files, then die of the signal
/// as if it had not been caught, so the parent sees the usual status. Call once, from `main`.
pub fn remove_temporaries_on_signal() {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]) else {
            return;
        };
        std::thread::spawn(move || {
            for signal in signals.forever() {
                if signal != SIGHUP && TERMINATION_HANDLED_ELSEWHERE.load(Ordering::SeqCst) {
                    continue;
                }
                // The list stays locked until the process is gone, so no thread registers (and
                // then creates) a file after the sweep. Paths are registered before their files
                // exist; a file created by a thread that registered it just before the lock was
                // taken is caught by the second sweep.
                let list = TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner());
                remove_listed(&list);
                std::thread::sleep(std::time::Duration::from_millis(20));
                remove_listed(&list);
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                std::process::exit(128 + signal);
            }
        });
    }
}

/// A temporary file beside the file it will replace, registered for removal on a signal and
/// removed when dropped unless persisted. Created readable by all (0644) on Unix, as a file
/// written in place would be, rather than the temp-file default of owner-only.
pub struct TempFile {
    file: tempfile::NamedTempFile,
    _registered: Registered,
}

impl TempFile {
    pub fn beside(target: &Path, prefix: &str) -> std::io::Result<TempFile> {
        let dir = target
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut builder = tempfile::Builder::new();
        builder.prefix(prefix);
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
        // Created with the list locked, so a signal's sweep sees it (or it is never made).
        let (file, registered) = {
            let mut list = TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner());
            let file = builder.tempfile_in(dir)?;
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            list.get_or_insert_with(HashMap::new)
                .insert(id, file.path().to_path_buf());
            (file, Registered(id))
        };
        Ok(TempFile {
            file,
            _registered: registered,
        })
    }

    /// A temporary file in the system's temporary folder, for scratch data.
    pub fn in_temp_dir(prefix: &str) -> std::io::Result<TempFile> {
        TempFile::beside(&std::env::temp_dir().join("scratch"), prefix)
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn as_file(&self) -> &File {
        self.file.as_file()
    }

    pub fn as_file_mut(&mut self) -> &mut File {
        self.file.as_file_mut()
    }

    /// Renames the file over `path`.
    pub fn persist(self, path: &Path) -> Result<File, tempfile::PersistError> {
        self.file.persist(path)
    }
}

impl Write for TempFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl std::io::Seek for TempFile {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.file.seek(pos)
    }
}

impl Read for TempFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.file.read(buf)
    }
}

/// Gives a format's error enum `in_file(path)`, which wraps an error in its `InFile { path,
/// cause }` variant unless it names its file already (`InFile`, or a `File` error).
macro_rules! in_file_error {
    ($error:ty) => {
        impl $error {
            /// Attaches the file this error came from (once).
            pub fn in_file(self, path: &std::path::Path) -> $error {
                match self {
                    e @ (Self::InFile { .. } | Self::File(_)) => e,
                    e => Self::InFile {
                        path: path.to_path_buf(),
                        cause: Box::new(e),
                    },
                }
            }
        }
    };
}
pub(crate) use in_file_error;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded_and_regular() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read_bounded(&p, 5, "test file").unwrap(), b"hello");
        let e = read_bounded(&p, 4, "test file").unwrap_err().to_string();
        assert!(
            e.contains("more than the 4 bytes a test file may be"),
            "{e}"
        );
        let e = read_bounded(dir.path(), 4, "test file")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory"), "{e}");
    }

    #[test]
    fn output_writes_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.png");
        let link = dir.path().join("link.png");
        std::fs::write(&target, b"old").unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("target.png", &link).unwrap();
            write_output(&link, b"new").unwrap();
            assert!(std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink());
            assert_eq!(std::fs::read(&target).unwrap(), b"new");
        }
    }

    #[cfg(unix)]
    #[test]
    fn own_files_are_opened_and_replaced_without_following_links_or_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let write = std::fs::OpenOptions::new().write(true).create(true).clone();
        let e = open_regular_here(&link, &write).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        let e = replace_regular(&link, b"new").unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // A FIFO nobody reads or writes: refused at once, for reading and for writing.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let e = open_regular_here(&fifo, &write).unwrap_err().to_string();
        assert!(e.contains("is a FIFO"), "{e}");
        let e = open_regular(&fifo).unwrap_err().to_string();
        assert!(e.contains("is a FIFO"), "{e}");
        let e = replace_regular(&fifo, b"new").unwrap_err().to_string();
        assert!(e.contains("is a FIFO"), "{e}");
        replace_regular(&target, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert!(open_regular_here(&target, &write).is_ok());
    }

    #[test]
    fn temporaries_are_listed_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let t = TempFile::beside(&dir.path().join("x"), ".t-").unwrap();
        let p = t.path().to_path_buf();
        let listed = |p: &Path| {
            let list = TEMPORARIES.lock().unwrap();
            list.as_ref().is_some_and(|l| l.values().any(|v| v == p))
        };
        assert!(listed(&p));
        drop(t);
        assert!(!p.exists());
        assert!(!listed(&p));
    }
}
