//! `routelab profile fit` and `routelab profile show`: hardware profiles as a user brings them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use routelab_reports::{fit_report, profile_text, write_profile_chart};
use routelab_sim::ProfileLookup;
use routelab_sim::hardware::fit::{FitInput, FitOptions, FitSource, MixedStep, fit};

/// The `profile` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ProfileCommand {
    /// Fit a profile YAML from measurements: a CSV of concurrency,aggregate_tok_s, the result
    /// files of `vllm bench serve --save-result` (one per --max-concurrency), or a saved
    /// `GET /admin/capacity` of the gateway.
    Fit(Box<FitArgs>),
    /// Print a profile's decode curve and fields and write its chart (SVG + PNG).
    Show(ShowArgs),
}

/// Options of `routelab profile fit`.
#[derive(Debug, clap::Args)]
pub struct FitArgs {
    /// What the files are.
    #[arg(long = "from", value_parser = FitSource::NAMES)]
    pub from: String,
    /// The measurement file(s).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The profile's name.
    #[arg(long)]
    pub name: String,
    /// Write the profile here (default: print it).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// KV-cache capacity, tokens (default: 131072, listed as extrapolated).
    #[arg(long)]
    pub kv_capacity_tokens: Option<u64>,
    /// The engine's running-sequence limit, vLLM's max_num_seqs (default: 256).
    #[arg(long)]
    pub max_running: Option<u32>,
    /// Context window, tokens (default: the gateway's figure, else 32768).
    #[arg(long)]
    pub context_window: Option<u32>,
    /// Prefill tokens/s (default: measured, else 10 x the single-sequence decode speed).
    #[arg(long)]
    pub prefill_tok_s: Option<f64>,
    /// The gateway worker to fit (required when the file has several).
    #[arg(long)]
    pub worker: Option<String>,
    /// The rows are pure-decode measurements (nothing prefilling beside them): take their
    /// output tok/s as the decode aggregate. Without it, closed-loop rows (vllm-bench runs, CSV
    /// rows with mean_prompt_tokens and mean_output_tokens) have their prompts' prefill
    /// subtracted under the step model.
    #[arg(long)]
    pub pure_decode: bool,
    /// One measured mixed step: N sequences decoding beside PROMPT_TOKENS prompt tokens took
    /// STEP_MS ms (e.g. 256:539:16.3); fits the profile's prefill_overlap.
    #[arg(long, value_name = MixedStep::FORMAT)]
    pub mixed_step: Option<String>,
    /// The share of a mixed step's prefill that hides under its decode, in [0, 1] (default:
    /// routelab's 0.4, listed as extrapolated).
    #[arg(long, value_name = "F")]
    pub prefill_overlap: Option<f64>,
    /// A pure-decode sweep of the same engine (CSV `concurrency,aggregate_tok_s`, e.g. the
    /// `decode.csv` of `routelab bench`): the curve comes from it and the closed-loop FILEs fit
    /// prefill_overlap, with its uncertainty.
    #[arg(long, value_name = "CSV")]
    pub decode_sweep: Option<PathBuf>,
    /// What the worker announces to the router, comma-separated (e.g. "RTX 4090,RTX 4090");
    /// overrides the source's.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub gpu_names: Option<Vec<String>>,
    /// The engine's prompt-token budget per step (vLLM's max_num_batched_tokens, llama.cpp's
    /// --batch-size): the closed loops' prefill is packed to it and the profile's
    /// prefill_chunk_tokens is it (default: routelab's 512, listed as extrapolated).
    #[arg(long, value_name = "TOKENS")]
    pub chunk_tokens: Option<u32>,
}

/// Options of `routelab profile show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// A profile name (looked up in the nearest hardware/ or scenarios/hardware/ here or in a
    /// parent directory, the bundled profiles, then ROUTELAB_HARDWARE) or a path to a profile
    /// file; see docs/profiles.md.
    pub profile: String,
    /// Where to write the chart (default: out/profiles/<name>/).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Run a `profile` subcommand.
pub fn run(cmd: &ProfileCommand, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    match cmd {
        ProfileCommand::Fit(args) => fit_cmd(args, out),
        ProfileCommand::Show(args) => show(args, out),
    }
}

fn fit_cmd(args: &FitArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let source = FitSource::from_name(&args.from).context("clap checked the source name")?;
    let inputs = args
        .files
        .iter()
        .map(|f| FitInput::read(f))
        .collect::<Result<Vec<_>, _>>()?;
    let options = FitOptions {
        name: args.name.clone(),
        kv_capacity_tokens: args.kv_capacity_tokens,
        max_running: args.max_running,
        context_window: args.context_window,
        prefill_tok_s: args.prefill_tok_s,
        worker: args.worker.clone(),
        pure_decode: args.pure_decode,
        mixed_step: args
            .mixed_step
            .as_deref()
            .map(MixedStep::parse)
            .transpose()?,
        prefill_overlap: args.prefill_overlap,
        decode_sweep: args
            .decode_sweep
            .as_deref()
            .map(FitInput::read)
            .transpose()?,
        gpu_names: args
            .gpu_names
            .as_ref()
            .map(|g| g.iter().map(|n| n.trim().to_string()).collect()),
        chunk_tokens: args.chunk_tokens,
    };
    let fitted = fit(source, &inputs, &options)?;
    match &args.out {
        None => {
            // the YAML alone on stdout (it may be piped into a file); the check on stderr
            write!(out, "{}", fitted.yaml)?;
            eprint!("{}", fit_report(&fitted));
        }
        Some(path) => {
            std::fs::write(path, &fitted.yaml)
                .with_context(|| format!("{}: cannot write", path.display()))?;
            write!(out, "{}", profile_text(&fitted.profile))?;
            write!(out, "\n{}", fit_report(&fitted))?;
            writeln!(out, "\nprofile: {}", path.display())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn show(args: &ShowArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let profile = ProfileLookup::for_command_line()
        .find(&args.profile)
        .map_err(|e| e.located("<command line>", "PROFILE"))?;
    write!(out, "{}", profile_text(&profile))?;
    let dir = args.out.clone().unwrap_or_else(|| {
        Path::new("out")
            .join("profiles")
            .join(profile.name().replace(['/', '\\'], "_"))
    });
    let written = write_profile_chart(&profile, &dir)?;
    for f in &written.files {
        writeln!(out, "chart: {}", f.display())?;
    }
    Ok(ExitCode::SUCCESS)
}
