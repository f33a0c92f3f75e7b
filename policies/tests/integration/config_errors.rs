//! Bad YAML policies: every error names the field and what would be valid.

use routelab_policies::{ConfigError, PolicyConfig, RawPolicy};

/// Parse and validate; the error's message (serde's or ours).
fn error_of(yaml: &str) -> String {
    match serde_saphyr::from_str::<RawPolicy>(yaml) {
        Err(e) => e.to_string(),
        Ok(raw) => match PolicyConfig::from_raw(&raw) {
            Ok(p) => panic!("accepted:\n{yaml}\nas {p:?}"),
            Err(e) => e.to_string(),
        },
    }
}

#[track_caller]
fn assert_mentions(yaml: &str, needles: &[&str]) {
    let msg = error_of(yaml);
    for n in needles {
        assert!(
            msg.contains(n),
            "error for\n{yaml}\nis `{msg}`; expected it to mention `{n}`"
        );
    }
}

#[test]
fn a_good_policy_parses() {
    let yaml = "name: mine\npreset: seed-v3\nweights: { kind: probe, warmup: true, clamp: [0.25, 8] }\nchooser: { kind: sed, ties: higher-weight }\naffinity: { kind: capacity, base: 2, per_1k_tokens: 0.25, max: 8 }\ncap: { kind: weighted, limit: 24 }\n";
    let raw: RawPolicy = serde_saphyr::from_str(yaml).unwrap();
    let p = PolicyConfig::from_raw(&raw).unwrap();
    assert_eq!(p.name, "mine");
    assert_eq!(p.cap, routelab_policies::Cap::Weighted(24));
    assert_eq!(p.chooser.name(), "sed");
}

#[test]
fn bad_clamps_name_the_field_and_the_rule() {
    let rule = "finite 0 < min <= max";
    assert_mentions(
        "weights: { kind: probe, clamp: [-1, 8] }",
        &["weights.clamp", rule],
    );
    assert_mentions(
        "weights: { kind: probe, clamp: [.nan, 8] }",
        &["weights.clamp", "NaN", rule],
    );
    assert_mentions(
        "weights: { kind: oracle, clamp: [0.25, .inf] }",
        &["weights.clamp", rule],
    );
    assert_mentions(
        "weights: { kind: at-load, clamp: [0, 8] }",
        &["weights.clamp", rule],
    );
    assert_mentions(
        "weights: { kind: live, clamp: [8, 0.25] }",
        &["weights.clamp", "inverted", "min must be <= max"],
    );
}

#[test]
fn an_empty_table_is_rejected() {
    assert_mentions(
        "weights: { kind: table, table: {} }",
        &["weights.table", "empty", "GPU name: weight"],
    );
    assert_mentions(
        "weights: { kind: table, table: { RTX 4090: -1.75 } }",
        &["weights.table.RTX 4090", "finite number > 0"],
    );
}

#[test]
fn unknown_names_list_the_valid_ones() {
    assert_mentions(
        "preset: seed-v9",
        &["preset", "seed-v9", "seed-v1", "seed-v3-cold", "seed-next"],
    );
    assert_mentions(
        "preset: seed-v3\nchooser: { kind: fastest }",
        &[
            "chooser.kind",
            "fastest",
            "p2c",
            "sed",
            "jsq",
            "least-request",
            "wrr",
            "random",
            "round-robin",
        ],
    );
    assert_mentions(
        "preset: seed-v3\nchooser: { kind: p2c, ties: sometimes }",
        &["chooser.ties", "first", "random", "higher-weight"],
    );
    assert_mentions(
        "weights: { kind: magic }",
        &["weights.kind", "magic", "table", "probe", "at-load"],
    );
    assert_mentions(
        "preset: seed-v3\naffinity: { kind: sticky }",
        &["affinity.kind", "none, raw, capacity"],
    );
    assert_mentions(
        "preset: seed-v3\ncap: { kind: soft }",
        &["cap.kind", "none, flat, weighted"],
    );
}

#[test]
fn unknown_fields_are_rejected_by_serde() {
    assert_mentions(
        "preset: seed-v3\ncolour: blue",
        &["colour", "preset", "weights"],
    );
    assert_mentions(
        "weights: { kind: probe, warm_up: true }",
        &["warm_up", "warmup"],
    );
    assert_mentions(
        "preset: seed-v3\ncap: { kind: flat, max: 3 }",
        &["max", "limit"],
    );
}

#[test]
fn fields_of_another_kind_are_rejected() {
    assert_mentions(
        "weights: { kind: table, warmup: true }",
        &["weights.warmup", "table, unknown"],
    );
    assert_mentions(
        "preset: seed-v3\ncap: { kind: flat, limit: 0 }",
        &["cap.limit", ">= 1"],
    );
    assert_mentions(
        "preset: seed-v3\nchooser: { kind: wrr, ties: first }",
        &["chooser.ties", "p2c"],
    );
}

#[test]
fn the_field_path_is_machine_readable() {
    let raw: RawPolicy =
        serde_saphyr::from_str("weights: { kind: probe, clamp: [8, 0.25] }").unwrap();
    let e = PolicyConfig::from_raw(&raw).unwrap_err();
    assert_eq!(e.field(), "weights.clamp");
    assert!(matches!(e, ConfigError::Invalid { .. }));
}
