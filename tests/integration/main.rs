//! Integration tests of the `routelab` lab: the bundled case studies and the command line.
mod bench_cmd;
mod capacity;
mod case_studies;
mod check_output;
mod cli;
mod common;
mod compare_paired;
mod console_tables;
mod deploy;
mod profile_cmd;
mod readme;
mod replicas_cmd;
mod report_browser;
mod run_output;
mod shards;
mod sweep_seeds;
mod trace_cmd;
