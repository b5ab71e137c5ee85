//! Skipped tests: the few reasons a test may skip, recorded where CI shows
//! them, and checked against the machine.
//!
//! A test that cannot run here returns early; `cargo test` then hides
//! whatever it printed and counts it as passed. [`skip`] also appends a line
//! to the file named by [`SKIP_LOG_ENV`], which `cargo xtask test` sets,
//! prints after the run and hands to [`check_log`].
//!
//! A skip gives a [`Reason`] from a closed list, each a fact this machine
//! can be asked about again: the tests run as another user than root, or
//! the kernel lacks a [`KernelFeature`]. [`check_log`] asks again, and
//! refuses every skip whose reason does not hold here: CI runs as root on a
//! recent kernel, so there a test that needs root runs, or fails the run.
//!
//! [`OutsideAddress`] is here too: it gives a test an address of this
//! machine besides loopback, adding one when root may, and the check of
//! [`KernelFeature::AddressOnLoopback`] tries the same thing.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable naming the file skipped tests are recorded in.
pub const SKIP_LOG_ENV: &str = "SLUICE_SKIP_LOG";

/// Why a test skipped: one of a fixed list, each checkable on the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The test needs root (to mount a tmpfs, give a file away, add an
    /// address) and runs as another user. Holds when the uid is not 0.
    NotRoot,
    /// The kernel lacks something the test needs. Holds when this machine
    /// indeed lacks it.
    KernelFeature(KernelFeature),
    /// The machine lacks what building Wasm with C in it needs (cargo with
    /// the `wasm32-wasip2` target, and clang with wasi-libc's headers or a
    /// wasi-sdk), so `sluice` was built without its prebuilt QuickJS
    /// engine. Holds when one of them is missing, found as the engine's
    /// build looks for them.
    NoWasmToolchain,
}

/// What a test may find missing from the kernel it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFeature {
    /// A `THP_enabled:` line in `/proc/PID/status`, which says whether the
    /// process may use transparent huge pages (Linux 5.0 and later).
    ThpStatusLine,
    /// Root may add an IPv4 address outside 127/8 to `lo` (`ip address
    /// add 198.18.x.y/32 dev lo`), which gives a machine with no network a
    /// source address that is not loopback. A network namespace whose
    /// `CAP_NET_ADMIN` the process lacks (a container started without it)
    /// refuses it.
    AddressOnLoopback,
}

impl KernelFeature {
    /// Every feature, in the order of the enum.
    pub const ALL: [KernelFeature; 2] = [
        KernelFeature::ThpStatusLine,
        KernelFeature::AddressOnLoopback,
    ];

    /// Whether this machine has the feature: `Ok(())` if so, else what is
    /// missing.
    pub fn present(self) -> Result<(), String> {
        match self {
            KernelFeature::ThpStatusLine => {
                let status = std::fs::read_to_string("/proc/self/status")
                    .map_err(|err| format!("/proc/self/status: {err}"))?;
                if status.lines().any(|l| l.starts_with("THP_enabled:")) {
                    Ok(())
                } else {
                    Err("/proc/self/status has no THP_enabled line".to_owned())
                }
            }
            KernelFeature::AddressOnLoopback => match LoopbackAlias::add() {
                Ok(_removed_on_drop) => Ok(()),
                Err(AliasError::Refused(why)) => Err(why),
                // Without the tool nothing can be said of the kernel; the
                // test fails rather than skips then.
                Err(AliasError::NoTool(why)) => {
                    eprintln!("(cannot check: {why})");
                    Ok(())
                }
            },
        }
    }
}

impl Reason {
    /// Every reason, in the order of the enums.
    pub const ALL: [Reason; 4] = [
        Reason::NotRoot,
        Reason::KernelFeature(KernelFeature::ThpStatusLine),
        Reason::KernelFeature(KernelFeature::AddressOnLoopback),
        Reason::NoWasmToolchain,
    ];

    /// The reason's word in the skip log.
    pub fn code(self) -> &'static str {
        match self {
            Reason::NotRoot => "not-root",
            Reason::KernelFeature(KernelFeature::ThpStatusLine) => "kernel:thp-status-line",
            Reason::KernelFeature(KernelFeature::AddressOnLoopback) => "kernel:address-on-lo",
            Reason::NoWasmToolchain => "no-wasm-toolchain",
        }
    }

    /// The reason whose [`code`](Self::code) is `code`.
    pub fn from_code(code: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Whether the reason holds on this machine: `Ok(())` if so, else why
    /// it does not.
    pub fn holds(self) -> Result<(), String> {
        match self {
            Reason::NotRoot if is_root() => Err("this runs as root".to_owned()),
            Reason::NotRoot => Ok(()),
            Reason::KernelFeature(feature) => match feature.present() {
                Ok(()) => Err("this machine has that feature".to_owned()),
                Err(_) => Ok(()),
            },
            Reason::NoWasmToolchain => match wasm_toolchain() {
                Ok(()) => Err("this machine has the Wasm toolchain".to_owned()),
                Err(_) => Ok(()),
            },
        }
    }
}

/// The tools that build the prebuilt QuickJS engine, looked for as its
/// build (`author/build.rs`) looks for them: `Ok(())` when all are here,
/// else the first one missing.
pub fn wasm_toolchain() -> Result<(), String> {
    let missing = |m: toolchain::Missing| format!("{} was not found", m.tool);
    toolchain::cargo().map_err(missing)?;
    toolchain::WasmC::find().map_err(missing)?;
    Ok(())
}

/// The author crate's toolchain search, the same file its build script
/// includes.
#[allow(dead_code)]
#[path = "../../author/src/toolchain.rs"]
mod toolchain;

/// Whether this process runs as root (uid 0).
pub fn is_root() -> bool {
    rustix::process::getuid().is_root()
}

/// The line [`skip`] records: `SKIPPED <test>: <code>: <why>`.
fn line(test: &str, reason: Reason, why: &str) -> String {
    format!("SKIPPED {test}: {}: {why}", reason.code())
}

/// Records that `test` was skipped for `reason` (`why` says what needed
/// it, for people), on stderr and in the skip log when one is set. The
/// caller returns right after.
pub fn skip(test: &str, reason: Reason, why: &str) {
    let line = line(test, reason, why);
    eprintln!("{line}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    // One `write` of a short line to a file opened for appending lands
    // whole even when several test processes write at once.
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(err) = appended {
        eprintln!("(could not record the skip in {}: {err})", path.display());
    }
}

/// Checks a skip log against this machine: `Err` lists every line whose
/// reason does not hold here, or is not on the list of [`Reason`]s.
pub fn check_log(log: &str) -> Result<(), String> {
    check(log, Reason::holds)
}

/// [`check_log`] with the machine's answers given by `holds`.
fn check(log: &str, holds: impl Fn(Reason) -> Result<(), String>) -> Result<(), String> {
    let mut refused = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let code = line
            .strip_prefix("SKIPPED ")
            .and_then(|rest| rest.split_once(": "))
            .map(|(_test, rest)| rest.split_once(": ").map_or(rest, |(code, _why)| code));
        match code.and_then(Reason::from_code) {
            None => {
                let known: Vec<&str> = Reason::ALL.iter().map(|r| r.code()).collect();
                refused.push(format!(
                    "{line}\n     (not a reason on the list: {})",
                    known.join(", ")
                ));
            }
            Some(reason) => {
                if let Err(why) = holds(reason) {
                    refused.push(format!("{line}\n     (does not hold: {why})"));
                }
            }
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} skip{} whose reason does not hold on this machine:\n   {}",
        refused.len(),
        if refused.len() == 1 { "" } else { "s" },
        refused.join("\n   ")
    ))
}

/// An address of this machine besides loopback, for a test that must be
/// reached from one: the source address of the machine's route out, or,
/// on a machine with none, one that root adds to `lo` for as long as this
/// lives.
#[derive(Debug)]
pub struct OutsideAddress {
    ip: IpAddr,
    _added: Option<LoopbackAlias>,
}

impl OutsideAddress {
    /// The machine's own address when it has one; else, as root, a fresh
    /// one on `lo`. `Err` gives the reason to skip with: not root, or a
    /// kernel that refuses the address. Panics when `ip` (Debian:
    /// iproute2) is missing, which is no reason to skip.
    pub fn get() -> Result<Self, Reason> {
        if let Some(ip) = routed_address() {
            return Ok(Self { ip, _added: None });
        }
        if !is_root() {
            return Err(Reason::NotRoot);
        }
        match LoopbackAlias::add() {
            Ok(alias) => Ok(Self {
                ip: IpAddr::V4(alias.ip),
                _added: Some(alias),
            }),
            Err(AliasError::Refused(why)) => {
                eprintln!("{why}");
                Err(Reason::KernelFeature(KernelFeature::AddressOnLoopback))
            }
            Err(AliasError::NoTool(why)) => panic!("{why}"),
        }
    }

    /// The address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

/// The source address of a route out, if it is not loopback (a UDP
/// "connect" sends nothing).
fn routed_address() -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// An address from 198.18.0.0/15 (set aside for benchmarks, never routed)
/// on `lo`, deleted on drop.
#[derive(Debug)]
struct LoopbackAlias {
    ip: Ipv4Addr,
}

/// Why [`LoopbackAlias::add`] failed.
#[derive(Debug)]
enum AliasError {
    /// The `ip` command is missing.
    NoTool(String),
    /// `ip address add` failed: not root, or the kernel refused.
    Refused(String),
}

impl LoopbackAlias {
    /// Adds a fresh address; one taken already (by a test killed before
    /// its drop, say) is passed over.
    fn add() -> Result<Self, AliasError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
        let mut last = String::new();
        for _ in 0..8 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let offset = std::process::id().wrapping_mul(16).wrapping_add(n) & 0x1_ffff;
            let ip = Ipv4Addr::from(base + offset);
            let out = ip_address("add", ip).map_err(|err| {
                AliasError::NoTool(format!(
                    "running `ip` ({err}): install it (Debian: `apt-get install iproute2`)"
                ))
            })?;
            if out.status.success() {
                return Ok(Self { ip });
            }
            last = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            if !last.contains("exists") {
                break;
            }
        }
        Err(AliasError::Refused(format!(
            "`ip address add 198.18.x.y/32 dev lo`: {last}"
        )))
    }
}

impl Drop for LoopbackAlias {
    fn drop(&mut self) {
        match ip_address("del", self.ip) {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "(could not remove {} from lo: {})",
                self.ip,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(err) => eprintln!("(could not remove {} from lo: {err})", self.ip),
        }
    }
}

/// `ip address <verb> <ip>/32 dev lo`.
fn ip_address(verb: &str, ip: Ipv4Addr) -> std::io::Result<std::process::Output> {
    Command::new("ip")
        .args(["address", verb, &format!("{ip}/32"), "dev", "lo"])
        .stdin(Stdio::null())
        .output()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers as a machine that runs as root and has every feature.
    fn root_with_everything(reason: Reason) -> Result<(), String> {
        match reason {
            Reason::NotRoot => Err("this runs as root".to_owned()),
            Reason::KernelFeature(_) => Err("this machine has that feature".to_owned()),
            Reason::NoWasmToolchain => Err("this machine has the Wasm toolchain".to_owned()),
        }
    }

    /// Answers as a machine where every reason holds.
    fn nothing_here(_: Reason) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn a_not_root_skip_is_refused_when_running_as_root() {
        let log = line("disk_full", Reason::NotRoot, "mounting a tmpfs needs root");
        let err = check(&log, root_with_everything).expect_err("refused");
        assert!(err.contains("SKIPPED disk_full: not-root:"), "{err}");
        assert!(err.contains("this runs as root"), "{err}");
    }

    #[test]
    fn a_reason_not_on_the_list_is_refused() {
        for log in [
            "SKIPPED t: no-network: nothing to send from",
            "SKIPPED t: this machine has no address but loopback",
            "SKIP: this machine has no address but loopback to send from",
        ] {
            let err = check(log, nothing_here).expect_err(log);
            assert!(err.contains("not a reason on the list: not-root"), "{err}");
        }
    }

    #[test]
    fn a_reason_that_holds_passes_and_every_refusal_is_listed() {
        let log: String = Reason::ALL
            .iter()
            .map(|&r| format!("{}\n", line("t", r, "why: with a colon")))
            .collect();
        assert_eq!(check(&log, nothing_here), Ok(()));
        assert_eq!(check("", root_with_everything), Ok(()));
        let err = check(&format!("{log}SKIPPED u: gone: x\n"), root_with_everything)
            .expect_err("refused");
        let want = format!("{} skips whose reason", Reason::ALL.len() + 1);
        assert!(err.starts_with(&want), "{err}");
    }

    #[test]
    fn every_code_reads_back_as_its_reason() {
        for reason in Reason::ALL {
            assert_eq!(Reason::from_code(reason.code()), Some(reason));
        }
        for feature in KernelFeature::ALL {
            assert!(Reason::ALL.contains(&Reason::KernelFeature(feature)));
        }
    }

    #[test]
    fn not_root_holds_here_exactly_when_the_uid_is_not_0() {
        let log = line("t", Reason::NotRoot, "why");
        assert_eq!(check_log(&log).is_ok(), !is_root());
    }
}
