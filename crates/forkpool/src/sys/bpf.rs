//! The `bpf(2)` calls kernel dispatch needs, and the shared memory of an
//! mmapable array map.
//!
//! Three commands and one socket option, no more: create a map (an array
//! whose memory can be mapped, or a `REUSEPORT_SOCKARRAY`), put a socket
//! in a sockarray, load a program, and attach it to a
//! `SO_REUSEPORT` group. The structures below are the kernel's `union
//! bpf_attr` laid out for exactly those commands (the kernel reads the
//! rest as zeros), checked against `<linux/bpf.h>`'s offsets in the tests.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use nix::errno::Errno;

/// `BPF_MAP_CREATE`.
const MAP_CREATE: libc::c_int = 0;
/// `BPF_MAP_UPDATE_ELEM`.
const MAP_UPDATE_ELEM: libc::c_int = 2;
/// `BPF_MAP_DELETE_ELEM`.
const MAP_DELETE_ELEM: libc::c_int = 3;
/// `BPF_PROG_LOAD`.
const PROG_LOAD: libc::c_int = 5;

/// `BPF_MAP_TYPE_ARRAY`.
const MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY`.
const MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
/// `BPF_PROG_TYPE_SK_REUSEPORT`.
pub const PROG_TYPE_SK_REUSEPORT: u32 = 21;
/// `BPF_F_MMAPABLE`: the array's values can be mapped with `mmap`.
const F_MMAPABLE: u32 = 1 << 10;
/// `SO_ATTACH_REUSEPORT_EBPF` (asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;
/// The size of `union bpf_attr` on this kernel's ABI.
const ATTR_SIZE: usize = 144;

/// `union bpf_attr` for `BPF_MAP_CREATE`.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    rest: [u8; ATTR_SIZE - 44],
}

/// `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
    rest: [u8; ATTR_SIZE - 32],
}

/// `union bpf_attr` for `BPF_PROG_LOAD`.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    rest: [u8; ATTR_SIZE - 72],
}

/// A name the kernel shows in `bpftool` (15 bytes and a NUL at most).
fn object_name(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (to, from) in out.iter_mut().zip(name.bytes().take(15)) {
        *to = from;
    }
    out
}

/// Calls `bpf(cmd, attr)`; a new descriptor when the command makes one.
fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> Result<libc::c_long, Errno> {
    debug_assert_eq!(std::mem::size_of::<T>(), ATTR_SIZE);
    // SAFETY: `attr` is a live, writable `union bpf_attr` of ATTR_SIZE
    // bytes laid out for `cmd` (every pointer in it points to memory that
    // outlives the call); the kernel reads and writes no more than that.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            ATTR_SIZE as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(rc)
    }
}

/// Takes ownership of the descriptor a successful `bpf()` returned.
fn owned(rc: libc::c_long) -> OwnedFd {
    // SAFETY: a successful map or program creation returns a new
    // descriptor (close-on-exec, as every bpf descriptor is) that nothing
    // else owns.
    unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) }
}

/// An array map of one value of `value_size` bytes whose memory can be
/// mapped by every process holding the descriptor.
pub fn create_shared_array(value_size: u32, name: &str) -> Result<OwnedFd, Errno> {
    let mut attr = MapCreateAttr {
        map_type: MAP_TYPE_ARRAY,
        key_size: 4,
        value_size,
        max_entries: 1,
        map_flags: F_MMAPABLE,
        inner_map_fd: 0,
        numa_node: 0,
        map_name: object_name(name),
        rest: [0; ATTR_SIZE - 44],
    };
    bpf(MAP_CREATE, &mut attr).map(owned)
}

/// A `REUSEPORT_SOCKARRAY` of `entries` sockets (a program picks a socket
/// of the group by its index here).
pub fn create_sockarray(entries: u32, name: &str) -> Result<OwnedFd, Errno> {
    let mut attr = MapCreateAttr {
        map_type: MAP_TYPE_REUSEPORT_SOCKARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: entries,
        map_flags: 0,
        inner_map_fd: 0,
        numa_node: 0,
        map_name: object_name(name),
        rest: [0; ATTR_SIZE - 44],
    };
    bpf(MAP_CREATE, &mut attr).map(owned)
}

/// Puts listening socket `sock` at `index` of sockarray `map` (replacing
/// what was there).
pub fn sockarray_set(map: BorrowedFd<'_>, index: u32, sock: BorrowedFd<'_>) -> Result<(), Errno> {
    let key = index;
    let value = sock.as_raw_fd() as u64;
    let mut attr = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        pad: 0,
        key: &key as *const u32 as u64,
        value: &value as *const u64 as u64,
        flags: 0, // BPF_ANY
        rest: [0; ATTR_SIZE - 32],
    };
    bpf(MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Empties `index` of sockarray `map`: the socket there leaves the array
/// (and may join another).
pub fn sockarray_clear(map: BorrowedFd<'_>, index: u32) -> Result<(), Errno> {
    let key = index;
    let mut attr = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        pad: 0,
        key: &key as *const u32 as u64,
        value: 0,
        flags: 0,
        rest: [0; ATTR_SIZE - 32],
    };
    bpf(MAP_DELETE_ELEM, &mut attr).map(drop)
}

/// Why a program did not load: the error, and the verifier's log when it
/// gave one.
#[derive(Debug)]
pub struct LoadError {
    /// The error `bpf(BPF_PROG_LOAD)` returned.
    pub errno: Errno,
    /// What the verifier said (empty unless it rejected the program).
    pub log: String,
}

/// Loads a program of `prog_type` from its raw 8-byte instructions. On a
/// refusal by the verifier (`EINVAL`, `EACCES`) it loads again with the
/// log on, so the error says which instruction and why.
pub fn load_program(prog_type: u32, insns: &[u64], name: &str) -> Result<OwnedFd, LoadError> {
    let license = CString::new("GPL").expect("no NUL in a literal");
    let load = |log: &mut Vec<u8>| {
        let mut attr = ProgLoadAttr {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: if log.is_empty() {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            kern_version: 0,
            prog_flags: 0,
            prog_name: object_name(name),
            prog_ifindex: 0,
            expected_attach_type: 0,
            rest: [0; ATTR_SIZE - 72],
        };
        bpf(PROG_LOAD, &mut attr).map(owned)
    };
    match load(&mut Vec::new()) {
        Ok(fd) => Ok(fd),
        Err(errno @ (Errno::EINVAL | Errno::EACCES)) => {
            let mut log = vec![0u8; 1 << 20];
            let second = load(&mut log);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).into_owned();
            match second {
                Ok(fd) => Ok(fd),
                Err(_) => Err(LoadError { errno, log: text }),
            }
        }
        Err(errno) => Err(LoadError {
            errno,
            log: String::new(),
        }),
    }
}

/// Attaches program `prog` to the `SO_REUSEPORT` group `sock` is in: from
/// now on it picks the socket of the group for each new connection.
pub fn attach_reuseport(sock: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> Result<(), Errno> {
    let fd: libc::c_int = prog.as_raw_fd();
    // SAFETY: the option value is a live c_int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_EBPF,
            &fd as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// The memory of a mapped shared array: `len` 64-bit words, each read and
/// written only atomically (the kernel's program writes them too).
pub struct SharedWords {
    ptr: NonNull<AtomicU64>,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics.
unsafe impl Send for SharedWords {}
// SAFETY: as above; every access is an atomic operation.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps the first `len` words of the value of mmapable array `map`
    /// (made by [`create_shared_array`] with at least `8 * len` bytes).
    /// Any process holding the map's descriptor can map it.
    pub fn map(map: BorrowedFd<'_>, len: usize) -> io::Result<SharedWords> {
        let bytes = len.max(1) * 8;
        // SAFETY: a new shared mapping of a descriptor we hold; the kernel
        // checks the length against the map's size.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr as *mut AtomicU64)
            .ok_or_else(|| io::Error::other("mmap gave a null address"))?;
        Ok(SharedWords { ptr, len })
    }

    /// The words.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is `len` words long, page-aligned (so each
        // word is aligned), lives as long as `self`, and is only ever
        // accessed through these atomics (here and in other processes
        // and the kernel's program, which use atomic instructions too).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: the region mapped in `map`, unmapped once; no reference
        // from `words` outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len.max(1) * 8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The offsets `<linux/bpf.h>` gives (printed by a C program with
    /// `offsetof` on this machine's headers).
    #[test]
    fn the_attributes_are_laid_out_as_the_kernel_reads_them() {
        assert_eq!(size_of::<MapCreateAttr>(), 144);
        assert_eq!(offset_of!(MapCreateAttr, key_size), 4);
        assert_eq!(offset_of!(MapCreateAttr, value_size), 8);
        assert_eq!(offset_of!(MapCreateAttr, max_entries), 12);
        assert_eq!(offset_of!(MapCreateAttr, map_flags), 16);
        assert_eq!(offset_of!(MapCreateAttr, map_name), 28);
        assert_eq!(size_of::<ElemAttr>(), 144);
        assert_eq!(offset_of!(ElemAttr, key), 8);
        assert_eq!(offset_of!(ElemAttr, value), 16);
        assert_eq!(offset_of!(ElemAttr, flags), 24);
        assert_eq!(size_of::<ProgLoadAttr>(), 144);
        assert_eq!(offset_of!(ProgLoadAttr, insns), 8);
        assert_eq!(offset_of!(ProgLoadAttr, license), 16);
        assert_eq!(offset_of!(ProgLoadAttr, log_level), 24);
        assert_eq!(offset_of!(ProgLoadAttr, log_buf), 32);
        assert_eq!(offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(offset_of!(ProgLoadAttr, expected_attach_type), 68);
    }

    #[test]
    fn names_are_cut_to_fifteen_bytes_and_a_nul() {
        let name = object_name("forkpool_scoreboard");
        assert_eq!(&name[..15], b"forkpool_scoreb");
        assert_eq!(name[15], 0);
    }
}
