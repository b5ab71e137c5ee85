//! The `sluice` binary; everything lives in the library's [`sluice::cli`].

/// mimalloc instead of the system allocator: lifting a handler's output into
/// the host allocates for every string and list, and mimalloc measured about
/// 20% faster than glibc malloc on the batch path (see BENCHMARKS.md).
/// The `system-allocator` feature drops it, for heap profilers that hook
/// malloc.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    #[cfg(not(feature = "system-allocator"))]
    tune_mimalloc();
    sluice::cli::main()
}

/// The two settings the daemon's memory needs from mimalloc (BENCHMARKS.md,
/// "The soak's RSS"); each yields to the operator's own environment
/// variable. A build with the system allocator needs neither.
#[cfg(not(feature = "system-allocator"))]
fn tune_mimalloc() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        return_freed_memory_promptly();
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        keep_huge_pages_out_of_the_heap();
    }
}

/// mimalloc's `purge_delay` option (mimalloc.h, v2 and v3: `mi_option_purge_delay`).
#[cfg(not(feature = "system-allocator"))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc hand freed pages back to the OS at once rather than after
/// its default delay. Under a steady ingest load the daemon frees many
/// short-lived buffers (request bodies, batches, memtable flushes), and with
/// the default the freed pages stayed resident: the daemon held ~170 MiB
/// with a 1M-message backlog against ~120 MiB with prompt purging, at the
/// same ingest rate (BENCHMARKS.md, `daemon-rss`).
#[cfg(not(feature = "system-allocator"))]
fn return_freed_memory_promptly() {
    // SAFETY: sets one integer option of the allocator; mimalloc reads its
    // options atomically and documents them as settable at any time. No
    // pointers or memory are involved.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`).
///
/// mimalloc asks for huge pages on its arena (`MADV_HUGEPAGE`, 1 GiB) but
/// hands freed memory back in 64 KiB pieces. The kernel's khugepaged walks
/// such regions slowly (a 1 GiB arena about once every 11 minutes on the
/// defaults) and rebuilds every 2 MiB piece that still holds a single page
/// into a whole resident huge page. The soak saw it as a step of about
/// 25 MiB in RSS, 11-12 minutes into every run, that never went away while
/// the live heap stayed flat; with khugepaged sped up it came in seconds.
/// The flag covers the arena already mapped, which an allocator option set
/// here would not.
#[cfg(not(feature = "system-allocator"))]
fn keep_huge_pages_out_of_the_heap() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes one integer and sets a flag on
        // the process; no pointers or memory are involved.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            // Not fatal: the daemon works with huge pages; only its RSS grows.
            let err = std::io::Error::last_os_error();
            eprintln!(
                "warning: cannot turn transparent huge pages off ({err}); RSS may grow in steps"
            );
        }
    }
}
