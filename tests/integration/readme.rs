//! The README's examples work as written, in a clone with nothing beside it.

use super::common::{routelab, text};

/// The fenced block of `lang` that follows the heading `heading` in README.md.
fn block_after(heading: &str, lang: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let after = &readme[readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has {heading}"))..];
    let fence = format!("```{lang}\n");
    let start = after.find(&fence).expect("a fenced block") + fence.len();
    let len = after[start..].find("```").expect("a closed block");
    after[start..start + len].to_string()
}

/// The scenario under "Writing a scenario", saved where the README says, validates: its
/// profiles and its trace (vendored in data/) are found from inside the repository.
#[test]
fn the_readme_scenario_example_validates() {
    let yaml = block_after("## Writing a scenario", "yaml");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!(".readme-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleet.yaml");
    std::fs::write(&file, yaml).unwrap();
    let o = routelab(&["validate", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// The README's first commands are `cargo run --release -- …` and `scripts/test`; the first
/// names a bundled scenario that exists, the second is the one test command, which sets up what
/// the tests need, then runs every test, and which `.ci/run` calls too.
#[test]
fn the_readme_first_command_names_a_bundled_scenario() {
    let commands = block_after("# routelab", "sh");
    let first = commands.lines().next().unwrap();
    assert!(first.starts_with("cargo run --release -- "), "{first}");
    let scenario = first
        .split_whitespace()
        .find(|w| w.ends_with(".yaml"))
        .expect("a scenario file");
    assert!(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(scenario)
            .is_file(),
        "{scenario}"
    );
    let second = commands.lines().nth(1).unwrap();
    assert!(second.starts_with("scripts/test "), "{second}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("scripts/test")).unwrap();
    assert!(
        script.contains("\nsetup\nif") && script.contains("need_chromium()"),
        "the script sets up what the tests need"
    );
    assert!(
        script
            .trim_end()
            .ends_with("exec cargo test --workspace --release \"$@\""),
        "then runs every test"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root.join("scripts/test"))
            .unwrap()
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "scripts/test is executable");
    }
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.contains("\nscripts/test\n") && !ci.contains("\ncargo test"),
        ".ci/run runs the tests through scripts/test"
    );
}

/// `scripts/test` installs a missing package through the distribution's registry (a stand-in
/// `apt-get` that records its calls and provides the missing command) and leaves a present one
/// alone.
#[test]
fn the_test_script_installs_what_is_missing_and_only_that() {
    let dir = super::common::scratch("test-script");
    let log = dir.join("apt.log");
    let stub = format!(
        "#!/bin/sh\necho \"$@\" >> {log}\n\
         case \"$1\" in install) printf '#!/bin/sh\\n' > {bin}; chmod +x {bin};; esac\n",
        log = log.display(),
        bin = dir.join("fake-probe").display()
    );
    let apt = dir.join("apt-get");
    std::fs::write(&apt, stub).unwrap();
    let sudo = dir.join("sudo");
    std::fs::write(&sudo, "#!/bin/sh\nexec \"$@\"\n").unwrap();
    for f in [&apt, &sudo] {
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(f)
            .status()
            .unwrap();
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test");
    let run = |probe: &str| {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source {}; need_debian_packages {probe} 'a test' pkg-a pkg-b",
                script.display()
            ))
            .env(
                "PATH",
                format!("{}:{}", dir.display(), std::env::var("PATH").unwrap()),
            )
            .output()
            .unwrap()
    };
    let o = run("fake-probe");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("== installing pkg-a pkg-b (a test)"),
        "{}",
        text(&o)
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls, "update -q\ninstall -y -q pkg-a pkg-b\n");
    // Present now: nothing more is installed.
    assert!(run("fake-probe").status.success());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), calls);
}

/// Issue 41: the README says how to get a `routelab` to call (its examples call it by name),
/// points at nothing outside the repository, and its `profile fit` synopsis names every flag
/// its own examples use.
#[test]
fn the_readme_installs_stays_inside_the_repository_and_its_synopsis_covers_its_examples() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    assert!(
        readme.contains("cargo install --path .\n") || readme.contains("cargo install --path . ")
    );
    assert!(
        !readme.contains("../shared"),
        "a path outside the repository"
    );
    let synopsis = readme
        .lines()
        .find(|l| l.starts_with("| `routelab profile fit "))
        .expect("the synopsis row");
    let synopsis = synopsis.split(" | ").next().unwrap();
    let mut examples = 0;
    let mut lines = readme.lines().peekable();
    while let Some(l) = lines.next() {
        if !l.trim_start().starts_with("routelab profile fit ") {
            continue;
        }
        examples += 1;
        let mut cmd = l.to_string();
        while cmd.ends_with('\\') {
            cmd.pop();
            cmd.push_str(lines.next().unwrap_or(""));
        }
        for flag in cmd.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(
                synopsis.contains(&format!("{flag} ")) || synopsis.contains(&format!("{flag}]")),
                "{flag} (used in `{}`) is not in the synopsis {synopsis}",
                cmd.trim()
            );
        }
    }
    assert!(examples >= 3, "{examples}");
}
