//! `routelab-gateway --config gateway.yaml`
#![forbid(unsafe_code)]

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

fn main() -> std::process::ExitCode {
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
        if config.clock_scale != 1.0 {
            eprintln!(
                "warning: clock_scale is {}: policy time runs faster than wall time; for tests and emulations only",
                config.clock_scale
            );
        }
        println!(
            "{}: ok ({} workers)",
            args.config.display(),
            config.workers.len()
        );
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
        let mut gateway = match routelab_gateway::start(config).await {
            Ok(g) => g,
            Err(e) => {
                let code = exit_code(&e);
                eprintln!("error: {:#}", anyhow::Error::new(e));
                return std::process::ExitCode::from(code);
            }
        };
        tokio::select! {
            _ = shutdown_signal() => {
                routelab_gateway::log("shutting_down", &[]);
                gateway.shutdown().await;
            }
            _ = gateway.wait() => {}
        }
        std::process::ExitCode::SUCCESS
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
