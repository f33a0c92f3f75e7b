use super::*;
use routelab_reports::capacity::{Censored, Evaluation, Rejected};
use routelab_reports::metric::CATALOG;

fn summary(policy: &str, salt: f64) -> RunSummary {
    let values = (0..CATALOG.len())
        .map(|i| (i % 5 != 0).then(|| (i as f64 + salt) / 3.0))
        .collect();
    RunSummary::from_values(policy, values).unwrap()
}

fn histogram(values: &[u64]) -> Histogram {
    let mut h = Histogram::new();
    for &v in values {
        h.record(v);
    }
    h
}

fn partial(shard: Shard, records: Records) -> Partial {
    Partial {
        version: VERSION.to_string(),
        command: records.command().to_string(),
        args: vec!["a.yaml".into(), "--seeds".into(), "3".into()],
        shard,
        units: 7,
        inputs_hash: 0x0123_4567_89ab_cdef,
        wall_s: 0.1 + 0.2,
        threads: 2,
        records,
    }
}

fn compare_records() -> Records {
    Records::Compare(vec![CompareRun {
        scenario: 1,
        ordinal: 0,
        policy: 2,
        seed: u64::MAX - 3,
        summary: summary("p", 0.1),
        e2e: Some(histogram(&[5, 5, 130, 1_000_000, 7_777_777_777, 1 << 50])),
        requests: 12,
        perf: PerfRun {
            scenario: "s".into(),
            policy: "p".into(),
            seed: u64::MAX - 3,
            wall_s: 1.0 / 3.0,
            sim_events: 99,
            simulated_s: 600.000_000_001,
        },
    }])
}

fn every_kind() -> Vec<Records> {
    vec![
        compare_records(),
        Records::Sweep(vec![SweepRun {
            job: 4,
            seed: 7,
            summary: summary("", 2.5),
        }]),
        Records::Capacity(vec![CapacityRun {
            scenario: 0,
            policy: 1,
            found: SeedCapacity {
                seed: 3,
                scale: 1.234_567_890_123,
                failing_scale: 1.26,
                censored: Some(Censored::NeverHolds {
                    min_scale: 1.0 / 64.0,
                    why: "ttft_p99 = 3.00 s > 2.00 s".into(),
                }),
                evaluations: vec![Evaluation {
                    scale: 0.1,
                    holds: false,
                    attainment: None,
                    ttft_p99_s: Some(0.1 + 0.2),
                    values: vec![Some(1e-300), None],
                    rejected: Rejected {
                        total: 5,
                        context_window: 4,
                        no_worker: 0,
                        largest_window: 32_768,
                        longest_request: 40_000,
                    },
                }],
            },
        }]),
        Records::Check(vec![CheckRun {
            job: 0,
            values: vec![("ttft_p99".into(), Some(0.3)), ("share:w1".into(), None)],
        }]),
    ]
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routelab-partial-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn every_kind_of_partial_round_trips_exactly() {
    let dir = scratch("round-trip");
    for records in every_kind() {
        let p = partial(Shard::new(2, 7).unwrap(), records);
        let file = dir.join(format!("{}.json", p.command));
        p.write(&file).unwrap();
        assert_eq!(Partial::read(&file).unwrap(), p, "{}", p.command);
    }
}

/// Issue 41: context-window rejections travel through a capacity partial; a partial of a run
/// that refused nothing is written (and read) as before the field existed.
#[test]
fn capacity_rejections_round_trip_and_older_partials_still_read() {
    let dir = scratch("rejections");
    let Records::Capacity(mut runs) = every_kind().remove(2) else {
        panic!("every_kind()[2] is the capacity records")
    };
    let file = dir.join("with.json");
    let p = partial(Shard::new(1, 2).unwrap(), Records::Capacity(runs.clone()));
    p.write(&file).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"rejected\""), "{text}");
    let back = Partial::read(&file).unwrap();
    let Records::Capacity(read) = &back.records else {
        panic!("capacity records")
    };
    assert_eq!(read[0].found.evaluations[0].rejected.context_window, 4);

    runs[0].found.evaluations[0].rejected = Rejected::default();
    let file = dir.join("without.json");
    let p = partial(Shard::new(1, 2).unwrap(), Records::Capacity(runs));
    p.write(&file).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("rejected"), "{text}");
    assert_eq!(Partial::read(&file).unwrap(), p);
}

#[test]
fn histograms_are_rebuilt_with_their_count_sum_min_max_and_buckets() {
    let cases: Vec<Vec<u64>> = vec![
        vec![],
        vec![42],
        vec![1000, 1001],
        vec![3, 3, 3],
        vec![200, 201, 202, 203, 900, 1 << 40, (1 << 40) + 12_345],
        (0..5000u64).map(|i| i * i * 7919 % 123_456_789).collect(),
        vec![u64::MAX, u64::MAX - 1, 1],
    ];
    for values in cases {
        let h = histogram(&values);
        let back = RawHistogramProbe::round_trip(&h);
        assert_eq!(back.as_ref(), Some(&h), "{values:?}");
    }
}

/// The rebuild through the raw form only (without a file).
struct RawHistogramProbe;

impl RawHistogramProbe {
    fn round_trip(h: &Histogram) -> Option<Histogram> {
        let p = partial(
            Shard::WHOLE,
            Records::Compare(vec![CompareRun {
                e2e: Some(h.clone()),
                ..match compare_records() {
                    Records::Compare(mut v) => v.remove(0),
                    _ => unreachable!(),
                }
            }]),
        );
        let text = raw::to_json(&p).ok()?;
        match raw::from_json(&text, "t.json").ok()?.records {
            Records::Compare(mut v) => v.remove(0).e2e,
            _ => None,
        }
    }
}

#[test]
fn a_histogram_whose_figures_disagree_is_refused() {
    let p = partial(Shard::WHOLE, compare_records());
    let text = raw::to_json(&p).unwrap();
    let tampered = text.replacen("\"sum\":", "\"sum\":1", 1);
    let e = raw::from_json(&tampered, "t.json").unwrap_err();
    assert_eq!(e.field, "records.compare[0].e2e");
    assert!(e.to_string().contains("is not a histogram"), "{e}");
}

#[test]
fn non_finite_values_round_trip_too() {
    let p = partial(
        Shard::WHOLE,
        Records::Check(vec![CheckRun {
            job: 0,
            values: vec![("x".into(), Some(f64::INFINITY)), ("y".into(), Some(-0.0))],
        }]),
    );
    let back = raw::from_json(&raw::to_json(&p).unwrap(), "t.json").unwrap();
    assert_eq!(back, p);
    let Records::Check(runs) = back.records else {
        panic!("check")
    };
    assert!(runs[0].values[1].1.unwrap().is_sign_negative());
}

#[test]
fn malformed_partials_are_located_errors() {
    for (text, field, says) in [
        ("{", "", "EOF"),
        ("[1]", "", "invalid length"),
        (
            r#"{"routelab_partial":2,"routelab":"0.1.0","command":"compare","args":[],"shard":"3/2","units":1,"inputs_hash":"0000000000000001","wall_s":0,"threads":1,"records":{"compare":[]}}"#,
            "shard",
            "does not exist",
        ),
        (
            r#"{"routelab_partial":2,"routelab":"0.1.0","command":"sweep","args":[],"shard":"1/2","units":1,"inputs_hash":"0000000000000001","wall_s":0,"threads":1,"records":{"compare":[]}}"#,
            "records",
            "not of `sweep`",
        ),
        (
            r#"{"routelab_partial":9,"routelab":"0.1.0","command":"sweep","args":[],"shard":"1/2","units":1,"inputs_hash":"0000000000000001","wall_s":0,"threads":1,"records":{"sweep":[]}}"#,
            "routelab_partial",
            "format 9",
        ),
        (
            r#"{"routelab_partial":2,"routelab":"0.1.0","command":"sweep","args":[],"shard":"1/2","units":1,"inputs_hash":"xyz","wall_s":0,"threads":1,"records":{"sweep":[]}}"#,
            "inputs_hash",
            "16 hexadecimal",
        ),
        (
            r#"{"routelab_partial":2,"routelab":"0.1.0","command":"sweep","args":[],"shard":"1/2","units":1,"inputs_hash":"0000000000000001","wall_s":0,"threads":1,"records":{"sweep":[{"job":0,"seed":1,"summary":["1.0"]}]}}"#,
            "records.sweep[0].summary",
            "one finite value",
        ),
    ] {
        let e = raw::from_json(text, "p.json").unwrap_err();
        assert_eq!(e.file, "p.json", "{text}");
        assert_eq!(e.field, field, "{text}: {e}");
        assert!(e.to_string().contains(says), "{text}: {e}");
    }
}

fn named(k: u32, n: u32, records: Records) -> (String, Partial) {
    (
        format!("shard-{k}-of-{n}.json"),
        partial(Shard::new(k, n).unwrap(), records),
    )
}

fn sweep(job: usize) -> Records {
    Records::Sweep(vec![SweepRun {
        job,
        seed: job as u64,
        summary: summary("", job as f64),
    }])
}

#[test]
fn a_complete_set_merges_in_shard_order() {
    let set = check_set(vec![
        named(3, 3, sweep(2)),
        named(1, 3, sweep(0)),
        named(2, 3, sweep(1)),
    ])
    .unwrap();
    assert_eq!(set.command, "sweep");
    let order: Vec<(String, u32)> = set
        .parts
        .iter()
        .map(|(f, s, _)| (f.clone(), s.index()))
        .collect();
    assert_eq!(
        order,
        [
            ("shard-1-of-3.json".to_string(), 1),
            ("shard-2-of-3.json".to_string(), 2),
            ("shard-3-of-3.json".to_string(), 3)
        ]
    );
    assert_eq!(set.threads, 6);
    let mut results = Results::<SweepRun>::from_shards(set.parts, |&job| Some(job)).unwrap();
    for job in 0..3 {
        assert_eq!(results.take(&job, job, String::new).unwrap().job, job);
    }
}

/// The parts of a checked set of `n` sweep shards, shard k holding the jobs `jobs[k - 1]`.
fn parts(n: u32, jobs: &[&[usize]]) -> Vec<(String, Shard, Records)> {
    (1..=n)
        .zip(jobs)
        .map(|(k, js)| {
            let runs = js
                .iter()
                .flat_map(|&j| match sweep(j) {
                    Records::Sweep(r) => r,
                    _ => unreachable!(),
                })
                .collect();
            (
                format!("shard-{k}-of-{n}.json"),
                Shard::new(k, n).unwrap(),
                Records::Sweep(runs),
            )
        })
        .collect()
}

#[test]
fn each_record_must_be_its_shards_and_appear_once() {
    // Six jobs over three shards: shard k owns jobs k − 1 and k + 2.
    let unit_of = |&job: &usize| (job < 6).then_some(job);
    assert!(
        Results::<SweepRun>::from_shards(parts(3, &[&[0, 3], &[1, 4], &[2, 5]]), unit_of).is_ok()
    );
    // Shard 2 holds job 3, which is shard 1's (and so appears twice).
    let e = Results::<SweepRun>::from_shards(parts(3, &[&[0], &[1, 3, 4], &[2, 5]]), unit_of)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("shard-2-of-3.json holds a result 3 that shard 2/3 does not run"),
        "{e}"
    );
    // A job the command does not have.
    let e = Results::<SweepRun>::from_shards(parts(3, &[&[0, 3, 6], &[1, 4], &[2, 5]]), unit_of)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("shard-1-of-3.json holds a result 6"), "{e}");
    // The same job twice in one shard's file.
    let e = Results::<SweepRun>::from_shards(parts(3, &[&[0, 3, 3], &[1, 4], &[2, 5]]), unit_of)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "the result 3 is in both shard-1-of-3.json and shard-1-of-3.json; was a partial edited?"
    );
    // A missing job names the shard and file that should hold it.
    let mut results =
        Results::<SweepRun>::from_shards(parts(3, &[&[0, 3], &[1], &[2, 5]]), unit_of).unwrap();
    let e = results
        .take(&4, 4, || "job 4".to_string())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "the results hold no run of job 4; shard 2/3 (shard-2-of-3.json) should hold it; were \
         the partial results edited?"
    );
    // Records of another command are refused.
    let e = Results::<CheckRun>::from_shards(parts(1, &[&[0]]), |&j| Some(j))
        .unwrap_err()
        .to_string();
    assert!(e.contains("another command"), "{e}");
}

#[test]
fn sets_that_do_not_belong_together_are_refused_naming_the_files() {
    let mut other = named(2, 3, sweep(1));
    other.1.inputs_hash ^= 1;
    let e = check_set(vec![named(1, 3, sweep(0)), other])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shard-1-of-3.json and shard-2-of-3.json were made from different inputs"),
        "{e}"
    );

    let e = check_set(vec![named(1, 2, sweep(0)), named(2, 3, sweep(1))])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("different inputs") && e.contains("3 shards"),
        "{e}"
    );

    let mut dup = named(1, 3, sweep(0));
    dup.0 = "copy.json".into();
    let e = check_set(vec![named(1, 3, sweep(0)), dup, named(2, 3, sweep(1))])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "shard 1/3 is given twice: shard-1-of-3.json and copy.json"
    );

    let e = check_set(vec![
        named(1, 7, sweep(0)),
        named(3, 7, sweep(2)),
        named(4, 7, sweep(3)),
        named(6, 7, sweep(5)),
        named(7, 7, sweep(6)),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("missing shards 2, 5 of 7"), "{e}");

    assert!(matches!(check_set(Vec::new()), Err(MergeError::Empty)));

    // The same inputs, other arguments (e.g. `--out`): refused, whatever the order.
    let mut moved = named(2, 2, sweep(1));
    moved.1.args.push("--out".into());
    for set in [
        vec![named(1, 2, sweep(0)), moved.clone()],
        vec![moved.clone(), named(1, 2, sweep(0))],
    ] {
        let e = check_set(set).unwrap_err().to_string();
        assert!(e.contains("were run with different arguments"), "{e}");
        assert!(e.contains("a.yaml --seeds 3 --out`"), "{e}");
    }

    // Another routelab's partial.
    let mut old = named(2, 2, sweep(1));
    old.1.version = "0.0.1".into();
    let e = check_set(vec![named(1, 2, sweep(0)), old])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "shard-2-of-2.json was made by routelab 0.0.1, this is {VERSION}; run the shards and \
             the merge with one routelab"
        )
    );
}
