//! Integration tests of the `routelab` lab: the bundled case studies and the command line.
mod capacity;
mod case_studies;
mod cli;
mod common;
mod compare_paired;
mod report_browser;
