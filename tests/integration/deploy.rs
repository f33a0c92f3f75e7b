//! The deployments in `deploy/` hand out shards the way `--shard K/N` expects. Each script is run
//! by a real shell (as the pod, the array task or the user would run it) with a stand-in
//! `routelab` on the `PATH` that records its arguments and creates the `--partial` file it is
//! given; the recorded `--shard` values must parse with `Shard::parse` and cover 1..=N exactly
//! once, and the merge must be handed exactly the partials the shards wrote.

use crate::common::scratch;
use routelab_lab::shard::Shard;
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The stand-in: one file per call (parallel shards never interleave), arguments
/// tab-separated, and beside it the call's `RAYON_NUM_THREADS` (the thread pool size it would
/// run with). It writes the `--partial` file without creating its directory (the real
/// command's caller must), and fails when its `--shard` equals `$STUB_FAIL`.
const STUB: &str = r#"#!/bin/sh
call=$(mktemp "$(dirname "$0")/call.XXXXXX")
for a in "$@"; do printf '%s\t' "$a"; done > "$call"
printf '%s' "${RAYON_NUM_THREADS:-unset}" > "$(dirname "$0")/threads.${call##*.}"
shard=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --shard) shard=$2 ;;
    --partial) : > "$2" || exit 1 ;;
  esac
  shift
done
if [ -n "${STUB_FAIL:-}" ] && [ "$shard" = "$STUB_FAIL" ]; then exit 1; fi
"#;

struct Stub {
    dir: PathBuf,
}

impl Stub {
    fn new(work: &Path) -> Stub {
        let dir = work.join("bin");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("routelab");
        std::fs::write(&path, STUB).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
        Stub { dir }
    }

    /// `PATH` with the stand-in first.
    fn path(&self) -> OsString {
        let mut p = self.dir.clone().into_os_string();
        p.push(":");
        p.push(std::env::var_os("PATH").unwrap_or_default());
        p
    }

    /// Every call's arguments.
    fn calls(&self) -> Vec<Vec<String>> {
        let mut calls: Vec<Vec<String>> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("call.")
            })
            .map(|p| {
                let text = std::fs::read_to_string(p).unwrap();
                text.strip_suffix('\t')
                    .unwrap_or(&text)
                    .split('\t')
                    .map(str::to_string)
                    .collect()
            })
            .collect();
        calls.sort();
        calls
    }

    /// Every call's `RAYON_NUM_THREADS` (`unset` when it had none).
    fn threads(&self) -> Vec<String> {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("threads.")
            })
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect()
    }

    /// A command run from `cwd` with the stand-in on the `PATH` (and no `RAYON_NUM_THREADS`
    /// from the test's own environment).
    fn command(&self, program: &str, cwd: &Path) -> Command {
        let mut c = Command::new(program);
        c.current_dir(cwd)
            .env("PATH", self.path())
            .env_remove("RAYON_NUM_THREADS");
        c
    }
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The value after `flag` in one call.
fn value<'a>(call: &'a [String], flag: &str) -> Option<&'a str> {
    call.iter()
        .position(|a| a == flag)
        .and_then(|i| call.get(i + 1))
        .map(String::as_str)
}

/// The shard calls' `--shard` values (parsed as the CLI parses them) and `--partial` paths;
/// checks that the shards are exactly 1..=n of n, and that each partial is named after its
/// shard (`shard-K-of-N.json`, what the merges select), so distinct.
fn shards_and_partials(calls: &[Vec<String>], command: &str, n: u32) -> BTreeSet<String> {
    let shard_calls: Vec<&Vec<String>> = calls.iter().filter(|c| c[0] == command).collect();
    assert_eq!(
        shard_calls.len(),
        n as usize,
        "one call per shard: {calls:?}"
    );
    let mut indices = Vec::new();
    let mut partials = BTreeSet::new();
    for call in shard_calls {
        let text = value(call, "--shard").unwrap_or_else(|| panic!("no --shard: {call:?}"));
        let shard = Shard::parse(text, "deploy", "--shard")
            .unwrap_or_else(|e| panic!("`{text}` is not a shard: {e}"));
        assert_eq!(shard.count(), n, "{call:?}");
        indices.push(shard.index());
        let partial = value(call, "--partial").unwrap_or_else(|| panic!("no --partial: {call:?}"));
        let name = format!("shard-{}-of-{n}.json", shard.index());
        assert!(
            Path::new(partial).file_name() == Some(name.as_ref()),
            "{partial} is not named {name}"
        );
        assert!(
            partials.insert(partial.to_string()),
            "partial {partial} written twice"
        );
    }
    indices.sort_unstable();
    assert_eq!(indices, (1..=n).collect::<Vec<_>>(), "every shard once");
    partials
}

/// The partials one merge call is given (its arguments other than `merge` and `--out DIR`).
fn merged(calls: &[Vec<String>]) -> BTreeSet<String> {
    let merges: Vec<&Vec<String>> = calls.iter().filter(|c| c[0] == "merge").collect();
    assert_eq!(merges.len(), 1, "one merge: {calls:?}");
    let mut args = merges[0][1..].iter();
    let mut partials = BTreeSet::new();
    while let Some(a) = args.next() {
        if a == "--out" {
            args.next();
        } else {
            partials.insert(a.clone());
        }
    }
    partials
}

/// What Kubernetes does to `command` and `args` before the container starts: `$(NAME)` becomes
/// the container's variable NAME if it has one (else stays as written) and `$$` becomes `$`.
fn kubernetes_expand(text: &str, env: &[(&str, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
            continue;
        }
        if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some((_, v)) = env.iter().find(|(k, _)| *k == &inner[..end])
        {
            out.push_str(v);
            rest = &inner[end + 1..];
            continue;
        }
        out.push('$');
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The one container of a Job document.
struct Container {
    /// Its `sh -c` program.
    command: Vec<String>,
    /// The script the shell is given, as written (before Kubernetes' `$(NAME)` expansion).
    script: String,
    /// Where the results volume is mounted.
    mount: String,
    /// Its environment variables with a literal `value`.
    env: Vec<(String, String)>,
}

impl Container {
    /// The script as the container's shell gets it, with `more` variables set in the pod (as
    /// JOB_COMPLETION_INDEX is by the Job controller).
    fn expanded(&self, more: &[(&str, String)]) -> String {
        let mut env: Vec<(&str, String)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        env.extend(more.iter().cloned());
        kubernetes_expand(&self.script, &env)
    }

    fn var(&self, name: &str) -> &str {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.env))
    }
}

fn container(job: &Value) -> Container {
    let pod = &job["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{job}");
    let c = &containers[0];
    let command: Vec<String> = c["command"]
        .as_array()
        .expect("command")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        command,
        ["sh", "-c"],
        "the shell evaluates the index arithmetic"
    );
    let args = c["args"].as_array().expect("args");
    assert_eq!(args.len(), 1, "{args:?}");
    let mount = c["volumeMounts"][0]["mountPath"]
        .as_str()
        .expect("a volume mount")
        .to_string();
    let volume = c["volumeMounts"][0]["name"].as_str().unwrap();
    let claim = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == volume)
        .expect("the mounted volume is declared");
    assert_eq!(
        claim["persistentVolumeClaim"]["claimName"],
        "routelab-results"
    );
    let env = c["env"]
        .as_array()
        .map(|vars| {
            vars.iter()
                .map(|v| {
                    let name = v["name"].as_str().expect("an env name").to_string();
                    let value = v["value"]
                        .as_str()
                        .expect("a literal env value")
                        .to_string();
                    (name, value)
                })
                .collect()
        })
        .unwrap_or_default();
    Container {
        command,
        script: args[0].as_str().unwrap().to_string(),
        mount,
        env,
    }
}

#[test]
fn the_kubernetes_indexed_job_runs_each_shard_once_and_the_merge_reads_every_partial() {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read("deploy/kubernetes/compare-indexed-job.yaml"))
            .expect("the manifest parses");
    let claim = docs
        .iter()
        .find(|d| d["kind"] == "PersistentVolumeClaim")
        .expect("the shared volume's claim");
    assert_eq!(claim["metadata"]["name"], "routelab-results");
    assert_eq!(claim["spec"]["accessModes"][0], "ReadWriteMany");
    let job = docs.iter().find(|d| d["kind"] == "Job").expect("a Job");
    assert_eq!(job["apiVersion"], "batch/v1");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let n = spec["completions"].as_u64().expect("completions") as u32;
    assert!(n >= 2, "a sharded job: {n}");
    let parallelism = spec["parallelism"].as_u64().expect("parallelism");
    assert!((1..=u64::from(n)).contains(&parallelism), "{parallelism}");
    let shard = container(job);
    let mount = shard.mount.clone();
    let run = shard.var("RUN");

    let work = scratch("deploy-kubernetes");
    let stub = Stub::new(&work);
    let results = work.join("results");
    std::fs::create_dir_all(&results).unwrap();
    // The volume, mounted at `mount` in the pod, is `results` here.
    let local = |script: &str| script.replace(&mount, results.to_str().unwrap());
    for index in 0..n {
        // The Job controller sets JOB_COMPLETION_INDEX in each pod, 0..completions-1.
        let env = [("JOB_COMPLETION_INDEX", index.to_string())];
        let o = stub
            .command(&shard.command[0], &work)
            .args(&shard.command[1..])
            .arg(local(&shard.expanded(&env)))
            .env("JOB_COMPLETION_INDEX", index.to_string())
            .output()
            .unwrap();
        ok(&o, &format!("pod {index}"));
    }
    let calls = stub.calls();
    // `completions` agrees with the `/N` of `--shard` and the `-of-N` of the partial's name.
    let partials = shards_and_partials(&calls, "compare", n);
    // In this run's own directory, so an earlier run's partials are not merged with these.
    let partial_dir = results.join(run).join("partials");
    for p in &partials {
        assert_eq!(Path::new(p).parent(), Some(partial_dir.as_path()), "{p}");
    }

    let docs: Vec<Value> = serde_saphyr::from_multiple(&read("deploy/kubernetes/merge-job.yaml"))
        .expect("the merge manifest parses");
    let merge_job = docs.iter().find(|d| d["kind"] == "Job").expect("a Job");
    assert_ne!(merge_job["metadata"]["name"], job["metadata"]["name"]);
    let merge = container(merge_job);
    assert_eq!(merge.mount, mount, "both Jobs mount the volume at one path");
    assert_eq!(
        merge.var("RUN"),
        run,
        "the merge reads the run the Job wrote"
    );
    // A partial of another N and one of an earlier run on the volume are not merged.
    std::fs::write(partial_dir.join(format!("shard-1-of-{}.json", n + 1)), "").unwrap();
    let earlier = results.join(format!("{run}-earlier")).join("partials");
    std::fs::create_dir_all(&earlier).unwrap();
    std::fs::write(earlier.join(format!("shard-1-of-{n}.json")), "").unwrap();
    let o = stub
        .command(&merge.command[0], &work)
        .args(&merge.command[1..])
        .arg(local(&merge.expanded(&[])))
        .output()
        .unwrap();
    ok(&o, "merge");
    let calls = stub.calls();
    assert_eq!(merged(&calls), partials);
    let merge = calls.iter().find(|c| c[0] == "merge").unwrap();
    let out = value(merge, "--out").expect("the merge writes to the volume");
    assert!(Path::new(out).starts_with(results.join(run)), "{out}");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn kubernetes_leaves_the_shells_index_arithmetic_to_the_shell() {
    let env = [("JOB_COMPLETION_INDEX", "3".to_string())];
    assert_eq!(
        kubernetes_expand(
            "$(( JOB_COMPLETION_INDEX + 1 ))/4 $(JOB_COMPLETION_INDEX) $$x",
            &env
        ),
        "$(( JOB_COMPLETION_INDEX + 1 ))/4 3 $x"
    );
}

/// The `#SBATCH --array=1-N` directive's N.
fn slurm_array_size(script: &str) -> u32 {
    let range = script
        .lines()
        .find_map(|l| l.strip_prefix("#SBATCH --array="))
        .expect("an #SBATCH --array= directive")
        .trim();
    let (first, last) = range.split_once('-').expect("a range 1-N");
    assert_eq!(first, "1", "array task ids count from 1, as shards do");
    last.parse().expect("N")
}

#[test]
fn the_slurm_array_runs_each_shard_once_and_its_dependent_merge_reads_every_partial() {
    let rel = "deploy/slurm/compare-array.sh";
    let text = read(rel);
    let script = Path::new(ROOT).join(rel);
    let n = slurm_array_size(&text);
    assert!(n >= 2, "{n}");
    let work = scratch("deploy-slurm");
    let stub = Stub::new(&work);
    let job = "4242";
    let task = |id: u32, run: Option<&str>| {
        let mut c = stub.command("bash", &work);
        c.arg(&script)
            .env(
                "SLURM_ARRAY_JOB_ID",
                if run.is_some() { "5555" } else { job },
            )
            .env("SLURM_ARRAY_TASK_ID", id.to_string())
            .env("SLURM_CPUS_PER_TASK", "3")
            .env_remove("ROUTELAB_RUN");
        if let Some(run) = run {
            c.env("ROUTELAB_RUN", run);
        }
        c.output().unwrap()
    };
    // Task ids outside 1..=N (an array declared from 0, or longer than the script's N): refused.
    for id in [0, n + 1] {
        let o = task(id, None);
        assert_eq!(o.status.code(), Some(2), "task {id}: {o:?}");
    }
    assert!(stub.calls().is_empty());
    for id in 1..n {
        ok(&task(id, None), &format!("array task {id}"));
    }
    // The last index as a rerun in a job of its own, writing into the first run's directory.
    ok(&task(n, Some(job)), "rerun of the last task");
    let calls = stub.calls();
    let partials = shards_and_partials(&calls, "compare", n);
    for p in &partials {
        assert!(p.starts_with(&format!("out/partials/{job}/")), "{p}");
    }
    // Each task's thread pool is the CPUs Slurm allots it, not the node's.
    assert_eq!(stub.threads(), vec!["3"; n as usize]);

    // The merge, as the script's header submits it: after every task succeeded.
    let submit = text
        .lines()
        .find(|l| l.contains("sbatch --parsable"))
        .expect("the submission line");
    assert!(submit.contains(rel), "{submit}");
    let dependent = text
        .lines()
        .find(|l| l.contains("sbatch --dependency=afterok:$jid "))
        .expect("the merge is a job depending on the array");
    let wrapped = dependent
        .split_once("--wrap \"")
        .and_then(|(_, w)| w.strip_suffix('"'))
        .expect("the merge's --wrap command");
    let o = stub
        .command("sh", &work)
        .arg("-c")
        .arg(wrapped.replace("$jid", job))
        .output()
        .unwrap();
    ok(&o, "merge");
    assert_eq!(merged(&stub.calls()), partials);
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn the_local_script_runs_every_shard_with_xargs_then_merges_and_stops_on_a_failure() {
    let script = Path::new(ROOT).join("deploy/local.sh");
    assert!(read("deploy/local.sh").contains("xargs -P"));
    for n in [1u32, 3, 7] {
        let work = scratch(&format!("deploy-local-{n}"));
        let stub = Stub::new(&work);
        let o = stub
            .command("sh", &work)
            .arg(&script)
            .args([&n.to_string(), "compare", "a scenario.yaml", "--seeds", "2"])
            .env("PARALLEL", "3")
            .env("MERGE_OUT", "out/merged")
            .output()
            .unwrap();
        ok(&o, &format!("{n} shards"));
        let calls = stub.calls();
        let partials = shards_and_partials(&calls, "compare", n);
        for call in calls.iter().filter(|c| c[0] == "compare") {
            assert_eq!(call[1..4], ["a scenario.yaml", "--seeds", "2"], "{call:?}");
        }
        assert_eq!(merged(&calls), partials);
        let merge = calls.iter().find(|c| c[0] == "merge").unwrap();
        assert_eq!(value(merge, "--out"), Some("out/merged"));

        // A shard that fails: no merge.
        let work = scratch(&format!("deploy-local-fail-{n}"));
        let stub = Stub::new(&work);
        let o = stub
            .command("sh", &work)
            .arg(&script)
            .args([&n.to_string(), "sweep", "s.yaml"])
            .env("STUB_FAIL", format!("{n}/{n}"))
            .output()
            .unwrap();
        assert!(!o.status.success(), "{o:?}");
        let calls = stub.calls();
        // Every shard ran (xargs goes on past a failing one), then no merge.
        shards_and_partials(&calls, "sweep", n);
        assert_eq!(calls.len(), n as usize, "{calls:?}");
        let _ = std::fs::remove_dir_all(&work);
    }
}

/// The package's binary names, from the manifests: the root package's `default-run` and the
/// gateway's `[[bin]]`.
fn binary_names() -> Vec<String> {
    let name_after = |manifest: &str, marker: &str, key: &str| -> String {
        let text = read(manifest);
        let from = text
            .find(marker)
            .unwrap_or_else(|| panic!("{manifest}: {marker}"));
        let line = text[from..]
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("{manifest}: {key}"));
        line.split('"').nth(1).unwrap().to_string()
    };
    vec![
        name_after("Cargo.toml", "[package]", "default-run"),
        name_after("gateway/Cargo.toml", "[[bin]]", "name"),
    ]
}

#[test]
fn the_dockerfile_builds_both_binaries_and_ships_the_scenarios_and_their_traces() {
    let text = read("deploy/Dockerfile");
    // Instructions, continuation lines joined, comments dropped.
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let instructions: Vec<&str> = joined.lines().filter(|l| !l.trim().is_empty()).collect();
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("FROM "))
        .map(|(i, _)| i)
        .collect();
    assert!(stages.len() >= 2, "multi-stage: {stages:?}");
    let build_stage = instructions[stages[0]]
        .split_whitespace()
        .collect::<Vec<_>>();
    assert!(build_stage[1].starts_with("rust:"), "{build_stage:?}");
    let build_name = build_stage
        .iter()
        .position(|w| w.eq_ignore_ascii_case("AS"))
        .map(|i| build_stage[i + 1])
        .expect("a named build stage");
    let last = &instructions[*stages.last().unwrap()..];
    assert_eq!(last[0], "FROM debian:bookworm-slim");
    let build = instructions[..stages[1]]
        .iter()
        .find(|l| l.starts_with("RUN") && l.contains("cargo build"))
        .expect("a cargo build");
    let words: Vec<&str> = build.split_whitespace().collect();
    for flag in ["--release", "--locked"] {
        assert!(words.contains(&flag), "{flag}: {build}");
    }
    let copy_bins = last
        .iter()
        .find(|l| l.starts_with(&format!("COPY --from={build_name} ")))
        .expect("the binaries are copied from the build stage");
    for bin in binary_names() {
        assert!(
            words.windows(2).any(|w| w == ["--bin", bin.as_str()]),
            "--bin {bin}: {build}"
        );
        assert!(
            copy_bins.contains(&format!("/target/release/{bin} ")),
            "{bin}: {copy_bins}"
        );
    }
    // Scenarios name their traces as ../../data/...: both trees, side by side.
    for tree in ["scenarios/", "data/"] {
        assert!(
            last.contains(&format!("COPY {tree} {tree}").as_str()),
            "{tree}: {last:?}"
        );
    }
    let user = last
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    assert!(!["root", "0"].contains(&user.trim()), "{user}");
    assert!(last.contains(&r#"ENTRYPOINT ["routelab"]"#), "{last:?}");
    let dockerignore = read(".dockerignore");
    let ignored: Vec<&str> = dockerignore
        .lines()
        .map(|l| l.trim().trim_end_matches('/'))
        .collect::<Vec<_>>();
    for dir in ["target", "out"] {
        assert!(ignored.contains(&dir), "{dir} not in .dockerignore");
    }
}
