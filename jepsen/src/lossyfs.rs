//! `lossyfs`: a FUSE file system, held in memory, that loses everything
//! written but not synced when told to, as a power failure does. A node's
//! data directory is mounted on it so that a nemesis can cut the power under
//! RocksDB and check that every acknowledged write was really synced.
//!
//! The module owns the file system (the `lossyfs` subcommand runs [`serve`]),
//! its control socket, and the client of that socket ([`command`]).
//!
//! It keeps two states: the *current* one, which processes see, and the
//! *durable* one, which would survive a power failure. The durability model is
//! strict POSIX:
//!
//! - writes, truncates, `fallocate`, creates, `mkdir`, `unlink`, `rmdir`,
//!   `rename` and `link` change only the current state;
//! - `fsync`/`fdatasync` on a file makes its current data, size and attributes
//!   durable, but not the directory entry of a new file;
//! - `fsync` on a directory makes its current entries durable: an inode newly
//!   entered in it exists durably with whatever durable content it has (empty if
//!   it was never synced), and an entry removed from it is durably gone;
//! - a write to a file opened with `O_SYNC` or `O_DSYNC` syncs the file after
//!   it (the kernel does not send FUSE an fsync for it on a direct-I/O file);
//! - close (flush, release) makes nothing durable, and neither do `sync` and
//!   `syncfs`, which the kernel does not pass to FUSE.
//!
//! The `drop` command makes the current state a copy of the durable one:
//! unsynced data, creates, renames and unlinks are gone, and handles opened
//! before it fail with EIO. An unsynced rename or create may therefore be lost
//! even when the renamed or created file was synced.
//!
//! This is stricter than ext4, which in `data=ordered` mode usually also
//! persists a new file's directory entry on the file's `fsync`, because its
//! journal commits the whole transaction. A run valid under this model is valid
//! on ext4 in that respect; a program that skips a directory `fsync` may pass
//! on ext4 and fail here.
//!
//! Files are opened with `FOPEN_DIRECT_IO` and attributes and entries are
//! cached for no time, so the kernel never serves pages or sizes from before a
//! drop: every read and lookup comes here. Locks (`flock`, `fcntl`) are left to
//! the kernel, which keeps them locally.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{CString, OsStr, OsString};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use fuser::{
    AccessFlags, BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session, SessionACL, TimeOrNow, WriteFlags,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, SignalKind};

/// How long the kernel may cache attributes and entries: not at all, so that
/// nothing from before a drop is served.
const TTL: Duration = Duration::ZERO;
/// The block size reported by `stat` and `statfs`.
const BLOCK: u32 = 4096;
/// Blocks reported by `statfs`: 16 TiB, so nothing ever looks full.
const TOTAL_BLOCKS: u64 = 1 << 32;
/// The longest name an entry may have, as on ext4.
const NAME_MAX: usize = 255;
/// How often [`serve`] checks whether the file system was unmounted under it.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// How long the control socket waits for a command line.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

type Ino = u64;
const ROOT: Ino = INodeNo::ROOT.0;

/// What an inode holds.
#[derive(Clone)]
enum Body {
    File(Vec<u8>),
    /// `parent` is only kept for `..` and for refusing to move a directory
    /// into itself; in the durable state it is set again on a drop.
    Dir {
        entries: BTreeMap<OsString, Ino>,
        parent: Ino,
    },
}

/// An inode's contents and attributes, in either state.
#[derive(Clone)]
struct Node {
    body: Body,
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
}

impl Node {
    fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir { .. })
    }

    /// The same attributes with no contents: what an inode is durably when a
    /// directory sync enters it before it was ever synced itself.
    fn emptied(&self) -> Node {
        let body = match &self.body {
            Body::File(_) => Body::File(Vec::new()),
            Body::Dir { parent, .. } => Body::Dir { entries: BTreeMap::new(), parent: *parent },
        };
        let Node { perm, uid, gid, atime, mtime, ctime, .. } = *self;
        Node { body, perm, uid, gid, atime, mtime, ctime }
    }

    fn set_attrs_of(&mut self, other: &Node) {
        self.perm = other.perm;
        self.uid = other.uid;
        self.gid = other.gid;
        self.atime = other.atime;
        self.mtime = other.mtime;
        self.ctime = other.ctime;
    }
}

/// An inode as processes see it.
struct Current {
    node: Node,
    nlink: u32,
    /// Open handles (files and directories) since the last drop; an inode
    /// with no links is forgotten when its last handle is released.
    open: u32,
    /// The byte range written, truncated or allocated since the last sync
    /// (the bounding range of all of them). Outside it, and below both
    /// lengths, the current data equals the durable data.
    dirty: Option<(u64, u64)>,
}

impl Current {
    fn new(node: Node, nlink: u32) -> Current {
        Current { node, nlink, open: 0, dirty: None }
    }

    fn mark_dirty(&mut self, from: u64, to: u64) {
        if from < to {
            self.dirty = Some(match self.dirty {
                Some((lo, hi)) => (lo.min(from), hi.max(to)),
                None => (from, to),
            });
        }
    }

    fn attr(&self, ino: Ino) -> FileAttr {
        let (kind, size) = match &self.node.body {
            Body::File(data) => (FileType::RegularFile, data.len() as u64),
            Body::Dir { .. } => (FileType::Directory, u64::from(BLOCK)),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.node.atime,
            mtime: self.node.mtime,
            ctime: self.node.ctime,
            crtime: self.node.ctime,
            kind,
            perm: self.node.perm,
            nlink: self.nlink,
            uid: self.node.uid,
            gid: self.node.gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        }
    }
}

/// An inode as it would be after a power failure.
struct Durable {
    node: Node,
    /// Durable directory entries naming it. A durable inode that no durable
    /// entry names and that is gone from the current state is garbage.
    refs: u32,
}

/// A directory listing taken when `readdir` starts at offset 0, so that
/// entries added or removed meanwhile do not shift later pages.
type Listing = Vec<(Ino, FileType, OsString)>;

/// Both states, shared by the FUSE handler and the control socket.
struct State {
    current: HashMap<Ino, Current>,
    durable: HashMap<Ino, Durable>,
    /// Inode numbers are never reused, across drops too, so the kernel never
    /// confuses a new inode with one it cached.
    next_ino: Ino,
    /// Drops so far: the high 32 bits of every handle, so that handles opened
    /// before a drop are recognized as stale.
    epoch: u64,
    next_handle: u64,
    listings: HashMap<u64, Listing>,
}

fn now() -> SystemTime {
    SystemTime::now()
}

fn size_of(n: u64) -> Result<usize, Errno> {
    usize::try_from(n).map_err(|_| Errno::EFBIG)
}

/// Resizes `data` to `len`, filling with zeros, or fails with ENOSPC when
/// memory runs out instead of aborting.
fn resize(data: &mut Vec<u8>, len: usize) -> Result<(), Errno> {
    if len > data.len() {
        data.try_reserve(len - data.len()).map_err(|_| Errno::ENOSPC)?;
    }
    data.resize(len, 0);
    Ok(())
}

fn check_name(name: &OsStr) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(())
}

impl State {
    fn new() -> State {
        let t = now();
        let root = Node {
            body: Body::Dir { entries: BTreeMap::new(), parent: ROOT },
            perm: 0o755,
            uid: 0,
            gid: 0,
            atime: t,
            mtime: t,
            ctime: t,
        };
        State {
            current: HashMap::from([(ROOT, Current::new(root.clone(), 2))]),
            durable: HashMap::from([(ROOT, Durable { node: root, refs: 1 })]),
            next_ino: ROOT + 1,
            epoch: 0,
            next_handle: 0,
            listings: HashMap::new(),
        }
    }

    fn get(&self, ino: Ino) -> Result<&Current, Errno> {
        self.current.get(&ino).ok_or(Errno::ENOENT)
    }

    fn get_mut(&mut self, ino: Ino) -> Result<&mut Current, Errno> {
        self.current.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn entries(&self, dir: Ino) -> Result<&BTreeMap<OsString, Ino>, Errno> {
        match &self.get(dir)?.node.body {
            Body::Dir { entries, .. } => Ok(entries),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> Result<&mut BTreeMap<OsString, Ino>, Errno> {
        let t = now();
        let current = self.get_mut(dir)?;
        current.node.mtime = t;
        current.node.ctime = t;
        match &mut current.node.body {
            Body::Dir { entries, .. } => Ok(entries),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn child(&self, dir: Ino, name: &OsStr) -> Result<Ino, Errno> {
        self.entries(dir)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn is_dir(&self, ino: Ino) -> Result<bool, Errno> {
        Ok(self.get(ino)?.node.is_dir())
    }

    /// Fails with EIO for a handle opened before the last drop.
    fn check(&self, fh: FileHandle) -> Result<(), Errno> {
        if fh.0 >> 32 == self.epoch {
            Ok(())
        } else {
            Err(Errno::EIO)
        }
    }

    fn lookup(&self, parent: Ino, name: &OsStr) -> Result<FileAttr, Errno> {
        let ino = self.child(parent, name)?;
        Ok(self.get(ino)?.attr(ino))
    }

    /// Enters a new inode under `parent`.
    fn make(&mut self, req: &Request, parent: Ino, name: &OsStr, dir: bool, mode: u32) -> Result<FileAttr, Errno> {
        check_name(name)?;
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let body = if dir { Body::Dir { entries: BTreeMap::new(), parent } } else { Body::File(Vec::new()) };
        let t = now();
        let node =
            Node { body, perm: (mode & 0o7777) as u16, uid: req.uid(), gid: req.gid(), atime: t, mtime: t, ctime: t };
        let current = Current::new(node, if dir { 2 } else { 1 });
        let attr = current.attr(ino);
        self.current.insert(ino, current);
        self.entries_mut(parent)?.insert(name.to_os_string(), ino);
        if dir {
            self.get_mut(parent)?.nlink += 1;
        }
        Ok(attr)
    }

    fn open(&mut self, ino: Ino, dir: bool) -> Result<FileHandle, Errno> {
        let current = self.get_mut(ino)?;
        match (dir, current.node.is_dir()) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            _ => {}
        }
        current.open += 1;
        self.next_handle += 1;
        Ok(FileHandle(self.epoch << 32 | (self.next_handle & 0xffff_ffff)))
    }

    fn release(&mut self, ino: Ino, fh: FileHandle) {
        self.listings.remove(&fh.0);
        // Open counts start again at a drop: a stale handle counts for nothing.
        if self.check(fh).is_err() {
            return;
        }
        if let Some(current) = self.current.get_mut(&ino) {
            current.open = current.open.saturating_sub(1);
            self.forget_if_gone(ino);
        }
    }

    /// Forgets an inode that no entry names and no handle holds, then its
    /// durable copy if nothing durable names it either.
    fn forget_if_gone(&mut self, ino: Ino) {
        if self.current.get(&ino).is_some_and(|c| c.nlink == 0 && c.open == 0) {
            self.current.remove(&ino);
            self.collect(ino);
        }
    }

    /// Removes durable inodes, starting at `ino`, that neither state can
    /// reach any more (a removed durable directory releases its entries).
    fn collect(&mut self, ino: Ino) {
        let mut stack = vec![ino];
        while let Some(ino) = stack.pop() {
            if ino == ROOT || self.current.contains_key(&ino) || self.durable.get(&ino).is_none_or(|d| d.refs > 0) {
                continue;
            }
            if let Some(Durable { node: Node { body: Body::Dir { entries, .. }, .. }, .. }) = self.durable.remove(&ino)
            {
                for child in entries.into_values() {
                    if let Some(d) = self.durable.get_mut(&child) {
                        d.refs = d.refs.saturating_sub(1);
                    }
                    stack.push(child);
                }
            }
        }
    }

    fn file(&self, ino: Ino, fh: FileHandle) -> Result<&Vec<u8>, Errno> {
        self.check(fh)?;
        match &self.get(ino)?.node.body {
            Body::File(data) => Ok(data),
            Body::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// The current inode of an open file and its data.
    fn file_mut(&mut self, ino: Ino, fh: FileHandle) -> Result<&mut Current, Errno> {
        self.check(fh)?;
        let current = self.get_mut(ino)?;
        if current.node.is_dir() {
            return Err(Errno::EISDIR);
        }
        Ok(current)
    }

    fn read(&self, ino: Ino, fh: FileHandle, offset: u64, size: u32) -> Result<&[u8], Errno> {
        let data = self.file(ino, fh)?;
        let from = size_of(offset)?.min(data.len());
        let to = from.saturating_add(size as usize).min(data.len());
        Ok(&data[from..to])
    }

    fn write(&mut self, ino: Ino, fh: FileHandle, offset: u64, bytes: &[u8]) -> Result<u32, Errno> {
        let current = self.file_mut(ino, fh)?;
        let Body::File(data) = &mut current.node.body else { return Err(Errno::EISDIR) };
        let from = size_of(offset)?;
        let to = from.checked_add(bytes.len()).ok_or(Errno::EFBIG)?;
        let old_len = data.len();
        if to > old_len {
            resize(data, to)?;
        }
        data[from..to].copy_from_slice(bytes);
        // Bytes between the old end and a write beyond it became zeros.
        current.mark_dirty(offset.min(old_len as u64), to as u64);
        let t = now();
        current.node.mtime = t;
        current.node.ctime = t;
        Ok(bytes.len() as u32)
    }

    fn truncate(current: &mut Current, len: u64) -> Result<(), Errno> {
        let Body::File(data) = &mut current.node.body else { return Err(Errno::EISDIR) };
        let old = data.len() as u64;
        resize(data, size_of(len)?)?;
        current.mark_dirty(old.min(len), old.max(len));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        ino: Ino,
        fh: Option<FileHandle>,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> Result<FileAttr, Errno> {
        if let Some(fh) = fh {
            self.check(fh)?;
        }
        let current = self.get_mut(ino)?;
        let t = now();
        let at = |time: TimeOrNow| match time {
            TimeOrNow::SpecificTime(time) => time,
            TimeOrNow::Now => t,
        };
        if let Some(len) = size {
            State::truncate(current, len)?;
            current.node.mtime = t;
        }
        if let Some(mode) = mode {
            current.node.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = uid {
            current.node.uid = uid;
        }
        if let Some(gid) = gid {
            current.node.gid = gid;
        }
        if let Some(atime) = atime {
            current.node.atime = at(atime);
        }
        if let Some(mtime) = mtime {
            current.node.mtime = at(mtime);
        }
        current.node.ctime = t;
        Ok(current.attr(ino))
    }

    /// Mode 0 extends the file with zeros; `FALLOC_FL_KEEP_SIZE` alone
    /// reserves nothing (memory is not disk) and succeeds; with
    /// `FALLOC_FL_PUNCH_HOLE` it zeroes the range.
    fn fallocate(&mut self, ino: Ino, fh: FileHandle, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        let current = self.file_mut(ino, fh)?;
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        let Body::File(data) = &mut current.node.body else { return Err(Errno::EISDIR) };
        let len = data.len() as u64;
        match mode {
            0 if end > len => State::truncate(current, end)?,
            0 | libc::FALLOC_FL_KEEP_SIZE => return Ok(()),
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                let (from, to) = (offset.min(len), end.min(len));
                data[from as usize..to as usize].fill(0);
                current.mark_dirty(from, to);
            }
            _ => return Err(Errno::EOPNOTSUPP),
        }
        let t = now();
        current.node.mtime = t;
        current.node.ctime = t;
        Ok(())
    }

    fn unlink(&mut self, parent: Ino, name: &OsStr) -> Result<(), Errno> {
        let ino = self.child(parent, name)?;
        if self.is_dir(ino)? {
            return Err(Errno::EISDIR);
        }
        self.entries_mut(parent)?.remove(name);
        let current = self.get_mut(ino)?;
        current.nlink = current.nlink.saturating_sub(1);
        current.node.ctime = now();
        self.forget_if_gone(ino);
        Ok(())
    }

    fn rmdir(&mut self, parent: Ino, name: &OsStr) -> Result<(), Errno> {
        let ino = self.child(parent, name)?;
        if !self.entries(ino)?.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        self.entries_mut(parent)?.remove(name);
        self.get_mut(ino)?.nlink = 0;
        let parent = self.get_mut(parent)?;
        parent.nlink = parent.nlink.saturating_sub(1);
        self.forget_if_gone(ino);
        Ok(())
    }

    /// Whether `dir` is `ancestor` or lies under it.
    fn is_under(&self, dir: Ino, ancestor: Ino) -> bool {
        let mut at = dir;
        loop {
            if at == ancestor {
                return true;
            }
            match self.current.get(&at).map(|c| &c.node.body) {
                Some(Body::Dir { parent, .. }) if at != ROOT => at = *parent,
                _ => return false,
            }
        }
    }

    fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        check_name(new_name)?;
        let ino = self.child(parent, name)?;
        let target = self.entries(new_parent)?.get(new_name).copied();
        let dir = self.is_dir(ino)?;
        if let Some(target) = target {
            if target == ino {
                return Ok(());
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            match (dir, self.is_dir(target)?) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !self.entries(target)?.is_empty() => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        if dir && self.is_under(new_parent, ino) {
            return Err(Errno::EINVAL);
        }
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(new_parent)?.insert(new_name.to_os_string(), ino);
        let moved = self.get_mut(ino)?;
        moved.node.ctime = now();
        if let Body::Dir { parent: p, .. } = &mut moved.node.body {
            *p = new_parent;
        }
        if dir {
            let old_parent = self.get_mut(parent)?;
            old_parent.nlink = old_parent.nlink.saturating_sub(1);
            self.get_mut(new_parent)?.nlink += 1;
        }
        if let Some(target) = target {
            let replaced = self.get_mut(target)?;
            replaced.node.ctime = now();
            if replaced.node.is_dir() {
                replaced.nlink = 0;
                let new_parent = self.get_mut(new_parent)?;
                new_parent.nlink = new_parent.nlink.saturating_sub(1);
            } else {
                replaced.nlink = replaced.nlink.saturating_sub(1);
            }
            self.forget_if_gone(target);
        }
        Ok(())
    }

    fn link(&mut self, ino: Ino, new_parent: Ino, new_name: &OsStr) -> Result<FileAttr, Errno> {
        check_name(new_name)?;
        if self.is_dir(ino)? {
            return Err(Errno::EPERM);
        }
        if self.entries(new_parent)?.contains_key(new_name) {
            return Err(Errno::EEXIST);
        }
        self.entries_mut(new_parent)?.insert(new_name.to_os_string(), ino);
        let current = self.get_mut(ino)?;
        current.nlink += 1;
        current.node.ctime = now();
        Ok(current.attr(ino))
    }

    /// `fsync` on a file: its current data, size and attributes become
    /// durable, copying only what changed since the last sync.
    fn sync_file(&mut self, ino: Ino) -> Result<(), Errno> {
        let current = self.current.get_mut(&ino).ok_or(Errno::ENOENT)?;
        let Body::File(data) = &current.node.body else { return self.sync_dir(ino) };
        let durable = self.durable.entry(ino).or_insert_with(|| Durable { node: current.node.emptied(), refs: 0 });
        let Body::File(kept) = &mut durable.node.body else { return Err(Errno::EIO) };
        let old_len = kept.len();
        resize(kept, data.len())?;
        let mut copy = |from: usize, to: usize| {
            let to = to.min(data.len());
            if from < to {
                kept[from..to].copy_from_slice(&data[from..to]);
            }
        };
        // Bytes past the old durable end, and the dirty range.
        copy(old_len, data.len());
        if let Some((from, to)) = current.dirty {
            copy(from as usize, to as usize);
        }
        durable.node.set_attrs_of(&current.node);
        current.dirty = None;
        Ok(())
    }

    /// `fsync` on a directory: its current entries become durable.
    fn sync_dir(&mut self, ino: Ino) -> Result<(), Errno> {
        let current = self.current.get(&ino).ok_or(Errno::ENOENT)?;
        let Body::Dir { entries, .. } = &current.node.body else { return Err(Errno::ENOTDIR) };
        let entries = entries.clone();
        let durable = self.durable.entry(ino).or_insert_with(|| Durable { node: current.node.emptied(), refs: 0 });
        durable.node.set_attrs_of(&current.node);
        let Body::Dir { entries: kept, .. } = &mut durable.node.body else { return Err(Errno::EIO) };
        let old = std::mem::replace(kept, entries.clone());
        // Count new references before dropping old ones, so that an inode
        // renamed within the directory is never collected in between.
        for (name, child) in &entries {
            if old.get(name) != Some(child) {
                let durable = match self.durable.entry(*child) {
                    Entry::Occupied(durable) => durable.into_mut(),
                    Entry::Vacant(vacant) => {
                        let node = self.current.get(child).ok_or(Errno::EIO)?.node.emptied();
                        vacant.insert(Durable { node, refs: 0 })
                    }
                };
                durable.refs += 1;
            }
        }
        for (name, child) in old {
            if entries.get(&name) != Some(&child) {
                if let Some(d) = self.durable.get_mut(&child) {
                    d.refs = d.refs.saturating_sub(1);
                }
                self.collect(child);
            }
        }
        Ok(())
    }

    /// Inodes that a drop would keep: those durably reachable from the root.
    fn durably_reachable(&self) -> HashSet<Ino> {
        let mut seen = HashSet::from([ROOT]);
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if let Some(Body::Dir { entries, .. }) = self.durable.get(&ino).map(|d| &d.node.body) {
                stack.extend(entries.values().filter(|&&child| seen.insert(child)));
            }
        }
        seen
    }

    /// Bytes of file data that are current but would not survive a drop
    /// (approximately: all of a file a drop would lose, else its dirty range
    /// or its growth past the durable end).
    fn unsynced_bytes(&self) -> u64 {
        let reachable = self.durably_reachable();
        let mut total = 0;
        for (ino, current) in &self.current {
            let Body::File(data) = &current.node.body else { continue };
            let len = data.len() as u64;
            let kept = match self.durable.get(ino).map(|d| &d.node.body) {
                Some(Body::File(kept)) if reachable.contains(ino) => kept.len() as u64,
                _ => {
                    total += len;
                    continue;
                }
            };
            let dirty = current.dirty.map_or(0, |(from, to)| to.min(len).saturating_sub(from));
            total += dirty.max(len.saturating_sub(kept));
        }
        total
    }

    /// Directory entries that differ between the current and durable states.
    fn unsynced_entries(&self) -> u64 {
        let none = BTreeMap::new();
        let mut total = 0;
        for (ino, current) in &self.current {
            let Body::Dir { entries, .. } = &current.node.body else { continue };
            let kept = match self.durable.get(ino).map(|d| &d.node.body) {
                Some(Body::Dir { entries, .. }) => entries,
                _ => &none,
            };
            total += entries.iter().filter(|(name, ino)| kept.get(*name) != Some(ino)).count() as u64;
            total += kept.keys().filter(|name| !entries.contains_key(*name)).count() as u64;
        }
        total
    }

    /// The power failure: the current state becomes a copy of what is durably
    /// reachable from the root. Returns the bytes and entries lost.
    fn drop_unsynced(&mut self) -> (u64, u64) {
        let lost = (self.unsynced_bytes(), self.unsynced_entries());
        let mut old = std::mem::take(&mut self.durable);
        // Walks directories breadth-first from the root (never collected),
        // recounting references. Unsynced renames of directories can leave one
        // durably in two places (even in a cycle); only the first place found
        // keeps it, so the result is a tree.
        let mut queue = VecDeque::new();
        if let Some(mut root) = old.remove(&ROOT) {
            root.refs = 1;
            self.durable.insert(ROOT, root);
            queue.push_back(ROOT);
        }
        while let Some(dir) = queue.pop_front() {
            let Some(Body::Dir { entries, .. }) = self.durable.get_mut(&dir).map(|d| &mut d.node.body) else {
                continue;
            };
            let entries = std::mem::take(entries);
            let mut kept = BTreeMap::new();
            for (name, child) in entries {
                if let Some(d) = self.durable.get_mut(&child) {
                    if !d.node.is_dir() {
                        d.refs += 1;
                        kept.insert(name, child);
                    }
                } else if let Some(mut d) = old.remove(&child) {
                    d.refs = 1;
                    if let Body::Dir { parent, .. } = &mut d.node.body {
                        *parent = dir;
                        queue.push_back(child);
                    }
                    self.durable.insert(child, d);
                    kept.insert(name, child);
                }
            }
            if let Some(Body::Dir { entries, .. }) = self.durable.get_mut(&dir).map(|d| &mut d.node.body) {
                *entries = kept;
            }
        }
        self.current = self
            .durable
            .iter()
            .map(|(&ino, d)| {
                let nlink = match &d.node.body {
                    Body::File(_) => d.refs,
                    Body::Dir { entries, .. } => {
                        let subdirs = entries.values().filter(|c| self.durable.get(c).is_some_and(|c| c.node.is_dir()));
                        2 + subdirs.count() as u32
                    }
                };
                (ino, Current::new(d.node.clone(), nlink))
            })
            .collect();
        self.epoch += 1;
        self.listings.clear();
        lost
    }

    /// Current regular files and their bytes.
    fn usage(&self) -> (usize, u64) {
        let mut files = 0;
        let mut bytes = 0;
        for current in self.current.values() {
            if let Body::File(data) = &current.node.body {
                files += 1;
                bytes += data.len() as u64;
            }
        }
        (files, bytes)
    }

    fn readdir(&mut self, ino: Ino, fh: FileHandle, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        self.check(fh)?;
        if offset == 0 || !self.listings.contains_key(&fh.0) {
            let Body::Dir { entries, parent } = &self.get(ino)?.node.body else { return Err(Errno::ENOTDIR) };
            let mut listing = vec![(ino, FileType::Directory, ".".into()), (*parent, FileType::Directory, "..".into())];
            for (name, &child) in entries {
                let kind = match self.current.get(&child) {
                    Some(c) if c.node.is_dir() => FileType::Directory,
                    _ => FileType::RegularFile,
                };
                listing.push((child, kind, name.clone()));
            }
            self.listings.insert(fh.0, listing);
        }
        let listing = self.listings.get(&fh.0).map_or(&[][..], |l| &l[..]);
        for (i, (child, kind, name)) in listing.iter().enumerate().skip(size_of(offset)?) {
            if reply.add(INodeNo(*child), i as u64 + 1, *kind, name) {
                break;
            }
        }
        Ok(())
    }
}

/// The FUSE handler: every operation locks the shared state.
struct LossyFs {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // An operation that panicked left the state as consistent as any other
    // point between two operations; keep serving.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn reply_entry(result: Result<FileAttr, Errno>, reply: ReplyEntry) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(result: Result<(), Errno>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn reply_open(result: Result<FileHandle, Errno>, flags: FopenFlags, reply: ReplyOpen) {
    match result {
        Ok(fh) => reply.opened(fh, flags),
        Err(e) => reply.error(e),
    }
}

impl LossyFs {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl fuser::Filesystem for LossyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry(self.lock().lookup(parent.0, name), reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let state = self.lock();
        let result = fh.map_or(Ok(()), |fh| state.check(fh)).and_then(|()| Ok(state.get(ino.0)?.attr(ino.0)));
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.lock().setattr(ino.0, fh, mode, uid, gid, size, atime, mtime) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Only regular files: no devices, FIFOs or sockets.
        if mode & libc::S_IFMT == libc::S_IFREG {
            reply_entry(self.lock().make(req, parent.0, name, false, mode & !umask), reply);
        } else {
            reply.error(Errno::EPERM);
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        reply_entry(self.lock().make(req, parent.0, name, true, mode & !umask), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.lock().unlink(parent.0, name), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.lock().rmdir(parent.0, name), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.lock().rename(parent.0, name, new_parent.0, new_name, flags), reply);
    }

    fn link(&self, _req: &Request, ino: INodeNo, new_parent: INodeNo, new_name: &OsStr, reply: ReplyEntry) {
        reply_entry(self.lock().link(ino.0, new_parent.0, new_name), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply_open(self.lock().open(ino.0, false), FopenFlags::FOPEN_DIRECT_IO, reply);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.lock().read(ino.0, fh, offset, size) {
            Ok(data) => reply.data(data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut state = self.lock();
        let mut result = state.write(ino.0, fh, offset, data);
        if flags.0 & libc::O_DSYNC != 0 {
            result = result.and_then(|written| state.sync_file(ino.0).map(|()| written));
        }
        match result {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply_empty(self.lock().check(fh), reply);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().release(ino.0, fh);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut state = self.lock();
        reply_empty(state.check(fh).and_then(|()| state.sync_file(ino.0)), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply_open(self.lock().open(ino.0, true), FopenFlags::empty(), reply);
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.lock().readdir(ino.0, fh, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.lock().release(ino.0, fh);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut state = self.lock();
        reply_empty(state.check(fh).and_then(|()| state.sync_dir(ino.0)), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (files, bytes) = self.lock().usage();
        let free = TOTAL_BLOCKS.saturating_sub(bytes.div_ceil(u64::from(BLOCK)));
        let inodes = u64::from(u32::MAX);
        let free_inodes = inodes.saturating_sub(files as u64);
        reply.statfs(TOTAL_BLOCKS, free, free, inodes, free_inodes, BLOCK, NAME_MAX as u32, BLOCK);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permissions are the kernel's (`default_permissions`); this is only
        // asked whether the inode exists.
        reply_empty(self.lock().get(ino.0).map(|_| ()), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = self.lock();
        let result = state.make(req, parent.0, name, false, mode & !umask).and_then(|attr| {
            let fh = state.open(attr.ino.0, false)?;
            Ok((attr, fh))
        });
        match result {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.lock().fallocate(ino.0, fh, offset, length, mode), reply);
    }
}

/// Binds the control socket, replacing a stale one.
fn bind(control: &Path) -> anyhow::Result<UnixListener> {
    match std::fs::remove_file(control) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the stale socket {}", control.display())),
    }
    UnixListener::bind(control).with_context(|| format!("binding {}", control.display()))
}

/// Mounts a file system over `state` at `mount` and serves it on a
/// background thread until the returned session is dropped or unmounted.
fn mount_fs(mount: &Path, state: Arc<Mutex<State>>) -> anyhow::Result<BackgroundSession> {
    let mut config = Config::default();
    config.mount_options =
        vec![MountOption::FSName("lossyfs".into()), MountOption::DefaultPermissions, MountOption::NoAtime];
    config.acl = SessionACL::All;
    let session =
        Session::new(LossyFs { state }, mount, &config).with_context(|| format!("mounting {}", mount.display()))?;
    Ok(session.spawn()?)
}

/// Unmounts; a mount still in use (a process holds files open on it) is
/// detached instead, and ends when that process lets go or this one exits.
fn unmount(session: BackgroundSession, mount: &Path) -> anyhow::Result<()> {
    let Err(e) = session.umount_and_join() else { return Ok(()) };
    let path = CString::new(mount.as_os_str().as_bytes())?;
    // SAFETY: `path` is a valid NUL-terminated string for the call's duration.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(e).with_context(|| format!("unmounting {}", mount.display()));
    }
    Ok(())
}

/// Answers control connections until the process ends.
fn listen(listener: UnixListener, state: &Mutex<State>) {
    for conn in listener.incoming() {
        if let Err(e) = conn.map_err(anyhow::Error::from).and_then(|conn| answer(&conn, state)) {
            eprintln!("lossyfs: control connection: {e:#}");
        }
    }
}

fn answer(conn: &UnixStream, state: &Mutex<State>) -> anyhow::Result<()> {
    conn.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    let reply = match line.trim() {
        "drop" => {
            let (bytes, entries) = lock(state).drop_unsynced();
            format!("ok dropped_bytes={bytes} dropped_entries={entries}\n")
        }
        "stats" => {
            let state = lock(state);
            let ((files, bytes), unsynced) = (state.usage(), state.unsynced_bytes());
            format!("ok files={files} bytes={bytes} unsynced_bytes={unsynced}\n")
        }
        other => format!("err unknown command {other:?}\n"),
    };
    let mut conn = conn;
    conn.write_all(reply.as_bytes())?;
    Ok(())
}

/// Runs the file system at `mount`, taking commands on the Unix socket
/// `control`, until it is unmounted or the process gets SIGTERM or SIGINT
/// (which unmount it, lazily if it is in use). Prints one line to stderr once
/// it is mounted.
///
/// Commands are one line each, answered with one line: `drop` loses
/// everything not synced and answers `ok dropped_bytes=<N>
/// dropped_entries=<M>` (file bytes lost, approximately, and directory entries
/// that differed); `stats` answers `ok files=<n> bytes=<b> unsynced_bytes=<u>`.
/// Anything else gets `err ...`.
pub fn serve(mount: &Path, control: &Path) -> anyhow::Result<()> {
    let mount = &std::fs::canonicalize(mount).with_context(|| format!("the mount point {}", mount.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int) = {
        let _entered = runtime.enter();
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?)
    };
    let state = Arc::new(Mutex::new(State::new()));
    let listener = bind(control)?;
    let session = mount_fs(mount, Arc::clone(&state))?;
    std::thread::Builder::new().name("lossyfs-control".into()).spawn(move || listen(listener, &state))?;
    // One write, so that the line is never interleaved with another.
    let line = format!("lossyfs: mounted {} (control socket {})\n", mount.display(), control.display());
    std::io::stderr().write_all(line.as_bytes())?;
    let signalled = runtime.block_on(async {
        loop {
            tokio::select! {
                _ = term.recv() => return true,
                _ = int.recv() => return true,
                () = tokio::time::sleep(POLL_EVERY) => if session.guard.is_finished() { return false },
            }
        }
    });
    let result = if signalled {
        unmount(session, mount)
    } else {
        session.join().with_context(|| format!("serving {}", mount.display()))
    };
    let _ = std::fs::remove_file(control);
    result
}

/// Sends one command line (`drop` or `stats`, with or without the newline)
/// to the file system whose control socket is `control`, and returns its
/// reply line (without the newline). A reply other than `ok ...` is an error.
pub async fn command(control: &Path, line: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::UnixStream::connect(control)
        .await
        .with_context(|| format!("connecting to lossyfs at {}", control.display()))?;
    stream.write_all(format!("{}\n", line.trim_end()).as_bytes()).await?;
    let mut reply = String::new();
    tokio::io::BufReader::new(stream).read_line(&mut reply).await?;
    let reply = reply.trim_end();
    if !reply.starts_with("ok ") {
        bail!("lossyfs at {}: {}: {reply:?}", control.display(), line.trim_end());
    }
    Ok(reply.to_string())
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File, OpenOptions};
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::path::PathBuf;

    use super::*;

    /// A file system mounted under /tmp for one test, with its control
    /// socket; unmounted when dropped (on failure too).
    struct Mounted {
        root: PathBuf,
        mnt: PathBuf,
        control: PathBuf,
        session: Option<BackgroundSession>,
    }

    impl Mounted {
        fn new(test: &str) -> Mounted {
            let root = std::env::temp_dir().join(format!("lossyfs-{}-{test}", std::process::id()));
            let mnt = root.join("mnt");
            fs::create_dir_all(&mnt).unwrap();
            let control = root.join("control.sock");
            let state = Arc::new(Mutex::new(State::new()));
            let listener = bind(&control).unwrap();
            let shared = Arc::clone(&state);
            std::thread::spawn(move || listen(listener, &shared));
            let session = mount_fs(&mnt, state).unwrap();
            Mounted { root, mnt, control, session: Some(session) }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.mnt.join(name)
        }

        fn try_command(&self, line: &str) -> anyhow::Result<String> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(command(&self.control, line))
        }

        fn command(&self, line: &str) -> String {
            self.try_command(line).unwrap()
        }

        fn drop_unsynced(&self) -> String {
            self.command("drop")
        }

        /// Writes a file, fsyncs it, and fsyncs its directory.
        fn write_synced(&self, name: &str, data: &[u8]) {
            let mut file = File::create(self.path(name)).unwrap();
            file.write_all(data).unwrap();
            file.sync_all().unwrap();
            self.sync_dir(Path::new(name).parent().and_then(Path::to_str).unwrap_or(""));
        }

        fn sync_dir(&self, name: &str) {
            File::open(self.path(name)).unwrap().sync_all().unwrap();
        }
    }

    impl Drop for Mounted {
        fn drop(&mut self) {
            if let Some(session) = self.session.take() {
                if let Err(e) = unmount(session, &self.mnt) {
                    eprintln!("unmounting {}: {e:#}", self.mnt.display());
                }
            }
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn synced_file_and_directory_survive_a_drop() {
        let fs = Mounted::new("synced");
        fs.write_synced("a", b"hello");
        assert_eq!(fs.drop_unsynced(), "ok dropped_bytes=0 dropped_entries=0");
        assert_eq!(fs::read(fs.path("a")).unwrap(), b"hello");
        assert_eq!(fs.command("stats"), "ok files=1 bytes=5 unsynced_bytes=0");
    }

    #[test]
    fn data_appended_after_the_fsync_is_lost() {
        let fs = Mounted::new("append");
        fs.write_synced("log", b"synced;");
        let mut file = OpenOptions::new().append(true).open(fs.path("log")).unwrap();
        file.write_all(b"not synced").unwrap();
        assert_eq!(fs.command("stats"), "ok files=1 bytes=17 unsynced_bytes=10");
        drop(file);
        assert_eq!(fs.drop_unsynced(), "ok dropped_bytes=10 dropped_entries=0");
        assert_eq!(fs::read(fs.path("log")).unwrap(), b"synced;");

        // fdatasync counts as well, and only what changed is copied.
        let mut file = OpenOptions::new().read(true).write(true).open(fs.path("log")).unwrap();
        file.seek(SeekFrom::Start(2)).unwrap();
        file.write_all(b"NC").unwrap();
        file.seek(SeekFrom::End(0)).unwrap();
        file.write_all(b"more").unwrap();
        assert_eq!(unsafe { libc::fdatasync(file.as_raw_fd()) }, 0);
        file.write_all(b"lost").unwrap();
        drop(file);
        fs.drop_unsynced();
        assert_eq!(fs::read(fs.path("log")).unwrap(), b"syNCed;more");

        // So does every write to an O_DSYNC file.
        let mut file = OpenOptions::new().append(true).custom_flags(libc::O_DSYNC).open(fs.path("log")).unwrap();
        file.write_all(b";dsync").unwrap();
        drop(file);
        fs.drop_unsynced();
        assert_eq!(fs::read(fs.path("log")).unwrap(), b"syNCed;more;dsync");
    }

    #[test]
    fn file_whose_directory_was_not_synced_is_lost() {
        let fs = Mounted::new("nodirsync");
        fs.write_synced("kept", b"1");
        let mut file = File::create(fs.path("new")).unwrap();
        file.write_all(b"data").unwrap();
        file.sync_all().unwrap();
        drop(file);
        fs::create_dir(fs.path("sub")).unwrap();
        fs.write_synced("sub/inner", b"x");
        assert_eq!(fs.drop_unsynced(), "ok dropped_bytes=5 dropped_entries=2");
        assert!(!fs.path("new").exists());
        assert!(!fs.path("sub").exists());
        assert_eq!(fs::read(fs.path("kept")).unwrap(), b"1");

        // Entered by a directory sync but never synced itself: empty.
        let mut file = File::create(fs.path("empty")).unwrap();
        file.write_all(b"data").unwrap();
        fs.sync_dir(".");
        drop(file);
        fs.drop_unsynced();
        assert_eq!(fs::read(fs.path("empty")).unwrap(), b"");
    }

    #[test]
    fn rename_over_a_file_needs_a_directory_sync() {
        let fs = Mounted::new("rename");
        fs.write_synced("CURRENT", b"MANIFEST-1\n");
        let replace = |data: &[u8]| {
            let mut tmp = File::create(fs.path("CURRENT.tmp")).unwrap();
            tmp.write_all(data).unwrap();
            tmp.sync_all().unwrap();
            fs::rename(fs.path("CURRENT.tmp"), fs.path("CURRENT")).unwrap();
        };
        replace(b"MANIFEST-2\n");
        assert_eq!(fs::read(fs.path("CURRENT")).unwrap(), b"MANIFEST-2\n");
        fs.drop_unsynced();
        assert_eq!(fs::read(fs.path("CURRENT")).unwrap(), b"MANIFEST-1\n");
        assert!(!fs.path("CURRENT.tmp").exists());

        replace(b"MANIFEST-3\n");
        fs.sync_dir(".");
        fs.drop_unsynced();
        assert_eq!(fs::read(fs.path("CURRENT")).unwrap(), b"MANIFEST-3\n");
        assert!(!fs.path("CURRENT.tmp").exists());
        assert_eq!(fs::read_dir(&fs.mnt).unwrap().count(), 1);
    }

    #[test]
    fn unlink_needs_a_directory_sync() {
        let fs = Mounted::new("unlink");
        fs.write_synced("a", b"still here");
        fs.write_synced("b", b"gone");
        fs::remove_file(fs.path("a")).unwrap();
        fs::remove_file(fs.path("b")).unwrap();
        fs.sync_dir(".");
        fs.write_synced("c", b"c");
        fs::remove_file(fs.path("c")).unwrap();
        assert!(!fs.path("c").exists());
        fs.drop_unsynced();
        assert!(!fs.path("a").exists());
        assert!(!fs.path("b").exists());
        assert_eq!(fs::read(fs.path("c")).unwrap(), b"c");
    }

    #[test]
    fn truncate_fallocate_and_links() {
        let fs = Mounted::new("truncate");
        fs.write_synced("f", b"0123456789");
        let file = OpenOptions::new().write(true).open(fs.path("f")).unwrap();
        file.set_len(4).unwrap();
        file.set_len(8).unwrap();
        assert_eq!(fs::read(fs.path("f")).unwrap(), b"0123\0\0\0\0");
        file.sync_all().unwrap();
        assert_eq!(unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 100) }, 0);
        assert_eq!(unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1000) }, 0);
        assert_eq!(file.metadata().unwrap().len(), 100);
        drop(file);
        fs::hard_link(fs.path("f"), fs.path("g")).unwrap();
        assert_eq!(fs::metadata(fs.path("f")).unwrap().nlink(), 2);
        fs.drop_unsynced();
        assert_eq!(fs::read(fs.path("f")).unwrap(), b"0123\0\0\0\0");
        assert!(!fs.path("g").exists());
        let statfs = statvfs(&fs.mnt);
        assert!(statfs.f_bavail * statfs.f_bsize > 1 << 40);
    }

    fn statvfs(path: &Path) -> libc::statvfs {
        let path = CString::new(path.as_os_str().as_bytes()).unwrap();
        let mut out = unsafe { std::mem::zeroed::<libc::statvfs>() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut out) }, 0);
        out
    }

    #[test]
    fn directories_rename_and_list() {
        let fs = Mounted::new("dirs");
        fs::create_dir_all(fs.path("d1/sub")).unwrap();
        fs.sync_dir("d1");
        fs.sync_dir("");
        fs::rename(fs.path("d1"), fs.path("d2")).unwrap();
        let into_itself = fs::rename(fs.path("d2"), fs.path("d2/sub/x")).unwrap_err();
        assert_eq!(into_itself.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(fs::remove_dir(fs.path("d2")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
        let names = |dir: &str| -> Vec<String> {
            let mut names: Vec<String> =
                fs::read_dir(fs.path(dir)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            names.sort();
            names
        };
        assert_eq!(names(""), ["d2"]);
        assert_eq!(fs::metadata(&fs.mnt).unwrap().nlink(), 3);
        assert_eq!(fs.drop_unsynced(), "ok dropped_bytes=0 dropped_entries=2");
        assert_eq!(names(""), ["d1"]);
        assert_eq!(names("d1"), ["sub"]);
    }

    #[test]
    fn handles_from_before_a_drop_are_stale() {
        let fs = Mounted::new("stale");
        fs.write_synced("a", b"abc");
        let mut file = OpenOptions::new().read(true).write(true).open(fs.path("a")).unwrap();
        fs.drop_unsynced();
        let mut buf = Vec::new();
        assert_eq!(file.read_to_end(&mut buf).unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(file.write(b"x").unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(file.sync_all().is_err());
        drop(file);
        assert_eq!(fs::read(fs.path("a")).unwrap(), b"abc");
        let err = fs.try_command("bogus").unwrap_err().to_string();
        assert!(err.contains("err unknown command"), "{err}");
    }
}
