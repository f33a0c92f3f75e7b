//! Integration tests of routelab-sim.
mod calibration;
mod common_random_numbers;
mod engine;
mod load_scale;
mod mapped_traces;
mod peers;
mod traffic;
mod validation;
