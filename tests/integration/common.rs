//! What every command-line test needs: run the binary, read what it said, a scratch directory.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Run `routelab` from the repository root.
pub fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs")
}

/// Its stdout then stderr, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A fresh, empty directory for one test (`name` unique across the test crate: tests run in
/// parallel in one process).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routelab-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A scenario in `dir` replaying a slice of the Azure conv trace (1,500 rows at 0.4x) on two
/// workers, policies seed-v1 and seed-v3: a capacity search of three policies on three seeds
/// takes well under a second in release.
pub fn azure_slice(dir: &std::path::Path, name: &str) -> PathBuf {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv");
    let p = dir.join("slice.yaml");
    std::fs::write(
        &p,
        format!(
            "name: {name}\nseed: 1\nmodel: gemma-27b\nfleet:\n  \
             - {{ name: pro6000, profile: rtx-pro-6000-27b }}\n  \
             - {{ name: pair, profile: rtx4090x2-27b }}\ntraffic:\n  - trace: {{ path: {}, \
             format: azure, limit: 1500, rate_scale: 0.4 }}\npolicies: [seed-v1, seed-v3]\n\
             timeline_s: 0\n",
            trace.display()
        ),
    )
    .unwrap();
    p
}
