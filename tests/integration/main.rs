//! Integration tests of the `routelab` lab: the bundled case studies and the command line.
mod capacity;
mod case_studies;
mod cli;
mod common;
mod compare_paired;
mod profile_cmd;
mod readme;
mod run_output;
mod trace_cmd;
