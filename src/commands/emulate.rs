//! `routelab emulate --profile P --port N`: an OpenAI-compatible engine that streams tokens in
//! real time following the simulator's hardware model (for the gateway and sim-to-real checks).

use anyhow::Context;
use routelab_emulator::{EmulatorOptions, serve};
use routelab_sim::ProfileLookup;
use std::io::Write;
use std::process::ExitCode;

/// Options of `routelab emulate`.
#[derive(Debug, clap::Args)]
pub struct EmulateArgs {
    /// Hardware profile: a bundled or ROUTELAB_HARDWARE name (`rtx-pro-6000-27b`) or a YAML
    /// file (see docs/profiles.md).
    #[arg(long)]
    pub profile: String,
    /// Port (0: any free port).
    #[arg(long, default_value_t = 8001)]
    pub port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Model name it serves (default: the profile's).
    #[arg(long)]
    pub model: Option<String>,
    /// Round trip to the gateway, ms.
    #[arg(long, default_value_t = 0.0)]
    pub rtt_ms: f64,
    /// Model time runs this many times faster than wall time.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Start with a cold engine.
    #[arg(long)]
    pub cold: bool,
    /// Degraded node: every rate x this.
    #[arg(long, default_value_t = 1.0)]
    pub speed_factor: f64,
    /// The worker's name, sent on every answer as the `x-routelab-worker` header (default: the
    /// profile's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Publish the simulated prefix cache as vLLM's KV events (ZeroMQ on loopback, 16-token
    /// blocks), for a router that subscribes to them (vLLM router's `kv_aware`:
    /// `--kv-event-source URL=ENDPOINT --kv-event-replay-source URL=REPLAY`).
    #[arg(long)]
    pub kv_events: bool,
}

/// Serve until Ctrl-C.
pub fn run(args: &EmulateArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let profile = ProfileLookup::for_command_line()
        .find(&args.profile)
        .map_err(|e| e.located("<command line>", "--profile"))?;
    let mut opts = EmulatorOptions::new(profile);
    if let Some(m) = &args.model {
        opts.model = m.clone();
    }
    opts.rtt_ms = args.rtt_ms;
    opts.speedup = args.speedup;
    opts.overrides.start_cold = args.cold;
    opts.overrides.speed_factor = args.speed_factor;
    opts.worker_name = args.name.clone();
    opts.kv_events = args.kv_events;
    opts.validate()?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let model = opts.model.clone();
        let emulator = serve(listener, opts).await?;
        writeln!(
            out,
            "emulating {} as model `{model}` on {} (speed-up x{}); Ctrl-C stops",
            args.profile,
            emulator.base_url(),
            args.speedup
        )?;
        if let Some((endpoint, replay)) = emulator.kv_endpoints() {
            writeln!(
                out,
                "KV events (vLLM's wire format, 16-token blocks): {endpoint}, replay {replay}"
            )?;
        }
        out.flush()?;
        tokio::signal::ctrl_c()
            .await
            .context("waiting for Ctrl-C")?;
        emulator.shutdown(std::time::Duration::from_secs(2)).await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
