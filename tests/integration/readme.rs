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

/// The README's first commands are `cargo run --release -- …` and `cargo test …`; the first
/// names a bundled scenario that exists.
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
    assert!(
        commands
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("cargo test --workspace")
    );
}
