//! `routelab-gateway --config gateway.yaml`
// Unsafe code is denied everywhere but in two allocator calls, `limit_malloc_arenas` and
// `trim_malloc_periodically` (measured reasons there).
#![deny(unsafe_code)]

use clap::Parser;
use std::path::PathBuf;

/// OpenAI-compatible LLM gateway routing with routelab-policies.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// The YAML configuration (see gateway/examples/gateway.yaml).
    #[arg(long, short)]
    config: PathBuf,
    /// Check the configuration and what start reads beside it (the state file) and exit.
    #[arg(long)]
    check: bool,
}

/// The exit code for an error at start: 2 for bad input (a configuration that cannot be used,
/// e.g. a request log that cannot be opened), as at load; 1 otherwise.
fn exit_code(e: &routelab_gateway::GatewayError) -> u8 {
    if matches!(e, routelab_gateway::GatewayError::Config(_)) {
        2
    } else {
        1
    }
}

/// Most malloc arenas the process may use, unless `MALLOC_ARENA_MAX` says otherwise.
///
/// glibc gives each thread that contends for the heap an arena of its own (up to 8 per core)
/// and returns little of it to the system; in a gateway serving for hours the RSS crept while the
/// live heap stayed flat. Measured with `examples/soak.rs` (400 req/s, every signal on; figures
/// in docs/performance.md): the default arenas grew 33.1 → 41.4 MiB over an hour (+0.15
/// MiB/min in the second half) while heaptrack held the live heap at 8–12 MB over 25 minutes
/// and 600,000 requests; two arenas crept about a third as fast. mimalloc as the global
/// allocator did not help (42 → 52 MiB, up and down).
const MALLOC_ARENAS: i32 = 2;

/// Cap glibc's malloc arenas at [`MALLOC_ARENAS`] before any thread starts (an explicit
/// `MALLOC_ARENA_MAX` in the environment wins: glibc read it at start).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: `mallopt` only sets an allocator parameter; it is called before any other
        // thread exists, and M_ARENA_MAX with a positive value is a documented glibc option.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

/// How often the binary hands glibc's free memory back to the system.
///
/// The arena cap alone left RSS stepping up (+1.5 MiB in the first 30 of 50 minutes): freed
/// memory inside an arena is kept. `malloc_trim(0)` returns the free pages of every arena.
/// Measured with the soak (400 req/s, every signal on, two arenas): RSS 25.2–25.9 MiB from 30 s
/// to 25 minutes (second-half slope −0.008 MiB/min), against 32.6 → 34.2 MiB without the trim;
/// p50/p99 unchanged.
const MALLOC_TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Return glibc's free memory to the system every [`MALLOC_TRIM_EVERY`], on a thread of its own
/// that never allocates (so it takes no arena) and cannot fail.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim_malloc_periodically() {
    let spawned = std::thread::Builder::new()
        .name("malloc-trim".into())
        .spawn(|| {
            loop {
                std::thread::sleep(MALLOC_TRIM_EVERY);
                // SAFETY: `malloc_trim` only gives free heap pages back to the system; it is
                // thread-safe (it takes each arena's lock).
                unsafe {
                    libc::malloc_trim(0);
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("warning: cannot start the malloc-trim thread ({e}); RSS may creep");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_malloc_periodically() {}

fn main() -> std::process::ExitCode {
    limit_malloc_arenas();
    trim_malloc_periodically();
    let args = Args::parse();
    let config = match routelab_gateway::GatewayConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {:#}", anyhow::Error::new(e));
            return std::process::ExitCode::from(2);
        }
    };
    if args.check {
        // What start reads beside the file (the state file, the log's directory) is read the
        // same way here, so a configuration `--check` passes does not then fail to start.
        if let Err(e) = routelab_gateway::check(&config) {
            let code = exit_code(&e);
            eprintln!("error: {:#}", anyhow::Error::new(e));
            return std::process::ExitCode::from(code);
        }
        for w in config.warnings() {
            eprintln!("warning: {w}");
        }
        if config.clock_scale != 1.0 {
            eprintln!(
                "warning: clock_scale is {}: policy time runs faster than wall time; for tests and emulations only",
                config.clock_scale
            );
        }
        // What the policy will see of each worker, and what it falls back to where a signal
        // is missing.
        let (lines, warnings) = match routelab_gateway::signals::check_report(&config) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {:#}", anyhow::Error::new(e));
                return std::process::ExitCode::from(2);
            }
        };
        for w in &warnings {
            eprintln!("warning: {w}");
        }
        println!(
            "{}: ok ({} workers)",
            args.config.display(),
            config.workers.len()
        );
        for l in &lines {
            println!("  {l}");
        }
        return std::process::ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let mut signals = match Signals::new() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot listen for signals: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let mut gateway = match routelab_gateway::start(config).await {
            Ok(g) => g,
            Err(e) => {
                let code = exit_code(&e);
                eprintln!("error: {:#}", anyhow::Error::new(e));
                return std::process::ExitCode::from(code);
            }
        };
        tokio::select! {
            signal = signals.stop() => {
                routelab_gateway::log("shutting_down", &[("signal", signal)]);
            }
            _ = gateway.wait() => return std::process::ExitCode::SUCCESS,
        }
        // The drain is bounded by `server.drain_timeout_s`; a second signal ends it at once.
        tokio::select! {
            _ = gateway.shutdown() => std::process::ExitCode::SUCCESS,
            signal = signals.stop() => {
                routelab_gateway::log(
                    "shutdown_forced",
                    &[("signal", signal), ("note", "a second signal: exiting without waiting for requests in flight")],
                );
                std::process::exit(1);
            }
        }
    })
}

/// The signals the gateway answers. SIGTERM and SIGINT stop it (the first gracefully, a second
/// at once). SIGHUP, whose default action would kill the process mid-stream, is logged and
/// otherwise ignored: the gateway does not reload its configuration (workers change through
/// the admin API, and the request log reopens its file by itself when it is moved away).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Listen from now on (before the start, so that no signal between start and listening
    /// falls to its default action).
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
                hup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// The next signal that asks the gateway to stop, by name; a SIGHUP meanwhile is logged.
    async fn stop(&mut self) -> &'static str {
        #[cfg(unix)]
        loop {
            tokio::select! {
                _ = self.term.recv() => return "SIGTERM",
                _ = self.int.recv() => return "SIGINT",
                _ = self.hup.recv() => routelab_gateway::log(
                    "sighup_ignored",
                    &[("note", "the gateway does not reload its configuration; restart it to apply a new one")],
                ),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}
