//! The tests' own differences between OSes, in one place (the crate's are in
//! `pgbus_hub_core::os`): what a test measures of its own process (open
//! descriptors, threads) and how it sees a peer hang up without reading.
//! Where an OS offers no way to measure something, the answer is None and
//! the test skips that check, saying so.

#![allow(dead_code)]

/// poll(2) events that report a peer's hang-up without consuming a byte.
/// macOS has no POLLRDHUP; it reports POLLHUP (asked for or not) once the
/// peer of a Unix stream has closed.
#[cfg(any(target_os = "linux", target_os = "freebsd"))]
pub const PEER_HANGUP_EVENTS: libc::c_short = libc::POLLRDHUP;
#[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
pub const PEER_HANGUP_EVENTS: libc::c_short = 0;

/// The revents that mean the peer hung up.
pub const PEER_HANGUP_SEEN: libc::c_short = PEER_HANGUP_EVENTS | libc::POLLHUP;

/// This process's open descriptors.
#[cfg(target_os = "linux")]
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// This process's open descriptors: every number fcntl(2) knows, up to the
/// descriptor limit (FreeBSD's /dev/fd lists only 0-2 without fdescfs).
#[cfg(not(target_os = "linux"))]
pub fn open_fds() -> usize {
    // SAFETY: getdtablesize has no preconditions; F_GETFD only reads a
    // descriptor's flags (EBADF if it is not open).
    let limit = unsafe { libc::getdtablesize() }.clamp(0, 1 << 16);
    (0..limit)
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1)
        .count()
}

/// This process's threads.
#[cfg(target_os = "linux")]
pub fn process_threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(target_vendor = "apple")]
pub fn process_threads() -> Option<usize> {
    // SAFETY: proc_taskinfo is plain old data; proc_pidinfo writes at most
    // `size` bytes into it.
    let mut info: libc::proc_taskinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_taskinfo>() as libc::c_int;
    let written = unsafe {
        libc::proc_pidinfo(
            libc::getpid(),
            libc::PROC_PIDTASKINFO,
            0,
            std::ptr::addr_of_mut!(info).cast(),
            size,
        )
    };
    (written == size).then(|| usize::try_from(info.pti_threadnum).unwrap_or(0))
}

#[cfg(target_os = "freebsd")]
pub fn process_threads() -> Option<usize> {
    // SAFETY: kinfo_proc is plain old data; sysctl writes at most `size`
    // bytes into it.
    let mut info: libc::kinfo_proc = unsafe { std::mem::zeroed() };
    let mut size = std::mem::size_of::<libc::kinfo_proc>();
    let mut mib = [
        libc::CTL_KERN,
        libc::KERN_PROC,
        libc::KERN_PROC_PID,
        unsafe { libc::getpid() },
    ];
    let rc = unsafe {
        libc::sysctl(
            mib.as_mut_ptr(),
            mib.len() as libc::c_uint,
            std::ptr::addr_of_mut!(info).cast(),
            &mut size,
            std::ptr::null(),
            0,
        )
    };
    (rc == 0).then(|| usize::try_from(info.ki_numthreads).unwrap_or(0))
}

#[cfg(not(any(target_os = "linux", target_os = "freebsd", target_vendor = "apple")))]
pub fn process_threads() -> Option<usize> {
    None
}

/// This process's threads named `name` (the name a thread was spawned with).
#[cfg(target_os = "linux")]
pub fn threads_named(name: &str) -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count(),
    )
}

/// Elsewhere a process cannot list its threads' names without the OS's
/// debugging interfaces.
#[cfg(not(target_os = "linux"))]
pub fn threads_named(_name: &str) -> Option<usize> {
    None
}
