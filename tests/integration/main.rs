//! Integration tests of the `routelab` lab: the bundled case studies and the command line.
mod capacity;
mod case_studies;
mod check_output;
mod cli;
mod common;
mod compare_paired;
mod console_tables;
mod sweep_seeds;
