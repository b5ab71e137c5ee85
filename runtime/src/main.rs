//! The `sluice` binary; everything lives in the library's [`sluice::cli`].

/// mimalloc instead of the system allocator: lifting a handler's output into
/// the host allocates for every string and list, and mimalloc measured about
/// 20% faster than glibc malloc on the batch path (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    return_freed_memory_promptly();
    sluice::cli::main()
}

/// mimalloc's `purge_delay` option (mimalloc.h, v2: `mi_option_purge_delay`).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc hand freed pages back to the OS at once rather than after
/// its default delay. Under a steady ingest load the daemon frees many
/// short-lived buffers (request bodies, batches, memtable flushes), and with
/// the default the freed pages stayed resident: the daemon held ~170 MiB
/// with a 1M-message backlog against ~120 MiB with prompt purging, at the
/// same ingest rate (BENCHMARKS.md, `daemon-rss`). An operator's own
/// `MIMALLOC_PURGE_DELAY` wins.
fn return_freed_memory_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: sets one integer option of the allocator; mimalloc reads its
    // options atomically and documents them as settable at any time. No
    // pointers or memory are involved.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}
