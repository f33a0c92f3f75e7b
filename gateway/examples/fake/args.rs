//! The examples' command lines: every flag takes one value; a flag an example does not take is
//! refused (a typo would otherwise start a long run with the defaults).

use std::path::{Path, PathBuf};

/// The value after `name`, if given.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The whole number after `name`, or `default`; exits 2 naming the flag when it is not one.
pub fn num(name: &str, default: u64) -> u64 {
    match arg(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("error: {name}: `{v}` is not a whole number");
            std::process::exit(2)
        }),
    }
}

/// `--help` prints `usage` and exits 0; a flag of `example` not in `flags`, or one without
/// its value, exits 2 saying which.
pub fn check(example: &str, usage: &str, flags: &[&str]) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{usage}");
        std::process::exit(0);
    }
    let mut i = 0;
    while i < args.len() {
        if !flags.contains(&args[i].as_str()) {
            eprintln!(
                "error: `{}` is not an argument of {example} (valid: {}; --help)",
                args[i],
                flags.join(", ")
            );
            std::process::exit(2);
        }
        if i + 1 >= args.len() {
            eprintln!("error: {} needs a value", args[i]);
            std::process::exit(2);
        }
        i += 2;
    }
}

/// The gateway binary: `--gateway PATH`, else the one built beside this example
/// (`target/<profile>/examples/NAME` -> `target/<profile>/routelab-gateway`); exits 2 saying
/// how to build it when there is none.
pub fn gateway_binary() -> PathBuf {
    let path = arg("--gateway").map(PathBuf::from).unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("the path of this example");
        exe.parent()
            .and_then(Path::parent)
            .map(|d| d.join("routelab-gateway"))
            .expect("this example's directory has a parent")
    });
    if !path.is_file() {
        eprintln!(
            "error: --gateway: no gateway binary at {} (build it: cargo build --release -p routelab-gateway --bins)",
            path.display()
        );
        std::process::exit(2);
    }
    path
}

/// The example's work directory, made now: `--dir PATH`, else `routelab-EXAMPLE-PID` in the
/// system's temporary directory; exits 2 when it cannot be made.
pub fn work_dir(example: &str) -> PathBuf {
    let dir = arg("--dir").map(PathBuf::from).unwrap_or_else(|| {
        std::env::temp_dir().join(format!("routelab-{example}-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
        eprintln!("error: --dir: cannot create {}: {e}", dir.display());
        std::process::exit(2)
    });
    dir
}
